//! How an engine's leases keep time, and the durations the cases use,
//! scaled to it.
//!
//! The SQL engines keep leases in milliseconds on the server's clock, and
//! the cases are written for that: leases of 100–600 ms, waits past their
//! end of a few tens of milliseconds. An engine whose leases are coarser
//! (etcd's are whole seconds, and a lapsed one is removed up to half a
//! second late) declares its [`LeaseClock`] in its fixture
//! ([`Fresh::with_lease_clock`](crate::Fresh::with_lease_clock)), and
//! every short duration a case uses ([`ms`]) is scaled by
//! [`LeaseClock::scale`], every wait past a lease's end ([`outlive`](crate::support::outlive))
//! rounded up to the granularity and the lag. The cases' reasoning holds
//! unchanged, at the engine's pace; on a millisecond clock nothing
//! changes.

use std::sync::OnceLock;
use std::time::Duration;

/// How an engine's leases keep time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseClock {
    /// A lease lasts a whole number of these, the ttl asked rounded up:
    /// 1 ms for the SQL engines, 1 s for etcd.
    pub granularity: Duration,
    /// The shortest lease the engine grants (a shorter ttl is raised to it).
    pub minimum: Duration,
    /// How long after its end a lapsed lease may still be seen live (etcd
    /// looks for lapsed leases every 500 ms).
    pub expiry_lag: Duration,
    /// The engine removes a lapsed grant by itself (etcd's lease end
    /// deletes its key), so [`purge_expired`](alkstore_core::Store::purge_expired)
    /// finds nothing to purge; otherwise a lapsed grant stays until its
    /// name is granted again, its own release, or a purge.
    pub removes_lapsed: bool,
    /// How long a waiter's ticket lasts from its last attempt: the core's
    /// [`TICKET_LEASE`](alkstore_core::TICKET_LEASE) where the engine's
    /// leases can be that short (etcd's tickets last 2 s at least,
    /// `alkstore_etcd::SHORTEST_TICKET_LEASE`). It bounds how long a dead
    /// waiter keeps its place.
    pub ticket_lease: Duration,
}

impl LeaseClock {
    /// Leases to the millisecond, seen gone when they end: the SQL engines
    /// and the reference engine.
    pub const MILLISECONDS: LeaseClock = LeaseClock {
        granularity: Duration::from_millis(1),
        minimum: Duration::from_millis(1),
        expiry_lag: Duration::ZERO,
        removes_lapsed: false,
        ticket_lease: alkstore_core::TICKET_LEASE,
    };

    /// What the cases' short durations are multiplied by: 1 for a clock of
    /// at most 100 ms granularity; otherwise the granularity over 100 ms,
    /// rounded up (10 for whole seconds), so that the cases' shortest
    /// leases (100–150 ms) become at least one granule.
    pub fn scale(&self) -> u32 {
        let granule = self.granularity.as_millis();
        u32::try_from(granule.div_ceil(100))
            .unwrap_or(u32::MAX)
            .max(1)
    }

    /// The latest a lease of `ttl` granted now can still be seen live:
    /// `ttl` rounded up to the granularity, at least the minimum, plus the
    /// lag.
    pub fn lease_end(&self, ttl: Duration) -> Duration {
        let granule = self.granularity.as_nanos().max(1);
        let rounded = ttl.as_nanos().div_ceil(granule) * granule;
        let rounded = Duration::from_nanos(u64::try_from(rounded).unwrap_or(u64::MAX));
        rounded.max(self.minimum) + self.expiry_lag
    }

    /// How much later than a holder's reported time left its lease may be
    /// seen to end: a granule (an engine that reports whole granules
    /// rounds down) and the lag; nothing on a millisecond clock.
    pub fn end_slack(&self) -> Duration {
        match *self == LeaseClock::MILLISECONDS {
            true => Duration::ZERO,
            false => self.granularity + self.expiry_lag,
        }
    }
}

static CLOCK: OnceLock<LeaseClock> = OnceLock::new();

/// Declares the lease clock of this test process's engine.
///
/// # Panics
/// When another clock was declared before: one engine per test process.
pub(crate) fn declare(clock: LeaseClock) {
    let declared = *CLOCK.get_or_init(|| clock);
    assert_eq!(
        declared, clock,
        "one lease clock per test process: {declared:?} was declared before {clock:?}"
    );
}

/// The lease clock of this test process's engine ([`LeaseClock::MILLISECONDS`]
/// unless its fixture declared another).
pub fn clock() -> LeaseClock {
    CLOCK.get().copied().unwrap_or(LeaseClock::MILLISECONDS)
}

/// What a purge finds of `lapsed` grants that lapsed and were not
/// touched since: all of them, or none where the engine removes lapsed
/// grants by itself ([`LeaseClock::removes_lapsed`]).
pub fn purgeable(lapsed: u64) -> u64 {
    match clock().removes_lapsed {
        true => 0,
        false => lapsed,
    }
}

/// `n` milliseconds on a millisecond clock, scaled by the engine's
/// [`LeaseClock::scale`]: a case's short lease, or a wait or margin tied
/// to one.
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n) * clock().scale()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_millisecond_clock_changes_nothing() {
        let clock = LeaseClock::MILLISECONDS;
        assert_eq!(clock.scale(), 1);
        assert_eq!(
            clock.lease_end(Duration::from_millis(150)),
            Duration::from_millis(150)
        );
        assert_eq!(clock.end_slack(), Duration::ZERO);
    }

    #[test]
    fn a_seconds_clock_scales_by_ten_and_rounds_leases_up() {
        let clock = LeaseClock {
            granularity: Duration::from_secs(1),
            minimum: Duration::from_secs(2),
            expiry_lag: Duration::from_millis(500),
            removes_lapsed: true,
            ticket_lease: Duration::from_secs(2),
        };
        assert_eq!(clock.scale(), 10);
        assert_eq!(
            clock.lease_end(Duration::from_millis(1500)),
            Duration::from_millis(2500)
        );
        assert_eq!(
            clock.lease_end(Duration::from_millis(2100)),
            Duration::from_millis(3500)
        );
        assert_eq!(
            clock.lease_end(Duration::from_millis(100)),
            Duration::from_millis(2500)
        );
    }
}
