//! The two traits every engine provides, and what `holder` reports.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::Notify;

use crate::error::{Error, Result};
use crate::permit::PermitSlot;
use crate::rw::Access;

/// A place where named locks live: one database, file or schema.
///
/// Every method validates its arguments (see [`validate_name`](crate::validate_name),
/// [`validate_owner`](crate::validate_owner) and [`LeaseMillis`](crate::LeaseMillis))
/// before it touches storage. Used as `dyn Store`.
#[async_trait]
pub trait Store: Send + Sync {
    /// Tries once to take `name` for `owner` with a lease of `ttl`.
    ///
    /// `Ok(None)`: held by someone else right now (no-work is a value, not an error).
    /// The same owner asking again while its own lease is live is granted the
    /// same grant again: same fence, expiry not refreshed.
    ///
    /// An owner string names **one holder** (one task, one job run), not a
    /// host or a process: two holders that share one share its grant and
    /// exclude nothing between them. Make ids with
    /// [`unique_owner`](crate::unique_owner); a second live handle of one
    /// grant in this store logs a `tracing` warning.
    async fn try_lock(
        &self,
        name: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<Box<dyn Lock>>>;

    /// Waits up to `wait` for the lock; `Ok(None)` when the wait runs out.
    /// The owner rule of [`Store::try_lock`] holds here too: one owner id
    /// per holder.
    ///
    /// Woken by releases, with a bounded back-off poll as the fallback. A `wait`
    /// of zero tries once; a `wait` too long for the clock (`Duration::MAX`)
    /// waits until granted. An attempt waiting on someone else (a busy file,
    /// a row lock, every connection in use) gives up when the wait runs out:
    /// `Ok(None)`, nothing written.
    async fn lock(
        &self,
        name: &str,
        owner: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<Box<dyn Lock>>>;

    /// Tries once to take a permit of the semaphore `name` of `permits`
    /// permits for `owner` with a lease of `ttl`: at most `permits` owners
    /// hold one at a time, each with its own lease and fence, and its slot
    /// ([`Lock::permit`]).
    ///
    /// `Ok(None)`: every permit is held by someone else right now. The same
    /// owner asking again while its permit is live gets that permit back
    /// (same slot and fence, expiry not refreshed), as with
    /// [`Store::try_lock`]; the owner rule is the same.
    ///
    /// Errors, with nothing written: `permits` outside 1 to
    /// [`MAX_PERMITS`](crate::MAX_PERMITS)
    /// ([`Error::InvalidPermits`](crate::Error::InvalidPermits)); live
    /// grants of `name` with another number of permits
    /// ([`Error::PermitsMismatch`](crate::Error::PermitsMismatch)); `name`
    /// held by a plain lock
    /// ([`Error::HeldAsOtherKind`](crate::Error::HeldAsOtherKind)). A plain
    /// lock asked of a name live permits hold fails the same way.
    ///
    /// The default: not supported
    /// ([`PermitsUnsupported`](crate::PermitsUnsupported) in the source).
    async fn try_acquire_permit(
        &self,
        name: &str,
        permits: u32,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<Box<dyn Lock>>> {
        let _ = (name, permits, owner, ttl);
        Err(Error::database(
            "try_acquire_permit",
            crate::PermitsUnsupported,
        ))
    }

    /// Waits up to `wait` for a permit of the semaphore `name`, as
    /// [`Store::lock`] waits for a lock: woken by releases of any permit of
    /// the name, `Ok(None)` when the wait runs out. The rules and errors of
    /// [`Store::try_acquire_permit`] hold.
    async fn acquire_permit(
        &self,
        name: &str,
        permits: u32,
        owner: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<Box<dyn Lock>>> {
        let _ = (name, permits, owner, ttl, wait);
        Err(Error::database("acquire_permit", crate::PermitsUnsupported))
    }

    /// Tries once to take the reader-writer lock `name` as a reader for
    /// `owner` with a lease of `ttl`: readers share the name, a writer holds
    /// it alone ([`Lock::access`]).
    ///
    /// `Ok(None)`: a writer holds the name, or a writer waits for it
    /// ([`Store::write_lock`]): once a writer waits, new readers wait behind
    /// it. Also when [`MAX_READERS`](crate::MAX_READERS) readers hold it.
    /// The same owner asking again while its read grant is live gets that
    /// grant back (same fence, expiry not refreshed). A grant's fence is
    /// above every earlier writer's fence of the name.
    ///
    /// Errors, with nothing written: `name` held by a lock or a semaphore
    /// ([`Error::HeldAsOtherKind`](crate::Error::HeldAsOtherKind)); a lock
    /// or a permit asked of a name a reader-writer lock holds fails the
    /// same way.
    ///
    /// The default: not supported ([`RwUnsupported`](crate::RwUnsupported)
    /// in the source).
    async fn try_read_lock(
        &self,
        name: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<Box<dyn Lock>>> {
        let _ = (name, owner, ttl);
        Err(Error::database("try_read_lock", crate::RwUnsupported))
    }

    /// Waits up to `wait` to take `name` as a reader, as [`Store::lock`]
    /// waits for a lock: woken by releases of the name, `Ok(None)` when the
    /// wait runs out. The rules and errors of [`Store::try_read_lock`] hold.
    async fn read_lock(
        &self,
        name: &str,
        owner: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<Box<dyn Lock>>> {
        let _ = (name, owner, ttl, wait);
        Err(Error::database("read_lock", crate::RwUnsupported))
    }

    /// Tries once to take the reader-writer lock `name` as its writer for
    /// `owner` with a lease of `ttl`: granted only when no reader and no
    /// writer holds it, with a fence above every earlier grant's of the
    /// name. `Ok(None)` otherwise, with nothing written (no intent: only a
    /// waiting writer holds readers back). The same owner asking again
    /// while its write grant is live gets it back unchanged.
    ///
    /// Errors as for [`Store::try_read_lock`].
    async fn try_write_lock(
        &self,
        name: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<Box<dyn Lock>>> {
        let _ = (name, owner, ttl);
        Err(Error::database("try_write_lock", crate::RwUnsupported))
    }

    /// Waits up to `wait` to take `name` as its writer. While it waits, its
    /// intent holds new readers back (writer preference): the readers that
    /// hold the name finish, and the writer is granted when the last one
    /// releases or lapses. The intent lasts no longer than the wait, nor
    /// than `ttl` or [`MAX_INTENT`](crate::MAX_INTENT) (5 s) past the
    /// writer's last attempt: a writer that gives up, or whose future is
    /// dropped, holds readers back no longer than that.
    /// `Ok(None)` when the wait runs out. Errors as for
    /// [`Store::try_read_lock`].
    async fn write_lock(
        &self,
        name: &str,
        owner: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<Box<dyn Lock>>> {
        let _ = (name, owner, ttl, wait);
        Err(Error::database("write_lock", crate::RwUnsupported))
    }

    /// The current unexpired holder of the lock `name`, if any. A
    /// semaphore's permits are not a lock's holder (`None`): see
    /// [`Store::holders`].
    async fn holder(&self, name: &str) -> Result<Option<Holder>>;

    /// Every live grant of `name`: the lock's holder, each live permit of
    /// a semaphore in slot order ([`Listed::permit`]), or a reader-writer
    /// lock's writer or readers ([`Listed::access`]); empty when the
    /// name is free. One read (a [`Store::list`] page).
    async fn holders(&self, name: &str) -> Result<Vec<Listed>> {
        crate::validate_name(name)?;
        let mut page = self.list(name, None, 1).await?;
        page.retain(|listed| listed.name == name);
        Ok(page)
    }

    /// The waiters queued for `name`, oldest ticket first: who waits, for
    /// what, and how long its place lasts unless its next attempt renews
    /// it. Empty when nobody waits, and on an engine that does not queue
    /// ([`Engine::queues`](crate::Engine::queues)): there waiters keep no
    /// place to show.
    async fn waiters(&self, name: &str) -> Result<Vec<crate::Waiter>> {
        crate::validate_name(name)?;
        Ok(Vec::new())
    }

    /// Deletes every expired lock row; returns how many. Never called implicitly.
    async fn purge_expired(&self) -> Result<u64>;

    /// One page of the live holders whose names start with `prefix` (empty:
    /// every name), in the byte order of their names, starting after the name
    /// `after` (exclusive; `None`: from the first), at most `limit` of them
    /// (1 to [`MAX_LIST_LIMIT`]). The next page starts after the last name
    /// of this one; a page shorter than `limit` is the last.
    ///
    /// A semaphore's name is listed once per live permit, in slot order
    /// ([`Listed::permit`]), a reader-writer lock's once per reader, or
    /// once for its writer ([`Listed::access`]), and a page never splits a
    /// name: when the `limit`-th row is a permit or a reader, the page holds
    /// every live grant of its name (up to
    /// [`MAX_PERMITS`](crate::MAX_PERMITS)` - 1` rows more).
    ///
    /// Expired rows are never listed. Each page is one read: a page shows
    /// each name as it was when that read ran, and names granted or released
    /// between two pages may be missed or shown once more.
    async fn list(&self, prefix: &str, after: Option<&str>, limit: usize) -> Result<Vec<Listed>>;

    /// The operator's release: removes the live grant of `name` whoever holds
    /// it, and answers what it removed (`None`: the name was free).
    ///
    /// The removed grant's handles learn it at their next call: `renew` and
    /// `release` answer `false`, and a [`KeepAlive`](crate::KeepAlive) reports
    /// the lease lost. Until then the old holder still believes its
    /// `valid_until`: the next grant of the name has a higher fence, so what
    /// the old holder writes with its fence afterwards can be refused by
    /// whatever checks fences. Waiters for the name are woken as by a release.
    ///
    /// A semaphore's permits and a reader-writer lock's grants are removed
    /// one at a time, with [`Store::force_release_grant`]: for a name they
    /// hold, this fails with [`Error::HeldAsOtherKind`](crate::Error::HeldAsOtherKind)
    /// and removes nothing.
    async fn force_release(&self, name: &str) -> Result<Option<Holder>>;

    /// [`Store::force_release`] of one grant: removes the live grant of
    /// `name` only if its fence is `fence` (the one an operator was shown
    /// and confirmed), and answers it. `None`: the name is free or held by
    /// another grant (which stays held) — look again with
    /// [`Store::holder`].
    async fn force_release_grant(&self, name: &str, fence: u64) -> Result<Option<Holder>>;

    /// The operator's fence raise, for what the engine cannot see by itself
    /// (a store restored from a backup or into a new cluster, a chain of
    /// promotions inside one replication lag; docs/failover.md): every
    /// grant made after this answers has a fence at least `by` above every
    /// fence handed out before it began. Answers the lowest fence a later
    /// grant can get. Never lowers a fence.
    ///
    /// It also retires every grant made before it: such a grant is still
    /// live to everyone else (refused until it expires), but its renewals
    /// answer `false`, and its own owner asking again gets a new grant
    /// with a fence above the raise (a grant a restore or a promotion
    /// revived may carry a fence below fences handed out since).
    ///
    /// `by` must be [`MIN_FENCE_RAISE`] to [`MAX_FENCE_RAISE`]
    /// ([`Error::InvalidRaise`](crate::Error::InvalidRaise) otherwise,
    /// before any round trip). A raise that would leave no fence
    /// ([`MAX_FENCE`]) is refused with
    /// [`Error::FencesExhausted`](crate::Error::FencesExhausted), nothing
    /// written.
    async fn raise_fences(&self, by: u64) -> Result<u64> {
        let _ = by;
        Err(crate::Error::database(
            "raise_fences",
            crate::RaiseUnsupported,
        ))
    }

    /// Closes the store; every later call on it or its handles fails with
    /// [`Error::Database`](crate::Error::Database) holding [`Closed`](crate::Closed).
    /// Closing twice is not an error.
    async fn close(&self) -> Result<()>;
}

/// A granted lease on one name: the handle of one grant (name + owner + fence).
///
/// Dropping a handle does nothing to storage: the lease lapses at its TTL.
/// Release it to free the name at once.
#[async_trait]
#[must_use = "dropping a lock handle leaves the lease held until its TTL runs out"]
pub trait Lock: Send + Sync + std::fmt::Debug {
    /// The lock name.
    fn name(&self) -> &str;
    /// The owner this grant was made to.
    fn owner(&self) -> &str;
    /// Fencing token of this grant: strictly greater than every earlier grant's token for the same name.
    fn fence(&self) -> u64;
    /// The permit this grant holds, for a semaphore's; `None` for a lock's.
    /// Provided (as `None`) for implementations written before semaphores.
    fn permit(&self) -> Option<PermitSlot> {
        None
    }
    /// How this grant holds a reader-writer lock (a reader, or the writer);
    /// `None` for a lock's or a permit's. Provided (as `None`) for
    /// implementations written before reader-writer locks.
    fn access(&self) -> Option<Access> {
        None
    }
    /// A local deadline before which the lease is certainly still valid
    /// (conservative: the moment the request was sent, plus the lease time the
    /// engine reported left, less the clock's rounding margin).
    fn valid_until(&self) -> Instant;
    /// A signal notified (`notify_waiters`) whenever this handle's
    /// `valid_until` comes down: a renewal sent with a shorter ttl, a
    /// renewal answered "lost", a release of the grant through any handle
    /// of it. A [`KeepAlive`](crate::KeepAlive) waits on it between
    /// renewals; without one (`None`, the provided answer, for
    /// implementations that cannot tell) it looks at `valid_until` every
    /// 100 ms at most instead, which costs a wake-up each time.
    fn valid_until_lowered(&self) -> Option<Arc<Notify>> {
        None
    }
    /// New full window `ttl` from now (not added to the old one). `Ok(false)`: the lease is lost.
    async fn renew(&self, ttl: Duration) -> Result<bool>;
    /// `Ok(true)`: the row of this grant was still there and is now gone. `Ok(false)`: it was not there.
    async fn release(self: Box<Self>) -> Result<bool>;
    /// Lets the lease run out at its TTL on purpose: the handle goes without
    /// touching storage, and without the warning that dropping a live handle
    /// logs. For leases meant to outlast their holder's interest, such as a
    /// [schedule](crate::schedule)'s claim of a slot, which holds the slot
    /// to its end even when the run finished early.
    ///
    /// Provided for implementations written before it existed: it drops the
    /// handle.
    fn let_lapse(self: Box<Self>) {}

    /// What [`Lock::release`] does, through a shared reference: for a
    /// handle shared between tasks, such as the one a
    /// [`KeepAlive`](crate::KeepAlive) gives up when it cannot renew in
    /// time. The handle stays, spent: its `valid_until` is over, and a
    /// later `renew` or `release` of it answers `false`.
    ///
    /// Provided for implementations written before it existed: they answer
    /// an error, and a keep-alive that gives their lease up lets it lapse.
    async fn release_shared(&self) -> Result<bool> {
        Err(Error::database(
            "release",
            "this Lock implementation cannot be released through a shared reference",
        ))
    }
}

/// The most names one page of [`Store::list`] may ask for.
pub const MAX_LIST_LIMIT: usize = 1000;

/// The highest fence any engine hands out: 2^63 − 2 (fences are stored as
/// signed 64-bit integers, and MariaDB's sequences end one below their
/// maximum). A grant past it, or a raise that would leave no fence, is
/// refused with [`Error::FencesExhausted`](crate::Error::FencesExhausted).
pub const MAX_FENCE: u64 = (i64::MAX - 1) as u64;

/// The raise `alkstore raise-fences` makes when not told: 2^40, above any
/// number of grants a lost server can have handed out.
pub const DEFAULT_FENCE_RAISE: u64 = 1 << 40;

/// The least [`Store::raise_fences`] raises by: 2^20. A raise is one
/// statement, but grants drawing fences meanwhile could outrun a smaller
/// one on an engine whose counter cannot be locked (PostgreSQL sequences).
pub const MIN_FENCE_RAISE: u64 = 1 << 20;

/// The most [`Store::raise_fences`] raises by: 2^56, so that raises leave
/// fences room (they fit an `i64`).
pub const MAX_FENCE_RAISE: u64 = 1 << 56;

/// One live grant, as [`Store::list`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// The lock name.
    pub name: String,
    /// Its live holder.
    pub holder: Holder,
    /// The permit held, for a semaphore's grant; `None` otherwise.
    pub permit: Option<PermitSlot>,
    /// The access held, for a reader-writer lock's grant; `None` otherwise.
    pub access: Option<Access>,
}

/// The current holder of a name, as [`Store::holder`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// Who holds it.
    pub owner: String,
    /// The fence of the live grant.
    pub fence: u64,
    /// How much of the lease is left, by the engine's clock.
    pub expires_in: Duration,
}
