//! The row operations of the SQLite engine, run inline or on the connection's
//! own thread (see `worker.rs`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use alkstore_core::clock::system_millis;
use alkstore_core::{
    Access, Attempt, BoxError, Engine, GrantKey, HeldAs, Holder, INTENT_SLOT, LeaseMillis, Line,
    Listed, MAX_FENCE, MAX_READERS, NoFenceLeft, PermitAttempt, PermitSlot, Queue, Queued,
    READ_WRITE_PERMITS, ReleaseBus, RwAttempt, RwMode, Ticket, TicketKind, WRITER_SLOT, Waiter,
    fence_from_sql, fence_to_sql, holder_from_sql, lease_left, permits_row_kind,
};
use async_trait::async_trait;
use rusqlite::{Connection, ErrorCode, OptionalExtension, TransactionBehavior, params};

use crate::sql;
use crate::worker::Worker;

/// Polling ceiling for releases made by other processes on the same file.
const POLL_CEILING: Duration = Duration::from_millis(100);

#[derive(Debug)]
pub(crate) struct SqliteEngine {
    pub(crate) worker: Worker,
    pub(crate) bus: Arc<ReleaseBus>,
}

/// How a write's commit reaches the disk (SQLite's `synchronous`, a
/// setting of the connection, set before each write). A grant, a renewal
/// and a forced release are synced before they are answered: a power loss
/// must not undo them (a lost grant would hand its fence out again, a lost
/// renewal shorten a lease its holder was promised, a lost forced release
/// bring back a grant the operator was told is gone). A release and a purge
/// are not: losing one only delays the next grant until the lease runs out,
/// and the next synced commit — a grant's — takes them along, so no name is
/// granted on a release a power loss could still undo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Commit {
    Synced,
    Unsynced,
}

/// Sets how the connection's next commits reach the disk.
pub(crate) fn commit_mode(conn: &Connection, commit: Commit) -> rusqlite::Result<()> {
    let pragma = match commit {
        Commit::Synced => sql::SYNCED,
        Commit::Unsynced => sql::UNSYNCED,
    };
    conn.prepare_cached(pragma)?.execute([])?;
    Ok(())
}

/// A lock row as read.
struct Row {
    owner: String,
    fence: i64,
    expires_at: i64,
    /// Retired by a fence raise: not renewed, its owner's ask granted anew.
    retired: bool,
}

fn read_row(conn: &Connection, name: &str) -> rusqlite::Result<Option<Row>> {
    conn.prepare_cached(sql::ROW)?
        .query_row([name], |r| {
            Ok(Row {
                owner: r.get(0)?,
                fence: r.get(1)?,
                expires_at: r.get(2)?,
                retired: r.get::<_, i64>(3)? != 0,
            })
        })
        .optional()
}

/// A holder as the statements answer it: owner, fence, time left.
fn holder_of(r: &rusqlite::Row<'_>, first: usize) -> rusqlite::Result<Holder> {
    Ok(holder_from_sql(
        r.get(first)?,
        r.get(first + 1)?,
        r.get(first + 2)?,
    ))
}

/// What a live row means for `owner`; `None` when there is no live row,
/// or when it is the owner's own retired by a fence raise (granted anew).
fn decide(row: Option<&Row>, owner: &str, now: i64) -> Option<Attempt> {
    let row = row.filter(|r| r.expires_at > now && !(r.retired && r.owner == owner))?;
    let expires_in = lease_left(row.expires_at - now);
    Some(if row.owner == owner {
        Attempt::Granted {
            fence: fence_from_sql(row.fence),
            expires_in,
        }
    } else {
        Attempt::Held {
            expires_in: Some(expires_in),
        }
    })
}

/// The next fence, drawn in the caller's transaction; past [`MAX_FENCE`],
/// [`NoFenceLeft`] (carried as the error's source) and nothing drawn.
fn next_fence(conn: &Connection) -> rusqlite::Result<i64> {
    conn.prepare_cached(sql::NEXT_FENCE)?
        .query_row([fence_to_sql(MAX_FENCE)], |r| r.get(0))
        .optional()?
        .ok_or_else(|| no_fence_left(0))
}

/// [`NoFenceLeft`] as an SQLite job's error (the core finds it in the
/// source chain).
fn no_fence_left(left: u64) -> rusqlite::Error {
    rusqlite::Error::ToSqlConversionFailure(Box::new(NoFenceLeft { left }))
}

