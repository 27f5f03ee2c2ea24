//! Fair waiting: the queue of a name's waiters, as an engine keeps it.
//!
//! A waiting acquire (`lock`, `acquire_permit`, `read_lock`, `write_lock`)
//! on an engine that [queues](crate::Engine::queues) takes a *ticket* on its
//! first refused attempt: a number the engine draws in its own order (a
//! counter, etcd's revision), never from a host's clock. Every attempt
//! renews the ticket's lease; the attempt that is granted removes it in the
//! same atomic step. The engine grants a waiter only when its turn came
//! (docs/contract.md, "Fair waiting"):
//!
//! - a lock, or a reader-writer lock's writer: the name is free and no live
//!   ticket of the name is older;
//! - a permit: no live ticket of another kind is older than its, and the
//!   free permits outnumber the live tickets older than its;
//! - a reader (phase-fair): no writer holds, no lock's or permit's ticket
//!   is older than its, and either no writer's ticket
//!   is older than its, or its ticket is *owed* — a writer held when it
//!   queued, or a writer was granted since. A writer also waits while owed
//!   readers' tickets are live, so a reader waits for at most one writer.
//!
//! The queue is one across kinds: a waiter is never passed by a later
//! caller of another kind (which, granted, would turn the waiter's next
//! attempt into a "held as another kind" error). A `try_` call never takes
//! a ticket and is refused while waiters are owed the name
//! ([`Queue::Never`]). A waiter that stops waiting leaves at once
//! ([`Engine::leave_queue`](crate::Engine::leave_queue)); one that dies
//! leaves when its ticket's lease ends ([`TICKET_LEASE`] at most).

use std::time::Duration;

use crate::duration::LeaseMillis;

/// The longest a ticket lasts from one attempt: 1 s (less when the wait
/// left is shorter). A waiter attempts again before half of it has passed,
/// so this bounds how long a waiter that died (a killed process, a lost
/// network) keeps its place ahead of the others.
pub const TICKET_LEASE: Duration = Duration::from_secs(1);

/// How an acquire attempt stands toward its name's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queue {
    /// A `try_` call: never queued, and refused while a live ticket is owed
    /// the name (it never jumps the queue).
    Never,
    /// An attempt of a waiting call.
    Waiting {
        /// Its ticket from an earlier attempt; `None` on the first attempt
        /// (the engine draws one when it refuses).
        ticket: Option<u64>,
        /// How long its ticket lasts from this attempt.
        lease: LeaseMillis,
    },
}

impl Queue {
    /// How long the standing lasts from the attempt: a waiting call's
    /// ticket lease; `None` for a `try_` call. On an engine that does not
    /// queue, a waiting writer's is its intent's
    /// ([`Engine::acquire_rw`](crate::Engine::acquire_rw)).
    pub fn lease(self) -> Option<LeaseMillis> {
        match self {
            Queue::Never => None,
            Queue::Waiting { lease, .. } => Some(lease),
        }
    }
}

/// Where a refused waiting call stands in its name's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Queued {
    /// Its ticket, to give to its next attempt. A ticket the engine no
    /// longer had (it lapsed) is replaced by a new one, at the back.
    pub ticket: u64,
    /// How many live tickets of the name are older than this one.
    pub position: u32,
    /// The live ticket just before this one: its leaving (granted, or
    /// gone) is this waiter's cue to attempt again. `None` when this
    /// waiter is first in line: a release is its cue.
    pub ahead: Option<u64>,
}

/// One waiter of a name, as [`Store::waiters`](crate::Store::waiters)
/// shows it to an operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiter {
    /// The owner that waits.
    pub owner: String,
    /// Its ticket (its place: lower is earlier).
    pub ticket: u64,
    /// What it waits for: `"lock"`, `"permit"`, `"read"` or `"write"`.
    pub kind: &'static str,
    /// How long its ticket lasts unless renewed (its next attempt renews it).
    pub expires_in: Duration,
    /// How long it has waited in the queue: since its ticket was taken, by
    /// the engine's clock.
    pub waited: Duration,
}

/// What a ticket waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TicketKind {
    /// A lock.
    Lock,
    /// A permit of a semaphore.
    Permit,
    /// A reader-writer lock's reader.
    Read,
    /// A reader-writer lock's writer.
    Write,
}

impl TicketKind {
    /// As engines store it and [`Waiter::kind`] shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            TicketKind::Lock => "lock",
            TicketKind::Permit => "permit",
            TicketKind::Read => "read",
            TicketKind::Write => "write",
        }
    }

    /// The kind stored as `text`, if it is one.
    pub fn parse(text: &str) -> Option<Self> {
        [Self::Lock, Self::Permit, Self::Read, Self::Write]
            .into_iter()
            .find(|kind| kind.as_str() == text)
    }
}

/// One live ticket of a name, as an engine read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket {
    /// Its number: lower is earlier.
    pub number: u64,
    /// The owner that waits.
    pub owner: String,
    /// What it waits for.
    pub kind: TicketKind,
    /// A reader's: owed the next turn (a writer held when it queued, or a
    /// writer was granted since).
    pub owed: bool,
}

