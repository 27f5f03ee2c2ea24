//! The schedule guard's own logic, over the reference engine (the fleet
//! cases run it over every engine): a grant answered after its slot ended
//! is not used, `Overlap::Skip` skips the slot whose turn comes during a
//! run (claiming it first), and `run` neither skips the slot after a run
//! that outlasted its own nor tries a slot again when the clock steps back.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use alkstore_contract_suite::fleet::shifted;
use alkstore_contract_suite::reference::MemoryEngine;
use alkstore_core::schedule::{Outcome, Overlap, Schedule, Slot};
use alkstore_core::{
    Attempt, BoxError, Engine, EngineStore, GrantKey, Holder, LeaseMillis, Listed, Queue,
    ReleaseBus, Store,
};
use async_trait::async_trait;

const PERIOD: Duration = Duration::from_millis(200);

/// The reference engine whose grants are answered `delay_ms` late (the
/// row is written at once; the answer takes its time), and whose running
/// locks (`…/running`) are granted `running_delay_ms` late (the row written
/// then).
#[derive(Debug, Clone, Default)]
struct LateAnswers {
    inner: MemoryEngine,
    delay_ms: Arc<AtomicU64>,
    running_delay_ms: Arc<AtomicU64>,
}

#[async_trait]
impl Engine for LateAnswers {
    async fn acquire(
        &self,
        name: &str,
        owner: &str,
        ttl: LeaseMillis,
        queue: Queue,
        deadline: Option<Instant>,
    ) -> Result<Attempt, BoxError> {
        if name.ends_with("/running") {
            let delay = self.running_delay_ms.load(Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        let attempt = self
            .inner
            .acquire(name, owner, ttl, queue, deadline)
            .await?;
        let delay = Duration::from_millis(self.delay_ms.load(Ordering::SeqCst));
        tokio::time::sleep(delay).await;
        Ok(attempt)
    }
    async fn renew(&self, grant: &GrantKey, ttl: LeaseMillis) -> Result<bool, BoxError> {
        self.inner.renew(grant, ttl).await
    }
    async fn release(&self, grant: &GrantKey) -> Result<bool, BoxError> {
        self.inner.release(grant).await
    }
    async fn holder(&self, name: &str) -> Result<Option<Holder>, BoxError> {
        self.inner.holder(name).await
    }
    async fn purge_expired(&self) -> Result<u64, BoxError> {
        self.inner.purge_expired().await
    }
    async fn list(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Listed>, BoxError> {
        self.inner.list(prefix, after, limit).await
    }
    async fn force_release(
        &self,
        name: &str,
        fence: Option<u64>,
    ) -> Result<Option<Holder>, BoxError> {
        self.inner.force_release(name, fence).await
    }
    async fn close(&self) -> Result<(), BoxError> {
        self.inner.close().await
    }
    fn releases(&self) -> &ReleaseBus {
        self.inner.releases()
    }
}

fn schedule(job: &str) -> Schedule {
    Schedule::every(job, PERIOD)
        .unwrap()
        .max_clock_skew(Duration::from_millis(20))
        .unwrap()
}

/// Sleeps until `after` past the start of the next slot; a wake-up more
/// than 20 ms late (a loaded machine) waits for the slot after, and so on.
async fn into_next_slot(schedule: &Schedule, after: Duration) -> Slot {
    for _ in 0..10 {
        let target = schedule.current_slot().index + 1;
        tokio::time::sleep(schedule.until_next_slot() + after).await;
        let slot = schedule.current_slot();
        let into = schedule
            .now()
            .duration_since(slot.start)
            .unwrap_or_default();
        if slot.index == target && into >= after && into < after + Duration::from_millis(20) {
            return slot;
        }
    }
    panic!("the machine is too slow for this test's timing: 10 late wake-ups in a row")
}

/// A try 30 ms before the slot's end whose grant is answered 100 ms later
/// (after the slot ended) does not run the job: `TooLate`. The same try
/// answered at once runs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_answered_after_the_slot_ended_is_not_used() {
    let engine = LateAnswers::default();
    let store = EngineStore::new(engine.clone());
    let schedule = schedule("late");
    for (delay_ms, late) in [(100, true), (0, false), (100, true)] {
        engine.delay_ms.store(delay_ms, Ordering::SeqCst);
        into_next_slot(&schedule, PERIOD - Duration::from_millis(30)).await;
        let ran = AtomicBool::new(false);
        let outcome = schedule
            .run_once(&store, "r", |_| async { ran.store(true, Ordering::SeqCst) })
            .await
            .unwrap();
        if late {
            assert!(
                matches!(outcome, Outcome::TooLate { .. }),
                "rule: a claim answered after the slot ended by the replica's clock is not \
                 used; saw {outcome:?} for a grant answered {delay_ms} ms late"
            );
            assert!(!ran.load(Ordering::SeqCst), "the job ran on a late grant");
        } else {
            assert!(matches!(outcome, Outcome::Ran { .. }), "{outcome:?}");
        }
    }
}

/// With `Overlap::Skip`, a run that outlasts its slot makes the next slot
/// skip — for every replica, since the one that skips it holds its claim —
/// and the slot after runs, its running fence higher. With overlaps
/// allowed, the same next slot runs alongside.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlap_skip_skips_the_slot_whose_turn_comes_during_a_run() {
    for overlap in [Overlap::Skip, Overlap::Allowed] {
        let engine = MemoryEngine::default();
        let (a, b, c) = (
            EngineStore::new(engine.clone()),
            EngineStore::new(engine.clone()),
            EngineStore::new(engine),
        );
        let schedule = schedule(&format!("overlap-{overlap:?}")).overlap(overlap);
        let first = into_next_slot(&schedule, Duration::from_millis(10)).await;
        // A's run lasts into the middle of the next slot.
        let long_run = {
            let schedule = schedule.clone();
            tokio::spawn(async move {
                let outcome = schedule
                    .run_once(&a, "a", |run| async move {
                        tokio::time::sleep(PERIOD + PERIOD / 2 - Duration::from_millis(10)).await;
                        run.running_fence
                    })
                    .await
                    .unwrap();
                (a, outcome)
            })
        };
        let second = into_next_slot(&schedule, Duration::from_millis(20)).await;
        assert_eq!(second.index, first.index + 1);
        let b_outcome = schedule.run_once(&b, "b", |_| async {}).await.unwrap();
        let c_outcome = schedule.run_once(&c, "c", |_| async {}).await.unwrap();
        let (_a, a_outcome) = long_run.await.unwrap();
        let Outcome::Ran {
            slot,
            output: first_running_fence,
            ..
        } = a_outcome
        else {
            panic!("A did not run the first slot: {a_outcome:?}");
        };
        assert_eq!(slot, first);
        assert!(
            matches!(c_outcome, Outcome::ClaimedElsewhere { .. }),
            "the second slot was not claimed by B, whatever it did: C saw {c_outcome:?}"
        );
        match overlap {
            Overlap::Skip => {
                assert_eq!(
                    b_outcome,
                    Outcome::PreviousRunStillRunning { slot: second },
                    "rule: with Overlap::Skip a slot whose turn comes during a run is skipped"
                );
                into_next_slot(&schedule, Duration::from_millis(10)).await;
                let third = schedule
                    .run_once(&c, "c", |run| async move { run.running_fence })
                    .await
                    .unwrap();
                let Outcome::Ran { output, .. } = third else {
                    panic!("the slot after the long run did not run: {third:?}");
                };
                assert!(
                    output > first_running_fence,
                    "running fences {first_running_fence:?} then {output:?}"
                );
            }
            Overlap::Allowed => assert!(
                matches!(b_outcome, Outcome::Ran { .. }),
                "with overlaps allowed the next slot runs alongside: {b_outcome:?}"
            ),
        }
    }
}

/// `run` over five slots, the first run lasting 1.5 slots: every slot is
/// tried, the one that began during the long run at once when it ended
/// (not skipped by sleeping to the start of the next). With
/// `Overlap::Skip`, that slot is skipped instead — claimed, so no replica
/// runs it late — and the next runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_tries_the_next_slot_at_once_after_a_run_that_outlasted_its_slot() {
    for overlap in [Overlap::Allowed, Overlap::Skip] {
        run_after_a_long_run(overlap).await;
    }
}