/// What an attempt's look at a name's rows and queue comes to.
enum Turn<A, G> {
    /// The answer; nothing to write.
    Answer(A),
    /// The owner's own live grant, given back: the answer, and the
    /// attempt's ticket, if it has one, leaves the queue (a waiting call of
    /// an owner that already holds the name is granted with it).
    Own(A),
    /// Its turn: grant this.
    Grant(G),
    /// Not its turn (the name is held, or others queued first): refused,
    /// with the soonest lease end, and queued when the call waits; `owed`,
    /// a reader a writer holds back (owed the turn after it).
    Wait {
        expires_in: Option<Duration>,
        owed: bool,
    },
}

/// The live tickets of `name`, and where an attempt standing as `queue`
/// stands among them.
fn live_line(conn: &Connection, name: &str, queue: Queue, now: i64) -> rusqlite::Result<Line> {
    let live = conn
        .prepare_cached(sql::LIVE_TICKETS)?
        .query_map(params![name, now], |r| {
            let kind: String = r.get(2)?;
            Ok(Ticket {
                number: u64::try_from(r.get::<_, i64>(0)?).unwrap_or(0),
                owner: r.get(1)?,
                kind: TicketKind::parse(&kind).unwrap_or(TicketKind::Lock),
                owed: r.get::<_, i64>(3)? != 0,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(Line::of(live, queue))
}

/// One attempt of any kind, in turn (`alkstore_core::queue`): `decide`
/// looks at the rows and the line, `grant` writes a grant, `refused`
/// words a refusal. A `try_` call's refusal, like every answer that is no
/// grant, is decided by a plain read: nothing written. A grant is written
/// under the write lock after a second look, synced, with the attempt's
/// ticket removed; a waiting call's refusal renews its ticket (or draws
/// one, at the back), unsynced: a ticket lost to a power cut only gives
/// up a place.
///
/// With a `deadline` (a waiting acquire), the wait for another
/// connection's write lock is cut to the time left, and running out of it
/// is a refusal that wrote nothing, not an error. `busy` is the
/// connection's busy timeout where the call runs (zero inline): the wait
/// is never longer, and a busy answer within a zero timeout goes back to
/// the caller (to run again on the connection's thread) rather than count
/// as a refusal.
#[allow(clippy::too_many_arguments)]
fn in_turn<A, G>(
    conn: &mut Connection,
    name: &str,
    owner: &str,
    kind: TicketKind,
    queue: Queue,
    deadline: Option<Instant>,
    busy: Duration,
    decide: impl Fn(&Connection, &Line, i64) -> rusqlite::Result<Turn<A, G>>,
    grant: impl Fn(&Connection, G, i64) -> rusqlite::Result<A>,
    refused: impl Fn(Option<Duration>, Option<Queued>) -> A,
) -> rusqlite::Result<A> {
    // A waiting acquire waits for other connections' locks no longer than
    // its wait left, on every statement (the worker sets the busy timeout
    // afresh for each job, so it is not put back).
    let waiting = deadline.filter(|_| !busy.is_zero());
    if let Some(deadline) = waiting {
        conn.busy_timeout(deadline.saturating_duration_since(Instant::now()).min(busy))?;
    }
    let attempt = (|| -> rusqlite::Result<A> {
        let now = system_millis();
        let first = decide(conn, &live_line(conn, name, queue, now)?, now)?;
        let mut commit = match (first, queue) {
            (Turn::Answer(answer), _) => return Ok(answer),
            (Turn::Own(answer), Queue::Never | Queue::Waiting { ticket: None, .. }) => {
                return Ok(answer);
            }
            (Turn::Own(_), Queue::Waiting { .. }) => Commit::Unsynced,
            (Turn::Wait { expires_in, .. }, Queue::Never) => return Ok(refused(expires_in, None)),
            (Turn::Wait { .. }, Queue::Waiting { .. }) => Commit::Unsynced,
            (Turn::Grant(_), _) => Commit::Synced,
        };
        loop {
            commit_mode(conn, commit)?;
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let now = system_millis();
            let line = live_line(&tx, name, queue, now)?;
            let answer = match (decide(&tx, &line, now)?, queue) {
                (Turn::Answer(answer), _) => return Ok(answer),
                (Turn::Own(answer), _) => match &line.mine {
                    Some(mine) => {
                        tx.prepare_cached(sql::DROP_TICKET)?.execute(params![
                            name,
                            ticket_to_sql(mine.number),
                            now
                        ])?;
                        answer
                    }
                    None => return Ok(answer),
                },
                (Turn::Wait { expires_in, .. }, Queue::Never) => {
                    return Ok(refused(expires_in, None));
                }
                // The setting cannot change inside a transaction: a grant
                // found where a ticket was planned is decided again, synced.
                (Turn::Grant(_), _) if commit == Commit::Unsynced => {
                    commit = Commit::Synced;
                    continue;
                }
                (Turn::Grant(granted), _) => {
                    if let Some(mine) = &line.mine {
                        tx.prepare_cached(sql::DROP_TICKET)?.execute(params![
                            name,
                            ticket_to_sql(mine.number),
                            now
                        ])?;
                    }
                    grant(&tx, granted, now)?
                }
                (Turn::Wait { expires_in, owed }, Queue::Waiting { lease, .. }) => {
                    let until = now + lease.as_i64();
                    let (number, owed) = match &line.mine {
                        Some(mine) => {
                            tx.prepare_cached(sql::RENEW_TICKET)?.execute(params![
                                name,
                                ticket_to_sql(mine.number),
                                until,
                                owed
                            ])?;
                            (mine.number, mine.owed || owed)
                        }
                        None => {
                            tx.prepare_cached(sql::DROP_LAPSED_TICKETS)?
                                .execute(params![name, now])?;
                            let number: i64 = tx
                                .prepare_cached(sql::NEXT_TICKET)?
                                .query_row([], |r| r.get(0))?;
                            tx.prepare_cached(sql::TAKE_TICKET)?.execute(params![
                                name,
                                number,
                                owner,
                                kind.as_str(),
                                owed,
                                until,
                                now
                            ])?;
                            (u64::try_from(number).unwrap_or(0), owed)
                        }
                    };
                    refused(expires_in, Some(line.queued(number, kind, owed)))
                }
            };
            tx.commit()?;
            return Ok(answer);
        }
    })();
    match attempt {
        Err(e) if waiting.is_some() && e.sqlite_error_code() == Some(ErrorCode::DatabaseBusy) => {
            Ok(refused(None, None))
        }
        attempt => attempt,
    }
}

/// A ticket number as SQLite stores it (drawn from a 64-bit signed
/// counter, so every number handed out fits).
fn ticket_to_sql(number: u64) -> i64 {
    i64::try_from(number).unwrap_or(i64::MAX)
}

/// Acquires `name` for `owner`, in turn ([`in_turn`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn acquire(
    conn: &mut Connection,
    name: &str,
    owner: &str,
    ttl: i64,
    queue: Queue,
    deadline: Option<Instant>,
    busy: Duration,
) -> rusqlite::Result<Attempt> {
    let look = |conn: &Connection, line: &Line, now: i64| {
        let row = read_row(conn, name)?;
        match decide(row.as_ref(), owner, now) {
            Some(Attempt::Held { expires_in }) => {
                return Ok(Turn::Wait {
                    expires_in,
                    owed: false,
                });
            }
            Some(answer) => return Ok(Turn::Own(answer)),
            None => {}
        }
        // The owner's own grant, retired by a fence raise: granted anew,
        // whoever waits.
        let own = row.is_some_and(|r| r.expires_at > now && r.owner == owner);
        match semaphore_of(conn, name, now)?.map(HeldAs::of_permits_column) {
            Some(HeldAs::Semaphore { permits }) => {
                return Ok(Turn::Answer(Attempt::HeldAsSemaphore { permits }));
            }
            Some(_) => return Ok(Turn::Answer(Attempt::HeldAsReadWrite)),
            None => {}
        }
        Ok(match own || line.lock_turn() {
            true => Turn::Grant(()),
            false => Turn::Wait {
                expires_in: None,
                owed: false,
            },
        })
    };
    let grant = |tx: &Connection, (): (), now: i64| {
        let fence = next_fence(tx)?;
        tx.prepare_cached(sql::GRANT)?
            .execute(params![name, owner, fence, now + ttl])?;
        Ok(Attempt::Granted {
            fence: fence_from_sql(fence),
            expires_in: lease_left(ttl),
        })
    };
    let refused = Attempt::refused;
    let kind = TicketKind::Lock;
    in_turn(
        conn, name, owner, kind, queue, deadline, busy, look, grant, refused,
    )
}

/// The permits of the semaphore whose live permits hold `name`, if any.
fn semaphore_of(conn: &Connection, name: &str, now: i64) -> rusqlite::Result<Option<u32>> {
    conn.prepare_cached(sql::SEMAPHORE_OF)?
        .query_row(params![name, now], |r| r.get(0))
        .optional()
}

/// A live row of `alkstore_permits` as read: a permit's, or a
/// reader-writer lock's (permits 0).
struct PermitRow {
    slot: i64,
    owner: String,
    fence: i64,
    expires_at: i64,
    permits: u32,
    /// Retired by a fence raise: not renewed, its owner's ask granted anew.
    retired: bool,
}

fn live_permits(conn: &Connection, name: &str, now: i64) -> rusqlite::Result<Vec<PermitRow>> {
    conn.prepare_cached(sql::LIVE_PERMITS)?
        .query_map(params![name, now], |r| {
            Ok(PermitRow {
                slot: r.get(0)?,
                owner: r.get(1)?,
                fence: r.get(2)?,
                expires_at: r.get(3)?,
                permits: r.get(4)?,
                retired: r.get::<_, i64>(5)? != 0,
            })
        })?
        .collect()
}

/// The soonest end of `rows`' leases, if any.
fn soonest<'a>(rows: impl Iterator<Item = &'a PermitRow>, now: i64) -> Option<Duration> {
    rows.map(|p| lease_left(p.expires_at - now)).min()
}

/// What the rows of `name` and its line mean for a permit of `permits`
/// for `owner`: an answer, the free slot to grant, or a wait.
fn decide_permit(
    conn: &Connection,
    name: &str,
    permits: u32,
    owner: &str,
    line: &Line,
    now: i64,
) -> rusqlite::Result<Turn<PermitAttempt, u32>> {
    if read_row(conn, name)?.is_some_and(|row| row.expires_at > now) {
        return Ok(Turn::Answer(PermitAttempt::HeldAsLock));
    }
    let live = live_permits(conn, name, now)?;
    if let Some(other) = live.iter().find(|p| p.permits != permits) {
        return Ok(Turn::Answer(
            match HeldAs::of_permits_column(other.permits) {
                HeldAs::Semaphore { permits } => PermitAttempt::Mismatch { permits },
                _ => PermitAttempt::HeldAsReadWrite,
            },
        ));
    }
    // Every live row is this semaphore's permit: its slot is 0..permits.
    if let Some(mine) = live.iter().find(|p| p.owner == owner) {
        if mine.retired {
            // Retired by a fence raise: its own slot, granted anew.
            return Ok(Turn::Grant(mine.slot as u32));
        }
        return Ok(Turn::Own(PermitAttempt::Granted {
            fence: fence_from_sql(mine.fence),
            slot: mine.slot as u32,
            expires_in: lease_left(mine.expires_at - now),
        }));
    }
    let free = (permits as usize).saturating_sub(live.len());
    Ok(match lowest_free_slot(&live, permits) {
        Some(slot) if line.permit_turn(free) => Turn::Grant(slot),
        _ => Turn::Wait {
            expires_in: soonest(live.iter(), now),
            owed: false,
        },
    })
}

/// The lowest slot below `bound` that no row of `live` (in slot order)
/// holds.
fn lowest_free_slot(live: &[PermitRow], bound: u32) -> Option<u32> {
    let mut slots = live.iter().map(|p| p.slot).filter(|&slot| slot >= 0);
    // Slots come in order: the first not at its own index is free.
    let mut next = slots.next();
    (0..bound).find(|&slot| {
        if next == Some(i64::from(slot)) {
            next = slots.next();
            false
        } else {
            true
        }
    })
}

/// What the rows of `name` and its line mean for a reader-writer grant of
/// `mode` for `owner` (docs/contract.md, "Reader-writer locks", "Fair
/// waiting"): an answer, the access to grant, or a wait.
fn decide_rw(
    conn: &Connection,
    name: &str,
    mode: RwMode,
    owner: &str,
    line: &Line,
    now: i64,
) -> rusqlite::Result<Turn<RwAttempt, Access>> {
    use Turn::{Answer, Grant, Own, Wait};
    if read_row(conn, name)?.is_some_and(|row| row.expires_at > now) {
        return Ok(Answer(RwAttempt::HeldAsOther(HeldAs::Lock)));
    }
    // A waiting writer's intent of schema version 4 is no longer read.
    let live: Vec<PermitRow> = live_permits(conn, name, now)?
        .into_iter()
        .filter(|p| p.slot != INTENT_SLOT)
        .collect();
    if let Some(other) = live.iter().find(|p| p.permits != READ_WRITE_PERMITS) {
        let held_as = HeldAs::of_permits_column(other.permits);
        return Ok(Answer(RwAttempt::HeldAsOther(held_as)));
    }
    let writer = live.iter().find(|p| p.slot == WRITER_SLOT);
    let readers = || live.iter().filter(|p| p.slot >= 0);
    let mine = |row: &PermitRow, access| RwAttempt::Granted {
        fence: fence_from_sql(row.fence),
        access,
        expires_in: lease_left(row.expires_at - now),
    };
    Ok(match mode {
        RwMode::Read => {
            if let Some(row) = readers().find(|p| p.owner == owner) {
                let access = Access::Read {
                    slot: row.slot as u32,
                };
                match row.retired {
                    true => Grant(access),
                    false => Own(mine(row, access)),
                }
            } else if let Some(writer) = writer {
                // A writer holds: this reader is owed the turn after it.
                Wait {
                    expires_in: soonest(std::iter::once(writer), now),
                    owed: true,
                }
            } else {
                let free = (MAX_READERS as usize).saturating_sub(readers().count());
                match lowest_free_slot(&live, MAX_READERS) {
                    Some(slot) if line.read_turn(free) => Grant(Access::Read { slot }),
                    _ => Wait {
                        expires_in: soonest(readers(), now),
                        owed: false,
                    },
                }
            }
        }
        RwMode::Write => {
            if let Some(row) = writer.filter(|p| p.owner == owner) {
                match row.retired {
                    true => Grant(Access::Write),
                    false => Own(mine(row, Access::Write)),
                }
            } else if writer.is_none() && readers().next().is_none() && line.write_turn() {
                Grant(Access::Write)
            } else {
                Wait {
                    expires_in: soonest(writer.into_iter().chain(readers()), now),
                    owed: false,
                }
            }
        }
    })
}

/// A reader-writer lock's grant of `name`, in turn ([`in_turn`]): a
/// writer's grant owes every reader queued then the turn after it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn acquire_rw(
    conn: &mut Connection,
    name: &str,
    mode: RwMode,
    owner: &str,
    ttl: i64,
    queue: Queue,
    deadline: Option<Instant>,
    busy: Duration,
) -> rusqlite::Result<RwAttempt> {
    let look =
        |conn: &Connection, line: &Line, now: i64| decide_rw(conn, name, mode, owner, line, now);
    let grant = |tx: &Connection, access: Access, now: i64| {
        let fence = next_fence(tx)?;
        tx.prepare_cached(sql::GRANT_PERMIT)?.execute(params![
            name,
            access.row_slot(),
            owner,
            fence,
            now + ttl,
            READ_WRITE_PERMITS
        ])?;
        if access == Access::Write {
            tx.prepare_cached(sql::OWE_READERS)?.execute([name])?;
        }
        Ok(RwAttempt::Granted {
            fence: fence_from_sql(fence),
            access,
            expires_in: lease_left(ttl),
        })
    };
    let refused = RwAttempt::refused;
    let kind = match mode {
        RwMode::Read => TicketKind::Read,
        RwMode::Write => TicketKind::Write,
    };
    in_turn(
        conn, name, owner, kind, queue, deadline, busy, look, grant, refused,
    )
}

/// A permit of `name`, in turn ([`in_turn`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn acquire_permit(
    conn: &mut Connection,
    name: &str,
    permits: u32,
    owner: &str,
    ttl: i64,
    queue: Queue,
    deadline: Option<Instant>,
    busy: Duration,
) -> rusqlite::Result<PermitAttempt> {
    let look = |conn: &Connection, line: &Line, now: i64| {
        decide_permit(conn, name, permits, owner, line, now)
    };
    let grant = |tx: &Connection, slot: u32, now: i64| {
        let fence = next_fence(tx)?;
        tx.prepare_cached(sql::GRANT_PERMIT)?.execute(params![
            name,
            slot,
            owner,
            fence,
            now + ttl,
            permits
        ])?;
        Ok(PermitAttempt::Granted {
            fence: fence_from_sql(fence),
            slot,
            expires_in: lease_left(ttl),
        })
    };
    let refused = PermitAttempt::refused;
    let kind = TicketKind::Permit;
    in_turn(
        conn, name, owner, kind, queue, deadline, busy, look, grant, refused,
    )
}

