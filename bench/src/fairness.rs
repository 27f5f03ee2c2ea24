//! How fair waiting is, measured from outside (issue 38): 16 independent
//! stores race on one reader-writer name, one in six a writer, each waiting
//! up to a second, holding a grant 50 ms and asking again at once: reads
//! and writes granted per second. Then 8 independent stores queue for one
//! held lock, 20 ms apart, and each takes its turn for 20 ms once the
//! holder lets go: how many were granted out of the order they asked in.
//! Both on stores that wait in turn and on stores that wait unfairly
//! (`fair_waiting(false)`: waiting as before queues). Then the cost:
//! 16 and 64 contenders on 16 independent stores take one lock in turns,
//! fair and unfair alternated (A B A B …, round 0 a warm-up): grants per
//! second and release → grant handoffs. The same for every engine.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use alkstore_core::Store;

use crate::contention::{self, Contended};
use crate::report::Row;

const TTL: Duration = Duration::from_secs(60);
const STORES: usize = 16;
const RACE: Duration = Duration::from_secs(4);
const WAITERS: usize = 8;
/// How long a racer holds each grant: a short critical section.
const HOLD: Duration = Duration::from_millis(50);

/// Contended runs per mode and count of contenders, after a warm-up.
const COST_ROUNDS: usize = 4;
/// How long each contended run lasts.
const COST_RUN: Duration = Duration::from_secs(2);

/// Every measure on stores `open(fair)` makes (each independent: its own
/// connections, channel or file handle), waiting in turn or not.
pub async fn run<F, Fut>(engine: &'static str, open: F) -> Vec<Row>
where
    F: Fn(bool) -> Fut,
    Fut: Future<Output = Arc<dyn Store>>,
{
    let mut rows = Vec::new();
    for fair in [true, false] {
        let stores = open_stores(&open, fair).await;
        let mode = mode(fair);
        eprintln!("bench: {engine} fairness, {STORES} stores, {mode}");
        let (reads, writes) = readers_and_writers(&stores).await;
        let out_of_order = arrival_order(&stores[..WAITERS]).await;
        close(stores).await;
        let race = format!("{STORES} stores, 1 in 6 a writer, {mode}");
        rows.extend([
            Row::rate(engine, format!("{race}: reads granted"), reads),
            Row::rate(engine, format!("{race}: writes granted"), writes),
            Row::count(
                engine,
                format!("{WAITERS} waiters 20 ms apart, {mode}: granted out of turn"),
                out_of_order,
            ),
        ]);
    }
    for contenders in [16, 64] {
        rows.extend(cost(engine, &open, contenders).await);
    }
    rows
}

fn mode(fair: bool) -> &'static str {
    if fair { "fair" } else { "unfair" }
}

async fn open_stores<F, Fut>(open: &F, fair: bool) -> Vec<Arc<dyn Store>>
where
    F: Fn(bool) -> Fut,
    Fut: Future<Output = Arc<dyn Store>>,
{
    let mut stores = Vec::with_capacity(STORES);
    for _ in 0..STORES {
        stores.push(open(fair).await);
    }
    stores
}

async fn close(stores: Vec<Arc<dyn Store>>) {
    for store in &stores {
        let _ = store.close().await;
    }
}

