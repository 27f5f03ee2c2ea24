//! The smallest engine that passes the whole contract: rows in a map behind
//! a mutex, the host's monotonic clock, a counter for fences. Written only
//! against `alkstore_core`'s published engine-author API, as
//! `docs/writing-an-engine.md` walks through it; `tests/memory_engine.rs`
//! runs the whole suite on it, and the [gallery](crate::gallery) breaks it
//! one rule at a time.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use alkstore_core::{
    Access, Attempt, BoxError, Engine, GrantKey, HeldAs, Holder, INTENT_SLOT, LeaseMillis, Line,
    Listed, MAX_FENCE, MAX_READERS, NoFenceLeft, PermitAttempt, PermitSlot, Queue, Queued,
    ReleaseBus, RwAttempt, RwMode, Ticket, TicketKind, WRITER_SLOT, Waiter,
};

/// One grant's row.
#[derive(Debug, Clone)]
pub struct Row {
    /// The holder.
    pub owner: String,
    /// The grant's fence.
    pub fence: u64,
    /// When the lease ends, by this engine's clock.
    pub expires_at: Instant,
    /// Retired by a fence raise: live to others, never renewed, taken over
    /// by its own owner's ask with a new fence.
    pub retired: bool,
}

/// One permit's row: a grant's row, and its semaphore's permits.
#[derive(Debug, Clone)]
pub struct PermitRow {
    /// The grant.
    pub row: Row,
    /// How many permits the semaphore has.
    pub permits: u32,
}

/// One waiter's place in a name's queue, as stored.
#[derive(Debug, Clone)]
pub struct TicketRow {
    /// The owner that waits.
    pub owner: String,
    /// What it waits for.
    pub kind: TicketKind,
    /// When the ticket lapses unless an attempt renews it.
    pub expires_at: Instant,
    /// A reader's: owed the next turn (`alkstore_core::queue`).
    pub owed: bool,
    /// When the ticket was taken.
    pub since: Instant,
}

/// The rows of one "database", and the last fence handed out.
#[derive(Debug, Default)]
pub struct Rows {
    /// Each lock name's row.
    pub rows: HashMap<String, Row>,
    /// Each semaphore's permit rows, by name and slot.
    pub permits: BTreeMap<(String, u32), PermitRow>,
    /// Each reader-writer lock's rows, by name and slot: readers on
    /// `0..MAX_READERS`, the writer on `WRITER_SLOT`, a waiting writer's
    /// intent (fence 0) on `INTENT_SLOT`.
    pub rw: BTreeMap<(String, i64), Row>,
    /// The last fence handed out.
    pub last_fence: u64,
    /// Each name's waiters' tickets, by name and number.
    pub tickets: BTreeMap<(String, u64), TicketRow>,
    /// The last ticket number drawn.
    pub last_ticket: u64,
    /// Set by a grant that found no fence left (it wrote nothing and
    /// answered "held"): the engine answers [`NoFenceLeft`] instead
    /// ([`Rows::no_fence_left`]).
    pub out_of_fences: bool,
}

impl Rows {
    /// The next fence, or `None` when none is left (noted for
    /// [`Rows::no_fence_left`]).
    fn draw(&mut self) -> Option<u64> {
        if self.last_fence >= MAX_FENCE {
            self.out_of_fences = true;
            return None;
        }
        self.last_fence += 1;
        Some(self.last_fence)
    }

    /// `answer`, unless a grant found no fence left meanwhile.
    pub fn no_fence_left<T>(&mut self, answer: T) -> Result<T, BoxError> {
        if std::mem::take(&mut self.out_of_fences) {
            return Err(NoFenceLeft { left: 0 }.into());
        }
        Ok(answer)
    }

    /// The live tickets of `name` at `now`, oldest first; lapsed ones are
    /// dropped.
    pub fn live_tickets(&mut self, name: &str, now: Instant) -> Vec<(u64, TicketRow)> {
        let range = (name.to_owned(), 0)..=(name.to_owned(), u64::MAX);
        let lapsed: Vec<_> = self
            .tickets
            .range(range.clone())
            .filter(|(_, t)| t.expires_at <= now)
            .map(|(key, _)| key.clone())
            .collect();
        for key in lapsed {
            self.tickets.remove(&key);
        }
        self.tickets
            .range(range)
            .map(|((_, number), t)| (*number, t.clone()))
            .collect()
    }

