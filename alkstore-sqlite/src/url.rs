//! The URLs this engine opens: `sqlite::memory:` (also `sqlite://:memory:`),
//! `sqlite://relative/path.db` and `sqlite:///absolute/path.db`.

use std::path::PathBuf;

use alkstore_core::url::OpenFuture;
use alkstore_core::{EngineDescriptor, Error, Store, UrlError};

use crate::SqliteStore;

/// The SQLite engine, as `alkstore::open` finds it.
pub const ENGINE: EngineDescriptor = EngineDescriptor {
    name: "sqlite",
    schemes: &["sqlite:"],
    open: open_url,
    inspect: crate::doctor::inspect_url,
    standby: alkstore_core::url::never_standby,
};

/// Where a URL points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    Memory,
    File(PathBuf),
}

pub(crate) fn parse(url: &str) -> Result<Target, UrlError> {
    if url == "sqlite::memory:" || url == "sqlite://:memory:" {
        return Ok(Target::Memory);
    }
    match url.strip_prefix("sqlite://") {
        Some(path) if !path.is_empty() && !path.contains('?') => Ok(Target::File(path.into())),
        _ => Err(UrlError::malformed(
            url,
            "expected sqlite::memory: or a file path after sqlite:// (no query parameters)",
        )),
    }
}

fn open_url(url: &str) -> OpenFuture<'_> {
    Box::pin(async move {
        let store = match parse(url).map_err(|e| Error::database("open", e))? {
            Target::Memory => SqliteStore::open_in_memory().await?,
            Target::File(path) => SqliteStore::open(path).await?,
        };
        Ok(Box::new(store) as Box<dyn Store>)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_forms() {
        assert_eq!(parse("sqlite::memory:"), Ok(Target::Memory));
        assert_eq!(parse("sqlite://:memory:"), Ok(Target::Memory));
        assert_eq!(
            parse("sqlite://locks.db"),
            Ok(Target::File("locks.db".into()))
        );
        assert_eq!(
            parse("sqlite:///var/lib/app/locks.db"),
            Ok(Target::File("/var/lib/app/locks.db".into()))
        );
        for bad in ["sqlite://", "sqlite://a.db?mode=ro", "sqlite:a.db"] {
            assert!(
                matches!(parse(bad), Err(UrlError::Malformed { .. })),
                "{bad}"
            );
        }
        let err = parse("sqlite://a.db?password=secret").unwrap_err();
        assert!(!err.to_string().contains("secret"), "{err}");
    }
}
