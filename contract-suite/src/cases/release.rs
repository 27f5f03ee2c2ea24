//! Releasing a grant, and grant identity.

use std::sync::Arc;
use std::time::Duration;

use alkstore_core::Store;

use crate::support::{granted, outlive};

const LONG: Duration = Duration::from_secs(30);

/// Releasing a live grant: `true`, and the name is free at once.
pub async fn release_live_grant(store: Arc<dyn Store>) {
    let a = granted(store.try_lock("job", "a", LONG).await);
    assert!(a.release().await.unwrap());
    assert!(store.holder("job").await.unwrap().is_none());
    let b = granted(store.try_lock("job", "b", LONG).await);
    assert!(b.release().await.unwrap());
}

/// Releasing the holder's own expired row that nobody took over: `true`, and
/// the row is gone (nothing left to purge).
pub async fn release_own_stale_row(store: Arc<dyn Store>) {
    let ttl = Duration::from_millis(150);
    let a = granted(store.try_lock("job", "a", ttl).await);
    outlive(ttl).await;
    assert!(a.release().await.unwrap());
    assert_eq!(store.purge_expired().await.unwrap(), 0);
}

/// Releasing after another owner took over: `false`, and the new grant stays.
pub async fn release_false_after_takeover(store: Arc<dyn Store>) {
    let ttl = Duration::from_millis(150);
    let a = granted(store.try_lock("job", "a", ttl).await);
    outlive(ttl).await;
    let b = granted(store.try_lock("job", "b", LONG).await);
    assert!(!a.release().await.unwrap());
    let holder = store.holder("job").await.unwrap().unwrap();
    assert_eq!((holder.owner.as_str(), holder.fence), ("b", b.fence()));
    assert!(b.release().await.unwrap());
}

/// A grant released once is gone: a second handle on the same grant (the same
/// owner's re-acquire) gets `false`.
pub async fn release_false_second_time(store: Arc<dyn Store>) {
    let first = granted(store.try_lock("job", "a", LONG).await);
    let second = granted(store.try_lock("job", "a", LONG).await);
    assert_eq!(first.fence(), second.fence());
    assert!(first.release().await.unwrap());
    assert!(!second.release().await.unwrap());
}

/// A handle never renews or releases a later grant, even one made to the
/// same owner string.
pub async fn handle_never_touches_later_grant(store: Arc<dyn Store>) {
    let ttl = Duration::from_millis(150);
    let old = granted(store.try_lock("job", "a", ttl).await);
    outlive(ttl).await;
    let new = granted(store.try_lock("job", "a", LONG).await);
    assert!(new.fence() > old.fence());
    assert!(!old.renew(LONG).await.unwrap());
    assert!(!old.release().await.unwrap());
    let holder = store.holder("job").await.unwrap().unwrap();
    assert_eq!((holder.owner.as_str(), holder.fence), ("a", new.fence()));
    assert!(holder.expires_in > Duration::from_secs(20));
    assert!(new.release().await.unwrap());
}
