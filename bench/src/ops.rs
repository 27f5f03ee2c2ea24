//! The alkstore operations both engines are timed on, one place for both.

use std::sync::Arc;
use std::time::{Duration, Instant};

use alkstore_core::{Lock, Store};

use crate::measure::timed;

const TTL: Duration = Duration::from_secs(60);

/// Name the refusal figures contend on; its holder must be someone else.
pub const HELD: &str = "held";

/// The lease of [`HELD`]'s holder: longer than a whole bench run, so that
/// the refusals measured last are still refusals.
pub const HELD_TTL: Duration = Duration::from_secs(3600);

/// One try_lock + release of a free name.
pub async fn one_cycle(store: &dyn Store) {
    let lock = store.try_lock("cycle", "me", TTL).await.unwrap().unwrap();
    lock.release().await.unwrap();
}

/// One try_lock of [`HELD`], refused.
pub async fn one_refusal(store: &dyn Store) {
    assert!(store.try_lock(HELD, "other", TTL).await.unwrap().is_none());
}

/// One renewal of [`HELD`]'s holder, for another [`HELD_TTL`].
pub async fn one_renewal(held: &dyn Lock) {
    assert!(held.renew(HELD_TTL).await.unwrap());
}

/// One look at [`HELD`]'s holder.
pub async fn one_holder(store: &dyn Store) {
    assert!(store.holder(HELD).await.unwrap().is_some());
}

/// try_lock + release of a free name.
pub async fn cycle(store: &dyn Store, iterations: u32) -> Duration {
    timed!(iterations, { one_cycle(store).await })
}

/// try_lock of [`HELD`], refused.
pub async fn refused(store: &dyn Store, iterations: u32) -> Duration {
    timed!(iterations, { one_refusal(store).await })
}

/// Handoffs timed per kind (same store, another store).
const HANDOFFS: usize = 60;

/// Release on `holder` → grant on `waiter`, `HANDOFFS` times: the waiter
/// waits from 20 to 69 ms before the release (so it is at every phase of its
/// back-off), and the time from the release's start to its grant is one sample.
pub async fn handoffs(
    holder: &Arc<dyn Store>,
    waiter: &Arc<dyn Store>,
    tag: &str,
) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(HANDOFFS);
    for i in 0..HANDOFFS {
        let name = format!("handoff-{tag}-{i}");
        let lock = holder.try_lock(&name, "a", TTL).await.unwrap().unwrap();
        let (waiter, wait_name) = (waiter.clone(), name.clone());
        let waiting = tokio::spawn(async move {
            let lock = waiter
                .lock(&wait_name, "b", TTL, Duration::from_secs(5))
                .await
                .unwrap()
                .expect("granted after the release");
            let granted = Instant::now();
            lock.release().await.unwrap();
            granted
        });
        tokio::time::sleep(Duration::from_millis(20 + (i as u64 * 7) % 50)).await;
        let released = Instant::now();
        assert!(lock.release().await.unwrap());
        samples.push(waiting.await.unwrap() - released);
    }
    samples
}
