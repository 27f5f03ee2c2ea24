//! A gallery of broken engines: each breaks exactly one rule of
//! docs/contract.md, wrapped around the correct [reference
//! engine](crate::reference), and names the cases that must reject it. The
//! suite is only as strong as the broken engines it rejects;
//! `tests/gallery.rs` runs every case on every flaw in CI and checks that
//! exactly the named cases fail — so each case is shown to catch its rule,
//! and each flaw to break one rule only.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use alkstore_core::{
    Access, Attempt, BoxError, Engine, GrantKey, Holder, LeaseMillis, Listed, PermitAttempt, Queue,
    ReleaseBus, RwAttempt, RwMode, TicketKind, WRITER_SLOT,
};
use async_trait::async_trait;

use crate::reference::{MemoryEngine, PermitRow, Rows, TicketRow};

/// One way to break one rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Flaw {
    /// Grants a name whose live row belongs to another owner.
    GrantsOverALiveRow,
    /// Never lets a row expire: a lapsed lease still blocks others.
    NeverExpires,
    /// Takes over an expired row keeping its old fence.
    KeepsTheFenceOnTakeover,
    /// Gives the same owner's live re-acquire a new grant (a new fence).
    RegrantsTheSameOwner,
    /// Refreshes the expiry on the same owner's re-acquire.
    RefreshesOnReacquire,
    /// Renews matching name and owner, not the fence.
    RenewIgnoresTheFence,
    /// Releases matching name and owner, not the fence.
    ReleaseIgnoresTheFence,
    /// Renews whatever row holds the name: another owner's too.
    RenewMatchesTheNameOnly,
    /// Answers `true` to every release, whether it deleted a row or not.
    ReleaseAlwaysAnswersTrue,
    /// Renews by adding the ttl to the old expiry.
    RenewAddsToTheOldWindow,
    /// Renews a row that expired (when nobody took it).
    RenewsALapsedRow,
    /// Refuses to release the holder's own expired row.
    KeepsStaleRowsOnRelease,
    /// Reports an expired row as the holder.
    ReportsExpiredHolders,
    /// Reports the full ttl as the holder's time left.
    HolderReportsTheTtl,
    /// Reports 60 ms more lease than its clock holds.
    OverstatesTheLease,
    /// Purges every expired row on every acquire.
    SweepsOnAcquire,
    /// Purges live rows too.
    PurgesLiveRows,
    /// Says it purged nothing.
    PurgeCountsNothing,
    /// Lists expired rows as if they were held.
    ListsExpiredRows,
    /// Hands the fence of a grant removed by force out again (as an engine
    /// drawing the next fence from the rows left would).
    ForcedReleaseRewindsTheFence,
    /// Removes whatever grant holds the name when asked to remove one
    /// grant (the fence is not looked at).
    ForcedReleaseIgnoresTheFence,
    /// Gives a waiting acquire's grant a lease of its own (30 s), not the
    /// ttl asked for.
    WaitingGrantIgnoresTheTtl,
    /// Refuses a waiting acquire whose deadline has passed without trying
    /// it (so a zero wait never gets a free name).
    RefusesAPassedDeadline,
    /// Answers a fence raise as done without raising anything.
    IgnoresTheFenceRaise,
    /// Raises the fences but leaves the grants made before as they were:
    /// renewed, and given back to their owners with their old fences.
    RaiseKeepsLiveGrants,
    /// At the end of the fence space, grants on past it (the counter
    /// going beyond `MAX_FENCE`, as an unchecked `value + 1` would).
    GrantsPastTheEnd,
    /// When every permit is held, hands out the slot that ends soonest
    /// over its live holder: one holder more than the permits.
    GrantsOneMorePermit,
    /// Takes over an expired permit's slot keeping its old fence.
    PermitTakeoverKeepsTheFence,
    /// Grants a permit whatever number of permits it was asked with.
    IgnoresThePermitCount,
    /// Grants a plain lock over a semaphore's live permits.
    LockIgnoresLivePermits,
    /// Gives the same owner's live re-acquire of a permit a new permit.
    RegrantsTheSameOwnersPermit,
    /// Releases a permit matching name, slot and owner, not the fence.
    PermitReleaseIgnoresTheFence,
    /// Grants a writer over another owner's live writer.
    TwoWriters,
    /// Grants a writer beside live readers.
    WriterBesideReader,
    /// Grants readers whatever writers are queued: a stream of readers
    /// starves a waiting writer.
    StarvesWaitingWriters,
    /// Draws readers' fences from a counter of the name's own readers, not
    /// the one every grant draws from: a reader's fence can be below a
    /// writer's before it.
    ReaderFenceBelowWriter,
    /// Grants writers whatever readers are queued: a stream of writers
    /// starves a waiting reader.
    StarvesWaitingReaders,
    /// Owes no queued reader the turn when a writer is granted: a reader
    /// that queued behind two waiting writers waits for both.
    OwesNoReadersAfterAWriter,
    /// Grants whoever asks when the name is free, whatever tickets are
    /// older: the queue's order is not kept.
    ServesInAnyOrder,
    /// Grants a `try_` call whatever waiters are queued.
    TryJumpsTheQueue,
    /// Keeps a waiter's ticket for 30 s, not the lease its attempt asked:
    /// a waiter that died holds its place long after.
    KeepsADeadWaitersPlace,
    /// Leaves a waiter's ticket where it is when the waiter leaves the
    /// queue: one that stopped waiting holds its place until it lapses.
    LeavingTheQueueDoesNothing,
    /// Keeps the ticket of a waiter granted its owner's own live grant
    /// back: the name stays queued behind a waiter that is gone.
    KeepsAGrantedWaitersTicket,
    /// Keeps one queue per kind: a caller passes a waiter of another kind
    /// queued before it (a permit or a reader past a lock's waiter).
    PassesWaitersOfAnotherKind,
    /// Refuses a waiting writer its turn while any ticket queued after it
    /// is live (as a grant whose compare covers the whole queue would):
    /// readers arriving behind it keep a free name from everyone.
    WriterWaitsOutArrivals,
    /// A waiting lock's attempts do not renew its ticket: its place lapses
    /// while it waits, and it queues again at the back.
    TicketLapsesWhileWaiting,
    /// Refuses the same owner's lock asked again while others queue,
    /// where its own live grant should be answered at once.
    KeepsTheOwnerBehindTheQueue,
}

