//! The closed-store posture.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use alkstore_core::Store;

use crate::support::{assert_closed, granted, refused};

/// After `close`, every operation fails closed — the operator's `list` and
/// forced releases too — on the store and on handles taken before; closing
/// again is fine.
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
    assert_closed(store.list("", None, 10).await);
    assert_closed(store.force_release("job").await);
    assert_closed(store.force_release_grant("job", held.fence()).await);
    assert_closed(store.raise_fences(alkstore_core::MIN_FENCE_RAISE).await);
    assert_closed(held.renew(ttl).await);
    assert_closed(held.release().await);
    assert_closed(other.release().await);
    store.close().await.unwrap();
}

/// Calls in flight when the store closes either finish with their real
/// outcome or fail closed — never with another error (a driver's "pool
/// closed"), never a hang — and a waiting `lock` is woken to fail closed.
pub async fn calls_racing_close_finish_or_fail_closed(store: Arc<dyn Store>) {
    let ttl = Duration::from_secs(30);
    let cycles = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..16)
        .map(|i| {
            let (store, cycles) = (store.clone(), cycles.clone());
            tokio::spawn(async move {
                let name = format!("racing-close-{i}");
                loop {
                    // Each worker has a name of its own: never refused.
                    let lock = match store.try_lock(&name, "a", ttl).await {
                        Ok(lock) => lock.expect("a name of its own is free"),
                        Err(error) => return error,
                    };
                    if let Err(error) = lock.release().await {
                        return error;
                    }
                    cycles.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let held = granted(store.try_lock("held", "a", ttl).await);
    // The waiter has something to wait for (checked here, not left to the
    // race between the waiter's first try and close).
    refused(store.try_lock("held", "b", ttl).await);
    let waiter = {
        let store = store.clone();
        tokio::spawn(async move { store.lock("held", "b", ttl, Duration::from_secs(60)).await })
    };
    // Close while every worker is mid-cycle: after each did a few.
    let waiting_since = std::time::Instant::now();
    while cycles.load(Ordering::Relaxed) < 16 * 3 {
        assert!(
            waiting_since.elapsed() < Duration::from_secs(30),
            "the workers made no progress before close"
        );
        tokio::task::yield_now().await;
    }
    store.close().await.unwrap();
    for worker in workers {
        let error = tokio::time::timeout(Duration::from_secs(10), worker)
            .await
            .expect(
                "rule: calls in flight when the store closes finish or fail closed, never hang; \
                 saw a worker's call unanswered 10 s after close",
            )
            .unwrap();
        assert!(
            error.is_closed(),
            "rule: calls racing close finish with their real outcome or fail with Closed; saw \
             {error:?}, expected Closed"
        );
    }
    let waited = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect(
            "rule: a waiting lock is woken by close and fails with Closed; saw it still waiting \
             10 s after close",
        )
        .unwrap();
    assert_closed(waited);
    assert_closed(held.release().await);
}