/// Deletes the grant's row, expired or not; true if it was there.
pub(crate) fn release(conn: &Connection, grant: &GrantKey) -> rusqlite::Result<bool> {
    commit_mode(conn, Commit::Unsynced)?;
    let fence = fence_to_sql(grant.fence);
    let deleted = match grant.row_slot() {
        None => {
            conn.prepare_cached(sql::RELEASE)?
                .execute(params![grant.name, grant.owner, fence])?
        }
        Some(slot) => conn.prepare_cached(sql::RELEASE_PERMIT)?.execute(params![
            grant.name,
            slot,
            grant.owner,
            fence
        ])?,
    };
    Ok(deleted == 1)
}

/// Renews the grant's row if it is still live; true if it was. The clock
/// is read under the write lock: a renewal that waited for it behind a
/// grant must judge the lease by the time it lands, or it could bring back
/// a lease that grant saw expired (a grant of the other kind never touches
/// this row, so nothing else would stop it).
fn renew(conn: &mut Connection, grant: &GrantKey, ttl: i64) -> rusqlite::Result<bool> {
    Ok(renew_batch(conn, &[(grant.clone(), ttl)])?[0])
}

/// Renews each grant of `batch` in one transaction, one commit (synced):
/// each answers whether its row was still its own and live.
fn renew_batch(conn: &mut Connection, batch: &[(GrantKey, i64)]) -> rusqlite::Result<Vec<bool>> {
    commit_mode(conn, Commit::Synced)?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let now = system_millis();
    let mut renewed = Vec::with_capacity(batch.len());
    for (grant, ttl) in batch {
        renewed.push(renew_row(&tx, grant, *ttl, now)?);
    }
    tx.commit()?;
    Ok(renewed)
}

