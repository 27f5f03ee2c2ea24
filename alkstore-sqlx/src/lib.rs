//! The connections lock operations run on: one checkout, one statement, one
//! round trip.
//!
//! sqlx's pool pings every connection it takes back (a second round trip per
//! operation, measured on the wire by `tests/postgres.rs`), so the store keeps
//! its own small set of connections, made with the pool's connect options and
//! bounded by its `max_connections`. A connection goes back only after its
//! statement finished cleanly; one whose future was dropped mid-statement, or
//! that failed, is closed instead, so no connection in an unknown state is
//! ever reused.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use alkstore_core::{BoxError, Closed};
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How long opening a connection may take before the operation fails.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A waiting acquire's deadline passed before a connection was free or made:
/// nothing was sent, and the engine reports the attempt as refused.
#[derive(Debug, thiserror::Error)]
#[error("the wait ran out before a connection was ready")]
pub(crate) struct OutOfTime;

/// Idle connections and the permits that bound how many exist.
#[derive(Debug)]
pub(crate) struct Connections {
    options: PgConnectOptions,
    idle: Mutex<Vec<PgConnection>>,
    permits: Arc<Semaphore>,
    closed: AtomicBool,
}

impl Connections {
    /// Connections made with `options`, READ COMMITTED pinned (the
    /// statements rely on it, whatever the role's or database's default).
    pub(crate) fn new(options: PgConnectOptions, max: u32) -> Self {
        Connections {
            options: options.options([crate::sql::ISOLATION_OPTION]),
            idle: Mutex::new(Vec::new()),
            permits: Arc::new(Semaphore::new(max.max(1) as usize)),
            closed: AtomicBool::new(false),
        }
    }

    /// An idle connection (when `reuse`), or a new one.
    /// Fails with [`Closed`] once the store closed, also for a call that was
    /// waiting for a connection when it did; with [`OutOfTime`] when
    /// `deadline` passes while it waits for a permit (every connection busy
    /// with other calls of this store).
    pub(crate) async fn get(
        &self,
        reuse: bool,
        deadline: Option<Instant>,
    ) -> Result<Checkout<'_>, BoxError> {
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
            // zero wait sends its statement once.
            None => {
                let mut connected = tokio::time::timeout(CONNECT_TIMEOUT, self.options.connect())
                    .await
                    .map_err(|_| sqlx::Error::PoolTimedOut)??;
                sqlx::query(crate::sql::DURABLE_COMMITS)
                    .execute(&mut connected)
                    .await?;
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
    pub(crate) async fn close(&self) {
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

/// Runs `step` to the end, or until `deadline` when there is one.
async fn until<T>(
    deadline: Option<Instant>,
    step: impl std::future::Future<Output = T>,
) -> Result<T, OutOfTime> {
    match deadline {
        Some(deadline) => tokio::time::timeout_at(deadline.into(), step)
            .await
            .map_err(|_| OutOfTime),
        None => Ok(step.await),
    }
}

/// One connection, checked out for one statement.
pub(crate) struct Checkout<'a> {
    owner: &'a Connections,
    conn: Option<PgConnection>,
    clean: bool,
    /// Taken from the idle set rather than connected for this statement.
    reused: bool,
    _permit: OwnedSemaphorePermit,
}

impl Checkout<'_> {
    /// The connection, for one statement.
    pub(crate) fn conn(&mut self) -> &mut PgConnection {
        self.conn.as_mut().expect("present until drop")
    }

    /// Takes the statement's result. The connection goes back to the idle
    /// set only if the statement succeeded. A reused idle connection found
    /// dead (the server restarted or terminated it while it sat idle) asks
    /// for one retry on a new connection, and the rest of the idle set,
    /// likely dead too, is dropped — but only for a statement that can run
    /// twice with the same outcome (`idempotent`): a lost connection does
    /// not prove the statement never committed, and a release that committed
    /// and ran again would answer `false` and wake nobody.
    pub(crate) fn settle<T>(
        mut self,
        result: Result<T, sqlx::Error>,
        idempotent: bool,
    ) -> Settled<T> {
        self.clean = result.is_ok();
        if let Err(error) = &result {
            if self.reused && is_connection_lost(error) {
                self.owner
                    .idle
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clear();
            }
        }
        match result {
            Err(error) if idempotent && self.reused && is_connection_lost(&error) => {
                tracing::debug!(%error, "idle connection was dead; retrying on a new one");
                Settled::Retry
            }
            result => Settled::Done(result),
        }
    }
}

/// What to do after a statement.
pub(crate) enum Settled<T> {
    /// Run it again, on a new connection.
    Retry,
    /// The answer.
    Done(Result<T, sqlx::Error>),
}

/// Runs one statement (`$statement`, using the connection `$conn`) on a
/// connection from `$connections`; an idempotent one is retried once on a
/// new connection when a reused idle one was dead. With `deadline:`, the
/// first try gives up with [`OutOfTime`] when it passes while waiting for a
/// connection.
macro_rules! on_connection {
    ($connections:expr, idempotent: $idempotent:expr, |$conn:ident| $statement:expr) => {
        $crate::connections::on_connection!(
            $connections, idempotent: $idempotent, deadline: None, |$conn| $statement
        )
    };
    ($connections:expr, idempotent: $idempotent:expr, deadline: $deadline:expr,
     |$conn:ident| $statement:expr) => {{
        let mut reuse = true;
        loop {
            // A retry is not cut short by the deadline: the first try may
            // have committed, and only its answer can tell.
            let deadline = if reuse { $deadline } else { None };
            let mut checkout = $connections.get(reuse, deadline).await?;
            let $conn = checkout.conn();
            let result = $statement.await;
            match checkout.settle(result, $idempotent) {
                $crate::connections::Settled::Retry => reuse = false,
                $crate::connections::Settled::Done(result) => break result,
            }
        }
    }};
}
pub(crate) use on_connection;

impl Drop for Checkout<'_> {
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

/// Errors that mean the connection was gone: an I/O failure, or the server
/// saying it terminated the session (admin shutdown, crash shutdown,
/// `pg_terminate_backend`).
fn is_connection_lost(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_) => true,
        sqlx::Error::Database(db) => {
            matches!(db.code().as_deref(), Some("57P01" | "57P02" | "57P03"))
        }
        _ => false,
    }
}
