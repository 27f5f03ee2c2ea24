//! Fencing tokens over a long history of one name.

use std::sync::Arc;
use std::time::Duration;

use alkstore_core::Store;

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
            "step {step}: fence {} after {last}",
            lock.fence()
        );
        last = lock.fence();
        let again = granted(store.try_lock("fenced", owner, long).await);
        assert_eq!(
            again.fence(),
            last,
            "step {step}: re-acquire changed the fence"
        );
        drop(again);
        match step % 4 {
            // Lapse, then the next step takes it over (sometimes after a purge).
            0 => {
                outlive(short).await;
                if step % 8 == 0 {
                    assert_eq!(store.purge_expired().await.unwrap(), 1);
                }
                drop(lock);
            }
            _ => assert!(lock.release().await.unwrap()),
        }
    }
}