/// An attempt's view of its name's queue, from which an engine that decides
/// in Rust takes its grant decision (the SQL engines write the same rules
/// in their statements): the rules of this module's top, in one place.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Line {
    /// The live tickets older than the attempt's own (every live ticket for
    /// an attempt that has none live: a `try_` call, a first attempt, or
    /// one whose ticket lapsed), oldest first.
    pub ahead: Vec<Ticket>,
    /// The attempt's own live ticket.
    pub mine: Option<Ticket>,
    /// Whether any live ticket of the name (before or after the attempt's)
    /// is a reader's owed the next turn that can take it (no lock's or
    /// permit's ticket older than its: such a reader waits for that one
    /// first, and a writer waiting for it in turn would close a cycle): a
    /// writer waits while one is.
    pub owed_readers: bool,
}

impl Line {
    /// The line of an attempt standing as `queue` among the name's `live`
    /// tickets (oldest first).
    pub fn of(live: Vec<Ticket>, queue: Queue) -> Line {
        let other_kind = |t: &Ticket| matches!(t.kind, TicketKind::Lock | TicketKind::Permit);
        let owed_readers = live.iter().enumerate().any(|(at, t)| {
            t.kind == TicketKind::Read && t.owed && !live[..at].iter().any(other_kind)
        });
        let own = match queue {
            Queue::Waiting {
                ticket: Some(ticket),
                ..
            } => live.iter().position(|t| t.number == ticket),
            _ => None,
        };
        let (ahead, mine) = match own {
            Some(at) => {
                let mut ahead = live;
                let mine = ahead.drain(at..).next();
                (ahead, mine)
            }
            None => (live, None),
        };
        Line {
            ahead,
            mine,
            owed_readers,
        }
    }

    /// A lock's turn, with the name free: nobody queued before it.
    pub fn lock_turn(&self) -> bool {
        self.ahead.is_empty()
    }

    /// A permit's turn: nobody of another kind queued before it (the name
    /// is theirs first: one queue across kinds), and more permits `free`
    /// than waiters queued before it.
    pub fn permit_turn(&self, free: usize) -> bool {
        self.ahead.iter().all(|t| t.kind == TicketKind::Permit) && free > self.ahead.len()
    }

    /// A reader's turn, with no writer holding: no lock's or permit's
    /// waiter queued before it (one queue across kinds); no writer queued
    /// before it, or its ticket owed the turn; and more reader slots
    /// `free` than readers queued before it.
    pub fn read_turn(&self, free: usize) -> bool {
        let other_kind_ahead = self
            .ahead
            .iter()
            .any(|t| matches!(t.kind, TicketKind::Lock | TicketKind::Permit));
        if other_kind_ahead {
            return false;
        }
        let owed = self.mine.as_ref().is_some_and(|t| t.owed);
        let writer_ahead = self.ahead.iter().any(|t| t.kind == TicketKind::Write);
        let readers_ahead = self
            .ahead
            .iter()
            .filter(|t| t.kind == TicketKind::Read)
            .count();
        (owed || !writer_ahead) && free > readers_ahead
    }

    /// A writer's turn, with nothing holding the name: nobody queued before
    /// it, and no reader owed the turn.
    pub fn write_turn(&self) -> bool {
        self.ahead.is_empty() && !self.owed_readers
    }

    /// Where a refused waiting call of `kind` stands once its ticket is
    /// `ticket` (its own, renewed, or one drawn at the back), and `owed`
    /// (a reader's, as its ticket now says): its place, and its cue — the
    /// ticket whose leaving it waits for. The one just before it; for a
    /// reader owed its turn, none (a release is its cue: readers owed a
    /// turn go in together); for any other reader, the first writer queued
    /// before it (that writer's grant makes it owed).
    pub fn queued(&self, ticket: u64, kind: TicketKind, owed: bool) -> Queued {
        let ahead = match kind {
            TicketKind::Read if owed => None,
            TicketKind::Read => self
                .ahead
                .iter()
                .find(|t| t.kind == TicketKind::Write)
                .or(self.ahead.last())
                .map(|t| t.number),
            _ => self.ahead.last().map(|t| t.number),
        };
        Queued {
            ticket,
            position: u32::try_from(self.ahead.len()).unwrap_or(u32::MAX),
            ahead,
        }
    }
}