/// A list of contract cases by name, each checked by the compiler to be a
/// case of [`cases`](crate::cases): a renamed or misspelt case does not
/// compile.
macro_rules! cases {
    ($($case:ident),* $(,)?) => {{
        $(let _ = crate::cases::$case;)*
        &[$(stringify!($case)),*]
    }};
}

impl Flaw {
    /// Every flaw in the gallery.
    pub const ALL: [Flaw; 47] = [
        Flaw::GrantsOverALiveRow,
        Flaw::NeverExpires,
        Flaw::KeepsTheFenceOnTakeover,
        Flaw::RegrantsTheSameOwner,
        Flaw::RefreshesOnReacquire,
        Flaw::RenewIgnoresTheFence,
        Flaw::ReleaseIgnoresTheFence,
        Flaw::RenewMatchesTheNameOnly,
        Flaw::ReleaseAlwaysAnswersTrue,
        Flaw::RenewAddsToTheOldWindow,
        Flaw::RenewsALapsedRow,
        Flaw::KeepsStaleRowsOnRelease,
        Flaw::ReportsExpiredHolders,
        Flaw::HolderReportsTheTtl,
        Flaw::OverstatesTheLease,
        Flaw::SweepsOnAcquire,
        Flaw::PurgesLiveRows,
        Flaw::PurgeCountsNothing,
        Flaw::ListsExpiredRows,
        Flaw::ForcedReleaseRewindsTheFence,
        Flaw::ForcedReleaseIgnoresTheFence,
        Flaw::WaitingGrantIgnoresTheTtl,
        Flaw::RefusesAPassedDeadline,
        Flaw::IgnoresTheFenceRaise,
        Flaw::RaiseKeepsLiveGrants,
        Flaw::GrantsPastTheEnd,
        Flaw::GrantsOneMorePermit,
        Flaw::PermitTakeoverKeepsTheFence,
        Flaw::IgnoresThePermitCount,
        Flaw::LockIgnoresLivePermits,
        Flaw::RegrantsTheSameOwnersPermit,
        Flaw::PermitReleaseIgnoresTheFence,
        Flaw::TwoWriters,
        Flaw::WriterBesideReader,
        Flaw::StarvesWaitingWriters,
        Flaw::ReaderFenceBelowWriter,
        Flaw::StarvesWaitingReaders,
        Flaw::OwesNoReadersAfterAWriter,
        Flaw::ServesInAnyOrder,
        Flaw::TryJumpsTheQueue,
        Flaw::KeepsADeadWaitersPlace,
        Flaw::LeavingTheQueueDoesNothing,
        Flaw::KeepsAGrantedWaitersTicket,
        Flaw::PassesWaitersOfAnotherKind,
        Flaw::WriterWaitsOutArrivals,
        Flaw::TicketLapsesWhileWaiting,
        Flaw::KeepsTheOwnerBehindTheQueue,
    ];

