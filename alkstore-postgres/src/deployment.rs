//! What stands between the store and PostgreSQL: nothing, or a pooler in
//! session or transaction mode — and where the store listens for other
//! processes' releases (docs/deployments.md).

use std::time::Duration;

use sqlx::postgres::PgConnectOptions;

use crate::protocol::Protocol;

/// The pooler between the store and the server, as the URL's `pooler`
/// parameter names it (`none`, `session`, `transaction`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Pooler {
    /// None: the store talks to the server itself (the default).
    #[default]
    None,
    /// A pooler in session mode (PgBouncer's `pool_mode = session`): each
    /// client connection keeps one server connection for its life, so the
    /// store works as it does without one.
    Session,
    /// A pooler in transaction mode (PgBouncer's `pool_mode = transaction`,
    /// RDS Proxy, Supavisor's transaction port): each transaction may run on
    /// another server connection, shared with other clients. Every statement
    /// goes as one simple-protocol message, values written in as literals
    /// (no prepared statement outlives it), READ COMMITTED is set per
    /// transaction (no session setting), and releases by other processes
    /// reach waiters through a direct connection when one is given
    /// ([`Deployment::listen_directly`]), else by polling every 250 ms at
    /// most.
    Transaction,
}

impl Pooler {
    /// The URL parameter's values.
    pub(crate) fn from_param(value: &str) -> Option<Self> {
        match value {
            "none" => Some(Pooler::None),
            "session" => Some(Pooler::Session),
            "transaction" => Some(Pooler::Transaction),
            _ => None,
        }
    }
}

/// How a store reaches PostgreSQL: [`PgStore::open_with`](crate::PgStore::open_with)
/// takes it; `connect` and URLs read it from the `pooler` and `listen`
/// parameters.
///
/// ```
/// use alkstore_postgres::{Deployment, Pooler};
/// use sqlx::postgres::PgConnectOptions;
///
/// // PgBouncer in transaction mode on :6432; LISTEN straight at the
/// // server, with the pool's user, password and TLS settings.
/// let pool: PgConnectOptions =
///     "postgres://app@bouncer:6432/app?sslmode=verify-full".parse().unwrap();
/// let deployment = Deployment::new()
///     .pooler(Pooler::Transaction)
///     .listen_directly(pool.clone().host("db.internal").port(5432));
/// assert_eq!(deployment.get_pooler(), Pooler::Transaction);
/// ```
#[derive(Debug, Clone)]
pub struct Deployment {
    pooler: Pooler,
    listen: Option<PgConnectOptions>,
    answer_within: Duration,
}

impl Default for Deployment {
    fn default() -> Self {
        Deployment {
            pooler: Pooler::None,
            listen: None,
            answer_within: alkstore_sqlx::ANSWER_WITHIN,
        }
    }
}

impl Deployment {
    /// Straight to the server, listening on the store's own connection options.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every statement unanswered `within` past its own lock waits fails
    /// the call with [`alkstore_sqlx::NoAnswer`] (default
    /// [`alkstore_sqlx::ANSWER_WITHIN`], 10 s; the URL's `timeout=`): a
    /// server gone behind a pooler, which holds the query (PgBouncer for
    /// `query_wait_timeout`, 120 s by default), or cut off by the network.
    /// A zero bound is taken as 1 ms.
    pub fn answer_within(mut self, within: Duration) -> Self {
        self.answer_within = within.max(Duration::from_millis(1));
        self
    }

    /// The bound [`Deployment::answer_within`] set.
    pub fn get_answer_within(&self) -> Duration {
        self.answer_within
    }

    /// What stands between, as an error names it.
    pub(crate) fn via(&self) -> Option<String> {
        match self.pooler {
            Pooler::None => None,
            Pooler::Session => Some("a pooler in session mode".to_owned()),
            Pooler::Transaction => Some("a pooler in transaction mode".to_owned()),
        }
    }

    /// With `pooler` between the store and the server.
    pub fn pooler(mut self, pooler: Pooler) -> Self {
        self.pooler = pooler;
        self
    }

    /// LISTEN for other processes' releases over a connection made with
    /// `options`: straight to the server, past a pooler in transaction mode
    /// (which cannot keep a LISTEN). Without it, a store behind such a
    /// pooler polls. Made from the pool's options with another host and
    /// port, it keeps their TLS settings (`sslmode`, the CA), checked
    /// against its own host name.
    pub fn listen_directly(mut self, options: PgConnectOptions) -> Self {
        self.listen = Some(options);
        self
    }

    /// The pooler it names.
    pub fn get_pooler(&self) -> Pooler {
        self.pooler
    }

    /// How statements travel.
    pub(crate) fn protocol(&self) -> Protocol {
        match self.pooler {
            Pooler::Transaction => Protocol::Simple,
            Pooler::None | Pooler::Session => Protocol::Prepared,
        }
    }

    /// Where to LISTEN: the direct connection's options when given;
    /// otherwise the store's own (`store`) unless a pooler in transaction
    /// mode stands between (`None`: poll).
    pub(crate) fn listen_options(&self, store: &PgConnectOptions) -> Option<PgConnectOptions> {
        match (&self.listen, self.pooler) {
            (Some(direct), _) => Some(direct.clone()),
            (None, Pooler::Transaction) => None,
            (None, Pooler::None | Pooler::Session) => Some(store.clone()),
        }
    }
}
