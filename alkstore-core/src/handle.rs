//! The grant handle every [`EngineStore`](crate::EngineStore) hands out.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tracing::{Instrument, field};

use crate::clock::valid_until;
use crate::duration::LeaseMillis;
use crate::engine::{Engine, GrantKey};
use crate::engine_store::Shared;
use crate::error::{Error, Result};
use crate::store::Lock;

/// One grant: renew and release act on exactly this name + owner + fence.
#[must_use = "dropping a lock handle leaves the lease held until its TTL runs out"]
pub(crate) struct EngineLock<E: Engine> {
    shared: Arc<Shared<E>>,
    key: GrantKey,
    valid_until: Mutex<Instant>,
    /// Set when `release` consumed the handle, so `Drop` stays quiet.
    released: bool,
}

impl<E: Engine> EngineLock<E> {
    pub(crate) fn new(
        shared: Arc<Shared<E>>,
        name: String,
        owner: String,
        fence: u64,
        valid_until: Instant,
    ) -> Self {
        EngineLock {
            shared,
            key: GrantKey { name, owner, fence },
            valid_until: Mutex::new(valid_until),
            released: false,
        }
    }

    fn deadline(&self) -> Instant {
        *self.valid_until.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<E: Engine> std::fmt::Debug for EngineLock<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock")
            .field("name", &self.key.name)
            .field("owner", &self.key.owner)
            .field("fence", &self.key.fence)
            .field("valid_until", &self.deadline())
            .finish()
    }
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

    fn valid_until(&self) -> Instant {
        self.deadline()
    }

    async fn renew(&self, ttl: Duration) -> Result<bool> {
        let key = &self.key;
        let span = tracing::debug_span!("alkstore.renew", name = %key.name, owner = %key.owner, fence = key.fence, outcome = field::Empty);
        async {
            let ttl = LeaseMillis::new(ttl).map_err(|e| Error::database("renew", e))?;
            self.shared.check_open("renew")?;
            let sent = Instant::now();
            let renewed = self
                .shared
                .engine
                .renew(key, ttl)
                .await
                .map_err(|e| Error::database("renew", e))?;
            if renewed {
                *self.valid_until.lock().unwrap_or_else(|e| e.into_inner()) =
                    valid_until(sent, ttl.as_duration());
            }
            tracing::Span::current().record("outcome", if renewed { "renewed" } else { "lost" });
            Ok(renewed)
        }
        .instrument(span)
        .await
    }

    async fn release(mut self: Box<Self>) -> Result<bool> {
        // The handle is consumed whatever happens: no release hides in Drop.
        self.released = true;
        let key = &self.key;
        let span = tracing::debug_span!("alkstore.release", name = %key.name, owner = %key.owner, fence = key.fence, outcome = field::Empty);
        async {
            self.shared.check_open("release")?;
            let released = self
                .shared
                .engine
                .release(key)
                .await
                .map_err(|e| Error::database("release", e))?;
            tracing::Span::current().record("outcome", if released { "released" } else { "lost" });
            Ok(released)
        }
        .instrument(span)
        .await
    }
}

impl<E: Engine> Drop for EngineLock<E> {
    fn drop(&mut self) {
        if !self.released && Instant::now() < self.deadline() {
            tracing::warn!(
                name = %self.key.name,
                owner = %self.key.owner,
                fence = self.key.fence,
                "lock handle dropped while its lease is live; it stays held until its TTL runs out"
            );
        }
    }
}
