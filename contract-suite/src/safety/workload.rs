//! The contended workloads whose histories the checker reads.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use alkstore_core::{Lock, Store};

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

/// What the tasks of one run share: the unprotected counter the lock
/// guards, and the record of every grant.
#[derive(Debug, Default)]
struct Recorder {
    history: Mutex<Vec<Interval>>,
    counter: Mutex<u64>,
    lost_updates: AtomicU64,
    increments: AtomicU64,
    pauses: AtomicU64,
}

impl Recorder {
    /// The critical section: read the counter, yield, write it back plus
    /// one. The write happens only while the writer's lease is still valid
    /// (checked under the counter's mutex, so check and write are one step):
    /// a holder paused past its lease abandons its write, as a fenced
    /// resource would refuse it. A write that finds the counter changed
    /// since its read is a lost update.
    async fn increment(&self, lock: &dyn Lock) {
        let seen = *self.counter.lock().unwrap();
        tokio::task::yield_now().await;
        let mut value = self.counter.lock().unwrap();
        if Instant::now() < lock.valid_until() {
            if *value != seen {
                self.lost_updates.fetch_add(1, Ordering::SeqCst);
            }
            *value = seen + 1;
            self.increments.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Releases `lock` (it was requested at `requested` and came back at
    /// `start`) and records its interval; what the release answered.
    async fn release_and_record(
        &self,
        lock: Box<dyn Lock>,
        requested: Instant,
        start: Instant,
    ) -> bool {
        let end = Instant::now().min(lock.valid_until());
        let (owner, fence) = (lock.owner().to_owned(), lock.fence());
        let released = lock.release().await.expect("release");
        self.history.lock().unwrap().push(Interval {
            owner,
            fence,
            requested,
            start,
            end,
            released: Some(Instant::now()),
        });
        released
    }

    /// Grants recorded so far.
    fn grants(&self) -> usize {
        self.history.lock().unwrap().len()
    }

    fn finish(&self) -> Outcome {
        Outcome {
            history: std::mem::take(&mut *self.history.lock().unwrap()),
            counter: *self.counter.lock().unwrap(),
            lost_updates: self.lost_updates.load(Ordering::SeqCst),
            increments: self.increments.load(Ordering::SeqCst),
            pauses: self.pauses.load(Ordering::SeqCst),
        }
    }
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
    let recorder = Arc::new(Recorder::default());
    let tasks: Vec<_> = (0..workload.tasks)
        .map(|task| {
            let (store, name, recorder) = (store.clone(), name.to_owned(), recorder.clone());
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
                    recorder.increment(lock.as_ref()).await;
                    if rng.below(workload.pause_one_in) == 0 {
                        recorder.pauses.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(workload.ttl + Duration::from_millis(20)).await;
                    } else {
                        tokio::time::sleep(Duration::from_micros(rng.below(3000))).await;
                    }
                    // A paused holder's release may find its row taken over.
                    recorder.release_and_record(lock, requested, start).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a contending task panicked");
    }
    recorder.finish()
}

/// How a race between independent stores is shaped.
#[derive(Debug, Clone, Copy)]
pub struct Race {
    /// Contending tasks per store, one owner each.
    pub tasks_per_store: usize,
    /// How long the race runs.
    pub duration: Duration,
}

/// How long a waiting racer waits: long enough to reach its turn on an
/// engine that queues (a waiter that gives up goes to the back when it asks
/// again, so short waits would keep the queue churning), and short next to
/// the race.
const RACE_WAIT: Duration = Duration::from_secs(1);

/// The fewest grants a [`race`] aims for: past its duration it goes on
/// until it has them (a slow engine on a loaded machine: a queue's
/// handoffs wait for polls), for at most twice its duration more.
pub const MIN_RACE_GRANTS: usize = 60;

/// The most grants one [`race`] records.
pub const MAX_RACE_GRANTS: usize = 5_000;

impl Race {
    /// When a race that starts now stops at the latest: its duration, and
    /// twice that more for one short of [`MIN_RACE_GRANTS`].
    pub fn ends(self) -> (Instant, Instant) {
        let stop = Instant::now() + self.duration;
        (stop, stop + self.duration * 2)
    }
}

/// Whether a racer goes on, with `grants` recorded so far, of a race that
/// ends at `ends` ([`Race::ends`]): until its duration is over, then until
/// it has [`MIN_RACE_GRANTS`] (a slow engine on a loaded machine), never
/// past the hard stop nor [`MAX_RACE_GRANTS`] (an engine in memory grants
/// millions in the time a server grants hundreds, and the checker compares
/// grants pairwise).
pub fn racing(ends: (Instant, Instant), grants: usize) -> bool {
    let (stop, hard_stop) = ends;
    let now = Instant::now();
    grants < MAX_RACE_GRANTS && (now < stop || (grants < MIN_RACE_GRANTS && now < hard_stop))
}

/// Races tasks on independent stores (each with its own connections) for
/// one name: each task loops `try_lock` with a long lease, and when granted
/// increments the shared counter and releases at once. Every third task
/// waits with `lock` instead, so that a release sends a waiter at the name
/// while the spinning tasks try it too (on an engine that queues, the
/// waiters go in turn and the spinners only while nobody is queued). With long leases and prompt releases,
/// exclusion alone orders the grants, so the history checker's commit-order
/// rule must hold for every grant.
pub async fn race(stores: &[Arc<dyn Store>], name: &str, race: Race, seed: u64) -> Outcome {
    let ttl = Duration::from_secs(30);
    let recorder = Arc::new(Recorder::default());
    let ends = race.ends();
    let mut tasks = Vec::new();
    for racer in racers(stores, race, seed) {
        let (name, recorder) = (name.to_owned(), recorder.clone());
        let Racer {
            store,
            owner,
            waits,
            mut rng,
        } = racer;
        tasks.push(tokio::spawn(async move {
            while racing(ends, recorder.grants()) {
                let requested = Instant::now();
                let got = if waits {
                    store.lock(&name, &owner, ttl, RACE_WAIT).await
                } else {
                    store.try_lock(&name, &owner, ttl).await
                };
                let Some(lock) = got.expect("acquire") else {
                    tokio::time::sleep(Duration::from_micros(rng.below(500))).await;
                    continue;
                };
                let start = Instant::now();
                recorder.increment(lock.as_ref()).await;
                let released = recorder.release_and_record(lock, requested, start).await;
                assert!(released, "own live grant");
            }
        }));
    }
    for task in tasks {
        task.await.expect("a racing task panicked");
    }
    recorder.finish()
}

/// One racing task of a [`Race`]: its store, owner, whether it waits (every
/// third task) rather than tries once, and its own random source.
pub struct Racer {
    /// The store it races on.
    pub store: Arc<dyn Store>,
    /// Its owner, `store-S-task-T`.
    pub owner: String,
    /// It waits for a grant rather than tries once.
    pub waits: bool,
    /// Its random source, from the race's seed.
    pub rng: Rng,
}

/// The racers of `race` on `stores`: `tasks_per_store` on each.
pub fn racers(stores: &[Arc<dyn Store>], race: Race, seed: u64) -> Vec<Racer> {
    let mut racers = Vec::new();
    for (s, store) in stores.iter().enumerate() {
        for t in 0..race.tasks_per_store {
            racers.push(Racer {
                store: store.clone(),
                owner: format!("store-{s}-task-{t}"),
                waits: (s * race.tasks_per_store + t) % 3 == 2,
                rng: Rng::new(seed ^ ((s * 1000 + t) as u64).wrapping_mul(0x9E37_79B9)),
            });
        }
    }
    racers
}

/// Holds `grant` a moment (up to `hold_micros`, drawn from `rng`), then
/// releases it: its interval as its holder saw it (from `requested` and
/// `start`), and what the release answered.
pub async fn hold_then_release(
    grant: Box<dyn Lock>,
    requested: Instant,
    start: Instant,
    rng: &mut Rng,
    hold_micros: u64,
) -> (Interval, bool) {
    tokio::time::sleep(Duration::from_micros(rng.below(hold_micros))).await;
    let end = Instant::now().min(grant.valid_until());
    let (owner, fence) = (grant.owner().to_owned(), grant.fence());
    let released = grant.release().await.expect("release");
    let interval = Interval {
        owner,
        fence,
        requested,
        start,
        end,
        released: Some(Instant::now()),
    };
    (interval, released)
}