/// Fair next to unfair waiting: `contenders` tasks on 16 stores take one
/// name in turns, the two modes alternated; each mode's median run (by
/// grants per second) against the other's.
async fn cost<F, Fut>(engine: &'static str, open: &F, contenders: usize) -> [Row; 6]
where
    F: Fn(bool) -> Fut,
    Fut: Future<Output = Arc<dyn Store>>,
{
    let mut runs: [Vec<Contended>; 2] = Default::default();
    for round in 0..=COST_ROUNDS {
        // Fair first in even rounds, unfair first in odd ones.
        let turns = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for at in turns {
            let fair = at == 0;
            let stores = open_stores(open, fair).await;
            let name = format!("cost-{contenders}-{round}-{}", mode(fair));
            let run = contention::on_stores(&stores, &name, contenders, COST_RUN).await;
            close(stores).await;
            if round > 0 {
                runs[at].push(run);
            }
        }
    }
    let [fair, unfair] = runs.map(|mut runs| {
        runs.sort_by(|a, b| a.grants_per_sec.total_cmp(&b.grants_per_sec));
        runs.swap_remove(runs.len() / 2)
    });
    let rows = |run: &Contended, fair: bool| {
        let [p50, p99] = Row::handoffs(engine, run);
        let label = |row: Row| Row {
            figure: format!("{} ({} on {STORES} stores)", row.figure, mode(fair)),
            ..row
        };
        [
            label(Row::rate(
                engine,
                format!("{contenders} waiters: grants"),
                run.grants_per_sec,
            )),
            label(p50),
            label(p99),
        ]
    };
    let [unfair_rate, unfair_p50, unfair_p99] = rows(&unfair, false);
    let [fair_rate, fair_p50, fair_p99] = rows(&fair, true);
    [
        fair_rate.against(&unfair_rate, None),
        fair_p50.against(&unfair_p50, None),
        fair_p99.against(&unfair_p99, None),
        unfair_rate,
        unfair_p50,
        unfair_p99,
    ]
}

/// Reads and writes granted per second on one name.
async fn readers_and_writers(stores: &[Arc<dyn Store>]) -> (f64, f64) {
    let stop = Arc::new(AtomicBool::new(false));
    let (reads, writes) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let tasks: Vec<_> = stores
        .iter()
        .enumerate()
        .map(|(i, store)| {
            let (store, stop) = (store.clone(), stop.clone());
            let (reads, writes) = (reads.clone(), writes.clone());
            tokio::spawn(async move {
                // One task in six a writer (3 of 16), the others readers;
                // each asks again at once.
                let writer = i % 6 == 0;
                let owner = format!("racer{i}");
                let wait = Duration::from_secs(1);
                while !stop.load(Ordering::Relaxed) {
                    let (granted, count) = match writer {
                        true => (store.write_lock("fair", &owner, TTL, wait).await, &writes),
                        false => (store.read_lock("fair", &owner, TTL, wait).await, &reads),
                    };
                    if let Ok(Some(grant)) = granted {
                        count.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(HOLD).await;
                        let _ = grant.release().await;
                    }
                }
            })
        })
        .collect();
    let began = Instant::now();
    tokio::time::sleep(RACE).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        let _ = task.await;
    }
    let seconds = began.elapsed().as_secs_f64();
    (
        reads.load(Ordering::Relaxed) as f64 / seconds,
        writes.load(Ordering::Relaxed) as f64 / seconds,
    )
}

/// How many of `stores.len()` waiters, asking 20 ms apart for a held name,
/// were granted before a waiter that asked earlier.
async fn arrival_order(stores: &[Arc<dyn Store>]) -> u64 {
    let holder = stores[0]
        .try_lock("queued", "holder", TTL)
        .await
        .unwrap()
        .expect("the name is free");
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for (i, store) in stores.iter().enumerate() {
        let (store, order) = (store.clone(), order.clone());
        waiters.push(tokio::spawn(async move {
            let lock = store
                .lock(
                    "queued",
                    &format!("waiter{i}"),
                    TTL,
                    Duration::from_secs(60),
                )
                .await
                .unwrap()
                .expect("granted within a minute");
            order.lock().unwrap().push(i);
            tokio::time::sleep(Duration::from_millis(20)).await;
            let _ = lock.release().await;
        }));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    holder.release().await.unwrap();
    for waiter in waiters {
        waiter.await.unwrap();
    }
    // Granted at another place than the one it asked in.
    let order = order.lock().unwrap().clone();
    order
        .iter()
        .enumerate()
        .filter(|(at, i)| *at != **i)
        .count() as u64
}
