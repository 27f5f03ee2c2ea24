//! The URLs this engine opens: `postgres://…` and `postgresql://…`, with
//! alkstore's own parameters taken out before the rest goes to the driver:
//! `schema` (default [`DEFAULT_SCHEMA`]), `pooler` (`none`, `session`,
//! `transaction`: [`Pooler`]), `listen` (`host` or `host:port`: where to
//! LISTEN straight at the server, with the URL's user, password and
//! database) and `timeout` (`10s`, `500ms`: how long a statement may go
//! unanswered past its lock waits, [`crate::Deployment::answer_within`]).

use alkstore_core::url::{OpenFuture, parse_duration};
use alkstore_core::{EngineDescriptor, Error, Store, UrlError};

use crate::{DEFAULT_SCHEMA, PgStore, Pooler};

/// A URL with alkstore's parameters taken out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Parsed {
    /// The URL to hand the driver.
    pub(crate) driver: String,
    /// `schema`, when given.
    pub(crate) schema: Option<String>,
    pub(crate) pooler: Pooler,
    /// `listen`: host and port (5432 when not given).
    pub(crate) listen: Option<(String, u16)>,
    /// `timeout`: how long a statement may go unanswered past its lock
    /// waits ([`crate::Deployment::answer_within`]).
    pub(crate) timeout: Option<std::time::Duration>,
}

impl Parsed {
    /// The schema, or the default.
    pub(crate) fn schema(&self) -> String {
        self.schema
            .clone()
            .unwrap_or_else(|| DEFAULT_SCHEMA.to_owned())
    }
}

/// The PostgreSQL engine, as `alkstore::open` finds it.
pub const ENGINE: EngineDescriptor = EngineDescriptor {
    name: "postgres",
    schemes: &["postgres://", "postgresql://"],
    open: open_url,
    inspect: crate::doctor::inspect_url,
    standby: crate::doctor::standby_url,
};

/// Takes alkstore's parameters out of `url`.
pub(crate) fn parse(url: &str) -> Result<Parsed, UrlError> {
    let malformed = |problem: String| UrlError::malformed(url, problem);
    let mut parsed = ::url::Url::parse(url).map_err(|e| malformed(e.to_string()))?;
    if parsed.host_str().is_none_or(str::is_empty)
        && !parsed.query_pairs().any(|(k, _)| k == "host")
    {
        return Err(malformed("no host".into()));
    }
    let (mut schema, mut pooler, mut listen, mut timeout) = (None, None, None, None);
    let mut rest = Vec::new();
    for (key, value) in parsed.query_pairs() {
        let twice = |what: &str| malformed(format!("`{what}` given twice"));
        match &*key {
            "schema" => {
                if schema.replace(value.into_owned()).is_some() {
                    return Err(twice("schema"));
                }
            }
            "pooler" => {
                // Not echoed: a value out of place may be a secret.
                let named = Pooler::from_param(&value)
                    .ok_or_else(|| malformed("`pooler` is none, session or transaction".into()))?;
                if pooler.replace(named).is_some() {
                    return Err(twice("pooler"));
                }
            }
            "listen" => {
                if listen
                    .replace(listen_address(&value).map_err(&malformed)?)
                    .is_some()
                {
                    return Err(twice("listen"));
                }
            }
            "timeout" => {
                let within = parse_duration(&value)
                    .filter(|t| !t.is_zero() && *t <= std::time::Duration::from_secs(3600))
                    .ok_or_else(|| {
                        malformed(
                            "`timeout` is a duration from 1ms to 3600s, such as 10s or 500ms"
                                .into(),
                        )
                    })?;
                if timeout.replace(within).is_some() {
                    return Err(twice("timeout"));
                }
            }
            _ => rest.push((key.into_owned(), value.into_owned())),
        }
    }
    if rest.is_empty() {
        parsed.set_query(None);
    } else {
        parsed.query_pairs_mut().clear().extend_pairs(rest);
    }
    Ok(Parsed {
        driver: parsed.into(),
        schema,
        pooler: pooler.unwrap_or_default(),
        listen,
        timeout,
    })
}

