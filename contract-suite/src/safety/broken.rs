//! A deliberately broken engine, for the negative control: it ignores expiry
//! and ownership on acquire and grants every request. A checker that passes
//! this engine proves nothing; the safety suite must catch it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use alkstore_core::{
    Attempt, BoxError, Engine, GrantKey, Holder, LeaseMillis, Listed, Queue, ReleaseBus,
};
use async_trait::async_trait;

/// What the negative-control engines answer to the operator's calls: they
/// exist to prove the safety checkers, which never list or force.
const NOT_FOR_LISTING: &str = "a negative-control engine neither lists nor forces releases";

/// Grants every acquire. Never use it for anything but proving a checker.
#[derive(Debug, Default)]
pub struct GrantsEverything {
    fences: AtomicU64,
    rows: Mutex<HashMap<String, (String, u64)>>,
    bus: ReleaseBus,
}

#[async_trait]
impl Engine for GrantsEverything {
    async fn acquire(
        &self,
        name: &str,
        owner: &str,
        ttl: LeaseMillis,
        _queue: Queue,
        _deadline: Option<std::time::Instant>,
    ) -> Result<Attempt, BoxError> {
        let fence = self.fences.fetch_add(1, Ordering::SeqCst) + 1;
        self.rows
            .lock()
            .unwrap()
            .insert(name.to_owned(), (owner.to_owned(), fence));
        Ok(Attempt::Granted {
            fence,
            expires_in: ttl.as_duration(),
        })
    }

    async fn renew(&self, grant: &GrantKey, _: LeaseMillis) -> Result<bool, BoxError> {
        Ok(self
            .rows
            .lock()
            .unwrap()
            .get(&grant.name)
            .is_some_and(|(_, f)| *f == grant.fence))
    }

    async fn release(&self, grant: &GrantKey) -> Result<bool, BoxError> {
        let mut rows = self.rows.lock().unwrap();
        if rows
            .get(&grant.name)
            .is_some_and(|(_, f)| *f == grant.fence)
        {
            rows.remove(&grant.name);
            return Ok(true);
        }
        Ok(false)
    }

    async fn holder(&self, name: &str) -> Result<Option<Holder>, BoxError> {
        Ok(self
            .rows
            .lock()
            .unwrap()
            .get(name)
            .map(|(owner, fence)| Holder {
                owner: owner.clone(),
                fence: *fence,
                expires_in: Duration::from_secs(1),
            }))
    }

    async fn list(&self, _: &str, _: Option<&str>, _: usize) -> Result<Vec<Listed>, BoxError> {
        Err(NOT_FOR_LISTING.into())
    }

    async fn force_release(&self, _: &str, _: Option<u64>) -> Result<Option<Holder>, BoxError> {
        Err(NOT_FOR_LISTING.into())
    }

    async fn purge_expired(&self) -> Result<u64, BoxError> {
        Ok(0)
    }

    async fn close(&self) -> Result<(), BoxError> {
        Ok(())
    }

    fn releases(&self) -> &ReleaseBus {
        &self.bus
    }
}

/// Exclusive and expiring like a correct engine, but it draws each fence
/// before it checks the name (as an `INSERT` whose default is evaluated
/// before its conflict check does), pausing in between as a descheduled
/// backend would: a slow contender can be granted a fence below one granted
/// and released meanwhile. Clones share one storage, so several stores over
/// clones race like independent processes. For the commit-order negative
/// control only.
#[derive(Debug, Clone, Default)]
pub struct DrawsFenceEarly {
    shared: std::sync::Arc<EarlyShared>,
}

#[derive(Debug, Default)]
struct EarlyShared {
    fences: AtomicU64,
    /// name → (owner, fence, expiry)
    rows: Mutex<HashMap<String, (String, u64, std::time::Instant)>>,
    bus: ReleaseBus,
}

#[async_trait]
impl Engine for DrawsFenceEarly {
    async fn acquire(
        &self,
        name: &str,
        owner: &str,
        ttl: LeaseMillis,
        _queue: Queue,
        _deadline: Option<std::time::Instant>,
    ) -> Result<Attempt, BoxError> {
        let fence = self.shared.fences.fetch_add(1, Ordering::SeqCst) + 1;
        // The pause between drawing and checking.
        let pause = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos() % 2000)
            .unwrap_or(0);
        tokio::time::sleep(Duration::from_micros(u64::from(pause))).await;
        let now = std::time::Instant::now();
        let mut rows = self.shared.rows.lock().unwrap();
        if let Some((holder, held_fence, expires)) = rows.get(name) {
            if *expires > now {
                let left = *expires - now;
                return Ok(if holder == owner {
                    Attempt::Granted {
                        fence: *held_fence,
                        expires_in: left,
                    }
                } else {
                    Attempt::Held {
                        expires_in: Some(left),
                    }
                });
            }
        }
        rows.insert(
            name.to_owned(),
            (owner.to_owned(), fence, now + ttl.as_duration()),
        );
        Ok(Attempt::Granted {
            fence,
            expires_in: ttl.as_duration(),
        })
    }

    async fn renew(&self, grant: &GrantKey, ttl: LeaseMillis) -> Result<bool, BoxError> {
        let now = std::time::Instant::now();
        let mut rows = self.shared.rows.lock().unwrap();
        match rows.get_mut(&grant.name) {
            Some((owner, fence, expires))
                if *owner == grant.owner && *fence == grant.fence && *expires > now =>
            {
                *expires = now + ttl.as_duration();
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn release(&self, grant: &GrantKey) -> Result<bool, BoxError> {
        let mut rows = self.shared.rows.lock().unwrap();
        let mine = rows
            .get(&grant.name)
            .is_some_and(|(owner, fence, _)| *owner == grant.owner && *fence == grant.fence);
        if mine {
            rows.remove(&grant.name);
        }
        Ok(mine)
    }

    async fn holder(&self, name: &str) -> Result<Option<Holder>, BoxError> {
        let now = std::time::Instant::now();
        Ok(self
            .shared
            .rows
            .lock()
            .unwrap()
            .get(name)
            .filter(|(_, _, expires)| *expires > now)
            .map(|(owner, fence, expires)| Holder {
                owner: owner.clone(),
                fence: *fence,
                expires_in: *expires - now,
            }))
    }

    async fn list(&self, _: &str, _: Option<&str>, _: usize) -> Result<Vec<Listed>, BoxError> {
        Err(NOT_FOR_LISTING.into())
    }

    async fn force_release(&self, _: &str, _: Option<u64>) -> Result<Option<Holder>, BoxError> {
        Err(NOT_FOR_LISTING.into())
    }

    async fn purge_expired(&self) -> Result<u64, BoxError> {
        let now = std::time::Instant::now();
        let mut rows = self.shared.rows.lock().unwrap();
        let before = rows.len();
        rows.retain(|_, (_, _, expires)| *expires > now);
        Ok((before - rows.len()) as u64)
    }

    async fn close(&self) -> Result<(), BoxError> {
        Ok(())
    }

    fn releases(&self) -> &ReleaseBus {
        &self.shared.bus
    }
}
