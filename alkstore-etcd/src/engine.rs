//! The etcd engine's grant operations (docs/engine-etcd.md).
//!
//! Every grant is one key ([`crate::keys`]) on a lease of its own, granted
//! after the request was sent: the lease's end removes the key, so no
//! expired grant is ever read, and a watch sees an expiry as a release.
//! Every decision is made on one read of the name's keys, and written by a
//! transaction whose compares fail if anything under the name changed
//! since that read (or the fence base did): a lost race reads again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use alkstore_core::{
    Access, Attempt, BoxError, Engine, GrantKey, HeldAs, Holder, LeaseMillis, Listed, MAX_READERS,
    PermitAttempt, PermitSlot, ReleaseBus, RwAttempt, RwMode,
};
use async_trait::async_trait;
use futures::StreamExt;

use crate::client::{self, Client, Is, Target, Txn};
use crate::fence::{self, Base};
use crate::keys::{FenceRevision, GrantValue, Layout, Slot};
use crate::proto::mvccpb::KeyValue;
use crate::watcher::Watcher;

/// How many times an acquire reads again after losing a race before it
/// answers that the name is held.
const RACES: usize = 16;

/// The lease of a grant this engine made or found, by name and fence.
#[derive(Debug, Clone)]
struct Leased {
    key: Vec<u8>,
    lease: i64,
    /// The lease's TTL in seconds, as granted (0: unknown).
    ttl: i64,
    value: GrantValue,
    fence_revision: i64,
}

/// One grant key of a name, as read.
#[derive(Debug, Clone)]
struct Found {
    name: String,
    slot: Slot,
    kv: KeyValue,
    value: GrantValue,
}

impl Found {
    fn fence(&self) -> u64 {
        self.value.fence(&self.kv)
    }
}

/// A name's keys, as one read saw them.
#[derive(Debug)]
struct NameState {
    found: Vec<Found>,
    /// The revision of the read.
    revision: i64,
    base: Base,
}

impl NameState {
    fn of(&self, slot: Slot) -> Option<&Found> {
        self.found.iter().find(|f| f.slot == slot)
    }

    /// What other kind of grant holds the name, for a request of `kind`.
    fn held_as_other(&self, kind: Kind) -> Option<HeldAs> {
        self.found.iter().find_map(|f| {
            let theirs = Kind::of(f.slot);
            (theirs != kind).then_some(match theirs {
                Kind::Lock => HeldAs::Lock,
                Kind::Semaphore => HeldAs::Semaphore {
                    permits: f.value.permits,
                },
                Kind::ReadWrite => HeldAs::ReadWrite,
            })
        })
    }

    /// Whether the grant in `found` was made before the last fence raise
    /// (its renewals answer false; its owner's ask takes it over).
    fn retired(&self, found: &Found) -> bool {
        found.value.base < self.base.value
    }
}

/// The three kinds of grant a name can hold, one at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Lock,
    Semaphore,
    ReadWrite,
}

impl Kind {
    fn of(slot: Slot) -> Kind {
        match slot {
            Slot::Lock => Kind::Lock,
            Slot::Permit(_) => Kind::Semaphore,
            Slot::Reader(_) | Slot::Writer | Slot::Intent => Kind::ReadWrite,
        }
    }
}

/// What one decision on a name's state asks to be written.
#[derive(Debug)]
enum Write {
    /// A new grant in `slot` (over the owner's own retired grant there, if
    /// one), with `permits`.
    Grant { slot: Slot, permits: u32 },
    /// The owner's own live grant, answered unchanged.
    Again(Found),
}

/// A grant written: its fence and key.
#[derive(Debug)]
struct Granted {
    fence: u64,
    slot: Slot,
    expires_in: Duration,
}

/// The engine of one store: a prefix in one cluster.
#[derive(Debug)]
pub(crate) struct EtcdEngine {
    pub(crate) client: Client,
    pub(crate) layout: Layout,
    pub(crate) bus: Arc<ReleaseBus>,
    leased: Mutex<HashMap<(String, u64), Leased>>,
    watcher: Watcher,
}

/// Whole seconds of lease for `ttl`: rounded up, at least 1 (etcd's leases
/// are whole seconds; the cluster raises one below its minimum).
pub(crate) fn lease_seconds(ttl: LeaseMillis) -> i64 {
    i64::try_from(ttl.get().div_ceil(1000))
        .unwrap_or(i64::MAX)
        .max(1)
}

