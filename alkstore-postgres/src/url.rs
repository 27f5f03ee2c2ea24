//! The URLs this engine opens: `postgres://…` and `postgresql://…`, with
//! alkstore's own `schema` parameter (default [`DEFAULT_SCHEMA`]) taken out
//! before the rest goes to the driver.

use alkstore_core::url::OpenFuture;
use alkstore_core::{EngineDescriptor, Error, Store, UrlError};

use crate::{DEFAULT_SCHEMA, PgStore};

/// The PostgreSQL engine, as `alkstore::open` finds it.
pub const ENGINE: EngineDescriptor = EngineDescriptor {
    name: "postgres",
    schemes: &["postgres://", "postgresql://"],
    open: open_url,
    inspect: crate::doctor::inspect_url,
};

/// The URL to hand the driver (without `schema`) and the schema.
pub(crate) fn parse(url: &str) -> Result<(String, String), UrlError> {
    let malformed = |problem: String| UrlError::malformed(url, problem);
    let mut parsed = ::url::Url::parse(url).map_err(|e| malformed(e.to_string()))?;
    if parsed.host_str().is_none_or(str::is_empty)
        && !parsed.query_pairs().any(|(k, _)| k == "host")
    {
        return Err(malformed("no host".into()));
    }
    let mut schema = None;
    let mut rest = Vec::new();
    for (key, value) in parsed.query_pairs() {
        if key == "schema" {
            if schema.replace(value.into_owned()).is_some() {
                return Err(malformed("`schema` given twice".into()));
            }
        } else {
            rest.push((key.into_owned(), value.into_owned()));
        }
    }
    if rest.is_empty() {
        parsed.set_query(None);
    } else {
        parsed.query_pairs_mut().clear().extend_pairs(rest);
    }
    Ok((
        parsed.into(),
        schema.unwrap_or_else(|| DEFAULT_SCHEMA.to_owned()),
    ))
}

fn open_url(url: &str) -> OpenFuture<'_> {
    Box::pin(async move {
        let (url, schema) = parse(url).map_err(|e| Error::database("open", e))?;
        Ok(Box::new(PgStore::connect(&url, &schema).await?) as Box<dyn Store>)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_forms_take_out_the_schema() {
        assert_eq!(
            parse("postgres://u:p@db:5432/app?schema=locks&sslmode=disable"),
            Ok((
                "postgres://u:p@db:5432/app?sslmode=disable".into(),
                "locks".into()
            ))
        );
        assert_eq!(
            parse("postgresql://db/app"),
            Ok(("postgresql://db/app".into(), DEFAULT_SCHEMA.into()))
        );
        assert_eq!(
            parse("postgres://db/app?schema=a%22%3B%20DROP"),
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