    /// The rule of docs/contract.md it breaks.
    pub fn rule(self) -> &'static str {
        match self {
            Flaw::GrantsOverALiveRow => "exclusion: one owner holds a name at a time",
            Flaw::NeverExpires => "expiry: after the TTL another owner gets the name",
            Flaw::KeepsTheFenceOnTakeover => "fences: a takeover carries a higher fence",
            Flaw::RegrantsTheSameOwner => "same owner again gets the same grant (same fence)",
            Flaw::RefreshesOnReacquire => "same owner again: expiry not refreshed",
            Flaw::RenewIgnoresTheFence => "renew acts on exactly its grant",
            Flaw::ReleaseIgnoresTheFence => "release acts on exactly its grant",
            Flaw::RenewMatchesTheNameOnly => "renew answers false after a takeover",
            Flaw::ReleaseAlwaysAnswersTrue => {
                "release answers true only when it deleted the grant's row"
            }
            Flaw::RenewAddsToTheOldWindow => "renew sets a full window from now",
            Flaw::RenewsALapsedRow => "renew answers false once the lease lapsed",
            Flaw::KeepsStaleRowsOnRelease => "release deletes the holder's own expired row",
            Flaw::ReportsExpiredHolders => "holder reports only a live holder",
            Flaw::HolderReportsTheTtl => "holder reports the lease time left",
            Flaw::OverstatesTheLease => "valid_until never promises more than the engine holds",
            Flaw::SweepsOnAcquire => "expiry is silent: no sweeper, rows stay until purged",
            Flaw::PurgesLiveRows => "purge_expired deletes expired rows only",
            Flaw::PurgeCountsNothing => "purge_expired says how many it deleted",
            Flaw::ListsExpiredRows => "list shows live holders only",
            Flaw::ForcedReleaseRewindsTheFence => {
                "the grant after a forced release has a higher fence"
            }
            Flaw::ForcedReleaseIgnoresTheFence => {
                "a forced release of one grant removes that grant only"
            }
            Flaw::WaitingGrantIgnoresTheTtl => "lock grants the ttl it was asked for",
            Flaw::RefusesAPassedDeadline => "lock with a zero wait tries once",
            Flaw::IgnoresTheFenceRaise => "every grant after a fence raise is above it",
            Flaw::RaiseKeepsLiveGrants => "a fence raise retires every grant made before it",
            Flaw::GrantsPastTheEnd => "past the end of the fences, grants are refused",
            Flaw::GrantsOneMorePermit => "at most `permits` holders of a semaphore at a time",
            Flaw::PermitTakeoverKeepsTheFence => "a permit's takeover carries a higher fence",
            Flaw::IgnoresThePermitCount => "a permit asked with another count is refused",
            Flaw::LockIgnoresLivePermits => "a name is a lock or a semaphore, never both",
            Flaw::RegrantsTheSameOwnersPermit => "the same owner again gets the same permit",
            Flaw::PermitReleaseIgnoresTheFence => "a permit's release acts on exactly its grant",
            Flaw::TwoWriters => "a writer excludes other writers",
            Flaw::WriterBesideReader => "a writer excludes readers",
            Flaw::StarvesWaitingWriters => "once a writer waits, new readers wait behind it",
            Flaw::ReaderFenceBelowWriter => "a reader's fence is above every earlier writer's",
            Flaw::StarvesWaitingReaders => "a waiting reader waits for at most one writer",
            Flaw::OwesNoReadersAfterAWriter => {
                "a writer's grant owes every queued reader the turn after it"
            }
            Flaw::ServesInAnyOrder => "waiters are granted first come, first served",
            Flaw::TryJumpsTheQueue => "a try_ call never jumps the queue",
            Flaw::KeepsADeadWaitersPlace => {
                "a dead waiter's place is freed within the ticket lease"
            }
            Flaw::LeavingTheQueueDoesNothing => {
                "a waiter that stops waiting leaves the queue at once"
            }
            Flaw::KeepsAGrantedWaitersTicket => "a waiter granted leaves the queue with its grant",
            Flaw::PassesWaitersOfAnotherKind => "one queue across kinds: no kind passes another",
            Flaw::WriterWaitsOutArrivals => {
                "a waiting writer is granted a free name whoever queues behind it"
            }
            Flaw::TicketLapsesWhileWaiting => "a waiter keeps its place for as long as it waits",
            Flaw::KeepsTheOwnerBehindTheQueue => {
                "an owner asking again is answered at once with its grant"
            }
        }
    }

    /// The cases that must fail on it. Every other case must pass, except
    /// those in [`Flaw::also_probed_by`].
    pub fn rejected_by(self) -> &'static [&'static str] {
        match self {
            Flaw::GrantsOverALiveRow => cases!(
                a_dead_waiters_place_is_freed_within_the_ticket_lease,
                a_dropped_waiter_leaves_the_queue_at_once,
                a_waiters_place_is_kept_while_it_waits,
                an_owner_asking_again_is_answered_at_once_while_others_queue,
                calls_racing_close_finish_or_fail_closed,
                dropping_a_handle_leaves_its_grant,
                exclusion_many_contenders,
                exclusion_two_owners,
                expiry_lets_another_owner_in,
                fences_in_commit_order_across_stores,
                keepalive_holds_past_ttl,
                lock_granted_after_expiry,
                lock_grants_the_ttl_asked_for,
                lock_times_out_with_none,
                lock_with_a_zero_wait_tries_once,
                lock_with_an_endless_wait_waits_until_granted,
                lock_woken_by_forced_release,
                lock_woken_by_release,
                model_based_sequences,
                no_kind_passes_a_waiter_of_another,
                per_holder_owners_count_exactly,
                raise_fences_lifts_every_later_fence,
                reacquire_same_owner_keeps_grant,
                safety_many_holders_one_name,
                schedule_crashed_run_is_not_run_again,
                schedule_retry_runs_a_crashed_slot_once_more,
                schedule_runs_each_slot_once_across_skewed_clocks,
                try_never_queues_nor_jumps_the_queue,
                valid_until_never_outlasts_the_lease,
                waiters_are_granted_in_arrival_order,
                waiters_are_listed_oldest_first_with_their_whole_wait
            ),
            Flaw::NeverExpires => cases!(
                expired_rows_stay_until_purged,
                expiry_lets_another_owner_in,
                fences_strictly_increase,
                handle_never_touches_later_grant,
                holder_reports_live_holder,
                list_pages_live_holders_by_prefix,
                lock_granted_after_expiry,
                lock_grants_the_ttl_asked_for,
                lock_with_an_endless_wait_waits_until_granted,
                purge_removes_only_expired_rows,
                reacquire_same_owner_keeps_grant,
                release_false_after_takeover,
                renew_false_after_lapse,
                renew_false_after_takeover,
                schedule_retry_runs_a_crashed_slot_once_more,
                sub_millisecond_ttl_rounds_up,
                valid_until_never_outlasts_the_lease
            ),
            Flaw::KeepsTheFenceOnTakeover => cases!(
                expiry_lets_another_owner_in,
                fences_strictly_increase,
                handle_never_touches_later_grant,
                lock_granted_after_expiry,
                renew_false_after_lapse,
                safety_many_holders_one_name,
                sub_millisecond_ttl_rounds_up
            ),
            Flaw::RegrantsTheSameOwner => cases!(
                a_lowered_deadline_is_signalled,
                an_owner_asking_again_is_answered_at_once_while_others_queue,
                dropping_a_handle_leaves_its_grant,
                fences_strictly_increase,
                handles_of_one_grant_are_one_grant,
                model_based_sequences,
                reacquire_same_owner_keeps_grant,
                release_false_second_time,
                renew_false_ends_valid_until,
                waiters_are_granted_in_arrival_order
            ),
            Flaw::RefreshesOnReacquire => cases!(
                raise_fences_lifts_every_later_fence,
                reacquire_same_owner_keeps_grant,
                waiters_are_granted_in_arrival_order
            ),
            Flaw::RenewIgnoresTheFence => cases!(handle_never_touches_later_grant),
            Flaw::ReleaseIgnoresTheFence => cases!(
                handle_never_touches_later_grant,
                raise_fences_lifts_every_later_fence
            ),
            Flaw::RenewMatchesTheNameOnly => {
                cases!(handle_never_touches_later_grant, renew_false_after_takeover)
            }
            Flaw::ReleaseAlwaysAnswersTrue => cases!(
                a_lowered_deadline_is_signalled,
                expired_rows_stay_until_purged,
                force_release_ends_the_grant,
                handle_never_touches_later_grant,
                handles_of_one_grant_are_one_grant,
                permit_handle_never_touches_a_later_grant_of_its_slot,
                permit_release_ends_its_grant_only,
                purge_removes_only_expired_rows,
                raise_fences_lifts_every_later_fence,
                reacquire_same_owner_keeps_grant,
                release_false_after_takeover,
                release_false_second_time,
                rw_grants_are_listed_and_released_by_force_one_at_a_time,
                rw_leases_renew_release_and_lapse
            ),
            Flaw::RenewAddsToTheOldWindow => cases!(
                a_lapsed_lease_stays_lost_once_the_other_kind_holds_the_name,
                renew_is_a_full_window_from_now,
                sub_millisecond_ttl_rounds_up
            ),
            Flaw::RenewsALapsedRow => cases!(
                a_lapsed_lease_stays_lost_once_the_other_kind_holds_the_name,
                permit_renew_is_a_full_window_and_false_when_lost,
                raise_fences_lifts_every_later_fence,
                renew_false_after_lapse,
                rw_leases_renew_release_and_lapse
            ),
            Flaw::KeepsStaleRowsOnRelease => cases!(
                expired_rows_stay_until_purged,
                force_release_ends_the_grant,
                list_pages_live_holders_by_prefix,
                release_own_stale_row,
                sub_millisecond_ttl_rounds_up
            ),
            Flaw::ReportsExpiredHolders => cases!(
                expired_rows_stay_until_purged,
                holder_reports_live_holder,
                renew_false_after_lapse,
                sub_millisecond_ttl_rounds_up
            ),
            Flaw::HolderReportsTheTtl => cases!(
                holder_reports_time_left_not_the_ttl,
                reacquire_same_owner_keeps_grant
            ),
            Flaw::OverstatesTheLease => cases!(
                handles_of_one_grant_are_one_grant,
                lock_granted_after_expiry,
                lock_with_an_endless_wait_waits_until_granted,
                safety_many_holders_one_name,
                schedule_crashed_run_is_not_run_again,
                schedule_retry_runs_a_crashed_slot_once_more,
                schedule_runs_each_slot_once_across_skewed_clocks,
                valid_until_never_outlasts_the_lease
            ),
            Flaw::SweepsOnAcquire => cases!(
                expired_rows_stay_until_purged,
                list_pages_live_holders_by_prefix
            ),
            Flaw::PurgesLiveRows => cases!(
                expired_rows_stay_until_purged,
                purge_removes_only_expired_rows
            ),
            Flaw::PurgeCountsNothing => cases!(
                expired_rows_stay_until_purged,
                fences_strictly_increase,
                purge_removes_only_expired_rows
            ),
            Flaw::ListsExpiredRows => cases!(
                a_lapsed_lease_stays_lost_once_the_other_kind_holds_the_name,
                list_pages_live_holders_by_prefix
            ),
            Flaw::ForcedReleaseRewindsTheFence => cases!(
                force_release_ends_the_grant,
                permits_are_listed_and_released_by_force_one_at_a_time,
                rw_grants_are_listed_and_released_by_force_one_at_a_time
            ),
            Flaw::ForcedReleaseIgnoresTheFence => cases!(
                force_release_ends_the_grant,
                permits_are_listed_and_released_by_force_one_at_a_time,
                rw_grants_are_listed_and_released_by_force_one_at_a_time
            ),
            Flaw::WaitingGrantIgnoresTheTtl => cases!(lock_grants_the_ttl_asked_for),
            Flaw::RefusesAPassedDeadline => cases!(lock_with_a_zero_wait_tries_once),
            Flaw::IgnoresTheFenceRaise => cases!(
                raise_fences_lifts_every_later_fence,
                fences_end_with_a_typed_error_and_the_store_goes_on
            ),
            Flaw::RaiseKeepsLiveGrants => cases!(raise_fences_lifts_every_later_fence),
            Flaw::GrantsPastTheEnd => {
                cases!(fences_end_with_a_typed_error_and_the_store_goes_on)
            }
            Flaw::GrantsOneMorePermit => cases!(
                acquire_permit_woken_by_release,
                an_owner_asking_again_is_answered_at_once_while_others_queue,
                dropping_a_handle_leaves_its_grant,
                keepalive_holds_a_permit_past_its_ttl,
                lock_and_semaphore_names_never_mix,
                no_kind_passes_a_waiter_of_another,
                permit_expiry_lets_another_owner_in,
                semaphore_admits_at_most_its_permits,
                waiters_are_granted_in_arrival_order
            ),
            Flaw::PermitTakeoverKeepsTheFence => cases!(
                permit_expiry_lets_another_owner_in,
                permit_handle_never_touches_a_later_grant_of_its_slot,
                sub_millisecond_ttl_rounds_up_for_every_kind
            ),
            Flaw::IgnoresThePermitCount => cases!(permit_count_mismatch_is_refused),
            Flaw::LockIgnoresLivePermits => cases!(lock_and_semaphore_names_never_mix),
            Flaw::RegrantsTheSameOwnersPermit => cases!(
                a_lowered_deadline_is_signalled,
                an_owner_asking_again_is_answered_at_once_while_others_queue,
                dropping_a_handle_leaves_its_grant,
                permit_same_owner_gets_its_permit_back,
                raise_fences_lifts_every_later_fence
            ),
            Flaw::PermitReleaseIgnoresTheFence => cases!(
                permit_handle_never_touches_a_later_grant_of_its_slot,
                raise_fences_lifts_every_later_fence
            ),
            Flaw::TwoWriters => cases!(
                a_reader_waits_for_at_most_one_writer,
                no_kind_passes_a_waiter_of_another,
                readers_and_writers_never_overlap,
                readers_share_a_name_and_a_writer_holds_it_alone
            ),
            Flaw::WriterBesideReader => cases!(
                a_reader_waits_for_at_most_one_writer,
                a_waiting_writer_holds_new_readers_back,
                a_waiting_writer_is_granted_among_arriving_readers,
                a_writers_intent_ends_with_its_wait,
                an_owner_asking_again_is_answered_at_once_while_others_queue,
                dropping_a_handle_leaves_its_grant,
                readers_and_writers_never_overlap,
                readers_share_a_name_and_a_writer_holds_it_alone,
                rw_grants_are_listed_and_released_by_force_one_at_a_time,
                rw_leases_renew_release_and_lapse
            ),
            Flaw::StarvesWaitingWriters => cases!(
                a_reader_waits_for_at_most_one_writer,
                a_stream_of_readers_cannot_starve_a_writer,
                a_waiting_writer_holds_new_readers_back,
                a_waiting_writer_is_granted_among_arriving_readers,
                a_writers_intent_ends_with_its_wait,
                rw_grants_are_listed_and_released_by_force_one_at_a_time
            ),
            Flaw::ReaderFenceBelowWriter => cases!(
                a_reader_waits_for_at_most_one_writer,
                a_waiting_writer_holds_new_readers_back,
                raise_fences_lifts_every_later_fence,
                readers_and_writers_never_overlap,
                rw_fences_rise_past_every_writer,
                rw_grants_are_listed_and_released_by_force_one_at_a_time
            ),
            Flaw::StarvesWaitingReaders => cases!(a_reader_waits_for_at_most_one_writer),
            Flaw::OwesNoReadersAfterAWriter => cases!(a_reader_waits_for_at_most_one_writer),
            Flaw::ServesInAnyOrder => cases!(
                a_dead_waiters_place_is_freed_within_the_ticket_lease,
                a_waiting_writer_holds_new_readers_back,
                a_waiting_writer_is_granted_among_arriving_readers,
                a_writers_intent_ends_with_its_wait,
                no_kind_passes_a_waiter_of_another,
                rw_grants_are_listed_and_released_by_force_one_at_a_time,
                try_never_queues_nor_jumps_the_queue
            ),
            Flaw::TryJumpsTheQueue => cases!(
                a_waiting_writer_holds_new_readers_back,
                a_writers_intent_ends_with_its_wait,
                no_kind_passes_a_waiter_of_another,
                rw_grants_are_listed_and_released_by_force_one_at_a_time,
                try_never_queues_nor_jumps_the_queue
            ),
            Flaw::KeepsADeadWaitersPlace => cases!(
                a_dead_waiters_place_is_freed_within_the_ticket_lease,
                a_reader_waits_for_at_most_one_writer,
                try_never_queues_nor_jumps_the_queue
            ),
            Flaw::LeavingTheQueueDoesNothing => cases!(a_dropped_waiter_leaves_the_queue_at_once),
            Flaw::KeepsAGrantedWaitersTicket => cases!(waiters_are_granted_in_arrival_order),
            Flaw::PassesWaitersOfAnotherKind => cases!(no_kind_passes_a_waiter_of_another),
            Flaw::TicketLapsesWhileWaiting => cases!(
                a_waiters_place_is_kept_while_it_waits,
                waiters_are_listed_oldest_first_with_their_whole_wait
            ),
            Flaw::KeepsTheOwnerBehindTheQueue => {
                cases!(an_owner_asking_again_is_answered_at_once_while_others_queue)
            }
            Flaw::WriterWaitsOutArrivals => cases!(
                a_reader_waits_for_at_most_one_writer,
                a_waiting_writer_is_granted_among_arriving_readers
            ),
        }
    }

    /// Cases that may or may not run into this flaw in one run: allowed
    /// to fail on it, not required to. Those that draw their operations at
    /// random, on every flaw; and, on a flaw that grants out of turn, the
    /// cases whose waiters race for a turn (which one lands first decides
    /// whether the order comes out wrong).
    pub fn also_probed_by(self) -> Vec<&'static str> {
        let mut cases = cases!(
            cancellation_leaves_no_trace,
            model_based_sequences,
            permit_cancellation_leaves_nothing_beyond_its_ttl,
            per_holder_owners_count_exactly,
            readers_and_writers_never_overlap,
            safety_many_holders_one_name
        )
        .to_vec();
        let racing: &[&str] = match self {
            Flaw::ServesInAnyOrder => cases!(
                a_reader_waits_for_at_most_one_writer,
                a_stream_of_readers_cannot_starve_a_writer,
                waiters_are_granted_in_arrival_order
            ),
            // Its readers' stream leaves gaps in which no ticket is live.
            Flaw::WriterWaitsOutArrivals => cases!(a_stream_of_readers_cannot_starve_a_writer),
            _ => &[],
        };
        cases.extend_from_slice(racing);
        cases
    }
}

