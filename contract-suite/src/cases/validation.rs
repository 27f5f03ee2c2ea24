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
        }) => assert_eq!((f, p), (field, problem)),
        other => panic!("expected InvalidName {field:?} {problem:?}, got {other:?}"),
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
                "{result:?}"
            );
        }
    }
    // The longest valid name and the prefix without its dot are fine.
    let longest = "x".repeat(255);
    assert!(
        store.holder(&longest).await.unwrap().is_none(),
        "a refused call left a row"
    );
    granted(store.try_lock(&longest, "a", TTL).await)
        .release()
        .await
        .unwrap();
    granted(store.try_lock("alkstore", "a", TTL).await)
        .release()
        .await
        .unwrap();
    assert_eq!(store.purge_expired().await.unwrap(), 0);
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
    assert!(
        store.holder("job").await.unwrap().is_none(),
        "a refused call left a row"
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
    assert!(store.holder("job").await.unwrap().is_none());
    // A huge but representable lease is fine.
    let year = Duration::from_secs(365 * 24 * 3600);
    let lock = granted(store.try_lock("job", "a", year).await);
    assert!(
        store.holder("job").await.unwrap().unwrap().expires_in > year - Duration::from_secs(60)
    );
    assert!(lock.release().await.unwrap());
}

/// A ttl under a millisecond rounds up to one millisecond (never down to zero).
pub async fn sub_millisecond_ttl_rounds_up(store: Arc<dyn Store>) {
    let lock = granted(store.try_lock("job", "a", Duration::from_nanos(1)).await);
    // A 1 ms lease: certainly over by now, so another owner gets in.
    tokio::time::sleep(Duration::from_millis(30)).await;
    let b = granted(store.try_lock("job", "b", TTL).await);
    assert!(b.fence() > lock.fence());
    // A renew under a millisecond is a 1 ms lease too, not a refused zero.
    assert!(b.renew(Duration::from_nanos(999_999)).await.unwrap());
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert!(store.holder("job").await.unwrap().is_none());
    assert!(b.release().await.unwrap());
}