    /// The line of an attempt standing as `queue` in `name`'s queue.
    pub fn line(&mut self, name: &str, queue: Queue, now: Instant) -> Line {
        let live = self
            .live_tickets(name, now)
            .into_iter()
            .map(|(number, t)| Ticket {
                number,
                owner: t.owner,
                kind: t.kind,
                owed: t.owed,
            })
            .collect();
        Line::of(live, queue)
    }

    /// A refused attempt standing as `queue`: for a waiting call, its
    /// ticket renewed (drawn, at the back, when it has none live; `owed`
    /// from now on, for a reader a writer holds back), and where it
    /// stands; `None` for a `try_` call, which never queues.
    #[allow(clippy::too_many_arguments)]
    pub fn queue_up(
        &mut self,
        name: &str,
        owner: &str,
        kind: TicketKind,
        queue: Queue,
        line: &Line,
        owed: bool,
        now: Instant,
    ) -> Option<Queued> {
        let Queue::Waiting { lease, .. } = queue else {
            return None;
        };
        let expires_at = now + lease.as_duration();
        let number = match &line.mine {
            Some(mine) => mine.number,
            None => {
                self.last_ticket += 1;
                self.last_ticket
            }
        };
        let entry = self
            .tickets
            .entry((name.to_owned(), number))
            .or_insert(TicketRow {
                owner: owner.to_owned(),
                kind,
                expires_at,
                owed,
                since: now,
            });
        entry.expires_at = expires_at;
        entry.owed |= owed;
        Some(line.queued(number, kind, entry.owed))
    }

    /// A granted attempt's ticket leaves the queue with the grant.
    pub fn dequeue(&mut self, name: &str, line: &Line) {
        if let Some(mine) = &line.mine {
            self.tickets.remove(&(name.to_owned(), mine.number));
        }
    }

    /// A writer was granted `name`: every reader queued now is owed the
    /// turn after it.
    pub fn owe_readers(&mut self, name: &str) {
        let range = (name.to_owned(), 0)..=(name.to_owned(), u64::MAX);
        for (_, ticket) in self.tickets.range_mut(range) {
            if ticket.kind == TicketKind::Read {
                ticket.owed = true;
            }
        }
    }

    /// The numbers of `name`'s tickets owed the next turn (for the
    /// gallery).
    pub fn owed_tickets(&self, name: &str) -> Vec<u64> {
        let range = (name.to_owned(), 0)..=(name.to_owned(), u64::MAX);
        self.tickets
            .range(range)
            .filter(|(_, ticket)| ticket.owed)
            .map(|((_, number), _)| *number)
            .collect()
    }

    /// Owes the turn to exactly `owed` of `name`'s tickets (for the
    /// gallery).
    pub fn set_owed_tickets(&mut self, name: &str, owed: &[u64]) {
        let range = (name.to_owned(), 0)..=(name.to_owned(), u64::MAX);
        for ((_, number), ticket) in self.tickets.range_mut(range) {
            ticket.owed = owed.contains(number);
        }
    }

    /// Every row, of every kind, live or not.
    pub fn every_row_mut(&mut self) -> impl Iterator<Item = &mut Row> {
        let permits = self.permits.values_mut().map(|permit| &mut permit.row);
        self.rows
            .values_mut()
            .chain(permits)
            .chain(self.rw.values_mut())
    }

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

