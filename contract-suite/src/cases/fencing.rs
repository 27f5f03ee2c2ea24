//! Fencing tokens over a long history of one name.

use std::sync::Arc;
use std::time::Duration;

use alkstore_core::{Error, MAX_FENCE, MAX_FENCE_RAISE, MIN_FENCE_RAISE, Store};

use crate::clock::{ms, purgeable};
use crate::safety::Rng;
use crate::safety::history::check;
use crate::safety::workload::Race;
use crate::support::{granted, outlive, refused};

/// Fences strictly increase over grants, releases, expiries, takeovers and
/// purges of one name; a same-owner re-acquire is the same grant, same fence.
pub async fn fences_strictly_increase(store: Arc<dyn Store>) {
    let short = ms(60);
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
                        purgeable(1),
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
/// answered); a raise out of range is refused before storage. It retires
/// every grant made before it — a lock, a permit, a reader: still live to
/// everyone else, its renewals answer false, and its own owner asking again
/// gets a new grant with a fence at least the raise's answer (a grant a
/// restore revived may carry a fence below fences handed out since).
pub async fn raise_fences_lifts_every_later_fence(store: Arc<dyn Store>) {
    let ttl = Duration::from_secs(30);
    let held = granted(store.try_lock("held", "a", ttl).await);
    let permit = granted(store.try_acquire_permit("pool", 2, "p", ttl).await);
    let reader = granted(store.try_read_lock("shared", "r", ttl).await);
    let before = reader.fence();
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
        Some(held.fence()),
        "rule: a grant a raise retired is still live to others, with its fence"
    );
    refused(store.try_lock("held", "b", ttl).await);
    for (old, what) in [(&held, "lock"), (&permit, "permit"), (&reader, "reader")] {
        assert!(
            !old.renew(ttl).await.unwrap(),
            "rule: a {what} granted before a fence raise is not renewed after it"
        );
    }
    let again = [
        granted(store.try_lock("held", "a", ttl).await),
        granted(store.try_acquire_permit("pool", 2, "p", ttl).await),
        granted(store.try_read_lock("shared", "r", ttl).await),
    ];
    for lock in &again {
        assert!(
            lock.fence() >= next,
            "rule: an owner asking again for its grant retired by a raise gets a new fence at \
             least the raise's answer; {} saw {} after a raise answering {next}",
            lock.name(),
            lock.fence()
        );
    }
    let after = granted(store.try_lock("after", "b", ttl).await);
    assert!(
        after.fence() >= next,
        "rule: every grant after a raise has a fence at least the one it answered; saw {} \
         after a raise answering {next}",
        after.fence()
    );
    assert!(after.renew(ttl).await.unwrap());
    for old in [held, permit, reader] {
        assert!(
            !old.release().await.unwrap(),
            "rule: the retired grant's handle never touches its owner's new grant"
        );
    }
    for lock in again.into_iter().chain([after]) {
        assert!(lock.release().await.unwrap());
    }
}

/// The end of the fence space ([`MAX_FENCE`]): raises by the most refused
/// once they would leave no fence, with [`Error::FencesExhausted`] and
/// nothing written; grants go on while fences are left, each above the
/// last and never past the end, until one is refused the same way; the
/// store stays usable (renewals, releases, reads, other grants' handles).
pub async fn fences_end_with_a_typed_error_and_the_store_goes_on(store: Arc<dyn Store>) {
    let ttl = Duration::from_secs(60);
    let first = granted(store.try_lock("first", "a", ttl).await);
    let mut last = first.fence();
    first.let_lapse();
    let mut raises = 0u32;
    let left = loop {
        match store.raise_fences(MAX_FENCE_RAISE).await {
            Ok(next) => {
                assert!(
                    next > last,
                    "rule: a raise never lowers; saw {next} after {last}"
                );
                last = next;
                raises += 1;
                assert!(raises < 10_000, "rule: the fences end below 2^63");
            }
            Err(Error::FencesExhausted {
                operation: "raise_fences",
                left,
            }) => break left,
            Err(e) => panic!(
                "rule: a raise past the end of the fences is FencesExhausted; saw {e:?} after \
                 {raises} raises"
            ),
        }
    };
    assert!(
        left <= MAX_FENCE_RAISE && last.saturating_add(left) <= MAX_FENCE.saturating_add(1),
        "rule: a refused raise says how many fences are left, fewer than it asked; saw {left} \
         after the lowest later fence {last}"
    );
    // Still granting, above every fence before.
    let held = granted(store.try_lock("held", "b", ttl).await);
    assert!(held.fence() >= last && held.fence() <= MAX_FENCE);
    // Close to the end, in one raise: a handful of fences left.
    let left = MAX_FENCE - held.fence();
    assert!(
        left > MIN_FENCE_RAISE + 16,
        "precondition: room for a raise to the last fences; {left} left"
    );
    store.raise_fences(left - 16).await.unwrap();
    let mut last = held.fence();
    let mut grants = 0;
    let refusal = loop {
        match store.try_lock(&format!("n{grants}"), "c", ttl).await {
            Ok(Some(lock)) => {
                assert!(
                    lock.fence() > last && lock.fence() <= MAX_FENCE,
                    "rule: a fence never wraps or repeats; saw {} after {last} (the end is \
                     {MAX_FENCE})",
                    lock.fence()
                );
                last = lock.fence();
                grants += 1;
                assert!(grants < 64, "rule: the fences end at {MAX_FENCE}");
                lock.let_lapse();
            }
            other => break other,
        }
    };
    assert!(
        matches!(
            refusal,
            Err(Error::FencesExhausted {
                operation: "try_lock",
                left: 0
            })
        ),
        "rule: a grant past the end of the fences is FencesExhausted; saw {refusal:?} after \
         fence {last}"
    );
    for grant in [
        store.try_acquire_permit("pool", 2, "p", ttl).await,
        store.try_write_lock("rw", "w", ttl).await,
    ] {
        assert!(
            matches!(grant, Err(Error::FencesExhausted { left: 0, .. })),
            "rule: every grant past the end is FencesExhausted; saw {grant:?}"
        );
    }
    let raise = store.raise_fences(MIN_FENCE_RAISE).await;
    assert!(
        matches!(raise, Err(Error::FencesExhausted { left: 0, .. })),
        "rule: a raise past the end is FencesExhausted; saw {raise:?}"
    );
    // Nothing was written by the refusals; the store stays usable.
    assert_eq!(store.holders("pool").await.unwrap(), Vec::new());
    assert_eq!(store.holders("rw").await.unwrap(), Vec::new());
    assert_eq!(
        store.holder("held").await.unwrap().map(|h| h.fence),
        Some(held.fence())
    );
    refused(store.try_lock("held", "z", ttl).await);
    assert!(held.release().await.unwrap());
    assert_eq!(store.holder("held").await.unwrap(), None);
}
