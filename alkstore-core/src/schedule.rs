//! Run a job at most once per slot of time across a fleet, over any [`Store`].
//!
//! Time is cut into **slots** of a fixed `period`, aligned to the Unix epoch
//! (plus an optional `offset`): slot `i` runs from `offset + i × period` to
//! the next. Every replica calls [`Schedule::run_once`] (or loops with
//! [`Schedule::run`]); the first to claim the slot runs the job, every other
//! replica is told the slot was claimed elsewhere.
//!
//! **Why it holds with skewed clocks.** Each replica reads its own clock to
//! know which slot it is in. The claim of slot `i` is a lock named
//! `"{job}/slot/{i}"`, held until the end of the slot *by the claimant's
//! clock* plus the declared bound on clock disagreement (`max_clock_skew`):
//! so it is still held when a replica whose clock is up to that bound behind
//! asks for the same slot. A replica runs the job only if its grant came back
//! while its own clock was still inside the slot; a grant that arrives later
//! might have come after the claim ran out, so it is not used. Together:
//! when no two replicas' clocks disagree by more than `max_clock_skew`, no
//! slot runs twice (the proof is in docs/schedule.md).
//!
//! **Crashes.** By default a claim is never given back: a run that crashes
//! half-way still holds its slot, and nobody runs that slot again. With
//! [`Schedule::retry_crashed_runs`] the claim is instead a lease of
//! `run_lease`, kept alive while the job runs: a crashed run's claim lapses
//! and another replica may run the slot again within it. Either way the slot
//! is held to its end once a run finishes — a run that ends early does not
//! let another replica run the same slot ("lock at least for" the slot).
//!
//! **Overlap.** A run that outlives its slot does not stop the next slot's
//! run ([`Overlap::Allowed`], the default). With [`Overlap::Skip`], a
//! job-wide lock (`"{job}/running"`, kept alive while a run lasts) makes a
//! slot whose turn comes while an earlier run is still going skip.
//!
//! **Fences.** The job gets its claim's fence ([`SlotRun::fence`]), to hand
//! to what it writes. Fences of one name only are comparable, and each slot
//! has its own name; with [`Overlap::Skip`] the running lock's fence
//! ([`SlotRun::running_fence`]) grows from run to run across slots.
//!
//! Claims of past slots expire on their own; [`Store::purge_expired`] removes
//! them (nothing here deletes rows by hand).
//!
//! ```
//! # async fn demo() -> alkstore_core::Result<()> {
//! # let store: Box<dyn alkstore_core::Store> = unimplemented!();
//! use std::time::Duration;
//! use alkstore_core::schedule::{Outcome, Schedule};
//!
//! let nightly = Schedule::every("reports/nightly", Duration::from_secs(24 * 3600))
//!     .unwrap()
//!     .max_clock_skew(Duration::from_secs(2))
//!     .unwrap();
//! match nightly.run_once(&*store, "reporter", |run| async move { run.fence }).await? {
//!     Outcome::Ran { output: fence, .. } => println!("ran with fence {fence}"),
//!     other => println!("not this replica's turn: {other:?}"),
//! }
//! # Ok(())
//! # }
//! ```

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};
use crate::keepalive::KeepAlive;
use crate::name::validate_name;
use crate::store::{Lock, Store};

/// Kept on top of every claim's hold, for engines that truncate their clock
/// to whole milliseconds (a lease can end up to 1 ms early).
const ROUNDING_MARGIN: Duration = Duration::from_millis(5);

/// The pause between two tries of holding a claim to its slot's end.
const HOLD_RETRY_PAUSE: Duration = Duration::from_millis(50);

/// The default lease of a running job's locks ([`Schedule::run_lease`]).
const DEFAULT_RUN_LEASE: Duration = Duration::from_secs(30);

/// What the clock of a schedule is: the system clock, or one a test sets.
type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// Whether a slot's run may start while an earlier run still goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Overlap {
    /// Each slot runs in its turn, whatever earlier runs still do.
    #[default]
    Allowed,
    /// A slot whose turn comes while an earlier run of the job still goes on
    /// is skipped ([`Outcome::PreviousRunStillRunning`]).
    Skip,
}

