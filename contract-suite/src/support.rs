//! Assertions the cases share, public for engine-specific tests too.

use std::time::Duration;

use alkstore_core::{Closed, DurationError, Error, Lock, Result};

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
