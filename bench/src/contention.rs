//! Contended runs: many tasks taking one name in turns.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use alkstore_core::Store;
use tokio::sync::Mutex;

/// What a contended run measured.
#[derive(Debug, Clone)]
pub struct Contended {
    pub tasks: usize,
    pub grants_per_sec: f64,
    /// release → next grant, one sample per handoff.
    pub handoffs: Vec<Duration>,
}

/// `tasks` tasks each waiting (`lock`) for `name` and releasing at once, for
/// `length`. Handoff = time from a release's start to the next grant.
pub async fn one_name(
    store: Arc<dyn Store>,
    name: &str,
    tasks: usize,
    length: Duration,
) -> Contended {
    on_stores(&[store], name, tasks, length).await
}

/// [`one_name`] with the tasks spread over `stores` (task `t` on store
/// `t % stores.len()`): independent stores, as processes would be.
pub async fn on_stores(
    stores: &[Arc<dyn Store>],
    name: &str,
    tasks: usize,
    length: Duration,
) -> Contended {
    let stop = Arc::new(AtomicBool::new(false));
    let grants = Arc::new(AtomicU64::new(0));
    let last_release: Arc<Mutex<Option<Instant>>> = Arc::default();
    let handoffs: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let workers: Vec<_> = (0..tasks)
        .map(|t| {
            let (store, stop, grants, last_release, handoffs, name) = (
                stores[t % stores.len()].clone(),
                stop.clone(),
                grants.clone(),
                last_release.clone(),
                handoffs.clone(),
                name.to_owned(),
            );
            tokio::spawn(async move {
                let owner = format!("task-{t}");
                while !stop.load(Ordering::Relaxed) {
                    let lock = store
                        .lock(
                            &name,
                            &owner,
                            Duration::from_secs(10),
                            Duration::from_secs(1),
                        )
                        .await
                        .expect("lock");
                    let Some(lock) = lock else { continue };
                    let granted = Instant::now();
                    if let Some(released) = last_release.lock().await.take() {
                        handoffs.lock().await.push(granted - released);
                    }
                    grants.fetch_add(1, Ordering::Relaxed);
                    *last_release.lock().await = Some(Instant::now());
                    lock.release().await.expect("release");
                }
            })
        })
        .collect();
    let started = Instant::now();
    tokio::time::sleep(length).await;
    stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed();
    let granted = grants.load(Ordering::Relaxed);
    for worker in workers {
        worker.await.expect("worker");
    }
    let handoffs = std::mem::take(&mut *handoffs.lock().await);
    Contended {
        tasks,
        grants_per_sec: granted as f64 / elapsed.as_secs_f64(),
        handoffs,
    }
}
