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
pub mod clock;
pub mod failover;
pub mod faults;
pub mod fleet;
mod fresh;
pub mod gallery;
pub mod load;
pub mod opening;
pub mod reference;
pub mod safety;
pub mod spans;
pub mod support;

pub use clock::LeaseClock;
pub use fresh::{Fresh, Stores, run, run_case, run_with_peers, verdict};

/// Hands the list of every contract case to `$callback!`, after `$extra`:
/// the one place a case is listed (`cargo xtask tidy` checks that every case
/// is here, and named in docs/contract.md). Cases taking one store come
/// first; those taking the store and its independent peers after `peers:`.
/// A contract case's name, checked by the compiler: `case!(name)` is
/// `"name"` when `name` is a case of [`cases`], and does not compile
/// otherwise (a renamed or misspelt case breaks the build, not a run). For
/// [`Fresh::opting_out`].
///
/// ```
/// use alkstore_contract_suite::{Fresh, case};
/// # fn opt_out(fresh: Fresh) -> Fresh {
/// fresh.opting_out(case!(lock_woken_by_release), "no wake-up across stores")
/// # }
/// assert_eq!(case!(exclusion_two_owners), "exclusion_two_owners");
/// ```
///
/// ```compile_fail
/// let _ = alkstore_contract_suite::case!(no_such_case);
/// ```
#[macro_export]
macro_rules! case {
    ($case:ident) => {{
        let _ = $crate::cases::$case;
        stringify!($case)
    }};
}

/// The fair-waiting cases: what an engine that does not queue its waiters
/// opts out of ([`Fresh::without_queues`]).
pub const FAIR_WAITING_CASES: [&str; 10] = [
    case!(waiters_are_granted_in_arrival_order),
    case!(a_waiters_place_is_kept_while_it_waits),
    case!(an_owner_asking_again_is_answered_at_once_while_others_queue),
    case!(waiters_are_listed_oldest_first_with_their_whole_wait),
    case!(no_kind_passes_a_waiter_of_another),
    case!(a_waiting_writer_is_granted_among_arriving_readers),
    case!(a_reader_waits_for_at_most_one_writer),
    case!(a_dead_waiters_place_is_freed_within_the_ticket_lease),
    case!(a_dropped_waiter_leaves_the_queue_at_once),
    case!(try_never_queues_nor_jumps_the_queue),
];

#[doc(hidden)]
#[macro_export]
macro_rules! __with_cases {
    ($callback:path; $($extra:tt)*) => {
        $callback!($($extra)*;
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
            dropping_a_handle_leaves_its_grant,
            handle_never_touches_later_grant,
            fences_strictly_increase,
            raise_fences_lifts_every_later_fence,
            fences_end_with_a_typed_error_and_the_store_goes_on,
            validation_rejects_bad_names,
            validation_rejects_bad_owners,
            duration_guard_on_acquire,
            sub_millisecond_ttl_rounds_up,
            sub_millisecond_ttl_rounds_up_for_every_kind,
            waiters_validates_and_fails_closed,
            closed_store_fails_closed,
            calls_racing_close_finish_or_fail_closed,
            lock_times_out_with_none,
            lock_woken_by_release,
            lock_granted_after_expiry,
            lock_with_an_endless_wait_waits_until_granted,
            lock_with_a_zero_wait_tries_once,
            lock_grants_the_ttl_asked_for,
            lock_woken_by_forced_release,
            name_limit_counts_bytes,
            holder_reports_live_holder,
            holder_reports_time_left_not_the_ttl,
            purge_removes_only_expired_rows,
            expired_rows_stay_until_purged,
            valid_until_never_outlasts_the_lease,
            keepalive_holds_past_ttl,
            keepalive_signals_revoked,
            keepalive_signals_lost_before_valid_until,
            a_lowered_deadline_is_signalled,
            safety_many_holders_one_name,
            per_holder_owners_count_exactly,
            cancellation_leaves_no_trace,
            model_based_sequences,
            bad_input_is_refused_and_writes_nothing,
            operations_are_traced_with_their_outcome,
            list_pages_live_holders_by_prefix,
            force_release_ends_the_grant,
            permit_expiry_lets_another_owner_in,
            permit_renew_is_a_full_window_and_false_when_lost,
            permit_release_ends_its_grant_only,
            permit_handle_never_touches_a_later_grant_of_its_slot,
            permit_same_owner_gets_its_permit_back,
            permit_count_mismatch_is_refused,
            lock_and_semaphore_names_never_mix,
            a_lapsed_lease_stays_lost_once_the_other_kind_holds_the_name,
            keepalive_holds_a_permit_past_its_ttl,
            permit_bad_input_is_refused_and_writes_nothing,
            permit_calls_on_a_closed_store_fail_closed,
            acquire_permit_woken_by_release,
            permits_are_listed_and_released_by_force_one_at_a_time,
            permit_cancellation_leaves_nothing_beyond_its_ttl,
            readers_share_a_name_and_a_writer_holds_it_alone,
            rw_fences_rise_past_every_writer,
            a_waiting_writer_holds_new_readers_back,
            a_writers_intent_ends_with_its_wait,
            rw_and_other_kinds_never_mix,
            rw_leases_renew_release_and_lapse,
            rw_bad_input_is_refused_and_closed_stores_fail_closed,
            rw_grants_are_listed_and_released_by_force_one_at_a_time;
            peers: fences_in_commit_order_across_stores,
            semaphore_admits_at_most_its_permits,
            readers_and_writers_never_overlap,
            a_stream_of_readers_cannot_starve_a_writer,
            renew_false_ends_valid_until,
            schedule_runs_each_slot_once_across_skewed_clocks,
            schedule_crashed_run_is_not_run_again,
            schedule_retry_runs_a_crashed_slot_once_more,
            waiters_are_granted_in_arrival_order,
            a_reader_waits_for_at_most_one_writer,
            a_dead_waiters_place_is_freed_within_the_ticket_lease,
            a_dropped_waiter_leaves_the_queue_at_once,
            try_never_queues_nor_jumps_the_queue,
            no_kind_passes_a_waiter_of_another,
            a_waiting_writer_is_granted_among_arriving_readers,
            a_waiters_place_is_kept_while_it_waits,
            an_owner_asking_again_is_answered_at_once_while_others_queue,
            waiters_are_listed_oldest_first_with_their_whole_wait
        );
    };
}

