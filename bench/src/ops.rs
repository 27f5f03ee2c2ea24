//! The alkstore operations both engines are timed on, one place for both.

use std::time::Duration;

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
