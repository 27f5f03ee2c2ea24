//! Renewing a lease.

use std::sync::Arc;
use std::time::{Duration, Instant};

use alkstore_core::{DurationError, Store};

use crate::clock::{clock, ms};
use crate::support::{assert_duration_error, granted, outlive};

/// Renew sets a full window from now; it does not add to the old one.
pub async fn renew_is_a_full_window_from_now(store: Arc<dyn Store>) {
    let lock = granted(store.try_lock("job", "a", Duration::from_secs(60)).await);
    let before = Instant::now();
    assert!(
        lock.renew(ms(2000)).await.unwrap(),
        "rule: renew answers true for its own live grant; saw false, expected true"
    );
    let holder = store.holder("job").await.unwrap().unwrap();
    // Additive would leave about 62 s (80 s scaled by ten); a full window
    // from now leaves at most 2 s (20 s).
    assert!(
        holder.expires_in <= ms(2000),
        "rule: renew sets a full window from now, not added to the old one; saw {holder:?}, \
         expected at most {:?} left",
        ms(2000)
    );
    assert!(
        holder.expires_in > ms(1000),
        "rule: renew sets a full window of its ttl from now; saw {holder:?}, expected more than \
         {:?} of the {:?} left",
        ms(1000),
        ms(2000)
    );
    assert!(
        lock.valid_until() <= Instant::now() + ms(2000),
        "rule: valid_until never promises more than the renewal's ttl; saw it {:?} from now, \
         expected at most {:?}",
        lock.valid_until().saturating_duration_since(Instant::now()),
        ms(2000)
    );
    assert!(
        lock.valid_until() >= before + ms(1900),
        "rule: a renewal answered true moves valid_until to its send time plus its ttl; saw it \
         {:?} after the renewal was sent, expected at least {:?}",
        lock.valid_until().saturating_duration_since(before),
        ms(1900)
    );
    // And it extends a short lease past its old end.
    let short = granted(store.try_lock("short", "a", ms(300)).await);
    assert!(
        short.renew(ms(5000)).await.unwrap(),
        "rule: renew answers true for its own live grant; saw false, expected true"
    );
    outlive(ms(300)).await;
    assert_eq!(
        store.holder("short").await.unwrap().unwrap().fence,
        short.fence(),
        "rule: renew sets a full window from now: a renewed short lease outlives its old end"
    );
    assert!(
        short.release().await.unwrap(),
        "rule: release answers true for its own live grant; saw false, expected true"
    );
    assert!(
        lock.release().await.unwrap(),
        "rule: release answers true for its own live grant; saw false, expected true"
    );
}

/// Renew after a takeover by another owner: `false`, and the new holder keeps it.
pub async fn renew_false_after_takeover(store: Arc<dyn Store>) {
    let ttl = ms(150);
    let a = granted(store.try_lock("job", "a", ttl).await);
    outlive(ttl).await;
    let b = granted(store.try_lock("job", "b", Duration::from_secs(30)).await);
    assert!(
        !a.renew(Duration::from_secs(30)).await.unwrap(),
        "rule: renew answers false after a takeover; saw true, expected false"
    );
    let holder = store.holder("job").await.unwrap().unwrap();
    assert_eq!(
        (holder.owner.as_str(), holder.fence),
        ("b", b.fence()),
        "rule: renew acts on exactly its grant: the new holder keeps the name"
    );
    assert!(
        b.release().await.unwrap(),
        "rule: release answers true for its own live grant; saw false, expected true"
    );
}

/// Renew after the lease lapsed, even with nobody taking it: `false`.
pub async fn renew_false_after_lapse(store: Arc<dyn Store>) {
    let ttl = ms(150);
    let a = granted(store.try_lock("job", "a", ttl).await);
    outlive(ttl).await;
    assert!(
        !a.renew(Duration::from_secs(30)).await.unwrap(),
        "rule: renew answers false once the lease lapsed; saw true, expected false"
    );
    let seen = store.holder("job").await.unwrap();
    assert!(
        seen.is_none(),
        "rule: holder reports only a live holder; saw {seen:?} after the lease lapsed and its \
         renewal answered false, expected None"
    );
    // The holder must acquire again, and gets a new fence.
    let again = granted(store.try_lock("job", "a", Duration::from_secs(30)).await);
    assert!(
        again.fence() > a.fence(),
        "rule: a holder whose lease lapsed acquires again with a higher fence; saw fence {} \
         after {}, expected it higher",
        again.fence(),
        a.fence()
    );
    assert!(
        again.release().await.unwrap(),
        "rule: release answers true for its own live grant; saw false, expected true"
    );
}