/// A schedule that cannot work; nothing was started.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScheduleError {
    /// The job name, or a slot name made from it, is not a valid lock name.
    #[error("the job name cannot name its slots: {0}")]
    JobName(String),
    /// A period of less than a millisecond.
    #[error("the period must be at least 1 ms")]
    PeriodTooShort,
    /// An offset not shorter than the period.
    #[error("the offset must be shorter than the period")]
    OffsetNotBelowPeriod,
    /// A duration too large to count in milliseconds.
    #[error("{0} is too large")]
    TooLarge(&'static str),
    /// A run lease too short to keep alive.
    #[error("the run lease must be at least 3 ms")]
    RunLeaseTooShort,
    /// A duration with a part of a millisecond: slots are counted in whole
    /// milliseconds, as the stores count leases.
    #[error("{0} must be a whole number of milliseconds")]
    NotWholeMillis(&'static str),
}

/// One slot of a schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Slot {
    /// Its number: slots since the epoch (plus the offset).
    pub index: u64,
    /// When it starts.
    pub start: SystemTime,
    /// When it ends (the next slot's start).
    pub end: SystemTime,
}

/// What the job of a slot is handed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotRun {
    /// The slot being run.
    pub slot: Slot,
    /// The fence of this run's claim of the slot, for what it writes.
    pub fence: u64,
    /// With [`Overlap::Skip`], the fence of the job-wide running lock, which
    /// grows from run to run.
    pub running_fence: Option<u64>,
}

/// How a call of [`Schedule::run_once`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome<T> {
    /// This replica ran the slot.
    Ran {
        /// The slot it ran.
        slot: Slot,
        /// Its claim's fence.
        fence: u64,
        /// What the job answered.
        output: T,
        /// Whether the claim still held when the run ended (always, unless
        /// [`Schedule::retry_crashed_runs`] is on and the claim was lost
        /// during the run: then another replica may have run the slot too).
        held_to_end: bool,
    },
    /// Another replica claimed the slot.
    ClaimedElsewhere {
        /// The slot.
        slot: Slot,
    },
    /// The claim came back after the slot had ended by this replica's clock,
    /// so it could not be trusted; the job did not run.
    TooLate {
        /// The slot.
        slot: Slot,
    },
    /// [`Overlap::Skip`]: an earlier run still goes on; the slot was skipped.
    PreviousRunStillRunning {
        /// The slot.
        slot: Slot,
    },
    /// [`Schedule::run`] only: `count` slots from `first` on began and ended
    /// while this replica was busy with an earlier slot (a run or a skip
    /// that outlasted them), or while its clock jumped forward over them;
    /// they were not tried, and another replica may have run them. One
    /// outcome for the whole stretch, however long.
    Missed {
        /// The first slot missed.
        first: Slot,
        /// How many slots in a row, from `first` on (at least 1).
        count: u64,
    },
}

/// A job run at most once per slot across every replica that shares a store.
#[derive(Clone)]
pub struct Schedule {
    job: String,
    period: Duration,
    offset: Duration,
    max_clock_skew: Duration,
    overlap: Overlap,
    retry: bool,
    run_lease: Duration,
    clock: Clock,
}

impl std::fmt::Debug for Schedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Schedule")
            .field("job", &self.job)
            .field("period", &self.period)
            .field("offset", &self.offset)
            .field("max_clock_skew", &self.max_clock_skew)
            .field("overlap", &self.overlap)
            .field("retry", &self.retry)
            .field("run_lease", &self.run_lease)
            .finish_non_exhaustive()
    }
}

