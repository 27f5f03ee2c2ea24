//! The two traits every engine provides, and what `holder` reports.

use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::error::{Error, Result};

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

    /// The current unexpired holder of `name`, if any.
    async fn holder(&self, name: &str) -> Result<Option<Holder>>;

    /// Deletes every expired lock row; returns how many. Never called implicitly.
    async fn purge_expired(&self) -> Result<u64>;

    /// One page of the live holders whose names start with `prefix` (empty:
    /// every name), in the byte order of their names, starting after the name
    /// `after` (exclusive; `None`: from the first), at most `limit` of them
    /// (1 to [`MAX_LIST_LIMIT`]). The next page starts after the last name
    /// of this one; a page shorter than `limit` is the last.
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
    /// grant can get. Never lowers a fence; live grants keep theirs.
    ///
    /// `by` must be [`MIN_FENCE_RAISE`] to [`MAX_FENCE_RAISE`]
    /// ([`Error::InvalidRaise`](crate::Error::InvalidRaise) otherwise,
    /// before any round trip).
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
    /// A local deadline before which the lease is certainly still valid
    /// (conservative: the moment the request was sent, plus the lease time the
    /// engine reported left, less the clock's rounding margin).
    fn valid_until(&self) -> Instant;
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

/// The least [`Store::raise_fences`] raises by: 2^20. A raise is one
/// statement, but grants drawing fences meanwhile could outrun a smaller
/// one on an engine whose counter cannot be locked (PostgreSQL sequences).
pub const MIN_FENCE_RAISE: u64 = 1 << 20;

/// The most [`Store::raise_fences`] raises by: 2^50, so that raises leave
/// fences room (they fit an `i64`).
pub const MAX_FENCE_RAISE: u64 = 1 << 50;

/// One live grant, as [`Store::list`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// The lock name.
    pub name: String,
    /// Its live holder.
    pub holder: Holder,
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