/// Renew refuses a zero or overflowing ttl before any round trip, and the
/// lease is left as it was.
pub async fn renew_duration_guard(store: Arc<dyn Store>) {
    let lock = granted(store.try_lock("job", "a", Duration::from_secs(2)).await);
    assert_duration_error(lock.renew(Duration::ZERO).await, DurationError::Zero);
    assert_duration_error(lock.renew(Duration::MAX).await, DurationError::TooLarge);
    let holder = store.holder("job").await.unwrap().unwrap();
    assert!(
        holder.expires_in <= Duration::from_secs(2),
        "rule: a refused renew leaves the lease as it was; saw {holder:?}, expected at most \
         2 s left"
    );
    assert_eq!(
        holder.fence,
        lock.fence(),
        "rule: a refused renew leaves the grant as it was"
    );
    assert!(
        lock.renew(Duration::from_secs(3)).await.unwrap(),
        "rule: renew answers true for its own live grant; saw false, expected true"
    );
    assert!(
        lock.release().await.unwrap(),
        "rule: release answers true for its own live grant; saw false, expected true"
    );
}

/// A renewal that answers `false` ends the handle's `valid_until` at once
/// (no later than the moment it was sent), even when this handle had no
/// other way to know: the grant was released through another store's
/// handle of it (the same owner string in another process).
pub async fn renew_false_ends_valid_until(stores: crate::Stores) {
    let pair = stores.open(2).await;
    if Arc::ptr_eq(&pair[0], &pair[1]) {
        eprintln!("renew_false_ends_valid_until: needs an independent peer store; not run");
        return;
    }
    let here = granted(pair[0].try_lock("job", "a", Duration::from_secs(30)).await);
    let there = granted(pair[1].try_lock("job", "a", Duration::from_secs(30)).await);
    assert_eq!(
        here.fence(),
        there.fence(),
        "rule: the same owner again gets the same grant, same fence: one grant across stores"
    );
    assert!(
        there.release().await.unwrap(),
        "rule: release answers true for its own live grant; saw false, expected true"
    );
    assert!(
        here.valid_until() > Instant::now(),
        "precondition: nothing told this handle of the other store's release yet; saw its \
         valid_until passed {:?} ago, expected it ahead",
        Instant::now().saturating_duration_since(here.valid_until())
    );
    assert!(
        !here.renew(Duration::from_secs(30)).await.unwrap(),
        "rule: renew answers false once its grant was released (through another store's \
         handle); saw true, expected false"
    );
    assert!(
        here.valid_until() <= Instant::now(),
        "rule: a renew answering false ends valid_until; saw it {:?} ahead after the renewal \
         answered false, expected it passed",
        here.valid_until().saturating_duration_since(Instant::now())
    );
}

/// `valid_until` never promises more than the engine holds: another owner
/// polling the name (every millisecond) is never granted it before the first
/// holder's `valid_until`, after a grant and after a renewal.
pub async fn valid_until_never_outlasts_the_lease(store: Arc<dyn Store>) {
    let ttl = ms(150);
    for round in 0..4 {
        let name = format!("job-{round}");
        let lock = granted(store.try_lock(&name, "a", ttl).await);
        if round % 2 == 1 {
            assert!(
                lock.renew(ttl).await.unwrap(),
                "rule: renew answers true for its own live grant; round {round}: saw false, \
                 expected true"
            );
        }
        let valid_until = lock.valid_until();
        let give_up = Instant::now() + clock().lease_end(ttl) + Duration::from_secs(2);
        let taken_at = loop {
            assert!(
                Instant::now() < give_up,
                "rule: after the TTL another owner gets the name; round {round}: not granted"
            );
            let got = store.try_lock(&name, "b", ttl).await.unwrap();
            let answered = Instant::now();
            if let Some(taken) = got {
                assert!(
                    taken.release().await.unwrap(),
                    "rule: release answers true for its own live grant; round {round}: saw false, \
                     expected true"
                );
                break answered;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        assert!(
            valid_until <= taken_at,
            "rule: valid_until is the send time plus the lease left; round {round}: another \
             owner was granted the name {:?} before the holder's valid_until",
            valid_until - taken_at
        );
    }
}
