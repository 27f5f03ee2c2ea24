//! The waiting acquire, `lock`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use alkstore_core::Store;
use tracing::instrument::WithSubscriber;

use crate::clock::{clock, ms};
use crate::support::{Handoff, assert_woken, granted, refused};

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
    let handoffs = handoffs(&store, LetGo::Release).await;
    assert_woken(&handoffs, "the release");
}

/// How the holder lets go of the name in [`handoffs`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LetGo {
    /// It releases its grant.
    Release,
    /// An operator removes the grant by force.
    ForceRelease,
}

/// Five rounds of: a holder, a waiter that waits long enough for its
/// back-off to reach its ceiling (checked, not hoped), the holder letting go
/// by `let_go`; answers the median let-go → grant time and all of them.
async fn handoffs(store: &Arc<dyn Store>, let_go: LetGo) -> Vec<Handoff> {
    let mut handoffs = Vec::new();
    let (subscriber, spans, _second) = crate::spans::collecting();
    for round in 0..5 {
        let name = format!("handoff-{let_go:?}-{round}");
        let holder = granted(store.try_lock(&name, "holder", LONG).await);
        let waiter = {
            let (store, name) = (store.clone(), name.clone());
            let waiting = async move {
                let asked_at = Instant::now();
                let lock = granted(
                    store
                        .lock(&name, "waiter", LONG, Duration::from_secs(20))
                        .await,
                );
                (asked_at, Instant::now(), lock)
            };
            tokio::spawn(waiting.with_subscriber(subscriber.clone()))
        };
        tokio::time::sleep(crate::support::before_letting_go(round)).await;
        assert!(
            !waiter.is_finished(),
            "rule: one owner holds a name at a time; round {round}: saw the waiter finished \
             (granted while the name was held, or failed), expected it still waiting"
        );
        let released_at = Instant::now();
        match let_go {
            LetGo::Release => assert!(
                holder.release().await.unwrap(),
                "rule: release answers true for its own live grant; round {round}: saw false, \
                 expected true"
            ),
            LetGo::ForceRelease => {
                let removed = store.force_release(&name).await.unwrap();
                assert_eq!(
                    removed.map(|h| h.fence),
                    Some(holder.fence()),
                    "rule: a forced release removes the live grant and answers it"
                );
                holder.let_lapse();
            }
        }
        let (asked_at, granted_at, lock) = waiter.await.unwrap();
        // The waiter was really waiting before the holder let go, long
        // enough for its back-off to be at its ceiling.
        assert!(
            released_at >= asked_at + Duration::from_millis(400),
            "precondition: the waiter was waiting before the {let_go:?}; round {round}: saw \
             {:?} from its ask to it, expected at least 400 ms (the waiter started late)",
            released_at.saturating_duration_since(asked_at)
        );
        handoffs.push(Handoff {
            took: granted_at - released_at,
            woken: crate::spans::woken_in(&spans.take(), "alkstore.lock"),
        });
        assert!(
            lock.release().await.unwrap(),
            "rule: release answers true for its own live grant; round {round}: saw false, \
             expected true"
        );
    }
    handoffs
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

/// `lock` with a wait of `Duration::MAX` (no deadline the clock can hold)
/// waits until it is granted: here until the holder's lease lapses.
pub async fn lock_with_an_endless_wait_waits_until_granted(store: Arc<dyn Store>) {
    let ttl = Duration::from_millis(400);
    let a = granted(store.try_lock("job", "a", ttl).await);
    let asked = Instant::now();
    let waited = tokio::time::timeout(
        Duration::from_secs(10),
        store.lock("job", "b", LONG, Duration::MAX),
    )
    .await;
    let b = match waited {
        Ok(result) => granted(result),
        Err(_) => panic!(
            "rule: lock with an endless wait waits until granted; saw no answer within 10 s of a \
             400 ms lease"
        ),
    };
    assert!(
        Instant::now() >= a.valid_until(),
        "rule: lock with an endless wait is granted only once the name is free; saw it granted \
         {:?} after asking, before a's lease ended",
        asked.elapsed()
    );
    assert!(
        b.release().await.unwrap(),
        "rule: release answers true for its own live grant; saw false, expected true"
    );
}

/// `lock` with a zero wait makes one attempt: a free name is granted, a
/// held one refused at once.
pub async fn lock_with_a_zero_wait_tries_once(store: Arc<dyn Store>) {
    let lock = match store.lock("free", "a", LONG, Duration::ZERO).await {
        Ok(Some(lock)) => lock,
        other => panic!(
            "rule: lock with a zero wait tries once and a free name is granted; saw {other:?}, \
             expected a grant"
        ),
    };
    let asked = Instant::now();
    refused(store.lock("free", "b", LONG, Duration::ZERO).await);
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "rule: lock with a zero wait answers after one attempt; saw {:?}",
        asked.elapsed()
    );
    assert!(
        lock.release().await.unwrap(),
        "rule: release answers true for its own live grant; saw false, expected true"
    );
}

