//! A fleet of replicas running one [`Schedule`] with clocks that disagree:
//! the driver of the schedule cases, of their negative control and of the
//! engines' multi-process schedule tests.
//!
//! Each replica reads a clock shifted by its own offset and tries every slot
//! three times by that clock — at its start, in its middle, and just before
//! its end — as replicas that wake at different moments of a slot would. The
//! late tries are what a claim must outlast: a replica whose clock is behind
//! asks for a slot after a replica whose clock is ahead claimed it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use alkstore_core::Store;
use alkstore_core::schedule::{Outcome, Schedule, Slot};
use tokio::sync::Notify;

/// A clock offset: how far a replica's clock is ahead (positive) or behind
/// (negative) the host's, in milliseconds.
pub type OffsetMs = i64;

/// `at` shifted by `offset`.
pub fn shifted(at: SystemTime, offset: OffsetMs) -> SystemTime {
    let by = Duration::from_millis(offset.unsigned_abs());
    if offset >= 0 { at + by } else { at - by }
}

/// The host's clock shifted by `offset`.
pub fn shifted_clock(offset: OffsetMs) -> impl Fn() -> SystemTime + Send + Sync + 'static {
    move || shifted(SystemTime::now(), offset)
}

/// When a replica crashes: in the first job it runs of this slot or a later
/// one, after saying it started. The crash is real as far as the schedule
/// can tell: the job never ends, and the replica drops the `run_once`
/// future in the middle of it (its keep-alive, if any, with it) and tries
/// nothing more; a replica in a child process then aborts.
pub type CrashAt = Option<u64>;

/// What one replica saw: the slots whose job it started.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplicaLog {
    /// The slots whose job this replica started, in order.
    pub started: Vec<u64>,
    /// Whether it crashed (in the job of its last started slot).
    pub crashed: bool,
}

/// How a replica in a process of its own dies at its crash point, inside
/// the job (`std::process::abort`); a replica without one is dropped
/// mid-job instead (see [`CrashAt`]).
pub type Die = Arc<dyn Fn() + Send + Sync>;

/// Where a replica reports a started run as it happens (a line on stdout,
/// for a replica in another process). Called before the job's work.
pub type Report = Arc<dyn Fn(u64) + Send + Sync>;

/// Which slots a replica runs over, and how its job and tries behave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// The first slot to try.
    pub first: u64,
    /// The last slot to try.
    pub last: u64,
    /// How long a run works.
    pub work: Duration,
    /// How long before a slot's end the last try of it comes.
    pub late: Duration,
}

/// Runs one replica over the slots `plan.first..=plan.last` of `schedule`
/// (whose clock is the replica's), trying each slot at its start, middle
/// and end less `plan.late`. The job reports its start, then works for
/// `plan.work`; in the first job it runs from slot `crash_at` on, it calls
/// `die` (if given: a process's abort) or else never ends, and the replica
/// drops the run mid-job and returns (see [`CrashAt`]).
pub async fn replica(
    store: Arc<dyn Store>,
    schedule: Schedule,
    plan: Plan,
    crash_at: CrashAt,
    report: Report,
    die: Option<Die>,
) -> ReplicaLog {
    let Plan {
        first,
        last,
        work,
        late,
    } = plan;
    let mut log = ReplicaLog::default();
    loop {
        let slot = schedule.current_slot();
        if slot.index > last {
            return log;
        }
        if slot.index < first {
            tokio::time::sleep(schedule.until_next_slot() + Duration::from_millis(1)).await;
            continue;
        }
        for point in tries(&slot, late) {
            nap_until(&schedule, point).await;
            if schedule.current_slot().index != slot.index {
                break;
            }
            let crash = crash_at.is_some_and(|at| slot.index >= at);
            let report = report.clone();
            let dying = Arc::new(Notify::new());
            let run = schedule.run_once(&*store, "replica", |run| {
                let (dying, die) = (dying.clone(), die.clone());
                async move {
                    report(run.slot.index);
                    if crash {
                        if let Some(die) = die {
                            die();
                        }
                        dying.notify_one();
                        std::future::pending::<()>().await;
                    }
                    tokio::time::sleep(work).await;
                }
            });
            let outcome = tokio::select! {
                outcome = run => outcome,
                () = dying.notified() => {
                    // Dies mid-job: the run is dropped where it stands.
                    log.started.push(slot.index);
                    log.crashed = true;
                    return log;
                }
            };
            match outcome {
                Ok(Outcome::Ran { slot, .. }) => log.started.push(slot.index),
                Ok(_) => {}
                Err(error) => panic!("replica: the store failed: {error:?}"),
            }
        }
        nap_until(&schedule, slot.end).await;
    }
}

