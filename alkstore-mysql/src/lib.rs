//! The MariaDB/MySQL engine of alkstore: named locks with TTL leases that a
//! fleet of hosts shares through one server.
//!
//! - Every object lives in one database the caller names (default
//!   `alkstore`), created if missing.
//! - Acquire, renew and release are one statement, one round trip, each
//!   (acquire is a `CALL` of the store's procedure); a refused acquire
//!   writes nothing.
//! - The server's clock decides expiry, so hosts never disagree about it.
//! - Fences follow commit order: a grant's fence is drawn from the
//!   database's sequence only while the grant holds the name's row lock
//!   (docs/engine-mysql.md).
//! - Waiting acquires in this process are woken by releases at once; a
//!   release in another process is seen by a bounded poll (MariaDB has no
//!   LISTEN/NOTIFY).
//!
//! Proven on MariaDB 10.11; the acquire procedure uses MariaDB's sequences,
//! which MySQL 8 lacks (docs/engine-mysql.md says what differs).
//!
//! ```no_run
//! use std::time::Duration;
//! use alkstore_core::Store;
//! use alkstore_mysql::MySqlStore;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> alkstore_core::Result<()> {
//! let store = MySqlStore::connect("mysql://app:secret@db.internal", "alkstore").await?;
//! let me = alkstore_core::unique_owner("leader-candidate")?;
//! if let Some(lock) = store.try_lock("leader", &me, Duration::from_secs(15)).await? {
//!     lock.release().await?;
//! }
//! # Ok(())
//! # }
//! ```

mod connection;
mod doctor;
mod schema;
mod sql;
mod url;

use std::time::Duration;

use alkstore_core::{EngineStore, Error, Result};
use alkstore_sqlx::{Namespace, Polling, SqlxEngine};
use sqlx::MySqlPool;

use crate::connection::MySql;
use crate::sql::Statements;

pub use alkstore_core::SchemaVersionError;
pub use alkstore_sqlx::{CONNECT_TIMEOUT, ConnectError, DEFAULT_MAX_CONNECTIONS};
pub use schema::{
    CannotSeeEverythingError, ForeignObjectsError, LostFencesError, MAX_DATABASE_BYTES,
};
/// The layout version of the objects this build makes (recorded in `meta`).
pub use sql::SCHEMA_VERSION;
/// The connection pool type `MySqlStore::open` takes (sqlx's).
pub use sqlx::MySqlPool as Pool;
pub use url::ENGINE;

/// The default database name.
pub const DEFAULT_DATABASE: &str = "alkstore";

/// How long a waiter in another process sleeps at most between attempts:
/// MariaDB has no LISTEN/NOTIFY, so a release in another process is seen by
/// polling (releases in this process wake waiters at once).
const POLL_CEILING: Duration = Duration::from_millis(50);

/// A lock store in one MariaDB/MySQL database.
#[derive(Debug)]
pub struct MySqlStore {
    inner: EngineStore<SqlxEngine<Statements>>,
}

impl MySqlStore {
    /// Connects a pool of up to [`DEFAULT_MAX_CONNECTIONS`] to `url` and
    /// opens the store in `database`, creating it if missing. A database in
    /// `url`'s path is only the session's default; the store's objects are
    /// always named with `database`.
    pub async fn connect(url: &str, database: &str) -> Result<Self> {
        schema::validate(database)?;
        Self::open(alkstore_sqlx::connect_pool::<MySql>(url).await?, database).await
    }

    /// Opens the store in `database` over an existing pool, creating what
    /// is missing. Safe when several processes open the same database at once.
    pub async fn open(pool: MySqlPool, database: &str) -> Result<Self> {
        schema::validate(database)?;
        let statements = Statements::new(database);
        let lifecycle = schema::Database::new(database, &statements);
        alkstore_sqlx::lifecycle::open(&lifecycle, &pool)
            .await
            .map_err(|e| Error::database("open", e))?;
        let engine = SqlxEngine::new(
            Namespace::database(database),
            pool,
            statements,
            Box::new(Polling(POLL_CEILING)),
        );
        Ok(MySqlStore {
            inner: EngineStore::new(engine),
        })
    }

    /// Whether this store's waiting calls wait in turn: `true` by default
    /// (first come, first served; docs/fair-waiting.md). With `false` they
    /// take no place in the queue and win the name when their attempt
    /// lands first ([`EngineStore::fair_waiting`](alkstore_core::EngineStore::fair_waiting)).
    pub fn fair_waiting(self, fair: bool) -> Self {
        MySqlStore {
            inner: self.inner.fair_waiting(fair),
        }
    }

    /// Whether renewals go to the server in batches (the default: `true`;
    /// [`EngineStore::renewals_in_batches`](alkstore_core::EngineStore::renewals_in_batches)):
    /// for the benchmark's A/B of the two paths.
    #[doc(hidden)]
    pub fn renewals_in_batches(self, batched: bool) -> Self {
        MySqlStore {
            inner: self.inner.renewals_in_batches(batched),
        }
    }

    /// The database this store lives in.
    pub fn database(&self) -> &str {
        &self.inner.engine().namespace().name
    }

    /// The pool underneath.
    pub fn pool(&self) -> &MySqlPool {
        self.inner.engine().pool()
    }

    /// Drops alkstore's objects in the database (tests and teardown), and
    /// the database itself if alkstore created it and nothing else lives in
    /// it. Fails closed after [`Store::close`](alkstore_core::Store::close).
    pub async fn drop_database(&self) -> Result<()> {
        if self.inner.is_closed() {
            return Err(Error::closed("drop_database"));
        }
        let engine = self.inner.engine();
        let lifecycle = schema::Database::new(self.database(), engine.statements());
        alkstore_sqlx::lifecycle::drop(&lifecycle, engine.pool())
            .await
            .map_err(|e| Error::database("drop_database", e))
    }
}

alkstore_core::delegate_store!(MySqlStore, inner);
