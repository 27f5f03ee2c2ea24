//! Keep-alive: renews a held lock in the background, and tells the holder at
//! once when the lease cannot be kept.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use crate::duration::LeaseMillis;
use crate::error::{Error, Result};
use crate::store::Lock;

/// The pause between retries after a failed renewal.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// The longest a keep-alive goes without looking at its lock's deadline,
/// when the lock gives no signal of its lowering
/// ([`Lock::valid_until_lowered`]).
const WATCH_CEILING: Duration = Duration::from_millis(100);

/// The shortest pause between two looks (a zero margin would spin).
const WATCH_FLOOR: Duration = Duration::from_millis(5);

/// Why a kept lease was lost.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LostReason {
    /// A renewal answered `false`: the grant is gone (taken over, purged, or lapsed).
    #[error("the lease was revoked: a renewal found the grant gone")]
    Revoked,
    /// No renewal succeeded in time; the last error, if any, says why.
    #[error(
        "the lease could not be renewed in time{}",
        last_error.as_ref().map(|e| format!(" (last error: {e})")).unwrap_or_default()
    )]
    NotRenewedInTime {
        /// The last renewal error, as text.
        last_error: Option<String>,
    },
}

/// What a keep-alive knows about its lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseStatus {
    /// Held, certainly valid until `valid_until`.
    Held {
        /// The conservative local deadline of the lease.
        valid_until: Instant,
    },
    /// Lost: stop the work the lock protects. Signalled no later than
    /// `valid_until - margin` of the last successful grant or renewal.
    Lost(LostReason),
}

/// Keep-alive options that could not keep a lease; found in the source chain
/// of the [`Error::Database`] that [`KeepAlive::with_options`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeepAliveOptionsError {
    /// A zero interval would renew in a tight loop.
    #[error("the keep-alive interval is zero")]
    ZeroInterval,
    /// The lease would lapse between two renewals.
    #[error("the keep-alive interval is not shorter than the ttl")]
    IntervalNotBelowTtl,
    /// The loss would be signalled before the first renewal could happen.
    #[error("the keep-alive margin is not shorter than the ttl")]
    MarginNotBelowTtl,
}

/// How a [`KeepAlive`] renews.
#[derive(Debug, Clone, Copy)]
pub struct KeepAliveOptions {
    /// The lease each renewal asks for.
    pub ttl: Duration,
    /// Time between renewals (default: `ttl / 3`). The first renewal comes
    /// sooner, at a random point from a quarter of it on.
    pub interval: Duration,
    /// How long before `valid_until` the keep-alive gives up and signals
    /// [`LeaseStatus::Lost`] when renewals keep failing (default: `ttl / 10`),
    /// so the holder hears of the loss while the lease is still valid.
    pub margin: Duration,
}

impl KeepAliveOptions {
    /// Defaults for a lease of `ttl`: renew every `ttl / 3`, give up `ttl / 10`
    /// before the lease ends.
    pub fn new(ttl: Duration) -> Self {
        KeepAliveOptions {
            ttl,
            interval: ttl / 3,
            margin: ttl / 10,
        }
    }
}

/// A held lock renewed in the background.
///
/// Renewals run every `interval`, the first at a random point between a
/// quarter of the interval and the interval (so that leases taken together
/// do not all renew together); a failed renewal is retried until it
/// succeeds or the lease is about to end. The holder hears of a loss through
/// [`KeepAlive::lost`] or [`KeepAlive::status`] before the conservative
/// `valid_until` passes: a renewal that answered `false` is reported at once,
/// and errors that kept every retry from succeeding are reported `margin`
/// before the lease ends (or a quarter of the lease left, if less). Renewals
/// start in time for the lease actually left, even one taken with a shorter
/// ttl. A renewal answered too late for its own lease counts as lost; a
/// lease the handle already knows to be over (a twin handle released it)
/// gets one last renewal, whose answer gives the reason.
/// When renewals could not keep the lease (`NotRenewedInTime`), the
/// keep-alive releases the grant right after it signals the loss, so that
/// the name frees at once even if the renewal it gave up on lands later.
/// [`KeepAlive::release`] stops the renewals and releases; dropping the
/// keep-alive stops them and leaves the lease to lapse (a renewal in flight
/// at that moment may still land, so allow up to one more `ttl`).
///
/// ```
/// use std::time::Duration;
/// use alkstore_core::{KeepAlive, Store};
/// # async fn demo(store: &dyn Store) -> alkstore_core::Result<()> {
/// if let Some(lock) = store.try_lock("leader", "replica-1", Duration::from_secs(10)).await? {
///     let kept = KeepAlive::start(lock, Duration::from_secs(10))?;
///     tokio::select! {
///         reason = kept.lost() => eprintln!("leadership lost: {reason:?}"),
///         _ = tokio::time::sleep(Duration::from_secs(1)) => { kept.release().await?; }
///     }
/// }
/// # Ok(())
/// # }
/// ```
#[must_use = "dropping a KeepAlive stops the renewals"]
#[derive(Debug)]
pub struct KeepAlive {
    /// `None` only inside `release`, which consumes the keep-alive.
    lock: Option<Arc<Box<dyn Lock>>>,
    status: watch::Receiver<LeaseStatus>,
    /// `None` once `release` took it.
    task: Option<JoinHandle<()>>,
    /// Asks the renewal task to end between renewals ([`KeepAlive::stop`]).
    stop: Arc<Notify>,
}

