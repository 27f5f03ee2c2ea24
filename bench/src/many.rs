//! Many names at once: 64 tasks, each taking names drawn at random among
//! 1000, against the raw insert+delete pair driven the same way (A B A B …).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use alkstore_core::Store;

use crate::measure::{RUNS, Rounds, order};
use crate::report::Row;

/// Tasks working at once.
pub const TASKS: usize = 64;
/// Names they draw from.
pub const NAMES: u64 = 1000;
/// One run of either side.
const LENGTH: Duration = Duration::from_secs(2);
const TTL: Duration = Duration::from_secs(60);

/// `TASKS` tasks for `LENGTH`, each calling `cycle(task, name)` on names
/// drawn at random among `NAMES`; a cycle answers whether it took its name
/// (a name another task holds is refused, on either side). Grants per second.
pub async fn drive<F, Fut>(cycle: F) -> f64
where
    F: Fn(usize, String) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = bool> + Send,
{
    let stop = Arc::new(AtomicBool::new(false));
    let grants = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..TASKS)
        .map(|task| {
            let (cycle, stop, grants) = (cycle.clone(), stop.clone(), grants.clone());
            tokio::spawn(async move {
                // xorshift64, seeded per task: the same draws on both sides.
                let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ (task as u64 + 1);
                while !stop.load(Ordering::Relaxed) {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    let name = format!("many-{}", state % NAMES);
                    if cycle(task, name).await {
                        grants.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    let started = Instant::now();
    tokio::time::sleep(LENGTH).await;
    stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed();
    let granted = grants.load(Ordering::Relaxed);
    for worker in workers {
        worker.await.expect("worker");
    }
    granted as f64 / elapsed.as_secs_f64()
}

/// try_lock + release through `store`; a refusal takes nothing.
pub async fn store_cycle(store: &Arc<dyn Store>, task: usize, name: String) -> bool {
    let owner = format!("task-{task}");
    match store.try_lock(&name, &owner, TTL).await.unwrap() {
        Some(lock) => {
            lock.release().await.unwrap();
            true
        }
        None => false,
    }
}

/// The store's grants per second and the raw pair's, alternated (a warm-up
/// round first, then `RUNS` rounds, medians), as two rows: the raw pair's,
/// then the store's against it (≥ 0.8× of it, the target).
pub async fn run<R, RFut>(engine: &'static str, store: Arc<dyn Store>, raw: R) -> [Row; 2]
where
    R: Fn(usize, String) -> RFut + Clone + Send + 'static,
    RFut: Future<Output = bool> + Send,
{
    eprintln!("bench: {engine} {TASKS} tasks over {NAMES} names, alternating with the raw pair");
    let mut rounds = Rounds::<2>::default();
    // Rates as time per grant, so that `Rounds` takes their medians.
    let per_grant = |rate: f64| Duration::from_secs_f64(1.0 / rate.max(1e-9));
    for round in 0..=RUNS {
        let mut rates = [0.0; 2];
        for turn in order(round, 2) {
            rates[turn] = match turn {
                0 => {
                    let store = store.clone();
                    drive(move |task, name| {
                        let store = store.clone();
                        async move { store_cycle(&store, task, name).await }
                    })
                    .await
                }
                _ => drive(raw.clone()).await,
            };
        }
        rounds.record(round, rates.map(per_grant));
    }
    let [ours, theirs] = rounds.medians().map(|d| 1.0 / d.as_secs_f64());
    let floor = Row::rate(
        engine,
        format!("raw insert+delete, {TASKS} tasks over {NAMES} names"),
        theirs,
    );
    let figure = Row::rate(
        engine,
        format!("try_lock+release, {TASKS} tasks over {NAMES} names"),
        ours,
    )
    .against(&floor, Some(1.25));
    [floor, figure]
}
