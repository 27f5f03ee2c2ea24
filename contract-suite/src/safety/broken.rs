//! A deliberately broken engine, for the negative control: it ignores expiry
//! and ownership on acquire and grants every request. A checker that passes
//! this engine proves nothing; the safety suite must catch it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use alkstore_core::{Attempt, BoxError, Engine, GrantKey, Holder, LeaseMillis, ReleaseBus};
use async_trait::async_trait;

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
    ) -> Result<Attempt, BoxError> {
        let fence = self.fences.fetch_add(1, Ordering::SeqCst) + 1;
        self.rows
            .lock()
            .unwrap()
            .insert(name.to_owned(), (owner.to_owned(), fence));
        Ok(Attempt::Granted {
            fence,
            left: ttl.as_duration(),
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
