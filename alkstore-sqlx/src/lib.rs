//! The connections an alkstore engine built on sqlx runs its lock
//! operations on: one checkout, one statement, one round trip — whatever the
//! database.
//!
//! sqlx's pool pings every connection it takes back (a second round trip per
//! operation, measured on the wire by the PostgreSQL engine's tests), so a
//! store keeps its own small set of connections, made with the pool's
//! connect options and bounded by its `max_connections`. A connection goes
//! back only after its statement finished cleanly; one whose future was
//! dropped mid-statement, or that failed, is closed instead, so no connection
//! in an unknown state is ever reused.
//!
//! What differs per database is a [`Dialect`]: what to run on each new
//! connection, and which errors prove what about the statement.
//!
//! ```
//! use alkstore_sqlx::{Connections, Dialect, OnLostConnection};
//! use sqlx::postgres::{PgConnectOptions, PgConnection};
//!
//! struct Postgres;
//!
//! impl Dialect for Postgres {
//!     type Database = sqlx::Postgres;
//!     fn connection_lost(error: &sqlx::Error) -> bool {
//!         matches!(error, sqlx::Error::Io(_))
//!     }
//!     fn rolled_back(error: &sqlx::Error) -> bool {
//!         matches!(error, sqlx::Error::Database(e) if e.code().as_deref() == Some("40P01"))
//!     }
//!     fn lock_wait_ended(error: &sqlx::Error) -> bool {
//!         matches!(error, sqlx::Error::Database(e) if e.code().as_deref() == Some("55P03"))
//!     }
//!     fn server(options: &PgConnectOptions) -> String {
//!         format!("{}:{}", options.get_host(), options.get_port())
//!     }
//!     async fn prepare(_: &mut PgConnection) -> Result<(), sqlx::Error> {
//!         Ok(())
//!     }
//! }
//!
//! # async fn example(name: &str) -> Result<(), alkstore_core::BoxError> {
//! let connections = Connections::<Postgres>::new(PgConnectOptions::new(), 4);
//! // One statement, which may run again after a lost connection; no deadline.
//! let (one,): (i32,) = connections
//!     .run(OnLostConnection::RunAgain, None, |conn, _| {
//!         Box::pin(sqlx::query_as("SELECT 1").fetch_one(conn))
//!     })
//!     .await?;
//! # Ok(())
//! # }
//! # fn main() {}
//! ```

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use alkstore_core::{BoxError, Closed};

mod namespace;
pub use namespace::{ForeignObjectsError, LostFencesError, Namespace, Objects};
use sqlx::{ConnectOptions, Connection, Database};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How long opening a connection may take before the operation fails.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How many times a statement the server rolled back whole (a deadlock
/// victim) is run again before its error is the answer.
pub const ROLLED_BACK_RETRIES: u32 = 3;

/// What the connection layer needs to know about one database.
pub trait Dialect: Send + Sync + 'static {
    /// sqlx's database type.
    type Database: Database;

    /// The connection was gone before or while the statement ran: an I/O
    /// failure, or the server saying it ended the session. It does not prove
    /// the statement never committed.
    fn connection_lost(error: &sqlx::Error) -> bool;

    /// The server rolled the statement's whole transaction back (a deadlock
    /// victim, a serialization failure): nothing of it committed, so running
    /// it again is safe for any statement.
    fn rolled_back(error: &sqlx::Error) -> bool;

    /// The server cut a lock wait at the bound the statement set for it
    /// (and rolled the transaction back): a waiting acquire ran out of its
    /// wait, having written nothing.
    fn lock_wait_ended(error: &sqlx::Error) -> bool;

    /// Where connections go, for an error to say (host and port, or the
    /// socket; never a password).
    fn server(options: &Options<Self>) -> String;

    /// Runs once on each new connection, before its first statement.
    fn prepare(
        conn: &mut <Self::Database as Database>::Connection,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
}

/// The connect options of a dialect's database.
pub type Options<D> = <<<D as Dialect>::Database as Database>::Connection as Connection>::Options;

/// The connection type of a dialect's database.
pub type Conn<D> = <<D as Dialect>::Database as Database>::Connection;

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
        .map_err(|e| failed(e.into()))
}