impl EtcdEngine {
    /// The engine over `client` under `layout`.
    pub(crate) fn new(client: Client, layout: Layout) -> EtcdEngine {
        let bus = Arc::new(ReleaseBus::new());
        EtcdEngine {
            watcher: Watcher::new(client.clone(), layout.clone(), bus.clone()),
            client,
            layout,
            bus,
            leased: Mutex::new(HashMap::new()),
        }
    }

    fn remember(&self, name: &str, fence: u64, leased: Leased) {
        self.leased
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((name.to_owned(), fence), leased);
    }

    fn forget(&self, name: &str, fence: u64) {
        self.leased
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(name.to_owned(), fence));
    }

    /// One read of `name`'s keys and the fence base.
    async fn read_name(&self, name: &str) -> Result<NameState, BoxError> {
        let txn = Txn::new()
            .read(self.layout.name_start(name), self.layout.name_end(name))
            .read(self.layout.base(), Vec::new());
        let answer = self.client.txn(txn).await?;
        let revision = client::revision(&answer);
        let mut reads = client::reads(answer).into_iter();
        let (keys, base) = (
            reads.next().unwrap_or_default(),
            reads.next().unwrap_or_default(),
        );
        let base = Base::from_read(base.kvs.first())?;
        Ok(NameState {
            found: self.decode(keys.kvs),
            revision,
            base,
        })
    }

    /// The grant keys among `kvs` (a key this build did not write is left
    /// out: it holds nothing).
    fn decode(&self, kvs: Vec<KeyValue>) -> Vec<Found> {
        kvs.into_iter()
            .filter_map(|kv| {
                let (name, slot) = self.layout.parse(&kv.key)?;
                let value = GrantValue::decode(&kv.value)?;
                Some(Found {
                    name,
                    slot,
                    kv,
                    value,
                })
            })
            .collect()
    }

    /// What is left of `lease` ([`time_left`]).
    async fn time_left(&self, lease: i64) -> Result<Duration, BoxError> {
        time_left(&self.client, lease).await
    }

    /// Reads `name`, lets `decide` choose, and writes what it chose under
    /// compares that fail if the name or the fence base changed since the
    /// read; reads again after a lost race. `Err(answer)` from `decide`
    /// answers without writing.
    async fn decide_and_write<T>(
        &self,
        name: &str,
        owner: &str,
        ttl: LeaseMillis,
        decide: impl Fn(&NameState) -> Result<Write, T>,
        lost: impl Fn() -> T,
    ) -> Result<Result<Granted, T>, BoxError> {
        for _ in 0..RACES {
            let state = self.read_name(name).await?;
            let (slot, permits) = match decide(&state) {
                Err(answer) => return Ok(Err(answer)),
                Ok(Write::Again(found)) => {
                    let expires_in = self.time_left(found.kv.lease).await?;
                    let fence = found.fence();
                    self.remember(
                        name,
                        fence,
                        Leased {
                            key: found.kv.key.clone(),
                            lease: found.kv.lease,
                            ttl: 0,
                            fence_revision: found.value.fence_revision(&found.kv),
                            value: found.value.clone(),
                        },
                    );
                    return Ok(Ok(Granted {
                        fence,
                        slot: found.slot,
                        expires_in,
                    }));
                }
                Ok(Write::Grant { slot, permits }) => (slot, permits),
            };
            fence::check_room(state.base.value, state.revision.saturating_add(1))?;
            let seconds = lease_seconds(ttl);
            let (lease, granted_ttl) = self.client.lease_grant(seconds).await?;
            let key = self.layout.key(name, slot);
            let over = state.of(slot).cloned();
            let value = GrantValue {
                base: state.base.value,
                revision: match over {
                    Some(_) => FenceRevision::Mod,
                    None => FenceRevision::Create,
                },
                permits,
                owner: owner.to_owned(),
            };
            let txn = Txn::new()
                .when(
                    self.layout.name_start(name),
                    self.layout.name_end(name),
                    Target::Mod,
                    Is::Less,
                    state.revision + 1,
                )
                .when(
                    self.layout.base(),
                    Vec::new(),
                    Target::Mod,
                    Is::Equal,
                    state.base.mod_revision,
                )
                .put(key.clone(), value.encode(), lease);
            // A write to the intent's key (the writer's own) goes with it.
            let txn = match (slot, state.of(Slot::Intent)) {
                (Slot::Writer, Some(intent)) if intent.value.owner == owner => {
                    txn.delete(intent.kv.key.clone())
                }
                _ => txn,
            };
            let answer = match self.client.txn(txn).await {
                Ok(answer) => answer,
                Err(status) => {
                    self.client.lease_revoke_later(lease);
                    return Err(status.into());
                }
            };
            if !answer.succeeded {
                self.client.lease_revoke_later(lease);
                continue;
            }
            let revision = client::revision(&answer);
            if let Some(old) = over {
                self.client.lease_revoke_later(old.kv.lease);
            }
            if let (Slot::Writer, Some(intent)) = (slot, state.of(Slot::Intent)) {
                if intent.value.owner == owner {
                    self.client.lease_revoke_later(intent.kv.lease);
                }
            }
            let fence = fence::of(state.base.value, revision);
            self.remember(
                name,
                fence,
                Leased {
                    key,
                    lease,
                    ttl: granted_ttl,
                    value,
                    fence_revision: revision,
                },
            );
            return Ok(Ok(Granted {
                fence,
                slot,
                expires_in: ttl.as_duration(),
            }));
        }
        Ok(Err(lost()))
    }

    /// The lease of the grant `grant`: remembered, or read.
    async fn leased(&self, grant: &GrantKey) -> Result<Option<Leased>, BoxError> {
        let remembered = self
            .leased
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(grant.name.clone(), grant.fence))
            .cloned();
        if remembered.is_some() {
            return Ok(remembered);
        }
        let state = self.read_name(&grant.name).await?;
        Ok(state
            .found
            .into_iter()
            .find(|f| {
                f.slot == slot_of(grant) && f.value.owner == grant.owner && f.fence() == grant.fence
            })
            .map(|f| Leased {
                key: f.kv.key.clone(),
                lease: f.kv.lease,
                ttl: 0,
                fence_revision: f.value.fence_revision(&f.kv),
                value: f.value,
            }))
    }

    /// A waiting writer's intent for `owner` on `name`, lasting `intent`,
    /// unless another writer's intent is live; its own is renewed.
    async fn record_intent(
        &self,
        name: &str,
        owner: &str,
        intent: LeaseMillis,
        state: &NameState,
    ) -> Result<(), BoxError> {
        let theirs = state.of(Slot::Intent);
        if theirs.is_some_and(|i| i.value.owner != owner) {
            return Ok(());
        }
        let (lease, _) = self.client.lease_grant(lease_seconds(intent)).await?;
        let key = self.layout.key(name, Slot::Intent);
        let value = GrantValue {
            base: state.base.value,
            revision: FenceRevision::Create,
            permits: 0,
            owner: owner.to_owned(),
        };
        let txn = Txn::new()
            .when(
                key.clone(),
                Vec::new(),
                Target::Mod,
                Is::Equal,
                theirs.map_or(0, |i| i.kv.mod_revision),
            )
            .put(key, value.encode(), lease);
        let answer = self.client.txn(txn).await;
        match (&answer, theirs) {
            (Ok(answer), Some(old)) if answer.succeeded => {
                self.client.lease_revoke_later(old.kv.lease)
            }
            (Ok(answer), _) if !answer.succeeded => self.client.lease_revoke_later(lease),
            (Err(_), _) => self.client.lease_revoke_later(lease),
            _ => {}
        }
        answer.map(drop).map_err(Into::into)
    }

    /// Every live grant of `found` listed, with what is left of each lease.
    async fn listed(&self, found: Vec<Found>) -> Result<Vec<Listed>, BoxError> {
        let leases: Vec<i64> = found.iter().map(|f| f.kv.lease).collect();
        let client = self.client.clone();
        let lefts = futures::stream::iter(leases)
            .map(move |lease| {
                let client = client.clone();
                async move { time_left(&client, lease).await }
            })
            .buffered(32)
            .collect::<Vec<_>>()
            .await;
        found
            .into_iter()
            .zip(lefts)
            .map(|(f, left)| {
                let (permit, access) = match f.slot {
                    Slot::Permit(slot) => (
                        Some(PermitSlot {
                            slot,
                            permits: f.value.permits,
                        }),
                        None,
                    ),
                    Slot::Reader(slot) => (None, Some(Access::Read { slot })),
                    Slot::Writer => (None, Some(Access::Write)),
                    Slot::Lock | Slot::Intent => (None, None),
                };
                let fence = f.fence();
                Ok(Listed {
                    name: f.name,
                    holder: Holder {
                        fence,
                        owner: f.value.owner,
                        expires_in: left?,
                    },
                    permit,
                    access,
                })
            })
            .collect()
    }
}

