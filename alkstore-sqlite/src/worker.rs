//! The bridge from async callers to blocking rusqlite: one thread owns the
//! connection and runs jobs in arrival order, as sqlx's SQLite driver does.
//!
//! A tokio worker thread never blocks on SQLite: callers only send a job and
//! await its reply. A caller that drops its future does not stop a job already
//! queued; the job finishes and its reply is discarded.

use std::sync::Mutex;
use std::sync::mpsc;

use alkstore_core::{BoxError, Closed};
use rusqlite::Connection;
use tokio::sync::oneshot;

type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// How long the thread keeps polling for a next job before it sleeps: a
/// caller that sends again soon (the usual pattern: acquire, work, release)
/// then finds it awake, without a thread wake-up on its path.
const SPIN: std::time::Duration = std::time::Duration::from_micros(50);

/// The next job: polled for `SPIN`, then waited for. `None` once every
/// sender is gone.
fn next_job(jobs: &mpsc::Receiver<Job>) -> Option<Job> {
    let spin_until = std::time::Instant::now() + SPIN;
    loop {
        match jobs.try_recv() {
            Ok(job) => return Some(job),
            Err(mpsc::TryRecvError::Disconnected) => return None,
            Err(mpsc::TryRecvError::Empty) if std::time::Instant::now() < spin_until => {
                std::hint::spin_loop();
            }
            Err(mpsc::TryRecvError::Empty) => return jobs.recv().ok(),
        }
    }
}

/// The thread that owns one connection.
#[derive(Debug)]
pub(crate) struct Worker {
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    stopped: Mutex<Option<oneshot::Receiver<()>>>,
}

impl Worker {
    /// Starts the thread, opens the connection there with `open`, and returns
    /// once `open` succeeded.
    pub(crate) async fn start(
        open: impl FnOnce() -> Result<Connection, BoxError> + Send + 'static,
    ) -> Result<Worker, BoxError> {
        let (jobs_tx, jobs_rx) = mpsc::channel::<Job>();
        let (opened_tx, opened_rx) = oneshot::channel();
        let (stopped_tx, stopped_rx) = oneshot::channel();
        std::thread::Builder::new()
            .name("alkstore-sqlite".into())
            .spawn(move || {
                let mut conn = match open() {
                    Ok(conn) => {
                        let _ = opened_tx.send(Ok(()));
                        conn
                    }
                    Err(e) => {
                        let _ = opened_tx.send(Err(e));
                        return;
                    }
                };
                // Ends when every sender is gone (the store closed or dropped).
                while let Some(job) = next_job(&jobs_rx) {
                    job(&mut conn);
                }
                if let Err((_, error)) = conn.close() {
                    tracing::warn!(%error, "closing the SQLite connection failed");
                }
                let _ = stopped_tx.send(());
            })?;
        opened_rx.await.map_err(|_| Closed)??;
        Ok(Worker {
            jobs: Mutex::new(Some(jobs_tx)),
            stopped: Mutex::new(Some(stopped_rx)),
        })
    }

    /// Runs `job` on the connection's thread and returns its result.
    pub(crate) async fn run<T, F>(&self, job: F) -> Result<T, BoxError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        let (reply_tx, reply_rx) = oneshot::channel();
        let sender = self
            .jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or(Closed)?;
        sender
            .send(Box::new(move |conn: &mut Connection| {
                let _ = reply_tx.send(job(conn));
            }))
            .map_err(|_| Closed)?;
        Ok(reply_rx.await.map_err(|_| Closed)??)
    }

    /// Stops taking jobs, lets queued ones finish, and waits for the
    /// connection to close.
    pub(crate) async fn stop(&self) {
        drop(self.jobs.lock().unwrap_or_else(|e| e.into_inner()).take());
        let stopped = self
            .stopped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(stopped) = stopped {
            let _ = stopped.await;
        }
    }
}
