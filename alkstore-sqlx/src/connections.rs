//! The store's own connections: one checkout, one statement, one round
//! trip; retries after a rolled-back statement or a lost connection.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use alkstore_core::{BoxError, Closed, UrlError};
use sqlx::{ConnectOptions, Connection};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::{Conn, Dialect, Options, TlsParams};

/// How long opening a connection may take before the operation fails.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long past its own lock waits a statement may go unanswered before
/// the call fails with [`NoAnswer`] (its connection dropped, so that the
/// server rolls back whatever did not commit): 10 s. A server that died
/// answers a direct connection at once (refused, reset); a pooler in front
/// of it holds the query instead (PgBouncer for `query_wait_timeout`,
/// 120 s by default), and a server cut off by the network answers nothing.
/// Settable per store (the PostgreSQL URL's `timeout=`; MariaDB stores
/// keep this default).
pub const ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// How many times a statement the server rolled back whole (a deadlock
/// victim) is run again before its error is the answer.
pub const ROLLED_BACK_RETRIES: u32 = 3;

/// How much longer than the first try's deadline a try after a lost
/// connection may wait: the first try's lock waits ended at the deadline,
/// and this is time for it to finish and for the second to see the result.
pub const RETRY_GRACE: Duration = Duration::from_millis(250);

/// What [`Connections::run`] does when a reused connection turns out lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnLostConnection {
    /// Run the statement once more on a new connection: a second run has the
    /// same outcome as one (a renewal, a read), or the engine reads its
    /// answer knowing the first may have committed ([`Try::after_lost_connection`]).
    RunAgain,
    /// Answer the error: a second run could do what the first did already
    /// and answer otherwise (a purge would count fewer rows).
    Fail,
}

/// Which try of a statement runs, as [`Connections::run`] tells the statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Try {
    /// The deadline of this try's waits for locks on the server, if any.
    pub bound: Option<Instant>,
    /// An earlier try's connection was lost: it may have committed.
    pub after_lost_connection: bool,
}

/// The server could not be reached or would not let the store in: the
/// first connection's own error (refused, unknown host, authentication
/// failed, no such database), with where it went — never a password.
#[derive(Debug, thiserror::Error)]
#[error("cannot connect to {server}")]
pub struct ConnectError {
    /// Host and port (or socket) the connection went to.
    pub server: String,
    #[source]
    source: BoxError,
}

/// Makes one connection with `options` and closes it: a store's
/// constructor runs this before it builds its pool, because a pool answers a
/// refused connection only with a timeout ([`CONNECT_TIMEOUT`] later) that
/// hides the cause.
pub async fn check_connect<D: Dialect>(options: &Options<D>) -> Result<(), ConnectError> {
    let _ = connect::<D>(options).await?.close().await;
    Ok(())
}

/// Makes one connection with `options` (within [`CONNECT_TIMEOUT`]), its
/// failure a [`ConnectError`] saying where it went and why.
pub async fn connect<D: Dialect>(options: &Options<D>) -> Result<Conn<D>, ConnectError> {
    let failed = |source: BoxError| ConnectError {
        server: D::server(options),
        source,
    };
    tokio::time::timeout(CONNECT_TIMEOUT, options.connect())
        .await
        .map_err(|_| failed(format!("no answer within {CONNECT_TIMEOUT:?}").into()))?
        .map_err(|e| failed(D::explain_connect(e, options)))
}

/// Connects to the server a driver URL names, for a one-off look (what
/// `alkstore doctor` reads): where it is, for a report (never a password),
/// and the connection.
pub async fn connect_url<D: Dialect>(url: &str) -> Result<(String, Conn<D>), BoxError> {
    let options = driver_options::<D>(url)?;
    let conn = connect::<D>(&options).await?;
    Ok((D::server(&options), conn))
}

/// A waiting acquire's deadline passed before a connection was free or made:
/// nothing was sent, and the engine reports the attempt as refused.
#[derive(Debug, thiserror::Error)]
#[error("the wait ran out before a connection was ready")]
pub struct OutOfTime;

/// What runs once on each new connection of a store, after
/// [`Dialect::prepare`] and before its first statement: session state the
/// store's statements rely on, where the deployment keeps it (a pooler in
/// transaction mode does not, and a store behind one has none).
pub type Setup<D> =
    Arc<dyn for<'c> Fn(&'c mut Conn<D>) -> StatementFuture<'c, ()> + Send + Sync + 'static>;

