//! The operator's view: listing live holders, releasing a stuck lock by force.

use std::sync::Arc;
use std::time::Duration;

use alkstore_core::{Error, Field, KeepAlive, Listed, LostReason, MAX_LIST_LIMIT, Store};

use crate::clock::{clock, ms};
use crate::support::{granted, outlive};

const LONG: Duration = Duration::from_secs(30);

/// The names of a page, in its order.
fn names(page: &[Listed]) -> Vec<&str> {
    page.iter().map(|l| l.name.as_str()).collect()
}

/// `list` shows live holders only, by name prefix (wildcards of SQL `LIKE`
/// are plain characters), in byte order of their names, in pages that
/// continue after the last name of the previous one; bad arguments are
/// refused before storage is touched.
pub async fn list_pages_live_holders_by_prefix(store: Arc<dyn Store>) {
    let short = ms(150);
    let expired = granted(store.try_lock("jobs/old", "x", short).await);
    outlive(short).await;
    // Byte order: "B" (0x42) < "a" (0x61) < "z" < "é" (0xC3 0xA9).
    let mut held = Vec::new();
    for (name, owner) in [
        ("jobs/é", "e"),
        ("jobs/a", "a"),
        ("jobs/z", "z"),
        ("jobs/B", "b"),
        ("jobs%x", "p"),
        ("jobs_x", "u"),
        ("other", "o"),
    ] {
        held.push(granted(store.try_lock(name, owner, LONG).await));
    }

    let first = store.list("jobs/", None, 2).await.unwrap();
    assert_eq!(
        names(&first),
        ["jobs/B", "jobs/a"],
        "rule: list pages live holders by prefix in byte order of names; saw the first page \
         {first:?}"
    );
    let second = store.list("jobs/", Some("jobs/a"), 2).await.unwrap();
    assert_eq!(
        names(&second),
        ["jobs/z", "jobs/é"],
        "rule: the next page starts after the last name of the previous one; saw {second:?}"
    );
    let third = store.list("jobs/", Some("jobs/é"), 2).await.unwrap();
    assert!(
        third.is_empty(),
        "rule: list shows live holders only (jobs/old expired); saw {third:?}, expected nothing"
    );
    let z = &second[0];
    assert_eq!(
        (z.holder.owner.as_str(), z.holder.fence),
        ("z", held[2].fence()),
        "rule: list reports each holder's owner and fence; saw {z:?}"
    );
    assert!(
        z.holder.expires_in <= LONG && z.holder.expires_in > LONG - Duration::from_secs(10),
        "rule: list reports the time left of the lease; saw {:?} of a {LONG:?} lease",
        z.holder.expires_in
    );

    let literal = store.list("jobs%", None, 10).await.unwrap();
    assert_eq!(
        names(&literal),
        ["jobs%x"],
        "rule: a prefix is matched literally (`%` is no wildcard); saw {literal:?}"
    );
    let literal = store.list("jobs_", None, 10).await.unwrap();
    assert_eq!(
        names(&literal),
        ["jobs_x"],
        "rule: a prefix is matched literally (`_` is no wildcard); saw {literal:?}"
    );
    let all = store.list("", None, MAX_LIST_LIMIT).await.unwrap();
    assert_eq!(
        names(&all),
        [
            "jobs%x", "jobs/B", "jobs/a", "jobs/z", "jobs/é", "jobs_x", "other"
        ],
        "rule: the empty prefix lists every live holder, in byte order; saw {all:?}"
    );

    for limit in [0, MAX_LIST_LIMIT + 1] {
        let refused = store.list("", None, limit).await;
        assert!(
            matches!(refused, Err(Error::InvalidLimit { .. })),
            "rule: a page size outside 1..={MAX_LIST_LIMIT} is refused; saw {refused:?} for \
             {limit}"
        );
    }
    let refused = store.list("jobs\n", None, 10).await;
    assert!(
        matches!(
            refused,
            Err(Error::InvalidName {
                field: Field::Prefix,
                ..
            })
        ),
        "rule: a prefix with a control character is refused; saw {refused:?}"
    );
    let refused = store.list("", Some(""), 10).await;
    assert!(
        matches!(refused, Err(Error::InvalidName { .. })),
        "rule: an empty name to start after is refused; saw {refused:?}"
    );

    assert_eq!(
        expired.release().await.unwrap(),
        !clock().removes_lapsed,
        "rule: release deletes the holder's own expired row and answers true (false where the \
         engine removed the lapsed grant itself)"
    );
    for lock in held {
        assert!(lock.release().await.unwrap());
    }
}