/// The reference engine with one flaw. Stores made from clones share rows.
#[derive(Debug, Clone)]
pub struct Broken {
    inner: MemoryEngine,
    flaw: Flaw,
    /// The ttl of each name's last grant (for flaws that need it).
    ttls: Arc<Mutex<HashMap<String, Duration>>>,
    /// Each name's count of readers granted (for `ReaderFenceBelowWriter`).
    reader_fences: Arc<Mutex<HashMap<String, u64>>>,
}

impl Broken {
    /// A fresh, empty engine with `flaw`.
    pub fn new(flaw: Flaw) -> Self {
        Broken {
            inner: MemoryEngine::default(),
            flaw,
            ttls: Arc::default(),
            reader_fences: Arc::default(),
        }
    }

    /// Runs `f` on the inner rows (the reference engine's shared state).
    fn with_rows<T>(&self, f: impl FnOnce(&mut Rows) -> T) -> T {
        self.inner.with_rows(f)
    }

    /// A permit decided as the flaw decides it, under the rows' lock.
    #[allow(clippy::too_many_arguments)]
    fn flawed_permit(
        &self,
        rows: &mut Rows,
        name: &str,
        permits: u32,
        owner: &str,
        ttl: Duration,
        queue: Queue,
        now: Instant,
    ) -> PermitAttempt {
        let live: Vec<(u32, PermitRow)> = rows
            .live_permits(name, now)
            .map(|(slot, permit)| (slot, permit.clone()))
            .collect();
        let mine = live.iter().find(|(_, p)| p.row.owner == owner);
        match self.flaw {
            Flaw::RegrantsTheSameOwnersPermit if mine.is_some() => {
                let free = (0..permits).find(|s| live.iter().all(|(held, _)| held != s));
                return match free {
                    Some(slot) => rows.grant_permit(name, slot, permits, owner, ttl, now),
                    None => PermitAttempt::Held { expires_in: None },
                };
            }
            Flaw::GrantsOneMorePermit if live.len() as u32 == permits && mine.is_none() => {
                let soonest = live.iter().min_by_key(|(_, p)| p.row.expires_at);
                if let Some((slot, _)) = soonest {
                    return rows.grant_permit(name, *slot, permits, owner, ttl, now);
                }
            }
            _ => {}
        }
        // The fences of rows there before this acquire, expired or not.
        let before: HashMap<u32, u64> = (0..permits)
            .filter_map(|slot| {
                let row = rows.permits.get(&(name.to_owned(), slot))?;
                Some((slot, row.row.fence))
            })
            .collect();
        match rows.acquire_permit(name, permits, owner, ttl, queue, now) {
            PermitAttempt::Mismatch { permits: live }
                if self.flaw == Flaw::IgnoresThePermitCount =>
            {
                rows.acquire_permit(name, live, owner, ttl, queue, now)
            }
            PermitAttempt::Granted {
                slot, expires_in, ..
            } if self.flaw == Flaw::PermitTakeoverKeepsTheFence
                && mine.is_none()
                && before.contains_key(&slot) =>
            {
                // A takeover of an expired row: its fence again.
                let fence = before[&slot];
                if let Some(row) = rows.permits.get_mut(&(name.to_owned(), slot)) {
                    row.row.fence = fence;
                }
                PermitAttempt::Granted {
                    fence,
                    slot,
                    expires_in,
                }
            }
            attempt => attempt,
        }
    }