    /// The live permits of `name` at `now`, in slot order.
    pub fn live_permits<'a>(
        &'a self,
        name: &'a str,
        now: Instant,
    ) -> impl Iterator<Item = (u32, &'a PermitRow)> + 'a {
        self.permits
            .range((name.to_owned(), 0)..=(name.to_owned(), u32::MAX))
            .filter(move |(_, permit)| permit.row.expires_at > now)
            .map(|((_, slot), permit)| (*slot, permit))
    }

    /// The live rows of the reader-writer lock `name` at `now` (its
    /// intent's too), in slot order.
    pub fn live_rw<'a>(
        &'a self,
        name: &'a str,
        now: Instant,
    ) -> impl Iterator<Item = (i64, &'a Row)> + 'a {
        self.rw
            .range((name.to_owned(), i64::MIN)..=(name.to_owned(), i64::MAX))
            .filter(move |(_, row)| row.expires_at > now)
            .map(|((_, slot), row)| (*slot, row))
    }

    /// What holds `name` at `now` other than a lock, if anything: live
    /// permits, or a reader-writer lock's live rows.
    pub fn held_by_other_kind(&self, name: &str, now: Instant) -> Option<HeldAs> {
        if let Some((_, permit)) = self.live_permits(name, now).next() {
            return Some(HeldAs::Semaphore {
                permits: permit.permits,
            });
        }
        self.live_rw(name, now).next().map(|_| HeldAs::ReadWrite)
    }

    /// A reader-writer lock's grant of `name` for `owner` at `now`, decided
    /// and granted as one step (the rules of `Engine::acquire_rw`, queued
    /// phase-fairly: `alkstore_core::queue`).
    pub fn acquire_rw(
        &mut self,
        name: &str,
        mode: RwMode,
        owner: &str,
        ttl: Duration,
        queue: Queue,
        now: Instant,
    ) -> RwAttempt {
        if self.live(name, now).is_some() {
            return RwAttempt::HeldAsOther(HeldAs::Lock);
        }
        if let Some(held_as @ HeldAs::Semaphore { .. }) = self.held_by_other_kind(name, now) {
            return RwAttempt::HeldAsOther(held_as);
        }
        let live: Vec<(i64, Row)> = self
            .live_rw(name, now)
            .filter(|(slot, _)| *slot != INTENT_SLOT)
            .map(|(slot, row)| (slot, row.clone()))
            .collect();
        let row_at = |slot: i64| live.iter().find(|(s, _)| *s == slot).map(|(_, row)| row);
        let readers = || live.iter().filter(|(slot, _)| *slot >= 0);
        let writer = row_at(WRITER_SLOT);
        let left = |row: &Row| row.expires_at - now;
        let soonest = |rows: &mut dyn Iterator<Item = &Row>| rows.map(left).min();
        let line = self.line(name, queue, now);
        match mode {
            RwMode::Read => {
                if let Some((slot, mine)) = readers().find(|(_, row)| row.owner == owner) {
                    let access = Access::Read { slot: *slot as u32 };
                    self.dequeue(name, &line);
                    if mine.retired {
                        return self.grant_rw(name, access, owner, ttl, now);
                    }
                    return RwAttempt::Granted {
                        fence: mine.fence,
                        access,
                        expires_in: left(mine),
                    };
                }
                let read = TicketKind::Read;
                if let Some(writer) = writer {
                    // A writer holds: this reader is owed the next turn.
                    let expires_in = Some(left(writer));
                    let queued = self.queue_up(name, owner, read, queue, &line, true, now);
                    return RwAttempt::refused(expires_in, queued);
                }
                let free = (0..MAX_READERS)
                    .filter(|slot| readers().all(|(held, _)| *held != i64::from(*slot)))
                    .collect::<Vec<_>>();
                if line.read_turn(free.len()) {
                    self.dequeue(name, &line);
                    return self.grant_rw(name, Access::Read { slot: free[0] }, owner, ttl, now);
                }
                let expires_in = soonest(&mut readers().map(|(_, row)| row));
                let queued = self.queue_up(name, owner, read, queue, &line, false, now);
                RwAttempt::refused(expires_in, queued)
            }
            RwMode::Write => {
                if let Some(mine) = writer.filter(|row| row.owner == owner) {
                    self.dequeue(name, &line);
                    if mine.retired {
                        self.owe_readers(name);
                        return self.grant_rw(name, Access::Write, owner, ttl, now);
                    }
                    return RwAttempt::Granted {
                        fence: mine.fence,
                        access: Access::Write,
                        expires_in: left(mine),
                    };
                }
                if writer.is_none() && readers().next().is_none() && line.write_turn() {
                    self.dequeue(name, &line);
                    self.owe_readers(name);
                    return self.grant_rw(name, Access::Write, owner, ttl, now);
                }
                let expires_in = soonest(&mut writer.into_iter().chain(readers().map(|(_, r)| r)));
                let write = TicketKind::Write;
                let queued = self.queue_up(name, owner, write, queue, &line, false, now);
                RwAttempt::refused(expires_in, queued)
            }
        }
    }

    /// A new reader-writer grant of `name`, with the next fence.
    pub fn grant_rw(
        &mut self,
        name: &str,
        access: Access,
        owner: &str,
        ttl: Duration,
        now: Instant,
    ) -> RwAttempt {
        let Some(fence) = self.draw() else {
            return RwAttempt::Held { expires_in: None };
        };
        let row = Row {
            owner: owner.to_owned(),
            fence,
            expires_at: now + ttl,
            retired: false,
        };
        self.rw.insert((name.to_owned(), access.row_slot()), row);
        RwAttempt::Granted {
            fence,
            access,
            expires_in: ttl,
        }
    }

    /// Up to `limit` live grants (a lock's row, each permit of a
    /// semaphore, or a reader-writer lock's writer or each reader) whose names start with `prefix` and sort after `after`,
    /// in name and slot order (`str`'s `Ord` is byte order); the page ends
    /// with a whole name.
    pub fn list(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
        now: Instant,
    ) -> Vec<Listed> {
        let wanted =
            |name: &str| name.starts_with(prefix) && after.is_none_or(|after| name > after);
        let mut listed: Vec<Listed> = self
            .all_rows()
            .filter(|(name, row, _, _)| row.expires_at > now && wanted(name))
            .map(|(name, row, permit, access)| Listed {
                name: name.to_owned(),
                holder: Holder {
                    owner: row.owner.clone(),
                    fence: row.fence,
                    expires_in: row.expires_at - now,
                },
                permit,
                access,
            })
            .collect();
        sort_listed(&mut listed);
        end_with_a_whole_name(&mut listed, limit);
        listed
    }

    /// Every grant's row, live or not, with its permit or access (a
    /// waiting writer's intent is not a grant: left out).
    pub fn all_rows(
        &self,
    ) -> impl Iterator<Item = (&str, &Row, Option<PermitSlot>, Option<Access>)> + '_ {
        let locks = self
            .rows
            .iter()
            .map(|(name, row)| (name.as_str(), row, None, None));
        let permits = self.permits.iter().map(|((name, slot), permit)| {
            let slot = PermitSlot {
                slot: *slot,
                permits: permit.permits,
            };
            (name.as_str(), &permit.row, Some(slot), None)
        });
        let rw = self.rw.iter().filter_map(|((name, slot), row)| {
            Some((name.as_str(), row, None, Some(Access::of_row_slot(*slot)?)))
        });
        locks.chain(permits).chain(rw)
    }

    /// A permit of `name` for `owner` at `now`, decided and granted as one
    /// step (the rules of `Engine::acquire_permit`, queued first come, first
    /// served: `alkstore_core::queue`).
    pub fn acquire_permit(
        &mut self,
        name: &str,
        permits: u32,
        owner: &str,
        ttl: Duration,
        queue: Queue,
        now: Instant,
    ) -> PermitAttempt {
        if self.live(name, now).is_some() {
            return PermitAttempt::HeldAsLock;
        }
        if self.live_rw(name, now).any(|(slot, _)| slot != INTENT_SLOT) {
            return PermitAttempt::HeldAsReadWrite;
        }
        let live: Vec<(u32, PermitRow)> = self
            .live_permits(name, now)
            .map(|(slot, permit)| (slot, permit.clone()))
            .collect();
        if let Some((_, other)) = live.iter().find(|(_, p)| p.permits != permits) {
            return PermitAttempt::Mismatch {
                permits: other.permits,
            };
        }
        let line = self.line(name, queue, now);
        if let Some((slot, mine)) = live.iter().find(|(_, p)| p.row.owner == owner) {
            self.dequeue(name, &line);
            if mine.row.retired {
                return self.grant_permit(name, *slot, permits, owner, ttl, now);
            }
            return PermitAttempt::Granted {
                fence: mine.row.fence,
                slot: *slot,
                expires_in: mine.row.expires_at - now,
            };
        }
        let free: Vec<u32> = (0..permits)
            .filter(|slot| live.iter().all(|(held, _)| held != slot))
            .collect();
        if line.permit_turn(free.len()) {
            self.dequeue(name, &line);
            return self.grant_permit(name, free[0], permits, owner, ttl, now);
        }
        let expires_in = live.iter().map(|(_, p)| p.row.expires_at - now).min();
        let queued = self.queue_up(name, owner, TicketKind::Permit, queue, &line, false, now);
        PermitAttempt::refused(expires_in, queued)
    }

    /// A new grant of `slot` of `name`, with the next fence.
    pub fn grant_permit(
        &mut self,
        name: &str,
        slot: u32,
        permits: u32,
        owner: &str,
        ttl: Duration,
        now: Instant,
    ) -> PermitAttempt {
        let Some(fence) = self.draw() else {
            return PermitAttempt::Held { expires_in: None };
        };
        let row = Row {
            owner: owner.to_owned(),
            fence,
            expires_at: now + ttl,
            retired: false,
        };
        self.permits
            .insert((name.to_owned(), slot), PermitRow { row, permits });
        PermitAttempt::Granted {
            fence,
            slot,
            expires_in: ttl,
        }
    }

    /// The row of `grant`, a lock's, a permit's or a reader-writer
    /// lock's, whatever its state.
    pub fn row_of(&mut self, grant: &GrantKey) -> Option<&mut Row> {
        match (grant.permit, grant.access) {
            (Some(permit), _) => self
                .permits
                .get_mut(&(grant.name.clone(), permit.slot))
                .map(|permit| &mut permit.row),
            (None, Some(access)) => self.rw.get_mut(&(grant.name.clone(), access.row_slot())),
            (None, None) => self.rows.get_mut(&grant.name),
        }
    }

    /// Removes the row of `grant`'s name (and slot).
    pub fn remove(&mut self, grant: &GrantKey) {
        match (grant.permit, grant.access) {
            (Some(permit), _) => {
                self.permits.remove(&(grant.name.clone(), permit.slot));
            }
            (None, Some(access)) => {
                self.rw.remove(&(grant.name.clone(), access.row_slot()));
            }
            (None, None) => {
                self.rows.remove(&grant.name);
            }
        }
    }

    /// A lock of `name` for `owner` at `now`, decided and granted as one
    /// step (the rules of `Engine::acquire`, queued first come, first
    /// served: `alkstore_core::queue`).
    pub fn acquire(
        &mut self,
        name: &str,
        owner: &str,
        ttl: Duration,
        queue: Queue,
        now: Instant,
    ) -> Attempt {
        let live = self
            .rows
            .get(name)
            .filter(|row| row.expires_at > now)
            .cloned();
        let line = self.line(name, queue, now);
        let expires_in = match live {
            Some(row) if row.owner == owner => {
                self.dequeue(name, &line);
                // Its owner's retired grant: a new one, with a new fence.
                if row.retired {
                    return self.grant(name, owner, ttl, now);
                }
                return Attempt::Granted {
                    fence: row.fence,
                    expires_in: row.expires_at - now,
                };
            }
            Some(row) => Some(row.expires_at - now),
            None => match self.held_by_other_kind(name, now) {
                Some(HeldAs::Semaphore { permits }) => {
                    return Attempt::HeldAsSemaphore { permits };
                }
                Some(_) => return Attempt::HeldAsReadWrite,
                None if line.lock_turn() => {
                    self.dequeue(name, &line);
                    return self.grant(name, owner, ttl, now);
                }
                None => None,
            },
        };
        let queued = self.queue_up(name, owner, TicketKind::Lock, queue, &line, false, now);
        Attempt::refused(expires_in, queued)
    }

    /// A new grant of `name` to `owner`: the next fence, drawn under the
    /// same lock that makes the grant visible, so fences follow commit order.
    pub fn grant(&mut self, name: &str, owner: &str, ttl: Duration, now: Instant) -> Attempt {
        let Some(fence) = self.draw() else {
            return Attempt::Held { expires_in: None };
        };
        let row = Row {
            owner: owner.to_owned(),
            fence,
            expires_at: now + ttl,
            retired: false,
        };
        self.rows.insert(name.to_owned(), row);
        Attempt::Granted {
            fence,
            expires_in: ttl,
        }
    }
}