/// Connects to the server a driver URL names, for a one-off look (what
/// `alkstore doctor` reads): where it is, for a report (never a password),
/// and the connection.
pub async fn connect_url<D: Dialect>(url: &str) -> Result<(String, Conn<D>), BoxError> {
    let options: Options<D> = url.parse()?;
    let conn = connect::<D>(&options).await?;
    Ok((D::server(&options), conn))
}

/// Composed SQL text marked as audited for sqlx: the engine's one place that
/// composes SQL (its `sql.rs`) vouches that the only text spliced in is its
/// namespace's name, quoted there.
pub fn audited(text: String) -> sqlx::SqlStr {
    use sqlx::SqlSafeStr;
    sqlx::AssertSqlSafe(std::sync::Arc::<str>::from(text)).into_sql_str()
}

/// True when a waiting acquire ran out of its wait before it could decide:
/// no connection in time ([`OutOfTime`]), or a lock wait the server cut at
/// the statement's bound ([`Dialect::lock_wait_ended`]). The transaction
/// rolled back (or never started): nothing was written.
pub fn ran_out_of_time<D: Dialect>(error: &BoxError) -> bool {
    error.is::<OutOfTime>()
        || error
            .downcast_ref::<sqlx::Error>()
            .is_some_and(D::lock_wait_ended)
}

/// A waiting acquire's deadline passed before a connection was free or made:
/// nothing was sent, and the engine reports the attempt as refused.
#[derive(Debug, thiserror::Error)]
#[error("the wait ran out before a connection was ready")]
pub struct OutOfTime;

/// Idle connections and the permits that bound how many exist.
pub struct Connections<D: Dialect> {
    options: Options<D>,
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
            idle: Mutex::new(Vec::new()),
            permits: Arc::new(Semaphore::new(max.max(1) as usize)),
            closed: AtomicBool::new(false),
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
            let result = statement(checkout.conn(), attempt).await;
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
                        return Err(error.into());
                    }
                    tracing::debug!(%error, "idle connection was dead; retrying on a new one");
                    attempt = Try {
                        bound: deadline.map(|d| d.checked_add(RETRY_GRACE).unwrap_or(d)),
                        after_lost_connection: true,
                    };
                }
                Err(error) => return Err(error.into()),
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
                D::prepare(&mut connected).await?;
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

/// The answer of a statement that removes one grant (a release, a forced
/// release of one fence), run again after a lost connection: what the try
/// found and removed is the answer — a second try that removes the grant
/// proves the first did not, as a grant's fence is never handed out twice.
/// A second try that finds nothing cannot tell whether the first removed
/// it or someone else did: [`OutcomeUnknown`](alkstore_core::OutcomeUnknown),
/// never a guess.
pub fn removed<T>(
    found: Option<T>,
    after_lost_connection: bool,
    operation: &'static str,
) -> Result<Option<T>, BoxError> {
    match found {
        None if after_lost_connection => Err(alkstore_core::OutcomeUnknown { operation }.into()),
        found => Ok(found),
    }
}

/// A row a statement returned (or none), as the tuple the engine reads it
/// as; a row of another shape is an error, not a panic.
pub fn decoded<R, T>(row: Option<R>) -> Result<Option<T>, BoxError>
where
    R: sqlx::Row,
    T: for<'r> sqlx::FromRow<'r, R>,
{
    Ok(row.map(|row| T::from_row(&row)).transpose()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_try_that_removes_the_grant_answers_it() {
        assert_eq!(removed(Some(7), true, "release").unwrap(), Some(7));
        assert_eq!(removed(Some(7), false, "release").unwrap(), Some(7));
        assert_eq!(removed::<u8>(None, false, "release").unwrap(), None);
    }

    #[test]
    fn a_second_try_that_finds_nothing_answers_unknown_not_false() {
        let error = removed::<u8>(None, true, "release").unwrap_err();
        let unknown = error
            .downcast_ref::<alkstore_core::OutcomeUnknown>()
            .expect("OutcomeUnknown");
        assert_eq!(unknown.operation, "release");
        assert!(error.to_string().contains("release"), "{error}");
    }
}
