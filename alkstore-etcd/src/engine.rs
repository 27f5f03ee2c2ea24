//! The etcd engine's grant operations (docs/engine-etcd.md).
//!
//! Every grant is one key ([`crate::keys`]) on a lease of its own, granted
//! after the request was sent: the lease's end removes the key, so no
//! expired grant is ever read, and a watch sees an expiry as a release.
//! Every decision is made on one read of the name's keys, and written by a
//! transaction whose compares fail if anything under the name changed
//! since that read (or the fence base did): a lost race reads again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use alkstore_core::{
    Access, Attempt, BoxError, Engine, GrantKey, HeldAs, Holder, LeaseMillis, Line, Listed,
    MAX_READERS, PermitAttempt, PermitSlot, Queue, Queued, ReleaseBus, RwAttempt, RwMode,
    TicketKind, Waiter,
};
use async_trait::async_trait;
use futures::StreamExt;

use crate::client::{self, Client, Is, Target, Txn};
use crate::fence::{self, Base};
use crate::keys::{FenceRevision, GrantValue, Layout, Slot, TicketValue};
use crate::proto::mvccpb::KeyValue;
use crate::watcher::Watcher;

mod queue;
mod renewals;

use queue::{Drawn, FoundTicket, InTurn, Spare, Standing};

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
    /// The key's mod revision when read or written: a move compares it.
    mod_revision: i64,
    /// When the lease ends at the latest, by this host's clock, unless
    /// renewed: an entry past it is dropped when the map grows.
    until: Instant,
}

impl Leased {
    /// The lease of the grant in `found`, granted `ttl` seconds long.
    fn of(found: &Found, ttl: i64) -> Leased {
        Leased {
            key: found.kv.key.clone(),
            lease: found.kv.lease,
            ttl,
            fence_revision: found.value.fence_revision(&found.kv),
            mod_revision: found.kv.mod_revision,
            value: found.value.clone(),
            until: Instant::now() + whole_seconds(ttl) + LEASE_SLACK,
        }
    }
}

/// How many remembered leases the map holds before it drops those past
/// their end (a handle dropped without release leaves its entry).
const REMEMBERED: usize = 4096;

/// The leases of the grants this engine made or found, by name and fence.
#[derive(Debug, Default)]
struct Remembered {
    map: HashMap<(String, u64), Leased>,
    /// The size at which the next sweep of lapsed entries runs.
    sweep_at: usize,
    /// Grants whose move to a new lease got no answer: it may still land,
    /// until the key's mod revision changes.
    unsettled: std::collections::HashSet<(String, u64)>,
}

/// How long past its TTL a remembered lease may still be live (a leader
/// change gives leases their full TTL again).
const LEASE_SLACK: Duration = Duration::from_secs(60);

/// The longest lease etcd grants: 9,000,000,000 s (`MaxLeaseTTL`).
const MAX_LEASE_SECONDS: i64 = 9_000_000_000;

fn whole_seconds(ttl: i64) -> Duration {
    Duration::from_secs(u64::try_from(ttl).unwrap_or(0))
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
    /// Its grants (and an older build's waiting writer's intent).
    found: Vec<Found>,
    /// Its queue, oldest ticket first.
    tickets: Vec<FoundTicket>,
    /// The revision of the read.
    revision: i64,
    base: Base,
}

impl NameState {
    fn of(&self, slot: Slot) -> Option<&Found> {
        self.found.iter().find(|f| f.slot == slot)
    }

    /// Ticket `number` of the queue, if live.
    fn ticket(&self, number: u64) -> Option<&FoundTicket> {
        self.tickets.iter().find(|t| t.number() == number)
    }