/// Whole milliseconds of `d`, if it is a whole number of them and fits the
/// lock's lease arithmetic.
fn millis(d: Duration, what: &'static str) -> std::result::Result<u64, ScheduleError> {
    let ms = u64::try_from(d.as_millis())
        .ok()
        .filter(|ms| *ms <= crate::MAX_LEASE_MILLIS)
        .ok_or(ScheduleError::TooLarge(what))?;
    if d.subsec_nanos() % 1_000_000 != 0 {
        return Err(ScheduleError::NotWholeMillis(what));
    }
    Ok(ms)
}

/// Checks that the longest hold of a claim — a whole period, plus the skew
/// bound, plus the rounding margin — is a lease the stores accept.
fn check_longest_hold(period: Duration, skew: Duration) -> std::result::Result<(), ScheduleError> {
    let longest = period
        .checked_add(skew)
        .and_then(|d| d.checked_add(ROUNDING_MARGIN))
        .ok_or(ScheduleError::TooLarge(
            "the period plus the clock skew bound",
        ))?;
    millis(longest, "the period plus the clock skew bound").map(|_| ())
}

impl Schedule {
    /// A schedule of `job` with slots of `period`, aligned to the Unix
    /// epoch, no offset, no clock skew allowed for, overlapping runs allowed,
    /// and crashed runs not retried. Slot claims are named
    /// `"{job}/slot/{index}"`, so the job name follows the rules of lock
    /// names with room for that suffix.
    pub fn every(job: &str, period: Duration) -> std::result::Result<Self, ScheduleError> {
        for name in [job.to_owned(), slot_name(job, u64::MAX)] {
            validate_name(&name).map_err(|e| ScheduleError::JobName(e.to_string()))?;
        }
        if millis(period, "the period")? == 0 {
            return Err(ScheduleError::PeriodTooShort);
        }
        check_longest_hold(period, Duration::ZERO)?;
        Ok(Schedule {
            job: job.to_owned(),
            period,
            offset: Duration::ZERO,
            max_clock_skew: Duration::ZERO,
            overlap: Overlap::Allowed,
            retry: false,
            run_lease: DEFAULT_RUN_LEASE,
            clock: Arc::new(SystemTime::now),
        })
    }

    /// Slots start `offset` after each multiple of the period (the nightly
    /// job at 02:00 UTC: a day's period with a 2 h offset).
    pub fn offset(mut self, offset: Duration) -> std::result::Result<Self, ScheduleError> {
        millis(offset, "the offset")?;
        if offset >= self.period {
            return Err(ScheduleError::OffsetNotBelowPeriod);
        }
        self.offset = offset;
        Ok(self)
    }

    /// The most that the clocks of any two replicas may disagree by. A slot
    /// is held that much longer than its end, so that a replica whose clock
    /// is behind still finds it claimed. Clocks that disagree by more can
    /// run a slot twice.
    pub fn max_clock_skew(mut self, skew: Duration) -> std::result::Result<Self, ScheduleError> {
        millis(skew, "the clock skew bound")?;
        check_longest_hold(self.period, skew)?;
        self.max_clock_skew = skew;
        Ok(self)
    }

    /// Whether a slot may run while an earlier run still goes on.
    pub fn overlap(mut self, overlap: Overlap) -> Self {
        self.overlap = overlap;
        self
    }

    /// Lets another replica run a slot again, within the slot, when the run
    /// that claimed it crashed (its claim, kept alive while it runs, lapses
    /// after the run lease). Off by default: a crashed run's slot is not
    /// run again. With it on, a run cut off from the store for longer than
    /// the run lease can overlap a retry of its slot; the fences tell them
    /// apart.
    pub fn retry_crashed_runs(mut self) -> Self {
        self.retry = true;
        self
    }

    /// The lease of the locks a run holds while it runs (kept alive in the
    /// background): the job-wide lock of [`Overlap::Skip`], and with
    /// [`Schedule::retry_crashed_runs`] the claim itself. A crashed run's
    /// locks lapse this long after its last renewal. Default 30 s.
    pub fn run_lease(mut self, lease: Duration) -> std::result::Result<Self, ScheduleError> {
        if millis(lease, "the run lease")? < 3 {
            return Err(ScheduleError::RunLeaseTooShort);
        }
        self.run_lease = lease;
        Ok(self)
    }

