//! Reader-writer locks: the read and write cycles next to the lock cycle,
//! and 32 tasks mixing reads and writes (nine in ten reads) on one name.
//! The same for every engine.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use alkstore_core::Store;

use crate::measure::{Rounds, in_turn};
use crate::report::Row;

const TTL: Duration = Duration::from_secs(60);

/// `try_lock`, `try_read_lock` and `try_write_lock` of free names, each with
/// its release, alternated (A B C A B C …, the first round a warm-up): the
/// read and write cycles against the lock cycle (target 1.2×), the lock
/// cycle against `floor`.
pub async fn cycle(
    engine: &'static str,
    store: &dyn Store,
    iterations: u32,
    floor: &Row,
) -> [Row; 3] {
    let mut rounds = Rounds::<3>::default();
    for round in 0..=crate::measure::RUNS {
        let runs = in_turn!(
            round,
            iterations,
            [
                { crate::ops::one_cycle(store).await },
                {
                    let read = store.try_read_lock("rw-read", "me", TTL).await.unwrap();
                    read.unwrap().release().await.unwrap();
                },
                {
                    let write = store.try_write_lock("rw-write", "me", TTL).await.unwrap();
                    write.unwrap().release().await.unwrap();
                },
            ]
        );
        rounds.record(round, runs);
    }
    let [lock, read, write] = rounds.medians();
    let lock = Row::time(
        engine,
        "try_lock+release cycle (beside read and write)",
        lock,
    )
    .against(floor, None);
    let read = Row::time(engine, "try_read_lock+release cycle", read).against(&lock, Some(1.2));
    let write = Row::time(engine, "try_write_lock+release cycle", write).against(&lock, Some(1.2));
    [lock, read, write]
}

/// 32 tasks on one name for `length`, each asking nine times in ten to
/// read and once to write (waiting up to a second), releasing each grant
/// at once: reads and writes granted per second.
pub async fn mixed(engine: &'static str, store: Arc<dyn Store>, length: Duration) -> [Row; 2] {
    const TASKS: usize = 32;
    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let workers: Vec<_> = (0..TASKS)
        .map(|t| {
            let (store, stop, counts) = (store.clone(), stop.clone(), counts.clone());
            tokio::spawn(async move {
                let owner = format!("task-{t}");
                let wait = Duration::from_secs(1);
                let mut n = t;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let write = n % 10 == 0;
                    let got = if write {
                        store.write_lock("rw-mixed", &owner, TTL, wait).await
                    } else {
                        store.read_lock("rw-mixed", &owner, TTL, wait).await
                    };
                    let Some(grant) = got.expect("a reader-writer acquire") else {
                        continue;
                    };
                    counts[usize::from(write)].fetch_add(1, Ordering::Relaxed);
                    grant.release().await.expect("release");
                }
            })
        })
        .collect();
    let started = Instant::now();
    tokio::time::sleep(length).await;
    stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    for worker in workers {
        worker.await.expect("worker");
    }
    let per_sec = |i: usize| counts[i].load(Ordering::Relaxed) as f64 / elapsed;
    let label = format!("{TASKS} tasks, 9 reads in 10, one name");
    [
        Row::rate(engine, format!("{label}: reads"), per_sec(0)),
        Row::rate(engine, format!("{label}: writes"), per_sec(1)),
    ]
}

/// The reader-writer rows of one engine: the cycles, then the mixed load.
pub async fn run(
    engine: &'static str,
    store: Arc<dyn Store>,
    iterations: u32,
    floor: &Row,
    rows: &mut Vec<Row>,
) {
    eprintln!("bench: {engine} reader-writer locks");
    rows.extend(cycle(engine, store.as_ref(), iterations, floor).await);
    rows.extend(mixed(engine, store, Duration::from_secs(3)).await);
}
