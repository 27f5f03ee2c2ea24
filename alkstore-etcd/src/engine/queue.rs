//! Fair waiting on etcd (docs/fair-waiting.md): etcd's lock recipe, with
//! `alkstore_core::queue`'s rules.
//!
//! A waiter's ticket is a key beside its name's grants
//! ([`crate::keys::Layout::ticket`]), on a lease of its own, numbered by its
//! create revision. A refused waiting attempt draws one, under the compare a
//! grant writes under (nothing under the name written since the read it was
//! refused on), or renews its lease; a grant deletes it in its own
//! transaction; a waiter that stops waiting deletes it; a dead waiter's
//! goes with its lease. The store's watch hears every ticket's deletion and
//! cues the waiter behind it ([`crate::watcher`]).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use alkstore_core::{BoxError, LeaseMillis, Line, Queue, Queued, Ticket, TicketKind, Waiter};

use super::{EtcdEngine, NameState, attempt_bound, ran_out};
use crate::client::{self, Is, Target, Txn};
use crate::keys::{Slot, TicketValue};
use crate::proto::mvccpb::KeyValue;

/// The shortest lease of a ticket, in seconds
/// ([`crate::SHORTEST_TICKET_LEASE`]).
const TICKET_SECONDS: i64 = crate::SHORTEST_TICKET_LEASE.as_secs() as i64;

/// How long after a ticket's last renewal an attempt renews it again: its
/// waiter attempts at least twice a second, so a ticket has more than 1 s
/// left whenever it is looked at.
const RENEW_AFTER: Duration = Duration::from_millis(500);

/// How many tickets this engine remembers before it forgets those not
/// renewed for a minute (a closed store's waiters' are never taken out).
const REMEMBERED_TICKETS: usize = 1024;

/// How many waiting readers a writer's grant owes the next turn in its own
/// transaction (etcd refuses a transaction of more than 128 operations by
/// default). A reader beyond them is owed its turn by its own next attempt
/// while that writer holds.
const OWED_IN_ONE_GRANT: usize = 100;

/// One ticket of a name, as read.
#[derive(Debug, Clone)]
pub(super) struct FoundTicket {
    pub(super) kv: KeyValue,
    pub(super) value: TicketValue,
}

impl FoundTicket {
    /// Its number: its key's create revision.
    pub(super) fn number(&self) -> u64 {
        u64::try_from(self.kv.create_revision).unwrap_or(0)
    }
}

/// An attempt's line in `tickets` (oldest first), standing as `queue`.
pub(super) fn line_of(tickets: &[FoundTicket], queue: Queue) -> Line {
    let live = tickets
        .iter()
        .map(|t| Ticket {
            number: t.number(),
            owner: t.value.owner.clone(),
            kind: t.value.kind,
            owed: t.value.owed,
        })
        .collect();
    Line::of(live, queue)
}

/// The tickets this engine drew for its waiting calls, by name and
/// number: their keys, leases and last renewals.
#[derive(Debug, Default)]
pub(super) struct Drawn {
    map: Mutex<HashMap<(String, u64), DrawnTicket>>,
}

#[derive(Debug, Clone)]
struct DrawnTicket {
    key: Vec<u8>,
    lease: i64,
    renewed: Instant,
}

impl Drawn {
    fn insert(&self, name: &str, number: u64, key: Vec<u8>, lease: i64) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= REMEMBERED_TICKETS {
            map.retain(|_, t| t.renewed.elapsed() < Duration::from_secs(60));
        }
        let renewed = Instant::now();
        map.insert(
            (name.to_owned(), number),
            DrawnTicket {
                key,
                lease,
                renewed,
            },
        );
    }

    /// Whether the ticket is due for renewal (or was not drawn here).
    fn due(&self, name: &str, number: u64) -> bool {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&(name.to_owned(), number))
            .is_none_or(|t| t.renewed.elapsed() >= RENEW_AFTER)
    }

    fn renewed(&self, name: &str, number: u64, key: &[u8], lease: i64) {
        self.insert(name, number, key.to_vec(), lease);
    }

    /// Forgets the ticket: its key and lease, if it was drawn here.
    fn take(&self, name: &str, number: u64) -> Option<(Vec<u8>, i64)> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.remove(&(name.to_owned(), number))
            .map(|t| (t.key, t.lease))
    }
}