/// Sets one grant's row to expire `ttl` after `now`, if it is still its
/// own and live.
fn renew_row(
    tx: &rusqlite::Transaction<'_>,
    grant: &GrantKey,
    ttl: i64,
    now: i64,
) -> rusqlite::Result<bool> {
    let fence = fence_to_sql(grant.fence);
    let changed = match grant.row_slot() {
        None => tx.prepare_cached(sql::RENEW)?.execute(params![
            grant.name,
            grant.owner,
            fence,
            ttl,
            now
        ])?,
        Some(slot) => tx.prepare_cached(sql::RENEW_PERMIT)?.execute(params![
            grant.name,
            slot,
            grant.owner,
            fence,
            ttl,
            now
        ])?,
    };
    Ok(changed == 1)
}

/// Deletes the live row of `name` (of that fence, when one is given) and
/// answers it.
fn force_release(
    conn: &mut Connection,
    name: &str,
    fence: Option<u64>,
) -> rusqlite::Result<Option<Holder>> {
    commit_mode(conn, Commit::Synced)?;
    // The clock under the write lock, as a renewal's: a row judged live is
    // live when it is removed.
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let now = system_millis();
    let removed = tx
        .prepare_cached(sql::FORCE_RELEASE)?
        .query_row(params![name, now, fence.map(fence_to_sql)], |r| {
            holder_of(r, 0)
        })
        .optional()?;
    // A semaphore's permit goes only by its fence. (Fences are unique in
    // the file: at most one of the two statements removes a row.)
    let removed = match (removed, fence) {
        (None, Some(fence)) => tx
            .prepare_cached(sql::FORCE_RELEASE_PERMIT)?
            .query_row(params![name, now, fence_to_sql(fence)], |r| holder_of(r, 0))
            .optional()?,
        (removed, _) => removed,
    };
    tx.commit()?;
    Ok(removed)
}