/// The lease of a waiter's ticket for its next attempt: [`TICKET_LEASE`],
/// cut to the wait left; at least a millisecond (the last attempt, with no
/// wait left, still keeps its place for the moment it runs).
pub(crate) fn ticket_lease(wait_left: Option<Duration>) -> LeaseMillis {
    let bound = wait_left.map_or(TICKET_LEASE, |left| left.min(TICKET_LEASE));
    LeaseMillis::new(bound.max(Duration::from_millis(1))).unwrap_or_else(|_| {
        // 1 ms to 1 s always fits; kept total rather than panicking.
        LeaseMillis::new(TICKET_LEASE).expect("a second is a valid lease")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ticket(number: u64, kind: TicketKind, owed: bool) -> Ticket {
        Ticket {
            number,
            owner: format!("o{number}"),
            kind,
            owed,
        }
    }

    fn waiting(ticket: Option<u64>) -> Queue {
        Queue::Waiting {
            ticket,
            lease: ticket_lease(None),
        }
    }

    #[test]
    fn a_line_splits_the_queue_at_the_attempts_own_ticket() {
        let live = vec![
            ticket(3, TicketKind::Lock, false),
            ticket(5, TicketKind::Lock, false),
            ticket(9, TicketKind::Lock, false),
        ];
        let line = Line::of(live.clone(), waiting(Some(5)));
        assert_eq!(line.ahead, live[..1]);
        assert_eq!(line.mine, Some(live[1].clone()));
        assert!(!line.lock_turn());
        assert_eq!(
            line.queued(5, TicketKind::Lock, false),
            Queued {
                ticket: 5,
                position: 1,
                ahead: Some(3)
            }
        );
        // No ticket, a lapsed one, or a try: behind every live ticket.
        for queue in [Queue::Never, waiting(None), waiting(Some(4))] {
            let line = Line::of(live.clone(), queue);
            assert_eq!((line.ahead.len(), line.mine), (3, None));
        }
        assert!(Line::of(live[..1].to_vec(), waiting(Some(3))).lock_turn());
        let permits: Vec<Ticket> = [3, 5, 9]
            .map(|n| ticket(n, TicketKind::Permit, false))
            .to_vec();
        let permits = Line::of(permits, waiting(Some(9)));
        assert!(!permits.permit_turn(2) && permits.permit_turn(3));
    }

    #[test]
    fn readers_and_writers_take_phase_fair_turns() {
        // A reader behind a writer waits; owed, it goes before that writer.
        let live = vec![
            ticket(1, TicketKind::Write, false),
            ticket(2, TicketKind::Read, false),
        ];
        let reader = Line::of(live.clone(), waiting(Some(2)));
        assert!(!reader.read_turn(10));
        assert_eq!(reader.queued(2, TicketKind::Read, false).ahead, Some(1));
        let owed = vec![
            ticket(1, TicketKind::Write, false),
            ticket(2, TicketKind::Read, true),
        ];
        let reader = Line::of(owed.clone(), waiting(Some(2)));
        assert!(reader.read_turn(10));
        assert_eq!(reader.queued(2, TicketKind::Read, true).ahead, None);
        // The writer first in line waits while a reader is owed the turn.
        let writer = Line::of(owed, waiting(Some(1)));
        assert!(!writer.write_turn());
        assert!(Line::of(live, waiting(Some(1))).write_turn());
        // A try reader (no ticket) never passes a queued writer.
        let only_writer = vec![ticket(1, TicketKind::Write, false)];
        assert!(!Line::of(only_writer, Queue::Never).read_turn(10));
    }

    #[test]
    fn no_kind_passes_a_waiter_of_another() {
        for first in [TicketKind::Lock, TicketKind::Read, TicketKind::Write] {
            let live = vec![ticket(1, first, false)];
            for queue in [Queue::Never, waiting(None), waiting(Some(2))] {
                assert!(!Line::of(live.clone(), queue).permit_turn(3), "{first:?}");
            }
        }
        for first in [TicketKind::Lock, TicketKind::Permit] {
            let live = vec![ticket(1, first, false), ticket(2, TicketKind::Read, true)];
            assert!(!Line::of(live.clone(), Queue::Never).read_turn(10));
            assert!(!Line::of(live, waiting(Some(2))).read_turn(10), "{first:?}");
        }
        // An owed reader behind a lock's waiter holds no writer back: the
        // writer, the lock's waiter and the reader would wait in a ring.
        let ring = vec![
            ticket(2, TicketKind::Write, false),
            ticket(3, TicketKind::Lock, false),
            ticket(4, TicketKind::Read, true),
        ];
        assert!(Line::of(ring.clone(), waiting(Some(2))).write_turn());
        assert!(!Line::of(ring, waiting(Some(4))).read_turn(10));
        // Behind its own kind, as before.
        let permits = vec![ticket(1, TicketKind::Permit, false)];
        assert!(Line::of(permits, Queue::Never).permit_turn(2));
        let readers = vec![ticket(1, TicketKind::Read, false)];
        assert!(Line::of(readers, Queue::Never).read_turn(2));
    }

    #[test]
    fn a_tickets_lease_is_cut_to_the_wait_and_kept_above_zero() {
        let ms = |n| Some(Duration::from_millis(n));
        assert_eq!(ticket_lease(None).get(), 1000);
        assert_eq!(ticket_lease(ms(60_000)).get(), 1000);
        assert_eq!(ticket_lease(ms(250)).get(), 250);
        assert_eq!(ticket_lease(ms(0)).get(), 1);
        assert_eq!(ticket_lease(Some(Duration::from_micros(10))).get(), 1);
    }
}
