//! Every SQL text of the SQLite engine, in one place.

/// The schema version this crate writes and reads: 5 since waiters queue
/// (`alkstore_tickets`, and the ticket counter `last_ticket`), 4 since rows record
/// whether a fence raise retired them (`epoch`: 0 current, -1 retired), 3
/// since reader-writer locks (their rows live in `alkstore_permits`,
/// marked with permits 0), 2 since semaphores (`alkstore_permits`). An older file is upgraded in
/// place when opened ([`UPGRADE`]); a build that knows only an older
/// version then refuses the file, so no old process grants a lock or a
/// permit over grants it cannot read.
pub(crate) const SCHEMA_VERSION: i64 = 5;

/// WAL, so readers never wait for the writer. Answers the mode now in effect.
pub(crate) const WAL_MODE: &str = "PRAGMA journal_mode = WAL";

/// `alkstore doctor`: the file's journal mode (WAL is kept in the file).
pub(crate) const JOURNAL_MODE: &str = "PRAGMA journal_mode";

/// Connection settings at open: NORMAL sync (durable across process
/// crashes); each write sets its own before it runs ([`SYNCED`],
/// [`UNSYNCED`]; docs/engine-sqlite.md).
pub(crate) const PRAGMAS: &str = "PRAGMA synchronous = NORMAL;";

/// The next commits sync the WAL to disk before they return: durable
/// against power loss.
pub(crate) const SYNCED: &str = "PRAGMA synchronous = FULL";

/// The next commits return before the WAL is synced (durable across a
/// process crash, not a power loss); the next synced commit takes them along.
pub(crate) const UNSYNCED: &str = "PRAGMA synchronous = NORMAL";