/// `host` or `host:port` (an IPv6 address in brackets).
fn listen_address(value: &str) -> Result<(String, u16), String> {
    // Not echoed: it could hold a password.
    let bad = || "`listen` takes host or host:port, nothing more".to_owned();
    let parsed = ::url::Url::parse(&format!("postgres://{value}")).map_err(|_| bad())?;
    match parsed.host_str() {
        Some(host)
            if !host.is_empty()
                && parsed.path().is_empty()
                && parsed.query().is_none()
                && parsed.fragment().is_none()
                && !value.contains('@') =>
        {
            let host = host.trim_start_matches('[').trim_end_matches(']');
            Ok((host.to_owned(), parsed.port().unwrap_or(5432)))
        }
        _ => Err(bad()),
    }
}

fn open_url(url: &str) -> OpenFuture<'_> {
    Box::pin(async move {
        let parsed = parse(url).map_err(|e| Error::database("open", e))?;
        Ok(Box::new(PgStore::connect_parsed(&parsed, &parsed.schema()).await?) as Box<dyn Store>)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn driver_and_schema(url: &str) -> Result<(String, String), UrlError> {
        parse(url).map(|p| (p.driver.clone(), p.schema()))
    }

    #[test]
    fn postgres_forms_take_out_the_schema() {
        assert_eq!(
            driver_and_schema("postgres://u:p@db:5432/app?schema=locks&sslmode=disable"),
            Ok((
                "postgres://u:p@db:5432/app?sslmode=disable".into(),
                "locks".into()
            ))
        );
        assert_eq!(
            driver_and_schema("postgresql://db/app"),
            Ok(("postgresql://db/app".into(), DEFAULT_SCHEMA.into()))
        );
        assert_eq!(
            driver_and_schema("postgres://db/app?schema=a%22%3B%20DROP"),
            Ok(("postgres://db/app".into(), "a\"; DROP".into()))
        );
        assert!(matches!(
            parse("postgres://db/app?schema=a&schema=b"),
            Err(UrlError::Malformed { .. })
        ));
        assert!(matches!(
            parse("postgres://"),
            Err(UrlError::Malformed { .. })
        ));
    }

    #[test]
    fn pooler_and_listen_are_taken_out() {
        let parsed = parse(
            "postgres://u:p@bouncer:6432/app?pooler=transaction&listen=db:5433&sslmode=disable",
        )
        .unwrap();
        assert_eq!(
            parsed.driver,
            "postgres://u:p@bouncer:6432/app?sslmode=disable"
        );
        assert_eq!(parsed.pooler, Pooler::Transaction);
        assert_eq!(parsed.listen, Some(("db".into(), 5433)));
        let parsed = parse("postgres://db/app?pooler=session&listen=%5B::1%5D").unwrap();
        assert_eq!(parsed.pooler, Pooler::Session);
        assert_eq!(parsed.listen, Some(("::1".into(), 5432)));
        assert_eq!(parse("postgres://db/app").unwrap().pooler, Pooler::None);
        for bad in [
            "postgres://db/app?pooler=statement",
            "postgres://db/app?pooler=none&pooler=none",
            "postgres://db/app?listen=",
            "postgres://db/app?listen=db:notaport",
            "postgres://db/app?listen=u:secret@db",
            "postgres://db/app?listen=db/other",
            "postgres://db/app?listen=db%3Fx",
            "postgres://db/app?listen=db%23y",
            "postgres://db/app?listen=a&listen=b",
        ] {
            let err = parse(bad).unwrap_err();
            let UrlError::Malformed { problem, .. } = &err else {
                panic!("{bad}: {err}");
            };
            // The problem does not repeat the value (it could hold a password).
            assert!(!problem.contains("secret"), "{bad}: {err}");
        }
    }

    #[test]
    fn malformed_urls_are_refused_without_leaking_passwords() {
        for url in [
            "postgres://user:secret@host:notaport/db",
            "postgres://user:secret@[bad/db",
            "postgres://user:sec/ret@host/db?port=x&schema=a&schema=b",
            "postgres://user:se@cret@/db",
            "postgres://host/db?password=secret&schema=a&schema=b",
            "postgres://host/db?PassWord=secret&schema=a&schema=b",
        ] {
            let err = parse(url).unwrap_err();
            assert!(!err.to_string().contains("secret"), "{url}: {err}");
            assert!(!format!("{err:?}").contains("secret"), "{url}: {err:?}");
        }
    }
}