    /// The line of an attempt standing as `queue`.
    fn line(&self, queue: Queue) -> Line {
        queue::line_of(&self.tickets, queue)
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

/// Why one decision on a name's state refused.
#[derive(Debug)]
enum Refused<T> {
    /// For a cause that is not the name's turn (another kind of grant
    /// holds it, another count of permits): answered as it is, with no
    /// place kept.
    Answer(T),
    /// Not this attempt's turn: a waiting call keeps its place, `owed` the
    /// next turn if a reader held back by a writer that holds.
    Turn { owed: bool },
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

/// How one renewal on one lease ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Renewal {
    Renewed,
    /// The lease ended (lapsed, or revoked with its key).
    Lost,
    /// The key is not on this lease (moved, released, removed), or the
    /// grant was retired by a fence raise.
    NotOnThisLease,
    /// A move that got no answer can no longer land: the renewal starts
    /// again from a read of the key.
    Settled,
}

/// A ttl longer than etcd's longest lease (9,000,000,000 s), asked of a
/// renewal: refused, the lease left as it was (an acquire is given the
/// longest instead, and its `valid_until` says so).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("etcd grants leases of at most 9000000000 s; {asked} s were asked")]
pub struct LeaseTooLong {
    /// The seconds asked.
    pub asked: i64,
}

/// An acquire attempt, as the engine was asked it.
#[derive(Debug, Clone, Copy)]
struct Ask<'a> {
    name: &'a str,
    owner: &'a str,
    ttl: LeaseMillis,
    queue: Queue,
    deadline: Option<Instant>,
    /// What its ticket waits for, if it queues.
    kind: TicketKind,
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
    leased: Mutex<Remembered>,
    /// The tickets this engine drew for its waiting calls.
    drawn: Drawn,
    /// The shortest lease the cluster grants, in seconds, as learnt from
    /// its grants (1 until one was raised).
    floor: AtomicI64,
    watcher: Watcher,
}

/// The least time an attempt's read gets, even with its deadline passed:
/// it still makes one attempt.
const LEAST_ATTEMPT: Duration = Duration::from_millis(100);

/// How long an attempt's read and lease may take: what is left of its
/// deadline (at least [`LEAST_ATTEMPT`]); the store's timeout without one.
fn attempt_bound(deadline: Option<Instant>) -> Option<Duration> {
    deadline.map(|d| {
        d.saturating_duration_since(Instant::now())
            .max(LEAST_ATTEMPT)
    })
}

/// Whole seconds of lease for `ttl`: rounded up, at least 1 (etcd's leases
/// are whole seconds; the cluster raises one below its minimum), at most
/// etcd's longest ([`MAX_LEASE_SECONDS`]).
pub(crate) fn lease_seconds(ttl: LeaseMillis) -> i64 {
    whole_seconds_asked(ttl).clamp(1, MAX_LEASE_SECONDS)
}

/// A transaction whose compare holds while the grant's key is on the lease
/// `leased` names (not released, removed by force or moved).
fn on_its_lease(leased: &Leased) -> Txn {
    Txn::new().when(
        leased.key.clone(),
        Vec::new(),
        Target::Lease,
        Is::Equal,
        leased.lease,
    )
}

/// The whole seconds `ttl` asks for, rounded up.
fn whole_seconds_asked(ttl: LeaseMillis) -> i64 {
    i64::try_from(ttl.get().div_ceil(1000)).unwrap_or(i64::MAX)
}

/// A renewal's `ttl`, refused when it is longer than etcd's longest lease
/// (the lease is left as it was).
fn renewable(ttl: LeaseMillis) -> Result<(), LeaseTooLong> {
    match whole_seconds_asked(ttl) {
        asked if asked > MAX_LEASE_SECONDS => Err(LeaseTooLong { asked }),
        _ => Ok(()),
    }
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
            leased: Mutex::new(Remembered::default()),
            drawn: Drawn::default(),
            floor: AtomicI64::new(1),
        }
    }

    /// A new lease of `seconds`, bounded by `within` when given; learns the
    /// cluster's shortest lease from it.
    async fn lease(
        &self,
        seconds: i64,
        within: Option<Duration>,
    ) -> Result<(i64, i64), tonic::Status> {
        let (lease, granted) = self.client.lease_grant_within(seconds, within).await?;
        // The cluster's shortest lease as last seen raised (it changes
        // with the cluster's election timeout).
        if granted > seconds {
            self.floor.store(granted, Ordering::Relaxed);
        }
        Ok((lease, granted))
    }

    /// The TTL a lease of `ttl` is granted with: whole seconds, at least
    /// the cluster's shortest.
    fn granted_seconds(&self, ttl: LeaseMillis) -> i64 {
        lease_seconds(ttl).max(self.floor.load(Ordering::Relaxed))
    }

    /// Remembers `leased` as the lease of the grant (`name`, `fence`);
    /// unless `replace`, keeps an entry already there.
    fn remember(&self, name: &str, fence: u64, leased: Leased, replace: bool) {
        let mut remembered = self.leased.lock().unwrap_or_else(|e| e.into_inner());
        let Remembered { map, sweep_at, .. } = &mut *remembered;
        if map.len() >= (*sweep_at).max(REMEMBERED) {
            let now = Instant::now();
            map.retain(|_, l| l.until > now);
            // Not again before the map doubles: a sweep per insert of a
            // map of live grants would cost its whole length each time.
            *sweep_at = 2 * map.len();
        }
        let key = (name.to_owned(), fence);
        match replace {
            true => {
                map.insert(key, leased);
            }
            false => {
                map.entry(key).or_insert(leased);
            }
        }
    }

    fn forget(&self, name: &str, fence: u64) {
        self.leased
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map
            .remove(&(name.to_owned(), fence));
    }

    /// Marks the grant (`name`, `fence`) as one whose move to another lease
    /// may still land ([`EtcdEngine::renew_on`]), or clears the mark.
    fn unsettled(&self, name: &str, fence: u64, unsettled: bool) {
        let mut remembered = self.leased.lock().unwrap_or_else(|e| e.into_inner());
        let key = (name.to_owned(), fence);
        match unsettled {
            true => remembered.unsettled.insert(key),
            false => remembered.unsettled.remove(&key),
        };
    }

    fn is_unsettled(&self, name: &str, fence: u64) -> bool {
        self.leased
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .unsettled
            .contains(&(name.to_owned(), fence))
    }

    /// A transaction whose compare fails if any key of `name` was written
    /// (created, changed) since `state` was read: deleted keys only free.
    fn unchanged_since(&self, name: &str, state: &NameState) -> Txn {
        Txn::new().when(
            self.layout.name_start(name),
            self.layout.name_end(name),
            Target::Mod,
            Is::Less,
            state.revision.saturating_add(1),
        )
    }

    /// A transaction whose compares fail if any grant key of `name` was
    /// written since `state` was read; tickets drawn or changed since do
    /// not count.
    fn grants_unchanged_since(&self, name: &str, state: &NameState) -> Txn {
        let below = state.revision.saturating_add(1);
        let (start, end) = (self.layout.name_start(name), self.layout.name_end(name));
        let (tickets, after) = (
            self.layout.tickets_start(name),
            self.layout.tickets_end(name),
        );
        Txn::new()
            .when(start, tickets, Target::Mod, Is::Less, below)
            .when(after, end, Target::Mod, Is::Less, below)
    }

    /// One read of `name`'s keys and the fence base.
    async fn read_name(&self, name: &str) -> Result<NameState, BoxError> {
        self.read_name_within(name, None).await?
    }

    /// One read of `name`'s keys and the fence base, bounded by `within`
    /// when given: `Err` when it ran out.
    async fn read_name_within(
        &self,
        name: &str,
        within: Option<Duration>,
    ) -> Result<Result<NameState, BoxError>, tonic::Status> {
        let txn = Txn::new()
            .read(self.layout.name_start(name), self.layout.name_end(name))
            .read(self.layout.base(), Vec::new())
            .within(within);
        let answer = self.client.txn(txn).await?;
        Ok(self.name_state(answer))
    }

    /// A name's state from the answer of its read.
    fn name_state(
        &self,
        answer: crate::proto::etcdserverpb::TxnResponse,
    ) -> Result<NameState, BoxError> {
        let revision = client::revision(&answer);
        let mut reads = client::reads(answer).into_iter();
        let (keys, base) = (
            reads.next().unwrap_or_default(),
            reads.next().unwrap_or_default(),
        );
        let base = Base::from_read(base.kvs.first())?;
        let (found, mut tickets) = self.decode(keys.kvs);
        tickets.sort_by_key(|t| t.kv.create_revision);
        Ok(NameState {
            found,
            tickets,
            revision,
            base,
        })
    }

    /// The grant keys and the tickets among `kvs` (a key this build did not
    /// write is left out: it holds nothing).
    fn decode(&self, kvs: Vec<KeyValue>) -> (Vec<Found>, Vec<FoundTicket>) {
        let (mut found, mut tickets) = (Vec::new(), Vec::new());
        for kv in kvs {
            if let Some((name, slot)) = self.layout.parse(&kv.key) {
                if let Some(value) = GrantValue::decode(&kv.value) {
                    found.push(Found {
                        name,
                        slot,
                        kv,
                        value,
                    });
                }
            } else if self.layout.parse_ticket(&kv.key).is_some() {
                if let Some(value) = TicketValue::decode(&kv.value) {
                    tickets.push(FoundTicket { kv, value });
                }
            }
        }
        (found, tickets)
    }

    /// What is left of `lease` ([`time_left`]).
    async fn time_left(&self, lease: i64) -> Result<Duration, BoxError> {
        time_left(&self.client, lease).await
    }

    /// Reads the name, lets `decide` choose, and writes what it chose under
    /// compares that fail if the name or the fence base changed since the
    /// read; reads again after a lost race. A refusal in turn keeps a
    /// waiting call's place ([`EtcdEngine::queue_up`]), and answers
    /// `refused` with it; `Refused::Answer` answers without writing.
    async fn decide_and_write<T>(
        &self,
        ask: &Ask<'_>,
        decide: impl Fn(&NameState, &Line) -> Result<Write, Refused<T>>,
        refused: impl Fn(Option<Queued>) -> T,
    ) -> Result<Result<Granted, T>, BoxError> {
        let mut spare = None;
        let answer = self.race_to_write(ask, decide, refused, &mut spare).await;
        if let Some(Spare { lease, .. }) = spare {
            self.client.lease_revoke_later(lease);
        }
        answer
    }

    /// [`EtcdEngine::decide_and_write`]'s races; `spare` is a ticket's lease
    /// a lost race left unused, for the next draw.
    async fn race_to_write<T>(
        &self,
        ask: &Ask<'_>,
        decide: impl Fn(&NameState, &Line) -> Result<Write, Refused<T>>,
        refused: impl Fn(Option<Queued>) -> T,
        spare: &mut Option<Spare>,
    ) -> Result<Result<Granted, T>, BoxError> {
        let Ask {
            name,
            owner,
            ttl,
            queue,
            deadline,
            ..
        } = *ask;
        for race in 0..RACES {
            if race > 0 && deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(Err(refused(None)));
            }
            // The read and the lease wait no longer than the deadline: what
            // they leave behind is nothing, or a lease with no key. The
            // write is not cut short (it may land even so).
            let bound = attempt_bound(deadline);
            let state = match self.read_name_within(name, bound).await {
                Ok(state) => state?,
                Err(status) if ran_out(&status, bound, &self.client) => {
                    return Ok(Err(refused(None)));
                }
                Err(status) => return Err(status.into()),
            };
            let line = state.line(queue);
            let mine = line.mine.as_ref().and_then(|m| state.ticket(m.number));
            let (slot, permits) = match decide(&state, &line) {
                Err(Refused::Answer(answer)) => return Ok(Err(answer)),
                Err(Refused::Turn { owed }) => {
                    let Queue::Waiting { lease, .. } = queue else {
                        return Ok(Err(refused(None)));
                    };
                    let attempt = InTurn {
                        name,
                        owner,
                        kind: ask.kind,
                        owed,
                        lease,
                        deadline,
                    };
                    match self.queue_up(&attempt, &state, &line, spare).await? {
                        Standing::Queued(queued) => return Ok(Err(refused(Some(queued)))),
                        Standing::RanOut => return Ok(Err(refused(None))),
                        Standing::Raced => continue,
                    }
                }
                Ok(Write::Again(found)) => {
                    let fence = found.fence();
                    // A grant past the end that was not taken back (its undo
                    // failed) is never answered.
                    if fence > alkstore_core::MAX_FENCE {
                        return Err(alkstore_core::NoFenceLeft { left: 0 }.into());
                    }
                    let (expires_in, granted) = lease_time(&self.client, found.kv.lease).await?;
                    self.remember(name, fence, Leased::of(&found, granted), false);
                    if let Some(mine) = mine {
                        self.dequeue_now(name, mine).await;
                    }
                    return Ok(Ok(Granted {
                        fence,
                        slot: found.slot,
                        expires_in,
                    }));
                }
                Ok(Write::Grant { slot, permits }) => (slot, permits),
            };
            fence::check_room(state.base.value, state.revision)?;
            let seconds = lease_seconds(ttl);
            let bound = attempt_bound(deadline);
            let (lease, granted_ttl) = match self.lease(seconds, bound).await {
                Ok(granted) => granted,
                Err(status) if ran_out(&status, bound, &self.client) => {
                    return Ok(Err(refused(None)));
                }
                Err(status) => return Err(status.into()),
            };
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
            // An attempt with its own live ticket is decided by the tickets
            // older than its own, and every ticket drawn since the read is
            // newer: its grant does not fail for them (with waiters
            // arriving as fast as grants, it would fail again and again,
            // and a writer first in line would never be granted). A
            // writer also waits for owed readers queued behind it, but no
            // ticket becomes owed, or is drawn owed, unless a writer holds
            // (the owing write compares that writer's key, see
            // `queue_up`), and this grant was decided with none holding:
            // a writer granted since fails its compare on the grant keys.
            // A call with no ticket compares the whole name: every live
            // ticket is ahead of it.
            let since = match mine {
                Some(_) => self.grants_unchanged_since(name, &state),
                None => self.unchanged_since(name, &state),
            };
            let txn = since
                .when(
                    self.layout.base(),
                    Vec::new(),
                    Target::Mod,
                    Is::Equal,
                    state.base.mod_revision,
                )
                .put(key.clone(), value.encode(), lease);
            let writer = slot == Slot::Writer;
            let txn = self.dequeue_with(txn, &state, mine, writer);
            // A writer's grant reads the queue as it commits: readers that
            // queued after its read are owed their turn too.
            let txn = match writer {
                true => txn.read(
                    self.layout.tickets_start(name),
                    self.layout.tickets_end(name),
                ),
                false => txn,
            };
            // An error leaves the lease to its TTL: the grant may have
            // landed, and its owner's next ask adopts it (revoking the lease
            // would remove a grant the owner may then be told it holds).
            let answer = self.client.txn(txn).await?;
            if !answer.succeeded {
                self.client.lease_revoke_later(lease);
                // Its place is kept while it races (a writer's grant fails
                // for every newcomer's draw).
                if let Some(mine) = mine {
                    self.renew_if_due(name, mine).await?;
                }
                continue;
            }
            let revision = client::revision(&answer);
            if fence::past_the_end(state.base.value, revision) {
                // Other writes came between the read and the grant, at the
                // very end of the fence space: the grant is taken back,
                // never answered.
                // The owner's own retired grant it replaced goes back as it
                // was (on its own lease), else the key goes.
                let undo =
                    Txn::new().when(key.clone(), Vec::new(), Target::Mod, Is::Equal, revision);
                let undo = match &over {
                    Some(old) => {
                        let was = GrantValue {
                            revision: FenceRevision::At(old.value.fence_revision(&old.kv)),
                            ..old.value.clone()
                        };
                        undo.put(key.clone(), was.encode(), old.kv.lease)
                    }
                    None => undo.delete(key.clone()),
                };
                let undone = self.client.txn(undo).await;
                self.client.lease_revoke_later(lease);
                undone?;
                return Err(alkstore_core::NoFenceLeft { left: 0 }.into());
            }
            if let Some(old) = over {
                self.client.lease_revoke_later(old.kv.lease);
            }
            if let Some(mine) = mine {
                self.dequeued(name, mine);
            }
            if writer {
                // Before the grant is answered, so that its holder cannot
                // have released it yet.
                self.owe_latecomers(&key, revision, &state, answer).await;
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
                    mod_revision: revision,
                    until: Instant::now() + whole_seconds(granted_ttl) + LEASE_SLACK,
                },
                true,
            );
            return Ok(Ok(Granted {
                fence,
                slot,
                // A ttl past etcd's longest lease got the longest.
                expires_in: ttl.as_duration().min(whole_seconds(granted_ttl)),
            }));
        }
        Ok(Err(refused(None)))
    }

    /// The lease of the grant `grant`: remembered, or read.
    async fn leased(&self, grant: &GrantKey) -> Result<Option<Leased>, BoxError> {
        match self.remembered(grant) {
            Some(leased) => Ok(Some(leased)),
            None => self.read_grant(grant).await,
        }
    }

    /// The lease this store remembers `grant` on, if it does.
    fn remembered(&self, grant: &GrantKey) -> Option<Leased> {
        self.leased
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map
            .get(&(grant.name.clone(), grant.fence))
            .cloned()
    }

    /// The grant `grant` as its key holds it now (its lease may have moved:
    /// another handle's renewal), with its lease's TTL; remembered.
    async fn read_grant(&self, grant: &GrantKey) -> Result<Option<Leased>, BoxError> {
        let state = self.read_name(&grant.name).await?;
        let Some(found) = state.found.into_iter().find(|f| {
            f.slot == slot_of(grant) && f.value.owner == grant.owner && f.fence() == grant.fence
        }) else {
            return Ok(None);
        };
        let (_, granted) = lease_time(&self.client, found.kv.lease).await?;
        let leased = Leased::of(&found, granted);
        self.remember(&grant.name, grant.fence, leased.clone(), true);
        Ok(Some(leased))
    }

    /// A transaction whose compares hold while the grant's key is on the
    /// lease `leased` names (not released, removed by force or moved) and
    /// no fence raise retired it since.
    fn still_on(&self, leased: &Leased) -> Txn {
        on_its_lease(leased).when(
            self.layout.base(),
            Vec::new(),
            Target::Mod,
            Is::Less,
            leased.fence_revision.saturating_add(1),
        )
    }

    /// One renewal of `grant` on the lease `leased` names.
    ///
    /// The lease is refreshed first, then the key checked: still on that
    /// lease (not released, removed by force or moved), and no fence raise
    /// since the grant (a raise retires it). So a renewal answered true
    /// had the key on a lease refreshed before the check: the grant lives
    /// a full TTL from the refresh (unless released after). A lapsed lease
    /// answers 0 to its refresh (etcd waits for its revocation). With
    /// another length than the lease's, the key moves to a new lease of
    /// that length, its fence kept.
    async fn renew_on(
        &self,
        grant: &GrantKey,
        leased: &Leased,
        ttl: LeaseMillis,
    ) -> Result<Renewal, BoxError> {
        let still = || self.still_on(leased);
        if self.client.lease_keep_alive_once(leased.lease).await? == 0 {
            return Ok(Renewal::Lost);
        }
        // The value a put of the key writes: its fence kept.
        let value = GrantValue {
            revision: FenceRevision::At(leased.fence_revision),
            ..leased.value.clone()
        };
        // The key put again on `lease`, its fence kept, if it is still
        // this grant's and no write changed it since it was read.
        let put_unmoved = |lease: i64| {
            still()
                .when(
                    leased.key.clone(),
                    Vec::new(),
                    Target::Mod,
                    Is::Equal,
                    leased.mod_revision,
                )
                .put(leased.key.clone(), value.encode(), lease)
        };
        if self.is_unsettled(&grant.name, grant.fence) {
            // A move of this grant got no answer and may still land (it
            // compares the key's mod revision it read): a put of the key on
            // the lease it is on changes that revision, so the lost move
            // can no longer shorten the lease under a renewal answered true.
            let settle = put_unmoved(leased.lease);
            if !self.client.txn(settle).await?.succeeded {
                return Ok(Renewal::NotOnThisLease);
            }
            self.unsettled(&grant.name, grant.fence, false);
            return Ok(Renewal::Settled);
        }
        if leased.ttl == self.granted_seconds(ttl) {
            return Ok(match self.client.txn(still()).await?.succeeded {
                true => {
                    self.refresh(grant, leased);
                    Renewal::Renewed
                }
                false => Renewal::NotOnThisLease,
            });
        }
        let (lease, granted_ttl) = self.lease(lease_seconds(ttl), None).await?;
        let move_it = put_unmoved(lease);
        let answer = match self.client.txn(move_it).await {
            Ok(answer) => answer,
            Err(status) => {
                // It may have landed, or land later: the new lease is left
                // to its TTL (revoking it would remove a key its holder
                // still trusts), the next call reads the key again, and the
                // next renewal settles the key first.
                self.forget(&grant.name, grant.fence);
                self.unsettled(&grant.name, grant.fence, true);
                return Err(status.into());
            }
        };
        if !answer.succeeded {
            self.client.lease_revoke_later(lease);
            return Ok(Renewal::NotOnThisLease);
        }
        self.client.lease_revoke_later(leased.lease);
        let moved = Leased {
            lease,
            ttl: granted_ttl,
            value,
            mod_revision: client::revision(&answer),
            until: Instant::now() + whole_seconds(granted_ttl) + LEASE_SLACK,
            ..leased.clone()
        };
        self.remember(&grant.name, grant.fence, moved, true);
        Ok(Renewal::Renewed)
    }

    /// After a renewal on `leased`'s lease: its remembered end moves on.
    fn refresh(&self, grant: &GrantKey, leased: &Leased) {
        let refreshed = Leased {
            until: Instant::now() + whole_seconds(leased.ttl) + LEASE_SLACK,
            ..leased.clone()
        };
        self.remember(&grant.name, grant.fence, refreshed, true);
    }

    /// What is left of each of `leases` ([`time_left`]), 32 asked at once.
    async fn times_left(&self, leases: Vec<i64>) -> Vec<Result<Duration, BoxError>> {
        let client = self.client.clone();
        futures::stream::iter(leases)
            .map(move |lease| {
                let client = client.clone();
                async move { time_left(&client, lease).await }
            })
            .buffered(32)
            .collect()
            .await
    }

    /// Every live grant of `found` listed, with what is left of each lease.
    async fn listed(&self, found: Vec<Found>) -> Result<Vec<Listed>, BoxError> {
        let lefts = self
            .times_left(found.iter().map(|f| f.kv.lease).collect())
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
    Ok(lease_time(client, lease).await?.0)
}

