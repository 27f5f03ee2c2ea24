//! The duration guard: turns a caller's `ttl` into whole milliseconds, or refuses it.

use std::time::{Duration, Instant, SystemTime};

use crate::error::DurationError;

/// The longest lease accepted, in milliseconds: half of `i64::MAX`, so that an
/// engine can add it to a millisecond clock stored as a signed 64-bit number
/// (SQLite `INTEGER`, PostgreSQL `bigint`) without overflow for millions of years.
pub const MAX_LEASE_MILLIS: u64 = (i64::MAX / 2) as u64;

/// A lease duration that passed the guard: whole milliseconds, at least 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct LeaseMillis(u64);

impl LeaseMillis {
    /// Checks `ttl` and rounds any sub-millisecond part **up**, so the lease is
    /// never shorter than the caller asked for.
    ///
    /// Refuses zero ([`DurationError::Zero`]) and anything that cannot be added
    /// to the clocks without overflow ([`DurationError::TooLarge`]), such as
    /// `Duration::MAX`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use alkstore_core::{DurationError, LeaseMillis};
    /// assert_eq!(LeaseMillis::new(Duration::from_micros(1500)).unwrap().get(), 2);
    /// assert_eq!(LeaseMillis::new(Duration::ZERO), Err(DurationError::Zero));
    /// assert_eq!(LeaseMillis::new(Duration::MAX), Err(DurationError::TooLarge));
    /// ```
    pub fn new(ttl: Duration) -> Result<Self, DurationError> {
        if ttl.is_zero() {
            return Err(DurationError::Zero);
        }
        let whole = ttl.as_millis() + u128::from(ttl.subsec_nanos() % 1_000_000 != 0);
        let millis = u64::try_from(whole).map_err(|_| DurationError::TooLarge)?;
        if millis > MAX_LEASE_MILLIS {
            return Err(DurationError::TooLarge);
        }
        let rounded = Duration::from_millis(millis);
        // Both local clocks must be able to hold the deadline too.
        if Instant::now().checked_add(rounded).is_none()
            || SystemTime::now().checked_add(rounded).is_none()
        {
            return Err(DurationError::TooLarge);
        }
        Ok(LeaseMillis(millis))
    }

    /// The lease in whole milliseconds.
    pub fn get(self) -> u64 {
        self.0
    }

    /// The lease as a signed 64-bit number of milliseconds (always fits).
    pub fn as_i64(self) -> i64 {
        self.0 as i64
    }

    /// The lease as a `Duration`.
    pub fn as_duration(self) -> Duration {
        Duration::from_millis(self.0)
    }

    /// This lease cut to `bound` (whole milliseconds, rounded up; at least
    /// 1); unchanged when `bound` is `None` (no bound).
    ///
    /// ```
    /// use std::time::Duration;
    /// use alkstore_core::LeaseMillis;
    /// let ttl = LeaseMillis::new(Duration::from_secs(5)).unwrap();
    /// assert_eq!(ttl.at_most(Some(Duration::from_micros(2500))).get(), 3);
    /// assert_eq!(ttl.at_most(Some(Duration::ZERO)).get(), 1);
    /// assert_eq!(ttl.at_most(None), ttl);
    /// ```
    pub fn at_most(self, bound: Option<Duration>) -> LeaseMillis {
        let Some(bound) = bound else { return self };
        let whole = bound.as_millis() + u128::from(bound.subsec_nanos() % 1_000_000 != 0);
        let bound = u64::try_from(whole).unwrap_or(u64::MAX).max(1);
        LeaseMillis(self.0.min(bound))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn sql_sees_the_milliseconds() {
        let ttl = LeaseMillis::new(Duration::from_millis(1500)).unwrap();
        assert_eq!(ttl.as_i64(), 1500);
        assert_eq!(ttl.get(), 1500);
    }

    #[test]
    fn rounds_up_to_whole_milliseconds() {
        assert_eq!(LeaseMillis::new(Duration::from_nanos(1)).unwrap().get(), 1);
        assert_eq!(LeaseMillis::new(Duration::from_millis(7)).unwrap().get(), 7);
        assert_eq!(
            LeaseMillis::new(Duration::from_nanos(7_000_001))
                .unwrap()
                .get(),
            8
        );
    }

    #[test]
    fn refuses_zero_and_overflow() {
        assert_eq!(LeaseMillis::new(Duration::ZERO), Err(DurationError::Zero));
        assert_eq!(
            LeaseMillis::new(Duration::MAX),
            Err(DurationError::TooLarge)
        );
        assert_eq!(
            LeaseMillis::new(Duration::from_millis(MAX_LEASE_MILLIS + 1)),
            Err(DurationError::TooLarge)
        );
        assert!(LeaseMillis::new(Duration::from_secs(365 * 24 * 3600)).is_ok());
    }

    proptest! {
        #[test]
        fn never_panics_and_never_shortens(secs in any::<u64>(), nanos in 0u32..1_000_000_000) {
            let ttl = Duration::new(secs, nanos);
            match LeaseMillis::new(ttl) {
                Ok(lease) => {
                    prop_assert!(lease.as_duration() >= ttl);
                    prop_assert!(lease.as_duration() - ttl < Duration::from_millis(1));
                }
                Err(DurationError::Zero) => prop_assert!(ttl.is_zero()),
                Err(DurationError::TooLarge) => prop_assert!(ttl > Duration::from_millis(MAX_LEASE_MILLIS)),
            }
        }
    }
}
