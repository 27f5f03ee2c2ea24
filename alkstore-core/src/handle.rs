//! The grant handle every [`EngineStore`](crate::EngineStore) hands out.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::Notify;
use tracing::{Instrument, field};

use crate::duration::LeaseMillis;
use crate::engine::{Engine, GrantKey};
use crate::engine_store::Shared;
use crate::error::{Error, Result};
use crate::finish::run_to_end;
use crate::grant::{self, SharedGrant};
use crate::metrics::{self, RELEASE_TOTAL, RENEW_TOTAL};
use crate::permit::PermitSlot;
use crate::renewals;
use crate::rw::Access;
use crate::store::Lock;

/// One grant: renew and release act on exactly this name + owner + fence.
#[must_use = "dropping a lock handle leaves the lease held until its TTL runs out"]
pub(crate) struct EngineLock<E: Engine> {
    shared: Arc<Shared<E>>,
    key: GrantKey,
    /// Shared with every other handle of this grant from this store.
    /// `None` only once `Drop` gave it back.
    state: Option<SharedGrant>,
    /// Set once a release was sent (or the lease is let lapse on purpose),
    /// so `Drop` stays quiet.
    released: AtomicBool,
}

impl<E: Engine> EngineLock<E> {
    /// A handle to the grant `key`, certainly valid until `valid_until`. A
    /// second live handle of one grant from this store (the same owner
    /// string asking twice) shares the first one's state, and is warned of
    /// once: two holders that share an owner string share one grant.
    pub(crate) fn new(shared: Arc<Shared<E>>, key: GrantKey, valid_until: Instant) -> Self {
        let (state, first_shared) = shared.grants.handed_out(&key, valid_until);
        if first_shared {
            tracing::warn!(
                name = %key.name,
                owner = %key.owner,
                fence = key.fence,
                "the same grant was handed out again while a handle to it is live: an owner \
                 string names one holder; two holders sharing it share one grant (and \
                 exclude nothing between them). Give each holder its own owner id"
            );
        }
        EngineLock {
            shared,
            key,
            state: Some(state),
            released: AtomicBool::new(false),
        }
    }

    fn state(&self) -> &SharedGrant {
        self.state.as_ref().expect("present until drop")
    }

    fn deadline(&self) -> Instant {
        grant::valid_until(self.state())
    }
}

impl<E: Engine> std::fmt::Debug for EngineLock<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock")
            .field("name", &self.key.name)
            .field("owner", &self.key.owner)
            .field("fence", &self.key.fence)
            .field("permit", &self.key.permit)
            .field("access", &self.key.access)
            .field("valid_until", &self.deadline())
            .finish()
    }
}

/// Spends from tokio's cooperative budget (yielding when it is used up)
/// before a renewal or release changes any state, so that dropping the call
/// there leaves nothing half done. Without it, a loop of calls on an engine
/// that answers without ever waiting (one in memory) would never give its
/// worker thread back to other tasks.
async fn cooperate() {
    tokio::task::consume_budget().await;
}

#[async_trait]
impl<E: Engine> Lock for EngineLock<E> {
    fn name(&self) -> &str {
        &self.key.name
    }

    fn owner(&self) -> &str {
        &self.key.owner
    }

    fn fence(&self) -> u64 {
        self.key.fence
    }

    fn permit(&self) -> Option<PermitSlot> {
        self.key.permit
    }

    fn access(&self) -> Option<Access> {
        self.key.access
    }

    fn valid_until(&self) -> Instant {
        self.deadline()
    }

    fn valid_until_lowered(&self) -> Option<Arc<Notify>> {
        Some(grant::lowered(self.state()))
    }

    async fn renew(&self, ttl: Duration) -> Result<bool> {
        cooperate().await;
        let key = &self.key;
        let span = tracing::debug_span!("alkstore.renew", name = %key.name, owner = %key.owner, fence = key.fence, outcome = field::Empty);
        async {
            let ttl = LeaseMillis::new(ttl).map_err(|e| Error::database("renew", e))?;
            self.shared.check_open("renew")?;
            // Sent alone or in the store's next batch (`renewals`), which
            // runs to its answer and records it even if this future is
            // dropped: a renewal given up on may still land (PostgreSQL runs a statement to its end
            // after the client left), and until its answer is known the
            // grant's deadline cannot go up.
            let answer =
                renewals::renew(&self.shared, key.clone(), ttl, self.state().clone()).await;
            let outcome = metrics::outcome(&answer, "renewed", "lost");
            metrics::count(
                RENEW_TOTAL,
                &[("engine", self.shared.engine.name()), ("outcome", outcome)],
            );
            let renewed = answer.map_err(|e| Error::database("renew", e))?;
            tracing::Span::current().record("outcome", if renewed { "renewed" } else { "lost" });
            Ok(renewed)
        }
        .instrument(span)
        .await
    }

    async fn release(self: Box<Self>) -> Result<bool> {
        // The handle is consumed whatever happens: no release hides in Drop.
        self.release_shared().await
    }

    fn let_lapse(self: Box<Self>) {
        // Quiet on drop, as after a release: the lapse is meant.
        self.released.store(true, Ordering::Release);
    }

    async fn release_shared(&self) -> Result<bool> {
        cooperate().await;
        self.released.store(true, Ordering::Release);
        let key = &self.key;
        let span = tracing::debug_span!("alkstore.release", name = %key.name, owner = %key.owner, fence = key.fence, outcome = field::Empty);
        async {
            self.shared.check_open("release")?;
            // Whatever it answers (or if it never answers), this grant can
            // no longer be counted on from the moment the release is sent,
            // by any handle of it that shares this state.
            let sent = Instant::now();
            grant::ended(self.state(), sent);
            // Remembered for the acquires in flight, which may come back
            // with this grant read before the release committed.
            self.shared.grants.release_sent(key, sent);
            // Like a renewal, the release runs to its answer even if this
            // future is dropped: a DELETE whose caller stopped waiting may
            // still commit, and the memory of it must last until it did.
            let (shared, task_key) = (self.shared.clone(), key.clone());
            let released = run_to_end(async move {
                let released = shared.engine.release(&task_key).await;
                if matches!(released, Ok(true)) {
                    // Waiters in this process need not wait for a
                    // notification's trip, or a poll, to hear of it.
                    shared.engine.releases().released(&task_key.name);
                }
                shared.grants.release_answered(&task_key);
                released
            })
            .await;
            let outcome = metrics::outcome(&released, "released", "lost");
            metrics::count(
                RELEASE_TOTAL,
                &[("engine", self.shared.engine.name()), ("outcome", outcome)],
            );
            let released = released.map_err(|e| Error::database("release", e))?;
            tracing::Span::current().record("outcome", if released { "released" } else { "lost" });
            Ok(released)
        }
        .instrument(span)
        .await
    }
}

impl<E: Engine> Drop for EngineLock<E> {
    fn drop(&mut self) {
        let live = Instant::now() < self.deadline();
        if let Some(state) = self.state.take() {
            self.shared.grants.dropped(&self.key, state);
        }
        if !self.released.load(Ordering::Acquire) && live {
            tracing::warn!(
                name = %self.key.name,
                owner = %self.key.owner,
                fence = self.key.fence,
                "lock handle dropped while its lease is live; it stays held until its TTL runs out"
            );
        }
    }
}