/// The moments a replica tries a slot: start, middle, end less `late`.
fn tries(slot: &Slot, late: Duration) -> [SystemTime; 3] {
    let period = slot.end.duration_since(slot.start).unwrap_or_default();
    [
        slot.start,
        slot.start + period / 2,
        slot.end - late.min(period),
    ]
}

/// Sleeps until `at` by the schedule's clock (not at all if it passed).
async fn nap_until(schedule: &Schedule, at: SystemTime) {
    let left = at.duration_since(schedule.now()).unwrap_or_default();
    tokio::time::sleep(left).await;
}

/// Which replicas started each slot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FleetLog {
    /// Slot → the replicas (by index) that started its job.
    pub runs: BTreeMap<u64, Vec<usize>>,
    /// The slots the fleet ran over.
    pub first: u64,
    /// The last slot.
    pub last: u64,
    /// The replicas that crashed.
    pub crashed: Vec<usize>,
}

impl FleetLog {
    /// Slots started by more than one replica, with who started them.
    pub fn doubles(&self) -> Vec<(u64, Vec<usize>)> {
        self.runs
            .iter()
            .filter(|(_, who)| who.len() > 1)
            .map(|(slot, who)| (*slot, who.clone()))
            .collect()
    }

    /// Slots of the range that nobody started.
    pub fn missed(&self) -> Vec<u64> {
        (self.first..=self.last)
            .filter(|slot| !self.runs.contains_key(slot))
            .collect()
    }
}

/// The fleet: one replica per store, each with its clock offset, over
/// `slots` slots starting two slots from now (by the host's clock). `base`
/// gives the schedule (job, period, skew bound, …); each replica gets it
/// with its own clock. `crash_at[i]` makes replica `i` crash.
pub async fn run_fleet(
    stores: Vec<Arc<dyn Store>>,
    base: Schedule,
    offsets: &[OffsetMs],
    slots: u64,
    work: Duration,
    late: Duration,
    crash_at: &[CrashAt],
) -> FleetLog {
    assert_eq!(stores.len(), offsets.len(), "one offset per replica");
    let first = base.slot_at(SystemTime::now()).index + 2;
    let last = first + slots - 1;
    let runs: Arc<Mutex<BTreeMap<u64, Vec<usize>>>> = Arc::default();
    let mut tasks = Vec::new();
    for (i, (store, offset)) in stores.into_iter().zip(offsets).enumerate() {
        let schedule = base.clone().clock(shifted_clock(*offset));
        let runs = runs.clone();
        let report: Report = Arc::new(move |slot| {
            runs.lock().unwrap().entry(slot).or_default().push(i);
        });
        let crash = crash_at.get(i).copied().flatten();
        let plan = Plan {
            first,
            last,
            work,
            late,
        };
        tasks.push(tokio::spawn(replica(
            store, schedule, plan, crash, report, None,
        )));
    }
    let mut crashed = Vec::new();
    for (i, task) in tasks.into_iter().enumerate() {
        if task.await.expect("replica task").crashed {
            crashed.push(i);
        }
    }
    let runs = runs.lock().unwrap().clone();
    FleetLog {
        runs,
        first,
        last,
        crashed,
    }
}
