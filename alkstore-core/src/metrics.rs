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
/// Where a waiting call stood when it first queued, on an engine that
/// queues: `alkstore_queue_position{engine}` (the live tickets ahead of
/// it; a histogram of counts, not seconds).
pub(crate) const QUEUE_POSITION: &str = "alkstore_queue_position";
/// How long a queued waiting call waited from its first attempt to its
/// grant, by where it first stood: `alkstore_queued_wait_seconds{engine,
/// position}`, `position` `0`, `1`, `2-3`, `4-7` or `8+`.
pub(crate) const QUEUED_WAIT_SECONDS: &str = "alkstore_queued_wait_seconds";
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

/// Records `value` in the histogram `name` with its labels.
#[cfg(feature = "metrics")]
pub(crate) fn observe_value(
    name: &'static str,
    labels: &[(&'static str, &'static str)],
    value: f64,
) {
    let labels: Vec<metrics::Label> = labels
        .iter()
        .map(|(key, value)| metrics::Label::from_static_parts(key, value))
        .collect();
    metrics::histogram!(name, labels).record(value);
}

/// Without the `metrics` feature: nothing.
#[cfg(not(feature = "metrics"))]
pub(crate) fn observe_value(_: &'static str, _: &[(&'static str, &'static str)], _: f64) {}

/// The bounded label of a place in a queue.
pub(crate) fn position_label(position: u32) -> &'static str {
    match position {
        0 => "0",
        1 => "1",
        2..=3 => "2-3",
        4..=7 => "4-7",
        _ => "8+",
    }
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