    /// The standing the flaw gives an attempt: a waiting call's ticket
    /// kept for 30 s (`KeepsADeadWaitersPlace`), not the lease asked.
    fn flawed_queue(&self, queue: Queue) -> Queue {
        match (self.flaw, queue) {
            (Flaw::KeepsADeadWaitersPlace, Queue::Waiting { ticket, .. }) => Queue::Waiting {
                ticket,
                lease: LeaseMillis::new(Duration::from_secs(30)).expect("30 s is a lease"),
            },
            _ => queue,
        }
    }

    /// Takes out of `rows` the tickets of `name` the flaw does not look at
    /// (for `mode`, a reader-writer attempt's), for [`put_back`] once the
    /// attempt is decided, under the same hold of the rows.
    fn set_aside(
        &self,
        rows: &mut Rows,
        name: &str,
        queue: Queue,
        kind: TicketKind,
    ) -> Vec<((String, u64), TicketRow)> {
        let own = match queue {
            Queue::Waiting { ticket, .. } => ticket,
            Queue::Never => None,
        };
        // Locks, permits, and a reader-writer lock's two sides.
        let family = |kind: TicketKind| match kind {
            TicketKind::Lock => 0,
            TicketKind::Permit => 1,
            TicketKind::Read | TicketKind::Write => 2,
        };
        let ignored = |number: u64, ticket: &TicketRow| match (self.flaw, kind) {
            (Flaw::ServesInAnyOrder, _) => Some(number) != own,
            (Flaw::TryJumpsTheQueue, _) => queue == Queue::Never,
            (Flaw::StarvesWaitingWriters, TicketKind::Read) => ticket.kind == TicketKind::Write,
            (Flaw::StarvesWaitingReaders, TicketKind::Write) => ticket.kind == TicketKind::Read,
            (Flaw::PassesWaitersOfAnotherKind, _) => family(ticket.kind) != family(kind),
            _ => false,
        };
        let keys: Vec<(String, u64)> = rows
            .tickets
            .range((name.to_owned(), 0)..=(name.to_owned(), u64::MAX))
            .filter(|((_, number), ticket)| ignored(*number, ticket))
            .map(|(key, _)| key.clone())
            .collect();
        keys.into_iter()
            .filter_map(|key| rows.tickets.remove_entry(&key))
            .collect()
    }
}