/// A ticket's lease a draw that lost its race left unused, for the next.
pub(super) struct Spare {
    pub(super) lease: i64,
    /// When it was asked for: its TTL counts from no earlier.
    asked: Instant,
}

/// What an attempt refused in turn wrote of its place.
pub(super) enum Standing {
    /// Its ticket, renewed or drawn, and where it stands.
    Queued(Queued),
    /// The name changed since the read: read again.
    Raced,
    /// The attempt's bound ran out before a ticket was drawn.
    RanOut,
}

/// An attempt of a waiting call, refused in turn.
pub(super) struct InTurn<'a> {
    pub(super) name: &'a str,
    pub(super) owner: &'a str,
    pub(super) kind: TicketKind,
    /// A reader held back by a writer's grant: owed the next turn.
    pub(super) owed: bool,
    /// How long its ticket lasts from the attempt (raised to a whole
    /// number of seconds, at least [`TICKET_SECONDS`]).
    pub(super) lease: LeaseMillis,
    pub(super) deadline: Option<Instant>,
}

impl EtcdEngine {
    /// Keeps a refused waiting attempt's place: its live ticket renewed (and
    /// owed, for a reader a writer holds back), or a new one drawn at the
    /// back. `spare` is a lease a draw that lost its race left, for the
    /// next draw; whatever is left there is the caller's to revoke.
    pub(super) async fn queue_up(
        &self,
        attempt: &InTurn<'_>,
        state: &NameState,
        line: &Line,
        spare: &mut Option<Spare>,
    ) -> Result<Standing, BoxError> {
        let InTurn {
            name, kind, owed, ..
        } = *attempt;
        let mine = line.mine.as_ref().and_then(|m| state.ticket(m.number));
        if let Some(mine) = mine {
            let number = mine.number();
            if owed && !mine.value.owed {
                let value = TicketValue {
                    owed: true,
                    ..mine.value.clone()
                };
                // Owed because a writer holds: unless a grant changed since.
                let txn = self
                    .while_the_writer_holds(self.grants_unchanged_since(name, state), state)
                    .when_created_at(mine.kv.key.clone(), mine.kv.create_revision)
                    .put_keeping_lease(mine.kv.key.clone(), value.encode());
                if !self.client.txn(txn).await?.succeeded {
                    return Ok(Standing::Raced);
                }
            }
            self.renew_if_due(name, mine).await?;
            let owed = owed || mine.value.owed;
            return Ok(Standing::Queued(line.queued(number, kind, owed)));
        }
        let (lease, asked) = match spare.take() {
            Some(spare) if spare.asked.elapsed() < RENEW_AFTER => (spare.lease, spare.asked),
            left => {
                // Too old to be sure it still runs: a put on a lapsed lease
                // is an error, not a lost race.
                if let Some(old) = left {
                    self.client.lease_revoke_later(old.lease);
                }
                let seconds = self.granted_seconds(attempt.lease).max(TICKET_SECONDS);
                let bound = attempt_bound(attempt.deadline);
                let asked = Instant::now();
                match self.lease(seconds, bound).await {
                    Ok((lease, _)) => (lease, asked),
                    Err(status) if ran_out(&status, bound, &self.client) => {
                        return Ok(Standing::RanOut);
                    }
                    Err(status) => return Err(status.into()),
                }
            }
        };
        let key = self.layout.ticket(name, lease);
        let value = TicketValue {
            kind,
            owed,
            since_ms: now_ms(),
            owner: attempt.owner.to_owned(),
        };
        // Unless a grant changed since the read: a reader's ticket drawn on
        // a stale read could miss that a writer holds, or a writer's grant
        // that owes it the next turn. Tickets drawn meanwhile do not count:
        // this one is behind them all the same, and the queue is read again
        // in the draw's own transaction, for its place and cue.
        let since = self.grants_unchanged_since(name, state);
        let since = match owed {
            true => self.while_the_writer_holds(since, state),
            false => since,
        };
        let txn = since.put(key.clone(), value.encode(), lease).read(
            self.layout.tickets_start(name),
            self.layout.tickets_end(name),
        );
        // Revoked unless answered: a ticket whose number its waiter never
        // learnt (its future dropped, or the answer lost) would stand in
        // the queue for a whole lease. A ticket promises nothing to
        // anyone, so an error revokes it even if it landed.
        let unclaimed = Unclaimed::new(self.client.clone(), lease);
        let answer = self.client.txn(txn).await?;
        unclaimed.claim();
        if !answer.succeeded {
            *spare = Some(Spare { lease, asked });
            return Ok(Standing::Raced);
        }
        let number = u64::try_from(client::revision(&answer)).unwrap_or(0);
        self.drawn.insert(name, number, key, lease);
        // Every other ticket the draw saw is older than this one.
        let queue = client::reads(answer).into_iter().next().unwrap_or_default();
        let mut ahead = self.decode(queue.kvs).1;
        ahead.retain(|t| t.number() != number);
        ahead.sort_by_key(|t| t.kv.create_revision);
        let line = line_of(&ahead, Queue::Never);
        Ok(Standing::Queued(line.queued(number, kind, owed)))
    }

