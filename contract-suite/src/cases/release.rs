//! Releasing a grant, and grant identity.

use std::sync::Arc;
use std::time::Duration;

use alkstore_core::Store;

use crate::clock::{clock, ms};
use crate::support::{granted, outlive, refused};

const LONG: Duration = Duration::from_secs(30);

/// Releasing a live grant: `true`, and the name is free at once.
pub async fn release_live_grant(store: Arc<dyn Store>) {
    let a = granted(store.try_lock("job", "a", LONG).await);
    assert!(
        a.release().await.unwrap(),
        "rule: release answers true for its own live grant; saw false, expected true"
    );
    let seen = store.holder("job").await.unwrap();
    assert!(
        seen.is_none(),
        "rule: a released name is free at once; saw {seen:?}, expected None"
    );
    let b = granted(store.try_lock("job", "b", LONG).await);
    assert!(
        b.release().await.unwrap(),
        "rule: release answers true for its own live grant; saw false, expected true"
    );
}

/// Releasing the holder's own expired row that nobody took over: `true`, and
/// the row is gone (nothing left to purge).
pub async fn release_own_stale_row(store: Arc<dyn Store>) {
    let ttl = ms(150);
    let a = granted(store.try_lock("job", "a", ttl).await);
    outlive(ttl).await;
    assert_eq!(
        a.release().await.unwrap(),
        !clock().removes_lapsed,
        "rule: release deletes the holder's own expired row and answers true (false where the \
         engine removed the lapsed grant itself)"
    );
    assert_eq!(
        store.purge_expired().await.unwrap(),
        0,
        "rule: release deletes the holder's own expired row; a purge still found it"
    );
}

/// Releasing after another owner took over: `false`, and the new grant stays.
pub async fn release_false_after_takeover(store: Arc<dyn Store>) {
    let ttl = ms(150);
    let a = granted(store.try_lock("job", "a", ttl).await);
    outlive(ttl).await;
    let b = granted(store.try_lock("job", "b", LONG).await);
    assert!(
        !a.release().await.unwrap(),
        "rule: release answers false after a takeover; saw true, expected false"
    );
    let holder = store.holder("job").await.unwrap().unwrap();
    assert_eq!(
        (holder.owner.as_str(), holder.fence),
        ("b", b.fence()),
        "rule: release acts on exactly its grant: the new holder keeps the name"
    );
    assert!(
        b.release().await.unwrap(),
        "rule: release answers true for its own live grant; saw false, expected true"
    );
}

/// A grant released once is gone: a second handle on the same grant (the same
/// owner's re-acquire) gets `false`.
pub async fn release_false_second_time(store: Arc<dyn Store>) {
    let first = granted(store.try_lock("job", "a", LONG).await);
    let second = granted(store.try_lock("job", "a", LONG).await);
    assert_eq!(
        first.fence(),
        second.fence(),
        "rule: the same owner again gets the same grant, same fence"
    );
    assert!(
        first.release().await.unwrap(),
        "rule: release answers true for its own live grant; saw false, expected true"
    );
    assert!(
        !second.release().await.unwrap(),
        "rule: release answers true only when it deleted the grant's row; the second handle of \
         a grant released once saw true, expected false"
    );
}

/// A handle never renews or releases a later grant, even one made to the
/// same owner string.
pub async fn handle_never_touches_later_grant(store: Arc<dyn Store>) {
    let ttl = ms(150);
    let old = granted(store.try_lock("job", "a", ttl).await);
    outlive(ttl).await;
    let new = granted(store.try_lock("job", "a", LONG).await);
    assert!(
        new.fence() > old.fence(),
        "rule: a takeover carries a higher fence; saw fence {} after {}, expected it higher",
        new.fence(),
        old.fence()
    );
    assert!(
        !old.renew(LONG).await.unwrap(),
        "rule: renew acts on exactly its grant, never a later one of the same owner; saw true, \
         expected false"
    );
    assert!(
        !old.release().await.unwrap(),
        "rule: release acts on exactly its grant, never a later one of the same owner; saw \
         true, expected false"
    );
    let holder = store.holder("job").await.unwrap().unwrap();
    assert_eq!(
        (holder.owner.as_str(), holder.fence),
        ("a", new.fence()),
        "rule: the old handle's renew and release leave the later grant"
    );
    assert!(
        holder.expires_in > Duration::from_secs(20),
        "rule: renew acts on exactly its grant: the later grant's lease is untouched; saw \
         {holder:?}, expected over 20 s left"
    );
    assert!(
        new.release().await.unwrap(),
        "rule: release answers true for its own live grant; saw false, expected true"
    );
}

/// Dropping a live handle without `release` does nothing to storage: the
/// grant stays — its holder and fence, others refused, its owner given it
/// back — until its lease lapses; for a lock, a permit and a reader alike.
/// (A release spawned from `Drop` could land after the same owner asked
/// again and delete that grant.) Such a release lands within milliseconds:
/// the case looks 200 ms after the drops.
pub async fn dropping_a_handle_leaves_its_grant(store: Arc<dyn Store>) {
    let lock = granted(store.try_lock("dropped", "a", LONG).await);
    let permit = granted(store.try_acquire_permit("dropped-pool", 1, "p", LONG).await);
    let reader = granted(store.try_read_lock("dropped-rw", "r", LONG).await);
    let fences = [lock.fence(), permit.fence(), reader.fence()];
    drop(lock);
    drop(permit);
    drop(reader);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let holder = store.holder("dropped").await.unwrap();
    assert_eq!(
        holder.map(|h| (h.owner, h.fence)),
        Some(("a".to_owned(), fences[0])),
        "rule: dropping a handle does nothing to storage; the lock's grant is gone"
    );
    refused(store.try_lock("dropped", "b", LONG).await);
    refused(store.try_acquire_permit("dropped-pool", 1, "q", LONG).await);
    refused(store.try_write_lock("dropped-rw", "w", LONG).await);
    let again = [
        granted(store.try_lock("dropped", "a", LONG).await),
        granted(store.try_acquire_permit("dropped-pool", 1, "p", LONG).await),
        granted(store.try_read_lock("dropped-rw", "r", LONG).await),
    ];
    for (lock, fence) in again.into_iter().zip(fences) {
        assert_eq!(
            lock.fence(),
            fence,
            "rule: dropping a handle does nothing to storage; {}'s owner was not given its \
             grant back",
            lock.name()
        );
        assert!(lock.release().await.unwrap());
    }
}
