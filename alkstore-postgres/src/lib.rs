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
mod deployment;
mod doctor;
mod errors;
mod listener;
mod protocol;
mod schema;
mod sql;
mod url;

use alkstore_core::{EngineStore, Error, Result};
use alkstore_sqlx::{Namespace, Polling, SqlxEngine, Wakeups};
use sqlx::PgPool;

use crate::listener::Notifications;
use crate::sql::Statements;

pub use deployment::{Deployment, Pooler};
pub use errors::DeploymentError;

pub use alkstore_core::SchemaVersionError;
pub use alkstore_sqlx::{
    CONNECT_TIMEOUT, ConnectError, DEFAULT_MAX_CONNECTIONS, NoServerConnection,
};
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
    /// the store in `schema`, creating it if missing. The URL's `pooler`
    /// and `listen` parameters say what stands between ([`Deployment`]);
    /// its `schema` parameter, if any, is ignored for the argument.
    pub async fn connect(url: &str, schema: &str) -> Result<Self> {
        let parsed = url::parse(url).map_err(|e| Error::database("connect", e))?;
        Self::connect_parsed(&parsed, schema).await
    }

    /// [`PgStore::connect`] on a URL already parsed.
    pub(crate) async fn connect_parsed(url: &url::Parsed, schema: &str) -> Result<Self> {
        schema::validate(schema)?;
        let options = connection::options(&url.driver)?;
        let mut deployment = Deployment::new().pooler(url.pooler);
        if let Some(within) = url.timeout {
            deployment = deployment.answer_within(within);
        }
        if let Some((host, port)) = &url.listen {
            deployment = deployment.listen_directly(options.clone().host(host).port(*port));
        }
        let pool = alkstore_sqlx::connect_pool_with::<connection::Postgres>(options).await?;
        Self::open_with(pool, schema, deployment).await
    }

    /// Opens the store in `schema` over an existing pool, creating the schema
    /// if missing. Safe when several processes open the same schema at once.
    /// The pool's connections go straight to the server, or through a
    /// pooler in session mode ([`PgStore::open_with`] for others).
    pub async fn open(pool: PgPool, schema: &str) -> Result<Self> {
        Self::open_with(pool, schema, Deployment::new()).await
    }

    /// Opens the store in `schema` over an existing pool whose connections
    /// go as `deployment` says (through a pooler in transaction mode, for
    /// one), creating the schema if missing.
    pub async fn open_with(pool: PgPool, schema: &str, deployment: Deployment) -> Result<Self> {
        schema::validate(schema)?;
        let protocol = deployment.protocol();
        let mut statements = Statements::new(schema, protocol);
        let lifecycle = schema::Schema::new(schema, &statements);
        let oid = async {
            alkstore_sqlx::lifecycle::open(&lifecycle, &pool).await?;
            lifecycle.oid(&pool).await
        }
        .await
        .map_err(|e| Error::database("open", errors::explain_boxed(e)))?;
        statements.channel = sql::channel(oid);
        let store_options = connection::store_options(&pool.connect_options());
        let wakeups: Box<dyn Wakeups> = match deployment.listen_options(&store_options) {
            Some(options) => Box::new(Notifications::new(
                options,
                &statements.channel,
                &statements.tag,
            )),
            None => Box::new(Polling(listener::POLL_CEILING)),
        };
        let engine = SqlxEngine::new(Namespace::schema(schema), pool, statements, wakeups)
            .with_answer_bound(deployment.get_answer_within(), deployment.via());
        Ok(PgStore {
            inner: EngineStore::new(engine),
        })
    }

    /// Whether this store's waiting calls wait in turn: `true` by default
    /// (first come, first served; docs/fair-waiting.md). With `false` they
    /// take no place in the queue and win the name when their attempt
    /// lands first ([`EngineStore::fair_waiting`](alkstore_core::EngineStore::fair_waiting)).
    pub fn fair_waiting(self, fair: bool) -> Self {
        PgStore {
            inner: self.inner.fair_waiting(fair),
        }
    }

    /// Whether renewals go to the server in batches (the default: `true`;
    /// [`EngineStore::renewals_in_batches`](alkstore_core::EngineStore::renewals_in_batches)):
    /// for the benchmark's A/B of the two paths.
    #[doc(hidden)]
    pub fn renewals_in_batches(self, batched: bool) -> Self {
        PgStore {
            inner: self.inner.renewals_in_batches(batched),
        }
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
            .map_err(|e| Error::database("drop_schema", errors::explain_boxed(e)))
    }
}

alkstore_core::delegate_store!(PgStore, inner);
