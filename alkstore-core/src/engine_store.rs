//! [`EngineStore`]: the whole `Store` contract over any [`Engine`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tracing::{Instrument, field};

use crate::clock::valid_until;
use crate::duration::LeaseMillis;
use crate::engine::{Attempt, Engine, GrantKey, PermitAttempt, RwAttempt};
use crate::error::{Error, Result};
use crate::grant::Grants;
use crate::handle::EngineLock;
use crate::metrics::{
    self, ACQUIRE_TOTAL, FORCE_RELEASE_TOTAL, LOCK_REFUSED_ATTEMPTS_TOTAL, LOCK_WAIT_SECONDS,
    QUEUE_POSITION, QUEUED_WAIT_SECONDS,
};
use crate::name::{validate_listing, validate_name, validate_owner};
use crate::permit::{HeldAs, PermitSlot, validate_permits};
use crate::queue::{Queue, Queued, Waiter, ticket_lease};
use crate::renewals::Renewals;
use crate::rw::{Access, MAX_INTENT, RwMode};
use crate::store::{Holder, Listed, Lock, MAX_LIST_LIMIT, Store};
use crate::wait::Waiting;

/// The state a store shares with the handles it granted.
#[derive(Debug)]
pub(crate) struct Shared<E> {
    pub(crate) engine: E,
    closed: AtomicBool,
    /// The grants this store's live handles hold.
    pub(crate) grants: Grants,
    /// Whether waiting calls take their turn in the engine's queue
    /// ([`EngineStore::fair_waiting`]).
    fair: AtomicBool,
    /// Renewals waiting for their batch.
    pub(crate) renewals: Renewals,
}

impl<E: Engine> Shared<E> {
    /// Whether this store's waiting calls queue: the engine keeps queues,
    /// and the store was not told to wait unfairly.
    pub(crate) fn queueing(&self) -> bool {
        self.fair.load(Ordering::Relaxed) && self.engine.queues()
    }

    /// Fails closed once [`Store::close`] ran.
    pub(crate) fn check_open(&self, operation: &'static str) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::closed(operation));
        }
        Ok(())
    }
}

/// Gives an [`Engine`] the whole [`Store`] contract: validation before any
/// round trip, the duration guard, the closed posture, tracing spans, grant
/// handles and the waiting acquire.
///
/// Engine crates wrap it in their own store type (`SqliteStore`, `PgStore`).
pub struct EngineStore<E> {
    shared: Arc<Shared<E>>,
}

impl<E> std::fmt::Debug for EngineStore<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineStore").finish_non_exhaustive()
    }
}

impl<E: Engine> EngineStore<E> {
    /// Wraps an opened engine.
    pub fn new(engine: E) -> Self {
        EngineStore {
            shared: Arc::new(Shared {
                engine,
                closed: AtomicBool::new(false),
                grants: Grants::default(),
                fair: AtomicBool::new(true),
                renewals: Renewals::default(),
            }),
        }
    }

    /// Whether this store's waiting calls wait in turn (the default:
    /// `true`). With `false`, a waiting call takes no place in the name's
    /// queue: it attempts as `try_` calls do and, woken by releases, wins
    /// the name when its attempt lands first — faster handoffs under heavy
    /// contention, with no order between waiters, and never ahead of a
    /// store's waiters that do queue (docs/fair-waiting.md). No effect on
    /// an engine that does not queue. A waiting call keeps the mode it
    /// began with.
    pub fn fair_waiting(self, fair: bool) -> Self {
        self.shared.fair.store(fair, Ordering::Relaxed);
        self
    }

    /// Whether renewals go to the engine in batches, on an engine that
    /// batches them (the default: `true`); with `false` each goes alone,
    /// as it is asked. For the benchmark's A/B of the two paths.
    #[doc(hidden)]
    pub fn renewals_in_batches(self, batched: bool) -> Self {
        self.shared
            .renewals
            .alone
            .store(!batched, Ordering::Relaxed);
        self
    }

    /// The engine underneath.
    pub fn engine(&self) -> &E {
        &self.shared.engine
    }

