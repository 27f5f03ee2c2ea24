//! A load for engines' fault tests: workers taking one lock in turns while
//! the test breaks the server underneath, every grant recorded for the
//! [history checker](crate::safety::history::check).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use alkstore_core::{Error, Store};
use tokio::sync::Mutex;

use crate::safety::history::Interval;

/// What a load run saw.
#[derive(Debug, Default)]
pub struct Load {
    /// Every grant, for the history checker.
    pub history: Mutex<Vec<Interval>>,
    /// Grants so far.
    pub grants: AtomicU64,
    /// Failed operations so far (each an `Error::Database`).
    pub errors: AtomicU64,
    /// The slowest lock call, in milliseconds.
    pub slowest_ms: AtomicU64,
    /// Set to stop the workers.
    pub stop: AtomicBool,
}

/// `workers` tasks taking the lock `loaded` in turns (500 ms leases, 300 ms
/// waits, held 2 ms) until `load.stop` is set; every operation must end
/// within 20 s and every error must be an `Error::Database` (the task
/// panics otherwise: join the handles to see it).
pub fn start_load(
    store: Arc<dyn Store>,
    workers: usize,
    load: Arc<Load>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..workers)
        .map(|w| {
            let (store, load) = (store.clone(), load.clone());
            tokio::spawn(async move {
                let owner = format!("worker-{w}");
                while !load.stop.load(Ordering::SeqCst) {
                    let began = Instant::now();
                    let attempt = tokio::time::timeout(
                        Duration::from_secs(20),
                        store.lock(
                            "loaded",
                            &owner,
                            Duration::from_millis(500),
                            Duration::from_millis(300),
                        ),
                    )
                    .await
                    .expect("an operation hung past 20 s");
                    load.slowest_ms
                        .fetch_max(began.elapsed().as_millis() as u64, Ordering::SeqCst);
                    match attempt {
                        Ok(Some(lock)) => {
                            let start = Instant::now();
                            tokio::time::sleep(Duration::from_millis(2)).await;
                            let end = Instant::now().min(lock.valid_until());
                            let fence = lock.fence();
                            load.grants.fetch_add(1, Ordering::SeqCst);
                            if let Err(error) = lock.release().await {
                                assert!(matches!(error, Error::Database { .. }), "{error:?}");
                                load.errors.fetch_add(1, Ordering::SeqCst);
                            }
                            load.history.lock().await.push(Interval {
                                owner: owner.clone(),
                                fence,
                                requested: began,
                                start,
                                end,
                                released: Some(Instant::now()),
                            });
                        }
                        Ok(None) => {}
                        Err(error) => {
                            assert!(matches!(error, Error::Database { .. }), "{error:?}");
                            load.errors.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                }
            })
        })
        .collect()
}
