//! The contended workload whose history the checker reads.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use alkstore_core::Store;
use tokio::sync::Mutex;

use super::Rng;
use super::history::Interval;

/// What a contended run produced.
#[derive(Debug)]
pub struct Outcome {
    /// Every grant's validity interval.
    pub history: Vec<Interval>,
    /// The shared counter after the run.
    pub counter: u64,
    /// How many increments holders made inside their critical sections.
    pub increments: u64,
    /// Writes that found the counter changed since their read although
    /// their lease was still valid: another holder wrote in between.
    pub lost_updates: u64,
    /// How many holders paused past their TTL.
    pub pauses: u64,
}

/// How a contended run is shaped.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    /// Concurrent tasks, one owner each.
    pub tasks: usize,
    /// Grants each task takes.
    pub cycles: usize,
    /// The lease of each grant.
    pub ttl: Duration,
    /// One holder in this many pauses past its TTL.
    pub pause_one_in: u64,
}

/// Runs the workload on one name: each task waits for the lock, maybe
/// increments the shared counter (read, yield, write: a lost update if two
/// holders overlap), holds for a random while or pauses past its TTL, and
/// releases. Each grant's interval is recorded.
pub async fn contend(store: Arc<dyn Store>, name: &str, workload: Workload, seed: u64) -> Outcome {
    let history = Arc::new(Mutex::new(Vec::new()));
    // Read and write are separate steps with a yield between. The write
    // happens only while the writer's lease is still valid (checked under the
    // counter's mutex, so check and write are one step): a holder paused past
    // its lease abandons its write, as a fenced resource would refuse it.
    let counter = Arc::new(std::sync::Mutex::new(0u64));
    let lost_updates = Arc::new(AtomicU64::new(0));
    let increments = Arc::new(AtomicU64::new(0));
    let pauses = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..workload.tasks)
        .map(|task| {
            let (store, name) = (store.clone(), name.to_owned());
            let lost_updates = lost_updates.clone();
            let (history, counter, increments, pauses) = (
                history.clone(),
                counter.clone(),
                increments.clone(),
                pauses.clone(),
            );
            let mut rng = Rng::new(seed ^ (task as u64).wrapping_mul(0x9E37_79B9));
            tokio::spawn(async move {
                let owner = format!("task-{task}");
                for _ in 0..workload.cycles {
                    let requested = Instant::now();
                    let lock = store
                        .lock(&name, &owner, workload.ttl, Duration::from_secs(120))
                        .await
                        .expect("lock")
                        .expect("granted within the wait");
                    let start = Instant::now();
                    let seen = *counter.lock().unwrap();
                    tokio::task::yield_now().await;
                    {
                        let mut value = counter.lock().unwrap();
                        if Instant::now() < lock.valid_until() {
                            if *value != seen {
                                lost_updates.fetch_add(1, Ordering::SeqCst);
                            }
                            *value = seen + 1;
                            increments.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    if rng.below(workload.pause_one_in) == 0 {
                        pauses.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(workload.ttl + Duration::from_millis(20)).await;
                    } else {
                        tokio::time::sleep(Duration::from_micros(rng.below(3000))).await;
                    }
                    let end = Instant::now().min(lock.valid_until());
                    let fence = lock.fence();
                    let _ = lock.release().await.expect("release");
                    history.lock().await.push(Interval {
                        owner: owner.clone(),
                        fence,
                        requested,
                        start,
                        end,
                        released: Some(Instant::now()),
                    });
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a contending task panicked");
    }
    let history = std::mem::take(&mut *history.lock().await);
    Outcome {
        history,
        counter: *counter.lock().unwrap(),
        lost_updates: lost_updates.load(Ordering::SeqCst),
        increments: increments.load(Ordering::SeqCst),
        pauses: pauses.load(Ordering::SeqCst),
    }
}

/// How a race between independent stores is shaped.
#[derive(Debug, Clone, Copy)]
pub struct Race {
    /// Contending tasks per store, one owner each.
    pub tasks_per_store: usize,
    /// How long the race runs.
    pub duration: Duration,
}

/// Races tasks on independent stores (each with its own connections) for
/// one name: each task loops `try_lock` with a long lease, and when granted
/// increments the shared counter and releases at once. Every third task
/// waits with `lock` instead, so that a release sends a waiter at the name
/// while the spinning tasks try it too. With long leases and prompt releases,
/// exclusion alone orders the grants, so the history checker's commit-order
/// rule must hold for every grant.
pub async fn race(stores: &[Arc<dyn Store>], name: &str, race: Race, seed: u64) -> Outcome {
    let ttl = Duration::from_secs(30);
    let history = Arc::new(Mutex::new(Vec::new()));
    let counter = Arc::new(std::sync::Mutex::new(0u64));
    let lost_updates = Arc::new(AtomicU64::new(0));
    let increments = Arc::new(AtomicU64::new(0));
    let stop = Instant::now() + race.duration;
    let mut tasks = Vec::new();
    for (s, store) in stores.iter().enumerate() {
        for t in 0..race.tasks_per_store {
            let (store, name) = (store.clone(), name.to_owned());
            let (history, counter) = (history.clone(), counter.clone());
            let (lost_updates, increments) = (lost_updates.clone(), increments.clone());
            let waits = (s * race.tasks_per_store + t) % 3 == 2;
            let mut rng = Rng::new(seed ^ ((s * 1000 + t) as u64).wrapping_mul(0x9E37_79B9));
            tasks.push(tokio::spawn(async move {
                let owner = format!("store-{s}-task-{t}");
                while Instant::now() < stop {
                    let requested = Instant::now();
                    let got = if waits {
                        store
                            .lock(&name, &owner, ttl, Duration::from_millis(50))
                            .await
                    } else {
                        store.try_lock(&name, &owner, ttl).await
                    };
                    let Some(lock) = got.expect("acquire") else {
                        tokio::time::sleep(Duration::from_micros(rng.below(500))).await;
                        continue;
                    };
                    let start = Instant::now();
                    let seen = *counter.lock().unwrap();
                    tokio::task::yield_now().await;
                    {
                        let mut value = counter.lock().unwrap();
                        if *value != seen {
                            lost_updates.fetch_add(1, Ordering::SeqCst);
                        }
                        *value = seen + 1;
                        increments.fetch_add(1, Ordering::SeqCst);
                    }
                    let end = Instant::now().min(lock.valid_until());
                    let fence = lock.fence();
                    assert!(lock.release().await.expect("release"), "own live grant");
                    history.lock().await.push(Interval {
                        owner: owner.clone(),
                        fence,
                        requested,
                        start,
                        end,
                        released: Some(Instant::now()),
                    });
                }
            }));
        }
    }
    for task in tasks {
        task.await.expect("a racing task panicked");
    }
    let history = std::mem::take(&mut *history.lock().await);
    Outcome {
        history,
        counter: *counter.lock().unwrap(),
        lost_updates: lost_updates.load(Ordering::SeqCst),
        increments: increments.load(Ordering::SeqCst),
        pauses: 0,
    }
}