/// What is left of `lease`, at most: etcd answers whole seconds, rounded
/// down, so what it says is never more than what is left.
async fn time_left(client: &Client, lease: i64) -> Result<Duration, BoxError> {
    let seconds = client.lease_time_left(lease).await?.unwrap_or(0);
    Ok(Duration::from_secs(u64::try_from(seconds).unwrap_or(0)))
}

/// The slot of a grant's key.
fn slot_of(grant: &GrantKey) -> Slot {
    match (grant.permit, grant.access) {
        (Some(permit), _) => Slot::Permit(permit.slot),
        (None, Some(Access::Read { slot })) => Slot::Reader(slot),
        (None, Some(Access::Write)) => Slot::Writer,
        (None, None) => Slot::Lock,
    }
}

#[async_trait]
impl Engine for EtcdEngine {
    async fn acquire(
        &self,
        name: &str,
        owner: &str,
        ttl: LeaseMillis,
        _deadline: Option<Instant>,
    ) -> Result<Attempt, BoxError> {
        let decide = |state: &NameState| match state.held_as_other(Kind::Lock) {
            Some(HeldAs::Semaphore { permits }) => Err(Attempt::HeldAsSemaphore { permits }),
            Some(_) => Err(Attempt::HeldAsReadWrite),
            None => match state.of(Slot::Lock) {
                None => Ok(Write::Grant {
                    slot: Slot::Lock,
                    permits: 0,
                }),
                Some(found) if found.value.owner != owner => {
                    Err(Attempt::Held { expires_in: None })
                }
                Some(found) if state.retired(found) => Ok(Write::Grant {
                    slot: Slot::Lock,
                    permits: 0,
                }),
                Some(found) => Ok(Write::Again(found.clone())),
            },
        };
        let lost = || Attempt::Held { expires_in: None };
        Ok(
            match self
                .decide_and_write(name, owner, ttl, decide, lost)
                .await?
            {
                Ok(granted) => Attempt::Granted {
                    fence: granted.fence,
                    expires_in: granted.expires_in,
                },
                Err(answer) => answer,
            },
        )
    }