/// Puts back the tickets [`Broken::set_aside`] took out.
fn put_back(rows: &mut Rows, aside: Vec<((String, u64), TicketRow)>) {
    rows.tickets.extend(aside);
}

#[async_trait]
impl Engine for Broken {
    async fn acquire(
        &self,
        name: &str,
        owner: &str,
        ttl: LeaseMillis,
        queue: Queue,
        deadline: Option<Instant>,
    ) -> Result<Attempt, BoxError> {
        let now = Instant::now();
        let queue = self.flawed_queue(queue);
        if self.flaw == Flaw::RefusesAPassedDeadline && deadline.is_some_and(|d| d <= now) {
            return Ok(Attempt::Held { expires_in: None });
        }
        let ttl = match self.flaw {
            Flaw::WaitingGrantIgnoresTheTtl if deadline.is_some() => {
                LeaseMillis::new(Duration::from_secs(30))?
            }
            _ => ttl,
        };
        match self.flaw {
            Flaw::SweepsOnAcquire => {
                self.with_rows(|rows| rows.rows.retain(|n, row| n == name || row.expires_at > now));
            }
            Flaw::NeverExpires => {
                // Every row looks live for an hour more.
                self.with_rows(|rows| {
                    for row in rows.rows.values_mut() {
                        row.expires_at = row.expires_at.max(now + Duration::from_secs(3600));
                    }
                });
            }
            _ => {}
        }
        // Decided and done under one hold of the rows, as a real engine's
        // transaction would: a flaw must break its one rule, not also open a
        // window between a look and a write that breaks another.
        let flawed = self.with_rows(|rows| {
            let ttl = ttl.as_duration();
            if self.flaw == Flaw::GrantsPastTheEnd
                && rows.last_fence >= alkstore_core::MAX_FENCE
                && rows.live(name, now).is_none()
            {
                // The unchecked counter: on past the end.
                rows.last_fence += 1;
                let row = crate::reference::Row {
                    owner: owner.to_owned(),
                    fence: rows.last_fence,
                    expires_at: now + ttl,
                    retired: false,
                };
                rows.rows.insert(name.to_owned(), row);
                return Some(Attempt::Granted {
                    fence: rows.last_fence,
                    expires_in: ttl,
                });
            }
            let row = rows.rows.get_mut(name)?;
            let live = row.expires_at > now;
            match self.flaw {
                Flaw::GrantsOverALiveRow if live && row.owner != owner => {
                    Some(rows.grant(name, owner, ttl, now))
                }
                Flaw::RegrantsTheSameOwner if live && row.owner == owner => {
                    Some(rows.grant(name, owner, ttl, now))
                }
                Flaw::RefreshesOnReacquire if live && row.owner == owner => {
                    row.expires_at = now + ttl;
                    Some(Attempt::Granted {
                        fence: row.fence,
                        expires_in: ttl,
                    })
                }
                Flaw::KeepsTheFenceOnTakeover if !live => {
                    row.owner = owner.to_owned();
                    row.expires_at = now + ttl;
                    Some(Attempt::Granted {
                        fence: row.fence,
                        expires_in: ttl,
                    })
                }
                _ => None,
            }
        });
        if let Some(attempt) = flawed {
            return Ok(attempt);
        }
        let attempt = self.with_rows(|rows| {
            let aside = self.set_aside(rows, name, queue, TicketKind::Lock);
            // The attempt's own ticket, for `KeepsAGrantedWaitersTicket`.
            let own_ticket = match queue {
                Queue::Waiting {
                    ticket: Some(ticket),
                    ..
                } => rows.tickets.get_key_value(&(name.to_owned(), ticket)),
                _ => None,
            }
            .map(|(key, row)| (key.clone(), row.clone()));
            let before = rows.last_fence;
            let owners_again = rows.live(name, now).is_some_and(|row| row.owner == owner);
            let others_queue = rows
                .tickets
                .range((name.to_owned(), 0)..=(name.to_owned(), u64::MAX))
                .any(|(_, t)| t.expires_at > now && t.owner != owner);
            if self.flaw == Flaw::KeepsTheOwnerBehindTheQueue && owners_again && others_queue {
                put_back(rows, aside);
                return Ok(Attempt::Held { expires_in: None });
            }
            let attempt = match rows.acquire(name, owner, ttl.as_duration(), queue, now) {
                Attempt::HeldAsSemaphore { .. } if self.flaw == Flaw::LockIgnoresLivePermits => {
                    rows.grant(name, owner, ttl.as_duration(), now)
                }
                attempt => attempt,
            };
            let given_back =
                matches!(attempt, Attempt::Granted { .. }) && rows.last_fence == before;
            if self.flaw == Flaw::KeepsAGrantedWaitersTicket && given_back {
                rows.tickets.extend(own_ticket.clone());
            }
            // Its ticket as it was before this attempt: not renewed.
            if self.flaw == Flaw::TicketLapsesWhileWaiting {
                if let Some((key, was)) = own_ticket {
                    if let Some(ticket) = rows.tickets.get_mut(&key) {
                        ticket.expires_at = was.expires_at;
                    }
                }
            }
            put_back(rows, aside);
            rows.no_fence_left(attempt)
        })?;
        self.ttls
            .lock()
            .unwrap()
            .insert(name.to_owned(), ttl.as_duration());
        Ok(match (self.flaw, attempt) {
            (Flaw::OverstatesTheLease, Attempt::Granted { fence, expires_in }) => {
                // The row's lease is 60 ms shorter than the one reported.
                self.with_rows(|rows| {
                    if let Some(row) = rows.rows.get_mut(name).filter(|row| row.fence == fence) {
                        row.expires_at -= Duration::from_millis(60).min(expires_in);
                    }
                });
                Attempt::Granted { fence, expires_in }
            }
            (_, attempt) => attempt,
        })
    }

