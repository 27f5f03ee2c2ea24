//! The schedule guard over the engine: each slot runs once across replicas
//! whose clocks disagree within the declared bound; a crashed run's slot is
//! not run again, or, with retries on, run once more.

use std::time::Duration;

use alkstore_core::schedule::Schedule;

use crate::Stores;
use crate::clock::{clock, ms};
use crate::fleet::{FleetLog, run_fleet};

/// Slots of the fleet cases: long enough that a try at the start of a slot
/// is answered well inside it on a loaded machine, and that its three tries
/// are not all lost to one stall of the machine (400 ms slots saw a slot
/// run by nobody, four healthy replicas, with a second test run beside).
const PERIOD: Duration = Duration::from_secs(1);
/// The retry case's slot: the run lease and the run fit three times in it.
const RETRY_PERIOD: Duration = Duration::from_millis(1200);
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
/// just before its end: each of 6 slots of 1 s runs exactly once.
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

/// With retries on (slots of 1.2 s, run lease 450 ms, kept alive through
/// runs of 750 ms — renewed every 150 ms — then held to the slot's end):
/// three replicas, the
/// one furthest ahead dying in its first run from the second slot on. That
/// slot is run once more by another replica, within the slot; every other
/// slot runs exactly once — a run that outlived its run lease still holds
/// its slot to the end.
pub async fn schedule_retry_runs_a_crashed_slot_once_more(stores: Stores) {
    let replicas = stores.open(3).await;
    // Three times the other cases' slot, so that the run lease, renewed
    // every third of it while a run works, survives a loaded machine's
    // hiccups of a few hundred milliseconds (at 150 ms, one renewal 100 ms
    // late let a live run's claim lapse and its slot run twice), and still
    // lapses after a crash early enough for a retry within the slot.
    // Slot, run lease and run scaled to the engine's lease clock (a lease
    // rounded up to a coarse clock's granule would lapse too late for a
    // retry within a 1.2 s slot); one slot fewer on such a clock, so that
    // the case stays well within its time.
    let base = Schedule::every("fleet/retry", RETRY_PERIOD * clock().scale())
        .unwrap()
        .max_clock_skew(SKEW)
        .unwrap()
        .retry_crashed_runs()
        .run_lease(ms(450))
        .unwrap();
    let first_slot_soon = base.slot_at(std::time::SystemTime::now()).index + 2;
    let crash_at = first_slot_soon + 1;
    let slots = if clock().scale() > 1 { 4 } else { 5 };
    let log = run_fleet(
        replicas,
        base,
        &[0, 50, 100],
        slots,
        ms(750),
        LATE,
        &[None, None, Some(crash_at)],
    )
    .await;
    assert_eq!(
        log.crashed,
        [2],
        "the replica set to crash did not (it never started a run from slot {crash_at}): {log:?}"
    );
    // Replica 2 died in the first run it started from `crash_at` on.
    let crashed_slot = log
        .runs
        .iter()
        .find(|(slot, who)| **slot >= crash_at && who.contains(&2))
        .map(|(slot, _)| *slot);
    for (slot, who) in &log.runs {
        let expected = if Some(*slot) == crashed_slot { 2 } else { 1 };
        assert_eq!(
            who.len(),
            expected,
            "rule: with retries on, a crashed run's slot is run once more and every other slot \
             exactly once; slot {slot} was started by replicas {who:?} (crashed run in slot \
             {crashed_slot:?}; all: {:?})",
            log.runs
        );
    }
    assert!(
        log.missed().is_empty(),
        "rule: every slot runs while a replica is healthy; saw slots {:?} run by nobody",
        log.missed()
    );
}