    async fn acquire_permit(
        &self,
        name: &str,
        permits: u32,
        owner: &str,
        ttl: LeaseMillis,
        _deadline: Option<Instant>,
    ) -> Result<PermitAttempt, BoxError> {
        let decide = |state: &NameState| {
            match state.held_as_other(Kind::Semaphore) {
                Some(HeldAs::Lock) => return Err(PermitAttempt::HeldAsLock),
                Some(_) => return Err(PermitAttempt::HeldAsReadWrite),
                None => {}
            }
            if let Some(other) = state.found.iter().find(|f| f.value.permits != permits) {
                return Err(PermitAttempt::Mismatch {
                    permits: other.value.permits,
                });
            }
            if let Some(own) = state.found.iter().find(|f| f.value.owner == owner) {
                return Ok(match state.retired(own) {
                    true => Write::Grant {
                        slot: own.slot,
                        permits,
                    },
                    false => Write::Again(own.clone()),
                });
            }
            let taken: Vec<u32> = state
                .found
                .iter()
                .filter_map(|f| match f.slot {
                    Slot::Permit(slot) => Some(slot),
                    _ => None,
                })
                .collect();
            match (0..permits).find(|slot| !taken.contains(slot)) {
                Some(slot) => Ok(Write::Grant {
                    slot: Slot::Permit(slot),
                    permits,
                }),
                None => Err(PermitAttempt::Held { expires_in: None }),
            }
        };
        let lost = || PermitAttempt::Held { expires_in: None };
        Ok(
            match self
                .decide_and_write(name, owner, ttl, decide, lost)
                .await?
            {
                Ok(Granted {
                    fence,
                    slot: Slot::Permit(slot),
                    expires_in,
                }) => PermitAttempt::Granted {
                    fence,
                    slot,
                    expires_in,
                },
                Ok(other) => return Err(format!("a permit granted in {other:?}").into()),
                Err(answer) => answer,
            },
        )
    }