    async fn acquire_permit(
        &self,
        name: &str,
        permits: u32,
        owner: &str,
        ttl: LeaseMillis,
        queue: Queue,
        _deadline: Option<Instant>,
    ) -> Result<PermitAttempt, BoxError> {
        let queue = self.flawed_queue(queue);
        let (now, ttl) = (Instant::now(), ttl.as_duration());
        let attempt = self.with_rows(|rows| {
            let aside = self.set_aside(rows, name, queue, TicketKind::Permit);
            let attempt = self.flawed_permit(rows, name, permits, owner, ttl, queue, now);
            put_back(rows, aside);
            attempt
        });
        self.with_rows(|rows| rows.no_fence_left(attempt))
    }

    async fn acquire_rw(
        &self,
        name: &str,
        mode: RwMode,
        owner: &str,
        ttl: LeaseMillis,
        queue: Queue,
        _deadline: Option<Instant>,
    ) -> Result<RwAttempt, BoxError> {
        let queue = self.flawed_queue(queue);
        let (now, ttl) = (Instant::now(), ttl.as_duration());
        let mut reader_fences = self.reader_fences.lock().unwrap();
        let attempt = self.with_rows(|rows| {
            let live: Vec<(i64, String)> = rows
                .live_rw(name, now)
                .map(|(slot, row)| (slot, row.owner.clone()))
                .collect();
            let other_writer = live
                .iter()
                .any(|(slot, o)| *slot == WRITER_SLOT && o != owner);
            let readers = live.iter().any(|(slot, _)| *slot >= 0);
            let flawed_write = match self.flaw {
                Flaw::TwoWriters => other_writer && !readers,
                Flaw::WriterBesideReader => readers && !other_writer,
                _ => false,
            };
            if mode == RwMode::Write && flawed_write {
                return rows.grant_rw(name, Access::Write, owner, ttl, now);
            }
            if self.flaw == Flaw::WriterWaitsOutArrivals && mode == RwMode::Write {
                if let Queue::Waiting {
                    ticket: Some(own), ..
                } = queue
                {
                    let range = (name.to_owned(), own + 1)..=(name.to_owned(), u64::MAX);
                    if rows.tickets.range(range).any(|(_, t)| t.expires_at > now) {
                        let line = rows.line(name, queue, now);
                        let write = TicketKind::Write;
                        let queued = rows.queue_up(name, owner, write, queue, &line, false, now);
                        return RwAttempt::refused(None, queued);
                    }
                }
            }
            let before = rows.last_fence;
            let kind = match mode {
                RwMode::Read => TicketKind::Read,
                RwMode::Write => TicketKind::Write,
            };
            let aside = self.set_aside(rows, name, queue, kind);
            let owed_before = rows.owed_tickets(name);
            let attempt = rows.acquire_rw(name, mode, owner, ttl, queue, now);
            if self.flaw == Flaw::OwesNoReadersAfterAWriter {
                rows.set_owed_tickets(name, &owed_before);
            }
            put_back(rows, aside);
            match attempt {
                RwAttempt::Granted {
                    access: access @ Access::Read { slot },
                    expires_in,
                    ..
                } if self.flaw == Flaw::ReaderFenceBelowWriter && rows.last_fence > before => {
                    // The fence drawn from the name's own reader count instead.
                    rows.last_fence = before;
                    let counter = reader_fences.entry(name.to_owned()).or_default();
                    *counter += 1;
                    if let Some(row) = rows.rw.get_mut(&(name.to_owned(), i64::from(slot))) {
                        row.fence = *counter;
                    }
                    RwAttempt::Granted {
                        fence: *counter,
                        access,
                        expires_in,
                    }
                }
                attempt => attempt,
            }
        });
        drop(reader_fences);
        self.with_rows(|rows| rows.no_fence_left(attempt))
    }

    fn queues(&self) -> bool {
        true
    }

    async fn leave_queue(&self, name: &str, ticket: u64) -> Result<bool, BoxError> {
        if self.flaw == Flaw::LeavingTheQueueDoesNothing {
            return Ok(false);
        }
        self.inner.leave_queue(name, ticket).await
    }

    async fn waiters(&self, name: &str) -> Result<Vec<alkstore_core::Waiter>, BoxError> {
        self.inner.waiters(name).await
    }

