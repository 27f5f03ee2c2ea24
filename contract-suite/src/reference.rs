//! The smallest engine that passes the whole contract: rows in a map behind
//! a mutex, the host's monotonic clock, a counter for fences. Written only
//! against `alkstore_core`'s published engine-author API, as
//! `docs/writing-an-engine.md` walks through it; `tests/memory_engine.rs`
//! runs the whole suite on it, and the [gallery](crate::gallery) breaks it
//! one rule at a time.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use alkstore_core::{Attempt, BoxError, Engine, GrantKey, Holder, LeaseMillis, Listed, ReleaseBus};

/// One grant's row.
#[derive(Debug, Clone)]
pub struct Row {
    /// The holder.
    pub owner: String,
    /// The grant's fence.
    pub fence: u64,
    /// When the lease ends, by this engine's clock.
    pub expires_at: Instant,
}

/// The rows of one "database", and the last fence handed out.
#[derive(Debug, Default)]
pub struct Rows {
    /// Each name's row.
    pub rows: HashMap<String, Row>,
    /// The last fence handed out.
    pub last_fence: u64,
}

impl Rows {
    /// The live holder of `name` at `now`, if any.
    pub fn live(&self, name: &str, now: Instant) -> Option<Holder> {
        self.rows
            .get(name)
            .filter(|row| row.expires_at > now)
            .map(|row| Holder {
                owner: row.owner.clone(),
                fence: row.fence,
                expires_in: row.expires_at - now,
            })
    }

    /// Up to `limit` live rows whose names start with `prefix` and sort
    /// after `after`, in name order (`str`'s `Ord` is byte order).
    pub fn list(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
        now: Instant,
    ) -> Vec<Listed> {
        let mut names: Vec<&String> = self
            .rows
            .iter()
            .filter(|(name, row)| {
                row.expires_at > now
                    && name.starts_with(prefix)
                    && after.is_none_or(|after| name.as_str() > after)
            })
            .map(|(name, _)| name)
            .collect();
        names.sort_unstable();
        names
            .into_iter()
            .take(limit)
            .filter_map(|name| {
                Some(Listed {
                    name: name.clone(),
                    holder: self.live(name, now)?,
                })
            })
            .collect()
    }

    /// A new grant of `name` to `owner`: the next fence, drawn under the
    /// same lock that makes the grant visible, so fences follow commit order.
    pub fn grant(&mut self, name: &str, owner: &str, ttl: Duration, now: Instant) -> Attempt {
        self.last_fence += 1;
        let row = Row {
            owner: owner.to_owned(),
            fence: self.last_fence,
            expires_at: now + ttl,
        };
        self.rows.insert(name.to_owned(), row);
        Attempt::Granted {
            fence: self.last_fence,
            expires_in: ttl,
        }
    }
}

/// What stores of one "database" share: the rows, and the bus that wakes
/// their waiters.
#[derive(Debug, Default)]
pub struct Shared {
    rows: Mutex<Rows>,
    bus: ReleaseBus,
}

/// The engine: every store made from clones of one engine sees the same
/// rows, as stores on one database do.
#[derive(Debug, Clone, Default)]
pub struct MemoryEngine(Arc<Shared>);

impl MemoryEngine {
    /// Runs `f` on the rows, under their lock.
    pub fn with_rows<T>(&self, f: impl FnOnce(&mut Rows) -> T) -> T {
        f(&mut self.0.rows.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

#[async_trait::async_trait]
impl Engine for MemoryEngine {
    async fn acquire(
        &self,
        name: &str,
        owner: &str,
        ttl: LeaseMillis,
        _deadline: Option<Instant>,
    ) -> Result<Attempt, BoxError> {
        let now = Instant::now();
        Ok(self.with_rows(
            |rows| match rows.rows.get(name).filter(|row| row.expires_at > now) {
                Some(row) if row.owner == owner => Attempt::Granted {
                    fence: row.fence,
                    expires_in: row.expires_at - now,
                },
                Some(row) => Attempt::Held {
                    expires_in: Some(row.expires_at - now),
                },
                None => rows.grant(name, owner, ttl.as_duration(), now),
            },
        ))
    }

    async fn renew(&self, grant: &GrantKey, ttl: LeaseMillis) -> Result<bool, BoxError> {
        let now = Instant::now();
        Ok(self.with_rows(|rows| match rows.rows.get_mut(&grant.name) {
            Some(row)
                if row.owner == grant.owner && row.fence == grant.fence && row.expires_at > now =>
            {
                row.expires_at = now + ttl.as_duration();
                true
            }
            _ => false,
        }))
    }

    async fn release(&self, grant: &GrantKey) -> Result<bool, BoxError> {
        Ok(self.with_rows(|rows| {
            let ours = rows
                .rows
                .get(&grant.name)
                .is_some_and(|row| row.owner == grant.owner && row.fence == grant.fence);
            if ours {
                rows.rows.remove(&grant.name);
            }
            ours
        }))
    }

    async fn holder(&self, name: &str) -> Result<Option<Holder>, BoxError> {
        let now = Instant::now();
        Ok(self.with_rows(|rows| rows.live(name, now)))
    }

    async fn list(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Listed>, BoxError> {
        let now = Instant::now();
        Ok(self.with_rows(|rows| rows.list(prefix, after, limit, now)))
    }

    async fn raise_fences(&self, by: u64) -> Result<u64, BoxError> {
        Ok(self.with_rows(|rows| {
            rows.last_fence += by;
            rows.last_fence + 1
        }))
    }

    async fn force_release(
        &self,
        name: &str,
        fence: Option<u64>,
    ) -> Result<Option<Holder>, BoxError> {
        let now = Instant::now();
        Ok(self.with_rows(|rows| {
            let live = rows
                .live(name, now)
                .filter(|holder| fence.is_none_or(|fence| holder.fence == fence));
            if live.is_some() {
                rows.rows.remove(name);
            }
            live
        }))
    }

    async fn purge_expired(&self) -> Result<u64, BoxError> {
        let now = Instant::now();
        Ok(self.with_rows(|rows| {
            let before = rows.rows.len();
            rows.rows.retain(|_, row| row.expires_at > now);
            (before - rows.rows.len()) as u64
        }))
    }

    async fn close(&self) -> Result<(), BoxError> {
        Ok(())
    }

    fn releases(&self) -> &ReleaseBus {
        &self.0.bus
    }

    fn name(&self) -> &'static str {
        "memory"
    }

    /// Long enough that a waiter found by its poll instead of woken by a
    /// release takes well over the 30 ms the wake-up cases allow (its stores
    /// share one bus, so a waiter hears every release; polls only find
    /// expiries, which the back-off naps until anyway).
    fn poll_ceiling(&self) -> Duration {
        Duration::from_millis(200)
    }
}
