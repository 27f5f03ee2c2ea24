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
mod listener;
mod schema;
mod sql;
mod url;

use alkstore_core::{EngineStore, Error, Result};
use alkstore_sqlx::{Namespace, SqlxEngine};
use sqlx::PgPool;

use crate::connection::Postgres;
use crate::listener::Notifications;
use crate::sql::Statements;

pub use alkstore_core::SchemaVersionError;
pub use alkstore_sqlx::{CONNECT_TIMEOUT, ConnectError, DEFAULT_MAX_CONNECTIONS};
pub use schema::{CannotCreateError, ForeignObjectsError, LostFencesError, MAX_SCHEMA_BYTES};
/// The layout version of the objects this build makes (recorded in `meta`).
pub use sql::SCHEMA_VERSION;
/// The connection pool type `PgStore::open` takes (sqlx's).
pub use sqlx::PgPool as Pool;
pub use url::ENGINE;

/// The default schema name.
pub const DEFAULT_SCHEMA: &str = "alkstore";

/// A lock store in one PostgreSQL schema.
#[derive(Debug)]
pub struct PgStore {
    inner: EngineStore<SqlxEngine<Statements>>,
}

impl PgStore {
    /// Connects a pool of up to [`DEFAULT_MAX_CONNECTIONS`] to `url` and opens
    /// the store in `schema`, creating it if missing.
    pub async fn connect(url: &str, schema: &str) -> Result<Self> {
        schema::validate(schema)?;
        Self::open(alkstore_sqlx::connect_pool::<Postgres>(url).await?, schema).await
    }

    /// Opens the store in `schema` over an existing pool, creating the schema
    /// if missing. Safe when several processes open the same schema at once.
    pub async fn open(pool: PgPool, schema: &str) -> Result<Self> {
        schema::validate(schema)?;
        let mut statements = Statements::new(schema);
        let lifecycle = schema::Schema::new(schema, &statements);
        let oid = async {
            alkstore_sqlx::lifecycle::open(&lifecycle, &pool).await?;
            lifecycle.oid(&pool).await
        }
        .await
        .map_err(|e| Error::database("open", e))?;
        statements.channel = sql::channel(oid);
        let notifications = Notifications::new(
            (*pool.connect_options()).clone(),
            &statements.channel,
            &statements.tag,
        );
        let engine = SqlxEngine::new(
            Namespace::schema(schema),
            pool,
            statements,
            Box::new(notifications),
        );
        Ok(PgStore {
            inner: EngineStore::new(engine),
        })
    }

    /// The schema this store lives in.
    pub fn schema(&self) -> &str {
        &self.inner.engine().namespace().name
    }

    /// The pool underneath.
    pub fn pool(&self) -> &PgPool {
        self.inner.engine().pool()
    }

    /// Drops alkstore's objects in the schema (tests and teardown), and the
    /// schema itself if alkstore created it and nothing else lives in it:
    /// never a schema it found (such as `public`), never anything it did not
    /// create. Fails closed after [`Store::close`](alkstore_core::Store::close).
    pub async fn drop_schema(&self) -> Result<()> {
        if self.inner.is_closed() {
            return Err(Error::closed("drop_schema"));
        }
        let engine = self.inner.engine();
        let lifecycle = schema::Schema::new(self.schema(), engine.statements());
        alkstore_sqlx::lifecycle::drop(&lifecycle, engine.pool())
            .await
            .map_err(|e| Error::database("drop_schema", e))
    }
}

alkstore_core::delegate_store!(PgStore, inner);
