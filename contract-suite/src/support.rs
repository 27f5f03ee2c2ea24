//! Assertions the cases share, public for engine-specific tests too.

use std::time::Duration;

use alkstore_core::{Closed, DurationError, Error, Lock, Result, Store};

/// Asserts `result` is `Error::Database` with a [`DurationError`] in its chain.
#[track_caller]
pub fn assert_duration_error<T: std::fmt::Debug>(result: Result<T>, expected: DurationError) {
    match result {
        Err(err @ Error::Database { .. }) => {
            assert_eq!(
                err.find_source::<DurationError>(),
                Some(&expected),
                "{err:?}"
            );
        }
        other => panic!("expected Error::Database from {expected:?}, got {other:?}"),
    }
}

/// Asserts `result` is `Error::Database` with [`Closed`] in its chain.
#[track_caller]
pub fn assert_closed<T: std::fmt::Debug>(result: Result<T>) {
    match result {
        Err(err @ Error::Database { .. }) => {
            assert!(
                err.find_source::<Closed>().is_some(),
                "no Closed in {err:?}"
            );
        }
        other => panic!("expected Error::Database from Closed, got {other:?}"),
    }
}

/// Unwraps a grant, failing with what came back instead.
#[track_caller]
pub fn granted(result: Result<Option<Box<dyn Lock>>>) -> Box<dyn Lock> {
    match result {
        Ok(Some(lock)) => lock,
        other => panic!("expected a grant, got {other:?}"),
    }
}

/// Asserts the name was held elsewhere (`Ok(None)`).
#[track_caller]
pub fn refused(result: Result<Option<Box<dyn Lock>>>) {
    match result {
        Ok(None) => {}
        other => panic!("expected Ok(None) (held elsewhere), got {other:?}"),
    }
}

/// Sleeps past the end of a lease of `ttl` granted before this call: the full
/// ttl plus a margin for the engine's clock granularity.
pub async fn outlive(ttl: Duration) {
    tokio::time::sleep(ttl + Duration::from_millis(30)).await;
}

/// After the holder of `name` (owner `dead_owner`, grant `fence`) died
/// without releasing: its lease is still live, nobody gets the lock before the
/// lease ends, and a waiter gets it within a second after, with a higher
/// fence. Returns the lease that was left and how long the waiter waited.
pub async fn assert_dead_holder_blocks_until_ttl(
    store: &dyn Store,
    name: &str,
    dead_owner: &str,
    fence: u64,
) -> (Duration, Duration) {
    let asked = std::time::Instant::now();
    let holder = store
        .holder(name)
        .await
        .unwrap()
        .expect("the dead holder's lease is still live");
    assert_eq!((holder.owner.as_str(), holder.fence), (dead_owner, fence));
    refused(
        store
            .try_lock(name, "survivor", Duration::from_secs(5))
            .await,
    );
    let lock = granted(
        store
            .lock(
                name,
                "survivor",
                Duration::from_secs(5),
                Duration::from_secs(10),
            )
            .await,
    );
    let waited = asked.elapsed();
    assert!(
        waited >= holder.expires_in,
        "granted before the dead holder's lease ended"
    );
    assert!(
        waited < holder.expires_in + Duration::from_secs(1),
        "took too long: {waited:?}"
    );
    assert!(lock.fence() > fence);
    assert!(lock.release().await.unwrap());
    (holder.expires_in, waited)
}
