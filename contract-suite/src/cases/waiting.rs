//! The waiting acquire, `lock`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use alkstore_core::Store;

use crate::support::{granted, refused};

const LONG: Duration = Duration::from_secs(30);

/// `lock` on a held name returns `Ok(None)` once the wait runs out, not before.
pub async fn lock_times_out_with_none(store: Arc<dyn Store>) {
    let a = granted(store.try_lock("job", "a", LONG).await);
    let wait = Duration::from_millis(300);
    let started = Instant::now();
    refused(store.lock("job", "b", LONG, wait).await);
    let waited = started.elapsed();
    assert!(
        waited >= wait,
        "rule: lock answers Ok(None) once the wait runs out, never earlier; saw it give up after \
         {waited:?}, expected at least {wait:?}"
    );
    assert!(
        waited < wait + Duration::from_secs(5),
        "rule: lock answers Ok(None) once the wait runs out; saw it answer after {waited:?}, \
         expected within {wait:?} + 5 s"
    );
    // A zero wait is one attempt.
    refused(store.lock("job", "b", LONG, Duration::ZERO).await);
    assert!(
        a.release().await.unwrap(),
        "rule: release answers true for its own live grant; saw false, expected true"
    );
}

/// A waiter is woken by the release, not by its poll: over several rounds
/// (each waiter waiting long enough for its back-off to reach its ceiling
/// first), the median release → grant time stays far below any poll interval.
pub async fn lock_woken_by_release(store: Arc<dyn Store>) {
    let mut handoffs = Vec::new();
    for round in 0..5 {
        let name = format!("handoff-{round}");
        let holder = granted(store.try_lock(&name, "holder", LONG).await);
        let waiter = {
            let (store, name) = (store.clone(), name.clone());
            tokio::spawn(async move {
                let asked_at = Instant::now();
                let lock = granted(
                    store
                        .lock(&name, "waiter", LONG, Duration::from_secs(20))
                        .await,
                );
                (asked_at, Instant::now(), lock)
            })
        };
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(
            !waiter.is_finished(),
            "rule: one owner holds a name at a time; round {round}: saw the waiter finished \
             (granted while the name was held, or failed), expected it still waiting"
        );
        let released_at = Instant::now();
        assert!(
            holder.release().await.unwrap(),
            "rule: release answers true for its own live grant; round {round}: saw false, \
             expected true"
        );
        let (asked_at, granted_at, lock) = waiter.await.unwrap();
        // The waiter was really waiting before the release, long enough for
        // its back-off to be at its ceiling.
        assert!(
            released_at - asked_at >= Duration::from_millis(400),
            "precondition: the waiter was waiting before the release; round {round}: saw {:?} \
             from its ask to the release, expected at least 400 ms (the waiter started late)",
            released_at - asked_at
        );
        handoffs.push(granted_at - released_at);
        assert!(
            lock.release().await.unwrap(),
            "rule: release answers true for its own live grant; round {round}: saw false, \
             expected true"
        );
    }
    handoffs.sort();
    let median = handoffs[handoffs.len() / 2];
    assert!(
        median < Duration::from_millis(30),
        "rule: a waiter is woken by the release, not by its poll; saw a median release → grant \
         of {median:?} ({handoffs:?}), expected under 30 ms"
    );
}

/// A waiter gets the name once the holder's lease lapses, with no release.
pub async fn lock_granted_after_expiry(store: Arc<dyn Store>) {
    let ttl = Duration::from_millis(400);
    let a = granted(store.try_lock("job", "a", ttl).await);
    let b = granted(store.lock("job", "b", LONG, Duration::from_secs(10)).await);
    assert!(
        Instant::now() >= a.valid_until(),
        "rule: valid_until never promises more than the engine holds; saw b granted {:?} before \
         a's valid_until, expected not before",
        a.valid_until().saturating_duration_since(Instant::now())
    );
    assert!(
        b.fence() > a.fence(),
        "rule: a takeover carries a higher fence; saw fence {} after {}, expected it higher",
        b.fence(),
        a.fence()
    );
    assert!(
        b.release().await.unwrap(),
        "rule: release answers true for its own live grant; saw false, expected true"
    );
}
