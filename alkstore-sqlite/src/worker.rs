//! The bridge from async callers to blocking rusqlite, as sqlx's SQLite
//! driver has it — one thread owns the connection and runs jobs in arrival
//! order — with a short way round it: when the connection is free, a job
//! first runs on the caller's own thread with SQLite's busy timeout at zero.
//! SQLite then answers at once (a read, or a write nobody else holds the
//! lock for) or says `SQLITE_BUSY` having done nothing, and only then is the
//! job handed to the connection's thread, which waits with the busy timeout.
//! So a tokio worker thread does not wait out another connection's lock: it
//! runs the statements (a commit that checkpoints the WAL does its I/O
//! inline too; the benchmark reports the longest time a call holds a
//! worker). One wait SQLite does not let us bound: its own retries on the
//! WAL index when another process stalls inside it (under 10 s in SQLite's
//! worst case, then `SQLITE_PROTOCOL`, which sends the job to the thread).
//! While jobs wait for the thread, calls do not run inline: they queue.
//!
//! A caller that drops its future does not stop a job already handed to the
//! thread; the job finishes and its reply is discarded. An inline job is
//! never interrupted: it runs within one poll.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use alkstore_core::{BoxError, Closed};
use rusqlite::{Connection, ErrorCode};
use tokio::sync::oneshot;

use crate::schema::BUSY_TIMEOUT;

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

/// The connection, taken by whoever runs a job: a caller inline or the
/// thread. Empty once the store closed or a job panicked.
type Slot = Arc<Mutex<Option<Connection>>>;

/// Whether SQLite gave up on a lock held elsewhere rather than wait: busy,
/// or (WAL) its own bounded retries on the WAL index ran out while another
/// process held it. The thread tries again, with the busy timeout.
fn is_busy(error: &rusqlite::Error) -> bool {
    matches!(
        error.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::FileLockingProtocolFailed)
    )
}