/// Raises the fence counter by `by` and retires every row granted before,
/// in one synced transaction; the lowest fence a later grant can get. A
/// raise that would leave no fence is refused ([`NoFenceLeft`]), nothing
/// written.
fn raise_fences(conn: &mut Connection, by: u64) -> rusqlite::Result<u64> {
    commit_mode(conn, Commit::Synced)?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let last: i64 = tx
        .prepare_cached(sql::LAST_FENCE)?
        .query_row([], |r| r.get(0))?;
    let left = MAX_FENCE.saturating_sub(fence_from_sql(last));
    if by >= left {
        return Err(no_fence_left(left));
    }
    let last: i64 = tx
        .prepare_cached(sql::RAISE_FENCES)?
        .query_row(params![fence_to_sql(by), fence_to_sql(MAX_FENCE)], |r| {
            r.get(0)
        })?;
    for retire in sql::RETIRE {
        tx.prepare_cached(retire)?.execute([])?;
    }
    tx.commit()?;
    Ok(fence_from_sql(last) + 1)
}

/// Deletes every expired row; how many.
fn purge(conn: &Connection) -> rusqlite::Result<u64> {
    commit_mode(conn, Commit::Unsynced)?;
    let tx = conn.unchecked_transaction()?;
    let now = system_millis();
    let purged = tx.prepare_cached(sql::PURGE)?.execute([now])?
        + tx.prepare_cached(sql::PURGE_PERMITS)?.execute([now])?;
    // Lapsed tickets go too; they are no grants, and not counted.
    tx.prepare_cached(sql::PURGE_TICKETS)?.execute([now])?;
    tx.commit()?;
    Ok(purged as u64)
}