/// Sorts a listing in name and slot order (a writer's slot before its
/// readers', as an engine's permits table keeps them).
pub fn sort_listed(listed: &mut [Listed]) {
    listed.sort_by_key(|l| {
        let slot = match (l.permit, l.access) {
            (Some(permit), _) => Some(i64::from(permit.slot)),
            (None, access) => access.map(Access::row_slot),
        };
        (l.name.clone(), slot)
    });
}

/// Cuts a listing in name and slot order to a page of `limit` rows, and
/// the rest of the last row's name: a page never splits a semaphore.
pub fn end_with_a_whole_name(listed: &mut Vec<Listed>, limit: usize) {
    if let Some(last) = listed.get(limit.saturating_sub(1)).map(|l| l.name.clone()) {
        listed.retain(|l| l.name <= last);
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
        queue: Queue,
        _deadline: Option<Instant>,
    ) -> Result<Attempt, BoxError> {
        let now = Instant::now();
        self.with_rows(|rows| {
            let attempt = rows.acquire(name, owner, ttl.as_duration(), queue, now);
            rows.no_fence_left(attempt)
        })
    }

    async fn acquire_permit(
        &self,
        name: &str,
        permits: u32,
        owner: &str,
        ttl: LeaseMillis,
        queue: Queue,
        _deadline: Option<Instant>,
    ) -> Result<PermitAttempt, BoxError> {
        let now = Instant::now();
        self.with_rows(|rows| {
            let attempt = rows.acquire_permit(name, permits, owner, ttl.as_duration(), queue, now);
            rows.no_fence_left(attempt)
        })
    }

    async fn acquire_rw(
        &self,
        name: &str,
        mode: RwMode,
        owner: &str,
        ttl: LeaseMillis,
        queue: Queue,
        _deadline: Option<Instant>,
    ) -> Result<RwAttempt, BoxError> {
        let (now, ttl) = (Instant::now(), ttl.as_duration());
        self.with_rows(|rows| {
            let attempt = rows.acquire_rw(name, mode, owner, ttl, queue, now);
            rows.no_fence_left(attempt)
        })
    }

    fn queues(&self) -> bool {
        true
    }

    async fn leave_queue(&self, name: &str, ticket: u64) -> Result<bool, BoxError> {
        Ok(self.with_rows(|rows| {
            rows.tickets
                .remove(&(name.to_owned(), ticket))
                .is_some_and(|t| t.expires_at > Instant::now())
        }))
    }

    async fn waiters(&self, name: &str) -> Result<Vec<Waiter>, BoxError> {
        let now = Instant::now();
        Ok(self.with_rows(|rows| {
            rows.live_tickets(name, now)
                .into_iter()
                .map(|(ticket, t)| Waiter {
                    owner: t.owner,
                    ticket,
                    kind: t.kind.as_str(),
                    expires_in: t.expires_at - now,
                    waited: now.saturating_duration_since(t.since),
                })
                .collect()
        }))
    }

    async fn renew(&self, grant: &GrantKey, ttl: LeaseMillis) -> Result<bool, BoxError> {
        Ok(self.with_rows(|rows| {
            // Under the rows' lock: a renewal judges the lease by the time
            // it lands, never by a clock read before it waited.
            let now = Instant::now();
            match rows.row_of(grant) {
                Some(row)
                    if row.owner == grant.owner
                        && row.fence == grant.fence
                        && row.expires_at > now
                        && !row.retired =>
                {
                    row.expires_at = now + ttl.as_duration();
                    true
                }
                _ => false,
            }
        }))
    }

    async fn release(&self, grant: &GrantKey) -> Result<bool, BoxError> {
        Ok(self.with_rows(|rows| {
            let ours = rows
                .row_of(grant)
                .is_some_and(|row| row.owner == grant.owner && row.fence == grant.fence);
            if ours {
                rows.remove(grant);
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
        self.with_rows(|rows| {
            // The lowest fence a later grant can get must be a fence.
            let left = MAX_FENCE - rows.last_fence.min(MAX_FENCE);
            if by >= left {
                return Err(NoFenceLeft { left }.into());
            }
            rows.last_fence += by;
            for row in rows.every_row_mut() {
                row.retired = true;
            }
            Ok(rows.last_fence + 1)
        })
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
                return live;
            }
            // One permit, or one reader-writer grant, by its fence.
            let fence = fence?;
            let holder = |row: &Row| Holder {
                owner: row.owner.clone(),
                fence,
                expires_in: row.expires_at - now,
            };
            let permit = rows
                .live_permits(name, now)
                .find(|(_, permit)| permit.row.fence == fence)
                .map(|(slot, permit)| (slot, holder(&permit.row)));
            if let Some((slot, removed)) = permit {
                rows.permits.remove(&(name.to_owned(), slot));
                return Some(removed);
            }
            let (slot, row) = rows
                .live_rw(name, now)
                .find(|(slot, row)| *slot != INTENT_SLOT && row.fence == fence)?;
            let removed = holder(row);
            rows.rw.remove(&(name.to_owned(), slot));
            Some(removed)
        }))
    }

    async fn purge_expired(&self) -> Result<u64, BoxError> {
        let now = Instant::now();
        Ok(self.with_rows(|rows| {
            let count = |rows: &Rows| rows.rows.len() + rows.permits.len() + rows.rw.len();
            let before = count(rows);
            rows.rows.retain(|_, row| row.expires_at > now);
            rows.permits.retain(|_, permit| permit.row.expires_at > now);
            rows.rw.retain(|_, row| row.expires_at > now);
            (before - count(rows)) as u64
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