    /// True once [`Store::close`] ran.
    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire)
    }

    /// One acquire attempt, already validated; a handle when granted.
    #[allow(clippy::too_many_arguments)]
    async fn attempt(
        &self,
        operation: &'static str,
        ask: Ask,
        name: &str,
        owner: &str,
        ttl: LeaseMillis,
        queue: Queue,
        deadline: Option<Instant>,
    ) -> Result<Tried> {
        self.shared.check_open(operation)?;
        // In flight until its handle exists (or the future is dropped): a
        // release of the same grant meanwhile is remembered until then.
        let _in_flight = InFlight::new(&self.shared.grants);
        let sent = Instant::now();
        let engine = &self.shared.engine;
        let database = |e| Error::from_engine(operation, e);
        let clash = |held_as| Error::HeldAsOtherKind {
            name: name.to_owned(),
            held_as,
        };
        let refused = |expires_in, queued| Ok(Tried::Refused { expires_in, queued });
        let (fence, permit, access, expires_in) = match ask {
            Ask::Lock => match engine
                .acquire(name, owner, ttl, queue, deadline)
                .await
                .map_err(database)?
            {
                Attempt::Granted { fence, expires_in } => (fence, None, None, expires_in),
                Attempt::Held { expires_in } => return refused(expires_in, None),
                Attempt::Queued { expires_in, queued } => return refused(expires_in, Some(queued)),
                Attempt::HeldAsSemaphore { permits } => {
                    return Err(clash(HeldAs::Semaphore { permits }));
                }
                Attempt::HeldAsReadWrite => return Err(clash(HeldAs::ReadWrite)),
            },
            Ask::Rw(mode) => match engine
                .acquire_rw(name, mode, owner, ttl, queue, deadline)
                .await
                .map_err(database)?
            {
                RwAttempt::Granted {
                    fence,
                    access,
                    expires_in,
                } if access.mode() == mode => (fence, None, Some(access), expires_in),
                RwAttempt::Granted { fence, access, .. } => {
                    // The engine's bug, as a slot outside the permits is.
                    tracing::error!(name, fence, %access, ?mode, "the engine granted another mode");
                    return Err(database(
                        format!(
                            "the engine granted {access} access to a {mode:?} request (fence \
                             {fence}: force_release_grant removes it)"
                        )
                        .into(),
                    ));
                }
                RwAttempt::Held { expires_in } => return refused(expires_in, None),
                RwAttempt::Queued { expires_in, queued } => {
                    return refused(expires_in, Some(queued));
                }
                RwAttempt::HeldAsOther(held_as) => return Err(clash(held_as)),
            },
            Ask::Permit(permits) => match engine
                .acquire_permit(name, permits, owner, ttl, queue, deadline)
                .await
                .map_err(database)?
            {
                PermitAttempt::Granted {
                    fence,
                    slot,
                    expires_in,
                } if slot < permits => {
                    (fence, Some(PermitSlot { slot, permits }), None, expires_in)
                }
                PermitAttempt::Granted { slot, fence, .. } => {
                    // The engine's bug; its grant stays held until its TTL
                    // unless an operator removes it by its fence.
                    tracing::error!(
                        name,
                        fence,
                        slot,
                        permits,
                        "the engine granted a slot outside the semaphore's permits"
                    );
                    return Err(database(
                        format!(
                            "the engine granted slot {slot} of {permits} permits (fence {fence}: \
                             force_release_grant removes it)"
                        )
                        .into(),
                    ));
                }
                PermitAttempt::Held { expires_in } => return refused(expires_in, None),
                PermitAttempt::Queued { expires_in, queued } => {
                    return refused(expires_in, Some(queued));
                }
                PermitAttempt::Mismatch { permits: live } => {
                    return Err(Error::PermitsMismatch {
                        name: name.to_owned(),
                        asked: permits,
                        live,
                    });
                }
                PermitAttempt::HeldAsLock => return Err(clash(HeldAs::Lock)),
                PermitAttempt::HeldAsReadWrite => return Err(clash(HeldAs::ReadWrite)),
            },
        };
        let key = GrantKey {
            name: name.to_owned(),
            owner: owner.to_owned(),
            fence,
            permit,
            access,
        };
        let handle = EngineLock::new(self.shared.clone(), key, valid_until(sent, expires_in));
        Ok(Tried::Granted(Box::new(handle)))
    }

    /// `try_lock` and `try_acquire_permit`: one attempt, in `span`, counted.
    async fn try_acquire(
        &self,
        span: tracing::Span,
        operation: &'static str,
        ask: Ask,
        name: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<Box<dyn Lock>>> {
        let result = async {
            let ttl = check_request(operation, ask, name, owner, ttl)?;
            // Never queued, never ahead of the queue.
            let tried = self
                .attempt(operation, ask, name, owner, ttl, Queue::Never, None)
                .await?;
            Ok(tried.granted())
        }
        .instrument(span.clone())
        .await;
        self.count_acquire(operation, record_outcome(&span, &result));
        result
    }

    /// Counts an acquire call's outcome (`ACQUIRE_TOTAL`).
    fn count_acquire(&self, operation: &'static str, outcome: &'static str) {
        let engine = self.shared.engine.name();
        let labels = [
            ("engine", engine),
            ("operation", operation),
            ("outcome", outcome),
        ];
        metrics::count(ACQUIRE_TOTAL, &labels);
    }

    /// `lock` and `acquire_permit`: attempts until granted or `wait` runs
    /// out, woken by releases of `name`, in `span`, counted and timed.
    #[allow(clippy::too_many_arguments)]
    async fn acquire_waiting(
        &self,
        span: tracing::Span,
        operation: &'static str,
        ask: Ask,
        name: &str,
        owner: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<Box<dyn Lock>>> {
        let started = Instant::now();
        let result = async {
            let ttl = check_request(operation, ask, name, owner, ttl)?;
            self.shared.check_open(operation)?;
            let engine = &self.shared.engine;
            let subscription = engine.releases().subscribe(name);
            let mut waiting = Waiting::new(engine, wait);
            // This call's place in the name's queue, left when the call
            // ends ungranted, however it ends.
            let mut place = Place::new(&self.shared, name);
            let mut attempts = 0u64;
            loop {
                // Enabled before the attempt: a release landing while it
                // runs still wakes us. Boxed, so that a waiter behind
                // another can drop it (passing on a cue it took) at once.
                let mut released = Box::pin(subscription.notify().notified());
                released.as_mut().enable();

                attempts += 1;
                tracing::Span::current().record("attempts", attempts);
                let sent = Instant::now();
                let queue = place.queue(ask, ttl, waiting.left_for());
                // Every step of the attempt is bounded by the wait left.
                let tried = self
                    .attempt(operation, ask, name, owner, ttl, queue, waiting.deadline())
                    .await?;
                let (expires_in, queued) = match tried {
                    Tried::Granted(granted) => {
                        place.granted(started);
                        // Whether a notification (a release, a cue from the
                        // ticket ahead) woke the attempt that won, or its
                        // poll did (the contract's wake-up cases read it).
                        tracing::Span::current().record("woken", waiting.granted());
                        if place.queueing && matches!(ask, Ask::Rw(RwMode::Read)) {
                            // Readers go in together: the release that let
                            // this one in is passed on to the next waiter.
                            engine.releases().released(name);
                        }
                        return Ok(Some(granted));
                    }
                    Tried::Refused { expires_in, queued } => (expires_in, queued),
                };
                place.refused(queued);
                // The ticket (or a writer's intent) counts from no earlier
                // than the send: the next attempt renews it by half of it
                // from then.
                let attempt_by = match queue {
                    Queue::Waiting { lease, .. } => Some(sent + lease.as_duration() / 2),
                    Queue::Never => None,
                };
                metrics::count(LOCK_REFUSED_ATTEMPTS_TOTAL, &[("engine", engine.name())]);
                // Behind another waiter, this one's cue is that waiter
                // leaving the queue, not a release: a release is the first
                // in line's (a cue this waiter took is passed on as it is
                // dropped).
                let ahead = queued.and_then(|queued| queued.ahead);
                let watch = ahead.map(|ticket| engine.releases().watch_ticket(name, ticket));
                // Next in line: polls at the engine's turn pace.
                let next = queued.is_some_and(|queued| queued.position <= NEXT_IN_LINE);
                let over = match &watch {
                    Some(watch) => {
                        drop(released);
                        let cue = std::pin::pin!(watch.notify().notified());
                        !waiting.after_refusal(cue, None, attempt_by, next).await
                    }
                    None => {
                        !waiting
                            .after_refusal(released.as_mut(), expires_in, attempt_by, next)
                            .await
                    }
                };
                if over {
                    return Ok(None);
                }
            }
        }
        .instrument(span.clone())
        .await;
        let outcome = record_outcome(&span, &result);
        self.count_acquire(operation, outcome);
        let engine = self.shared.engine.name();
        metrics::observe(
            LOCK_WAIT_SECONDS,
            &[("engine", engine), ("outcome", outcome)],
            started.elapsed(),
        );
        result
    }

    /// `force_release` and `force_release_grant`: of any live grant, or of
    /// the one with `fence`.
    async fn forced_release(&self, name: &str, fence: Option<u64>) -> Result<Option<Holder>> {
        let span = tracing::debug_span!(
            "alkstore.force_release",
            name,
            expected_fence = fence,
            outcome = field::Empty,
            owner = field::Empty,
            fence = field::Empty
        );
        async {
            validate_name(name)?;
            self.shared.check_open("force_release")?;
            // No grant has fence 0 (a waiting writer's intent has: it is
            // not a grant) or a fence the stores cannot hold (above i64::MAX).
            let no_grant = |fence: u64| fence == 0 || i64::try_from(fence).is_err();
            let mut removed = if fence.is_some_and(no_grant) {
                Ok(None)
            } else {
                self.shared.engine.force_release(name, fence).await
            };
            // A name no lock holds may be a semaphore's or a reader-writer
            // lock's, whose grants go one at a time, by fence: say so
            // rather than "free".
            let mut other_kind = None;
            if let (Ok(None), None) = (&removed, fence) {
                match self.shared.engine.list(name, None, 1).await {
                    Ok(page) => {
                        other_kind = page
                            .first()
                            .filter(|listed| listed.name == name)
                            .and_then(|listed| match (listed.permit, listed.access) {
                                (Some(permit), _) => Some(HeldAs::Semaphore {
                                    permits: permit.permits,
                                }),
                                (None, Some(_)) => Some(HeldAs::ReadWrite),
                                (None, None) => None,
                            })
                    }
                    Err(e) => removed = Err(e),
                }
            }
            let outcome = match (&removed, fence) {
                _ if other_kind.is_some() => "other_kind",
                (Ok(Some(_)), _) => "removed",
                (Ok(None), None) => "free",
                (Ok(None), Some(_)) => "not_that_grant",
                (Err(_), _) => "error",
            };
            let engine = self.shared.engine.name();
            metrics::count(FORCE_RELEASE_TOTAL, &[("engine", engine), ("outcome", outcome)]);
            let removed = removed.map_err(|e| Error::database("force_release", e))?;
            let span = tracing::Span::current();
            if let Some(held_as) = other_kind {
                span.record("outcome", outcome);
                return Err(Error::HeldAsOtherKind {
                    name: name.to_owned(),
                    held_as,
                });
            }
            match &removed {
                Some(holder) => {
                    // Waiters in this process hear of it as of a release.
                    self.shared.engine.releases().released(name);
                    span.record("outcome", "removed");
                    span.record("owner", holder.owner.as_str());
                    span.record("fence", holder.fence);
                    tracing::info!(name, owner = %holder.owner, fence = holder.fence, "lock released by force");
                }
                None => {
                    span.record("outcome", outcome);
                }
            }
            Ok(removed)
        }
        .instrument(span)
        .await
    }
}

/// A waiting writer's intent for its next attempt: its ttl, cut to the wait
/// left and to [`MAX_INTENT`]; none once the wait is over (a last attempt
/// with no time left writes nothing when refused).
fn writers_intent(ttl: LeaseMillis, wait_left: Option<Duration>) -> Option<LeaseMillis> {
    let bound = wait_left.map_or(MAX_INTENT, |left| left.min(MAX_INTENT));
    (!bound.is_zero()).then(|| ttl.at_most(Some(bound)))
}

/// An acquire in flight, for [`Grants`]' memory of releases.
struct InFlight<'a> {
    grants: &'a Grants,
    ticket: u64,
}

