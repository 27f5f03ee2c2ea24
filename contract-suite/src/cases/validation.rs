//! Names, owners and durations refused before any round trip.

use std::sync::Arc;
use std::time::Duration;

use alkstore_core::{DurationError, Error, Field, NameProblem, Store};

use crate::support::{assert_duration_error, granted};

const TTL: Duration = Duration::from_secs(30);

/// Each kind of bad name, with the problem it must be reported as.
fn bad_names() -> Vec<(String, NameProblem)> {
    vec![
        (String::new(), NameProblem::Empty),
        ("   \u{a0}".into(), NameProblem::WhitespaceOnly),
        ("tab\there".into(), NameProblem::ControlCharacter { at: 3 }),
        ("nul\0byte".into(), NameProblem::ControlCharacter { at: 3 }),
        (
            "line\nbreak".into(),
            NameProblem::ControlCharacter { at: 4 },
        ),
        ("x".repeat(256), NameProblem::TooLong { len: 256, max: 255 }),
    ]
}

#[track_caller]
fn assert_invalid<T: std::fmt::Debug>(
    result: alkstore_core::Result<T>,
    field: Field,
    problem: NameProblem,
) {
    match result {
        Err(Error::InvalidName {
            field: f,
            problem: p,
        }) => assert_eq!(
            (f, p),
            (field, problem),
            "rule: a bad name or owner is InvalidName with its field and problem"
        ),
        other => panic!(
            "rule: bad names and owners are refused as InvalidName before storage; saw {other:?}, \
             expected InvalidName {field:?} {problem:?}"
        ),
    }
}

/// Bad and reserved names get the right error from every entry point, and
/// nothing is written.
pub async fn validation_rejects_bad_names(store: Arc<dyn Store>) {
    for (name, problem) in bad_names() {
        assert_invalid(store.try_lock(&name, "a", TTL).await, Field::Name, problem);
        assert_invalid(
            store.lock(&name, "a", TTL, Duration::ZERO).await,
            Field::Name,
            problem,
        );
        assert_invalid(store.holder(&name).await, Field::Name, problem);
    }
    for reserved in ["alkstore.leader", "alkstore."] {
        for result in [
            store.try_lock(reserved, "a", TTL).await.map(|_| ()),
            store
                .lock(reserved, "a", TTL, Duration::ZERO)
                .await
                .map(|_| ()),
            store.holder(reserved).await.map(|_| ()),
        ] {
            assert!(
                matches!(&result, Err(Error::ReservedName { name, field: alkstore_core::Field::Name }) if name == reserved),
                "rule: names starting with alkstore. are reserved; saw {result:?} for \
                 {reserved:?}, expected ReservedName"
            );
        }
    }
    // The longest valid name and the prefix without its dot are fine.
    let longest = "x".repeat(255);
    let seen = store.holder(&longest).await.unwrap();
    assert!(
        seen.is_none(),
        "rule: a refused call leaves nothing behind; saw {seen:?} holding the longest valid \
         name, expected None"
    );
    granted(store.try_lock(&longest, "a", TTL).await)
        .release()
        .await
        .unwrap();
    granted(store.try_lock("alkstore", "a", TTL).await)
        .release()
        .await
        .unwrap();
    assert_eq!(
        store.purge_expired().await.unwrap(),
        0,
        "rule: a refused call leaves nothing behind; a purge found rows"
    );
}

/// Bad owners are refused as owners, and leave the name free.
pub async fn validation_rejects_bad_owners(store: Arc<dyn Store>) {
    for (owner, problem) in bad_names() {
        assert_invalid(
            store.try_lock("job", &owner, TTL).await,
            Field::Owner,
            problem,
        );
        assert_invalid(
            store.lock("job", &owner, TTL, Duration::ZERO).await,
            Field::Owner,
            problem,
        );
    }
    let seen = store.holder("job").await.unwrap();
    assert!(
        seen.is_none(),
        "rule: a refused call leaves nothing behind; saw {seen:?} holding job after bad owners \
         were refused, expected None"
    );
    // Owners have no reserved prefix.
    granted(store.try_lock("job", "alkstore.owner", TTL).await)
        .release()
        .await
        .unwrap();
}

/// Zero and overflowing ttls are refused by `try_lock` and `lock`, leaving the name free.
pub async fn duration_guard_on_acquire(store: Arc<dyn Store>) {
    assert_duration_error(
        store.try_lock("job", "a", Duration::ZERO).await,
        DurationError::Zero,
    );
    assert_duration_error(
        store.try_lock("job", "a", Duration::MAX).await,
        DurationError::TooLarge,
    );
    assert_duration_error(
        store.lock("job", "a", Duration::ZERO, Duration::ZERO).await,
        DurationError::Zero,
    );
    assert_duration_error(
        store
            .lock("job", "a", Duration::MAX, Duration::from_secs(1))
            .await,
        DurationError::TooLarge,
    );
    let seen = store.holder("job").await.unwrap();
    assert!(
        seen.is_none(),
        "rule: a refused lease leaves nothing behind; saw {seen:?}, expected None"
    );
    // A huge but representable lease is fine.
    let year = Duration::from_secs(365 * 24 * 3600);
    let lock = granted(store.try_lock("job", "a", year).await);
    let holder = store.holder("job").await.unwrap().unwrap();
    assert!(
        holder.expires_in > year - Duration::from_secs(60),
        "rule: a huge but representable lease is granted in full; saw {holder:?}, expected \
         over {:?} left",
        year - Duration::from_secs(60)
    );
    assert!(
        lock.release().await.unwrap(),
        "rule: release answers true for its own live grant; saw false, expected true"
    );
}