    /// `txn`, failing unless the writer that holds in `state` still holds:
    /// its key there with the mod revision read. A reader's ticket is
    /// written owed only under it, so that no ticket turns owed after a
    /// waiting writer saw the name free (deleted keys do not fail the
    /// compare on grant keys; this one fails on a key gone).
    fn while_the_writer_holds(&self, txn: Txn, state: &NameState) -> Txn {
        match state.of(Slot::Writer) {
            Some(writer) => txn.when(
                writer.kv.key.clone(),
                Vec::new(),
                Target::Mod,
                Is::Equal,
                writer.kv.mod_revision,
            ),
            None => txn,
        }
    }

    /// Renews `mine`'s lease if 500 ms passed since its last renewal.
    pub(super) async fn renew_if_due(
        &self,
        name: &str,
        mine: &FoundTicket,
    ) -> Result<(), BoxError> {
        let number = mine.number();
        if self.drawn.due(name, number)
            && self.client.lease_keep_alive_once(mine.kv.lease).await? > 0
        {
            self.drawn
                .renewed(name, number, &mine.kv.key, mine.kv.lease);
        }
        Ok(())
    }

    /// A grant's transaction, also deleting the attempt's own ticket
    /// (`mine`, if live) and, for a writer's grant, owing every waiting
    /// reader the next turn: each in a transaction of its own inside the
    /// grant's, compared live (a put of a gone key would be an error), so
    /// that a reader leaving meanwhile does not fail the grant (with short
    /// waiting readers arriving and leaving all the time, it would fail
    /// again and again).
    pub(super) fn dequeue_with(
        &self,
        txn: Txn,
        state: &NameState,
        mine: Option<&FoundTicket>,
        writer: bool,
    ) -> Txn {
        let txn = match mine {
            Some(mine) => txn.delete(mine.kv.key.clone()),
            None => txn,
        };
        if !writer {
            return txn;
        }
        state
            .tickets
            .iter()
            .filter(|t| t.value.kind == TicketKind::Read && !t.value.owed)
            .take(OWED_IN_ONE_GRANT)
            .fold(txn, |txn, reader| txn.then_if(owe(reader)))
    }

    /// After a writer's grant (its key `key`, written at `revision`, on
    /// the name read as `state`; `answer` its transaction's, whose one read
    /// is the queue as it committed): the readers that queued after the
    /// read, which the grant did not owe the turn, are owed it now, while
    /// the grant still holds (its key unchanged). A reader that leaves
    /// meanwhile is passed over; a failure leaves them to owe themselves
    /// at their next attempt while the writer holds.
    pub(super) async fn owe_latecomers(
        &self,
        key: &[u8],
        revision: i64,
        state: &NameState,
        answer: crate::proto::etcdserverpb::TxnResponse,
    ) {
        let queue = client::reads(answer).into_iter().next().unwrap_or_default();
        let latecomers: Vec<FoundTicket> = self
            .decode(queue.kvs)
            .1
            .into_iter()
            .filter(|t| {
                t.value.kind == TicketKind::Read
                    && !t.value.owed
                    && t.kv.create_revision > state.revision
            })
            .take(OWED_IN_ONE_GRANT)
            .collect();
        if latecomers.is_empty() {
            return;
        }
        let txn = latecomers.iter().fold(
            Txn::new().when(key.to_vec(), Vec::new(), Target::Mod, Is::Equal, revision),
            |txn, reader| txn.then_if(owe(reader)),
        );
        let _ = self.client.txn(txn).await;
    }

