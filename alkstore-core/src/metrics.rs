//! Counters and histograms through the `metrics` facade (feature `metrics`,
//! off by default; without it every function here is empty and compiles
//! away). Labels are bounded: the engine's name, the operation and the
//! outcome — never a lock name or an owner. docs/metrics.md lists them.

/// Acquires by outcome: `alkstore_acquire_total{engine, operation, outcome}`,
/// `operation` `try_lock`, `lock`, `try_acquire_permit`, `acquire_permit`,
/// `try_read_lock`, `read_lock`, `try_write_lock` or `write_lock`,
/// `outcome` `granted`, `held` or `error`.
pub(crate) const ACQUIRE_TOTAL: &str = "alkstore_acquire_total";
/// How long `lock` waited, granted or not, in seconds:
/// `alkstore_lock_wait_seconds{engine, outcome}`.
pub(crate) const LOCK_WAIT_SECONDS: &str = "alkstore_lock_wait_seconds";
/// From a release waking a waiting `lock` in this process to that waiter's
/// grant, in seconds: `alkstore_handoff_seconds{engine}`.
pub(crate) const HANDOFF_SECONDS: &str = "alkstore_handoff_seconds";
/// Attempts of a waiting `lock` that found the name held:
/// `alkstore_lock_refused_attempts_total{engine}` (with the grants counted
/// by [`ACQUIRE_TOTAL`], the attempts per grant under contention).
pub(crate) const LOCK_REFUSED_ATTEMPTS_TOTAL: &str = "alkstore_lock_refused_attempts_total";
/// Renewals by outcome: `alkstore_renew_total{engine, outcome}`, `outcome`
/// `renewed`, `lost` or `error`.
pub(crate) const RENEW_TOTAL: &str = "alkstore_renew_total";
/// Releases by outcome: `alkstore_release_total{engine, outcome}`, `outcome`
/// `released`, `lost` or `error`.
pub(crate) const RELEASE_TOTAL: &str = "alkstore_release_total";
/// Forced releases by outcome: `alkstore_force_release_total{engine,
/// outcome}`, `outcome` `removed`, `free`, `not_that_grant`, `other_kind`
/// or `error`.
pub(crate) const FORCE_RELEASE_TOTAL: &str = "alkstore_force_release_total";
/// Leases a keep-alive lost: `alkstore_keepalive_lost_total{reason}`,
/// `reason` `revoked` or `not_renewed_in_time`.
pub(crate) const KEEPALIVE_LOST_TOTAL: &str = "alkstore_keepalive_lost_total";

/// Counts one event of `name` with its labels.
#[cfg(feature = "metrics")]
pub(crate) fn count(name: &'static str, labels: &[(&'static str, &'static str)]) {
    let labels: Vec<metrics::Label> = labels
        .iter()
        .map(|(key, value)| metrics::Label::from_static_parts(key, value))
        .collect();
    metrics::counter!(name, labels).increment(1);
}

/// Records `seconds` in the histogram `name` with its labels.
#[cfg(feature = "metrics")]
pub(crate) fn observe(
    name: &'static str,
    labels: &[(&'static str, &'static str)],
    seconds: std::time::Duration,
) {
    let labels: Vec<metrics::Label> = labels
        .iter()
        .map(|(key, value)| metrics::Label::from_static_parts(key, value))
        .collect();
    metrics::histogram!(name, labels).record(seconds.as_secs_f64());
}

/// Without the `metrics` feature: nothing.
#[cfg(not(feature = "metrics"))]
pub(crate) fn count(_: &'static str, _: &[(&'static str, &'static str)]) {}

/// Without the `metrics` feature: nothing.
#[cfg(not(feature = "metrics"))]
pub(crate) fn observe(_: &'static str, _: &[(&'static str, &'static str)], _: std::time::Duration) {
}

/// The outcome label of a call answering a bool, or failing.
pub(crate) fn outcome<E>(
    result: &Result<bool, E>,
    yes: &'static str,
    no: &'static str,
) -> &'static str {
    match result {
        Ok(true) => yes,
        Ok(false) => no,
        Err(_) => "error",
    }
}