/// The thread that owns one connection.
#[derive(Debug)]
pub(crate) struct Worker {
    conn: Slot,
    /// Jobs handed to the thread and not yet taken by it: while any wait,
    /// calls do not run inline (they would jump the queue, and could keep
    /// the thread from the connection for as long as they keep coming).
    queued: Arc<AtomicUsize>,
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
        let slot: Slot = Arc::default();
        let thread_slot = slot.clone();
        let queued = Arc::new(AtomicUsize::new(0));
        let thread_queued = queued.clone();
        std::thread::Builder::new()
            .name("alkstore-sqlite".into())
            .spawn(move || {
                match open() {
                    Ok(conn) => {
                        *thread_slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(conn);
                        let _ = opened_tx.send(Ok(()));
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
                        let mut slot = thread_slot.lock().unwrap_or_else(|e| e.into_inner());
                        thread_queued.fetch_sub(1, Ordering::AcqRel);
                        let Some(conn) = slot.as_mut() else {
                            // Gone with an inline job's panic: the job's
                            // caller sees the crash (its reply is dropped).
                            continue;
                        };
                        job(conn);
                    }
                }));
                let conn = thread_slot.lock().unwrap_or_else(|e| e.into_inner()).take();
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
                if let Some(Err((_, error))) = conn.map(Connection::close) {
                    tracing::warn!(%error, "closing the SQLite connection failed");
                }
                let _ = stopped_tx.send(());
            })?;
        opened_rx.await.map_err(|_| Closed)??;
        Ok(Worker {
            conn: slot,
            queued,
            jobs: Mutex::new(Some(jobs_tx)),
            stopped: Mutex::new(Some(stopped_rx)),
            crashed,
        })
    }

    /// Why the connection is gone: [`WorkerCrashed`] if a job panicked, else
    /// [`Closed`].
    fn gone(&self) -> BoxError {
        match self.crashed.get() {
            Some(crash) => crash.clone().into(),
            None => Closed.into(),
        }
    }

    /// Records a job's panic; the connection it left is dropped (rolling back
    /// whatever it had open), never reused.
    fn crash(&self, payload: &(dyn std::any::Any + Send)) -> BoxError {
        let _ = self.crashed.set(WorkerCrashed {
            panic: panic_message(payload),
        });
        self.gone()
    }

    /// Runs `job` on the connection and returns its result: inline when the
    /// connection is free and SQLite answers without waiting, else on the
    /// connection's thread. `job` gets the longest wait for another
    /// connection's lock allowed where it runs (zero inline): it may run
    /// twice, once inline answered `SQLITE_BUSY` (which did nothing).
    pub(crate) async fn run<T, F>(&self, mut job: F) -> Result<T, BoxError>
    where
        T: Send + 'static,
        F: FnMut(&mut Connection, Duration) -> rusqlite::Result<T> + Send + 'static,
    {
        if self.crashed.get().is_some() {
            return Err(self.gone());
        }
        let free = || self.queued.load(Ordering::Acquire) == 0;
        if let Some(mut slot) = free().then(|| self.conn.try_lock().ok()).flatten() {
            let Some(conn) = slot.as_mut() else {
                return Err(self.gone());
            };
            let inline = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                conn.busy_timeout(Duration::ZERO)?;
                job(conn, Duration::ZERO)
            }));
            match inline {
                Ok(Err(error)) if is_busy(&error) => {
                    // A job answered busy has done nothing; should one ever
                    // leave a transaction open, it does not run again in it.
                    if !conn.is_autocommit() {
                        let _ = conn.execute_batch("ROLLBACK");
                    }
                }
                Ok(result) => return Ok(result?),
                Err(payload) => {
                    drop(slot.take());
                    let crash = self.crash(&*payload);
                    tracing::error!(panic = %crash, "an SQLite job crashed on the caller's thread");
                    return Err(crash);
                }
            }
        }
        self.on_thread(job).await
    }

    /// Runs `job` on the connection's thread, with the busy timeout.
    async fn on_thread<T, F>(&self, mut job: F) -> Result<T, BoxError>
    where
        T: Send + 'static,
        F: FnMut(&mut Connection, Duration) -> rusqlite::Result<T> + Send + 'static,
    {
        let (reply_tx, reply_rx) = oneshot::channel();
        let sender = self
            .jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or(Closed)?;
        let crash_record = self.crashed.clone();
        self.queued.fetch_add(1, Ordering::AcqRel);
        sender
            .send(Box::new(move |conn: &mut Connection| {
                let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    conn.busy_timeout(BUSY_TIMEOUT)?;
                    job(conn, BUSY_TIMEOUT)
                }));
                match ran {
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
            .map_err(|_| {
                self.queued.fetch_sub(1, Ordering::AcqRel);
                self.gone()
            })?;
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

    /// `crash` fails with the worker's crash report naming `panic`, and so
    /// does every later call (not `Closed`: nobody closed the store).
    async fn assert_crashed(worker: Worker, crash: BoxError, panic: &str) {
        let later = worker.run(|_, _| Ok(2)).await.unwrap_err();
        for error in [crash, later] {
            let crashed = error
                .downcast_ref::<WorkerCrashed>()
                .unwrap_or_else(|| panic!("not reported as a crash: {error}"));
            assert!(crashed.panic.contains(panic), "{crashed}");
        }
        worker.stop().await;
    }

    #[tokio::test]
    async fn a_panicking_job_is_reported_as_a_crash_not_as_closed() {
        let worker = Worker::start(|| Ok(Connection::open_in_memory()?))
            .await
            .unwrap();
        assert_eq!(worker.run(|_, _| Ok(1)).await.unwrap(), 1);
        let crash = worker
            .run(|_, _| -> rusqlite::Result<()> { panic!("boom in a job") })
            .await
            .unwrap_err();
        assert_crashed(worker, crash, "boom in a job").await;
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_job_panicking_on_the_thread_is_reported_as_a_crash() {
        let (_dir, worker, _other) = worker_on_locked_file().await;
        let crash = worker
            .run(|conn, busy| -> rusqlite::Result<()> {
                if busy.is_zero() {
                    // Inline: busy behind the other connection, so to the thread.
                    conn.execute_batch("BEGIN IMMEDIATE")?;
                }
                panic!("boom on the thread")
            })
            .await
            .unwrap_err();
        assert_crashed(worker, crash, "boom on the thread").await;
    }

    /// A worker on a new file, and a second connection on that file
    /// holding its write lock.
    async fn worker_on_locked_file() -> (tempfile::TempDir, Worker, Connection) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("locks.db");
        let other = Connection::open(&path).unwrap();
        other
            .execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE t (x); BEGIN IMMEDIATE;")
            .unwrap();
        let worker = Worker::start(move || Ok(Connection::open(&path)?))
            .await
            .unwrap();
        (dir, worker, other)
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_free_connection_runs_the_job_on_the_callers_thread() {
        let worker = Worker::start(|| Ok(Connection::open_in_memory()?))
            .await
            .unwrap();
        let caller = std::thread::current().id();
        let (ran_on, busy) = worker
            .run(|_, busy| Ok((std::thread::current().id(), busy)))
            .await
            .unwrap();
        assert_eq!((ran_on, busy), (caller, Duration::ZERO));
        worker.stop().await;
    }

    /// Inline, a job never waits for another connection's lock: SQLite
    /// answers busy at once (busy timeout zero), and the job runs again on
    /// the connection's thread, which waits with the busy timeout.
    #[tokio::test(flavor = "current_thread")]
    async fn a_job_behind_another_connections_lock_waits_on_the_thread() {
        let (_dir, worker, other) = worker_on_locked_file().await;
        let caller = std::thread::current().id();
        let tries = Arc::new(Mutex::new(Vec::new()));
        let released = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let releaser = {
            let released = released.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(200));
                released.store(true, std::sync::atomic::Ordering::SeqCst);
                other.execute_batch("COMMIT").unwrap();
            })
        };
        let job_tries = tries.clone();
        let written_after_release = worker
            .run(move |conn, busy| {
                job_tries
                    .lock()
                    .unwrap()
                    .push((std::thread::current().id() == caller, busy));
                conn.execute_batch("BEGIN IMMEDIATE; INSERT INTO t VALUES (1); COMMIT;")?;
                Ok(released.load(std::sync::atomic::Ordering::SeqCst))
            })
            .await
            .unwrap();
        releaser.join().unwrap();
        assert!(written_after_release);
        assert_eq!(
            *tries.lock().unwrap(),
            [(true, Duration::ZERO), (false, BUSY_TIMEOUT)],
            "first inline without waiting, then on the thread with the busy timeout"
        );
        worker.stop().await;
    }
}