    /// Reads time from `clock` instead of the system clock: for tests and
    /// simulations of replicas whose clocks disagree.
    pub fn clock(mut self, clock: impl Fn() -> SystemTime + Send + Sync + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The job's name.
    pub fn job(&self) -> &str {
        &self.job
    }

    /// The slot that holds `at`. A time before the epoch (plus the offset)
    /// falls in slot 0.
    pub fn slot_at(&self, at: SystemTime) -> Slot {
        let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
        let period = self.period.as_millis().max(1);
        let index = since.saturating_sub(self.offset).as_millis() / period;
        self.slot(u64::try_from(index).unwrap_or(u64::MAX))
    }

    /// Slot number `index`.
    fn slot(&self, index: u64) -> Slot {
        let start = self.slot_start(index);
        Slot {
            index,
            start,
            // Past the end of representable time there is no next slot.
            end: start.checked_add(self.period).unwrap_or(start),
        }
    }

    /// When slot `index` starts.
    fn slot_start(&self, index: u64) -> SystemTime {
        let period_ms = self.period.as_millis();
        let since = u64::try_from(u128::from(index) * period_ms).unwrap_or(u64::MAX);
        UNIX_EPOCH
            .checked_add(self.offset)
            .and_then(|t| t.checked_add(Duration::from_millis(since)))
            .unwrap_or(UNIX_EPOCH)
    }

    /// This replica's clock now (the system clock unless
    /// [`Schedule::clock`] set another).
    pub fn now(&self) -> SystemTime {
        (self.clock)()
    }

    /// The slot this replica's clock is in now.
    pub fn current_slot(&self) -> Slot {
        self.slot_at(self.now())
    }

    /// How long until the next slot starts, by this replica's clock.
    pub fn until_next_slot(&self) -> Duration {
        let now = self.now();
        self.slot_at(now)
            .end
            .duration_since(now)
            .unwrap_or_default()
    }

    /// The lock name of slot `index`'s claim.
    pub fn slot_name(&self, index: u64) -> String {
        slot_name(&self.job, index)
    }

    /// The lock name that [`Overlap::Skip`] holds while a run goes on.
    pub fn running_name(&self) -> String {
        format!("{}/running", self.job)
    }

    /// How long a claim made now must hold so that a replica whose clock is
    /// up to the skew bound behind still finds it: to the slot's end by this
    /// clock, plus the bound, plus the rounding margin.
    fn hold_for(&self, slot: &Slot, now: SystemTime) -> Duration {
        slot.end.duration_since(now).unwrap_or_default() + self.max_clock_skew + ROUNDING_MARGIN
    }

    /// Runs `job` if this replica is the one to run the current slot, and
    /// says what happened. `replica` is a label for this replica (a host or
    /// service name; may be empty): every claim gets an owner id of its own
    /// made from it ([`unique_owner`](crate::unique_owner)), so that no try
    /// ever counts as the same owner asking again for a claim it made
    /// before — which the store would grant again — whether in this process
    /// or in one restarted under the same label.
    ///
    /// The slot is claimed first; with [`Overlap::Skip`] the job-wide
    /// running lock is taken only then, so a slot is skipped only by the
    /// replica that won it, and nobody else runs it.
    ///
    /// Errors from the store end the call; a claim made before the error
    /// holds its slot as a crashed run's would. Dropping the returned future
    /// mid-run is a crash too.
    pub async fn run_once<F, Fut, T>(
        &self,
        store: &dyn Store,
        replica: &str,
        job: F,
    ) -> Result<Outcome<T>>
    where
        F: FnOnce(SlotRun) -> Fut,
        Fut: Future<Output = T>,
    {
        self.run_slot(store, replica, self.current_slot(), job)
            .await
    }

    /// [`Schedule::run_once`] of `slot`, which the caller read from this
    /// replica's clock.
    async fn run_slot<F, Fut, T>(
        &self,
        store: &dyn Store,
        replica: &str,
        slot: Slot,
        job: F,
    ) -> Result<Outcome<T>>
    where
        F: FnOnce(SlotRun) -> Fut,
        Fut: Future<Output = T>,
    {
        let owner = &crate::unique_owner(replica)?;
        let name = self.slot_name(slot.index);
        let ttl = if self.retry {
            self.run_lease
        } else {
            self.hold_for(&slot, self.now())
        };
        let Some(claim) = store.try_lock(&name, owner, ttl).await? else {
            return Ok(Outcome::ClaimedElsewhere { slot });
        };
        // The grant is trusted only if it came back inside the slot by this
        // clock: then it reached the store while every earlier claim of the
        // slot (held to the slot's end plus the skew bound by its
        // claimant's clock) still held.
        if self.now() >= slot.end {
            claim.let_lapse();
            return Ok(Outcome::TooLate { slot });
        }
        let running = match self.overlap {
            Overlap::Allowed => None,
            Overlap::Skip => {
                match self.take_running_lock(store, owner, &slot).await {
                    Ok(Some(lock)) => Some(KeepAlive::start(lock, self.run_lease)?),
                    Ok(None) => {
                        // Skipped for everyone: the claim holds the slot to
                        // its end (already so, unless it is a run lease).
                        if self.retry {
                            self.hold_to_end(&*claim, &slot).await;
                        }
                        claim.let_lapse();
                        return Ok(Outcome::PreviousRunStillRunning { slot });
                    }
                    Err(error) => {
                        claim.let_lapse();
                        return Err(error);
                    }
                }
            }
        };
        // A run lease (retries on) is not kept alive until the run starts:
        // if the running lock's round trip outlasted it, another replica
        // may hold the slot by now. And a run begins inside its slot only
        // (waiting out a crashed run's running lock can reach its end).
        if claim.valid_until() <= Instant::now() || self.now() >= slot.end {
            claim.let_lapse();
            if let Some(running) = running {
                let _ = running.release().await;
            }
            return Ok(Outcome::TooLate { slot });
        }
        let run = SlotRun {
            slot,
            fence: claim.fence(),
            running_fence: running.as_ref().map(|kept| kept.lock().fence()),
        };
        let outcome = self.run_claimed(claim, run, job).await;
        if let Some(running) = running {
            // Freed at once for the next slot; if this fails, it lapses.
            if let Err(error) = running.release().await {
                tracing::warn!(%error, job = %self.job, "could not release the running lock");
            }
        }
        outcome
    }

    /// [`Overlap::Skip`]: takes the job-wide running lock for a run of
    /// `slot`, under an owner that names the slot. With retries on, a lock
    /// held by a run of this very slot is a crashed run's (its claim lapsed,
    /// or this one would not have been granted) whose lease was renewed
    /// apart from its claim's and can outlive it by a renewal: waited out
    /// (within the slot) rather than taken for a run still going on, which
    /// would skip the slot the retry is for.
    async fn take_running_lock(
        &self,
        store: &dyn Store,
        owner: &str,
        slot: &Slot,
    ) -> Result<Option<Box<dyn Lock>>> {
        let tag = running_tag(slot.index);
        // An owner too long to tag runs untagged: never recognised, skipped.
        let tagged = format!("{tag}{owner}");
        let owner = if crate::validate_owner(&tagged).is_ok() {
            tagged.as_str()
        } else {
            owner
        };
        let name = self.running_name();
        if let Some(lock) = store.try_lock(&name, owner, self.run_lease).await? {
            return Ok(Some(lock));
        }
        if !self.retry {
            return Ok(None);
        }
        let Some(holder) = store.holder(&name).await? else {
            // Gone since: one more try.
            return store.try_lock(&name, owner, self.run_lease).await;
        };
        if !holder.owner.starts_with(&tag) {
            return Ok(None);
        }
        let left_in_slot = slot.end.duration_since(self.now()).unwrap_or_default();
        let wait = (holder.expires_in + ROUNDING_MARGIN).min(left_in_slot);
        store.lock(&name, owner, self.run_lease, wait).await
    }

    /// Runs the job of a trusted claim, and holds the slot to its end.
    async fn run_claimed<F, Fut, T>(
        &self,
        claim: Box<dyn Lock>,
        run: SlotRun,
        job: F,
    ) -> Result<Outcome<T>>
    where
        F: FnOnce(SlotRun) -> Fut,
        Fut: Future<Output = T>,
    {
        let (slot, fence) = (run.slot, run.fence);
        if !self.retry {
            // Already held to the slot's end plus the bound.
            claim.let_lapse();
            let output = job(run).await;
            return Ok(Outcome::Ran {
                slot,
                fence,
                output,
                held_to_end: true,
            });
        }
        let kept = KeepAlive::start(claim, self.run_lease)?;
        let output = job(run).await;
        // Hold the slot to its end now that the run is over. `stop` waits
        // for a renewal on its way, so none lands after the hold below and
        // shortens it.
        let held_to_end = match kept.stop().await {
            Ok(claim) => {
                let held = self.hold_to_end(&*claim, &slot).await;
                claim.let_lapse();
                held
            }
            Err(reason) => {
                tracing::warn!(job = %self.job, slot = slot.index, fence, ?reason, "the claim was lost during the run");
                false
            }
        };
        Ok(Outcome::Ran {
            slot,
            fence,
            output,
            held_to_end,
        })
    }

    /// Claims `slot` without running it, held to its end plus the skew
    /// bound, so that no replica runs it late: a slot skipped because its
    /// turn came during a run.
    async fn skip_slot<T>(
        &self,
        store: &dyn Store,
        replica: &str,
        slot: Slot,
    ) -> Result<Outcome<T>> {
        let owner = crate::unique_owner(replica)?;
        let ttl = self.hold_for(&slot, self.now());
        let Some(claim) = store
            .try_lock(&self.slot_name(slot.index), &owner, ttl)
            .await?
        else {
            return Ok(Outcome::ClaimedElsewhere { slot });
        };
        claim.let_lapse();
        Ok(Outcome::PreviousRunStillRunning { slot })
    }

    /// Renews `claim` to the slot's end plus the skew bound; an error is
    /// tried again while the claim is still valid, and no try waits past
    /// that. Whether it holds.
    async fn hold_to_end(&self, claim: &dyn Lock, slot: &Slot) -> bool {
        loop {
            let hold = claim.renew(self.hold_for(slot, self.now()));
            let Ok(answer) = tokio::time::timeout_at(claim.valid_until().into(), hold).await else {
                tracing::warn!(job = %self.job, slot = slot.index, "holding the claim to the slot's end took longer than the claim");
                return false;
            };
            match answer {
                Ok(held) => {
                    if !held {
                        tracing::warn!(job = %self.job, slot = slot.index, fence = claim.fence(), "the claim was lost before it could be held to the slot's end");
                    }
                    return held;
                }
                Err(error) if claim.valid_until() > Instant::now() + HOLD_RETRY_PAUSE => {
                    tracing::warn!(%error, job = %self.job, slot = slot.index, "holding the claim to the slot's end failed; retrying");
                    tokio::time::sleep(HOLD_RETRY_PAUSE).await;
                }
                Err(error) => {
                    tracing::warn!(%error, job = %self.job, slot = slot.index, "could not hold the claim to the slot's end");
                    return false;
                }
            }
        }
    }

    /// Runs the job slot after slot, forever, and hands every outcome to
    /// `on_outcome`: tries each slot at its start (by this replica's clock),
    /// and at once if a run outlasted its slot and the next one has begun —
    /// with [`Overlap::Skip`] that slot is skipped instead (its turn came
    /// during the run): claimed without running, so that no replica runs it
    /// late, and reported as [`Outcome::PreviousRunStillRunning`] (or
    /// [`Outcome::ClaimedElsewhere`] if another replica had it).
    /// A slot is never tried again once this loop has had its outcome (a
    /// clock stepped back does not bring it round again) — except that
    /// with [`Schedule::retry_crashed_runs`], a slot claimed elsewhere is
    /// tried again every half run lease until it ends, so that a crashed
    /// run's slot is picked up. Returns only on a store error.
    pub async fn run<F, Fut, T>(
        &self,
        store: &dyn Store,
        replica: &str,
        mut job: F,
        mut on_outcome: impl FnMut(&Outcome<T>),
    ) -> Result<std::convert::Infallible>
    where
        F: FnMut(SlotRun) -> Fut,
        Fut: Future<Output = T>,
    {
        // The last slot whose outcome is final for this loop, and the last
        // with any outcome reported; neither is ever lowered.
        let mut done: Option<u64> = None;
        let mut reported: Option<u64> = None;
        loop {
            let slot = self.current_slot();
            if done.is_some_and(|done| slot.index <= done) {
                tokio::time::sleep(self.until_next_slot() + Duration::from_millis(1)).await;
                continue;
            }
            self.report_missed(reported, slot.index, &mut on_outcome);
            let outcome = self.run_slot(store, replica, slot, &mut job).await?;
            on_outcome(&outcome);
            reported = reported.max(Some(slot.index));
            if self.retry && matches!(outcome, Outcome::ClaimedElsewhere { .. }) {
                // Tried again every half run lease until the slot ends.
                let nap = self.until_next_slot().min(self.run_lease / 2);
                tokio::time::sleep(nap + Duration::from_millis(1)).await;
                continue;
            }
            done = done.max(Some(slot.index));
            let now = self.current_slot();
            // The run outlasted its slot. The slot that began meanwhile is
            // due now (the loop goes round without sleeping) — unless runs
            // must not overlap: its turn came during the run, so it is
            // skipped, for every replica.
            if now.index > slot.index
                && self.overlap == Overlap::Skip
                && matches!(outcome, Outcome::Ran { .. })
            {
                self.report_missed(reported, now.index, &mut on_outcome);
                on_outcome(&self.skip_slot(store, replica, now).await?);
                done = done.max(Some(now.index));
                reported = reported.max(Some(now.index));
            }
        }
    }

    /// Reports the slots after `reported` and before `next`, if any, as one
    /// [`Outcome::Missed`]: they began and ended without being tried.
    fn report_missed<T>(
        &self,
        reported: Option<u64>,
        next: u64,
        on_outcome: &mut impl FnMut(&Outcome<T>),
    ) {
        let Some(first) = reported.and_then(|r| r.checked_add(1)) else {
            return;
        };
        if first < next {
            on_outcome(&Outcome::Missed {
                first: self.slot(first),
                count: next - first,
            });
        }
    }
}

impl<T> Outcome<T> {
    /// The slot the outcome is about.
    pub fn slot(&self) -> Slot {
        match self {
            Outcome::Ran { slot, .. }
            | Outcome::ClaimedElsewhere { slot }
            | Outcome::TooLate { slot }
            | Outcome::PreviousRunStillRunning { slot }
            | Outcome::Missed { first: slot, .. } => *slot,
        }
    }
}

/// How the owner of the running lock of a run of slot `index` begins.
fn running_tag(index: u64) -> String {
    format!("slot {index} ")
}

/// The lock name of slot `index` of `job`.
fn slot_name(job: &str, index: u64) -> String {
    format!("{job}/slot/{index}")
}

impl From<ScheduleError> for Error {
    fn from(error: ScheduleError) -> Self {
        Error::database("schedule", error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_aligned_to_the_epoch_plus_the_offset() {
        let hourly = Schedule::every("j", Duration::from_secs(3600))
            .unwrap()
            .offset(Duration::from_secs(60))
            .unwrap();
        let at = UNIX_EPOCH + Duration::from_secs(10 * 3600 + 59);
        let slot = hourly.slot_at(at);
        assert_eq!(slot.index, 9);
        assert_eq!(slot.start, UNIX_EPOCH + Duration::from_secs(9 * 3600 + 60));
        assert_eq!(slot.end, UNIX_EPOCH + Duration::from_secs(10 * 3600 + 60));
        let next = hourly.slot_at(UNIX_EPOCH + Duration::from_secs(10 * 3600 + 60));
        assert_eq!(next.index, 10);
        assert_eq!(hourly.slot_name(10), "j/slot/10");
    }

    #[test]
    fn a_long_stretch_of_missed_slots_is_one_outcome() {
        let s = Schedule::every("j", Duration::from_millis(1)).unwrap();
        let mut outcomes: Vec<Outcome<()>> = Vec::new();
        // A clock that jumps a day forward over 1 ms slots.
        s.report_missed(Some(7), 7 + 86_400_000, &mut |o| outcomes.push(o.clone()));
        assert_eq!(
            outcomes,
            [Outcome::Missed {
                first: s.slot(8),
                count: 86_399_999
            }]
        );
        outcomes.clear();
        s.report_missed(Some(7), 8, &mut |o| outcomes.push(o.clone()));
        s.report_missed(None, 8, &mut |o| outcomes.push(o.clone()));
        s.report_missed(Some(u64::MAX), 8, &mut |o| outcomes.push(o.clone()));
        assert!(outcomes.is_empty(), "{outcomes:?}");
    }

    #[test]
    fn a_claim_holds_to_the_slot_end_plus_the_skew() {
        let s = Schedule::every("j", Duration::from_secs(10))
            .unwrap()
            .max_clock_skew(Duration::from_secs(2))
            .unwrap();
        let slot = s.slot_at(UNIX_EPOCH + Duration::from_secs(20));
        let now = UNIX_EPOCH + Duration::from_secs(23);
        assert_eq!(
            s.hold_for(&slot, now),
            Duration::from_secs(9) + ROUNDING_MARGIN
        );
    }

    #[test]
    fn bad_schedules_are_refused() {
        assert_eq!(
            Schedule::every("j", Duration::ZERO).unwrap_err(),
            ScheduleError::PeriodTooShort
        );
        assert_eq!(
            Schedule::every("j", Duration::from_micros(1500)).unwrap_err(),
            ScheduleError::NotWholeMillis("the period")
        );
        let longest = Duration::from_millis(crate::MAX_LEASE_MILLIS);
        assert!(matches!(
            Schedule::every("j", longest),
            Err(ScheduleError::TooLarge(_))
        ));
        let day = Schedule::every("j", Duration::from_secs(86_400)).unwrap();
        assert!(matches!(
            day.clone()
                .max_clock_skew(longest - Duration::from_secs(86_400)),
            Err(ScheduleError::TooLarge(_))
        ));
        assert_eq!(
            day.clone().offset(Duration::from_micros(10)).unwrap_err(),
            ScheduleError::NotWholeMillis("the offset")
        );
        assert_eq!(
            day.max_clock_skew(Duration::from_nanos(1)).unwrap_err(),
            ScheduleError::NotWholeMillis("the clock skew bound")
        );
        assert!(matches!(
            Schedule::every("", Duration::from_secs(1)),
            Err(ScheduleError::JobName(_))
        ));
        assert!(matches!(
            Schedule::every(&"x".repeat(240), Duration::from_secs(1)),
            Err(ScheduleError::JobName(_))
        ));
        assert!(matches!(
            Schedule::every("j", Duration::MAX),
            Err(ScheduleError::TooLarge(_))
        ));
        let s = Schedule::every("j", Duration::from_secs(1)).unwrap();
        assert_eq!(
            s.clone().offset(Duration::from_secs(1)).unwrap_err(),
            ScheduleError::OffsetNotBelowPeriod
        );
        assert_eq!(
            s.run_lease(Duration::from_millis(2)).unwrap_err(),
            ScheduleError::RunLeaseTooShort
        );
    }
}
