//! The behavioural contract of alkstore, for every engine: the in-tree SQLite
//! and PostgreSQL engines and any third-party one.
//!
//! Each case is a plain `async fn` taking a fresh, isolated, empty store
//! ([`cases`]). The [`contract_tests!`] macro turns every case into one `#[test]`
//! of the calling crate, so an engine author wires up an engine in a few lines
//! and sees each case pass or fail by name:
//!
//! ```
//! use std::sync::Arc;
//! use alkstore_contract_suite::{contract_tests, Fresh};
//!
//! /// A fresh, isolated store; `None` skips (say why on stderr first).
//! async fn fresh() -> Option<Fresh> {
//!     # struct Unused;
//!     # let store: Option<Arc<dyn alkstore_core::Store>> = None;
//!     // let store = Arc::new(MyStore::connect(...).await.unwrap());
//!     // Some(Fresh::new(store).with_cleanup(async move { /* drop what it made */ }))
//!     store.map(Fresh::new)
//! }
//!
//! contract_tests!(fresh);
//! # fn main() {}
//! ```

pub mod cases;
mod fresh;
pub mod load;
pub mod safety;
pub mod support;

pub use fresh::{Fresh, Stores, run, run_with_peers};

/// Expands to one `#[test]` per contract case, each running the case against
/// a store made by `$fresh` (an `async fn() -> Option<Fresh>`).
///
/// The calling crate needs no tokio dependency: each test builds its own
/// multi-threaded runtime.
#[macro_export]
macro_rules! contract_tests {
    ($fresh:path) => {
        $crate::contract_tests!(@cases $fresh;
            exclusion_two_owners,
            exclusion_many_contenders,
            reacquire_same_owner_keeps_grant,
            handles_of_one_grant_are_one_grant,
            expiry_lets_another_owner_in,
            renew_is_a_full_window_from_now,
            renew_false_after_takeover,
            renew_false_after_lapse,
            renew_duration_guard,
            release_live_grant,
            release_own_stale_row,
            release_false_after_takeover,
            release_false_second_time,
            handle_never_touches_later_grant,
            fences_strictly_increase,
            validation_rejects_bad_names,
            validation_rejects_bad_owners,
            duration_guard_on_acquire,
            sub_millisecond_ttl_rounds_up,
            closed_store_fails_closed,
            calls_racing_close_finish_or_fail_closed,
            lock_times_out_with_none,
            lock_woken_by_release,
            lock_granted_after_expiry,
            holder_reports_live_holder,
            purge_removes_only_expired_rows,
            keepalive_holds_past_ttl,
            keepalive_signals_revoked,
            keepalive_signals_lost_before_valid_until,
            safety_many_holders_one_name,
            per_holder_owners_count_exactly,
            cancellation_leaves_no_trace,
            model_based_sequences,
            bad_input_is_refused_and_writes_nothing;
            peers: fences_in_commit_order_across_stores,
            renew_false_ends_valid_until
        );
    };
    (@cases $fresh:path; $($case:ident),* $(,)?; peers: $($peer_case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::run($fresh, $crate::cases::$case);
            }
        )*
        $(
            #[test]
            fn $peer_case() {
                $crate::run_with_peers($fresh, $crate::cases::$peer_case);
            }
        )*
    };
}