/// A ttl under a millisecond rounds up to one millisecond (never down to zero).
pub async fn sub_millisecond_ttl_rounds_up(store: Arc<dyn Store>) {
    let lock = granted(store.try_lock("job", "a", Duration::from_nanos(1)).await);
    // A 1 ms lease (the engine's shortest, on a coarser lease clock):
    // certainly over by now, so another owner gets in.
    let over =
        crate::clock::clock().lease_end(Duration::from_millis(1)) + Duration::from_millis(30);
    tokio::time::sleep(over).await;
    let b = granted(store.try_lock("job", "b", TTL).await);
    assert!(
        b.fence() > lock.fence(),
        "rule: a ttl under a millisecond rounds up to 1 ms, and a takeover carries a higher \
         fence; saw fence {} after {}, expected it higher",
        b.fence(),
        lock.fence()
    );
    // A renew under a millisecond is a 1 ms lease too, not a refused zero.
    assert!(
        b.renew(Duration::from_nanos(999_999)).await.unwrap(),
        "rule: a renew under a millisecond is a 1 ms lease, not a refused zero; saw false, \
         expected true"
    );
    tokio::time::sleep(over).await;
    let seen = store.holder("job").await.unwrap();
    assert!(
        seen.is_none(),
        "rule: a renew under a millisecond is a 1 ms lease, and holder reports only a live \
         holder; saw {seen:?} {over:?} on, expected None"
    );
    assert_eq!(
        b.release().await.unwrap(),
        !crate::clock::clock().removes_lapsed,
        "rule: release deletes the holder's own expired row and answers true (false where the \
         engine removed the lapsed grant itself)"
    );
}

/// A sub-millisecond ttl of a permit, a reader or a writer is a 1 ms
/// lease too, not a refused zero: each is granted, and lapses for another
/// owner to take its place with a higher fence.
pub async fn sub_millisecond_ttl_rounds_up_for_every_kind(store: Arc<dyn Store>) {
    let tiny = Duration::from_nanos(999_999);
    let over =
        crate::clock::clock().lease_end(Duration::from_millis(1)) + Duration::from_millis(30);
    for kind in ["permit", "reader", "writer"] {
        let name = format!("tiny-{kind}");
        let first = match kind {
            "permit" => store.try_acquire_permit(&name, 1, "a", tiny).await,
            "reader" => store.try_read_lock(&name, "a", tiny).await,
            _ => store.try_write_lock(&name, "a", tiny).await,
        };
        let first = match first {
            Ok(Some(lock)) => lock,
            other => panic!(
                "rule: a {kind}'s ttl under a millisecond rounds up to 1 ms, not down to a \
                 refused zero; saw {other:?}, expected a grant"
            ),
        };
        tokio::time::sleep(over).await;
        let next = match kind {
            "permit" => store.try_acquire_permit(&name, 1, "b", TTL).await,
            // A writer after a reader or a writer: it waits for neither.
            _ => store.try_write_lock(&name, "b", TTL).await,
        };
        let next = granted(next);
        assert!(
            next.fence() > first.fence(),
            "rule: a {kind}'s 1 ms lease lapses and the next grant carries a higher fence; saw \
             fence {} after {}",
            next.fence(),
            first.fence()
        );
        assert!(next.release().await.unwrap());
        first.let_lapse();
    }
}

/// `waiters` validates the name as every call does (empty, a control
/// character, the reserved namespace: refused before storage), and fails
/// closed once the store is closed.
pub async fn waiters_validates_and_fails_closed(store: Arc<dyn Store>) {
    for (bad, reserved) in [("", false), ("bad\n", false), ("alkstore.x", true)] {
        let answer = store.waiters(bad).await;
        let refused = matches!(
            (&answer, reserved),
            (Err(Error::ReservedName { .. }), true) | (Err(Error::InvalidName { .. }), false)
        );
        assert!(
            refused,
            "rule: waiters refuses a bad name as every call does; waiters({bad:?}) answered \
             {answer:?}"
        );
    }
    store.close().await.unwrap();
    crate::support::assert_closed(store.waiters("job").await);
}

/// The name limit counts bytes, not characters: 64 four-byte characters
/// (256 bytes) are refused before storage, 63 (252 bytes) are a name the
/// engine keeps whole.
pub async fn name_limit_counts_bytes(store: Arc<dyn Store>) {
    let clef = '\u{1D11E}'; // 𝄞, four bytes in UTF-8
    let too_long: String = std::iter::repeat_n(clef, 64).collect();
    assert_invalid(
        store.try_lock(&too_long, "a", TTL).await,
        Field::Name,
        NameProblem::TooLong { len: 256, max: 255 },
    );
    let longest: String = std::iter::repeat_n(clef, 63).collect();
    let lock = granted(store.try_lock(&longest, "a", TTL).await);
    assert_eq!(
        lock.name(),
        longest,
        "rule: a name of 252 bytes is accepted whole"
    );
    let listed = store.list(&longest, None, 10).await.unwrap();
    assert_eq!(
        listed.iter().map(|l| l.name.as_str()).collect::<Vec<_>>(),
        [longest.as_str()],
        "rule: the engine keeps a 252-byte name whole; saw it listed as {listed:?}"
    );
    assert!(
        store.holder(&longest).await.unwrap().is_some(),
        "rule: the engine keeps a 252-byte name whole; saw no holder of it"
    );
    assert!(lock.release().await.unwrap());
}
