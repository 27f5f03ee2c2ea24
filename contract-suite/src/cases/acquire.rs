//! Exclusion, same-owner re-acquire and expiry.

use std::sync::Arc;
use std::time::{Duration, Instant};

use alkstore_core::Store;
use tokio::sync::Barrier;

use crate::clock::{clock, ms};
use crate::support::{granted, outlive, refused};

const LONG: Duration = Duration::from_secs(30);

/// Two owners on one free name: the first wins, the second gets `Ok(None)`.
pub async fn exclusion_two_owners(store: Arc<dyn Store>) {
    let a = granted(store.try_lock("job", "a", LONG).await);
    assert_eq!(
        (a.name(), a.owner()),
        ("job", "a"),
        "rule: a grant is (name, owner, fence) as asked; the handle names another"
    );
    refused(store.try_lock("job", "b", LONG).await);
    // Another name is independent.
    let other = granted(store.try_lock("other-job", "b", LONG).await);
    assert!(
        other.release().await.unwrap(),
        "rule: release answers true for its own live grant; saw false for \"other-job\", expected true"
    );
    assert!(
        a.release().await.unwrap(),
        "rule: release answers true for its own live grant; saw false for \"job\", expected true"
    );
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
        assert_eq!(
            grants.len(),
            1,
            "rule: of many contenders for a free name exactly one wins; round {round}: {grants:?}"
        );
        let holder = store.holder(&name).await.unwrap().unwrap();
        assert_eq!(
            holder.owner,
            grants[0].owner(),
            "rule: holder reports the live holder; round {round}: the owner is not the winner's"
        );
        assert_eq!(
            holder.fence,
            grants[0].fence(),
            "rule: holder reports the live holder; round {round}: the fence is not the winner's"
        );
    }
}

/// The same owner again while its row is live: granted, same fence, expiry
/// not refreshed.
pub async fn reacquire_same_owner_keeps_grant(store: Arc<dyn Store>) {
    let first = granted(store.try_lock("job", "a", Duration::from_secs(2)).await);
    let second = granted(store.try_lock("job", "a", Duration::from_secs(600)).await);
    assert_eq!(
        second.fence(),
        first.fence(),
        "rule: the same owner again while its lease is live gets the same grant, same fence"
    );
    let holder = store.holder("job").await.unwrap().unwrap();
    assert!(
        holder.expires_in <= Duration::from_secs(2),
        "rule: a same-owner re-acquire does not refresh the expiry; saw {holder:?} after asking \
         for 600 s, expected at most 2 s left"
    );
    // The second handle's deadline is what is left of the first lease.
    assert!(
        second.valid_until() <= Instant::now() + Duration::from_secs(2),
        "rule: a re-acquired handle's valid_until is what is left of the original lease; saw it \
         {:?} from now, expected at most 2 s",
        second
            .valid_until()
            .saturating_duration_since(Instant::now())
    );
    assert!(
        second.valid_until() > Instant::now(),
        "rule: a re-acquired handle's valid_until is what is left of the live lease; saw it \
         passed {:?} ago, expected it ahead",
        Instant::now().saturating_duration_since(second.valid_until())
    );
    // Another owner is still refused.
    refused(store.try_lock("job", "b", LONG).await);
    assert!(
        first.release().await.unwrap(),
        "rule: release answers true for its own live grant; saw false, expected true"
    );
    assert!(
        !second.release().await.unwrap(),
        "rule: release answers true only when it deleted the grant's row; the second handle's \
         release after the first saw true, expected false"
    );
}

/// After the TTL another owner acquires, with a higher fence.
pub async fn expiry_lets_another_owner_in(store: Arc<dyn Store>) {
    let ttl = ms(200);
    let a = granted(store.try_lock("job", "a", ttl).await);
    refused(store.try_lock("job", "b", LONG).await);
    outlive(ttl).await;
    assert!(
        Instant::now() > a.valid_until(),
        "rule: valid_until never outlasts the lease; saw it {:?} ahead after the ttl passed, \
         expected it passed",
        a.valid_until().saturating_duration_since(Instant::now())
    );
    let b = granted(store.try_lock("job", "b", LONG).await);
    assert!(
        b.fence() > a.fence(),
        "rule: a takeover carries a higher fence; saw fence {} after {}, expected it higher",
        b.fence(),
        a.fence()
    );
    assert_eq!(
        store.holder("job").await.unwrap().unwrap().owner,
        "b",
        "rule: after the TTL another owner gets the name; holder reports someone else"
    );
    assert!(
        b.release().await.unwrap(),
        "rule: release answers true for its own live grant; saw false, expected true"
    );
}

/// Two handles of one grant (the same owner string asked twice): they are
/// one grant. A renewal through one moves the other's `valid_until` too
/// (never later than the server's expiry); releasing one leaves the other's
/// `renew` and `release` answering `false`, and a `renew` that answers
/// `false` leaves `valid_until` no later than the moment it was sent.
pub async fn handles_of_one_grant_are_one_grant(store: Arc<dyn Store>) {
    let a = granted(store.try_lock("job", "a", Duration::from_secs(30)).await);
    let b = granted(store.try_lock("job", "a", Duration::from_secs(30)).await);
    assert_eq!(
        a.fence(),
        b.fence(),
        "rule: the same owner again gets the same grant, same fence"
    );
    let renewed = Instant::now();
    assert!(
        b.renew(ms(1000)).await.unwrap(),
        "rule: renew answers true for its own live grant; saw false, expected true"
    );
    let server = Instant::now() + store.holder("job").await.unwrap().unwrap().expires_in;
    // The server's lease runs on its wall clock, this side on a monotonic
    // one: a virtual machine's clock being stepped by a few milliseconds
    // between the two statements must not read as a longer promise (the
    // rule's violation is the old 30 s lease, not milliseconds). An
    // engine that reports whole seconds rounds down: a second more.
    assert!(
        a.valid_until() <= server + Duration::from_millis(50) + clock().end_slack(),
        "rule: handles of one grant are one grant: a renewal through one moves the other's \
         valid_until, never past the server's lease; saw the other handle's end {:?} after the \
         renewal was sent (the old, longer lease), expected no later than the server's {:?} \
         (+50 ms)",
        a.valid_until() - renewed,
        server.saturating_duration_since(renewed)
    );
    assert!(
        b.release().await.unwrap(),
        "rule: release answers true for its own live grant; saw false, expected true"
    );
    assert!(
        a.valid_until() <= Instant::now(),
        "rule: releasing one handle of a grant ends its twin's valid_until; saw the twin still \
         promising {:?}, expected it ended",
        a.valid_until().saturating_duration_since(Instant::now())
    );
    assert!(
        !a.renew(Duration::from_secs(30)).await.unwrap(),
        "rule: renew answers false once its grant was released through a twin handle; saw true, \
         expected false"
    );
    assert!(
        a.valid_until() <= Instant::now(),
        "rule: a renew answering false ends valid_until; saw it {:?} ahead after the lost \
         renewal, expected it passed",
        a.valid_until().saturating_duration_since(Instant::now())
    );
    assert!(
        !a.release().await.unwrap(),
        "rule: release answers true only when it deleted the grant's row; its twin released it \
         already, saw true, expected false"
    );
}
