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
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How long opening a connection may take before the operation fails.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Idle connections and the permits that bound how many exist.
#[derive(Debug)]
pub(crate) struct Connections {
    options: PgConnectOptions,
    idle: Mutex<Vec<PgConnection>>,
    permits: Arc<Semaphore>,
    closed: AtomicBool,
}

impl Connections {
    pub(crate) fn new(options: PgConnectOptions, max: u32) -> Self {
        Connections {
            options,
            idle: Mutex::new(Vec::new()),
            permits: Arc::new(Semaphore::new(max.max(1) as usize)),
            closed: AtomicBool::new(false),
        }
    }

    /// An idle connection, or a new one when none is idle and the bound allows.
    pub(crate) async fn get(&self) -> Result<Checkout<'_>, sqlx::Error> {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| sqlx::Error::PoolClosed)?;
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let conn = match idle {
            Some(conn) => conn,
            None => tokio::time::timeout(CONNECT_TIMEOUT, self.options.connect())
                .await
                .map_err(|_| sqlx::Error::PoolTimedOut)??,
        };
        Ok(Checkout {
            owner: self,
            conn: Some(conn),
            clean: false,
            _permit: permit,
        })
    }

    /// Refuses new checkouts and closes the idle connections.
    pub(crate) async fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.permits.close();
        let idle = std::mem::take(&mut *self.idle.lock().unwrap_or_else(|e| e.into_inner()));
        for conn in idle {
            let _ = conn.close().await;
        }
    }
}

/// One connection, checked out for one statement.
pub(crate) struct Checkout<'a> {
    owner: &'a Connections,
    conn: Option<PgConnection>,
    clean: bool,
    _permit: OwnedSemaphorePermit,
}

impl Checkout<'_> {
    pub(crate) fn conn(&mut self) -> &mut PgConnection {
        self.conn.as_mut().expect("present until drop")
    }

    /// Runs one statement's future on the connection; the connection goes
    /// back to the idle set only if it completed without error.
    pub(crate) async fn run<T, F>(mut self, statement: F) -> Result<T, sqlx::Error>
    where
        F: AsyncFnOnce(&mut PgConnection) -> Result<T, sqlx::Error>,
    {
        let result = statement(self.conn()).await;
        self.clean = result.is_ok();
        result
    }
}

impl Drop for Checkout<'_> {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else { return };
        if self.clean && !self.owner.closed.load(Ordering::Acquire) {
            self.owner
                .idle
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(conn);
        }
        // Otherwise the connection is dropped: its socket closes, and the
        // server ends the session and rolls back anything unfinished.
    }
}