/// Idempotent; run inside an IMMEDIATE transaction so two processes opening
/// one new file at once do not race.
pub(crate) const CREATE_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS alkstore_meta (
    key   TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS alkstore_locks (
    name       TEXT PRIMARY KEY,
    owner      TEXT NOT NULL,
    fence      INTEGER NOT NULL,
    expires_at INTEGER NOT NULL, -- Unix milliseconds, host clock
    epoch      INTEGER NOT NULL DEFAULT 0 -- 0, or -1: retired by a fence raise
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS alkstore_permits (
    name       TEXT NOT NULL,
    slot       INTEGER NOT NULL, -- 0 .. permits - 1; a reader-writer lock's: docs/engine-sqlite.md
    owner      TEXT NOT NULL,
    fence      INTEGER NOT NULL,
    expires_at INTEGER NOT NULL, -- Unix milliseconds, host clock
    permits    INTEGER NOT NULL, -- the semaphore's permits, as its grant asked; 0: a reader-writer lock's
    epoch      INTEGER NOT NULL DEFAULT 0, -- 0, or -1: retired by a fence raise
    PRIMARY KEY (name, slot)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS alkstore_tickets (
    name       TEXT NOT NULL,
    ticket     INTEGER NOT NULL, -- drawn from last_ticket: lower is earlier
    owner      TEXT NOT NULL,
    kind       TEXT NOT NULL,    -- lock, permit, read or write
    owed       INTEGER NOT NULL DEFAULT 0, -- a reader's: owed the next turn
    expires_at INTEGER NOT NULL, -- Unix milliseconds, host clock
    since      INTEGER NOT NULL, -- when it was taken: Unix milliseconds, host clock
    PRIMARY KEY (name, ticket)
) WITHOUT ROWID;
INSERT OR IGNORE INTO alkstore_meta (key, value)
VALUES ('schema_version', 5), ('last_fence', 0), ('last_ticket', 0);
";

/// Version 1 had no `alkstore_permits` ([`CREATE_SCHEMA`], run first in the
/// same transaction, made it); version 2 the same tables, without
/// reader-writer rows; 3 no `epoch` columns ([`HAS_EPOCH`], [`ADD_EPOCH`]);
/// 4 no `alkstore_tickets` nor `last_ticket` (made the same way; a waiting
/// writer's intent row of version 4 is no longer read, and lapses).
pub(crate) const UPGRADE: &str =
    "UPDATE alkstore_meta SET value = 5 WHERE key = 'schema_version' AND value IN (1, 2, 3, 4)";

/// ?1 a table: whether it has its `epoch` column.
pub(crate) const HAS_EPOCH: &str =
    "SELECT count(*) FROM pragma_table_info(?1) WHERE name = 'epoch'";

/// The `epoch` column, for a table of version 3 or older (its rows current).
pub(crate) const ADD_EPOCH: [&str; 2] = [
    "ALTER TABLE alkstore_locks ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE alkstore_permits ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0",
];

pub(crate) const SCHEMA_VERSION_READ: &str =
    "SELECT value FROM alkstore_meta WHERE key = 'schema_version'";

pub(crate) const ROW: &str =
    "SELECT owner, fence, expires_at, epoch FROM alkstore_locks WHERE name = ?1";

/// The last fence handed out.
pub(crate) const LAST_FENCE: &str = "SELECT value FROM alkstore_meta WHERE key = 'last_fence'";

/// Raises the fence counter by `?1` when it stays at most `?2` (the caller
/// checked that it does: never past the end, where `value + ?1` would
/// overflow into a REAL); answers the new last fence.
pub(crate) const RAISE_FENCES: &str = "UPDATE alkstore_meta SET value = value + ?1
WHERE key = 'last_fence' AND value <= ?2 - ?1 RETURNING value";

/// A raise retires every row granted before it.
pub(crate) const RETIRE: [&str; 2] = [
    "UPDATE alkstore_locks SET epoch = -1 WHERE epoch <> -1",
    "UPDATE alkstore_permits SET epoch = -1 WHERE epoch <> -1",
];

/// The next fencing token: one counter for the file, so a token is never
/// reused for any name, across releases, purges and restarts. No row when
/// the last one handed out is `?1` (`MAX_FENCE`): none is left.
pub(crate) const NEXT_FENCE: &str = "UPDATE alkstore_meta SET value = value + 1
WHERE key = 'last_fence' AND value < ?1 RETURNING value";

/// Insert, or take over the expired row (the caller checked it is expired
/// inside the same IMMEDIATE transaction).
pub(crate) const GRANT: &str = "
INSERT INTO alkstore_locks (name, owner, fence, expires_at, epoch) VALUES (?1, ?2, ?3, ?4, 0)
ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, fence = excluded.fence,
    expires_at = excluded.expires_at, epoch = 0";

/// ?5 is now: only a live row of this very grant is extended, and not
/// one a fence raise retired.
pub(crate) const RENEW: &str = "
UPDATE alkstore_locks SET expires_at = ?5 + ?4
WHERE name = ?1 AND owner = ?2 AND fence = ?3 AND expires_at > ?5 AND epoch = 0";

/// Deletes this grant's row whether or not it expired (the holder's own stale row).
pub(crate) const RELEASE: &str =
    "DELETE FROM alkstore_locks WHERE name = ?1 AND owner = ?2 AND fence = ?3";

pub(crate) const HOLDER: &str =
    "SELECT owner, fence, expires_at - ?2 FROM alkstore_locks WHERE name = ?1 AND expires_at > ?2";

/// ?1 now, ?2 the prefix, ?3 the name to start after ('' from the first),
/// ?4 the page size. Answers name, owner, fence, time left, slot and
/// permits (both NULL for a lock), in name and slot order.
///
/// A waiting writer's intent (slot -2, `INTENT_SLOT`) is not a grant and
/// is not listed.
///
/// The page is the first ?4 live rows of both tables (each read in key
/// order, ?4 at most), then every live permit of its last name, so that a
/// page never splits a semaphore. `name >= ?2` lets the primary keys find
/// the first name of the prefix; `substr` (in characters, as `length`
/// counts them) matches the prefix literally, unlike `LIKE`. Names compare
/// as bytes (BINARY).
pub(crate) const LIST: &str = "
WITH locks AS (
    SELECT name, NULL AS slot, NULL AS permits, owner, fence, expires_at FROM alkstore_locks
    WHERE name >= ?2 AND name > ?3 AND substr(name, 1, length(?2)) = ?2 AND expires_at > ?1
    ORDER BY name LIMIT ?4
), first_permits AS (
    SELECT name, slot FROM alkstore_permits
    WHERE name >= ?2 AND name > ?3 AND substr(name, 1, length(?2)) = ?2 AND expires_at > ?1
      AND slot <> -2
    ORDER BY name, slot LIMIT ?4
), page AS (
    SELECT name FROM (SELECT name, slot FROM locks UNION ALL SELECT name, slot FROM first_permits)
    ORDER BY name, slot LIMIT ?4
), last AS (SELECT max(name) AS name FROM page)
SELECT name, owner, fence, expires_at - ?1, slot, permits FROM locks
WHERE name <= (SELECT name FROM last)
UNION ALL
SELECT name, owner, fence, expires_at - ?1, slot, permits FROM alkstore_permits
WHERE name >= ?2 AND name > ?3 AND substr(name, 1, length(?2)) = ?2 AND expires_at > ?1
  AND slot <> -2 AND name <= (SELECT name FROM last)
ORDER BY 1, 5";

/// ?1 the name, ?2 now, ?3 the fence or NULL: removes the live row only (of
/// that fence, when one is given), and answers it.
pub(crate) const FORCE_RELEASE: &str = "
DELETE FROM alkstore_locks WHERE name = ?1 AND expires_at > ?2 AND (?3 IS NULL OR fence = ?3)
RETURNING owner, fence, expires_at - ?2";

pub(crate) const PURGE: &str = "DELETE FROM alkstore_locks WHERE expires_at <= ?1";

/// ?1 now: a semaphore's expired permits.
pub(crate) const PURGE_PERMITS: &str = "DELETE FROM alkstore_permits WHERE expires_at <= ?1";

/// ?1 the name, ?2 now: the live permits of a semaphore, in slot order.
pub(crate) const LIVE_PERMITS: &str = "
SELECT slot, owner, fence, expires_at, permits, epoch FROM alkstore_permits
WHERE name = ?1 AND expires_at > ?2 ORDER BY slot";

/// ?1 the name, ?2 now: the permits a live row of `name` in
/// `alkstore_permits` says its semaphore has (0: a reader-writer lock's
/// row; none: neither holds the name).
pub(crate) const SEMAPHORE_OF: &str =
    "SELECT permits FROM alkstore_permits WHERE name = ?1 AND expires_at > ?2 LIMIT 1";

/// A new grant of a free slot (the caller checked, inside the same
/// IMMEDIATE transaction, that no live permit holds it): ?1 name, ?2 slot,
/// ?3 owner, ?4 fence, ?5 expiry, ?6 permits.
pub(crate) const GRANT_PERMIT: &str = "
INSERT INTO alkstore_permits (name, slot, owner, fence, expires_at, permits, epoch)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, 0)
ON CONFLICT (name, slot) DO UPDATE SET owner = excluded.owner, fence = excluded.fence,
    expires_at = excluded.expires_at, permits = excluded.permits, epoch = 0";

/// ?1 name, ?2 slot, ?3 owner, ?4 fence, ?5 ttl, ?6 now: only a live row
/// of this very grant is extended, and not one a fence raise retired.
pub(crate) const RENEW_PERMIT: &str = "
UPDATE alkstore_permits SET expires_at = ?6 + ?5
WHERE name = ?1 AND slot = ?2 AND owner = ?3 AND fence = ?4 AND expires_at > ?6 AND epoch = 0";

/// ?1 name, ?2 slot, ?3 owner, ?4 fence: this grant's row, expired or not.
pub(crate) const RELEASE_PERMIT: &str =
    "DELETE FROM alkstore_permits WHERE name = ?1 AND slot = ?2 AND owner = ?3 AND fence = ?4";

/// ?1 the name, ?2 now, ?3 the fence: removes that live permit, and
/// answers it.
pub(crate) const FORCE_RELEASE_PERMIT: &str = "
DELETE FROM alkstore_permits WHERE name = ?1 AND expires_at > ?2 AND fence = ?3
RETURNING owner, fence, expires_at - ?2";

/// ?1 the name, ?2 now: its live tickets, oldest first.
pub(crate) const LIVE_TICKETS: &str = "
SELECT ticket, owner, kind, owed FROM alkstore_tickets
WHERE name = ?1 AND expires_at > ?2 ORDER BY ticket";

/// ?1 the name, ?2 now: its live tickets as an operator sees them.
pub(crate) const WAITERS: &str = "
SELECT ticket, owner, kind, expires_at - ?2, ?2 - since FROM alkstore_tickets
WHERE name = ?1 AND expires_at > ?2 ORDER BY ticket";

/// The next ticket number: one counter for the file.
pub(crate) const NEXT_TICKET: &str =
    "UPDATE alkstore_meta SET value = value + 1 WHERE key = 'last_ticket' RETURNING value";

/// ?1 name, ?2 ticket, ?3 owner, ?4 kind, ?5 owed, ?6 expiry, ?7 now.
pub(crate) const TAKE_TICKET: &str = "
INSERT INTO alkstore_tickets (name, ticket, owner, kind, owed, expires_at, since)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";

/// ?1 name, ?2 ticket, ?3 expiry, ?4 owed from now on (a ticket once owed
/// stays owed).
pub(crate) const RENEW_TICKET: &str = "
UPDATE alkstore_tickets SET expires_at = ?3, owed = max(owed, ?4) WHERE name = ?1 AND ticket = ?2";

/// ?1 name, ?2 ticket: granted, or left. ?3 now: only a live one counts
/// as left.
pub(crate) const DROP_TICKET: &str =
    "DELETE FROM alkstore_tickets WHERE name = ?1 AND ticket = ?2 AND expires_at > ?3";

/// ?1 name, ?2 now: the name's lapsed tickets, before a new one is taken.
pub(crate) const DROP_LAPSED_TICKETS: &str =
    "DELETE FROM alkstore_tickets WHERE name = ?1 AND expires_at <= ?2";

/// ?1 name: a writer was granted; every reader queued now is owed the
/// turn after it.
pub(crate) const OWE_READERS: &str =
    "UPDATE alkstore_tickets SET owed = 1 WHERE name = ?1 AND kind = 'read'";

/// ?1 now: every lapsed ticket (no grant: a purge does not count them).
pub(crate) const PURGE_TICKETS: &str = "DELETE FROM alkstore_tickets WHERE expires_at <= ?1";

#[cfg(test)]
mod tests {
    use super::*;

    /// The intent's slot (a version-4 file's waiting writer's row, never
    /// listed) is written into the SQL text: it must be the core's.
    #[test]
    fn the_intent_slot_is_the_cores() {
        let intent = format!("slot <> {}", alkstore_core::INTENT_SLOT);
        assert_eq!(LIST.matches(&intent).count(), 2);
    }
}
