//! The local deadline of a lease, kept conservative through the engines' rounding.

use std::time::{Duration, Instant};

/// Engines keep their clocks in whole milliseconds, truncated: the stored
/// expiry can fall up to this much before `send time + lease`.
pub const CLOCK_ROUNDING_MARGIN: Duration = Duration::from_millis(1);

/// The local instant before which a lease is certainly still valid.
///
/// `sent` is when the request left this process (taken before the request
/// was sent), `left` the lease time the engine reported remaining when it
/// handled the request. The engine's clock read happens after `sent`, so
/// `sent + left` could only be late by the engine's rounding, which is taken off.
///
/// ```
/// use std::time::{Duration, Instant};
/// use alkstore_core::clock::valid_until;
/// let sent = Instant::now();
/// assert_eq!(valid_until(sent, Duration::from_millis(500)), sent + Duration::from_millis(499));
/// assert_eq!(valid_until(sent, Duration::ZERO), sent);
/// ```
pub fn valid_until(sent: Instant, left: Duration) -> Instant {
    sent + left.saturating_sub(CLOCK_ROUNDING_MARGIN)
}

/// Milliseconds since the Unix epoch on this host's system clock, truncated.
///
/// The clock authority of engines whose clients all share one host (SQLite).
/// A system clock set before 1970 reads as 0.
pub fn system_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_millis_reads_the_system_clock() {
        let before = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let read = system_millis();
        let after = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        assert!(
            (before..=after).contains(&read),
            "{before} ≤ {read} ≤ {after}"
        );
    }
}