impl<'a> InFlight<'a> {
    fn new(grants: &'a Grants) -> Self {
        InFlight {
            grants,
            ticket: grants.acquire_sent(),
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.grants.acquire_done(self.ticket);
    }
}

/// What an acquire asks for.
#[derive(Debug, Clone, Copy)]
enum Ask {
    /// A plain lock.
    Lock,
    /// A permit of a semaphore of this many permits.
    Permit(u32),
    /// A reader-writer lock's grant.
    Rw(RwMode),
}

/// What one acquire attempt came to.
enum Tried {
    Granted(Box<dyn Lock>),
    Refused {
        /// Lease time left of the grant that ends first, if known.
        expires_in: Option<Duration>,
        /// Where a waiting call stands, on an engine that queues.
        queued: Option<Queued>,
    },
}

impl Tried {
    fn granted(self) -> Option<Box<dyn Lock>> {
        match self {
            Tried::Granted(granted) => Some(granted),
            Tried::Refused { .. } => None,
        }
    }
}

/// The places, counted from 0, that poll at the engine's turn pace
/// ([`Engine::turn_poll_ceiling`]): the first in line, whose turn is next,
/// and the one behind it, which becomes first when the first is granted —
/// and must see the name free soon after, where no release reaches it
/// across processes.
const NEXT_IN_LINE: u32 = 1;

/// A waiting call's place in its name's queue (on an engine that queues):
/// the ticket its attempts renew, left when the call ends ungranted — its
/// wait over, an error, or its future dropped.
struct Place<'a, E: Engine> {
    shared: &'a Arc<Shared<E>>,
    name: &'a str,
    /// Whether the call waits in turn: fixed when it begins.
    queueing: bool,
    ticket: Option<u64>,
    /// Where the call stood when it first queued.
    first_position: Option<u32>,
}

