//! Exclusion, same-owner re-acquire and expiry.

use std::sync::Arc;
use std::time::{Duration, Instant};

use alkstore_core::Store;
use tokio::sync::Barrier;

use crate::support::{granted, outlive, refused};

const LONG: Duration = Duration::from_secs(30);

/// Two owners on one free name: the first wins, the second gets `Ok(None)`.
pub async fn exclusion_two_owners(store: Arc<dyn Store>) {
    let a = granted(store.try_lock("job", "a", LONG).await);
    assert_eq!((a.name(), a.owner()), ("job", "a"));
    refused(store.try_lock("job", "b", LONG).await);
    // Another name is independent.
    let other = granted(store.try_lock("other-job", "b", LONG).await);
    assert!(other.release().await.unwrap());
    assert!(a.release().await.unwrap());
}

/// Many concurrent contenders for one free name: exactly one grant.
pub async fn exclusion_many_contenders(store: Arc<dyn Store>) {
    const CONTENDERS: usize = 16;
    for round in 0..5 {
        let name = format!("contended-{round}");
        let barrier = Arc::new(Barrier::new(CONTENDERS));
        let tasks: Vec<_> = (0..CONTENDERS)
            .map(|i| {
                let (store, barrier, name) = (store.clone(), barrier.clone(), name.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    store.try_lock(&name, &format!("owner-{i}"), LONG).await
                })
            })
            .collect();
        let mut grants = Vec::new();
        for task in tasks {
            if let Some(lock) = task.await.unwrap().unwrap() {
                grants.push(lock);
            }
        }
        assert_eq!(grants.len(), 1, "round {round}: {grants:?}");
        let holder = store.holder(&name).await.unwrap().unwrap();
        assert_eq!(holder.owner, grants[0].owner());
        assert_eq!(holder.fence, grants[0].fence());
    }
}

/// The same owner again while its row is live: granted, same fence, expiry
/// not refreshed.
pub async fn reacquire_same_owner_keeps_grant(store: Arc<dyn Store>) {
    let first = granted(store.try_lock("job", "a", Duration::from_secs(2)).await);
    let second = granted(store.try_lock("job", "a", Duration::from_secs(600)).await);
    assert_eq!(second.fence(), first.fence());
    let holder = store.holder("job").await.unwrap().unwrap();
    assert!(
        holder.expires_in <= Duration::from_secs(2),
        "expiry refreshed: {holder:?}"
    );
    // The second handle's deadline is what is left of the first lease.
    assert!(second.valid_until() <= Instant::now() + Duration::from_secs(2));
    assert!(second.valid_until() > Instant::now());
    // Another owner is still refused.
    refused(store.try_lock("job", "b", LONG).await);
    assert!(first.release().await.unwrap());
    assert!(!second.release().await.unwrap());
}

/// After the TTL another owner acquires, with a higher fence.
pub async fn expiry_lets_another_owner_in(store: Arc<dyn Store>) {
    let ttl = Duration::from_millis(200);
    let a = granted(store.try_lock("job", "a", ttl).await);
    refused(store.try_lock("job", "b", LONG).await);
    outlive(ttl).await;
    assert!(Instant::now() > a.valid_until());
    let b = granted(store.try_lock("job", "b", LONG).await);
    assert!(b.fence() > a.fence(), "{} !> {}", b.fence(), a.fence());
    assert_eq!(store.holder("job").await.unwrap().unwrap().owner, "b");
    assert!(b.release().await.unwrap());
}

/// Two handles of one grant (the same owner string asked twice): they are
/// one grant. A renewal through one moves the other's `valid_until` too
/// (never later than the server's expiry); releasing one leaves the other's
/// `renew` and `release` answering `false`, and a `renew` that answers
/// `false` leaves `valid_until` no later than the moment it was sent.
pub async fn handles_of_one_grant_are_one_grant(store: Arc<dyn Store>) {
    let a = granted(store.try_lock("job", "a", Duration::from_secs(30)).await);
    let b = granted(store.try_lock("job", "a", Duration::from_secs(30)).await);
    assert_eq!(a.fence(), b.fence());
    let renewed = Instant::now();
    assert!(b.renew(Duration::from_secs(1)).await.unwrap());
    let server = Instant::now() + store.holder("job").await.unwrap().unwrap().expires_in;
    // The server's lease runs on its wall clock, this side on a monotonic
    // one: a virtual machine's clock being stepped by a few milliseconds
    // between the two statements must not read as a longer promise (the
    // rule's violation is the old 30 s lease, not milliseconds).
    assert!(
        a.valid_until() <= server + Duration::from_millis(50),
        "the other handle still promises the old, longer lease: it ends {:?} after the \
         renewal was sent, the server's {:?} after",
        a.valid_until() - renewed,
        server.saturating_duration_since(renewed)
    );
    assert!(b.release().await.unwrap());
    assert!(
        a.valid_until() <= Instant::now(),
        "the other handle still promises a lease its twin released"
    );
    assert!(!a.renew(Duration::from_secs(30)).await.unwrap());
    assert!(
        a.valid_until() <= Instant::now(),
        "valid_until left in the future after a lost renewal"
    );
    assert!(!a.release().await.unwrap());
}