/// A listed row's permit or access, from its slot and permits columns
/// (both `NULL` for a lock's row).
fn listed_kind(slot: Option<i64>, permits: Option<u32>) -> (Option<PermitSlot>, Option<Access>) {
    match slot.zip(permits) {
        Some((slot, permits)) => permits_row_kind(slot, permits),
        None => (None, None),
    }
}

#[async_trait]
impl Engine for SqliteEngine {
    async fn acquire(
        &self,
        name: &str,
        owner: &str,
        ttl: LeaseMillis,
        queue: Queue,
        deadline: Option<Instant>,
    ) -> Result<Attempt, BoxError> {
        let (name, owner, ttl) = (name.to_owned(), owner.to_owned(), ttl.as_i64());
        self.worker
            .run(move |conn, busy| acquire(conn, &name, &owner, ttl, queue, deadline, busy))
            .await
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
        let (name, owner, ttl) = (name.to_owned(), owner.to_owned(), ttl.as_i64());
        self.worker
            .run(move |conn, busy| {
                acquire_permit(conn, &name, permits, &owner, ttl, queue, deadline, busy)
            })
            .await
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
        let (name, owner, ttl) = (name.to_owned(), owner.to_owned(), ttl.as_i64());
        self.worker
            .run(move |conn, busy| {
                acquire_rw(conn, &name, mode, &owner, ttl, queue, deadline, busy)
            })
            .await
    }

