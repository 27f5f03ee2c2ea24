//! How fair waiting is today, measured from outside (issue 38's "before"):
//! 16 independent stores race on one reader-writer name, one in six a
//! writer, each waiting up to a second, holding a grant 50 ms and asking
//! again at once: reads and writes granted per second. Then 8 independent
//! stores queue for one held lock, 20 ms apart, and each takes its turn
//! for 20 ms once the holder lets go: how many were granted out of the
//! order they asked in. The same for every engine.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use alkstore_core::Store;

use crate::report::Row;

const TTL: Duration = Duration::from_secs(60);
const STORES: usize = 16;
const RACE: Duration = Duration::from_secs(4);
const WAITERS: usize = 8;
/// How long a racer holds each grant: a short critical section.
const HOLD: Duration = Duration::from_millis(50);

/// Both measures on stores `open` makes (each independent: its own
/// connections, channel or file handle).
pub async fn run<F, Fut>(engine: &'static str, open: F) -> [Row; 3]
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Store>>,
{
    let mut stores = Vec::with_capacity(STORES);
    for _ in 0..STORES {
        stores.push(open().await);
    }
    eprintln!("bench: {engine} fairness, {STORES} stores");
    let (reads, writes) = readers_and_writers(&stores).await;
    let out_of_order = arrival_order(&stores[..WAITERS]).await;
    for store in &stores {
        let _ = store.close().await;
    }
    let race = format!("{STORES} stores, 1 in 6 a writer");
    [
        Row::rate(engine, format!("{race}: reads granted"), reads),
        Row::rate(engine, format!("{race}: writes granted"), writes),
        Row::count(
            engine,
            format!("{WAITERS} waiters 20 ms apart: granted out of turn"),
            out_of_order,
        ),
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
