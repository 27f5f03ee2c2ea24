//! The storage side of a store: what an engine implements so that
//! [`EngineStore`](crate::EngineStore) can give it the whole contract.
//!
//! An engine only moves rows. Validation, the duration guard, the closed-store
//! posture, tracing, the handle and the waiting loop live once, in the core,
//! and hold for every engine alike.

use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::duration::LeaseMillis;
use crate::error::BoxError;
use crate::permit::{HeldAs, PermitSlot};
use crate::queue::{Queue, Queued, Waiter};
use crate::rw::{Access, RwMode};
use crate::store::{Holder, Listed};
use crate::wake::ReleaseBus;

/// The identity of one grant: `renew` and `release` act on exactly this.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GrantKey {
    /// The lock name.
    pub name: String,
    /// The owner the grant was made to.
    pub owner: String,
    /// The grant's fencing token.
    pub fence: u64,
    /// The permit, for a semaphore's grant; `None` otherwise.
    pub permit: Option<PermitSlot>,
    /// The access, for a reader-writer lock's grant; `None` otherwise.
    pub access: Option<Access>,
}

impl GrantKey {
    /// The slot of the grant's row in a permits table: a permit's slot, a
    /// reader's slot, or [`WRITER_SLOT`](crate::WRITER_SLOT); `None` for a
    /// plain lock (whose row is the name's own).
    pub fn row_slot(&self) -> Option<i64> {
        match (self.permit, self.access) {
            (Some(permit), _) => Some(i64::from(permit.slot)),
            (None, Some(access)) => Some(access.row_slot()),
            (None, None) => None,
        }
    }
}

/// What one acquire attempt found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// Granted: a fresh insert, a takeover of an expired row, or the same
    /// owner's live row (then `fence` and `left` are that row's, unchanged).
    Granted {
        /// The grant's fencing token.
        fence: u64,
        /// Lease time left by the engine's clock when it decided (the
        /// ttl for a fresh grant): the same name as [`Holder::expires_in`].
        expires_in: Duration,
    },
    /// Someone else holds a live lease. `expires_in` is what is left of it,
    /// when the engine saw the row (a waiting acquire sleeps no longer than that).
    /// Also the answer when a concurrent grant won the race after the
    /// engine's snapshot, or when the attempt's deadline ran out before it
    /// could decide (then `expires_in` is `None`).
    Held {
        /// Lease time left of the live holder, if known.
        expires_in: Option<Duration>,
    },
    /// Refused, and the waiting call stands in the name's queue (an engine
    /// that [queues](Engine::queues), for [`Queue::Waiting`]): what
    /// [`Attempt::Held`] says, and where it stands.
    Queued {
        /// Lease time left of the live holder, if one holds and it is known.
        expires_in: Option<Duration>,
        /// Its ticket and place.
        queued: Queued,
    },
    /// Live permits of a semaphore hold `name` (a name is a lock or a
    /// semaphore, never both at once). Nothing was written.
    HeldAsSemaphore {
        /// The semaphore's permits, as its live grants say.
        permits: u32,
    },
    /// Live grants of a reader-writer lock, or a waiting writer's intent,
    /// hold `name`. Nothing was written.
    HeldAsReadWrite,
}

/// What one permit acquire attempt found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PermitAttempt {
    /// Granted: a free slot (never held, released, or expired) with a new
    /// fence, or the same owner's live permit (then its slot, fence and
    /// time left, unchanged).
    Granted {
        /// The grant's fencing token.
        fence: u64,
        /// The permit's slot, `0..permits`.
        slot: u32,
        /// Lease time left by the engine's clock when it decided.
        expires_in: Duration,
    },
    /// Every permit is held by someone else; `expires_in` is the soonest
    /// any of them ends (`None` when unknown, as for [`Attempt::Held`]).
    Held {
        /// Lease time left of the permit that ends first, if known.
        expires_in: Option<Duration>,
    },
    /// Refused, and the waiting call stands in the name's queue, as
    /// [`Attempt::Queued`].
    Queued {
        /// Lease time left of the permit that ends first, if known.
        expires_in: Option<Duration>,
        /// Its ticket and place.
        queued: Queued,
    },
    /// Live grants of the name have another number of permits. Nothing
    /// was written.
    Mismatch {
        /// The live grants' permits.
        permits: u32,
    },
    /// A live plain lock holds the name. Nothing was written.
    HeldAsLock,
    /// Live grants of a reader-writer lock, or a waiting writer's intent,
    /// hold the name. Nothing was written.
    HeldAsReadWrite,
}