    fn queues(&self) -> bool {
        true
    }

    async fn leave_queue(&self, name: &str, ticket: u64) -> Result<bool, BoxError> {
        let name = name.to_owned();
        self.worker
            .run(move |conn, _| {
                commit_mode(conn, Commit::Unsynced)?;
                let left = conn.prepare_cached(sql::DROP_TICKET)?.execute(params![
                    name,
                    ticket_to_sql(ticket),
                    system_millis()
                ])?;
                Ok(left == 1)
            })
            .await
    }

    async fn waiters(&self, name: &str) -> Result<Vec<Waiter>, BoxError> {
        let name = name.to_owned();
        self.worker
            .run(move |conn, _| {
                conn.prepare_cached(sql::WAITERS)?
                    .query_map(params![name, system_millis()], |r| {
                        let kind: String = r.get(2)?;
                        Ok(Waiter {
                            ticket: u64::try_from(r.get::<_, i64>(0)?).unwrap_or(0),
                            owner: r.get(1)?,
                            kind: TicketKind::parse(&kind).map_or("unknown", TicketKind::as_str),
                            expires_in: lease_left(r.get(3)?),
                            waited: lease_left(r.get(4)?),
                        })
                    })?
                    .collect()
            })
            .await
    }

    async fn renew(&self, grant: &GrantKey, ttl: LeaseMillis) -> Result<bool, BoxError> {
        let (grant, ttl) = (grant.clone(), ttl.as_i64());
        self.worker
            .run(move |conn, _| renew(conn, &grant, ttl))
            .await
    }

    fn batches_renewals(&self) -> bool {
        true
    }