    async fn acquire_rw(
        &self,
        name: &str,
        mode: RwMode,
        owner: &str,
        ttl: LeaseMillis,
        intent: Option<LeaseMillis>,
        _deadline: Option<Instant>,
    ) -> Result<RwAttempt, BoxError> {
        let refused = std::sync::OnceLock::new();
        let decide = |state: &NameState| {
            if let Some(other) = state.held_as_other(Kind::ReadWrite) {
                return Err(RwAttempt::HeldAsOther(other));
            }
            let own = state.found.iter().find(|f| {
                f.value.owner == owner
                    && matches!(
                        (mode, f.slot),
                        (RwMode::Read, Slot::Reader(_)) | (RwMode::Write, Slot::Writer)
                    )
            });
            if let Some(own) = own {
                return Ok(match state.retired(own) {
                    true => Write::Grant {
                        slot: own.slot,
                        permits: 0,
                    },
                    false => Write::Again(own.clone()),
                });
            }
            let writer = state.of(Slot::Writer).is_some();
            let readers: Vec<u32> = state
                .found
                .iter()
                .filter_map(|f| match f.slot {
                    Slot::Reader(slot) => Some(slot),
                    _ => None,
                })
                .collect();
            let held = RwAttempt::Held { expires_in: None };
            match mode {
                RwMode::Read => {
                    let intent = state.of(Slot::Intent).is_some();
                    match (0..MAX_READERS).find(|slot| !readers.contains(slot)) {
                        Some(slot) if !writer && !intent => Ok(Write::Grant {
                            slot: Slot::Reader(slot),
                            permits: 0,
                        }),
                        _ => Err(held),
                    }
                }
                RwMode::Write if !writer && readers.is_empty() => Ok(Write::Grant {
                    slot: Slot::Writer,
                    permits: 0,
                }),
                RwMode::Write => {
                    let _ = refused.set(());
                    Err(held)
                }
            }
        };
        let lost = || RwAttempt::Held { expires_in: None };
        let answer = self
            .decide_and_write(name, owner, ttl, decide, lost)
            .await?;
        Ok(match answer {
            Ok(Granted {
                fence,
                slot,
                expires_in,
            }) => {
                let access = match slot {
                    Slot::Reader(slot) => Access::Read { slot },
                    Slot::Writer => Access::Write,
                    other => return Err(format!("a reader-writer grant in {other:?}").into()),
                };
                RwAttempt::Granted {
                    fence,
                    access,
                    expires_in,
                }
            }
            Err(answer) => {
                if let (Some(intent), Some(())) = (intent, refused.get()) {
                    // The writer's refusal records its intent, read anew:
                    // the only write a refusal makes.
                    let state = self.read_name(name).await?;
                    if state.held_as_other(Kind::ReadWrite).is_none() {
                        self.record_intent(name, owner, intent, &state).await?;
                    }
                }
                answer
            }
        })
    }

    async fn renew(&self, grant: &GrantKey, ttl: LeaseMillis) -> Result<bool, BoxError> {
        let Some(leased) = self.leased(grant).await? else {
            return Ok(false);
        };
        let base = self.layout.base();
        // Still this grant's key on this lease, and no fence raise since
        // the grant (a raise retires every grant made before it).
        let still = Txn::new()
            .when(
                leased.key.clone(),
                Vec::new(),
                Target::Lease,
                Is::Equal,
                leased.lease,
            )
            .when(
                base,
                Vec::new(),
                Target::Mod,
                Is::Less,
                leased.fence_revision + 1,
            );
        let seconds = lease_seconds(ttl);
        if leased.ttl == seconds {
            let (check, kept) = tokio::join!(
                self.client.txn(still),
                self.client.lease_keep_alive_once(leased.lease)
            );
            let renewed = check?.succeeded && kept? > 0;
            if !renewed {
                self.forget(&grant.name, grant.fence);
            }
            return Ok(renewed);
        }
        // Another length: the key moves to a new lease of that length,
        // keeping its fence.
        let (lease, granted_ttl) = self.client.lease_grant(seconds).await?;
        let value = GrantValue {
            revision: FenceRevision::At(leased.fence_revision),
            ..leased.value.clone()
        };
        let answer = match self
            .client
            .txn(still.put(leased.key.clone(), value.encode(), lease))
            .await
        {
            Ok(answer) => answer,
            Err(status) => {
                self.client.lease_revoke_later(lease);
                return Err(status.into());
            }
        };
        if !answer.succeeded {
            self.client.lease_revoke_later(lease);
            self.forget(&grant.name, grant.fence);
            return Ok(false);
        }
        self.client.lease_revoke_later(leased.lease);
        self.remember(
            &grant.name,
            grant.fence,
            Leased {
                lease,
                ttl: granted_ttl,
                value,
                ..leased
            },
        );
        Ok(true)
    }