async fn run_after_a_long_run(overlap: Overlap) {
    let store = EngineStore::new(MemoryEngine::default());
    // A skew bound of 1 s keeps every claim of the test alive to its end.
    let schedule = Schedule::every(&format!("loop-{overlap:?}"), PERIOD)
        .unwrap()
        .max_clock_skew(Duration::from_secs(1))
        .unwrap()
        .overlap(overlap);
    into_next_slot(&schedule, Duration::from_millis(10)).await;
    let runs = AtomicU64::new(0);
    let mut outcomes = Vec::new();
    let looping = schedule.run(
        &store,
        "r",
        |_| {
            let first = runs.fetch_add(1, Ordering::SeqCst) == 0;
            async move {
                if first {
                    tokio::time::sleep(PERIOD + PERIOD / 2).await;
                }
            }
        },
        |outcome| outcomes.push(outcome.clone()),
    );
    let _ = tokio::time::timeout(4 * PERIOD + PERIOD / 2, looping).await;
    let ran: Vec<u64> = outcomes
        .iter()
        .filter_map(|outcome| match outcome {
            Outcome::Ran { slot, .. } => Some(slot.index),
            _ => None,
        })
        .collect();
    let skipped: Vec<u64> = outcomes
        .iter()
        .filter_map(|outcome| match outcome {
            Outcome::PreviousRunStillRunning { slot } => Some(slot.index),
            _ => None,
        })
        .collect();
    assert!(ran.len() >= 3, "too few runs: {outcomes:?}");
    match overlap {
        Overlap::Allowed => {
            assert!(skipped.is_empty(), "{outcomes:?}");
            for pair in ran.windows(2) {
                assert_eq!(
                    pair[1],
                    pair[0] + 1,
                    "rule: run tries every slot, even one that began during a long run; ran \
                     {ran:?}"
                );
            }
        }
        Overlap::Skip => {
            assert_eq!(
                skipped,
                [ran[0] + 1],
                "rule: with Overlap::Skip, run skips the slot that began during a run; \
                 outcomes {outcomes:?}"
            );
            assert_eq!(ran[1], ran[0] + 2, "{outcomes:?}");
            assert!(
                store
                    .holder(&schedule.slot_name(skipped[0]))
                    .await
                    .unwrap()
                    .is_some(),
                "rule: a slot skipped by the loop is claimed, so that no replica runs it late"
            );
            for pair in ran[1..].windows(2) {
                assert_eq!(pair[1], pair[0] + 1, "{outcomes:?}");
            }
        }
    }
}

