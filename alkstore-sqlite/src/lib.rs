//! The embedded SQLite engine of alkstore: named locks with TTL leases in one
//! database file (or in memory), shared safely by several processes on one host.
//!
//! ```
//! use std::time::Duration;
//! use alkstore_core::Store;
//! use alkstore_sqlite::SqliteStore;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> alkstore_core::Result<()> {
//! let store = SqliteStore::open_in_memory().await?;
//! let lock = store.try_lock("nightly-report", "worker-1", Duration::from_secs(30)).await?;
//! let lock = lock.expect("the name was free");
//! assert!(store.try_lock("nightly-report", "worker-2", Duration::from_secs(30)).await?.is_none());
//! assert!(lock.release().await?);
//! # Ok(())
//! # }
//! ```
//!
//! SQLite is blocking; every store owns one connection and a thread of its
//! own. A call runs on the caller's thread when the connection is free and
//! SQLite can answer without waiting for another connection's lock (busy
//! timeout zero), and on the connection's thread otherwise: a tokio worker
//! never waits on another process's lock.
//! The host's system clock decides expiry (every client is on this host).

mod bus;
mod doctor;
mod engine;
mod schema;
mod sql;
mod url;
mod worker;

use std::path::Path;
use std::sync::Arc;

use alkstore_core::{EngineStore, Error, ReleaseBus, Result};
use rusqlite::{Connection, OpenFlags};

use crate::engine::SqliteEngine;
use crate::worker::Worker;

pub use alkstore_core::SchemaVersionError;
pub use url::ENGINE;
pub use worker::WorkerCrashed;

/// [`SqliteStore::open`] was given an empty path; found in the source chain of
/// the `Error::Database` it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the database path is empty (use SqliteStore::open_in_memory for a private database)")]
pub struct EmptyPath;

/// The engine's row operations run on the caller's thread, without the async
/// bridge: for the benchmark's floor only (what the SQL itself costs). Not
/// part of the public API.
#[doc(hidden)]
pub mod unbridged {
    use alkstore_core::{Attempt, GrantKey};
    use rusqlite::Connection;

    /// Applies the engine's connection settings and schema to `conn`.
    pub fn prepare(conn: &mut Connection) -> Result<(), alkstore_core::BoxError> {
        crate::schema::prepare(conn)
    }

    /// The engine's acquire, as the store's thread runs it.
    pub fn acquire(
        conn: &mut Connection,
        name: &str,
        owner: &str,
        ttl_ms: i64,
    ) -> rusqlite::Result<Attempt> {
        crate::engine::acquire(
            conn,
            name,
            owner,
            ttl_ms,
            alkstore_core::Queue::Never,
            None,
            crate::schema::BUSY_TIMEOUT,
        )
    }

    /// The engine's release, as the store's thread runs it.
    pub fn release(conn: &Connection, grant: &GrantKey) -> rusqlite::Result<bool> {
        crate::engine::release(conn, grant)
    }
}

/// A lock store in one SQLite database.
///
/// Cheap to share behind an `Arc`; all calls go through one connection,
/// inline when it is free and answers at once, else on its own thread.
/// Several stores (in this process or others) may open the same file.
#[derive(Debug)]
pub struct SqliteStore {
    inner: EngineStore<SqliteEngine>,
}

impl SqliteStore {
    /// Opens (creating if needed) the database file at `path`, in WAL mode, and
    /// creates alkstore's tables if they are missing.
    ///
    /// An empty path is refused with [`EmptyPath`] (SQLite would silently
    /// open a private temporary database instead).
    pub async fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_owned();
        if path.as_os_str().is_empty() {
            return Err(Error::database("open", EmptyPath));
        }
        let opened = path.clone();
        let worker = Worker::start(move || {
            let mut conn = Connection::open(&opened)?;
            schema::prepare(&mut conn)?;
            Ok(conn)
        })
        .await
        .map_err(|e| Error::database("open", e))?;
        // The file exists now, so it has a canonical path for the shared bus.
        let bus = match std::fs::canonicalize(&path) {
            Ok(canonical) => bus::for_file(canonical),
            Err(_) => Arc::new(ReleaseBus::new()),
        };
        Ok(Self::from_engine(SqliteEngine { worker, bus }))
    }

    /// Opens a private in-memory database, gone when the store closes.
    pub async fn open_in_memory() -> Result<Self> {
        let worker = Worker::start(|| {
            let mut conn = Connection::open_in_memory_with_flags(OpenFlags::default())?;
            schema::prepare(&mut conn)?;
            Ok(conn)
        })
        .await
        .map_err(|e| Error::database("open", e))?;
        Ok(Self::from_engine(SqliteEngine {
            worker,
            bus: Arc::new(ReleaseBus::new()),
        }))
    }

    /// Whether this store's waiting calls wait in turn: `true` by default
    /// (first come, first served; docs/fair-waiting.md). With `false` they
    /// take no place in the queue and win the name when their attempt
    /// lands first ([`EngineStore::fair_waiting`](alkstore_core::EngineStore::fair_waiting)).
    pub fn fair_waiting(self, fair: bool) -> Self {
        SqliteStore {
            inner: self.inner.fair_waiting(fair),
        }
    }

    /// Whether renewals go to the server in batches (the default: `true`;
    /// [`EngineStore::renewals_in_batches`](alkstore_core::EngineStore::renewals_in_batches)):
    /// for the benchmark's A/B of the two paths.
    #[doc(hidden)]
    pub fn renewals_in_batches(self, batched: bool) -> Self {
        SqliteStore {
            inner: self.inner.renewals_in_batches(batched),
        }
    }

    fn from_engine(engine: SqliteEngine) -> Self {
        SqliteStore {
            inner: EngineStore::new(engine),
        }
    }
}

alkstore_core::delegate_store!(SqliteStore, inner);
