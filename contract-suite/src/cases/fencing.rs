//! Fencing tokens over a long history of one name.

use std::sync::Arc;
use std::time::Duration;

use alkstore_core::Store;

use crate::safety::Rng;
use crate::safety::history::check;
use crate::safety::workload::Race;
use crate::support::{granted, outlive};

/// Fences strictly increase over grants, releases, expiries, takeovers and
/// purges of one name; a same-owner re-acquire is the same grant, same fence.
pub async fn fences_strictly_increase(store: Arc<dyn Store>) {
    let short = Duration::from_millis(60);
    let long = Duration::from_secs(30);
    let mut last = 0u64;
    for step in 0..40 {
        let owner = ["a", "b", "c"][step % 3];
        let lock = granted(
            store
                .try_lock("fenced", owner, if step % 4 == 0 { short } else { long })
                .await,
        );
        assert!(
            lock.fence() > last,
            "rule: fences strictly increase across grants of a name; step {step}: saw fence {} \
             after {last}, expected more than {last}",
            lock.fence()
        );
        last = lock.fence();
        let again = granted(store.try_lock("fenced", owner, long).await);
        assert_eq!(
            again.fence(),
            last,
            "rule: the same owner again gets the same grant, same fence; step {step}: re-acquire \
             changed the fence"
        );
        drop(again);
        match step % 4 {
            // Lapse, then the next step takes it over (sometimes after a purge).
            0 => {
                outlive(short).await;
                if step % 8 == 0 {
                    assert_eq!(
                        store.purge_expired().await.unwrap(),
                        1,
                        "rule: purge deletes the expired rows and says how many; step {step}: one \
                         lapsed row"
                    );
                }
                drop(lock);
            }
            _ => assert!(
                lock.release().await.unwrap(),
                "rule: release answers true for its own live grant; step {step}: saw false, \
                 expected true"
            ),
        }
    }
}

/// Sixteen independent stores (each with its own connections, as sixteen
/// processes would have) race for one name for four seconds, with long
/// leases and prompt releases: every grant requested after another came
/// back, or coming back after another's release returned, carries the higher
/// fence — fences follow commit order, not the order contenders started in.
/// No overlap and no lost update either.
pub async fn fences_in_commit_order_across_stores(stores: crate::Stores) {
    let peers = stores.open(16).await;
    let seed = Rng::from_clock("fences_in_commit_order_across_stores").next_u64();
    let race = Race {
        tasks_per_store: 2,
        duration: Duration::from_secs(4),
    };
    let outcome = crate::safety::workload::race(&peers, "raced", race, seed).await;
    let grants = outcome.history.len();
    assert!(
        grants >= 50,
        "only {grants} grants: too little contention to prove anything"
    );
    assert_eq!(
        check(&outcome.history),
        Ok(()),
        "rule: fences follow commit order and one owner holds a name at a time; seed {seed}"
    );
    assert_eq!(
        outcome.lost_updates, 0,
        "rule: one owner holds a name at a time: a write found another holder's write since its \
         read (lost updates, seed {seed})"
    );
    assert_eq!(
        outcome.counter, outcome.increments,
        "rule: one owner holds a name at a time: the unprotected counter lost an update \
         (seed {seed})"
    );
    eprintln!(
        "commit order: {grants} grants over {} stores checked, violations: 0",
        peers.len()
    );
}