/// The replica's clock steps back a whole slot after its first run (as a
/// clock corrected by NTP): `run` does not run that slot again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_does_not_run_a_slot_again_when_the_clock_steps_back() {
    let store = EngineStore::new(MemoryEngine::default());
    let shift = Arc::new(AtomicI64::new(0));
    let clock = {
        let shift = shift.clone();
        move || shifted(SystemTime::now(), shift.load(Ordering::SeqCst))
    };
    // No skew allowed for: the claim of a slot ends with it.
    let schedule = Schedule::every("steps", PERIOD).unwrap().clock(clock);
    into_next_slot(&schedule, Duration::from_millis(10)).await;
    let mut outcomes = Vec::new();
    let looping = schedule.run(
        &store,
        "r",
        |run| async move { run.slot.index },
        |outcome| {
            if outcomes.is_empty() {
                // Back a slot and a half: the slot just run comes round
                // again after its claim (held to its end) has lapsed.
                shift.store(
                    -((PERIOD + PERIOD / 2).as_millis() as i64),
                    Ordering::SeqCst,
                );
            }
            outcomes.push(outcome.clone());
        },
    );
    let _ = tokio::time::timeout(4 * PERIOD + PERIOD / 2, looping).await;
    let mut ran: Vec<u64> = outcomes
        .iter()
        .filter_map(|outcome| match outcome {
            Outcome::Ran { slot, .. } => Some(slot.index),
            _ => None,
        })
        .collect();
    assert!(ran.len() >= 2, "too few runs: {outcomes:?}");
    let all = ran.clone();
    ran.dedup();
    assert_eq!(
        ran, all,
        "rule: run does not run a slot again after its clock steps back"
    );
    assert!(all.windows(2).all(|w| w[1] == w[0] + 1), "runs {all:?}");
}