/// A new connection was let in, but its first statement had no answer in
/// [`CONNECT_TIMEOUT`] (or the store's shorter [answer
/// bound](Connections::with_answer_bound)): a pooler between the store and
/// the server most likely queued it for a server connection none of its
/// clients gave back (in session mode each client keeps one for its whole
/// life), or for a server that is down.
#[derive(Debug, thiserror::Error)]
#[error(
    "a new connection to {server}{via} was let in, but its first statement had no answer \
     in time: a pooler in front of the server has no server connection free for it, \
     or the server behind the pooler is down or unreachable. A pool too small: this \
     store makes up to {max} connections, and one more to listen while someone waits; \
     raise the pooler's pool (PgBouncer: default_pool_size, max_db_connections), use \
     transaction mode, or lower the store's max_connections"
)]
pub struct NoServerConnection {
    /// Host and port (or socket) the connection went to.
    pub server: String,
    /// What stands between, as the store was told (`" through a pooler in
    /// session mode"`), or empty.
    pub via: String,
    /// The most connections the store makes.
    pub max: u32,
}

/// A statement had no answer within the store's bound ([`ANSWER_WITHIN`]
/// past its own lock waits): the server is down or cut off, or a pooler
/// in front of it holds the query. Its outcome is unknown: a grant it made
/// lapses with its lease, and its connection was dropped.
#[derive(Debug, thiserror::Error)]
#[error(
    "no answer from {server}{via} within {within:?}: the server is down or unreachable{hint} \
     (a bound of the store: a PostgreSQL URL sets it with timeout=)"
)]
pub struct NoAnswer {
    /// Host and port (or socket) the connection went to.
    pub server: String,
    /// What stands between, as the store was told (`" through a pooler in
    /// transaction mode"`), or empty.
    pub via: String,
    /// The bound that passed, past the statement's own lock waits.
    pub within: Duration,
    hint: &'static str,
}

/// Idle connections and the permits that bound how many exist.
pub struct Connections<D: Dialect> {
    options: Options<D>,
    setup: Option<Setup<D>>,
    answer_within: Duration,
    /// What stands between the store and the server, for [`NoAnswer`].
    via: Option<String>,
    max: u32,
    idle: Mutex<Vec<Conn<D>>>,
    permits: Arc<Semaphore>,
    closed: AtomicBool,
}