/// What one reader-writer acquire attempt found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RwAttempt {
    /// Granted: a new grant with the next fence, or the same owner's live
    /// grant of the same mode (then its access, fence and time left,
    /// unchanged).
    Granted {
        /// The grant's fencing token.
        fence: u64,
        /// How the grant holds the name (a reader's slot, or the writer).
        access: Access,
        /// Lease time left by the engine's clock when it decided.
        expires_in: Duration,
    },
    /// A writer (or a waiting writer's intent, for a reader) or readers (for
    /// a writer) hold the name; `expires_in` is the soonest any of them
    /// ends (`None` when unknown, as for [`Attempt::Held`]).
    Held {
        /// Lease time left of the grant (or intent) that ends first, if known.
        expires_in: Option<Duration>,
    },
    /// Refused, and the waiting call stands in the name's queue, as
    /// [`Attempt::Queued`].
    Queued {
        /// Lease time left of the grant that ends first, if known.
        expires_in: Option<Duration>,
        /// Its ticket and place.
        queued: Queued,
    },
    /// A lock or a semaphore holds the name. Nothing was written.
    HeldAsOther(HeldAs),
}

impl Attempt {
    /// A refusal: [`Attempt::Queued`] for a waiting call that stands in the
    /// queue, [`Attempt::Held`] otherwise.
    pub fn refused(expires_in: Option<Duration>, queued: Option<Queued>) -> Self {
        match queued {
            Some(queued) => Attempt::Queued { expires_in, queued },
            None => Attempt::Held { expires_in },
        }
    }
}

impl PermitAttempt {
    /// A refusal, as [`Attempt::refused`].
    pub fn refused(expires_in: Option<Duration>, queued: Option<Queued>) -> Self {
        match queued {
            Some(queued) => PermitAttempt::Queued { expires_in, queued },
            None => PermitAttempt::Held { expires_in },
        }
    }
}

impl RwAttempt {
    /// A refusal, as [`Attempt::refused`].
    pub fn refused(expires_in: Option<Duration>, queued: Option<Queued>) -> Self {
        match queued {
            Some(queued) => RwAttempt::Queued { expires_in, queued },
            None => RwAttempt::Held { expires_in },
        }
    }
}