/// One replica whose first run lasts 500 ms over 200 ms slots: `run`
/// reports every slot from the first to the last exactly once, in order —
/// the slot that began and ended during the run as `Missed`, none left out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_reports_an_outcome_for_every_slot() {
    for overlap in [Overlap::Allowed, Overlap::Skip] {
        let store = EngineStore::new(MemoryEngine::default());
        let schedule = Schedule::every(&format!("every-{overlap:?}"), PERIOD)
            .unwrap()
            .max_clock_skew(Duration::from_secs(1))
            .unwrap()
            .overlap(overlap);
        into_next_slot(&schedule, Duration::from_millis(10)).await;
        let runs = AtomicU64::new(0);
        let mut outcomes = Vec::new();
        let looping = schedule.run(
            &store,
            "r",
            |_| {
                let first = runs.fetch_add(1, Ordering::SeqCst) == 0;
                async move {
                    if first {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            },
            |outcome| outcomes.push(outcome.clone()),
        );
        let _ = tokio::time::timeout(6 * PERIOD + PERIOD / 2, looping).await;
        // The slots each outcome covers, in the order reported.
        let covered: Vec<u64> = outcomes
            .iter()
            .flat_map(|outcome| match outcome {
                Outcome::Missed { first, count } => first.index..first.index + count,
                other => other.slot().index..other.slot().index + 1,
            })
            .collect();
        assert!(covered.len() >= 5, "too few outcomes: {outcomes:?}");
        let expected: Vec<u64> = (covered[0]..covered[0] + covered.len() as u64).collect();
        assert_eq!(
            covered, expected,
            "rule: run reports every slot once, in order; outcomes {outcomes:?}"
        );
        assert!(
            matches!(outcomes[0], Outcome::Ran { .. }),
            "the first slot ran: {outcomes:?}"
        );
        assert!(
            matches!(outcomes[1], Outcome::Missed { .. }),
            "rule: the slot that began and ended during a run is reported missed; {outcomes:?}"
        );
        let ran = outcomes
            .iter()
            .filter(|o| matches!(o, Outcome::Ran { .. }))
            .count();
        assert!(ran >= 3, "the slots after the long run ran: {outcomes:?}");
    }
}

/// `Overlap::Skip` with retries: a run of a slot that dies as its job starts
/// leaves its running lock behind longer than its claim (the lock was taken
/// 250 ms after the claim, and the two leases are renewed apart). A replica
/// that retries the slot once the claim has lapsed waits the dead run's
/// running lock out and runs the slot, rather than take it for a run still
/// going on and skip the slot its retry is for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_waits_out_a_crashed_runs_running_lock() {
    let engine = LateAnswers::default();
    let (a, b) = (
        EngineStore::new(engine.clone()),
        EngineStore::new(engine.clone()),
    );
    let schedule = Schedule::every("crash-skip", Duration::from_secs(2))
        .unwrap()
        .overlap(Overlap::Skip)
        .retry_crashed_runs()
        .run_lease(Duration::from_millis(600))
        .unwrap();
    let slot = into_next_slot(&schedule, Duration::from_millis(10)).await;
    engine.running_delay_ms.store(250, Ordering::SeqCst);
    let started = Arc::new(tokio::sync::Notify::new());
    let crashing = {
        let (schedule, started) = (schedule.clone(), started.clone());
        tokio::spawn(async move {
            schedule
                .run_once(&a, "a", |_| async move {
                    started.notify_one();
                    std::future::pending::<()>().await
                })
                .await
        })
    };
    started.notified().await;
    crashing.abort();
    engine.running_delay_ms.store(0, Ordering::SeqCst);
    // The crashed run's claim lapses first.
    let deadline = Instant::now() + Duration::from_secs(2);
    while b
        .holder(&schedule.slot_name(slot.index))
        .await
        .unwrap()
        .is_some()
    {
        assert!(
            Instant::now() < deadline,
            "the crashed run's claim never lapsed"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        b.holder(&schedule.running_name()).await.unwrap().is_some(),
        "precondition: the crashed run's running lock outlives its claim"
    );
    let outcome = schedule
        .run_once(&b, "b", |run| async move { run.slot.index })
        .await
        .unwrap();
    assert!(
        matches!(outcome, Outcome::Ran { output, .. } if output == slot.index),
        "rule: with retries, a crashed run's slot runs again even when its running lock \
         outlived its claim; saw {outcome:?}"
    );
}
