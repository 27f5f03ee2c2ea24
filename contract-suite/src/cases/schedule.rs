//! The schedule guard over the engine: each slot runs once across replicas
//! whose clocks disagree within the declared bound, and a crashed run's slot
//! is not run again.

use std::time::Duration;

use alkstore_core::schedule::Schedule;

use crate::Stores;
use crate::fleet::{FleetLog, run_fleet};

/// Slots of the fleet cases: long enough that a try at the start of a slot
/// is answered well inside it on a loaded machine.
const PERIOD: Duration = Duration::from_millis(400);
/// The declared bound on clock disagreement, and the offsets within it.
const SKEW: Duration = Duration::from_millis(100);
/// How long a run works, and how long before its slot's end a replica's
/// last try comes.
const WORK: Duration = Duration::from_millis(20);
const LATE: Duration = Duration::from_millis(15);

fn schedule(job: &str) -> Schedule {
    Schedule::every(job, PERIOD)
        .unwrap()
        .max_clock_skew(SKEW)
        .unwrap()
}

fn check_each_slot_once(log: &FleetLog, what: &str) {
    assert!(
        log.doubles().is_empty(),
        "rule: a schedule runs each slot at most once across replicas whose clocks disagree \
         by at most {SKEW:?}; saw slots run twice {:?} ({what})",
        log.doubles()
    );
    assert!(
        log.missed().is_empty(),
        "rule: a schedule runs every slot once while a replica is healthy; saw slots {:?} of \
         {}..={} run by nobody ({what})",
        log.missed(),
        log.first,
        log.last
    );
}

/// Four replicas on independent stores, clocks 0, 33, 66 and 100 ms ahead
/// (the bound is 100 ms), each trying every slot at its start, middle and
/// just before its end: each of 6 slots of 400 ms runs exactly once.
pub async fn schedule_runs_each_slot_once_across_skewed_clocks(stores: Stores) {
    let replicas = stores.open(4).await;
    let log = run_fleet(
        replicas,
        schedule("fleet/once"),
        &[0, 33, 66, 100],
        6,
        WORK,
        LATE,
        &[],
    )
    .await;
    check_each_slot_once(&log, "4 healthy replicas");
}

/// Three replicas; the one whose clock is furthest ahead dies inside the
/// first run it starts from the second slot on. Its slot is not run again
/// by the others (its claim outlives it), and every other slot still runs
/// once.
pub async fn schedule_crashed_run_is_not_run_again(stores: Stores) {
    let replicas = stores.open(3).await;
    let base = schedule("fleet/crash");
    let first_slot_soon = base.slot_at(std::time::SystemTime::now()).index + 2;
    let log = run_fleet(
        replicas,
        base,
        &[0, 50, 100],
        5,
        WORK,
        LATE,
        &[None, None, Some(first_slot_soon + 1)],
    )
    .await;
    assert_eq!(
        log.crashed,
        [2],
        "the replica set to crash did not (it never started a run from slot {}): {log:?}",
        first_slot_soon + 1
    );
    check_each_slot_once(&log, "one replica crashed mid-run");
}