/// The row operations of one storage engine.
///
/// Every method gets arguments that already passed validation. Each must be
/// atomic on its own; the clock that decides expiry is the engine's (the
/// server's clock for a shared server, the host's for an embedded file).
/// Errors are returned as they come from the driver; the core wraps them in
/// [`Error::Database`](crate::Error::Database).
#[async_trait]
pub trait Engine: Send + Sync + 'static {
    /// Grant `name` to `owner` when no unexpired row exists for it (insert, or
    /// take over an expired row with a new, higher fence); when `owner`'s own
    /// row is live, grant it again unchanged. A refusal must write nothing
    /// but a waiting call's ticket (a `try_` call's refusal writes nothing).
    ///
    /// `queue` is the attempt's standing toward the name's queue: an engine
    /// that [queues](Engine::queues) grants only in turn, draws, renews and
    /// removes tickets, and answers a refused waiting call
    /// [`Attempt::Queued`] (the rules: [`crate::queue`]); one that does not
    /// ignores it.
    ///
    /// `deadline` is when a waiting acquire gives up (`None` for `try_lock`).
    /// The attempt must not wait past it for anything another transaction or
    /// caller holds (a connection, a write lock, a row lock): when it runs
    /// out, it answers [`Attempt::Held`] with `expires_in: None`, having
    /// written nothing. It still makes one attempt that does not wait when
    /// the deadline has already passed.
    async fn acquire(
        &self,
        name: &str,
        owner: &str,
        ttl: LeaseMillis,
        queue: Queue,
        deadline: Option<Instant>,
    ) -> Result<Attempt, BoxError>;

    /// A permit of the semaphore `name` of `permits` permits (validated,
    /// 1 to [`MAX_PERMITS`](crate::MAX_PERMITS)), for `owner`, in one
    /// atomic step:
    /// - a live plain lock of `name`: [`PermitAttempt::HeldAsLock`];
    /// - live permits of another count: [`PermitAttempt::Mismatch`];
    /// - `owner`'s own live permit of `name`: granted again, unchanged;
    /// - fewer than `permits` live permits: the lowest free slot, with the
    ///   next fence (above every fence of the store that committed before);
    /// - otherwise [`PermitAttempt::Held`], with the soonest expiry.
    ///
    /// Refusals write nothing (but a waiting call's ticket); `queue` and
    /// `deadline` are as for [`Engine::acquire`].
    /// And [`Engine::acquire`] must answer [`Attempt::HeldAsSemaphore`] for a
    /// name with live permits. The default: not supported
    /// ([`PermitsUnsupported`](crate::PermitsUnsupported)).
    async fn acquire_permit(
        &self,
        name: &str,
        permits: u32,
        owner: &str,
        ttl: LeaseMillis,
        queue: Queue,
        deadline: Option<Instant>,
    ) -> Result<PermitAttempt, BoxError> {
        let _ = (name, permits, owner, ttl, queue, deadline);
        Err(crate::PermitsUnsupported.into())
    }

    /// A reader-writer lock's grant of `name` for `owner`, in one atomic
    /// step (docs/contract.md, "Reader-writer locks"):
    /// - a live lock or live permits of a semaphore:
    ///   [`RwAttempt::HeldAsOther`], nothing written;
    /// - `owner`'s own live grant of the same mode: granted again, unchanged;
    /// - [`RwMode::Read`]: granted on the lowest free reader slot with the
    ///   next fence when no writer is live, no waiting writer's intent is
    ///   live, and fewer than [`MAX_READERS`](crate::MAX_READERS) readers
    ///   are; else [`RwAttempt::Held`];
    /// - [`RwMode::Write`]: granted with the next fence when no writer and
    ///   no reader is live (whoever's intent is live), removing `owner`'s
    ///   own intent. Else [`RwAttempt::Held`]; and for a waiting writer
    ///   ([`Queue::Waiting`]), on an engine that does not queue, `owner`'s
    ///   intent is recorded to last the queue's `lease` from now unless
    ///   another writer's intent is live. That is the only write a refusal
    ///   may make; for [`Queue::Never`], a refusal writes nothing.
    ///
    /// An engine that [queues](Engine::queues) keeps no intent: it keeps
    /// tickets, and grants readers and writers phase-fairly
    /// ([`crate::queue`]).
    ///
    /// Every grant's fence is above every fence of the store that committed
    /// before it. `deadline` is as for [`Engine::acquire`]. And
    /// [`Engine::acquire`] and [`Engine::acquire_permit`] must answer
    /// `HeldAsReadWrite` for a name a reader-writer lock's grants or intent
    /// hold. The default: not supported
    /// ([`RwUnsupported`](crate::RwUnsupported)).
    #[allow(clippy::too_many_arguments)]
    async fn acquire_rw(
        &self,
        name: &str,
        mode: RwMode,
        owner: &str,
        ttl: LeaseMillis,
        queue: Queue,
        deadline: Option<Instant>,
    ) -> Result<RwAttempt, BoxError> {
        let _ = (name, mode, owner, ttl, queue, deadline);
        Err(crate::RwUnsupported.into())
    }

    /// Set the grant's expiry to now + `ttl` if its row is still there, still
    /// this grant's, and not expired. `Ok(false)` otherwise. A grant with a
    /// [`GrantKey::row_slot`] is a semaphore's or a reader-writer lock's:
    /// its row is that slot's in the permits table.
    async fn renew(&self, grant: &GrantKey, ttl: LeaseMillis) -> Result<bool, BoxError>;

    /// Whether [`Engine::renew_batch`] renews a batch in one round trip.
    /// When it does, the core sends every renewal a store's handles ask for
    /// within one beat as one batch; when not (the default), each renewal
    /// goes alone as it is asked, and a slow one holds up no other.
    fn batches_renewals(&self) -> bool {
        false
    }

    /// The shortest time between two batches of one store's renewals
    /// ([`crate::RENEWAL_BEAT`] by default, at most 20 batches a second): an
    /// engine whose batch costs more than one round trip may ask for a
    /// longer one. A renewal waits at most this long, or an eighth of its
    /// lease, for its batch.
    fn renewal_beat(&self) -> std::time::Duration {
        crate::RENEWAL_BEAT
    }

    /// Renews each grant of `batch` for its ttl, as [`Engine::renew`]
    /// would, in one round trip ([`Engine::batches_renewals`]). The answers
    /// come in `batch`'s order, one per grant; an `Err` of the whole says
    /// that none of them is known to have been renewed or not (as a
    /// renewal's own error does). A `false` need not be final: the core
    /// renews each grant answered `false` once more alone, so a batch may
    /// skip a row it would have to wait for. The default renews them one
    /// by one.
    async fn renew_batch(
        &self,
        batch: &[(GrantKey, LeaseMillis)],
    ) -> Result<Vec<Result<bool, BoxError>>, BoxError> {
        let mut answers = Vec::with_capacity(batch.len());
        for (grant, ttl) in batch {
            answers.push(self.renew(grant, *ttl).await);
        }
        Ok(answers)
    }

    /// Delete the grant's row, expired or not; `Ok(true)` if it was there.
    /// The core signals [`Engine::releases`] for waiters in this process
    /// when it answers `true`; an engine signals other processes (if it
    /// can) itself.
    async fn release(&self, grant: &GrantKey) -> Result<bool, BoxError>;

    /// The live holder of the plain lock `name`, if any (never a permit).
    async fn holder(&self, name: &str) -> Result<Option<Holder>, BoxError>;

    /// Delete every expired row (locks' and permits'); how many.
    async fn purge_expired(&self) -> Result<u64, BoxError>;

    /// Up to `limit` live rows whose names start with `prefix` (every name
    /// when it is empty) and sort after `after` (from the first when `None`),
    /// in the byte order of their names (UTF-8 bytes compared unsigned, as
    /// `str`'s `Ord` does), read in one statement.
    ///
    /// A semaphore's name lists each live permit, in slot order, with its
    /// [`Listed::permit`]; a reader-writer lock's its writer or each
    /// reader, in slot order, with its [`Listed::access`] (a waiting
    /// writer's intent is not a grant and is not listed). A page ends with a whole name: when the
    /// `limit`-th row is a permit, every live permit of its name is on the
    /// page too (so a page holds up to
    /// [`MAX_PERMITS`](crate::MAX_PERMITS)` - 1` rows more than `limit`).
    async fn list(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Listed>, BoxError>;

    /// Delete the live row of `name`, whoever holds it; the holder it had.
    /// An expired row is left alone (`None`): purging is
    /// [`Engine::purge_expired`]'s. The core wakes this process's waiters
    /// when it answers `Some`; an engine signals other processes (if it
    /// can) itself, as for a release. A removal answered must stay removed
    /// through a crash: the operator was told the name is free. With
    /// `fence`, only the live grant of that fence is removed: any other
    /// live grant (or none) answers `None` and stays. Without `fence`,
    /// only a plain lock is removed (a semaphore's permits answer `None`);
    /// with it, a permit of that fence is removed as a lock's grant is.
    async fn force_release(
        &self,
        name: &str,
        fence: Option<u64>,
    ) -> Result<Option<Holder>, BoxError>;

    /// Raise the fence counter so that every later grant's fence is at
    /// least `by` above every fence handed out before (`by` checked by the
    /// core); answer the lowest fence a later grant can get. Never lower
    /// it. Retire every row granted before ([`Store::raise_fences`](crate::Store::raise_fences)):
    /// its renewals answer `false`, its owner's ask takes it over with a
    /// new fence, others are refused until it expires. When the lowest
    /// fence a later grant can get would be above [`MAX_FENCE`](crate::MAX_FENCE),
    /// refuse with [`NoFenceLeft`](crate::NoFenceLeft) (how many are left)
    /// and write nothing. Durable before answered. The default: not
    /// supported.
    ///
    /// Grants likewise: a grant whose fence would be above `MAX_FENCE` is
    /// refused with `NoFenceLeft { left: 0 }`, nothing written.
    async fn raise_fences(&self, by: u64) -> Result<u64, BoxError> {
        let _ = by;
        Err(crate::RaiseUnsupported.into())
    }

    /// Whether this engine keeps queues: it grants waiting calls first
    /// come, first served (and reader-writer locks phase-fairly), by the
    /// tickets [`Queue::Waiting`] asks for ([`crate::queue`]). An engine
    /// that does not is waited on as before queues: a release wakes the
    /// waiters, the first attempt to land wins. The default: `false`.
    fn queues(&self) -> bool {
        false
    }

    /// Removes the waiting call's `ticket` from `name`'s queue (it stopped
    /// waiting, ungranted); `Ok(false)` when it was not there (lapsed, or
    /// granted). An engine that queues signals the waiter behind it
    /// ([`ReleaseBus::dequeued`]) in other processes if it can; the core
    /// does in this one. The default: nothing to remove.
    async fn leave_queue(&self, name: &str, ticket: u64) -> Result<bool, BoxError> {
        let _ = (name, ticket);
        Ok(false)
    }

    /// The live tickets of `name`'s queue, oldest first (for an operator:
    /// `alkstore show`). The default: none.
    async fn waiters(&self, name: &str) -> Result<Vec<Waiter>, BoxError> {
        let _ = name;
        Ok(Vec::new())
    }

    /// Release the engine's resources (connections, threads).
    async fn close(&self) -> Result<(), BoxError>;

    /// Where this engine signals releases, for waiting acquires.
    fn releases(&self) -> &ReleaseBus;

    /// Called once before a waiting acquire's first attempt: start whatever
    /// carries releases from other processes. A failure here only means the
    /// waiter falls back to polling.
    async fn prepare_wait(&self) -> Result<(), BoxError> {
        Ok(())
    }

    /// The engine's name, as metrics label it (`"sqlite"`, `"postgres"`):
    /// a short constant, never anything that names a lock or a host.
    fn name(&self) -> &'static str {
        "unnamed"
    }

    /// The longest a waiting acquire sleeps between attempts when no release
    /// signal comes (releases from processes this engine cannot hear, and
    /// holders that crash).
    fn poll_ceiling(&self) -> Duration {
        Duration::from_millis(250)
    }

    /// The longest the first two waiters in a name's queue sleep between
    /// attempts: the one whose turn is next, and the one behind it. An
    /// engine that cannot tell waiters in other processes of a release or
    /// of a waiter's leaving (it polls) sets it below
    /// [`Engine::poll_ceiling`], so that a handoff across processes waits
    /// for one quick poll, not for the slow polls of every waiter. The
    /// default: [`Engine::poll_ceiling`].
    fn turn_poll_ceiling(&self) -> Duration {
        self.poll_ceiling()
    }
}