impl<'a, E: Engine> Place<'a, E> {
    fn new(shared: &'a Arc<Shared<E>>, name: &'a str) -> Self {
        Place {
            shared,
            name,
            queueing: shared.queueing(),
            ticket: None,
            first_position: None,
        }
    }

    /// The next attempt's standing: its ticket, to last [`ticket_lease`]
    /// from the attempt. On an engine that does not queue, a waiting
    /// writer's intent instead (its ttl, cut to the wait left and to
    /// [`MAX_INTENT`]), and nothing for the others; on one that queues,
    /// for a store told to wait unfairly, nothing.
    fn queue(&self, ask: Ask, ttl: LeaseMillis, wait_left: Option<Duration>) -> Queue {
        if self.queueing {
            // A call with no wait left and no place yet (a zero wait) makes
            // its one attempt as a `try_` call does: a place it would
            // leave at once is not worth a write.
            if self.ticket.is_none() && wait_left == Some(Duration::ZERO) {
                return Queue::Never;
            }
            return Queue::Waiting {
                ticket: self.ticket,
                lease: ticket_lease(wait_left),
            };
        }
        if self.shared.engine.queues() {
            // Told to wait unfairly: every attempt as a `try_` call's.
            return Queue::Never;
        }
        match (ask, writers_intent(ttl, wait_left)) {
            (Ask::Rw(RwMode::Write), Some(lease)) => Queue::Waiting {
                ticket: None,
                lease,
            },
            _ => Queue::Never,
        }
    }

    /// Refused: the ticket the engine answered (a new one when the old
    /// had lapsed), if it queues; where it first stood, counted.
    ///
    /// A refusal that says nothing of the queue (an attempt cut short by
    /// its bound) keeps the ticket the call had: it is still this call's to
    /// renew or to leave.
    fn refused(&mut self, queued: Option<Queued>) {
        let Some(queued) = queued else {
            return;
        };
        if self.first_position.is_none() {
            self.first_position = Some(queued.position);
            let engine = self.shared.engine.name();
            metrics::observe_value(
                QUEUE_POSITION,
                &[("engine", engine)],
                f64::from(queued.position),
            );
        }
        self.ticket = Some(queued.ticket);
    }

    /// Granted: the engine removed the ticket in the same step; the waiter
    /// behind it in this process is cued, and the wait of a queued call
    /// (`started`) counted by where it first stood.
    fn granted(&mut self, started: Instant) {
        if let Some(position) = self.first_position {
            let labels = [
                ("engine", self.shared.engine.name()),
                ("position", metrics::position_label(position)),
            ];
            metrics::observe(QUEUED_WAIT_SECONDS, &labels, started.elapsed());
        }
        if let Some(ticket) = self.ticket.take() {
            self.shared.engine.releases().dequeued(self.name, ticket);
        }
    }
}

impl<E: Engine> Drop for Place<'_, E> {
    fn drop(&mut self) {
        let Some(ticket) = self.ticket.take() else {
            return;
        };
        // A closed store does nothing more: its waiters' places end as a
        // dead process's do, with their tickets' leases.
        if self.shared.closed.load(Ordering::Acquire) {
            return;
        }
        // Left at once when a runtime is at hand (else the ticket lapses
        // with its lease); the waiter behind is cued once it is gone.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (shared, name) = (self.shared.clone(), self.name.to_owned());
        runtime.spawn(async move {
            match shared.engine.leave_queue(&name, ticket).await {
                Ok(_) => shared.engine.releases().dequeued(&name, ticket),
                Err(error) => {
                    tracing::debug!(%error, name, ticket, "leaving the queue failed; the ticket lapses");
                }
            }
        });
    }
}

/// Validates a name, a semaphore's permits, an owner and a ttl, in that
/// order.
fn check_request(
    operation: &'static str,
    ask: Ask,
    name: &str,
    owner: &str,
    ttl: Duration,
) -> Result<LeaseMillis> {
    validate_name(name)?;
    if let Ask::Permit(permits) = ask {
        validate_permits(permits)?;
    }
    validate_owner(owner)?;
    LeaseMillis::new(ttl).map_err(|e| Error::database(operation, e))
}