    async fn release(&self, grant: &GrantKey) -> Result<bool, BoxError> {
        let Some(leased) = self.leased(grant).await? else {
            return Ok(false);
        };
        let txn = Txn::new()
            .when(
                leased.key.clone(),
                Vec::new(),
                Target::Lease,
                Is::Equal,
                leased.lease,
            )
            .delete(leased.key);
        let released = self.client.txn(txn).await?.succeeded;
        self.forget(&grant.name, grant.fence);
        self.client.lease_revoke_later(leased.lease);
        Ok(released)
    }

    async fn holder(&self, name: &str) -> Result<Option<Holder>, BoxError> {
        let state = self.read_name(name).await?;
        let Some(found) = state.of(Slot::Lock) else {
            return Ok(None);
        };
        Ok(Some(Holder {
            owner: found.value.owner.clone(),
            fence: found.fence(),
            expires_in: self.time_left(found.kv.lease).await?,
        }))
    }

    async fn purge_expired(&self) -> Result<u64, BoxError> {
        // etcd removes a grant's key when its lease ends: nothing expired
        // is ever left.
        Ok(0)
    }

    async fn list(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Listed>, BoxError> {
        let grants = self.layout.grants();
        let from_prefix = [grants.as_slice(), prefix.as_bytes()].concat();
        let end = crate::keys::prefix_end(&from_prefix);
        let mut start = match after {
            // Past every key of `after`: they all start `after\0`.
            Some(after) => [grants.as_slice(), after.as_bytes(), b"\x01"].concat(),
            None => from_prefix.clone(),
        };
        if start < from_prefix {
            start = from_prefix;
        }
        // Pages of keys at one revision (one snapshot), until `limit`
        // grants and the last one's name whole.
        let mut rows: Vec<Found> = Vec::new();
        let mut revision = 0;
        let page = i64::try_from(limit).unwrap_or(i64::MAX).saturating_add(64);
        loop {
            let mut request = crate::proto::etcdserverpb::RangeRequest {
                key: start.clone(),
                range_end: end.clone(),
                limit: page,
                revision,
                ..Default::default()
            };
            request.revision = revision;
            let read = self.client.kv.clone().range(request).await?.into_inner();
            if revision == 0 {
                revision = read.header.as_ref().map_or(0, |h| h.revision);
            }
            let more = read.more;
            if let Some(last) = read.kvs.last() {
                start = [last.key.as_slice(), b"\0"].concat();
            }
            for found in self.decode(read.kvs) {
                if found.slot == Slot::Intent {
                    continue;
                }
                if rows.len() >= limit && rows.last().is_some_and(|last| last.name != found.name) {
                    return self.listed(rows).await;
                }
                rows.push(found);
            }
            if !more {
                return self.listed(rows).await;
            }
        }
    }

    async fn force_release(
        &self,
        name: &str,
        fence: Option<u64>,
    ) -> Result<Option<Holder>, BoxError> {
        for _ in 0..RACES {
            let state = self.read_name(name).await?;
            let target = state.found.iter().find(|f| match fence {
                None => f.slot == Slot::Lock,
                Some(fence) => f.slot != Slot::Intent && f.fence() == fence,
            });
            let Some(target) = target else {
                return Ok(None);
            };
            let txn = Txn::new()
                .when(
                    target.kv.key.clone(),
                    Vec::new(),
                    Target::Mod,
                    Is::Equal,
                    target.kv.mod_revision,
                )
                .delete(target.kv.key.clone());
            let expires_in = self.time_left(target.kv.lease).await?;
            if self.client.txn(txn).await?.succeeded {
                self.client.lease_revoke_later(target.kv.lease);
                return Ok(Some(Holder {
                    owner: target.value.owner.clone(),
                    fence: target.fence(),
                    expires_in,
                }));
            }
        }
        Err("the name changed under every try to remove its grant".into())
    }

    async fn raise_fences(&self, by: u64) -> Result<u64, BoxError> {
        fence::raise(&self.client, &self.layout, by).await
    }

    async fn close(&self) -> Result<(), BoxError> {
        self.watcher.stop();
        self.bus.wake_all();
        Ok(())
    }

    fn releases(&self) -> &ReleaseBus {
        &self.bus
    }

    async fn prepare_wait(&self) -> Result<(), BoxError> {
        self.watcher.start();
        Ok(())
    }

    fn name(&self) -> &'static str {
        "etcd"
    }
}