    async fn renew(&self, grant: &GrantKey, ttl: LeaseMillis) -> Result<bool, BoxError> {
        if grant.row_slot().is_some() {
            if self.flaw != Flaw::RenewsALapsedRow {
                return self.inner.renew(grant, ttl).await;
            }
            // A permit's lapsed row too, whoever holds the name now.
            let until = Instant::now() + ttl.as_duration();
            return Ok(self.with_rows(|rows| match rows.row_of(grant) {
                Some(row) if row.owner == grant.owner && row.fence == grant.fence => {
                    row.expires_at = until;
                    true
                }
                _ => false,
            }));
        }
        let now = Instant::now();
        let ttl = ttl.as_duration();
        let renewed = self.with_rows(|rows| {
            let row = rows.rows.get_mut(&grant.name)?;
            let ours = self.flaw == Flaw::RenewMatchesTheNameOnly
                || (row.owner == grant.owner
                    && (row.fence == grant.fence || self.flaw == Flaw::RenewIgnoresTheFence));
            let live = row.expires_at > now || self.flaw == Flaw::RenewsALapsedRow;
            let retired = row.retired;
            if !(ours && live) || retired {
                return Some(false);
            }
            row.expires_at = match self.flaw {
                Flaw::RenewAddsToTheOldWindow => row.expires_at + ttl,
                Flaw::OverstatesTheLease => now + ttl - Duration::from_millis(60).min(ttl),
                _ => now + ttl,
            };
            Some(true)
        });
        self.ttls.lock().unwrap().insert(grant.name.clone(), ttl);
        Ok(renewed.unwrap_or(false))
    }

    async fn release(&self, grant: &GrantKey) -> Result<bool, BoxError> {
        if grant.access.is_some() {
            let released = self.inner.release(grant).await?;
            return Ok(released || self.flaw == Flaw::ReleaseAlwaysAnswersTrue);
        }
        if let Some(permit) = grant.permit {
            if self.flaw == Flaw::ReleaseAlwaysAnswersTrue {
                self.inner.release(grant).await?;
                return Ok(true);
            }
            if self.flaw != Flaw::PermitReleaseIgnoresTheFence {
                return self.inner.release(grant).await;
            }
            let key = (grant.name.clone(), permit.slot);
            return Ok(self.with_rows(|rows| {
                let ours = rows
                    .permits
                    .get(&key)
                    .is_some_and(|row| row.row.owner == grant.owner);
                if ours {
                    rows.permits.remove(&key);
                }
                ours
            }));
        }
        let now = Instant::now();
        let always = self.flaw == Flaw::ReleaseAlwaysAnswersTrue;
        Ok(always
            | self.with_rows(|rows| {
                let Some(row) = rows.rows.get(&grant.name) else {
                    return false;
                };
                let ours = row.owner == grant.owner
                    && (row.fence == grant.fence || self.flaw == Flaw::ReleaseIgnoresTheFence);
                if !ours || (self.flaw == Flaw::KeepsStaleRowsOnRelease && row.expires_at <= now) {
                    return false;
                }
                rows.rows.remove(&grant.name);
                true
            }))
    }

    async fn holder(&self, name: &str) -> Result<Option<Holder>, BoxError> {
        let now = Instant::now();
        let row = self.with_rows(|rows| rows.rows.get(name).cloned());
        let Some(row) = row else { return Ok(None) };
        if row.expires_at <= now && self.flaw != Flaw::ReportsExpiredHolders {
            return Ok(None);
        }
        let expires_in = match self.flaw {
            Flaw::HolderReportsTheTtl => self
                .ttls
                .lock()
                .unwrap()
                .get(name)
                .copied()
                .unwrap_or_default(),
            _ => row.expires_at.saturating_duration_since(now),
        };
        Ok(Some(Holder {
            owner: row.owner,
            fence: row.fence,
            expires_in,
        }))
    }

    async fn purge_expired(&self) -> Result<u64, BoxError> {
        let now = Instant::now();
        let purged = self.with_rows(|rows| {
            let before = rows.rows.len();
            if self.flaw == Flaw::PurgesLiveRows {
                rows.rows.clear();
            } else {
                rows.rows.retain(|_, row| row.expires_at > now);
            }
            (before - rows.rows.len()) as u64
        });
        Ok(if self.flaw == Flaw::PurgeCountsNothing {
            0
        } else {
            purged
        })
    }

    async fn list(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Listed>, BoxError> {
        if self.flaw == Flaw::ListsExpiredRows {
            let now = Instant::now();
            return Ok(self.with_rows(|rows| {
                let mut listed: Vec<Listed> = rows
                    .all_rows()
                    .filter(|(name, _, _, _)| {
                        name.starts_with(prefix) && after.is_none_or(|a| *name > a)
                    })
                    .map(|(name, row, permit, access)| Listed {
                        name: name.to_owned(),
                        holder: Holder {
                            owner: row.owner.clone(),
                            fence: row.fence,
                            expires_in: row.expires_at.saturating_duration_since(now),
                        },
                        permit,
                        access,
                    })
                    .collect();
                crate::reference::sort_listed(&mut listed);
                crate::reference::end_with_a_whole_name(&mut listed, limit);
                listed
            }));
        }
        self.inner.list(prefix, after, limit).await
    }

    async fn force_release(
        &self,
        name: &str,
        fence: Option<u64>,
    ) -> Result<Option<Holder>, BoxError> {
        let fence = match self.flaw {
            Flaw::ForcedReleaseIgnoresTheFence => None,
            _ => fence,
        };
        let removed = self.inner.force_release(name, fence).await?;
        if self.flaw == Flaw::ForcedReleaseRewindsTheFence {
            // As an engine that draws the next fence from the rows left
            // (max + 1) would: the removed grant's fence is handed out again.
            if let Some(holder) = &removed {
                self.with_rows(|rows| rows.last_fence = holder.fence - 1);
            }
        }
        Ok(removed)
    }

    async fn raise_fences(&self, by: u64) -> Result<u64, BoxError> {
        if self.flaw == Flaw::IgnoresTheFenceRaise {
            return Ok(self.with_rows(|rows| rows.last_fence + by + 1));
        }
        let next = self.inner.raise_fences(by).await?;
        if self.flaw == Flaw::RaiseKeepsLiveGrants {
            self.with_rows(|rows| {
                for row in rows.every_row_mut() {
                    row.retired = false;
                }
            });
        }
        Ok(next)
    }

    async fn close(&self) -> Result<(), BoxError> {
        self.inner.close().await
    }

    fn releases(&self) -> &ReleaseBus {
        self.inner.releases()
    }

    fn turn_poll_ceiling(&self) -> Duration {
        self.inner.turn_poll_ceiling()
    }

    fn poll_ceiling(&self) -> Duration {
        self.inner.poll_ceiling()
    }
}
