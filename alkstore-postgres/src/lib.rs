//! The PostgreSQL engine of alkstore: named locks with TTL leases that a
//! fleet of hosts shares through one server.
//!
//! - Every object lives in one schema the caller names (default `alkstore`).
//! - Acquire, renew and release are one statement, one round trip, each; a
//!   refused acquire writes nothing.
//! - The server's clock decides expiry, so hosts never disagree about it.
//! - Fences follow commit order: a grant's fence is drawn from the schema's
//!   sequence only while it holds a per-name advisory lock, after every
//!   earlier grant of the name committed (docs/engine-postgres.md).
//! - Waiting acquires are woken by releases through LISTEN/NOTIFY (one
//!   listener connection per store), with a bounded poll for expiries.
//!
//! ```no_run
//! use std::time::Duration;
//! use alkstore_core::Store;
//! use alkstore_postgres::PgStore;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> alkstore_core::Result<()> {
//! let store = PgStore::connect("postgres://app@db.internal/app", "alkstore").await?;
//! let me = alkstore_core::unique_owner("leader-candidate")?;
//! if let Some(lock) = store.try_lock("leader", &me, Duration::from_secs(15)).await? {
//!     lock.release().await?;
//! }
//! # Ok(())
//! # }
//! ```

mod connection;
mod doctor;
mod engine;
mod listener;
mod schema;
mod sql;
mod url;

use std::sync::Arc;

use alkstore_core::{EngineStore, Error, ReleaseBus, Result};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::sync::OnceCell;

use crate::connection::Connections;
use crate::engine::PgEngine;
use crate::sql::Statements;

pub use alkstore_core::SchemaVersionError;
pub use alkstore_sqlx::ConnectError;
pub use schema::{CannotCreateError, ForeignObjectsError, LostFencesError, MAX_SCHEMA_BYTES};
/// The layout version of the objects this build makes (recorded in `meta`).
pub use sql::SCHEMA_VERSION;
/// The connection pool type `PgStore::open` takes (sqlx's).
pub use sqlx::PgPool as Pool;
pub use url::ENGINE;

/// A tag no other store shares: process id, a counter, and the clock.
fn store_tag() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{}.{n}.{nanos}", std::process::id())
}

/// The default schema name.
pub const DEFAULT_SCHEMA: &str = "alkstore";

/// How long `connect` keeps trying to reach the server.
pub const CONNECT_TIMEOUT: std::time::Duration = alkstore_sqlx::CONNECT_TIMEOUT;

/// The most connections the pool `PgStore::connect` makes holds.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 10;

/// A lock store in one PostgreSQL schema.
#[derive(Debug)]
pub struct PgStore {
    inner: EngineStore<PgEngine>,
    schema: String,
}

impl PgStore {
    /// Connects a pool of up to [`DEFAULT_MAX_CONNECTIONS`] to `url` and opens
    /// the store in `schema`, creating it if missing.
    pub async fn connect(url: &str, schema: &str) -> Result<Self> {
        schema::validate(schema)?;
        let options: PgConnectOptions = url.parse().map_err(|e| Error::database("connect", e))?;
        alkstore_sqlx::check_connect::<connection::Postgres>(&options)
            .await
            .map_err(|e| Error::database("connect", e))?;
        let pool = PgPoolOptions::new()
            .max_connections(DEFAULT_MAX_CONNECTIONS)
            // Lock operations run on the store's own connections; the pool
            // serves opening and dropping the schema, where a ping that
            // weeds out a connection the server dropped is worth its trip.
            .test_before_acquire(true)
            .acquire_timeout(CONNECT_TIMEOUT)
            .connect_with(options)
            .await
            .map_err(|e| Error::database("connect", e))?;
        Self::open(pool, schema).await
    }

    /// Opens the store in `schema` over an existing pool, creating the schema
    /// if missing. Safe when several processes open the same schema at once.
    pub async fn open(pool: PgPool, schema: &str) -> Result<Self> {
        schema::validate(schema)?;
        let sql = Statements::new(schema);
        let oid = schema::open(&pool, schema, &sql)
            .await
            .map_err(|e| Error::database("open", e))?;
        let options = (*pool.connect_options()).clone();
        let connections = Connections::new(
            connection::options(options.clone()),
            pool.options().get_max_connections(),
        );
        let listen_pool = PgPoolOptions::new()
            .max_connections(1)
            .max_lifetime(None)
            .idle_timeout(None)
            .connect_lazy_with(options);
        let engine = PgEngine {
            connections,
            listen_pool,
            schema: schema.to_owned(),
            pool,
            sql,
            channel: sql::channel(oid),
            tag: store_tag(),
            bus: Arc::new(ReleaseBus::new()),
            listener: OnceCell::new(),
        };
        Ok(PgStore {
            inner: EngineStore::new(engine),
            schema: schema.to_owned(),
        })
    }

    /// The schema this store lives in.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The pool underneath.
    pub fn pool(&self) -> &PgPool {
        &self.inner.engine().pool
    }

    /// Drops alkstore's objects in the schema (tests and teardown), and the
    /// schema itself if alkstore created it and nothing else lives in it:
    /// never a schema it found (such as `public`), never anything it did not
    /// create. Fails closed after [`Store::close`](alkstore_core::Store::close).
    pub async fn drop_schema(&self) -> Result<()> {
        if self.inner.is_closed() {
            return Err(Error::closed("drop_schema"));
        }
        self.inner
            .engine()
            .drop_schema()
            .await
            .map_err(|e| Error::database("drop_schema", e))
    }
}

alkstore_core::delegate_store!(PgStore, inner);