    /// After a grant deleted `mine` (or answered its owner's grant back):
    /// its lease goes.
    pub(super) fn dequeued(&self, name: &str, mine: &FoundTicket) {
        self.drawn.take(name, mine.number());
        self.client.lease_revoke_later(mine.kv.lease);
    }

    /// Deletes `mine`: the attempt answered its owner's own grant back,
    /// and wrote nothing that deleted it. A failure leaves it to its lease
    /// (the grant's answer stands).
    pub(super) async fn dequeue_now(&self, name: &str, mine: &FoundTicket) {
        let txn = Txn::new()
            .when_created_at(mine.kv.key.clone(), mine.kv.create_revision)
            .delete(mine.kv.key.clone());
        let _ = self.client.txn(txn).await;
        self.dequeued(name, mine);
    }

    /// Deletes ticket `number` of `name`; whether it was there.
    pub(super) async fn leave(&self, name: &str, number: u64) -> Result<bool, BoxError> {
        let (key, lease) = match self.drawn.take(name, number) {
            Some(drawn) => drawn,
            None => match self.read_name(name).await?.ticket(number) {
                Some(t) => (t.kv.key.clone(), t.kv.lease),
                None => return Ok(false),
            },
        };
        let revision = i64::try_from(number).unwrap_or(i64::MAX);
        let txn = Txn::new()
            .when_created_at(key.clone(), revision)
            .delete(key);
        let left = self.client.txn(txn).await;
        // The ticket's own lease holds nothing else: revoked whether or not
        // the delete was answered, it takes the ticket with it.
        self.client.lease_revoke_later(lease);
        Ok(left?.succeeded)
    }

    /// `name`'s live tickets, oldest first, as an operator sees them.
    pub(super) async fn waiters_of(&self, name: &str) -> Result<Vec<Waiter>, BoxError> {
        let state = self.read_name(name).await?;
        let lefts = self
            .times_left(state.tickets.iter().map(|t| t.kv.lease).collect())
            .await;
        let now = now_ms();
        state
            .tickets
            .into_iter()
            .zip(lefts)
            .map(|(t, left)| {
                Ok(Waiter {
                    ticket: t.number(),
                    kind: t.value.kind.as_str(),
                    expires_in: left?,
                    waited: Duration::from_millis(now.saturating_sub(t.value.since_ms)),
                    owner: t.value.owner,
                })
            })
            .collect()
    }
}

/// A transaction of its own, to nest in a writer's: `reader`'s ticket
/// owed the next turn, if it is still the ticket read (a put of a gone key
/// would be an error; a failed nested compare fails nothing else).
fn owe(reader: &FoundTicket) -> Txn {
    let owed = TicketValue {
        owed: true,
        ..reader.value.clone()
    };
    Txn::new()
        .when_created_at(reader.kv.key.clone(), reader.kv.create_revision)
        .put_keeping_lease(reader.kv.key.clone(), owed.encode())
}

/// A drawn ticket's lease while its draw is under way: revoked if dropped
/// unclaimed, when the attempt was dropped (its call cancelled) or its draw
/// failed before it learnt its ticket. Its waiter could neither renew nor
/// leave that ticket, which would stand in the queue for a whole lease.
/// Revoked, the lease takes the ticket with it, or the draw, landing
/// after, fails.
struct Unclaimed {
    client: crate::client::Client,
    lease: Option<i64>,
}

impl Unclaimed {
    fn new(client: crate::client::Client, lease: i64) -> Self {
        Unclaimed {
            client,
            lease: Some(lease),
        }
    }

    /// The draw answered: its caller has the lease.
    fn claim(mut self) {
        self.lease = None;
    }
}

impl Drop for Unclaimed {
    fn drop(&mut self) {
        let Some(lease) = self.lease.take() else {
            return;
        };
        // Dropped with its runtime gone: the lease ends with its TTL.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let client = self.client.clone();
            runtime.spawn(async move {
                let _ = client.lease_revoke(lease).await;
            });
        }
    }
}

/// This host's clock, in ms since the Unix epoch (0 before it).
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