/// What is left of `lease` (as [`time_left`]), at most the TTL it was
/// granted, and that TTL. A leader change gives a lease its TTL and the
/// election timeout; more than the longest lease is an etcd bug (during a
/// leader change, etcd before 3.4.32 and 3.5.14 can answer 9223372036 s:
/// etcd-io/etcd#17642), and counts as nothing left.
async fn lease_time(client: &Client, lease: i64) -> Result<(Duration, i64), BoxError> {
    let (left, granted) = client.lease_time_left(lease).await?.unwrap_or((0, 0));
    let left = match left > MAX_LEASE_SECONDS {
        true => 0,
        false => left.min(granted),
    };
    Ok((whole_seconds(left), granted))
}

/// Whether `status` says a call bounded by `bound` (an attempt's deadline,
/// [`attempt_bound`]) ran out of it: the bound was shorter than the store's
/// own timeout, whose running out is an error.
fn ran_out(status: &tonic::Status, bound: Option<Duration>, client: &Client) -> bool {
    client::ran_out(status) && bound.is_some_and(|b| b < client.timeout())
}

/// Whether `status` says a read's revision was compacted away.
fn is_compacted(status: &tonic::Status) -> bool {
    status
        .message()
        .contains("required revision has been compacted")
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
        queue: Queue,
        deadline: Option<Instant>,
    ) -> Result<Attempt, BoxError> {
        let ask = Ask {
            name,
            owner,
            ttl,
            queue,
            deadline,
            kind: TicketKind::Lock,
        };
        let decide = |state: &NameState, line: &Line| match state.held_as_other(Kind::Lock) {
            Some(HeldAs::Semaphore { permits }) => {
                Err(Refused::Answer(Attempt::HeldAsSemaphore { permits }))
            }
            Some(_) => Err(Refused::Answer(Attempt::HeldAsReadWrite)),
            None => match state.of(Slot::Lock) {
                None if line.lock_turn() => Ok(Write::Grant {
                    slot: Slot::Lock,
                    permits: 0,
                }),
                None => Err(Refused::Turn { owed: false }),
                Some(found) if found.value.owner != owner => Err(Refused::Turn { owed: false }),
                Some(found) if state.retired(found) => Ok(Write::Grant {
                    slot: Slot::Lock,
                    permits: 0,
                }),
                Some(found) => Ok(Write::Again(found.clone())),
            },
        };
        let refused = |queued| Attempt::refused(None, queued);
        Ok(match self.decide_and_write(&ask, decide, refused).await? {
            Ok(granted) => Attempt::Granted {
                fence: granted.fence,
                expires_in: granted.expires_in,
            },
            Err(answer) => answer,
        })
    }

    async fn acquire_permit(
        &self,
        name: &str,
        permits: u32,
        owner: &str,
        ttl: LeaseMillis,
        queue: Queue,
        deadline: Option<Instant>,
    ) -> Result<PermitAttempt, BoxError> {
        let ask = Ask {
            name,
            owner,
            ttl,
            queue,
            deadline,
            kind: TicketKind::Permit,
        };
        let decide = |state: &NameState, line: &Line| {
            match state.held_as_other(Kind::Semaphore) {
                Some(HeldAs::Lock) => return Err(Refused::Answer(PermitAttempt::HeldAsLock)),
                Some(_) => return Err(Refused::Answer(PermitAttempt::HeldAsReadWrite)),
                None => {}
            }
            if let Some(other) = state.found.iter().find(|f| f.value.permits != permits) {
                return Err(Refused::Answer(PermitAttempt::Mismatch {
                    permits: other.value.permits,
                }));
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
            let free: Vec<u32> = (0..permits).filter(|slot| !taken.contains(slot)).collect();
            match free.first() {
                Some(&slot) if line.permit_turn(free.len()) => Ok(Write::Grant {
                    slot: Slot::Permit(slot),
                    permits,
                }),
                _ => Err(Refused::Turn { owed: false }),
            }
        };
        let refused = |queued| PermitAttempt::refused(None, queued);
        Ok(match self.decide_and_write(&ask, decide, refused).await? {
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
        })
    }

    async fn acquire_rw(
        &self,
        name: &str,
        mode: RwMode,
        owner: &str,
        ttl: LeaseMillis,
        queue: Queue,
        deadline: Option<Instant>,
    ) -> Result<RwAttempt, BoxError> {
        let kind = match mode {
            RwMode::Read => TicketKind::Read,
            RwMode::Write => TicketKind::Write,
        };
        let ask = Ask {
            name,
            owner,
            ttl,
            queue,
            deadline,
            kind,
        };
        let decide = |state: &NameState, line: &Line| {
            if let Some(other) = state.held_as_other(Kind::ReadWrite) {
                return Err(Refused::Answer(RwAttempt::HeldAsOther(other)));
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
            match mode {
                // A writer holds: this reader is owed the turn after it.
                RwMode::Read if writer => Err(Refused::Turn { owed: true }),
                RwMode::Read => {
                    // A waiting writer's intent, which builds before queues
                    // wrote, still holds readers back (a fleet midway
                    // through an upgrade).
                    let intent = state.of(Slot::Intent).is_some();
                    let free = usize::try_from(MAX_READERS)
                        .unwrap_or(usize::MAX)
                        .saturating_sub(readers.len());
                    let slot = (0..MAX_READERS).find(|slot| !readers.contains(slot));
                    match slot {
                        Some(slot) if !intent && line.read_turn(free) => Ok(Write::Grant {
                            slot: Slot::Reader(slot),
                            permits: 0,
                        }),
                        _ => Err(Refused::Turn { owed: false }),
                    }
                }
                RwMode::Write if !writer && readers.is_empty() && line.write_turn() => {
                    Ok(Write::Grant {
                        slot: Slot::Writer,
                        permits: 0,
                    })
                }
                RwMode::Write => Err(Refused::Turn { owed: false }),
            }
        };
        let refused = |queued| RwAttempt::refused(None, queued);
        Ok(match self.decide_and_write(&ask, decide, refused).await? {
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
            Err(answer) => answer,
        })
    }

    async fn renew(&self, grant: &GrantKey, ttl: LeaseMillis) -> Result<bool, BoxError> {
        renewable(ttl)?;
        let Some(mut leased) = self.leased(grant).await? else {
            return Ok(false);
        };
        let mut read_again = true;
        loop {
            match self.renew_on(grant, &leased, ttl).await? {
                Renewal::Renewed => return Ok(true),
                // The key on another lease: another handle's renewal moved
                // it. Once more with the lease it is on now.
                // Settled: the key's revision changed; read it again.
                Renewal::Settled => match self.read_grant(grant).await? {
                    Some(now) => leased = now,
                    None => break,
                },
                Renewal::NotOnThisLease | Renewal::Lost if read_again => {
                    read_again = false;
                    match self.read_grant(grant).await? {
                        Some(now) if now.lease != leased.lease => leased = now,
                        _ => break,
                    }
                }
                Renewal::NotOnThisLease | Renewal::Lost => break,
            }
        }
        self.forget(&grant.name, grant.fence);
        Ok(false)
    }

    fn batches_renewals(&self) -> bool {
        true
    }

    /// Two beats: a batch is two calls (a keep-alive stream, then a read),
    /// so half as many batches keep a store at 20 calls a second. Leases
    /// are whole seconds here: a renewal waits at most an eighth of one.
    fn renewal_beat(&self) -> Duration {
        2 * alkstore_core::RENEWAL_BEAT
    }

    async fn renew_batch(
        &self,
        batch: &[(GrantKey, LeaseMillis)],
    ) -> Result<Vec<Result<bool, BoxError>>, BoxError> {
        Ok(self.renew_each(batch).await)
    }

    async fn release(&self, grant: &GrantKey) -> Result<bool, BoxError> {
        let Some(mut leased) = self.leased(grant).await? else {
            return Ok(false);
        };
        let mut read_again = true;
        let released = loop {
            let txn = on_its_lease(&leased).delete(leased.key.clone());
            if self.client.txn(txn).await?.succeeded {
                self.client.lease_revoke_later(leased.lease);
                break true;
            }
            // Moved to another lease by another handle's renewal: that
            // lease, once.
            if !read_again {
                break false;
            }
            read_again = false;
            match self.read_grant(grant).await? {
                Some(now) if now.lease != leased.lease => leased = now,
                _ => break false,
            }
        };
        self.forget(&grant.name, grant.fence);
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

    fn queues(&self) -> bool {
        true
    }

    async fn leave_queue(&self, name: &str, ticket: u64) -> Result<bool, BoxError> {
        self.leave(name, ticket).await
    }

    async fn waiters(&self, name: &str) -> Result<Vec<Waiter>, BoxError> {
        self.waiters_of(name).await
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
        // grants and the last one's name whole. A compaction past that
        // revision between two pages starts the listing again, at the
        // newest revision (a few times, then its error).
        let first = start.clone();
        let mut rows: Vec<Found> = Vec::new();
        let mut revision = 0;
        let mut compacted = 0;
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
            let read = self
                .client
                .call(|mut m| {
                    let request = request.clone();
                    async move { Ok(m.kv.range(request).await?.into_inner()) }
                })
                .await;
            let read = match read {
                Err(status) if revision != 0 && compacted < RACES && is_compacted(&status) => {
                    compacted += 1;
                    (rows, revision, start) = (Vec::new(), 0, first.clone());
                    continue;
                }
                read => read?,
            };
            if revision == 0 {
                revision = read.header.as_ref().map_or(0, |h| h.revision);
            }
            let more = read.more;
            if let Some(last) = read.kvs.last() {
                start = [last.key.as_slice(), b"\0"].concat();
            }
            for found in self.decode(read.kvs).0 {
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

#[cfg(test)]
mod tests {
    #[test]
    fn a_compacted_revision_is_told_apart() {
        let compacted =
            tonic::Status::out_of_range("etcdserver: mvcc: required revision has been compacted");
        assert!(super::is_compacted(&compacted));
        assert!(!super::is_compacted(&tonic::Status::unavailable(
            "no leader"
        )));
    }
}
