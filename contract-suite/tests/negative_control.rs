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