impl KeepAlive {
    /// Starts renewing `lock` with a lease of `ttl` and the default options.
    /// A `ttl` the duration guard refuses is an error, and so is calling it
    /// outside a tokio runtime.
    pub fn start(lock: Box<dyn Lock>, ttl: Duration) -> Result<Self> {
        Self::with_options(lock, KeepAliveOptions::new(ttl))
    }

    /// Starts renewing `lock` as `options` say. Refused (nothing started):
    /// a `ttl` the duration guard refuses ([`DurationError`](crate::DurationError)),
    /// or an interval or margin that could not keep the lease
    /// ([`KeepAliveOptionsError`]).
    pub fn with_options(lock: Box<dyn Lock>, options: KeepAliveOptions) -> Result<Self> {
        LeaseMillis::new(options.ttl).map_err(|e| Error::database("keep_alive", e))?;
        let problem = if options.interval.is_zero() {
            Some(KeepAliveOptionsError::ZeroInterval)
        } else if options.interval >= options.ttl {
            Some(KeepAliveOptionsError::IntervalNotBelowTtl)
        } else if options.margin >= options.ttl {
            Some(KeepAliveOptionsError::MarginNotBelowTtl)
        } else {
            None
        };
        if let Some(problem) = problem {
            return Err(Error::database("keep_alive", problem));
        }
        let lock: Arc<Box<dyn Lock>> = Arc::new(lock);
        let (tx, status) = watch::channel(LeaseStatus::Held {
            valid_until: lock.valid_until(),
        });
        let runtime =
            tokio::runtime::Handle::try_current().map_err(|e| Error::database("keep_alive", e))?;
        let stop = Arc::new(Notify::new());
        let task = runtime.spawn(keep(lock.clone(), options, tx, stop.clone()));
        Ok(KeepAlive {
            lock: Some(lock),
            status,
            task: Some(task),
            stop,
        })
    }

    /// The lock being kept.
    pub fn lock(&self) -> &dyn Lock {
        self.lock
            .as_deref()
            .map(|lock| lock.as_ref())
            .expect("present until release")
    }

    /// The lease status now. A `Held` deadline is never later than the
    /// lock's own `valid_until`, which can come down between renewals.
    pub fn status(&self) -> LeaseStatus {
        match self.status.borrow().clone() {
            LeaseStatus::Held { valid_until } => LeaseStatus::Held {
                valid_until: valid_until.min(self.lock().valid_until()),
            },
            lost => lost,
        }
    }

    /// A receiver that sees every change of status. A `Held` deadline in it
    /// is the one of the last renewal; the lock's own `valid_until` (and
    /// [`KeepAlive::status`]) can be lower between renewals.
    pub fn watch(&self) -> watch::Receiver<LeaseStatus> {
        self.status.clone()
    }

    /// Resolves when the lease is lost, with the reason.
    pub async fn lost(&self) -> LostReason {
        let mut status = self.status.clone();
        loop {
            if let LeaseStatus::Lost(reason) = &*status.borrow_and_update() {
                return reason.clone();
            }
            if status.changed().await.is_err() {
                // The task ended without a verdict (cancelled): treat as lost.
                return LostReason::NotRenewedInTime { last_error: None };
            }
        }
    }

    /// Stops the renewals and hands the lock back, its lease as the last
    /// renewal left it: for a holder that goes on without renewals (renews
    /// once more itself, lets the lease lapse on purpose, releases later).
    ///
    /// A renewal in flight is waited for, not cut off: once this returns the
    /// lock, no renewal of the keep-alive can still land and overwrite what
    /// the holder does next with it (a longer or shorter lease). If the
    /// lease was lost before the renewals stopped, the answer is why, and
    /// there is no lock to go on with: after `NotRenewedInTime` the
    /// keep-alive has made its one attempt to release the grant, and the
    /// renewal it gave up on may still land — if that release failed too,
    /// the grant can outlive the loss by up to one `ttl`.
    pub async fn stop(mut self) -> std::result::Result<Box<dyn Lock>, LostReason> {
        if let Some(task) = self.task.take() {
            self.stop.notify_one();
            if task.await.is_err() {
                return Err(LostReason::NotRenewedInTime {
                    last_error: Some("the renewal task ended abnormally".to_owned()),
                });
            }
        }
        if let LeaseStatus::Lost(reason) = &*self.status.borrow() {
            return Err(reason.clone());
        }
        let lock = self.lock.take().expect("present until release");
        // The task has ended without a loss: its reference to the lock is gone.
        Arc::try_unwrap(lock).map_err(|_| LostReason::NotRenewedInTime {
            last_error: Some("the renewal task still held the lock".to_owned()),
        })
    }

