//! Opting out of a case: only by a case's name, and the case then does not
//! run (a broken engine that the case would reject passes it).

use std::sync::Arc;

use alkstore_contract_suite::gallery::{Broken, Flaw};
use alkstore_contract_suite::{Fresh, case, list, run_case, verdict};
use alkstore_core::EngineStore;

async fn broken() -> Fresh {
    Fresh::new(Arc::new(EngineStore::new(Broken::new(
        Flaw::GrantsOverALiveRow,
    ))))
}

#[test]
fn an_opted_out_case_does_not_run() {
    let case = list::all()
        .into_iter()
        .find(|c| c.name == "exclusion_two_owners")
        .unwrap();
    // Without the opt-out the case rejects the engine...
    assert!(verdict(|| async { Some(broken().await) }, case).is_err());
    // ...with it, the case is not run.
    run_case(
        || async {
            Some(
                broken()
                    .await
                    .opting_out(case!(exclusion_two_owners), "shown by this test"),
            )
        },
        case,
    );
}

#[tokio::test]
#[should_panic(expected = "no contract case is named")]
async fn opting_out_of_a_case_that_does_not_exist_is_refused() {
    let _ = broken()
        .await
        .opting_out("exclusion_of_two_owners", "a typo");
}
