//! The URLs this engine opens: `mysql://user:password@host:port/database`
//! and the same with `mariadb://`. The path names the store's database
//! (default [`DEFAULT_DATABASE`]), which need not exist yet: the driver
//! connects without it, and the store's statements name it themselves.

use alkstore_core::url::OpenFuture;
use alkstore_core::{EngineDescriptor, Error, Store, UrlError};

use crate::{DEFAULT_DATABASE, MySqlStore};

/// The MariaDB/MySQL engine, as `alkstore::open` finds it.
pub const ENGINE: EngineDescriptor = EngineDescriptor {
    name: "mysql",
    schemes: &["mysql://", "mariadb://"],
    open: open_url,
    inspect: crate::doctor::inspect_url,
    standby: alkstore_core::url::never_standby,
};

/// The URL to hand the driver (`mysql://`, no database) and the database.
pub(crate) fn parse(url: &str) -> Result<(String, String), UrlError> {
    let malformed = |problem: String| UrlError::malformed(url, problem);
    let mut parsed = ::url::Url::parse(url).map_err(|e| malformed(e.to_string()))?;
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(malformed("no host".into()));
    }
    let path = parsed.path().trim_start_matches('/');
    if path.contains('/') {
        return Err(malformed(
            "expected at most one path segment, the database".into(),
        ));
    }
    let database = if path.is_empty() {
        DEFAULT_DATABASE.to_owned()
    } else {
        // Percent-decoding only: a `+` in a path is a plus, not a space.
        ::url::form_urlencoded::parse(format!("d={}", path.replace('+', "%2B")).as_bytes())
            .next()
            .map(|(_, d)| d.into_owned())
            .unwrap_or_default()
    };
    parsed.set_path("");
    let driver = parsed.as_str().replacen("mariadb://", "mysql://", 1);
    Ok((driver, database))
}

fn open_url(url: &str) -> OpenFuture<'_> {
    Box::pin(async move {
        let (url, database) = parse(url).map_err(|e| Error::database("open", e))?;
        Ok(Box::new(MySqlStore::connect(&url, &database).await?) as Box<dyn Store>)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_path_names_the_database() {
        assert_eq!(
            parse("mysql://u:p@db:3306/locks?ssl-mode=disabled"),
            Ok((
                "mysql://u:p@db:3306?ssl-mode=disabled".into(),
                "locks".into()
            ))
        );
        assert_eq!(
            parse("mariadb://db"),
            Ok(("mysql://db".into(), DEFAULT_DATABASE.into()))
        );
        assert_eq!(
            parse("mysql://db/a+b"),
            Ok(("mysql://db".into(), "a+b".into()))
        );
        assert_eq!(
            parse("mysql://db/a%60%3B%20DROP"),
            Ok(("mysql://db".into(), "a`; DROP".into()))
        );
        for bad in ["mysql://", "mysql://db/a/b", "mysql://u:secret@db:x/a"] {
            let err = parse(bad).unwrap_err();
            assert!(matches!(err, UrlError::Malformed { .. }), "{bad}");
            assert!(!err.to_string().contains("secret"), "{err}");
        }
    }
}