    /// Stops the renewals, then releases the lock (see [`Lock::release`]).
    /// After a loss the keep-alive already released it (or the lease is
    /// gone), and this answers `false`.
    pub async fn release(mut self) -> Result<bool> {
        if let Some(task) = self.task.take() {
            task.abort();
            // The task is gone; a renewal it had sent may still be on its
            // way (renewals run to their answer), which the release below
            // outlasts: a renewal landing after it finds no row.
            let _ = task.await;
        }
        let lock = self.lock.take().expect("present until release");
        lock.release_shared().await
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// When to renew next and when to give up, from the lease as it stands at
/// the start of a cycle: renew after `interval`, or halfway to the give-up
/// point if the lease left is shorter (a lease taken with a shorter ttl than
/// the keep-alive's); give up `margin` before `valid_until`, or a quarter of
/// the lease left if that is less.
fn schedule(
    valid_until: Instant,
    last: Instant,
    now: Instant,
    options: &KeepAliveOptions,
) -> (Instant, Instant) {
    let give_up = give_up_point(valid_until, now, options);
    let halfway = now + give_up.saturating_duration_since(now) / 2;
    let next = last.checked_add(options.interval).unwrap_or(halfway);
    (next.min(halfway), give_up)
}

/// When to give up on renewing a lease certainly valid until
/// `valid_until`: the margin before it, or a quarter of the lease left if
/// that is less.
fn give_up_point(valid_until: Instant, now: Instant, options: &KeepAliveOptions) -> Instant {
    let left = valid_until.saturating_duration_since(now);
    valid_until - margin_within(options, left)
}

/// When to count the first cycle from: up to three quarters of an interval
/// before `now`, at random, so that the first renewal comes somewhere
/// between a quarter of the interval and the interval. Leases taken
/// together (10 000 at a service's start) then renew spread over most of
/// an interval rather than all at once, every interval, against the
/// database; each renews every `interval` after its first. Earlier is
/// always safe: a renewal only extends. A lease held for less than a
/// quarter of the interval is never renewed.
fn spread_first_renewal(now: Instant, options: &KeepAliveOptions) -> Instant {
    let random = getrandom::u64().unwrap_or(0);
    let fraction = (random >> 11) as f64 / (1u64 << 53) as f64;
    now.checked_sub(options.interval.mul_f64(0.75 * fraction))
        .unwrap_or(now)
}

/// The margin to keep before the end of a lease of `span`: the configured
/// one, or a quarter of the lease if that is less (a lease shorter than the
/// keep-alive expects still gets renewed before it ends).
fn margin_within(options: &KeepAliveOptions, span: Duration) -> Duration {
    options.margin.min(span / 4)
}

/// The renewal task: wait until a renewal is due, renew (retrying until
/// renewed, revoked or too late), and on a loss report it and let go.
async fn keep(
    lock: Arc<Box<dyn Lock>>,
    options: KeepAliveOptions,
    status: watch::Sender<LeaseStatus>,
    stop: Arc<Notify>,
) {
    let keeper = Keeper::new(lock, options, status, stop);
    let mut last = spread_first_renewal(Instant::now(), &options);
    loop {
        let Some(give_up) = keeper.wait_until_due(last).await else {
            return;
        };
        match keeper.renew_until_given_up(give_up).await {
            Renewal::Renewed => last = Instant::now(),
            Renewal::Stopped => return,
            Renewal::Lost(reason) => return keeper.give_up(reason),
        }
    }
}

/// How one cycle's renewal ended.
enum Renewal {
    /// The lease was extended; the status says until when.
    Renewed,
    /// [`KeepAlive::stop`] (or a drop) asked the task to end.
    Stopped,
    /// Revoked, or not renewed before the give-up point.
    Lost(LostReason),
}

/// What one renewal attempt's answer, or its failure, means.
enum Answer {
    /// The verdict of the cycle.
    Final(Renewal),
    /// A transient failure: retry, if there is time.
    Failed(Error),
}

/// The state of one keep-alive task.
struct Keeper {
    lock: Arc<Box<dyn Lock>>,
    options: KeepAliveOptions,
    status: watch::Sender<LeaseStatus>,
    stop: Arc<Notify>,
    /// The margin kept before the end of a renewal's own lease.
    margin: Duration,
    /// A renewal's own lease ends `ttl` after it is sent: an answer later
    /// than this much after sending comes too late to be of use.
    useful_for: Duration,
    /// How often the deadline is looked at between renewals, for a lock
    /// that does not signal its lowering: it can come down meanwhile (a
    /// renewal with a shorter ttl through `lock()`, a twin handle's
    /// release), and then the next renewal is due sooner.
    watch: Duration,
}

impl Keeper {
    fn new(
        lock: Arc<Box<dyn Lock>>,
        options: KeepAliveOptions,
        status: watch::Sender<LeaseStatus>,
        stop: Arc<Notify>,
    ) -> Self {
        let margin = margin_within(&options, options.ttl);
        Keeper {
            useful_for: options.ttl - margin,
            watch: (options.margin / 2).clamp(WATCH_FLOOR, WATCH_CEILING),
            margin,
            lock,
            options,
            status,
            stop,
        }
    }

    /// Sleeps until `until`, or until asked to stop (then `true`). A stop is
    /// heard only here: never while a renewal is on its way.
    async fn stopped_before(&self, until: Instant) -> bool {
        tokio::select! {
            biased;
            () = self.stop.notified() => true,
            () = tokio::time::sleep_until(until.into()) => false,
        }
    }

    /// Waits until the next renewal is due (the last one was at `last`) and
    /// answers when to give up on it; `None` when asked to stop. Due times
    /// only ever move earlier while waiting: recomputed from a later `now`,
    /// "halfway to giving up" would keep sliding later.
    ///
    /// A lock that signals its deadline coming down
    /// ([`Lock::valid_until_lowered`]) is looked at again when it does;
    /// any other every `watch`.
    async fn wait_until_due(&self, last: Instant) -> Option<Instant> {
        let signal = self.lock.valid_until_lowered();
        let (mut due, mut give_up) = (None::<Instant>, None::<Instant>);
        loop {
            // Listening before the deadline is read: a lowering after the
            // read wakes this wait, one before it is in the read.
            let lowered = signal.as_ref().map(|signal| signal.notified());
            tokio::pin!(lowered);
            if let Some(lowered) = lowered.as_mut().as_pin_mut() {
                lowered.enable();
            }
            let now = Instant::now();
            let (next, until) = schedule(self.lock.valid_until(), last, now, &self.options);
            let (next, until) = (
                due.map_or(next, |d| d.min(next)),
                give_up.map_or(until, |g| g.min(until)),
            );
            (due, give_up) = (Some(next), Some(until));
            if next <= now {
                return Some(until);
            }
            let look = match signal {
                Some(_) => next,
                None => next.min(now + self.watch),
            };
            let signalled = async {
                match lowered.as_mut().as_pin_mut() {
                    Some(lowered) => lowered.await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                () = self.stop.notified() => return None,
                () = tokio::time::sleep_until(look.into()) => {}
                () = signalled => {}
            }
        }
    }

    /// Renews, retrying transient failures after [`RETRY_PAUSE`] while
    /// there is time before `give_up`.
    async fn renew_until_given_up(&self, mut give_up: Instant) -> Renewal {
        let mut last_error = None;
        loop {
            // The deadline may have come down since (a renewal through
            // `lock()` with a shorter ttl, a twin handle's release): give up
            // by its margin, not the old one's. One already over gets one
            // last renewal, whose answer says why (`renew_once`).
            let lowered = give_up_point(self.lock.valid_until(), Instant::now(), &self.options);
            give_up = give_up.min(lowered);
            let error = match self.renew_once(give_up, &last_error).await {
                Answer::Final(renewal) => return renewal,
                Answer::Failed(error) => error,
            };
            tracing::warn!(name = self.lock.name(), fence = self.lock.fence(), %error, "keep-alive: renewal failed; retrying");
            last_error = Some(error_chain(&error));
            let pause = Instant::now() + RETRY_PAUSE;
            if pause >= give_up {
                return Renewal::Lost(LostReason::NotRenewedInTime { last_error });
            }
            if self.stopped_before(pause).await {
                return Renewal::Stopped;
            }
        }
    }

    /// One renewal, bounded by its own lease's usefulness and by `give_up`.
    async fn renew_once(&self, give_up: Instant, last_error: &Option<String>) -> Answer {
        let too_late = || {
            Answer::Final(Renewal::Lost(LostReason::NotRenewedInTime {
                last_error: last_error.clone(),
            }))
        };
        let sent = Instant::now();
        let own = sent.checked_add(self.useful_for).unwrap_or(give_up);
        // A lease this handle already knows to be over (a twin handle
        // released it, or an unanswered renewal brought its deadline
        // down) gets one last renewal, whose answer says why.
        let deadline = if give_up > sent {
            own.min(give_up)
        } else {
            own
        };
        let renewal = self.lock.renew(self.options.ttl);
        match tokio::time::timeout_at(deadline.into(), renewal).await {
            Ok(Ok(true)) => {
                let valid_until = self.lock.valid_until();
                // Renewed, but the grant had already ended before this
                // renewal was sent (a twin handle's release, which the
                // renewal overtook on its way): taken away.
                if valid_until <= sent {
                    return Answer::Final(Renewal::Lost(LostReason::Revoked));
                }
                // Renewed, but so late that the new lease is (nearly) over.
                if valid_until <= Instant::now() + self.margin {
                    return too_late();
                }
                let _ = self.status.send(LeaseStatus::Held { valid_until });
                Answer::Final(Renewal::Renewed)
            }
            Ok(Ok(false)) => {
                tracing::warn!(
                    name = self.lock.name(),
                    fence = self.lock.fence(),
                    "keep-alive: lease lost"
                );
                Answer::Final(Renewal::Lost(LostReason::Revoked))
            }
            Ok(Err(error)) => Answer::Failed(error),
            Err(_) => too_late(),
        }
    }

    /// Reports the loss; a lease given up on is released in the background.
    fn give_up(self, reason: LostReason) {
        let given_up = matches!(reason, LostReason::NotRenewedInTime { .. });
        let label = if given_up {
            "not_renewed_in_time"
        } else {
            "revoked"
        };
        crate::metrics::count(crate::metrics::KEEPALIVE_LOST_TOTAL, &[("reason", label)]);
        if given_up {
            tracing::warn!(
                name = self.lock.name(),
                fence = self.lock.fence(),
                "keep-alive: not renewed in time"
            );
        }
        let _ = self.status.send(LeaseStatus::Lost(reason));
        if given_up {
            // Detached: dropping the keep-alive (the usual answer to
            // `lost()`) must not cut the release short.
            tokio::spawn(release_given_up(self.lock, self.options.ttl));
        }
    }
}

/// The holder was told the lease is lost, but the renewal given up on may
/// still be on its way and land: release the grant, so that the name frees
/// now rather than one ttl later (a release only ever removes this grant's
/// own row, and a renewal landing after it finds nothing to extend). One
/// attempt, bounded by one lease: if storage is down, the lease lapses.
async fn release_given_up(lock: Arc<Box<dyn Lock>>, ttl: Duration) {
    match tokio::time::timeout(ttl, lock.release_shared()).await {
        Ok(Ok(_)) => {}
        Ok(Err(error)) => {
            tracing::warn!(name = lock.name(), fence = lock.fence(), %error, "keep-alive: releasing the lost lease failed; it lapses at its ttl");
        }
        Err(_) => {
            tracing::warn!(
                name = lock.name(),
                fence = lock.fence(),
                "keep-alive: releasing the lost lease timed out; it lapses at its ttl"
            );
        }
    }
}

fn error_chain(error: &Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A lock whose renewals follow a script (`Err` for a transient failure),
    /// to drive the keep-alive's retry logic deterministically.
    #[derive(Debug)]
    struct Scripted {
        script: Mutex<Vec<Option<bool>>>,
        valid_until: Arc<Mutex<Instant>>,
        renewals: Mutex<u32>,
        /// How long each renewal's round trip takes.
        delay: Duration,
        /// The lease a successful renewal reports, if not the ttl asked for.
        renewed_for: Option<Duration>,
        /// When each renewal was sent.
        sent: Arc<Mutex<Vec<Instant>>>,
        /// How many times the lock was released through a shared reference.
        released: Arc<Mutex<u32>>,
        /// When a twin handle's release ended the grant: `valid_until`
        /// never goes past it, whatever renewals answer.
        ended_at: Option<Instant>,
        /// The signal of a lowered deadline it offers, if any.
        lowered: Option<Arc<Notify>>,
        /// How many times `valid_until` was read.
        looks: Arc<Mutex<u32>>,
    }

    impl Scripted {
        fn new(ttl: Duration, script: Vec<Option<bool>>) -> Self {
            Scripted {
                script: Mutex::new(script),
                valid_until: Arc::new(Mutex::new(Instant::now() + ttl)),
                renewals: Mutex::new(0),
                delay: Duration::ZERO,
                renewed_for: None,
                sent: Arc::default(),
                released: Arc::default(),
                ended_at: None,
                lowered: None,
                looks: Arc::default(),
            }
        }
    }

    #[async_trait::async_trait]
    impl Lock for Scripted {
        fn name(&self) -> &str {
            "scripted"
        }
        fn owner(&self) -> &str {
            "me"
        }
        fn fence(&self) -> u64 {
            1
        }
        fn valid_until(&self) -> Instant {
            *self.looks.lock().unwrap() += 1;
            let until = *self.valid_until.lock().unwrap();
            self.ended_at.map_or(until, |ended| until.min(ended))
        }
        fn valid_until_lowered(&self) -> Option<Arc<Notify>> {
            self.lowered.clone()
        }
        async fn renew(&self, ttl: Duration) -> Result<bool> {
            let sent = Instant::now();
            self.sent.lock().unwrap().push(sent);
            *self.renewals.lock().unwrap() += 1;
            tokio::time::sleep(self.delay).await;
            let next = {
                let mut script = self.script.lock().unwrap();
                if script.is_empty() {
                    Some(true)
                } else {
                    script.remove(0)
                }
            };
            match next {
                Some(true) => {
                    *self.valid_until.lock().unwrap() = sent + self.renewed_for.unwrap_or(ttl);
                    Ok(true)
                }
                Some(false) => Ok(false),
                None => Err(Error::database("renew", "transient failure")),
            }
        }
        async fn release(self: Box<Self>) -> Result<bool> {
            Ok(true)
        }
        async fn release_shared(&self) -> Result<bool> {
            *self.released.lock().unwrap() += 1;
            Ok(true)
        }
    }

    /// The lock's deadline comes down between two renewals (a twin handle
    /// released the grant): the keep-alive renews at once, learns the lease
    /// is gone and says so, without waiting out its 1 s interval; `status()`
    /// never shows the old deadline meanwhile.
    #[tokio::test]
    async fn a_deadline_lowered_between_renewals_is_acted_on_at_once() {
        let ttl = Duration::from_secs(3);
        let lock = Scripted::new(ttl, vec![Some(false)]);
        let deadline = lock.valid_until.clone();
        let kept = KeepAlive::start(Box::new(lock), ttl).unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let lowered = Instant::now();
        *deadline.lock().unwrap() = lowered;
        match kept.status() {
            LeaseStatus::Held { valid_until } => assert!(valid_until <= lowered),
            LeaseStatus::Lost(_) => {}
        }
        let reason = kept.lost().await;
        assert_eq!(reason, LostReason::Revoked);
        assert!(
            lowered.elapsed() < Duration::from_millis(500),
            "acted on the lowered deadline only after {:?}",
            lowered.elapsed()
        );
    }

    /// The deadline comes down while renewals keep failing (a renewal
    /// through `lock()` with a shorter ttl): the loss is reported before
    /// the lowered deadline, not at the margin before the old one.
    #[tokio::test]
    async fn a_deadline_lowered_during_retries_moves_the_give_up_point() {
        let ttl = Duration::from_secs(3);
        let lock = Scripted::new(ttl, vec![None; 1000]);
        let deadline = lock.valid_until.clone();
        let options = KeepAliveOptions {
            interval: Duration::from_millis(20),
            ..KeepAliveOptions::new(ttl)
        };
        let kept = KeepAlive::with_options(Box::new(lock), options).unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let lowered = Instant::now() + Duration::from_secs(1);
        *deadline.lock().unwrap() = lowered;
        assert!(matches!(
            kept.lost().await,
            LostReason::NotRenewedInTime { .. }
        ));
        assert!(
            Instant::now() < lowered,
            "told {:?} after the lowered deadline",
            Instant::now() - lowered
        );
    }

    /// A lock that signals its deadline coming down is not looked at
    /// between renewals until it does; then at once.
    #[tokio::test]
    async fn a_signalled_lowering_is_acted_on_at_once_and_nothing_polls_meanwhile() {
        let ttl = Duration::from_secs(30);
        let signal = Arc::new(Notify::new());
        let lock = Scripted {
            lowered: Some(signal.clone()),
            ..Scripted::new(ttl, vec![Some(false)])
        };
        let (deadline, looks) = (lock.valid_until.clone(), lock.looks.clone());
        let kept = KeepAlive::start(Box::new(lock), ttl).unwrap();
        // The first renewal is due 2.5 s from the start at the soonest; a
        // keep-alive looking every 100 ms would have looked 10 times by now.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let looked = *looks.lock().unwrap();
        assert!(looked <= 3, "looked at the deadline {looked} times");
        let lowered = Instant::now();
        *deadline.lock().unwrap() = lowered;
        signal.notify_waiters();
        assert_eq!(kept.lost().await, LostReason::Revoked);
        assert!(
            lowered.elapsed() < Duration::from_millis(500),
            "acted on the lowered deadline only after {:?}",
            lowered.elapsed()
        );
    }

    /// A twin's release ended the grant; the last renewal overtook that
    /// release on its way and answered `true`, but the handle's deadline
    /// stays at the release (before the renewal was sent): `Revoked`.
    #[tokio::test]
    async fn a_renewal_that_overtook_a_twins_release_reports_revoked() {
        let ttl = Duration::from_millis(300);
        let lock = Scripted {
            ended_at: Some(Instant::now()),
            ..Scripted::new(ttl, vec![Some(true)])
        };
        let kept = KeepAlive::start(Box::new(lock), ttl).unwrap();
        assert_eq!(kept.lost().await, LostReason::Revoked);
    }

    #[tokio::test]
    async fn a_transient_error_is_retried_and_the_lease_kept() {
        let ttl = Duration::from_millis(300);
        let kept =
            KeepAlive::start(Box::new(Scripted::new(ttl, vec![None, Some(true)])), ttl).unwrap();
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert!(
            matches!(kept.status(), LeaseStatus::Held { .. }),
            "{:?}",
            kept.status()
        );
        assert!(kept.lock().valid_until() > Instant::now());
        assert!(kept.release().await.unwrap());
    }

    #[tokio::test]
    async fn persistent_errors_signal_lost_before_the_lease_ends() {
        let ttl = Duration::from_millis(300);
        let lock = Scripted::new(ttl, vec![None; 1000]);
        let deadline = lock.valid_until();
        let released = lock.released.clone();
        let kept = KeepAlive::start(Box::new(lock), ttl).unwrap();
        let reason = kept.lost().await;
        assert!(
            Instant::now() < deadline,
            "lost signalled after valid_until"
        );
        assert_eq!(
            reason,
            LostReason::NotRenewedInTime {
                last_error: Some("renew failed: transient failure".into())
            }
        );
        // Having said so, it lets go of the grant.
        let waited = Instant::now();
        while *released.lock().unwrap() == 0 {
            assert!(
                waited.elapsed() < Duration::from_secs(5),
                "the lease given up was never released"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(*released.lock().unwrap(), 1);
    }

    /// The next renewal is due after the interval, or halfway to the give-up
    /// point when that comes first; the give-up point keeps the margin, or a
    /// quarter of the lease left when that is less.
    #[test]
    fn the_schedule_renews_halfway_to_giving_up_at_the_latest() {
        let now = Instant::now();
        let secs = Duration::from_secs;
        let options = KeepAliveOptions {
            ttl: secs(30),
            interval: secs(60),
            margin: secs(1),
        };
        assert_eq!(
            schedule(now + secs(10), now, now, &options),
            (now + Duration::from_millis(4500), now + secs(9))
        );
        let often = KeepAliveOptions {
            interval: secs(2),
            ..options
        };
        assert_eq!(schedule(now + secs(10), now, now, &often).0, now + secs(2));
        assert_eq!(margin_within(&options, secs(2)), Duration::from_millis(500));
        assert_eq!(margin_within(&options, secs(8)), secs(1));
    }

    /// The first cycle counts from up to three quarters of an interval
    /// back, at random: first renewals of leases taken together fall
    /// anywhere from a quarter of the interval to the interval.
    #[test]
    fn first_renewals_are_spread_over_three_quarters_of_the_interval() {
        let now = Instant::now() + Duration::from_secs(3600);
        let options = KeepAliveOptions::new(Duration::from_secs(30));
        let backs: Vec<Duration> = (0..1000)
            .map(|_| now - spread_first_renewal(now, &options))
            .collect();
        let most = options.interval.mul_f64(0.75);
        assert!(backs.iter().all(|back| *back <= most));
        // 1000 draws, each below a tenth of the range or within its top
        // tenth with chance 1/10: none there is a 1 in 10^45 chance.
        assert!(backs.iter().any(|back| *back < most / 10));
        assert!(backs.iter().any(|back| *back > most - most / 10));
    }

    /// Keep-alives started together send their first renewals spread out,
    /// none before a quarter of the interval.
    #[tokio::test]
    async fn keep_alives_started_together_renew_apart() {
        let ttl = Duration::from_secs(6);
        let options = KeepAliveOptions::new(ttl);
        let started = Instant::now();
        let kept: Vec<(KeepAlive, Arc<Mutex<Vec<Instant>>>)> = (0..20)
            .map(|_| {
                let lock = Scripted::new(ttl, vec![]);
                let sent = lock.sent.clone();
                (
                    KeepAlive::with_options(Box::new(lock), options).unwrap(),
                    sent,
                )
            })
            .collect();
        let mut firsts = Vec::new();
        for (_, sent) in &kept {
            while sent.lock().unwrap().is_empty() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            firsts.push(sent.lock().unwrap()[0] - started);
        }
        assert!(firsts.iter().all(|first| *first >= options.interval / 4));
        let (earliest, latest) = (firsts.iter().min().unwrap(), firsts.iter().max().unwrap());
        // 20 draws over 1.5 s all within 0.5 s of each other: a chance of
        // about 1 in 10^8.
        assert!(
            *latest - *earliest >= Duration::from_millis(500),
            "first renewals bunched: {firsts:?}"
        );
    }

    /// Dropping the keep-alive stops its renewals.
    #[tokio::test]
    async fn dropping_the_keep_alive_stops_renewing() {
        let ttl = Duration::from_millis(300);
        let lock = Scripted::new(ttl, vec![]);
        let sent = lock.sent.clone();
        let options = KeepAliveOptions {
            interval: Duration::from_millis(20),
            ..KeepAliveOptions::new(ttl)
        };
        let kept = KeepAlive::with_options(Box::new(lock), options).unwrap();
        while sent.lock().unwrap().len() < 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(kept);
        tokio::task::yield_now().await;
        let at_drop = sent.lock().unwrap().len();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            sent.lock().unwrap().len(),
            at_drop,
            "renewed after the drop"
        );
    }

    /// `stop` waits for the renewal on its way: when it returns, that
    /// renewal has been answered (the lease is the one it set), and no
    /// other is sent after.
    #[tokio::test]
    async fn stop_waits_for_the_renewal_in_flight_and_sends_no_more() {
        let ttl = Duration::from_millis(300);
        let lock = Scripted {
            delay: Duration::from_millis(100),
            ..Scripted::new(ttl, vec![])
        };
        let sent = lock.sent.clone();
        let options = KeepAliveOptions {
            interval: Duration::from_millis(20),
            ..KeepAliveOptions::new(ttl)
        };
        let kept = KeepAlive::with_options(Box::new(lock), options).unwrap();
        while sent.lock().unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let in_flight = sent.lock().unwrap()[0];
        let lock = tokio::time::timeout(Duration::from_secs(5), kept.stop())
            .await
            .expect("stop returned within 5 s")
            .expect("held");
        assert_eq!(
            lock.valid_until(),
            in_flight + ttl,
            "stop returned before the renewal on its way was answered"
        );
        let at_stop = sent.lock().unwrap().len();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(sent.lock().unwrap().len(), at_stop, "renewed after stop");
        assert_eq!(lock.valid_until(), in_flight + ttl);
    }

    /// `stop` after the lease was lost says why, instead of a lock.
    #[tokio::test]
    async fn stop_after_a_loss_answers_the_reason() {
        let ttl = Duration::from_millis(300);
        let kept = KeepAlive::start(Box::new(Scripted::new(ttl, vec![Some(false)])), ttl).unwrap();
        assert_eq!(kept.lost().await, LostReason::Revoked);
        assert_eq!(kept.stop().await.err(), Some(LostReason::Revoked));
    }

    #[tokio::test]
    async fn a_false_renewal_signals_revoked_at_once() {
        let ttl = Duration::from_millis(3000);
        let lock = Scripted::new(ttl, vec![Some(false)]);
        let options = KeepAliveOptions {
            interval: Duration::from_millis(20),
            ..KeepAliveOptions::new(ttl)
        };
        let kept = KeepAlive::with_options(Box::new(lock), options).unwrap();
        let started = Instant::now();
        assert_eq!(kept.lost().await, LostReason::Revoked);
        assert!(started.elapsed() < Duration::from_millis(1000));
    }

    #[tokio::test]
    async fn a_lease_shorter_than_the_interval_is_renewed_in_time() {
        // Taken with 1 s; kept with 30 s (interval 10 s, margin 3 s).
        let lock = Scripted::new(Duration::from_secs(1), vec![]);
        let lease_ends = lock.valid_until();
        let sent = lock.sent.clone();
        let kept = KeepAlive::start(Box::new(lock), Duration::from_secs(30)).unwrap();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        // Renewed about halfway to giving up (a quarter of the lease before
        // its end), not when the lease was over.
        let first = sent.lock().unwrap()[0];
        assert!(
            first + Duration::from_millis(250) <= lease_ends,
            "first renewal sent {:?} before the lease ended",
            lease_ends.saturating_duration_since(first)
        );
        assert!(
            matches!(kept.status(), LeaseStatus::Held { .. }),
            "{:?}",
            kept.status()
        );
        assert!(kept.lock().valid_until() > Instant::now() + Duration::from_secs(20));
    }

    #[tokio::test]
    async fn a_renewal_slower_than_its_own_lease_is_lost_before_that_lease_ends() {
        // 10 s left; renewals ask for 1 s but take 1.5 s to answer.
        let ttl = Duration::from_secs(1);
        let lock = Scripted {
            delay: Duration::from_millis(1500),
            ..Scripted::new(Duration::from_secs(10), vec![])
        };
        let sent = lock.sent.clone();
        let kept = KeepAlive::start(Box::new(lock), ttl).unwrap();
        let reason = kept.lost().await;
        let lost_at = Instant::now();
        assert!(
            matches!(reason, LostReason::NotRenewedInTime { .. }),
            "{reason:?}"
        );
        let first = sent.lock().unwrap()[0];
        // Had that renewal landed, its lease would end `ttl` after sending:
        // the holder hears of the loss before then, not 10 s later.
        assert!(
            lost_at < first + ttl,
            "lost signalled {:?} after the renewal was sent",
            lost_at - first
        );
    }

    #[tokio::test]
    async fn a_renewal_that_leaves_less_than_the_margin_counts_as_lost() {
        // Answered at once, but the engine reported only 50 ms of lease: less
        // than the keep-alive's 100 ms margin, so the holder is told it is
        // lost rather than held for a moment it could not use.
        let ttl = Duration::from_secs(1);
        let lock = Scripted {
            renewed_for: Some(Duration::from_millis(50)),
            ..Scripted::new(Duration::from_secs(10), vec![])
        };
        let options = KeepAliveOptions {
            interval: Duration::from_millis(20),
            ..KeepAliveOptions::new(ttl)
        };
        let kept = KeepAlive::with_options(Box::new(lock), options).unwrap();
        let lost = tokio::time::timeout(Duration::from_secs(2), kept.lost()).await;
        assert!(
            matches!(lost, Ok(LostReason::NotRenewedInTime { .. })),
            "a renewal leaving less than the margin was counted as kept: {lost:?}"
        );
    }

    #[tokio::test]
    async fn a_renewal_answered_after_its_own_lease_ended_counts_as_lost() {
        // The renewal answers `true` after 600 ms, but the engine reported
        // only 500 ms of lease: Held must not be published with that deadline.
        let ttl = Duration::from_secs(1);
        let lock = Scripted {
            delay: Duration::from_millis(600),
            renewed_for: Some(Duration::from_millis(500)),
            ..Scripted::new(Duration::from_secs(10), vec![])
        };
        let kept = KeepAlive::start(Box::new(lock), ttl).unwrap();
        let mut watch = kept.watch();
        watch.borrow_and_update();
        watch.changed().await.unwrap();
        let status = watch.borrow_and_update().clone();
        assert!(
            matches!(
                status,
                LeaseStatus::Lost(LostReason::NotRenewedInTime { .. })
            ),
            "published {status:?} after a renewal whose lease had already ended"
        );
    }

    #[test]
    fn options_that_cannot_keep_a_lease_are_refused() {
        let ttl = Duration::from_secs(1);
        for (options, expected) in [
            (
                KeepAliveOptions {
                    interval: Duration::ZERO,
                    ..KeepAliveOptions::new(ttl)
                },
                KeepAliveOptionsError::ZeroInterval,
            ),
            (
                KeepAliveOptions {
                    interval: ttl,
                    ..KeepAliveOptions::new(ttl)
                },
                KeepAliveOptionsError::IntervalNotBelowTtl,
            ),
            (
                KeepAliveOptions {
                    margin: ttl * 2,
                    ..KeepAliveOptions::new(ttl)
                },
                KeepAliveOptionsError::MarginNotBelowTtl,
            ),
        ] {
            let lock = Scripted::new(ttl, vec![]);
            let err = KeepAlive::with_options(Box::new(lock), options).unwrap_err();
            assert_eq!(err.find_source::<KeepAliveOptionsError>(), Some(&expected));
        }
    }

    #[test]
    fn a_bad_ttl_is_refused() {
        let lock = Scripted::new(Duration::from_secs(1), vec![]);
        let err = KeepAlive::start(Box::new(lock), Duration::ZERO).unwrap_err();
        assert!(err.find_source::<crate::DurationError>().is_some());
    }
}