/// A forced release removes the live grant whoever holds it and answers it;
/// the old handle's `renew` and `release` then answer `false`, its
/// keep-alive reports the lease revoked, and the next grant has a higher
/// fence. A free name, or an expired row, answers `None` (the expired row
/// is left for `purge_expired`). `force_release_grant` removes only the
/// live grant of the fence it is given.
pub async fn force_release_ends_the_grant(store: Arc<dyn Store>) {
    let stuck = granted(store.try_lock("stuck", "a", LONG).await);
    let stuck_fence = stuck.fence();
    let removed = store.force_release("stuck").await.unwrap();
    let removed = removed.expect(
        "rule: force_release answers the live holder it removed; saw None, expected a's grant",
    );
    assert_eq!(
        (removed.owner.as_str(), removed.fence),
        ("a", stuck.fence()),
        "rule: force_release answers the holder it removed; saw {removed:?}"
    );
    let seen = store.holder("stuck").await.unwrap();
    assert!(
        seen.is_none(),
        "rule: a name released by force is free at once; saw {seen:?}, expected None"
    );
    assert!(
        !stuck.renew(LONG).await.unwrap(),
        "rule: after a forced release the old handle's renew answers false; saw true"
    );
    let next = granted(store.try_lock("stuck", "b", LONG).await);
    assert!(
        next.fence() > stuck.fence(),
        "rule: the grant after a forced release has a higher fence; saw {} after {}",
        next.fence(),
        stuck.fence()
    );
    assert!(
        !stuck.release().await.unwrap(),
        "rule: after a forced release the old handle's release answers false; saw true"
    );
    assert_eq!(
        store.holder("stuck").await.unwrap().map(|h| h.fence),
        Some(next.fence()),
        "rule: the old handle's release leaves the next grant alone"
    );

    // A keep-alive hears of it at its next renewal.
    let kept_ttl = ms(600);
    let kept = KeepAlive::start(
        granted(store.try_lock("kept2", "k", kept_ttl).await),
        kept_ttl,
    )
    .unwrap();
    assert!(store.force_release("kept2").await.unwrap().is_some());
    assert_eq!(
        kept.lost().await,
        LostReason::Revoked,
        "rule: a keep-alive reports a lease released by force as revoked"
    );

    let free = store.force_release("never-held").await.unwrap();
    assert!(
        free.is_none(),
        "rule: force_release of a free name answers None; saw {free:?}"
    );
    let short = ms(150);
    let lapsed = granted(store.try_lock("lapsed", "c", short).await);
    outlive(short).await;
    let seen = store.force_release("lapsed").await.unwrap();
    assert!(
        seen.is_none(),
        "rule: force_release of an expired row answers None (nobody held it); saw {seen:?}"
    );
    assert_eq!(
        lapsed.release().await.unwrap(),
        !clock().removes_lapsed,
        "rule: force_release leaves an expired row for purging (unless the engine removes \
         lapsed grants itself); its own holder's release found it otherwise"
    );
    assert!(matches!(
        store.force_release("alkstore.x").await,
        Err(Error::ReservedName { .. })
    ));
    assert!(matches!(
        store.force_release_grant("alkstore.x", 1).await,
        Err(Error::ReservedName { .. })
    ));

    // The grant an operator confirmed, and no other: `next` holds "stuck".
    let other = store
        .force_release_grant("stuck", stuck_fence)
        .await
        .unwrap();
    assert!(
        other.is_none(),
        "rule: force_release_grant of a fence that no longer holds the name answers None; \
         saw {other:?}"
    );
    assert_eq!(
        store.holder("stuck").await.unwrap().map(|h| h.fence),
        Some(next.fence()),
        "rule: force_release_grant leaves another grant of the name alone"
    );
    let confirmed = store
        .force_release_grant("stuck", next.fence())
        .await
        .unwrap()
        .map(|h| (h.owner, h.fence));
    assert_eq!(
        confirmed,
        Some(("b".to_owned(), next.fence())),
        "rule: force_release_grant removes the live grant of its fence and answers it"
    );
    assert!(store.holder("stuck").await.unwrap().is_none());
    assert!(!next.release().await.unwrap());
}
