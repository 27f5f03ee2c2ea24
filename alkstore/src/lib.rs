//! Named locks with TTL leases over pluggable storage engines.
//!
//! A lock is a name that one owner holds at a time, for a lease (`ttl`) the
//! holder renews or lets lapse. Each grant carries a fencing token that is
//! strictly greater than every earlier grant's for the same name.
//!
//! ```
//! use std::time::Duration;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> alkstore::Result<()> {
//! let store = alkstore::open("sqlite::memory:").await?;
//! // An owner names one holder (this run), never a whole host or process.
//! let me = alkstore::unique_owner("report-run")?;
//! if let Some(lock) = store.try_lock("nightly-report", &me, Duration::from_secs(30)).await? {
//!     // ... the job runs in this holder only; pass lock.fence() to what it writes ...
//!     assert!(lock.renew(Duration::from_secs(30)).await?);
//!     lock.release().await?;
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Engines, chosen by feature flag: `sqlite` (default, embedded, bundled
//! SQLite) and `postgres` (a server shared by a fleet of hosts). The engine
//! crates can also be used directly: `alkstore_sqlite::SqliteStore`,
//! `alkstore_postgres::PgStore`.

mod url;

// What a lock user needs, at the root.
pub use alkstore_core::{
    BoxError, Closed, DurationError, Error, Field, Holder, KeepAlive, KeepAliveOptions,
    KeepAliveOptionsError, LeaseStatus, Lock, LostReason, MAX_LEASE_MILLIS, MAX_NAME_BYTES,
    NameProblem, RESERVED_PREFIX, Result, Store, unique_owner, validate_name, validate_owner,
};

/// For engine authors: what an engine implements and what the core gives
/// it. A lock user needs none of this (see `docs/writing-an-engine.md`).
pub mod engine {
    pub use alkstore_core::{
        Attempt, Engine, EngineStore, GrantKey, LeaseMillis, ReleaseBus, Subscription, check_text,
        clock, delegate_store, fence_from_sql, fence_to_sql, lease_left, wait,
    };
}
pub use url::{DEFAULT_SCHEMA, UrlError};

#[cfg(feature = "postgres")]
pub use alkstore_postgres as postgres;
#[cfg(feature = "sqlite")]
pub use alkstore_sqlite as sqlite;

use crate::url::Target;

/// Opens the store a URL names:
///
/// - `sqlite::memory:` — a private in-memory database;
/// - `sqlite://locks.db` (relative path), `sqlite:///var/lib/app/locks.db` (absolute);
/// - `postgres://user@host/db?schema=name` (or `postgresql://`); `schema` is
///   alkstore's own parameter (default [`DEFAULT_SCHEMA`]) and is not passed to
///   the driver.
///
/// An unknown or malformed URL, or one naming an engine this build leaves out,
/// is an [`Error::Database`] whose source is a [`UrlError`]; nothing is opened.
pub async fn open(url: &str) -> Result<Box<dyn Store>> {
    let target = url::parse(url).map_err(|e| Error::database("open", e))?;
    match target {
        #[cfg(feature = "sqlite")]
        Target::SqliteMemory => Ok(Box::new(
            alkstore_sqlite::SqliteStore::open_in_memory().await?,
        )),
        #[cfg(feature = "sqlite")]
        Target::SqliteFile(path) => Ok(Box::new(alkstore_sqlite::SqliteStore::open(path).await?)),
        #[cfg(not(feature = "sqlite"))]
        Target::SqliteMemory | Target::SqliteFile(_) => Err(Error::database(
            "open",
            UrlError::EngineNotEnabled { engine: "sqlite" },
        )),
        #[cfg(feature = "postgres")]
        Target::Postgres { url, schema } => Ok(Box::new(
            alkstore_postgres::PgStore::connect(&url, &schema).await?,
        )),
        #[cfg(not(feature = "postgres"))]
        Target::Postgres { .. } => Err(Error::database(
            "open",
            UrlError::EngineNotEnabled { engine: "postgres" },
        )),
    }
}
