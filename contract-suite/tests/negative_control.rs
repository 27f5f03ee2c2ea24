//! The negative control: the safety checker, run against an engine that
//! grants every request, must report the violation. A checker that cannot
//! fail proves nothing about the real engines.

use std::sync::Arc;
use std::time::Duration;

use alkstore_contract_suite::safety::broken::GrantsEverything;
use alkstore_contract_suite::safety::history::{Violation, check};
use alkstore_contract_suite::safety::workload::{Workload, contend};
use alkstore_core::EngineStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checker_catches_an_engine_that_grants_everything() {
    let store = Arc::new(EngineStore::new(GrantsEverything::default()));
    let workload = Workload {
        tasks: 100,
        cycles: 3,
        ttl: Duration::from_millis(150),
        pause_one_in: 20,
    };
    let outcome = contend(store, "contended", workload, 42).await;
    assert_eq!(outcome.history.len(), 300);
    let verdict = check(&outcome.history);
    assert!(
        matches!(
            verdict,
            Err(Violation::Overlap { .. } | Violation::FenceOrder { .. })
        ),
        "checker missed it: {verdict:?}"
    );
    assert!(
        outcome.counter < outcome.increments,
        "the counter missed the lost updates"
    );
    eprintln!(
        "negative control: {verdict:?}; {} lost updates, counter {} of {} increments",
        outcome.lost_updates, outcome.counter, outcome.increments
    );
}

/// The commit-order rule, run against an engine that is exclusive but draws
/// each fence before it checks the name: the race of independent stores must
/// find a grant whose fence is below one released before it came back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_race_catches_fences_drawn_before_the_check() {
    use alkstore_contract_suite::safety::broken::DrawsFenceEarly;
    use alkstore_contract_suite::safety::workload::{Race, race};
    let engine = DrawsFenceEarly::default();
    let stores: Vec<Arc<dyn alkstore_core::Store>> = (0..16)
        .map(|_| Arc::new(EngineStore::new(engine.clone())) as Arc<dyn alkstore_core::Store>)
        .collect();
    let shape = Race {
        tasks_per_store: 2,
        duration: Duration::from_secs(2),
    };
    let outcome = race(&stores, "raced", shape, 7).await;
    let verdict = check(&outcome.history);
    assert!(
        matches!(verdict, Err(Violation::FenceOrder { .. })),
        "checker missed fences out of commit order: {verdict:?} over {} grants",
        outcome.history.len()
    );
    assert_eq!(
        outcome.lost_updates, 0,
        "the engine is exclusive; only fences are wrong"
    );
    eprintln!(
        "negative control (commit order): {verdict:?} over {} grants",
        outcome.history.len()
    );
}

/// The schedule cases' checker, with clocks that disagree by more than the
/// schedule was told (200 ms apart, declared 10 ms): the replica whose clock
/// is behind asks for a slot after the claim of the one ahead ran out, and
/// runs it again. The fleet log must show it; a fleet driver that could not
/// see a double run would prove nothing of the real cases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schedule_checker_sees_slots_run_twice_beyond_the_skew_bound() {
    use alkstore_contract_suite::fleet::run_fleet;
    use alkstore_contract_suite::reference::MemoryEngine;
    use alkstore_core::Store;
    use alkstore_core::schedule::Schedule;

    let engine = MemoryEngine::default();
    let replicas: Vec<Arc<dyn Store>> = (0..2)
        .map(|_| Arc::new(EngineStore::new(engine.clone())) as Arc<dyn Store>)
        .collect();
    let schedule = Schedule::every("control/skew", Duration::from_millis(400))
        .unwrap()
        .max_clock_skew(Duration::from_millis(10))
        .unwrap();
    let log = run_fleet(
        replicas,
        schedule,
        &[0, 200],
        4,
        Duration::from_millis(20),
        Duration::from_millis(15),
        &[],
    )
    .await;
    let doubles = log.doubles();
    assert!(
        !doubles.is_empty(),
        "the fleet log shows no slot run twice with clocks 200 ms apart and a bound of 10 ms: \
         {log:?}"
    );
    eprintln!(
        "negative control: slots run twice {doubles:?} of {}..={}",
        log.first, log.last
    );
}