/// The store holds a layout version this build can neither use nor
/// upgrade. (A layout it can upgrade is upgraded in place when a role that
/// may change the store's objects opens it.)
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the store holds alkstore schema version {found}; this build uses version {known} and \
     cannot upgrade it: use a build that knows version {found}. Dropping the store's objects \
     to start over restarts fences at 1: do it only where no fence handed out still matters"
)]
pub struct SchemaVersionError {
    /// The version found in the store.
    pub found: i64,
    /// The version this build understands.
    pub known: i64,
}

impl SchemaVersionError {
    /// `Ok` when the store's version `found` is this build's `known` one.
    pub fn check(found: i64, known: i64) -> Result<(), Self> {
        if found == known {
            Ok(())
        } else {
            Err(SchemaVersionError { found, known })
        }
    }
}

/// A lease time left as SQL computes it (`expires_at - now`, whole
/// milliseconds) as a `Duration`: a negative value (a row that expired
/// between two reads of the clock) is no time left.
pub fn lease_left(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// A holder as SQL answers it: owner, fence, and lease time left in whole
/// milliseconds ([`fence_from_sql`], [`lease_left`]).
pub fn holder_from_sql(owner: String, fence: i64, expires_in_ms: i64) -> crate::Holder {
    crate::Holder {
        owner,
        fence: fence_from_sql(fence),
        expires_in: lease_left(expires_in_ms),
    }
}

/// A fence as SQL stores it (`bigint`, `INTEGER`) as the token handed out.
/// Fences start at 1; a value below (never written by an engine) reads as 0.
pub fn fence_from_sql(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

/// A fence handed out, as SQL stores it. Engines draw fences from a 64-bit
/// signed counter, so every fence they handed out fits; a larger one (never
/// handed out) reads as `i64::MAX`, which matches no row.
pub fn fence_to_sql(fence: u64) -> i64 {
    i64::try_from(fence).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_clamp_what_cannot_be() {
        assert_eq!(lease_left(-5), Duration::ZERO);
        assert_eq!(lease_left(1500), Duration::from_millis(1500));
        assert_eq!(fence_from_sql(-1), 0);
        assert_eq!(fence_from_sql(42), 42);
        assert_eq!(fence_to_sql(42), 42);
        assert_eq!(fence_to_sql(u64::MAX), i64::MAX);
    }

    #[test]
    fn only_this_builds_schema_version_is_accepted() {
        assert_eq!(SchemaVersionError::check(3, 3), Ok(()));
        for found in [0, 2, 4] {
            assert_eq!(
                SchemaVersionError::check(found, 3),
                Err(SchemaVersionError { found, known: 3 })
            );
        }
    }
}
