//! `holder` and `purge_expired`.

use std::sync::Arc;
use std::time::Duration;

use alkstore_core::Store;

use crate::clock::{ms, purgeable};
use crate::support::{granted, outlive};

/// `holder` names the live holder with its fence and remaining lease, and
/// nothing once the lease lapsed or was released.
pub async fn holder_reports_live_holder(store: Arc<dyn Store>) {
    let seen = store.holder("job").await.unwrap();
    assert!(
        seen.is_none(),
        "rule: holder reports only a live holder; saw {seen:?} for a name never acquired, \
         expected None"
    );
    let ttl = ms(400);
    let lock = granted(store.try_lock("job", "a", ttl).await);
    let holder = store.holder("job").await.unwrap().unwrap();
    assert_eq!(
        (holder.owner.as_str(), holder.fence),
        ("a", lock.fence()),
        "rule: holder reports the live holder's owner and fence"
    );
    assert!(
        holder.expires_in <= ttl && holder.expires_in > Duration::ZERO,
        "rule: holder reports the lease time left; saw {holder:?}, expected expires_in above \
         zero and at most {ttl:?}"
    );
    outlive(ttl).await;
    let seen = store.holder("job").await.unwrap();
    assert!(
        seen.is_none(),
        "rule: holder reports None once the lease lapsed; saw {seen:?} after the {ttl:?} \
         lease, expected None"
    );
    let again = granted(store.try_lock("job", "b", Duration::from_secs(30)).await);
    assert!(
        again.release().await.unwrap(),
        "rule: release answers true for its own live grant; saw false, expected true"
    );
    let seen = store.holder("job").await.unwrap();
    assert!(
        seen.is_none(),
        "rule: holder reports None once the lease was released; saw {seen:?}, expected None"
    );
}

/// `purge_expired` deletes expired rows only, and counts them.
pub async fn purge_removes_only_expired_rows(store: Arc<dyn Store>) {
    // Long enough that the first purge, two calls later, finds them live
    // even on a loaded machine.
    let short = ms(500);
    let stale: Vec<_> = ["s1", "s2", "s3"]
        .iter()
        .map(|name| store.try_lock(name, "a", short))
        .collect();
    let mut stale_locks = Vec::new();
    for attempt in stale {
        stale_locks.push(granted(attempt.await));
    }
    let live = granted(store.try_lock("live", "a", Duration::from_secs(30)).await);
    assert_eq!(
        store.purge_expired().await.unwrap(),
        0,
        "rule: purge deletes expired rows only; it purged live rows"
    );
    outlive(short).await;
    assert_eq!(
        store.purge_expired().await.unwrap(),
        purgeable(3),
        "rule: purge deletes the expired rows and says how many; three had lapsed"
    );
    assert_eq!(
        store.purge_expired().await.unwrap(),
        0,
        "rule: purge deletes every expired row and says how many; a second purge found more"
    );
    assert_eq!(
        store.holder("live").await.unwrap().unwrap().fence,
        live.fence(),
        "rule: purge deletes expired rows only; the live grant must stay"
    );
    // A purged grant's release finds nothing.
    for lock in stale_locks {
        assert!(
            !lock.release().await.unwrap(),
            "rule: release answers false once its row was purged; saw true, expected false"
        );
    }
    assert!(
        live.release().await.unwrap(),
        "rule: release answers true for its own live grant; saw false, expected true"
    );
}

/// `holder`'s `expires_in` is the lease time *left*, not the ttl: 400 ms
/// into a 1 s lease, at most 600 ms are left (and some are).
pub async fn holder_reports_time_left_not_the_ttl(store: Arc<dyn Store>) {
    let ttl = ms(1000);
    let lock = granted(store.try_lock("job", "a", ttl).await);
    let waited = ms(400);
    tokio::time::sleep(waited).await;
    let holder = store.holder("job").await.unwrap().unwrap();
    assert!(
        holder.expires_in <= ttl - waited,
        "rule: holder reports the lease time left; saw {:?} left {waited:?} into a {ttl:?} lease \
         (expected at most {:?})",
        holder.expires_in,
        ttl - waited
    );
    assert!(
        holder.expires_in >= ms(100),
        "rule: holder reports the lease time left; saw {:?}, expected at least {:?} of the \
         {:?} left",
        holder.expires_in,
        ms(100),
        ttl - waited
    );
    assert!(
        lock.release().await.unwrap(),
        "rule: release answers true for its own live grant; saw false, expected true"
    );
}

/// Expiry is silent: an expired row stays until its name is acquired again,
/// its own release, or `purge_expired` — acquiring, reading and renewing
/// *other* names sweeps nothing. The stale holder's release of its own row
/// still answers `true`, and a purge counts it.
pub async fn expired_rows_stay_until_purged(store: Arc<dyn Store>) {
    let short = ms(100);
    let stale = granted(store.try_lock("stale", "a", short).await);
    let counted = granted(store.try_lock("counted", "a", short).await);
    outlive(short).await;
    let other = granted(store.try_lock("other", "b", Duration::from_secs(30)).await);
    assert!(
        other.renew(Duration::from_secs(30)).await.unwrap(),
        "rule: renew answers true for its own live grant; saw false, expected true"
    );
    assert!(
        store.holder("other").await.unwrap().is_some(),
        "rule: holder reports the live holder; saw None for \"other\", expected b's grant"
    );
    let seen = store.holder("stale").await.unwrap();
    assert!(
        seen.is_none(),
        "rule: holder reports only a live holder; saw {seen:?} for the lapsed \"stale\", \
         expected None"
    );
    assert!(
        stale.release().await.unwrap(),
        "rule: an expired row stays until reacquired, released or purged; \
         its own release found it gone"
    );
    assert_eq!(
        store.purge_expired().await.unwrap(),
        1,
        "rule: an expired row stays until purged; purge found a different count"
    );
    assert!(
        !counted.release().await.unwrap(),
        "rule: release answers false once its row was purged; saw true, expected false"
    );
    assert!(
        other.release().await.unwrap(),
        "rule: release answers true for its own live grant; saw false, expected true"
    );
}
