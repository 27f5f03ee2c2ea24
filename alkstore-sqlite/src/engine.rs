//! The row operations of the SQLite engine, run inline or on the connection's
//! own thread (see `worker.rs`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use alkstore_core::clock::system_millis;
use alkstore_core::{
    Access, Attempt, BoxError, Engine, GrantKey, HeldAs, Holder, INTENT_SLOT, LeaseMillis, Listed,
    MAX_FENCE, MAX_READERS, NoFenceLeft, PermitAttempt, PermitSlot, READ_WRITE_PERMITS, ReleaseBus,
    RwAttempt, RwMode, WRITER_SLOT, fence_from_sql, fence_to_sql, holder_from_sql, lease_left,
    permits_row_kind,
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

/// Acquires `name` for `owner`. With a `deadline` (a waiting acquire), the
/// wait for another connection's write lock is cut to the time left, and
/// running out of it is a refusal that wrote nothing, not an error.
///
/// `busy` is the connection's busy timeout where the call runs (zero
/// inline): the wait is never longer, and a busy answer within a zero
/// timeout goes back to the caller (to run again on the connection's thread)
/// rather than count as a refusal.
pub(crate) fn acquire(
    conn: &mut Connection,
    name: &str,
    owner: &str,
    ttl: i64,
    deadline: Option<Instant>,
    busy: Duration,
) -> rusqlite::Result<Attempt> {
    // A waiting acquire waits for other connections' locks no longer than
    // its wait left, on every statement (the worker sets the busy timeout
    // afresh for each job, so it is not put back).
    let waiting = deadline.filter(|_| !busy.is_zero());
    if let Some(deadline) = waiting {
        conn.busy_timeout(deadline.saturating_duration_since(Instant::now()).min(busy))?;
    }
    let attempt = (|| {
        // A refusal is decided by a plain read: no write lock, nothing written.
        if let Some(attempt) = decide(read_row(conn, name)?.as_ref(), owner, system_millis()) {
            return Ok(attempt);
        }
        grant(conn, name, owner, ttl)
    })();
    match attempt {
        Err(e) if waiting.is_some() && e.sqlite_error_code() == Some(ErrorCode::DatabaseBusy) => {
            Ok(Attempt::Held { expires_in: None })
        }
        attempt => attempt,
    }
}

/// The write path: under the write lock, read the clock and the row again,
/// then grant with the next fence (or refuse, writing nothing).
fn grant(conn: &mut Connection, name: &str, owner: &str, ttl: i64) -> rusqlite::Result<Attempt> {
    commit_mode(conn, Commit::Synced)?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let now = system_millis();
    if let Some(attempt) = decide(read_row(&tx, name)?.as_ref(), owner, now) {
        return Ok(attempt);
    }
    match semaphore_of(&tx, name, now)?.map(HeldAs::of_permits_column) {
        Some(HeldAs::Semaphore { permits }) => return Ok(Attempt::HeldAsSemaphore { permits }),
        Some(_) => return Ok(Attempt::HeldAsReadWrite),
        None => {}
    }
    let fence = next_fence(&tx)?;
    tx.prepare_cached(sql::GRANT)?
        .execute(params![name, owner, fence, now + ttl])?;
    tx.commit()?;
    Ok(Attempt::Granted {
        fence: fence_from_sql(fence),
        expires_in: lease_left(ttl),
    })
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

/// What the rows of `name` mean for a permit of `permits` for `owner`: an
/// answer, or the free slot to grant (`Err`).
fn decide_permit(
    conn: &Connection,
    name: &str,
    permits: u32,
    owner: &str,
    now: i64,
) -> rusqlite::Result<Result<PermitAttempt, u32>> {
    if read_row(conn, name)?.is_some_and(|row| row.expires_at > now) {
        return Ok(Ok(PermitAttempt::HeldAsLock));
    }
    let live = live_permits(conn, name, now)?;
    if let Some(other) = live.iter().find(|p| p.permits != permits) {
        return Ok(Ok(match HeldAs::of_permits_column(other.permits) {
            HeldAs::Semaphore { permits } => PermitAttempt::Mismatch { permits },
            _ => PermitAttempt::HeldAsReadWrite,
        }));
    }
    // Every live row is this semaphore's permit: its slot is 0..permits.
    if let Some(mine) = live.iter().find(|p| p.owner == owner) {
        if mine.retired {
            // Retired by a fence raise: its own slot, granted anew.
            return Ok(Err(mine.slot as u32));
        }
        return Ok(Ok(PermitAttempt::Granted {
            fence: fence_from_sql(mine.fence),
            slot: mine.slot as u32,
            expires_in: lease_left(mine.expires_at - now),
        }));
    }
    let free = lowest_free_slot(&live, permits);
    match free {
        Some(slot) => Ok(Err(slot)),
        None => Ok(Ok(PermitAttempt::Held {
            expires_in: live.iter().map(|p| lease_left(p.expires_at - now)).min(),
        })),
    }
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

/// What a reader-writer attempt comes to, before anything is written.
enum RwDecision {
    /// The answer; nothing to write.
    Answer(RwAttempt),
    /// Grant this access with the next fence.
    Grant(Access),
    /// Refused (`Held`, the answer), and a waiting writer's intent to record.
    Intent(RwAttempt),
}

/// What the rows of `name` mean for a reader-writer grant of `mode` for
/// `owner` (docs/contract.md, "Reader-writer locks").
fn decide_rw(
    conn: &Connection,
    name: &str,
    mode: RwMode,
    owner: &str,
    waiting_writer: bool,
    now: i64,
) -> rusqlite::Result<RwDecision> {
    use RwDecision::{Answer, Grant, Intent};
    if read_row(conn, name)?.is_some_and(|row| row.expires_at > now) {
        return Ok(Answer(RwAttempt::HeldAsOther(HeldAs::Lock)));
    }
    let live = live_permits(conn, name, now)?;
    if let Some(other) = live.iter().find(|p| p.permits != READ_WRITE_PERMITS) {
        let held_as = HeldAs::of_permits_column(other.permits);
        return Ok(Answer(RwAttempt::HeldAsOther(held_as)));
    }
    let at = |slot: i64| live.iter().find(|p| p.slot == slot);
    let (writer, intent) = (at(WRITER_SLOT), at(INTENT_SLOT));
    let readers = || live.iter().filter(|p| p.slot >= 0);
    let held = |rows: &mut dyn Iterator<Item = &PermitRow>| RwAttempt::Held {
        expires_in: rows.map(|p| lease_left(p.expires_at - now)).min(),
    };
    let mine = |row: &PermitRow, access| RwAttempt::Granted {
        fence: fence_from_sql(row.fence),
        access,
        expires_in: lease_left(row.expires_at - now),
    };
    Ok(match mode {
        RwMode::Read => {
            if let Some(row) = readers().find(|p| p.owner == owner && p.retired) {
                Grant(Access::Read {
                    slot: row.slot as u32,
                })
            } else if let Some(row) = readers().find(|p| p.owner == owner) {
                Answer(mine(
                    row,
                    Access::Read {
                        slot: row.slot as u32,
                    },
                ))
            } else if writer.is_some() || intent.is_some() {
                Answer(held(&mut writer.into_iter().chain(intent)))
            } else {
                match lowest_free_slot(&live, MAX_READERS) {
                    Some(slot) => Grant(Access::Read { slot }),
                    None => Answer(held(&mut readers())),
                }
            }
        }
        RwMode::Write => {
            if writer.is_some_and(|p| p.owner == owner && p.retired) {
                Grant(Access::Write)
            } else if let Some(row) = writer.filter(|p| p.owner == owner) {
                Answer(mine(row, Access::Write))
            } else if writer.is_some() || readers().next().is_some() {
                // Another writer's intent may end first: this writer's turn.
                let others = intent.filter(|p| p.owner != owner);
                let refused = held(&mut writer.into_iter().chain(readers()).chain(others));
                if waiting_writer && intent.is_none_or(|p| p.owner == owner) {
                    Intent(refused)
                } else {
                    Answer(refused)
                }
            } else {
                Grant(Access::Write)
            }
        }
    })
}

/// A reader-writer lock's grant of `name`, as [`acquire`] takes a lock:
/// refusals decided by a plain read, a grant (or a waiting writer's
/// intent) written under the write lock after a second look.
#[allow(clippy::too_many_arguments)]
pub(crate) fn acquire_rw(
    conn: &mut Connection,
    name: &str,
    mode: RwMode,
    owner: &str,
    ttl: i64,
    intent: Option<i64>,
    deadline: Option<Instant>,
    busy: Duration,
) -> rusqlite::Result<RwAttempt> {
    let waiting = deadline.filter(|_| !busy.is_zero());
    if let Some(deadline) = waiting {
        conn.busy_timeout(deadline.saturating_duration_since(Instant::now()).min(busy))?;
    }
    let waiting_writer = intent.is_some();
    let attempt = (|| -> rusqlite::Result<RwAttempt> {
        let first = decide_rw(conn, name, mode, owner, waiting_writer, system_millis())?;
        // A grant commits synced; an intent alone is no grant: losing it to
        // a power cut only lets readers in sooner. (The setting cannot
        // change inside a transaction: a grant found where an intent was
        // planned is decided again, synced.)
        let mut commit = match first {
            RwDecision::Answer(answer) => return Ok(answer),
            RwDecision::Intent(_) => Commit::Unsynced,
            RwDecision::Grant(_) => Commit::Synced,
        };
        loop {
            commit_mode(conn, commit)?;
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let now = system_millis();
            let answer = match decide_rw(&tx, name, mode, owner, waiting_writer, now)? {
                RwDecision::Answer(answer) => return Ok(answer),
                RwDecision::Grant(_) if commit == Commit::Unsynced => {
                    commit = Commit::Synced;
                    continue;
                }
                RwDecision::Intent(refused) => {
                    let until = now + intent.unwrap_or(0);
                    tx.prepare_cached(sql::GRANT_PERMIT)?.execute(params![
                        name,
                        INTENT_SLOT,
                        owner,
                        0,
                        until,
                        READ_WRITE_PERMITS
                    ])?;
                    refused
                }
                RwDecision::Grant(access) => {
                    let fence = next_fence(&tx)?;
                    tx.prepare_cached(sql::GRANT_PERMIT)?.execute(params![
                        name,
                        access.row_slot(),
                        owner,
                        fence,
                        now + ttl,
                        READ_WRITE_PERMITS
                    ])?;
                    if access == Access::Write {
                        tx.prepare_cached(sql::DROP_INTENT)?
                            .execute(params![name, owner])?;
                    }
                    RwAttempt::Granted {
                        fence: fence_from_sql(fence),
                        access,
                        expires_in: lease_left(ttl),
                    }
                }
            };
            tx.commit()?;
            return Ok(answer);
        }
    })();
    match attempt {
        Err(e) if waiting.is_some() && e.sqlite_error_code() == Some(ErrorCode::DatabaseBusy) => {
            Ok(RwAttempt::Held { expires_in: None })
        }
        attempt => attempt,
    }
}

/// A permit of `name`, as [`acquire`] takes a lock: refusals decided by a
/// plain read, a grant under the write lock after a second look.
pub(crate) fn acquire_permit(
    conn: &mut Connection,
    name: &str,
    permits: u32,
    owner: &str,
    ttl: i64,
    deadline: Option<Instant>,
    busy: Duration,
) -> rusqlite::Result<PermitAttempt> {
    let waiting = deadline.filter(|_| !busy.is_zero());
    if let Some(deadline) = waiting {
        conn.busy_timeout(deadline.saturating_duration_since(Instant::now()).min(busy))?;
    }
    let attempt = (|| -> rusqlite::Result<PermitAttempt> {
        if let Ok(answer) = decide_permit(conn, name, permits, owner, system_millis())? {
            return Ok(answer);
        }
        commit_mode(conn, Commit::Synced)?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let now = system_millis();
        let slot = match decide_permit(&tx, name, permits, owner, now)? {
            Ok(answer) => return Ok(answer),
            Err(slot) => slot,
        };
        let fence = next_fence(&tx)?;
        tx.prepare_cached(sql::GRANT_PERMIT)?.execute(params![
            name,
            slot,
            owner,
            fence,
            now + ttl,
            permits
        ])?;
        tx.commit()?;
        Ok(PermitAttempt::Granted {
            fence: fence_from_sql(fence),
            slot,
            expires_in: lease_left(ttl),
        })
    })();
    match attempt {
        Err(e) if waiting.is_some() && e.sqlite_error_code() == Some(ErrorCode::DatabaseBusy) => {
            Ok(PermitAttempt::Held { expires_in: None })
        }
        attempt => attempt,
    }
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
    commit_mode(conn, Commit::Synced)?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let (fence, now) = (fence_to_sql(grant.fence), system_millis());
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
    tx.commit()?;
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
        deadline: Option<Instant>,
    ) -> Result<Attempt, BoxError> {
        let (name, owner, ttl) = (name.to_owned(), owner.to_owned(), ttl.as_i64());
        self.worker
            .run(move |conn, busy| acquire(conn, &name, &owner, ttl, deadline, busy))
            .await
    }

    async fn acquire_permit(
        &self,
        name: &str,
        permits: u32,
        owner: &str,
        ttl: LeaseMillis,
        deadline: Option<Instant>,
    ) -> Result<PermitAttempt, BoxError> {
        let (name, owner, ttl) = (name.to_owned(), owner.to_owned(), ttl.as_i64());
        self.worker
            .run(move |conn, busy| {
                acquire_permit(conn, &name, permits, &owner, ttl, deadline, busy)
            })
            .await
    }

    async fn acquire_rw(
        &self,
        name: &str,
        mode: RwMode,
        owner: &str,
        ttl: LeaseMillis,
        intent: Option<LeaseMillis>,
        deadline: Option<Instant>,
    ) -> Result<RwAttempt, BoxError> {
        let (name, owner, ttl) = (name.to_owned(), owner.to_owned(), ttl.as_i64());
        let intent = intent.map(LeaseMillis::as_i64);
        self.worker
            .run(move |conn, busy| {
                acquire_rw(conn, &name, mode, &owner, ttl, intent, deadline, busy)
            })
            .await
    }

    async fn renew(&self, grant: &GrantKey, ttl: LeaseMillis) -> Result<bool, BoxError> {
        let (grant, ttl) = (grant.clone(), ttl.as_i64());
        self.worker
            .run(move |conn, _| renew(conn, &grant, ttl))
            .await
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
        let Attempt::Granted { fence, .. } =
            acquire(&mut conn, "n", "a", 60_000, None, Duration::ZERO).unwrap()
        else {
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
