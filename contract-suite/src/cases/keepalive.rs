//! The keep-alive helper over a real engine.

use std::sync::Arc;
use std::time::{Duration, Instant};

use alkstore_core::{KeepAlive, LeaseStatus, LostReason, Store};

use crate::support::granted;

/// A kept lease outlives several TTLs, same grant, and releases cleanly.
/// (A 1 s lease: shorter ones can really be lost on a loaded machine, where
/// one renewal may take longer than the keep-alive's margin.)
pub async fn keepalive_holds_past_ttl(store: Arc<dyn Store>) {
    let ttl = Duration::from_secs(1);
    let lock = granted(store.try_lock("kept", "a", ttl).await);
    let fence = lock.fence();
    let kept = KeepAlive::start(lock, ttl).unwrap();
    tokio::time::sleep(ttl * 3).await;
    assert!(
        matches!(kept.status(), LeaseStatus::Held { .. }),
        "{:?}",
        kept.status()
    );
    let holder = store.holder("kept").await.unwrap().expect("still held");
    assert_eq!((holder.owner.as_str(), holder.fence), ("a", fence));
    assert!(store.try_lock("kept", "b", ttl).await.unwrap().is_none());
    assert!(kept.release().await.unwrap());
    assert!(store.holder("kept").await.unwrap().is_none());
}

/// When the grant is taken away (released through another handle of the same
/// grant), the next renewal reports `Revoked` while the old deadline is still ahead.
pub async fn keepalive_signals_revoked(store: Arc<dyn Store>) {
    let ttl = Duration::from_secs(3);
    let lock = granted(store.try_lock("kept", "a", ttl).await);
    let twin = granted(store.try_lock("kept", "a", ttl).await);
    let deadline = lock.valid_until();
    let kept = KeepAlive::start(lock, ttl).unwrap();
    assert!(twin.release().await.unwrap());
    assert_eq!(kept.lost().await, LostReason::Revoked);
    assert!(Instant::now() < deadline, "told after the lease ended");
}

/// When renewals keep failing (the store closed under it), the holder is
/// told before `valid_until` passes.
pub async fn keepalive_signals_lost_before_valid_until(store: Arc<dyn Store>) {
    let ttl = Duration::from_millis(600);
    let lock = granted(store.try_lock("kept", "a", ttl).await);
    let deadline = lock.valid_until();
    let kept = KeepAlive::start(lock, ttl).unwrap();
    store.close().await.unwrap();
    let reason = kept.lost().await;
    assert!(Instant::now() < deadline, "told after the lease ended");
    match reason {
        LostReason::NotRenewedInTime {
            last_error: Some(error),
        } => {
            assert!(error.contains("closed"), "{error}")
        }
        other => panic!("expected NotRenewedInTime, got {other:?}"),
    }
}
