//! Parsing the store URLs `alkstore::open` accepts.

/// A store URL `alkstore::open` could not use; found in the source chain of
/// the [`Error::Database`](crate::Error::Database) it returns.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UrlError {
    /// Not of any form `open` knows.
    #[error(
        "unsupported store URL {url:?}: expected sqlite://PATH, sqlite::memory:, or postgres://…"
    )]
    UnknownScheme {
        /// The URL as given.
        url: String,
    },
    /// The form is known but malformed.
    #[error("malformed store URL {url:?}: {problem}")]
    Malformed {
        /// The URL as given, with any password masked.
        url: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The URL names an engine this build leaves out.
    #[error("the {engine} engine is not enabled: turn on alkstore's `{engine}` feature")]
    EngineNotEnabled {
        /// The feature to turn on.
        engine: &'static str,
    },
}

/// Where a URL points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    SqliteMemory,
    SqliteFile(std::path::PathBuf),
    /// The URL to hand the driver (without alkstore's own `schema` parameter) and the schema.
    Postgres {
        url: String,
        schema: String,
    },
}

/// The PostgreSQL schema used when the URL names none.
pub const DEFAULT_SCHEMA: &str = "alkstore";

pub(crate) fn parse(url: &str) -> Result<Target, UrlError> {
    if url == "sqlite::memory:" || url == "sqlite://:memory:" {
        return Ok(Target::SqliteMemory);
    }
    if let Some(path) = url.strip_prefix("sqlite://") {
        if path.is_empty() || path.contains('?') {
            return Err(UrlError::Malformed {
                url: masked(url),
                problem: "expected a file path after sqlite:// (no query parameters)".into(),
            });
        }
        return Ok(Target::SqliteFile(path.into()));
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return parse_postgres(url);
    }
    Err(UrlError::UnknownScheme { url: masked(url) })
}

fn parse_postgres(url: &str) -> Result<Target, UrlError> {
    let malformed = |problem: String| UrlError::Malformed {
        url: masked(url),
        problem,
    };
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
    Ok(Target::Postgres {
        url: parsed.into(),
        schema: schema.unwrap_or_else(|| DEFAULT_SCHEMA.to_owned()),
    })
}

/// The URL with any password replaced, for error messages.
/// Query parameters whose value is a secret.
const SECRET_KEYS: [&str; 4] = ["password", "passwd", "pwd", "sslpassword"];

/// The URL with every secret replaced by `****`, parsed or not: the
/// password of the user-info (everything between the first `:` after the
/// scheme and the last `@` before the path or query, so that a password
/// holding `/`, `@` or `:` is masked whole) and the value of every query
/// parameter named like a password.
fn masked(url: &str) -> String {
    let (before_query, query) = match url.split_once('?') {
        Some((head, query)) => (head, Some(query)),
        None => (url, None),
    };
    let (prefix, rest) = match before_query.split_once("://") {
        Some((scheme, rest)) => (format!("{scheme}://"), rest),
        None => (String::new(), before_query),
    };
    let mut out = match rest.rfind('@') {
        Some(at) => {
            let userinfo = &rest[..at];
            let user = userinfo.split(':').next().unwrap_or_default();
            let password = if userinfo.contains(':') { ":****" } else { "" };
            format!("{prefix}{user}{password}@{}", &rest[at + 1..])
        }
        None => before_query.to_owned(),
    };
    if let Some(query) = query {
        let pairs: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((key, _)) if SECRET_KEYS.iter().any(|s| key.eq_ignore_ascii_case(s)) => {
                    format!("{key}=****")
                }
                _ => pair.to_owned(),
            })
            .collect();
        out.push('?');
        out.push_str(&pairs.join("&"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_forms() {
        assert_eq!(parse("sqlite::memory:"), Ok(Target::SqliteMemory));
        assert_eq!(
            parse("sqlite://locks.db"),
            Ok(Target::SqliteFile("locks.db".into()))
        );
        assert_eq!(
            parse("sqlite:///var/lib/app/locks.db"),
            Ok(Target::SqliteFile("/var/lib/app/locks.db".into()))
        );
        assert!(matches!(
            parse("sqlite://"),
            Err(UrlError::Malformed { .. })
        ));
        assert!(matches!(
            parse("sqlite://a.db?mode=ro"),
            Err(UrlError::Malformed { .. })
        ));
    }

    #[test]
    fn postgres_forms_take_out_the_schema() {
        assert_eq!(
            parse("postgres://u:p@db:5432/app?schema=locks&sslmode=disable"),
            Ok(Target::Postgres {
                url: "postgres://u:p@db:5432/app?sslmode=disable".into(),
                schema: "locks".into()
            })
        );
        assert_eq!(
            parse("postgresql://db/app"),
            Ok(Target::Postgres {
                url: "postgresql://db/app".into(),
                schema: DEFAULT_SCHEMA.into()
            })
        );
        assert_eq!(
            parse("postgres://db/app?schema=a%22%3B%20DROP"),
            Ok(Target::Postgres {
                url: "postgres://db/app".into(),
                schema: "a\"; DROP".into()
            })
        );
        assert!(matches!(
            parse("postgres://db/app?schema=a&schema=b"),
            Err(UrlError::Malformed { .. })
        ));
    }

    #[test]
    fn unknown_and_malformed_urls_are_refused_without_leaking_passwords() {
        assert!(matches!(
            parse("mysql://db/app"),
            Err(UrlError::UnknownScheme { .. })
        ));
        assert!(matches!(parse(""), Err(UrlError::UnknownScheme { .. })));
        assert!(matches!(
            parse("locks.db"),
            Err(UrlError::UnknownScheme { .. })
        ));
        for url in [
            "redis://user:secret@host/0",
            "postgres://user:secret@host:notaport/db",
            "postgres://user:secret@[bad/db",
            "postgres://user:sec/ret@host/db?port=x&schema=a&schema=b",
            "postgres://user:se@cret@/db",
            "postgres://host/db?password=secret&schema=a&schema=b",
            "postgres://host/db?PassWord=secret&schema=a&schema=b",
            "foo:secret@host",
            "sqlite://a.db?password=secret",
        ] {
            let err = parse(url).unwrap_err();
            assert!(!err.to_string().contains("secret"), "{url}: {err}");
            assert!(!format!("{err:?}").contains("secret"), "{url}: {err:?}");
        }
        assert_eq!(
            masked("postgres://u:p@h/db?sslmode=disable&password=x"),
            "postgres://u:****@h/db?sslmode=disable&password=****"
        );
        assert!(matches!(
            parse("postgres://"),
            Err(UrlError::Malformed { .. })
        ));
    }
}
