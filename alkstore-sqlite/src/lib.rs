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
//! SQLite is blocking; every store owns one connection on a thread of its own
//! and async callers only send it jobs, so tokio's worker threads never block.
//! The host's system clock decides expiry (every client is on this host).

mod bus;
mod engine;
mod schema;
mod sql;
mod worker;

use std::path::Path;
use std::sync::Arc;

use alkstore_core::{EngineStore, Error, ReleaseBus, Result};
use rusqlite::{Connection, OpenFlags};

use crate::engine::SqliteEngine;
use crate::worker::Worker;

pub use schema::SchemaVersionError;

/// A lock store in one SQLite database.
///
/// Cheap to share behind an `Arc`; all calls go through one connection owned by
/// a dedicated thread. Several stores (in this process or others) may open the
/// same file.
#[derive(Debug)]
pub struct SqliteStore {
    inner: EngineStore<SqliteEngine>,
}

impl SqliteStore {
    /// Opens (creating if needed) the database file at `path`, in WAL mode, and
    /// creates alkstore's tables if they are missing.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_owned();
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

    fn from_engine(engine: SqliteEngine) -> Self {
        SqliteStore {
            inner: EngineStore::new(engine),
        }
    }
}

alkstore_core::delegate_store!(SqliteStore, inner);
