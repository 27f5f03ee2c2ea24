//! The closed-store posture.

use std::sync::Arc;
use std::time::Duration;

use alkstore_core::Store;

use crate::support::{assert_closed, granted};

/// After `close`, every operation fails closed, on the store and on handles
/// taken before; closing again is fine.
pub async fn closed_store_fails_closed(store: Arc<dyn Store>) {
    let ttl = Duration::from_secs(30);
    let held = granted(store.try_lock("job", "a", ttl).await);
    let other = granted(store.try_lock("job-2", "a", ttl).await);
    store.close().await.unwrap();
    assert_closed(store.try_lock("job", "a", ttl).await);
    assert_closed(store.try_lock("free", "b", ttl).await);
    assert_closed(store.lock("free", "b", ttl, Duration::from_secs(1)).await);
    assert_closed(store.holder("job").await);
    assert_closed(store.purge_expired().await);
    assert_closed(held.renew(ttl).await);
    assert_closed(held.release().await);
    assert_closed(other.release().await);
    store.close().await.unwrap();
}
