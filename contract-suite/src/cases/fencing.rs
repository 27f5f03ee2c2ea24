//! Fencing tokens over a long history of one name.

use std::sync::Arc;
use std::time::Duration;

use alkstore_core::{Error, MAX_FENCE_RAISE, MIN_FENCE_RAISE, Store};

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
        // Only while the lease is certainly live for the engine: a short one
        // may lapse before a re-acquire lands on a loaded machine, and is
        // then rightly a new grant.
        if step % 4 != 0 {
            let again = granted(store.try_lock("fenced", owner, long).await);
            assert_eq!(
                again.fence(),
                last,
                "rule: the same owner again gets the same grant, same fence; step {step}: \
                 re-acquire changed the fence"
            );
            drop(again);
        }
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

/// The operator's fence raise: every grant made after it has a fence at
/// least the raise above every fence before (and at least the fence it
/// answered); a live grant keeps its fence and its lease; a raise out of
/// range is refused before storage.
pub async fn raise_fences_lifts_every_later_fence(store: Arc<dyn Store>) {
    let ttl = Duration::from_secs(30);
    let held = granted(store.try_lock("held", "a", ttl).await);
    let before = held.fence();
    for by in [0, MIN_FENCE_RAISE - 1, MAX_FENCE_RAISE + 1] {
        let refused = store.raise_fences(by).await;
        assert!(
            matches!(refused, Err(Error::InvalidRaise { by: b, .. }) if b == by),
            "rule: a fence raise out of range is InvalidRaise; saw {refused:?} for {by}"
        );
    }
    let next = store.raise_fences(MIN_FENCE_RAISE).await.unwrap();
    assert!(
        next > before + MIN_FENCE_RAISE,
        "rule: a raise answers the lowest later fence, above every earlier fence by the raise; \
         saw {next} after fence {before}, raised by {MIN_FENCE_RAISE}"
    );
    let holder = store.holder("held").await.unwrap().map(|h| h.fence);
    assert_eq!(
        holder,
        Some(before),
        "rule: a raise leaves live grants as they are"
    );
    assert!(
        held.renew(ttl).await.unwrap(),
        "rule: a raise leaves live grants as they are"
    );
    let after = granted(store.try_lock("after", "b", ttl).await);
    assert!(
        after.fence() >= next,
        "rule: every grant after a raise has a fence at least the one it answered; saw {} \
         after a raise answering {next}",
        after.fence()
    );
    assert!(after.release().await.unwrap());
    assert!(held.release().await.unwrap());
}
