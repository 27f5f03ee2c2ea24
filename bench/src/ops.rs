//! The alkstore operations both engines are timed on, one place for both.

use std::time::Duration;

use alkstore_core::Store;

use crate::measure::timed;

const TTL: Duration = Duration::from_secs(60);

/// Name the refusal figures contend on; its holder must be someone else.
pub const HELD: &str = "held";

/// The lease of [`HELD`]'s holder: longer than a whole bench run, so that
/// the refusals measured last are still refusals.
pub const HELD_TTL: Duration = Duration::from_secs(3600);

/// try_lock + release of a free name.
pub async fn cycle(store: &dyn Store, iterations: u32) -> Duration {
    timed!(iterations, {
        let lock = store.try_lock("cycle", "me", TTL).await.unwrap().unwrap();
        lock.release().await.unwrap();
    })
}

/// try_lock of [`HELD`], refused.
pub async fn refused(store: &dyn Store, iterations: u32) -> Duration {
    timed!(iterations, {
        assert!(store.try_lock(HELD, "other", TTL).await.unwrap().is_none());
    })
}
