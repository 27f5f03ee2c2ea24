//! The smallest engine that passes the whole contract: rows in a map behind
//! a mutex, the host's monotonic clock, a counter for fences. Written only
//! against the published API (`alkstore_core`'s engine-author items and
//! this crate), as `docs/writing-an-engine.md` walks through it — and run in
//! CI, so that the guide cannot rot.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use alkstore_core::{
    Attempt, BoxError, Engine, EngineStore, GrantKey, Holder, LeaseMillis, ReleaseBus, Store,
};

/// One grant's row.
#[derive(Debug, Clone)]
struct Row {
    owner: String,
    fence: u64,
    expires_at: Instant,
}

/// What stores of one "database" share: the rows, the last fence handed
/// out, and the bus that wakes their waiters.
#[derive(Debug, Default)]
struct Shared {
    rows: Mutex<(HashMap<String, Row>, u64)>,
    bus: ReleaseBus,
}

#[derive(Debug)]
struct MemoryEngine(Arc<Shared>);

#[async_trait::async_trait]
impl Engine for MemoryEngine {
    async fn acquire(
        &self,
        name: &str,
        owner: &str,
        ttl: LeaseMillis,
        _deadline: Option<Instant>,
    ) -> Result<Attempt, BoxError> {
        let mut guard = self.0.rows.lock().unwrap();
        let (rows, last_fence) = &mut *guard;
        let now = Instant::now();
        if let Some(row) = rows.get(name).filter(|row| row.expires_at > now) {
            let expires_in = row.expires_at - now;
            return Ok(if row.owner == owner {
                Attempt::Granted {
                    fence: row.fence,
                    expires_in,
                }
            } else {
                Attempt::Held {
                    expires_in: Some(expires_in),
                }
            });
        }
        // Fences in commit order: drawn under the same lock that makes the
        // grant visible.
        *last_fence += 1;
        let row = Row {
            owner: owner.to_owned(),
            fence: *last_fence,
            expires_at: now + ttl.as_duration(),
        };
        rows.insert(name.to_owned(), row);
        Ok(Attempt::Granted {
            fence: *last_fence,
            expires_in: ttl.as_duration(),
        })
    }

    async fn renew(&self, grant: &GrantKey, ttl: LeaseMillis) -> Result<bool, BoxError> {
        let mut guard = self.0.rows.lock().unwrap();
        let now = Instant::now();
        match guard.0.get_mut(&grant.name) {
            Some(row)
                if row.owner == grant.owner && row.fence == grant.fence && row.expires_at > now =>
            {
                row.expires_at = now + ttl.as_duration();
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn release(&self, grant: &GrantKey) -> Result<bool, BoxError> {
        let mut guard = self.0.rows.lock().unwrap();
        let ours = guard
            .0
            .get(&grant.name)
            .is_some_and(|row| row.owner == grant.owner && row.fence == grant.fence);
        if ours {
            guard.0.remove(&grant.name);
        }
        Ok(ours)
    }

    async fn holder(&self, name: &str) -> Result<Option<Holder>, BoxError> {
        let guard = self.0.rows.lock().unwrap();
        let now = Instant::now();
        Ok(guard
            .0
            .get(name)
            .filter(|row| row.expires_at > now)
            .map(|row| Holder {
                owner: row.owner.clone(),
                fence: row.fence,
                expires_in: row.expires_at - now,
            }))
    }

    async fn purge_expired(&self) -> Result<u64, BoxError> {
        let mut guard = self.0.rows.lock().unwrap();
        let now = Instant::now();
        let before = guard.0.len();
        guard.0.retain(|_, row| row.expires_at > now);
        Ok((before - guard.0.len()) as u64)
    }

    async fn close(&self) -> Result<(), BoxError> {
        Ok(())
    }

    fn releases(&self) -> &ReleaseBus {
        &self.0.bus
    }

    fn poll_ceiling(&self) -> Duration {
        Duration::from_millis(50)
    }
}

// The wiring: a fresh store per case, peers on the same rows. No more than this.
async fn fresh() -> Option<alkstore_contract_suite::Fresh> {
    let shared = Arc::new(Shared::default());
    let store = Arc::new(EngineStore::new(MemoryEngine(shared.clone())));
    Some(
        alkstore_contract_suite::Fresh::new(store).with_peers(move || {
            let peer = EngineStore::new(MemoryEngine(shared.clone()));
            std::future::ready(Arc::new(peer) as Arc<dyn Store>)
        }),
    )
}

alkstore_contract_suite::contract_tests!(fresh);