/// `lock` grants the ttl it was asked for — on a free name, and to a waiter
/// after a release: the lease ends near that ttl, not at some default.
pub async fn lock_grants_the_ttl_asked_for(store: Arc<dyn Store>) {
    let ttl = ms(600);
    // `valid_until` counts from the granting attempt's send time: no later
    // than when the call came back.
    let check = |lock: &dyn alkstore_core::Lock, answered: Instant, how: &str| {
        assert!(
            lock.valid_until() <= answered + ttl,
            "rule: lock grants the ttl asked for; {how}: saw valid_until {:?} after the answer, \
             expected at most the ttl {ttl:?}",
            lock.valid_until() - answered
        );
    };
    let free = granted(store.lock("free", "a", ttl, Duration::from_secs(5)).await);
    check(&*free, Instant::now(), "a free name");
    let left = store.holder("free").await.unwrap().map(|h| h.expires_in);
    assert!(
        left.is_some_and(|left| left <= ttl),
        "rule: lock grants the ttl asked for; a free name: saw the holder's time left {left:?}, \
         expected at most {ttl:?}"
    );
    let holder = granted(store.try_lock("held", "x", LONG).await);
    let waiter = {
        let store = store.clone();
        tokio::spawn(async move {
            let asked = Instant::now();
            let lock = granted(store.lock("held", "b", ttl, Duration::from_secs(10)).await);
            (asked, Instant::now(), lock)
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released_at = Instant::now();
    assert!(holder.release().await.unwrap());
    let (asked, answered, woken) = waiter.await.unwrap();
    assert!(
        released_at >= asked + Duration::from_millis(50),
        "precondition: the waiter was waiting before the release; saw {:?} from its ask to the \
         release, expected at least 50 ms (the waiter started late)",
        released_at.saturating_duration_since(asked)
    );
    check(&*woken, answered, "a waiter after a release");
    let left = store.holder("held").await.unwrap().map(|h| h.expires_in);
    assert!(
        left.is_some_and(|left| left <= ttl),
        "rule: lock grants the ttl asked for; a waiter after a release: saw the holder's time \
         left {left:?}, expected at most {ttl:?}"
    );
    // The lease ends with the ttl (as the engine's lease clock keeps it):
    // the name is free again soon after.
    let after = clock().lease_end(ttl) + Duration::from_millis(200);
    tokio::time::sleep(after).await;
    let Some(other) = store.try_lock("held", "c", LONG).await.unwrap() else {
        panic!(
            "rule: lock grants the ttl asked for; saw the waiter's grant still live {after:?} \
             after its {ttl:?} lease"
        );
    };
    assert!(other.release().await.unwrap());
    woken.let_lapse();
    free.let_lapse();
}

/// A waiter blocked on a name is woken by a forced release of that name at
/// once, not by its poll: over several rounds (the back-off at its ceiling
/// first), the median forced release → grant time stays far below any poll
/// interval.
pub async fn lock_woken_by_forced_release(store: Arc<dyn Store>) {
    let handoffs = handoffs(&store, LetGo::ForceRelease).await;
    assert_woken(&handoffs, "a forced release");
}