impl<D: Dialect> std::fmt::Debug for Connections<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connections")
            .field("options", &self.options)
            .field("available", &self.permits.available_permits())
            .field("closed", &self.closed.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl<D: Dialect> Connections<D> {
    /// At most `max` connections (at least one), made with `options`.
    pub fn new(options: Options<D>, max: u32) -> Self {
        Connections {
            options,
            setup: None,
            answer_within: ANSWER_WITHIN,
            via: None,
            max: max.max(1),
            idle: Mutex::new(Vec::new()),
            permits: Arc::new(Semaphore::new(max.max(1) as usize)),
            closed: AtomicBool::new(false),
        }
    }

    /// With `setup` run on each new connection ([`Setup`]).
    pub fn with_setup(mut self, setup: Setup<D>) -> Self {
        self.setup = Some(setup);
        self
    }

    /// With statements unanswered `within` past their own lock waits
    /// failing with [`NoAnswer`], which names `via` (a pooler between the
    /// store and the server, `None` for none) when given.
    pub fn with_answer_bound(mut self, within: Duration, via: Option<String>) -> Self {
        self.answer_within = within;
        self.via = via;
        self
    }

    /// When a statement of `attempt` fails unanswered: the store's bound
    /// past the end of its lock waits (now, when it has no deadline).
    fn answer_deadline(&self, attempt: Try) -> Instant {
        let now = Instant::now();
        let waits_end = attempt.bound.map_or(now, |bound| bound.max(now));
        waits_end
            .checked_add(self.answer_within)
            .unwrap_or(waits_end)
    }

    /// `" through …"` for what stands between, or empty.
    fn via_text(&self) -> String {
        self.via
            .as_ref()
            .map_or_else(String::new, |via| format!(" through {via}"))
    }

    fn no_answer(&self) -> NoAnswer {
        let hint = match &self.via {
            Some(_) => {
                " (a pooler holds a query while it has no server connection: \
                 PgBouncer's query_wait_timeout, 120 s by default)"
            }
            None => "",
        };
        NoAnswer {
            server: D::server(&self.options),
            via: self.via_text(),
            within: self.answer_within,
            hint,
        }
    }

    /// Runs one statement (`statement`, given the connection and the
    /// [`Try`] it runs in) on a connection of this set and returns its result.
    ///
    /// - A statement the server rolled back whole
    ///   ([`Dialect::rolled_back`]) runs again, up to [`ROLLED_BACK_RETRIES`]
    ///   times.
    /// - When a reused idle connection was found dead (the server restarted
    ///   or ended it while it sat idle, or during the statement), the rest of
    ///   the idle set, likely dead too, is dropped, and with
    ///   [`OnLostConnection::RunAgain`] the statement runs once more on a new
    ///   connection, told so by [`Try::after_lost_connection`]: the first try
    ///   may have committed, and the statement (or the engine reading its
    ///   answer) must be one whose second run proves or does no harm. With
    ///   [`OnLostConnection::Fail`] the error is the answer.
    /// - With a `deadline`, a try fails with [`OutOfTime`] when it passes
    ///   while waiting for a free connection. A try after a lost connection
    ///   keeps a deadline too, [`RETRY_GRACE`] later ([`Try::bound`]), for
    ///   its connect as well: the first try's own lock waits ended at the
    ///   deadline, so the second learns its outcome by then, and no try
    ///   outlives its wait without bound.
    /// - A statement unanswered [`ANSWER_WITHIN`] (or the store's own
    ///   bound) past its lock waits fails with [`NoAnswer`], its connection
    ///   dropped; it is not run again (it may still commit).
    ///
    /// Fails with [`Closed`] once the set closed, also for a call that was
    /// waiting for a connection when it did.
    pub async fn run<T, F>(
        &self,
        on_lost: OnLostConnection,
        deadline: Option<Instant>,
        mut statement: F,
    ) -> Result<T, BoxError>
    where
        F: for<'c> FnMut(&'c mut Conn<D>, Try) -> StatementFuture<'c, T>,
    {
        let mut attempt = Try {
            bound: deadline,
            after_lost_connection: false,
        };
        let mut rolled_back = 0;
        loop {
            let mut checkout = self
                .get(!attempt.after_lost_connection, attempt.bound)
                .await?;
            let answer_by = self.answer_deadline(attempt);
            let answered =
                tokio::time::timeout_at(answer_by.into(), statement(checkout.conn(), attempt))
                    .await;
            let Ok(result) = answered else {
                // Dropped unclean: its socket closes.
                return Err(self.no_answer().into());
            };
            checkout.clean = result.is_ok();
            match result {
                Ok(value) => return Ok(value),
                Err(error) if D::rolled_back(&error) && rolled_back < ROLLED_BACK_RETRIES => {
                    tracing::debug!(%error, "the server rolled the statement back; running it again");
                    rolled_back += 1;
                }
                Err(error) if checkout.reused && D::connection_lost(&error) => {
                    self.idle.lock().unwrap_or_else(|e| e.into_inner()).clear();
                    if on_lost == OnLostConnection::Fail {
                        return Err(D::explain(error));
                    }
                    tracing::debug!(%error, "idle connection was dead; retrying on a new one");
                    attempt = Try {
                        bound: deadline.map(|d| d.checked_add(RETRY_GRACE).unwrap_or(d)),
                        after_lost_connection: true,
                    };
                }
                Err(error) => return Err(D::explain(error)),
            }
        }
    }

    /// An idle connection (when `reuse`), or a new one.
    async fn get(
        &self,
        reuse: bool,
        deadline: Option<Instant>,
    ) -> Result<Checkout<'_, D>, BoxError> {
        let permit = until(deadline, self.permits.clone().acquire_owned())
            .await?
            .map_err(|_| Closed)?;
        let idle = if reuse {
            self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop()
        } else {
            None
        };
        let reused = idle.is_some();
        let conn = match idle {
            Some(conn) => conn,
            // Connecting is making the attempt, not waiting for someone
            // else: bounded by the connect timeout only, so that even a
            // zero wait sends its statement once — but a try after a lost
            // connection (`!reuse`) keeps to its deadline here too: the
            // server may be gone, and the first try already was the attempt.
            None => {
                let connect = tokio::time::timeout(CONNECT_TIMEOUT, self.options.connect());
                let connected = match reuse {
                    true => connect.await,
                    false => until(deadline, connect).await?,
                };
                let mut connected = connected.map_err(|_| sqlx::Error::PoolTimedOut)??;
                // Bounded: a pooler may queue the first statement for a
                // server connection without end.
                let first = async {
                    D::prepare(&mut connected).await?;
                    match &self.setup {
                        Some(setup) => setup(&mut connected).await,
                        None => Ok(()),
                    }
                };
                let first = tokio::time::timeout(self.answer_within.min(CONNECT_TIMEOUT), first);
                let answered = match reuse {
                    true => first.await,
                    false => until(deadline, first).await?,
                };
                answered.map_err(|_| NoServerConnection {
                    server: D::server(&self.options),
                    via: self.via_text(),
                    max: self.max,
                })??;
                // Closed while connecting: send nothing after `close()`.
                if self.closed.load(Ordering::Acquire) {
                    return Err(Closed.into());
                }
                connected
            }
        };
        Ok(Checkout {
            owner: self,
            conn: Some(conn),
            clean: false,
            reused,
            _permit: permit,
        })
    }

    /// Refuses new checkouts and closes the idle connections.
    pub async fn close(&self) {
        // Under the idle set's mutex, as in `Checkout::drop`: a connection
        // coming back either lands before this takes the set, or sees the flag.
        let idle = {
            let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            self.closed.store(true, Ordering::Release);
            std::mem::take(&mut *idle)
        };
        self.permits.close();
        for conn in idle {
            let _ = conn.close().await;
        }
    }
}

