//! The bridge from async callers to blocking rusqlite: one thread owns the
//! connection and runs jobs in arrival order, as sqlx's SQLite driver does.
//!
//! A tokio worker thread never blocks on SQLite: callers only send a job and
//! await its reply. A caller that drops its future does not stop a job already
//! queued; the job finishes and its reply is discarded.

use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};

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

/// The store's SQLite thread panicked: the call that was running and every
/// later one fail with this (not [`Closed`]: nobody closed the store). The
/// connection is gone, its open transaction rolled back; open a new store.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the SQLite worker thread crashed ({panic}); open the store again")]
pub struct WorkerCrashed {
    /// The panic's message.
    pub panic: String,
}

/// The thread that owns one connection.
#[derive(Debug)]
pub(crate) struct Worker {
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    stopped: Mutex<Option<oneshot::Receiver<()>>>,
    /// Set once, by the thread, if a job panicked.
    crashed: Arc<OnceLock<WorkerCrashed>>,
}

/// A panic payload's message, when it has one.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
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
        let crashed = Arc::new(OnceLock::new());
        let crash_record = crashed.clone();
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
                // A panicking job ends it too: the connection may be mid-
                // transaction, so it is dropped (rolling back), never reused.
                let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    while let Some(job) = next_job(&jobs_rx) {
                        job(&mut conn);
                    }
                }));
                if served.is_err() {
                    // The job recorded the crash before its caller's reply
                    // went away; queued jobs are dropped with the receiver,
                    // and their callers see it too.
                    let crash = crash_record.get_or_init(|| WorkerCrashed {
                        panic: "unknown".to_owned(),
                    });
                    tracing::error!(panic = %crash.panic, "the SQLite worker thread crashed");
                    drop(jobs_rx);
                    drop(conn);
                    let _ = stopped_tx.send(());
                    return;
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
            crashed,
        })
    }

    /// Why the thread is gone: [`WorkerCrashed`] if it panicked, else [`Closed`].
    fn gone(&self) -> BoxError {
        match self.crashed.get() {
            Some(crash) => crash.clone().into(),
            None => Closed.into(),
        }
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
        let crash_record = self.crashed.clone();
        sender
            .send(Box::new(move |conn: &mut Connection| {
                match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(conn))) {
                    Ok(result) => {
                        let _ = reply_tx.send(result);
                    }
                    Err(payload) => {
                        // Recorded before the reply is dropped, so the caller
                        // reads a crash, not a close.
                        let _ = crash_record.set(WorkerCrashed {
                            panic: panic_message(&*payload),
                        });
                        drop(reply_tx);
                        std::panic::resume_unwind(payload);
                    }
                }
            }))
            .map_err(|_| self.gone())?;
        Ok(reply_rx.await.map_err(|_| self.gone())??)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_job_is_reported_as_a_crash_not_as_closed() {
        let worker = Worker::start(|| Ok(Connection::open_in_memory()?))
            .await
            .unwrap();
        assert_eq!(worker.run(|_| Ok(1)).await.unwrap(), 1);
        let crash = worker
            .run(|_| -> rusqlite::Result<()> { panic!("boom in a job") })
            .await
            .unwrap_err();
        let later = worker.run(|_| Ok(2)).await.unwrap_err();
        for error in [crash, later] {
            let crashed = error
                .downcast_ref::<WorkerCrashed>()
                .unwrap_or_else(|| panic!("not reported as a crash: {error}"));
            assert!(crashed.panic.contains("boom in a job"), "{crashed}");
        }
        worker.stop().await;
    }
}