/// Expands to one `#[test]` per contract case, each running the case against
/// a store made by `$fresh` (an `async fn() -> Option<Fresh>`).
///
/// The calling crate needs no tokio dependency: each test builds its own
/// multi-threaded runtime.
///
/// `contract_tests!(fresh; case, …; peers: case, …)` runs only the cases
/// named (those taking peers after `peers:`): for a way of reaching an
/// engine that the whole suite already passes on (a user, TLS), where a
/// selection over every primitive shows the way works.
#[macro_export]
macro_rules! contract_tests {
    ($fresh:path) => {
        $crate::__with_cases!($crate::contract_tests; @cases $fresh);
    };
    ($fresh:path; $($case:ident),* $(,)?; peers: $($peer_case:ident),* $(,)?) => {
        $crate::contract_tests!(@cases $fresh; $($case),*; peers: $($peer_case),*);
    };
    (@cases $fresh:path; $($case:ident),* $(,)?; peers: $($peer_case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::run_case($fresh, $crate::Case {
                    name: stringify!($case),
                    run: $crate::CaseFn::Single(|store| Box::pin($crate::cases::$case(store))),
                });
            }
        )*
        $(
            #[test]
            fn $peer_case() {
                $crate::run_case($fresh, $crate::Case {
                    name: stringify!($peer_case),
                    run: $crate::CaseFn::Peers(|stores| Box::pin($crate::cases::$peer_case(stores))),
                });
            }
        )*
    };
}

/// The list of cases as data, from the same list as [`contract_tests!`].
macro_rules! case_list {
    (; $($case:ident),* $(,)?; peers: $($peer_case:ident),* $(,)?) => {
        /// Every contract case, by name, in the order `contract_tests!` runs
        /// them: for runners that need the cases as data (the gallery).
        pub fn all() -> Vec<Case> {
            vec![
                $(Case {
                    name: stringify!($case),
                    run: CaseFn::Single(|store| Box::pin(cases::$case(store))),
                },)*
                $(Case {
                    name: stringify!($peer_case),
                    run: CaseFn::Peers(|stores| Box::pin(cases::$peer_case(stores))),
                },)*
            ]
        }
    };
}

/// One contract case as data.
#[derive(Clone, Copy)]
pub struct Case {
    /// The case's name (its `async fn` in [`cases`]).
    pub name: &'static str,
    /// The case.
    pub run: CaseFn,
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// The future of a case.
pub type CaseFuture = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// A case taking one store, or the store and its peers.
#[derive(Clone, Copy)]
pub enum CaseFn {
    /// Takes the store under test.
    Single(fn(std::sync::Arc<dyn alkstore_core::Store>) -> CaseFuture),
    /// Takes the store under test and its independent peers.
    Peers(fn(Stores) -> CaseFuture),
}

/// The cases as data.
pub mod list {
    use super::{Case, CaseFn, cases};

    crate::__with_cases!(case_list;);
}