/// The future of one statement on a borrowed connection.
pub type StatementFuture<'c, T> =
    std::pin::Pin<Box<dyn Future<Output = Result<T, sqlx::Error>> + Send + 'c>>;

/// Runs `step` to the end, or until `deadline` when there is one.
async fn until<T>(
    deadline: Option<Instant>,
    step: impl Future<Output = T>,
) -> Result<T, OutOfTime> {
    match deadline {
        Some(deadline) => tokio::time::timeout_at(deadline.into(), step)
            .await
            .map_err(|_| OutOfTime),
        None => Ok(step.await),
    }
}

/// One connection, checked out for one statement.
struct Checkout<'a, D: Dialect> {
    owner: &'a Connections<D>,
    conn: Option<Conn<D>>,
    clean: bool,
    /// Taken from the idle set rather than connected for this statement.
    reused: bool,
    _permit: OwnedSemaphorePermit,
}

impl<D: Dialect> Checkout<'_, D> {
    fn conn(&mut self) -> &mut Conn<D> {
        self.conn.as_mut().expect("present until drop")
    }
}

impl<D: Dialect> Drop for Checkout<'_, D> {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else { return };
        if self.clean {
            let mut idle = self.owner.idle.lock().unwrap_or_else(|e| e.into_inner());
            if !self.owner.closed.load(Ordering::Acquire) {
                idle.push(conn);
            }
        }
        // Otherwise the connection is dropped: its socket closes, and the
        // server ends the session and rolls back anything unfinished.
    }
}

/// The most connections the pool a store's `connect` makes holds.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 10;

/// The pool a store's `connect` opens over: up to
/// [`DEFAULT_MAX_CONNECTIONS`] to `url`, after one connection was made
/// ([`check_connect`]) so that a refused connection answers at once with its
/// cause. Lock operations run on the store's own connections; the pool
/// serves opening and dropping, where a ping that weeds out a connection the
/// server dropped is worth its trip.
pub async fn connect_pool<D: Dialect>(
    url: &str,
) -> Result<sqlx::Pool<D::Database>, alkstore_core::Error> {
    let options =
        driver_options::<D>(url).map_err(|e| alkstore_core::Error::database("connect", e))?;
    connect_pool_with::<D>(options).await
}

/// The connect options of a driver URL, its TLS parameters
/// ([`Dialect::TLS`]) checked first: each given once, a known mode, the
/// files they name readable. Errors mask the URL's password.
pub fn driver_options<D: Dialect>(url: &str) -> Result<Options<D>, BoxError> {
    let tls = TlsParams::of(&D::TLS, url)?;
    tls.check_files(&D::TLS)
        .map_err(|problem| UrlError::malformed(url, problem))?;
    Ok(tls.driver_url(&D::TLS, url)?.parse::<Options<D>>()?)
}

/// As [`connect_pool`], with connect options made already.
pub async fn connect_pool_with<D: Dialect>(
    options: Options<D>,
) -> Result<sqlx::Pool<D::Database>, alkstore_core::Error> {
    let failed = |e: BoxError| alkstore_core::Error::database("connect", e);
    check_connect::<D>(&options)
        .await
        .map_err(|e| failed(e.into()))?;
    let server = D::server(&options);
    sqlx::pool::PoolOptions::<D::Database>::new()
        .max_connections(DEFAULT_MAX_CONNECTIONS)
        .test_before_acquire(true)
        .acquire_timeout(CONNECT_TIMEOUT)
        // A first statement, bounded: a pooler in session mode lets a
        // connection in and then queues its first statement for a server
        // connection without end (the acquire then times out, named).
        .after_connect(move |conn, _| {
            let server = server.clone();
            Box::pin(async move {
                let first = conn.ping();
                match tokio::time::timeout(CONNECT_TIMEOUT, first).await {
                    Ok(answered) => answered,
                    Err(_) => Err(sqlx::Error::Configuration(Box::new(NoServerConnection {
                        server,
                        via: String::new(),
                        max: DEFAULT_MAX_CONNECTIONS,
                    }))),
                }
            })
        })
        .connect_with(options)
        .await
        .map_err(|e| failed(e.into()))
}