/// Records how an acquire ended on the current span; the outcome's label.
fn record_outcome(span: &tracing::Span, result: &Result<Option<Box<dyn Lock>>>) -> &'static str {
    match result {
        Ok(Some(lock)) => {
            span.record("outcome", "granted");
            span.record("fence", lock.fence());
            if let Some(permit) = lock.permit() {
                span.record("slot", permit.slot);
            }
            if let Some(Access::Read { slot }) = lock.access() {
                span.record("slot", slot);
            }
            "granted"
        }
        Ok(None) => {
            span.record("outcome", "held elsewhere");
            "held"
        }
        Err(_) => {
            span.record("outcome", "error");
            "error"
        }
    }
}

#[async_trait]
impl<E: Engine> Store for EngineStore<E> {
    async fn try_lock(
        &self,
        name: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<Box<dyn Lock>>> {
        let span = tracing::debug_span!(
            "alkstore.try_lock",
            name,
            owner,
            outcome = field::Empty,
            fence = field::Empty
        );
        self.try_acquire(span, "try_lock", Ask::Lock, name, owner, ttl)
            .await
    }

    async fn lock(
        &self,
        name: &str,
        owner: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<Box<dyn Lock>>> {
        let span = tracing::debug_span!(
            "alkstore.lock",
            name,
            owner,
            outcome = field::Empty,
            fence = field::Empty,
            attempts = field::Empty,
            woken = field::Empty
        );
        self.acquire_waiting(span, "lock", Ask::Lock, name, owner, ttl, wait)
            .await
    }

    async fn try_acquire_permit(
        &self,
        name: &str,
        permits: u32,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<Box<dyn Lock>>> {
        let span = tracing::debug_span!(
            "alkstore.try_acquire_permit",
            name,
            permits,
            owner,
            outcome = field::Empty,
            fence = field::Empty,
            slot = field::Empty
        );
        let ask = Ask::Permit(permits);
        self.try_acquire(span, "try_acquire_permit", ask, name, owner, ttl)
            .await
    }

    async fn acquire_permit(
        &self,
        name: &str,
        permits: u32,
        owner: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<Box<dyn Lock>>> {
        let span = tracing::debug_span!(
            "alkstore.acquire_permit",
            name,
            permits,
            owner,
            outcome = field::Empty,
            fence = field::Empty,
            slot = field::Empty,
            attempts = field::Empty,
            woken = field::Empty
        );
        let ask = Ask::Permit(permits);
        self.acquire_waiting(span, "acquire_permit", ask, name, owner, ttl, wait)
            .await
    }

    async fn try_read_lock(
        &self,
        name: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<Box<dyn Lock>>> {
        let span = tracing::debug_span!(
            "alkstore.try_read_lock",
            name,
            owner,
            outcome = field::Empty,
            fence = field::Empty,
            slot = field::Empty
        );
        let ask = Ask::Rw(RwMode::Read);
        self.try_acquire(span, "try_read_lock", ask, name, owner, ttl)
            .await
    }

    async fn read_lock(
        &self,
        name: &str,
        owner: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<Box<dyn Lock>>> {
        let span = tracing::debug_span!(
            "alkstore.read_lock",
            name,
            owner,
            outcome = field::Empty,
            fence = field::Empty,
            slot = field::Empty,
            attempts = field::Empty,
            woken = field::Empty
        );
        let ask = Ask::Rw(RwMode::Read);
        self.acquire_waiting(span, "read_lock", ask, name, owner, ttl, wait)
            .await
    }

    async fn try_write_lock(
        &self,
        name: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<Box<dyn Lock>>> {
        let span = tracing::debug_span!(
            "alkstore.try_write_lock",
            name,
            owner,
            outcome = field::Empty,
            fence = field::Empty
        );
        let ask = Ask::Rw(RwMode::Write);
        self.try_acquire(span, "try_write_lock", ask, name, owner, ttl)
            .await
    }

    async fn write_lock(
        &self,
        name: &str,
        owner: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<Box<dyn Lock>>> {
        let span = tracing::debug_span!(
            "alkstore.write_lock",
            name,
            owner,
            outcome = field::Empty,
            fence = field::Empty,
            attempts = field::Empty,
            woken = field::Empty
        );
        let ask = Ask::Rw(RwMode::Write);
        self.acquire_waiting(span, "write_lock", ask, name, owner, ttl, wait)
            .await
    }

    async fn holder(&self, name: &str) -> Result<Option<Holder>> {
        let span = tracing::debug_span!("alkstore.holder", name, outcome = field::Empty);
        async {
            validate_name(name)?;
            self.shared.check_open("holder")?;
            let holder = self
                .shared
                .engine
                .holder(name)
                .await
                .map_err(|e| Error::database("holder", e))?;
            tracing::Span::current()
                .record("outcome", if holder.is_some() { "held" } else { "free" });
            Ok(holder)
        }
        .instrument(span)
        .await
    }

    async fn waiters(&self, name: &str) -> Result<Vec<Waiter>> {
        let span = tracing::debug_span!("alkstore.waiters", name, waiting = field::Empty);
        async {
            validate_name(name)?;
            self.shared.check_open("waiters")?;
            let waiters = self
                .shared
                .engine
                .waiters(name)
                .await
                .map_err(|e| Error::database("waiters", e))?;
            tracing::Span::current().record("waiting", waiters.len());
            Ok(waiters)
        }
        .instrument(span)
        .await
    }

    async fn purge_expired(&self) -> Result<u64> {
        let span = tracing::debug_span!("alkstore.purge_expired", purged = field::Empty);
        async {
            self.shared.check_open("purge_expired")?;
            let purged = self
                .shared
                .engine
                .purge_expired()
                .await
                .map_err(|e| Error::database("purge_expired", e))?;
            tracing::Span::current().record("purged", purged);
            Ok(purged)
        }
        .instrument(span)
        .await
    }

    async fn list(&self, prefix: &str, after: Option<&str>, limit: usize) -> Result<Vec<Listed>> {
        let span = tracing::debug_span!("alkstore.list", prefix, listed = field::Empty);
        async {
            validate_listing(prefix, after)?;
            if !(1..=MAX_LIST_LIMIT).contains(&limit) {
                return Err(Error::InvalidLimit {
                    limit,
                    max: MAX_LIST_LIMIT,
                });
            }
            self.shared.check_open("list")?;
            let listed = self
                .shared
                .engine
                .list(prefix, after, limit)
                .await
                .map_err(|e| Error::database("list", e))?;
            tracing::Span::current().record("listed", listed.len());
            Ok(listed)
        }
        .instrument(span)
        .await
    }

    async fn force_release(&self, name: &str) -> Result<Option<Holder>> {
        self.forced_release(name, None).await
    }

    async fn force_release_grant(&self, name: &str, fence: u64) -> Result<Option<Holder>> {
        self.forced_release(name, Some(fence)).await
    }

    async fn raise_fences(&self, by: u64) -> Result<u64> {
        let span = tracing::info_span!("alkstore.raise_fences", by, next = field::Empty);
        async {
            if !(crate::MIN_FENCE_RAISE..=crate::MAX_FENCE_RAISE).contains(&by) {
                return Err(Error::InvalidRaise {
                    by,
                    min: crate::MIN_FENCE_RAISE,
                    max: crate::MAX_FENCE_RAISE,
                });
            }
            self.shared.check_open("raise_fences")?;
            let next = self
                .shared
                .engine
                .raise_fences(by)
                .await
                .map_err(|e| Error::from_engine("raise_fences", e))?;
            tracing::Span::current().record("next", next);
            tracing::info!(by, next, "fences raised");
            Ok(next)
        }
        .instrument(span)
        .await
    }

    async fn close(&self) -> Result<()> {
        let span = tracing::debug_span!("alkstore.close");
        async {
            if self.shared.closed.swap(true, Ordering::AcqRel) {
                return Ok(());
            }
            // Waiters see the closed flag on their next attempt.
            self.shared.engine.releases().wake_all();
            self.shared
                .engine
                .close()
                .await
                .map_err(|e| Error::database("close", e))
        }
        .instrument(span)
        .await
    }
}

/// Implements [`Store`] for an engine's store type by handing every call to
/// its [`EngineStore`] field, so that engine crates do not repeat the
/// delegation: `alkstore_core::delegate_store!(SqliteStore, inner);`
#[macro_export]
macro_rules! delegate_store {
    ($store:ty, $field:ident) => {
        #[$crate::__private::async_trait]
        impl $crate::Store for $store {
            async fn try_lock(
                &self,
                name: &str,
                owner: &str,
                ttl: ::std::time::Duration,
            ) -> $crate::Result<::std::option::Option<::std::boxed::Box<dyn $crate::Lock>>> {
                self.$field.try_lock(name, owner, ttl).await
            }

            async fn lock(
                &self,
                name: &str,
                owner: &str,
                ttl: ::std::time::Duration,
                wait: ::std::time::Duration,
            ) -> $crate::Result<::std::option::Option<::std::boxed::Box<dyn $crate::Lock>>> {
                self.$field.lock(name, owner, ttl, wait).await
            }

            async fn try_acquire_permit(
                &self,
                name: &str,
                permits: u32,
                owner: &str,
                ttl: ::std::time::Duration,
            ) -> $crate::Result<::std::option::Option<::std::boxed::Box<dyn $crate::Lock>>> {
                self.$field
                    .try_acquire_permit(name, permits, owner, ttl)
                    .await
            }

            async fn acquire_permit(
                &self,
                name: &str,
                permits: u32,
                owner: &str,
                ttl: ::std::time::Duration,
                wait: ::std::time::Duration,
            ) -> $crate::Result<::std::option::Option<::std::boxed::Box<dyn $crate::Lock>>> {
                self.$field
                    .acquire_permit(name, permits, owner, ttl, wait)
                    .await
            }

            async fn try_read_lock(
                &self,
                name: &str,
                owner: &str,
                ttl: ::std::time::Duration,
            ) -> $crate::Result<::std::option::Option<::std::boxed::Box<dyn $crate::Lock>>> {
                self.$field.try_read_lock(name, owner, ttl).await
            }

            async fn read_lock(
                &self,
                name: &str,
                owner: &str,
                ttl: ::std::time::Duration,
                wait: ::std::time::Duration,
            ) -> $crate::Result<::std::option::Option<::std::boxed::Box<dyn $crate::Lock>>> {
                self.$field.read_lock(name, owner, ttl, wait).await
            }

            async fn try_write_lock(
                &self,
                name: &str,
                owner: &str,
                ttl: ::std::time::Duration,
            ) -> $crate::Result<::std::option::Option<::std::boxed::Box<dyn $crate::Lock>>> {
                self.$field.try_write_lock(name, owner, ttl).await
            }

            async fn write_lock(
                &self,
                name: &str,
                owner: &str,
                ttl: ::std::time::Duration,
                wait: ::std::time::Duration,
            ) -> $crate::Result<::std::option::Option<::std::boxed::Box<dyn $crate::Lock>>> {
                self.$field.write_lock(name, owner, ttl, wait).await
            }

            async fn holder(
                &self,
                name: &str,
            ) -> $crate::Result<::std::option::Option<$crate::Holder>> {
                self.$field.holder(name).await
            }

            async fn holders(&self, name: &str) -> $crate::Result<::std::vec::Vec<$crate::Listed>> {
                self.$field.holders(name).await
            }

            async fn waiters(&self, name: &str) -> $crate::Result<::std::vec::Vec<$crate::Waiter>> {
                self.$field.waiters(name).await
            }

            async fn purge_expired(&self) -> $crate::Result<u64> {
                self.$field.purge_expired().await
            }

            async fn list(
                &self,
                prefix: &str,
                after: ::std::option::Option<&str>,
                limit: usize,
            ) -> $crate::Result<::std::vec::Vec<$crate::Listed>> {
                self.$field.list(prefix, after, limit).await
            }

            async fn force_release(
                &self,
                name: &str,
            ) -> $crate::Result<::std::option::Option<$crate::Holder>> {
                self.$field.force_release(name).await
            }

            async fn force_release_grant(
                &self,
                name: &str,
                fence: u64,
            ) -> $crate::Result<::std::option::Option<$crate::Holder>> {
                self.$field.force_release_grant(name, fence).await
            }

            async fn raise_fences(&self, by: u64) -> $crate::Result<u64> {
                self.$field.raise_fences(by).await
            }

            async fn close(&self) -> $crate::Result<()> {
                self.$field.close().await
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::GrantKey;
    use crate::error::BoxError;
    use crate::wake::ReleaseBus;

    #[test]
    fn a_writers_intent_is_cut_to_its_wait_and_to_the_bound() {
        let ttl = LeaseMillis::new(Duration::from_secs(60)).unwrap();
        let ms = |ms| Some(Duration::from_millis(ms));
        let millis = |intent: Option<LeaseMillis>| intent.map(LeaseMillis::get);
        assert_eq!(millis(writers_intent(ttl, ms(1500))), Some(1500));
        assert_eq!(millis(writers_intent(ttl, None)), Some(5000));
        assert_eq!(millis(writers_intent(ttl, ms(60_000))), Some(5000));
        assert_eq!(
            millis(writers_intent(ttl, Some(Duration::from_micros(10)))),
            Some(1)
        );
        let short = LeaseMillis::new(Duration::from_millis(300)).unwrap();
        assert_eq!(millis(writers_intent(short, None)), Some(300));
        assert_eq!(
            writers_intent(ttl, Some(Duration::ZERO)),
            None,
            "no time left: no intent"
        );
    }

    /// How the test engine answers acquires.
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    enum Script {
        /// Every name is held by someone else; getting ready to wait hangs.
        #[default]
        HeldWithHangingListener,
        /// Grants fence 1 to every acquire; the second acquire answers only
        /// when let through (its read of the row came before a release).
        ReadBeforeRelease,
        /// As `ReadBeforeRelease`, and every renewal answers `true`.
        Renews,
    }

    #[derive(Debug, Default)]
    struct TestEngine {
        script: Script,
        bus: ReleaseBus,
        calls: std::sync::atomic::AtomicU32,
        let_through: tokio::sync::Notify,
    }

    impl TestEngine {
        fn new(script: Script) -> Self {
            TestEngine {
                script,
                ..TestEngine::default()
            }
        }
    }

    /// `is_closed` (which engine stores check before their own extras, such
    /// as dropping a schema) answers `true` from `close()` on, not before.
    #[tokio::test]
    async fn is_closed_from_close_on() {
        let store = EngineStore::new(TestEngine::new(Script::default()));
        assert!(!store.is_closed());
        store.close().await.unwrap();
        assert!(store.is_closed());
    }

    /// An engine that says nothing of its poll ceiling polls at most every
    /// 250 ms: never busily, never rarely enough to miss a lease.
    #[test]
    fn the_default_poll_ceiling_is_a_quarter_second() {
        let engine = TestEngine::new(Script::default());
        assert_eq!(engine.poll_ceiling(), Duration::from_millis(250));
    }

    #[async_trait]
    impl Engine for TestEngine {
        async fn acquire(
            &self,
            _: &str,
            _: &str,
            ttl: LeaseMillis,
            _: Queue,
            _: Option<Instant>,
        ) -> Result<Attempt, BoxError> {
            if self.script == Script::HeldWithHangingListener {
                return Ok(Attempt::Held {
                    expires_in: Some(Duration::from_secs(60)),
                });
            }
            if self.calls.fetch_add(1, Ordering::SeqCst) == 1 {
                self.let_through.notified().await;
            }
            Ok(Attempt::Granted {
                fence: 1,
                expires_in: ttl.as_duration(),
            })
        }
        async fn renew(&self, _: &GrantKey, _: LeaseMillis) -> Result<bool, BoxError> {
            Ok(self.script == Script::Renews)
        }
        async fn release(&self, _: &GrantKey) -> Result<bool, BoxError> {
            Ok(self.script == Script::ReadBeforeRelease)
        }
        async fn holder(&self, _: &str) -> Result<Option<Holder>, BoxError> {
            Ok(None)
        }
        async fn purge_expired(&self) -> Result<u64, BoxError> {
            Ok(0)
        }
        async fn list(&self, _: &str, _: Option<&str>, _: usize) -> Result<Vec<Listed>, BoxError> {
            Ok(Vec::new())
        }
        async fn force_release(&self, _: &str, _: Option<u64>) -> Result<Option<Holder>, BoxError> {
            Ok(None)
        }
        async fn close(&self) -> Result<(), BoxError> {
            Ok(())
        }
        fn releases(&self) -> &ReleaseBus {
            &self.bus
        }
        async fn prepare_wait(&self) -> Result<(), BoxError> {
            if self.script == Script::HeldWithHangingListener {
                tokio::time::sleep(Duration::from_secs(30)).await;
            }
            Ok(())
        }
    }

    /// Counts the warnings about a live handle dropped unreleased.
    #[derive(Clone, Default)]
    struct DropWarnings(Arc<std::sync::atomic::AtomicUsize>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for DropWarnings {
        fn on_event(
            &self,
            event: &tracing::Event<'_>,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            struct Message(bool);
            impl tracing::field::Visit for Message {
                fn record_debug(&mut self, _: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                    self.0 |= format!("{value:?}").contains("dropped while its lease is live");
                }
            }
            let mut message = Message(false);
            event.record(&mut message);
            if message.0 {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    /// A live handle dropped unreleased logs a warning (its lease stays
    /// held until its TTL); a released one, or one whose lease is over, does not.
    #[tokio::test(flavor = "current_thread")]
    async fn a_live_handle_dropped_unreleased_warns() {
        use tracing_subscriber::layer::SubscriberExt;
        let warnings = DropWarnings::default();
        let subscriber = tracing_subscriber::Registry::default().with(warnings.clone());
        let _guard = tracing::subscriber::set_default(subscriber);
        // Interest is cached per callsite for the process (tokio-rs/tracing#3611).
        let _second = tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default());
        tracing::callsite::rebuild_interest_cache();
        let fresh = || EngineStore::new(TestEngine::new(Script::ReadBeforeRelease));
        let count = || warnings.0.load(Ordering::SeqCst);

        let store = fresh();
        drop(
            store
                .try_lock("n", "o", Duration::from_secs(30))
                .await
                .unwrap(),
        );
        assert_eq!(count(), 1, "a live handle dropped unreleased");

        let store = fresh();
        let lock = store
            .try_lock("n", "o", Duration::from_secs(30))
            .await
            .unwrap()
            .unwrap();
        lock.release().await.unwrap();
        assert_eq!(count(), 1, "a released handle");

        let store = fresh();
        let lock = store
            .try_lock("n", "o", Duration::from_millis(1))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
        drop(lock);
        assert_eq!(count(), 1, "a handle whose lease is over");
    }

    /// A renewal dropped where it first yields to tokio (its cooperative
    /// budget used up) has changed nothing: no renewal is left counted as in
    /// flight, so the next one answered `true` moves `valid_until` up.
    #[tokio::test(flavor = "current_thread")]
    async fn a_renewal_dropped_at_its_first_yield_leaves_nothing_in_flight() {
        let store = EngineStore::new(TestEngine::new(Script::Renews));
        let lock = store
            .try_lock("n", "o", Duration::from_secs(1))
            .await
            .unwrap()
            .unwrap();
        let mut renewal = lock.renew(Duration::from_secs(60));
        std::future::poll_fn(|cx| {
            // Use the task's budget up, then poll the renewal once.
            while std::pin::pin!(tokio::task::consume_budget())
                .poll(cx)
                .is_ready()
            {}
            assert!(renewal.as_mut().poll(cx).is_pending());
            std::task::Poll::Ready(())
        })
        .await;
        drop(renewal);
        tokio::task::yield_now().await;
        assert!(lock.renew(Duration::from_secs(60)).await.unwrap());
        assert!(
            lock.valid_until() > Instant::now() + Duration::from_secs(50),
            "valid_until stuck behind a renewal dropped before it was sent"
        );
    }

    /// The same owner's acquire read the live row, then the twin handle
    /// released the grant and went away, then the acquire's answer came
    /// back: the new handle must not promise the released lease.
    #[tokio::test]
    async fn a_grant_released_while_its_reacquire_was_in_flight_comes_back_ended() {
        let store = Arc::new(EngineStore::new(TestEngine::new(Script::ReadBeforeRelease)));
        let ttl = Duration::from_secs(30);
        let first = store.try_lock("n", "o", ttl).await.unwrap().unwrap();
        let again = {
            let store = store.clone();
            tokio::spawn(async move { store.try_lock("n", "o", ttl).await })
        };
        while store.engine().calls.load(Ordering::SeqCst) < 2 {
            tokio::task::yield_now().await;
        }
        let released_at = Instant::now();
        assert!(first.release().await.unwrap());
        store.engine().let_through.notify_one();
        let again = again.await.unwrap().unwrap().expect("granted");
        assert!(
            again.valid_until() <= released_at + Duration::from_millis(1),
            "the re-acquired handle promises a lease released {:?} ago",
            released_at.elapsed()
        );
        // Later acquires, sent after the release answered, are not affected.
        drop(again);
        let later = store.try_lock("n", "o", ttl).await.unwrap().unwrap();
        assert!(later.valid_until() > Instant::now() + Duration::from_secs(20));
        assert!(later.release().await.unwrap());
    }

    #[tokio::test]
    async fn a_listener_that_hangs_does_not_stretch_the_wait() {
        let store = EngineStore::new(TestEngine::new(Script::HeldWithHangingListener));
        let asked = Instant::now();
        let wait = Duration::from_millis(200);
        let got = store
            .lock("busy", "me", Duration::from_secs(5), wait)
            .await
            .unwrap();
        assert!(got.is_none());
        let took = asked.elapsed();
        assert!(took >= wait, "gave up early: {took:?}");
        // The listener hangs for 30 s; a bounded wait returns long before.
        assert!(
            took < wait + Duration::from_secs(3),
            "overran the wait: {took:?}"
        );
    }
}