    /// One transaction, one synced commit, for the whole batch.
    async fn renew_batch(
        &self,
        batch: &[(GrantKey, LeaseMillis)],
    ) -> Result<Vec<Result<bool, BoxError>>, BoxError> {
        let batch: Vec<(GrantKey, i64)> = batch
            .iter()
            .map(|(grant, ttl)| (grant.clone(), ttl.as_i64()))
            .collect();
        let renewed = self
            .worker
            .run(move |conn, _| renew_batch(conn, &batch))
            .await?;
        Ok(renewed.into_iter().map(Ok).collect())
    }

    async fn release(&self, grant: &GrantKey) -> Result<bool, BoxError> {
        let key = grant.clone();
        self.worker.run(move |conn, _| release(conn, &key)).await
    }

    async fn holder(&self, name: &str) -> Result<Option<Holder>, BoxError> {
        let name = name.to_owned();
        self.worker
            .run(move |conn, _| {
                conn.prepare_cached(sql::HOLDER)?
                    .query_row(params![name, system_millis()], |r| holder_of(r, 0))
                    .optional()
            })
            .await
    }

    async fn list(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Listed>, BoxError> {
        let (prefix, after) = (prefix.to_owned(), after.unwrap_or("").to_owned());
        // At most MAX_LIST_LIMIT (validated by the core), so it fits.
        let limit = i64::try_from(limit)?;
        self.worker
            .run(move |conn, _| {
                conn.prepare_cached(sql::LIST)?
                    .query_map(params![system_millis(), prefix, after, limit], |r| {
                        let slot: Option<i64> = r.get(4)?;
                        let permits: Option<u32> = r.get(5)?;
                        let (permit, access) = listed_kind(slot, permits);
                        Ok(Listed {
                            name: r.get(0)?,
                            holder: holder_of(r, 1)?,
                            permit,
                            access,
                        })
                    })?
                    .collect()
            })
            .await
    }

    async fn force_release(
        &self,
        name: &str,
        fence: Option<u64>,
    ) -> Result<Option<Holder>, BoxError> {
        let name = name.to_owned();
        self.worker
            .run(move |conn, _| force_release(conn, &name, fence))
            .await
    }

    async fn purge_expired(&self) -> Result<u64, BoxError> {
        self.worker.run(|conn, _| purge(conn)).await
    }

    async fn raise_fences(&self, by: u64) -> Result<u64, BoxError> {
        self.worker.run(move |conn, _| raise_fences(conn, by)).await
    }

    async fn close(&self) -> Result<(), BoxError> {
        self.worker.stop().await;
        Ok(())
    }

    fn releases(&self) -> &ReleaseBus {
        &self.bus
    }

    fn name(&self) -> &'static str {
        "sqlite"
    }

    fn poll_ceiling(&self) -> Duration {
        POLL_CEILING
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `PRAGMA synchronous` of the connection now: 2 is FULL, 1 NORMAL.
    fn synchronous(conn: &Connection) -> i64 {
        conn.pragma_query_value(None, "synchronous", |r| r.get(0))
            .unwrap()
    }

    /// Each write commits with its own sync setting, left in place after it
    /// (nothing runs between the commit and the reading here): grants,
    /// renewals and forced releases synced, releases and purges not.
    #[test]
    fn grants_renewals_and_forced_releases_commit_synced() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = Connection::open(dir.path().join("sync.db")).unwrap();
        crate::schema::prepare(&mut conn).unwrap();
        assert_eq!(synchronous(&conn), 1, "opened with NORMAL");
        let Attempt::Granted { fence, .. } = acquire(
            &mut conn,
            "n",
            "a",
            60_000,
            Queue::Never,
            None,
            Duration::ZERO,
        )
        .unwrap() else {
            panic!("a free name is granted");
        };
        assert_eq!(synchronous(&conn), 2, "a grant commits with FULL");
        let key = GrantKey {
            name: "n".into(),
            owner: "a".into(),
            fence,
            permit: None,
            access: None,
        };
        release(&conn, &key).unwrap();
        assert_eq!(synchronous(&conn), 1, "a release commits with NORMAL");
        assert!(renew(&mut conn, &key, 60_000).is_ok());
        assert_eq!(synchronous(&conn), 2, "a renewal commits with FULL");
        purge(&conn).unwrap();
        assert_eq!(synchronous(&conn), 1, "a purge commits with NORMAL");
        force_release(&mut conn, "n", None).unwrap();
        assert_eq!(synchronous(&conn), 2, "a forced release commits with FULL");
    }
}
