//! Every SQL text of the PostgreSQL engine, composed in this one place.
//!
//! The caller's schema name is the only piece of text spliced into SQL, and
//! only through [`quote_ident`] (and, inside the acquire function's body,
//! [`quote_literal`] and a dollar-quote tag the name cannot contain); every
//! value is a bound parameter.

use std::time::Instant;

use alkstore_core::{
    GrantKey, INTENT_SLOT, LeaseMillis, MAX_FENCE, MAX_READERS, Queue, READ_WRITE_PERMITS, RwMode,
    WRITER_SLOT, fence_from_sql, fence_to_sql,
};
use alkstore_sqlx::{
    AcquireRow, HolderRow, ListedRow, MARKER_KEY, PermitRow, RwRow, StatementFuture, WaiterRow,
    audited, lock_wait_ms, row_as,
};
use sqlx::{PgConnection, SqlStr};

use crate::protocol::{Call, Protocol};

/// The schema version this crate writes and reads. 1 drew fences from an
/// identity column, out of commit order, and 2's acquire function took no
/// bound on its lock waits: neither is migrated. 3's acquire function keyed
/// its per-name lock on the name alone, so grants of one name in different
/// schemas of a database waited for each other; 4's fences were the
/// sequence's values alone, which a promoted standby hands out again; 5's
/// answered the same owner's grant again by reading it back, which a grant
/// whose wait for a synchronous standby was cut short is too (committed on
/// the primary only); 6 had no semaphores (`permits`, `acquire_permit`,
/// and an acquire function that refuses a name live permits hold): all
/// upgraded in place (`UPGRADABLE`), since only the functions changed
/// and a table was added (and 5's fences are above every fence of 4's); 7
/// had no reader-writer locks (`acquire_rw`; their rows live in `permits`,
/// marked with permits 0, which 7's functions read as a semaphore's); 8's
/// rows did not say which timeline granted them, so that a row a promotion
/// revived was given back to its owner with its old fence, below fences
/// the old primary had handed out since, and renewed (9: `epoch`, added in
/// place, the rows already there taken as the current timeline's, as
/// layout 8 took them); 9 had no queues (10: `tickets` and
/// `ticket_numbers`, and functions that grant waiters in turn, added in
/// place); 10's permit and reader functions let a caller pass a waiter of
/// another kind queued before it (11: one queue across kinds, only the
/// functions replaced).
pub const SCHEMA_VERSION: i64 = 11;

/// Older layouts an opener upgrades in place, under the creation lock: the
/// functions replaced, what is missing created, the version recorded.
pub(crate) const UPGRADABLE: std::ops::RangeInclusive<i64> = 3..=10;

/// A fence is `timeline × TIMELINE_STEP + n`, `n` drawn from the schema's
/// sequence: 2^44, so that every fence handed out on a timeline is above
/// every fence of an earlier one as long as a promotion loses fewer than
/// 2^44 (17.6 × 10^12) grants, and timelines up to 2^19 fit an `i64`.
pub(crate) const TIMELINE_STEP: i64 = 1 << 44;

/// The SQLSTATE the fence-drawing function raises past `MAX_FENCE`: no
/// fence left (the transaction rolls back, nothing written).
pub(crate) const NO_FENCE_LEFT: &str = "AKF01";

/// Advisory-lock class for schema creation (with `hashtext(schema)` as key).
pub(crate) const SCHEMA_LOCK_CLASS: i32 = 0x616c_6b73; // "alks"

/// The timeline of the WAL the server writes, which every promotion of a
/// standby raises: a fence's high part ([`TIMELINE_STEP`]). Readable by any
/// role; an error during recovery (a standby grants nothing anyway).
const TIMELINE: &str =
    "('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint";

/// The advisory-lock class under which the grants of one name in `schema`
/// are serialised (with `hashtext(name)` as key): the schema's own, so that
/// stores in other schemas of the database never wait on each other's
/// grants (a collision of classes or keys only serialises two names). A
/// 32-bit FNV-1a hash of the schema name, stable across builds and hosts.
fn fence_lock_class(schema: &str) -> i32 {
    let hash = schema.bytes().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    });
    i32::from_ne_bytes(hash.to_ne_bytes())
}

/// Before each lock wait of the acquire function: with `p_wait_ms`, bound
/// the wait by what is left of it (at least 1 ms; 0 would mean no bound),
/// local to the transaction. Past it the server raises 55P03 and rolls back.
const BOUND_LOCK_WAIT: &str = "IF p_wait_ms IS NOT NULL THEN
        PERFORM set_config('lock_timeout', greatest(1, ceil(extract(epoch FROM
            wait_until - clock_timestamp()) * 1000))::bigint::text, true);
    END IF;";

/// `alkstore doctor`: the durability and replication settings, as text
/// (`pg_settings` is readable by any role).
pub(crate) const DOCTOR_SETTINGS: &str = "
SELECT name, setting FROM pg_settings
WHERE name IN ('fsync', 'full_page_writes', 'synchronous_commit',
               'synchronous_standby_names', 'wal_level')";

/// `alkstore doctor`: whether the server is a standby; whether this role
/// may read `pg_stat_replication`'s `sync_state` (superusers and members of
/// `pg_read_all_stats`; others see it NULL); how many standbys stream from
/// it; how many of them are synchronous now.
pub(crate) const DOCTOR_STANDBYS: &str = "
SELECT pg_is_in_recovery(),
       pg_has_role(current_user, 'pg_read_all_stats', 'USAGE'),
       (SELECT count(*) FROM pg_stat_replication),
       (SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum'))";

/// `alkstore doctor`: this session's TLS as the server sees it (behind a
/// pooler: the pooler's connection to the server).
pub(crate) const DOCTOR_TLS: &str = "
SELECT coalesce((SELECT CASE WHEN ssl THEN version || ', ' || cipher END
                 FROM pg_stat_ssl WHERE pid = pg_backend_pid()), 'not encrypted')";

/// `alkstore doctor`: the setting its probe connection sets through the
/// startup `options` parameter, to see whether they reach the server.
pub(crate) const DOCTOR_PROBE_SETTING: &str = "alkstore.doctor_probe";

/// `alkstore doctor`: the probe setting as the server has it (NULL when the
/// startup parameter did not reach it).
pub(crate) const DOCTOR_PROBE_READ: &str = "SELECT current_setting('alkstore.doctor_probe', true)";

/// Whether the server is a standby (`alkstore list`, `show`, `watch`).
pub(crate) const IN_RECOVERY: &str = "SELECT pg_is_in_recovery()";

/// `alkstore doctor`: the server process this connection runs on now.
pub(crate) const DOCTOR_BACKEND: &str = "SELECT pg_backend_pid()";

/// `alkstore doctor`: Patroni's dynamic configuration as Patroni caches it
/// in the data directory (`patroni.dynamic.json`): whether the file is
/// there, `synchronous_mode`, `synchronous_mode_strict`. Reading a server
/// file needs superuser or `pg_read_server_files` (42501 otherwise).
pub(crate) const DOCTOR_PATRONI: &str = "
SELECT c IS NOT NULL, coalesce(c->>'synchronous_mode', ''), coalesce(c->>'synchronous_mode_strict', '')
FROM (SELECT pg_read_file('patroni.dynamic.json', 0, 1048576, true)::jsonb AS c) f";

/// `alkstore doctor`: the lowest fence a later grant can get in the store
/// whose sequence is `$1` (a quoted `schema.fences`), or NULL when there is
/// no such sequence. Reads the sequence without drawing from it.
pub(crate) fn doctor_next_fence() -> SqlStr {
    // Past the end (a draw refused there still moved the sequence): one
    // above `MAX_FENCE`, none left.
    let end = fence_to_sql(MAX_FENCE) + 1;
    audited(format!(
        "SELECT least(coalesce(pg_sequence_last_value(s), 0)::numeric + 1
                      + {TIMELINE} * {TIMELINE_STEP}, {end})::bigint
         FROM (SELECT to_regclass($1) AS s) r WHERE s IS NOT NULL
         UNION ALL SELECT NULL WHERE to_regclass($1) IS NULL"
    ))
}

/// The `meta` key that records whether alkstore created the schema itself
/// (1) or found it (0): only a schema it created is ever dropped.
pub(crate) const CREATED_SCHEMA_KEY: &str = "created_schema";

/// The server's clock in whole Unix milliseconds, truncated (floor), taken at
/// the start of the statement's transaction: every decision in one statement
/// sees one instant, and that instant is no earlier than the request's arrival.
const NOW_MS: &str = "floor(extract(epoch FROM now()) * 1000)::bigint";

/// The server's clock as it reads now, in whole Unix milliseconds: unlike
/// [`NOW_MS`], past waits inside the transaction.
const CLOCK_MS: &str = "floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// Quotes an identifier for PostgreSQL: wrapped in double quotes, inner
/// double quotes doubled. Safe for any text without NUL (validated before).
pub(crate) fn quote_ident(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

/// Quotes a string literal as an escape string (`E'…'`), which reads the
/// same whatever `standard_conforming_strings` says.
pub(crate) fn quote_literal(text: &str) -> String {
    format!("E'{}'", text.replace('\\', "\\\\").replace('\'', "''"))
}

/// A dollar-quote tag that does not occur in `body`.
fn dollar_tag(body: &str) -> String {
    let mut tag = String::from("$alkstore$");
    while body.contains(&tag) {
        tag.insert(tag.len() - 1, 'x');
    }
    tag
}

/// Which of alkstore's objects exist in the schema named `$1`; no row when
/// the schema does not exist. Catalog reads need no privilege.
pub(crate) const INSPECT: &str = "
SELECT EXISTS (SELECT 1 FROM pg_class WHERE relnamespace = n.oid AND relname = 'meta'),
       EXISTS (SELECT 1 FROM pg_class WHERE relnamespace = n.oid AND relname = 'locks'),
       EXISTS (SELECT 1 FROM pg_class WHERE relnamespace = n.oid AND relname = 'fences'),
       EXISTS (SELECT 1 FROM pg_proc WHERE pronamespace = n.oid AND proname = 'acquire')
         AND EXISTS (SELECT 1 FROM pg_proc WHERE pronamespace = n.oid AND proname = 'acquire_permit')
         AND EXISTS (SELECT 1 FROM pg_proc WHERE pronamespace = n.oid AND proname = 'acquire_rw')
         AND EXISTS (SELECT 1 FROM pg_proc WHERE pronamespace = n.oid AND proname = 'draw_fence'),
       EXISTS (SELECT 1 FROM pg_class WHERE relnamespace = n.oid AND relname = 'permits')
FROM pg_namespace n WHERE n.nspname = $1";

/// The OID of the schema named `$1`.
pub(crate) const SCHEMA_OID: &str = "SELECT oid::bigint FROM pg_namespace WHERE nspname = $1";

/// Takes the schema-creation lock: `$1` is the class, `$2` the schema name.
pub(crate) const LOCK_SCHEMA_CREATION: &str = "SELECT pg_advisory_xact_lock($1, hashtext($2))";

/// Pins the isolation level the statements rely on (first statement of a
/// transaction on a connection that may default to another level).
pub(crate) const READ_COMMITTED: &str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED";

/// Pins READ COMMITTED for the session: run on each new connection of a
/// store whose connections keep their session (no pooler, or one in session
/// mode), whatever the role's or database's default — and only where the
/// default is another level, so that a store wrongly not told of a
/// transaction pooler changes no shared server connection that needs no
/// change.
pub(crate) const SESSION_READ_COMMITTED: &str = "
SELECT CASE WHEN current_setting('default_transaction_isolation') <> 'read committed'
            THEN set_config('default_transaction_isolation', 'read committed', false) END";

/// A CTE that makes the statement's own commit durable when the session's
/// `synchronous_commit` is `off` (a role's, database's or server's default —
/// and the server's can change on a reload under a connection already open):
/// `on` for this transaction only. Stronger settings (`on`, `remote_write`,
/// `remote_apply`) are kept, and `local` too. Grants and renewals use it: a
/// grant answered but lost in a crash would hand its fence out again, a
/// renewal so lost would leave a lease shorter than its holder was told.
/// Always one row, so an `EXISTS` over it only makes sure it runs.
const DURABLE_COMMIT_CTE: &str = "durable_commit AS (
    SELECT CASE WHEN current_setting('synchronous_commit') = 'off'
                THEN set_config('synchronous_commit', 'on', true) END)";

/// A CTE that turns `synchronous_commit` off for the statement's own
/// transaction (`set_config(…, true)`: local, gone at its end), referenced by
/// a one-time `EXISTS` so that it runs before any row is deleted. Only
/// releases and purges use it. A release or purge lost in a crash after its
/// answer is harmless: the row comes back, expired or expiring on its own
/// lease, and the name frees when that runs out, as if its holder had died.
/// Nothing granted depends on it: a grant commits synchronously, and its
/// flush takes every earlier WAL record along — the release it followed
/// included — so a name is never granted on a release that a crash could
/// still undo. Grants and renewals never use it: a lost grant would hand its
/// fence out again, a lost renewal shorten a lease its holder was promised.
const ASYNC_COMMIT_CTE: &str =
    "async_commit AS (SELECT set_config('synchronous_commit', 'off', true))";

/// The LISTEN/NOTIFY channel of the schema with this OID.
pub(crate) fn channel(schema_oid: i64) -> String {
    format!("alkstore_{schema_oid}")
}

/// The statements of one store, composed once at open for its schema.
/// Cloning one is a reference count, not a copy.
#[derive(Debug, Clone)]
pub(crate) struct Statements {
    pub(crate) create_schema: SqlStr,
    pub(crate) create_meta: SqlStr,
    pub(crate) create_locks: SqlStr,
    pub(crate) create_fences: SqlStr,
    pub(crate) create_permits: SqlStr,
    pub(crate) create_acquire: SqlStr,
    pub(crate) record_meta: SqlStr,
    pub(crate) record_version: SqlStr,
    pub(crate) add_epochs: SqlStr,
    pub(crate) read_meta: SqlStr,
    pub(crate) drop_objects: SqlStr,
    pub(crate) drop_schema: SqlStr,
    pub(crate) acquire: SqlStr,
    pub(crate) acquire_waiting: SqlStr,
    pub(crate) acquire_permit: SqlStr,
    pub(crate) acquire_permit_waiting: SqlStr,
    pub(crate) acquire_rw: SqlStr,
    pub(crate) acquire_rw_waiting: SqlStr,
    pub(crate) renew: SqlStr,
    pub(crate) renew_permit: SqlStr,
    pub(crate) renew_batch: SqlStr,
    pub(crate) release: SqlStr,
    pub(crate) release_permit: SqlStr,
    pub(crate) holder: SqlStr,
    pub(crate) list: SqlStr,
    pub(crate) force_release: SqlStr,
    pub(crate) purge: [SqlStr; 2],
    pub(crate) purge_tickets: SqlStr,
    pub(crate) leave_queue: SqlStr,
    pub(crate) waiters: SqlStr,
    pub(crate) raise_fences: SqlStr,
    pub(crate) lock_for_raise: SqlStr,
    /// The channel releases notify on ([`channel`]; set once the schema's
    /// OID is known).
    pub(crate) channel: String,
    /// This store's mark on the notifications its releases send.
    pub(crate) tag: String,
    /// How the statements travel.
    pub(crate) protocol: Protocol,
}

impl Statements {
    pub(crate) fn new(schema: &str, protocol: Protocol) -> Self {
        let s = quote_ident(schema);
        let locks = format!("{s}.locks");
        let permits = format!("{s}.permits");
        let acquire_permit_fn = format!("{s}.acquire_permit");
        let acquire_rw_fn = format!("{s}.acquire_rw");
        let draw_fn = format!("{s}.draw_fence");
        let meta = format!("{s}.meta");
        let fences = format!("{s}.fences");
        let acquire_fn = format!("{s}.acquire");
        let tickets = format!("{s}.tickets");
        let ticket_numbers = format!("{s}.ticket_numbers");
        let fences_regclass = quote_literal(&fences);
        let tickets_regclass = quote_literal(&ticket_numbers);
        let fence_lock_class = fence_lock_class(schema);
        // The grant path, run only when the statement's snapshot saw no live
        // row. Under READ COMMITTED each statement of a volatile function
        // takes a new snapshot, so the read after the advisory lock sees every
        // grant of this name that committed before; the fence is drawn after
        // that lock is held, so it is above every fence of an earlier
        // committed grant of the name (they drew theirs under the same lock,
        // before committing and letting go of it). A refusal here writes
        // nothing and draws nothing. `p_wait_ms`, when given, bounds the
        // lock waits of the transaction together (the advisory lock, then
        // the expired row's lock, each to what is left of it): past it the
        // server raises 55P03 and rolls back, and a waiting acquire reports
        // "held", having drawn no fence.
        // Both functions begin alike: READ COMMITTED required, then the
        // name's advisory lock taken (its wait bounded), under which every
        // grant of the name, a lock's or a permit's, decides and draws.
        let serialise_the_name = format!(
            "BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'alkstore needs READ COMMITTED, the transaction runs %',
            current_setting('transaction_isolation') USING ERRCODE = '0A000';
    END IF;
    {BOUND_LOCK_WAIT}
    PERFORM pg_advisory_xact_lock({fence_lock_class}, hashtext(p_name));
    -- The name's queue, read once: its tickets are written only under the
    -- advisory lock held now (a waiter that leaves deletes its own). Whether
    -- the attempt's own ticket is live and owed the turn, whether any
    -- reader's is owed it, and what stands ahead of the attempt: every live
    -- ticket older than its own (every live one when it has none).
    SELECT coalesce(bool_or(t.ticket = p_ticket), false),
           coalesce(bool_or(t.ticket = p_ticket AND t.owed), false),
           -- An owed reader behind a lock's or permit's waiter holds no
           -- writer back (it waits for that one first: a ring otherwise).
           coalesce(bool_or(t.kind = 'read' AND t.owed AND NOT EXISTS (
               SELECT 1 FROM {tickets} o
                WHERE o.name = p_name AND o.expires_at > now_ms
                  AND o.kind IN ('lock', 'permit') AND o.ticket < t.ticket)), false),
           max(t.expires_at) FILTER (WHERE t.ticket = p_ticket)
      INTO q_mine, q_owed, q_owed_readers, q_expires
      FROM {tickets} t WHERE t.name = p_name AND t.expires_at > now_ms;
    SELECT count(*), count(*) FILTER (WHERE t.kind = 'read'),
           count(*) FILTER (WHERE t.kind = 'permit'),
           count(*) FILTER (WHERE t.kind IN ('lock', 'permit')),
           min(t.ticket) FILTER (WHERE t.kind = 'write'), max(t.ticket)
      INTO q_ahead, q_readers_ahead, q_permits_ahead, q_not_rw_ahead, q_writer_ahead, q_last
      FROM {tickets} t WHERE t.name = p_name AND t.expires_at > now_ms
       AND (NOT q_mine OR t.ticket < p_ticket);
"
        );
        // The queue's variables, declared by every acquire function.
        let queue_variables = "    q_mine boolean;
    q_owed boolean;
    q_owed_readers boolean;
    q_ahead bigint;
    q_readers_ahead bigint;
    q_permits_ahead bigint;
    q_not_rw_ahead bigint;
    q_writer_ahead bigint;
    q_last bigint;
    q_ticket bigint;
    q_expires bigint;
    ticket_now bigint;
    fenced boolean := false;
";
        // A refusal of a waiting call (`p_ticket_ms` given): its ticket
        // renewed, or — none live — a new one drawn at the back (the name's
        // lapsed tickets deleted first); `owed` (a reader's) is kept once
        // set. A refusal that wrote nothing else commits without waiting for
        // the WAL flush: a ticket lost in a crash only sends its waiter to
        // the back. Then `queued` below answers where it stands.
        let queue_up = |kind: &str, owed: &str| {
            format!(
                "IF p_ticket_ms IS NOT NULL THEN
            {BOUND_LOCK_WAIT}
            ticket_now := {CLOCK_MS};
            IF q_mine THEN
                -- Renewed once a quarter of its lease has passed, or when
                -- it becomes owed: polls in between write nothing. By the
                -- clock after the advisory lock's wait (`now_ms` is the
                -- transaction's start). A waiter attempts again within its
                -- poll ceiling, 250 ms, and at the latest half a lease
                -- after this attempt began: a quarter of a lease or more
                -- to spare.
                IF q_expires - ticket_now <= p_ticket_ms * 3 / 4 OR ({owed} AND NOT q_owed) THEN
                    UPDATE {tickets} t
                       SET expires_at = ticket_now + p_ticket_ms, owed = t.owed OR {owed}
                     WHERE t.name = p_name AND t.ticket = p_ticket;
                END IF;
                q_ticket := p_ticket;
                q_owed := q_owed OR {owed};
            ELSIF p_ticket IS NOT NULL AND EXISTS (
                SELECT 1 FROM {tickets} t
                 WHERE t.name = p_name AND t.ticket = p_ticket AND t.expires_at = 0) THEN
                -- Its call left the queue (`leave_queue` marks the ticket
                -- so) while this attempt was on its way: no new place for
                -- a call that is gone.
                NULL;
            ELSE
                -- Lapsed tickets whose rows nobody else holds (a purge
                -- may): skipped, not waited for, so that the two never
                -- wait for each other.
                DELETE FROM {tickets} t
                 USING (SELECT l.name, l.ticket FROM {tickets} l
                         WHERE l.name = p_name AND l.expires_at <= now_ms
                         FOR UPDATE SKIP LOCKED) lapsed
                 WHERE t.name = lapsed.name AND t.ticket = lapsed.ticket;
                q_ticket := nextval({tickets_regclass}::regclass);
                INSERT INTO {tickets} (name, ticket, owner, kind, owed, expires_at, since)
                VALUES (p_name, q_ticket, p_owner, {kind}, {owed}, ticket_now + p_ticket_ms,
                        ticket_now);
                q_owed := {owed};
            END IF;
            IF NOT fenced THEN
                PERFORM set_config('synchronous_commit', 'off', true);
            END IF;
        END IF;"
            )
        };
        // A refusal's last columns: the ticket (NULL: not queued), how many
        // live tickets are ahead, and the cue — the ticket whose leaving it
        // waits for: the one just ahead; none for a reader owed its turn (a
        // release is its cue); for another reader, the first writer ahead.
        let queued = |kind: &str| {
            format!(
                "q_ticket, q_ahead::integer,
                                CASE WHEN {kind} = 'read' AND q_owed THEN NULL
                                     WHEN {kind} = 'read' THEN coalesce(q_writer_ahead, q_last)
                                     ELSE q_last END"
            )
        };
        // A grant (or the owner's own grant given back) ends the attempt's
        // wait: its live ticket is deleted, and the waiter behind it, in
        // any process, is told (at commit) by the ticket's number.
        let leave_the_line = format!(
            "IF q_mine THEN
                {BOUND_LOCK_WAIT}
                DELETE FROM {tickets} t WHERE t.name = p_name AND t.ticket = p_ticket;
                PERFORM pg_notify(p_channel, p_tag || '#' || p_ticket || ':' || p_name);
            END IF;"
        );
        // The same owner's live grant keeps its fence when this timeline
        // granted it, and is given a new one otherwise.
        let refence = |alias: &str| {
            format!(
                "CASE WHEN {alias}.epoch = timeline THEN {alias}.fence
                                ELSE {draw_fn}(timeline) END"
            )
        };
        let (refence_lock, refence_permit) = (refence("l"), refence("p"));
        let queue_up_lock = queue_up("'lock'", "false");
        let queued_lock = queued("'lock'");
        let body = format!(
            "
DECLARE
    now_ms bigint := {NOW_MS};
    wait_until timestamptz := clock_timestamp() + p_wait_ms * interval '1 millisecond';
    held record;
    was_there boolean;
    semaphore integer;
    stale boolean;
    drawn bigint;
    timeline bigint;
{queue_variables}{serialise_the_name}    LOOP
        SELECT l.owner, l.fence, l.expires_at INTO held FROM {locks} l WHERE l.name = p_name;
        was_there := FOUND;
        IF was_there AND held.expires_at > now_ms AND held.owner <> p_owner THEN
            {queue_up_lock}
            RETURN QUERY SELECT false, held.fence, held.expires_at - now_ms, NULL::integer,
                                {queued_lock};
            RETURN;
        END IF;
        IF was_there AND held.expires_at > now_ms THEN
            -- The same owner's live grant: answered only once a write of
            -- ours commits, because its commit waits for a synchronous
            -- standby, and the standby then has every WAL record before it,
            -- the grant's own included. Read back alone, the row could be a
            -- grant whose commit's wait for the standby was cut short (its
            -- backend terminated, the answer lost): on the primary only.
            -- Granted on another timeline (before a promotion: a row the
            -- promotion revived, its release lost, or one the old primary
            -- granted), it is taken over with a new fence and lease: its
            -- old fence may be below fences the old primary handed out
            -- since, and no renewal of it is answered here.
            IF timeline IS NULL THEN
                timeline := {TIMELINE};
            END IF;
            {BOUND_LOCK_WAIT}
            UPDATE {locks} l
               SET fence = {refence_lock},
                   expires_at = CASE WHEN l.epoch = timeline THEN l.expires_at
                                     ELSE now_ms + p_ttl END,
                   epoch = timeline
             WHERE l.name = p_name AND l.owner = p_owner AND l.fence = held.fence
               AND l.expires_at > now_ms
            RETURNING l.fence, l.expires_at INTO held.fence, held.expires_at;
            IF FOUND THEN
                {leave_the_line}
                RETURN QUERY SELECT true, held.fence, held.expires_at - now_ms, NULL::integer,
                                    NULL::bigint, NULL::integer, NULL::bigint;
                RETURN;
            END IF;
            -- Released or expired meanwhile: look again.
            CONTINUE;
        END IF;
        -- A name is a lock or a semaphore: live permits (granted under
        -- this same advisory lock) refuse it, writing nothing. From the same
        -- read: whether some expired permit of the name is not fenced off
        -- yet (expiry 0, below).
        SELECT max(p.permits) FILTER (WHERE p.expires_at > now_ms),
               coalesce(bool_or(p.expires_at <= now_ms AND p.expires_at > 0), false)
          INTO semaphore, stale
          FROM {permits} p WHERE p.name = p_name;
        IF semaphore IS NOT NULL THEN
            RETURN QUERY SELECT false, 0::bigint, 0::bigint, semaphore,
                                NULL::bigint, NULL::integer, NULL::bigint;
            RETURN;
        END IF;
        IF q_ahead > 0 THEN
            -- Free, but a waiter queued before this attempt: its turn.
            {queue_up_lock}
            RETURN QUERY SELECT false, 0::bigint, NULL::bigint, NULL::integer, {queued_lock};
            RETURN;
        END IF;
        IF was_there THEN
            -- Expired: lock the row before drawing a fence (waiting for a
            -- renewal, release or purge in flight), so that a fence is drawn
            -- only for a row this transaction certainly takes over.
            {BOUND_LOCK_WAIT}
            PERFORM 1 FROM {locks} l
             WHERE l.name = p_name AND l.expires_at <= now_ms FOR UPDATE;
            IF NOT FOUND THEN
                -- Renewed, released or purged meanwhile: look again.
                CONTINUE;
            END IF;
        END IF;
        IF stale THEN
            -- The expired permits are fenced off (expiry 0) before the
            -- grant: this waits for a renewal of one in flight, which read
            -- its clock before the lease ran out and would otherwise land
            -- after the grant, on a row the grant never touched, bringing
            -- the permit back beside the lock; every later renewal of it
            -- answers lost. Its holder can still release it; a purge
            -- removes it. Then live permits are looked for again. (The
            -- name's row in `locks` first, then `permits`: every path
            -- takes them in that order, so none waits for another in a
            -- circle.)
            {BOUND_LOCK_WAIT}
            UPDATE {permits} p SET expires_at = 0
             WHERE p.name = p_name AND p.expires_at <= now_ms AND p.expires_at > 0;
            fenced := true;
            SELECT max(p.permits) INTO semaphore FROM {permits} p
             WHERE p.name = p_name AND p.expires_at > now_ms;
            IF semaphore IS NOT NULL THEN
                RETURN QUERY SELECT false, 0::bigint, 0::bigint, semaphore,
                                    NULL::bigint, NULL::integer, NULL::bigint;
                RETURN;
            END IF;
        END IF;
        IF timeline IS NULL THEN
            -- The WAL's timeline, raised by every promotion: a fence's high part.
            timeline := {TIMELINE};
        END IF;
        IF was_there THEN
            UPDATE {locks} l
               SET owner = p_owner,
                   fence = {draw_fn}(timeline),
                   expires_at = now_ms + p_ttl,
                   epoch = timeline
             WHERE l.name = p_name
            RETURNING l.fence INTO drawn;
        ELSE
            -- Every insert of a name runs under its advisory lock: no
            -- conflict can come up here but from outside alkstore.
            INSERT INTO {locks} AS l (name, owner, fence, expires_at, epoch)
            VALUES (p_name, p_owner, {draw_fn}(timeline),
                    now_ms + p_ttl, timeline)
            ON CONFLICT (name) DO NOTHING
            RETURNING l.fence INTO drawn;
        END IF;
        IF drawn IS NOT NULL THEN
            {leave_the_line}
            RETURN QUERY SELECT true, drawn, p_ttl, NULL::integer,
                                NULL::bigint, NULL::integer, NULL::bigint;
            RETURN;
        END IF;
        -- Released, purged or renewed meanwhile: look again.
    END LOOP;
END"
        );
        // What the permit and reader-writer functions share. The name's
        // lock row read once per look: live (refused: `lock`), or expired
        // and not fenced off yet (`lock_stale`).
        let look_at_the_lock = format!(
            "        -- Each table read once per look: what is live, and whether some
        -- expired grant of the name is not fenced off yet (expiry 0).
        SELECT bool_or(l.expires_at > now_ms),
               coalesce(bool_or(l.expires_at <= now_ms AND l.expires_at > 0), false)
          INTO lock_live, lock_stale
          FROM {locks} l WHERE l.name = p_name;
        IF lock_live THEN
            RETURN QUERY SELECT 'lock'::text, 0::bigint, 0, 0::bigint, 0,
                                NULL::bigint, NULL::integer, NULL::bigint;
            RETURN;
        END IF;
"
        );
        // About to grant: the name's expired lock and permits-table rows are
        // fenced off first (expiry 0; see the lock function), waiting for a
        // renewal of one in flight, and everything is looked at again.
        // `locks` first, then `permits`, as everywhere.
        let fence_off_the_expired = format!(
            "        IF lock_stale OR permits_stale THEN
            {BOUND_LOCK_WAIT}
            UPDATE {locks} l SET expires_at = 0
             WHERE l.name = p_name AND l.expires_at <= now_ms AND l.expires_at > 0;
            UPDATE {permits} p SET expires_at = 0
             WHERE p.name = p_name AND p.expires_at <= now_ms AND p.expires_at > 0;
            fenced := true;
            CONTINUE;
        END IF;
"
        );
        // The slot's row, if any, locked (waiting for a renewal, release or
        // purge in flight) before a fence is drawn: taken over when still
        // expired, inserted when gone (every insert into `permits` runs
        // under the name's advisory lock). `slot` is the variable holding
        // it, `permits` what the row's permits column gets.
        let take_the_slot = |slot: &str, permits_value: &str| {
            format!(
                "        {BOUND_LOCK_WAIT}
        SELECT p.expires_at INTO ends FROM {permits} p
         WHERE p.name = p_name AND p.slot = {slot} FOR UPDATE;
        IF FOUND AND ends <= now_ms THEN
            UPDATE {permits} p
               SET owner = p_owner,
                   fence = {draw_fn}(timeline),
                   expires_at = now_ms + p_ttl,
                   permits = {permits_value},
                   epoch = timeline
             WHERE p.name = p_name AND p.slot = {slot}
            RETURNING p.fence INTO drawn;
        ELSIF NOT FOUND THEN
            INSERT INTO {permits} AS p (name, slot, owner, fence, expires_at, permits, epoch)
            VALUES (p_name, {slot}, p_owner,
                    {draw_fn}(timeline),
                    now_ms + p_ttl, {permits_value}, timeline)
            ON CONFLICT ON CONSTRAINT permits_pkey DO NOTHING
            RETURNING p.fence INTO drawn;
        END IF;
"
            )
        };
        // The owner's own live grant in `permits` (its slot and fence in
        // `mine_slot`, `mine_fence`): given back only once a write of ours
        // confirms it, as the lock function's same-owner answer is (granted
        // on another timeline, taken over with a new fence, as there);
        // released or expired meanwhile, look again. `last` is the answer's
        // last column.
        let give_back = |last: &str| {
            format!(
                "        IF mine_fence IS NOT NULL THEN
            IF timeline IS NULL THEN
                timeline := {TIMELINE};
            END IF;
            {BOUND_LOCK_WAIT}
            UPDATE {permits} p
               SET fence = {refence_permit},
                   expires_at = CASE WHEN p.epoch = timeline THEN p.expires_at
                                     ELSE now_ms + p_ttl END,
                   epoch = timeline
             WHERE p.name = p_name AND p.slot = mine_slot AND p.fence = mine_fence
               AND p.expires_at > now_ms
            RETURNING p.fence, p.expires_at INTO mine_fence, ends;
            IF FOUND THEN
                {leave_the_line}
                RETURN QUERY SELECT 'granted'::text, mine_fence, mine_slot, ends - now_ms, {last},
                                    NULL::bigint, NULL::integer, NULL::bigint;
                RETURN;
            END IF;
            CONTINUE;
        END IF;
"
            )
        };
        let give_the_permit_back = give_back("p_permits");
        let give_the_rw_grant_back = give_back("0");
        let take_the_permit_slot = take_the_slot("free_slot", "p_permits");
        let take_the_rw_slot = take_the_slot("grant_slot", &READ_WRITE_PERMITS.to_string());
        let queue_up_permit = queue_up("'permit'", "false");
        let queued_permit = queued("'permit'");
        // A permit's grant path, under the same advisory lock as the
        // lock's, so that fences of one name follow commit order and a
        // name is never a lock and a semaphore at once. The decisions, in
        // order: a live lock refuses; live permits of another count refuse;
        // the owner's own live permit is given back (confirmed by a write,
        // as the lock's is); the lowest slot with no live permit is granted
        // (its expired row locked first, as the lock's is); none free:
        // held, with the soonest expiry. Refusals write nothing and draw
        // nothing. Table columns are always qualified: the output columns
        // are variables in here.
        let permit_body = format!(
            "
DECLARE
    now_ms bigint := {NOW_MS};
    wait_until timestamptz := clock_timestamp() + p_wait_ms * interval '1 millisecond';
    other integer;
    live bigint;
    mine_slot integer;
    mine_fence bigint;
    free_slot integer;
    ends bigint;
    drawn bigint;
    timeline bigint;
    lock_live boolean;
    lock_stale boolean;
    permits_stale boolean;
{queue_variables}{serialise_the_name}    LOOP
{look_at_the_lock}        -- The name's live permits at once: how many, the soonest end,
        -- another count if any, the owner's own.
        SELECT count(*) FILTER (WHERE p.expires_at > now_ms),
               min(p.expires_at) FILTER (WHERE p.expires_at > now_ms),
               max(p.permits) FILTER (WHERE p.expires_at > now_ms AND p.permits <> p_permits),
               max(p.slot) FILTER (WHERE p.expires_at > now_ms AND p.owner = p_owner),
               max(p.fence) FILTER (WHERE p.expires_at > now_ms AND p.owner = p_owner),
               coalesce(bool_or(p.expires_at <= now_ms AND p.expires_at > 0), false)
          INTO live, ends, other, mine_slot, mine_fence, permits_stale
          FROM {permits} p WHERE p.name = p_name;
        IF other IS NOT NULL THEN
            RETURN QUERY SELECT 'mismatch'::text, 0::bigint, 0, 0::bigint, other,
                                NULL::bigint, NULL::integer, NULL::bigint;
            RETURN;
        END IF;
{give_the_permit_back}        IF live >= p_permits OR p_permits - live <= q_ahead OR q_permits_ahead < q_ahead THEN
            -- Every permit held, or the free ones owed to waiters queued
            -- before this attempt, or a waiter of another kind queued
            -- before it (one queue across kinds: the name is theirs first).
            {queue_up_permit}
            RETURN QUERY SELECT 'held'::text, 0::bigint, 0, ends - now_ms, 0, {queued_permit};
            RETURN;
        END IF;
{fence_off_the_expired}        -- Fewer live permits than the count, all of it, all below it: a
        -- slot is free, and the lowest is 0 or one past a live slot.
        SELECT min(c.slot) INTO free_slot
          FROM (SELECT 0 AS slot
                UNION ALL
                SELECT p.slot + 1 FROM {permits} p
                 WHERE p.name = p_name AND p.expires_at > now_ms) c
         WHERE c.slot < p_permits
           AND NOT EXISTS (SELECT 1 FROM {permits} q
                            WHERE q.name = p_name AND q.slot = c.slot AND q.expires_at > now_ms);
        IF free_slot IS NULL THEN
            {queue_up_permit}
            RETURN QUERY SELECT 'held'::text, 0::bigint, 0, ends - now_ms, 0, {queued_permit};
            RETURN;
        END IF;
        IF timeline IS NULL THEN
            timeline := {TIMELINE};
        END IF;
{take_the_permit_slot}        IF drawn IS NOT NULL THEN
            {leave_the_line}
            RETURN QUERY SELECT 'granted'::text, drawn, free_slot, p_ttl, p_permits,
                                NULL::bigint, NULL::integer, NULL::bigint;
            RETURN;
        END IF;
        -- Renewed, released or taken meanwhile: look again.
    END LOOP;
END"
        );
        // A reader-writer lock's grant path, under the same advisory lock
        // as the others'; its rows live in `permits` with permits 0 (a
        // semaphore's are 1 or more): readers on slots 0.., the writer on
        // {WRITER_SLOT} (a waiting writer's intent of layout 9, on
        // {INTENT_SLOT}, is no longer read: the queue replaced it). The
        // decisions, in order: a live lock or live permits of a semaphore
        // refuse; the owner's own live grant of the mode is given back
        // (confirmed by a write); a writer is refused beside a live writer
        // or readers; a reader beside a live writer (then its ticket is
        // owed the turn after that writer), or {MAX_READERS} readers; then
        // the queue's turn (phase-fair: a writer when nobody is queued
        // ahead and no reader is owed a turn; a reader when no writer is
        // queued ahead or its ticket is owed, and a slot is free for it
        // past the readers ahead); otherwise the expired rows are fenced
        // off (as the permit function does) and the grant made, a writer's
        // owing every reader queued then the turn after it.
        let kind_rw = "CASE WHEN p_write THEN 'write' ELSE 'read' END";
        let queue_up_refused = queue_up(kind_rw, "false");
        let queue_up_owed = queue_up(kind_rw, "true");
        let queued_rw = queued(kind_rw);
        let rw_body = format!(
            "
DECLARE
    now_ms bigint := {NOW_MS};
    wait_until timestamptz := clock_timestamp() + p_wait_ms * interval '1 millisecond';
    lock_live boolean;
    lock_stale boolean;
    other integer;
    writer_owner text;
    writer_fence bigint;
    writer_ends bigint;
    readers bigint;
    readers_end bigint;
    mine_slot integer;
    mine_fence bigint;
    permits_stale boolean;
    grant_slot integer;
    ends bigint;
    drawn bigint;
    timeline bigint;
{queue_variables}{serialise_the_name}    LOOP
{look_at_the_lock}        -- The name's rows at once: a semaphore's permits, the writer, the
        -- readers, the owner's own reader, and whether some expired row is
        -- not fenced off yet.
        SELECT max(p.permits) FILTER (WHERE p.expires_at > now_ms AND p.permits <> {READ_WRITE_PERMITS}),
               max(p.owner) FILTER (WHERE p.expires_at > now_ms AND p.slot = {WRITER_SLOT}),
               max(p.fence) FILTER (WHERE p.expires_at > now_ms AND p.slot = {WRITER_SLOT}),
               max(p.expires_at) FILTER (WHERE p.expires_at > now_ms AND p.slot = {WRITER_SLOT}),
               count(*) FILTER (WHERE p.expires_at > now_ms AND p.slot >= 0),
               min(p.expires_at) FILTER (WHERE p.expires_at > now_ms AND p.slot >= 0),
               max(p.slot) FILTER (WHERE p.expires_at > now_ms AND p.slot >= 0 AND p.owner = p_owner),
               max(p.fence) FILTER (WHERE p.expires_at > now_ms AND p.slot >= 0 AND p.owner = p_owner),
               coalesce(bool_or(p.expires_at <= now_ms AND p.expires_at > 0), false)
          INTO other, writer_owner, writer_fence, writer_ends,
               readers, readers_end, mine_slot, mine_fence, permits_stale
          FROM {permits} p WHERE p.name = p_name;
        IF other IS NOT NULL THEN
            RETURN QUERY SELECT 'semaphore'::text, 0::bigint, 0, 0::bigint, other,
                                NULL::bigint, NULL::integer, NULL::bigint;
            RETURN;
        END IF;
        IF p_write THEN
            mine_slot := {WRITER_SLOT};
            mine_fence := CASE WHEN writer_owner = p_owner THEN writer_fence END;
        END IF;
{give_the_rw_grant_back}        IF p_write AND (writer_owner IS NOT NULL OR readers > 0) THEN
            {queue_up_refused}
            RETURN QUERY SELECT 'held'::text, 0::bigint, 0,
                                least(writer_ends, readers_end) - now_ms, 0, {queued_rw};
            RETURN;
        END IF;
        IF NOT p_write AND writer_owner IS NOT NULL THEN
            -- A writer holds: this reader is owed the turn after it.
            {queue_up_owed}
            RETURN QUERY SELECT 'held'::text, 0::bigint, 0, writer_ends - now_ms, 0, {queued_rw};
            RETURN;
        END IF;
        -- Not this attempt's turn in the queue. (In parentheses: IF reads
        -- its condition up to the first THEN outside them.)
        IF (CASE WHEN p_write THEN q_ahead > 0 OR q_owed_readers
                 ELSE readers >= {MAX_READERS} OR q_not_rw_ahead > 0
                      OR NOT (q_owed OR q_writer_ahead IS NULL)
                      OR {MAX_READERS} - readers <= q_readers_ahead END) THEN
            {queue_up_refused}
            RETURN QUERY SELECT 'held'::text, 0::bigint, 0, readers_end - now_ms, 0, {queued_rw};
            RETURN;
        END IF;
{fence_off_the_expired}        IF p_write THEN
            grant_slot := {WRITER_SLOT};
        ELSE
            -- The lowest free reader slot: 0, or one past a live reader's.
            SELECT min(c.slot) INTO grant_slot
              FROM (SELECT 0 AS slot
                    UNION ALL
                    SELECT p.slot + 1 FROM {permits} p
                     WHERE p.name = p_name AND p.slot >= 0 AND p.expires_at > now_ms) c
             WHERE c.slot < {MAX_READERS}
               AND NOT EXISTS (SELECT 1 FROM {permits} q
                                WHERE q.name = p_name AND q.slot = c.slot
                                  AND q.expires_at > now_ms);
        END IF;
        IF timeline IS NULL THEN
            timeline := {TIMELINE};
        END IF;
{take_the_rw_slot}        IF drawn IS NOT NULL THEN
            IF p_write THEN
                {BOUND_LOCK_WAIT}
                UPDATE {tickets} t SET owed = true
                 WHERE t.name = p_name AND t.kind = 'read' AND NOT t.owed
                   AND t.expires_at > now_ms;
            END IF;
            {leave_the_line}
            RETURN QUERY SELECT 'granted'::text, drawn, grant_slot, p_ttl, 0,
                                NULL::bigint, NULL::integer, NULL::bigint;
            RETURN;
        END IF;
        -- Renewed, released or taken meanwhile: look again.
    END LOOP;
END"
        );
        // Every fence drawn: the sequence's next value above the timeline's
        // base, or — past `MAX_FENCE` — an error of its own, raised before
        // the grant writes (its transaction rolls back whole).
        let draw_body = format!(
            "
DECLARE
    n bigint := nextval({fences_regclass}::regclass);
BEGIN
    IF n > {max} - p_timeline * {TIMELINE_STEP} THEN
        RAISE EXCEPTION 'alkstore: no fence left below the end (%)', {max}
            USING ERRCODE = '{NO_FENCE_LEFT}';
    END IF;
    RETURN n + p_timeline * {TIMELINE_STEP};
END",
            max = fence_to_sql(MAX_FENCE)
        );
        let tag = dollar_tag(&format!("{body}{permit_body}{rw_body}{draw_body}"));
        Statements {
            channel: String::new(),
            tag: store_tag(),
            protocol,
            create_schema: audited(format!("CREATE SCHEMA {s}")),
            create_meta: audited(format!(
                "CREATE TABLE {meta} (key text PRIMARY KEY, value bigint NOT NULL)"
            )),
            create_locks: audited(format!(
                "CREATE TABLE {locks} (
                     name       text   PRIMARY KEY,
                     owner      text   NOT NULL,
                     fence      bigint NOT NULL,
                     expires_at bigint NOT NULL, -- Unix milliseconds, server clock
                     epoch      bigint NOT NULL DEFAULT 0 -- the timeline that granted it
                 )"
            )),
            create_fences: audited(format!("CREATE SEQUENCE {fences} AS bigint")),
            create_permits: audited(format!(
                "CREATE TABLE {permits} (
                     name       text    NOT NULL,
                     slot       integer NOT NULL, -- 0 .. permits - 1
                     owner      text    NOT NULL,
                     fence      bigint  NOT NULL,
                     expires_at bigint  NOT NULL, -- Unix milliseconds, server clock
                     permits    integer NOT NULL, -- the semaphore's, as its grant asked
                     epoch      bigint  NOT NULL DEFAULT 0, -- the timeline that granted it
                     CONSTRAINT permits_pkey PRIMARY KEY (name, slot)
                 )"
            )),
            create_acquire: audited(format!(
                // The queue's table and numbers first (the functions name
                // them), made if missing: an older layout has none. Older
                // layouts' functions are dropped by their arguments: they
                // took others and answered fewer columns, which OR REPLACE
                // cannot change. One transaction (the creation lock's)
                // holds it all.
                "CREATE TABLE IF NOT EXISTS {tickets} (
                     name       text    NOT NULL,
                     ticket     bigint  NOT NULL, -- from ticket_numbers: lower is earlier
                     owner      text    NOT NULL,
                     kind       text    NOT NULL, -- lock, permit, read or write
                     owed       boolean NOT NULL, -- a reader's: owed the next turn
                     expires_at bigint  NOT NULL, -- Unix milliseconds, server clock
                     since      bigint  NOT NULL, -- when it was taken, server clock
                     CONSTRAINT tickets_pkey PRIMARY KEY (name, ticket)
                 );
                 CREATE SEQUENCE IF NOT EXISTS {ticket_numbers} AS bigint;
                 CREATE OR REPLACE FUNCTION {draw_fn}(p_timeline bigint) RETURNS bigint
                 LANGUAGE plpgsql VOLATILE AS {tag}{draw_body}{tag};
                 DROP FUNCTION IF EXISTS {acquire_fn}(text, text, bigint, integer);
                 DROP FUNCTION IF EXISTS {acquire_permit_fn}(text, integer, text, bigint, integer);
                 DROP FUNCTION IF EXISTS {acquire_rw_fn}(text, boolean, text, bigint, bigint, integer);
                 CREATE OR REPLACE FUNCTION {acquire_fn}(p_name text, p_owner text, p_ttl bigint,
                     p_wait_ms integer, p_ticket bigint, p_ticket_ms bigint,
                     p_channel text, p_tag text)
                 RETURNS TABLE (granted boolean, fence bigint, expires_in_ms bigint,
                                held_as_semaphore integer, ticket bigint, queue_position integer,
                                cue bigint)
                 LANGUAGE plpgsql VOLATILE AS {tag}{body}{tag};
                 CREATE OR REPLACE FUNCTION {acquire_permit_fn}(p_name text, p_permits integer,
                     p_owner text, p_ttl bigint, p_wait_ms integer, p_ticket bigint,
                     p_ticket_ms bigint, p_channel text, p_tag text)
                 RETURNS TABLE (outcome text, fence bigint, slot integer, expires_in_ms bigint,
                                live_permits integer, ticket bigint, queue_position integer,
                                cue bigint)
                 LANGUAGE plpgsql VOLATILE AS {tag}{permit_body}{tag};
                 CREATE OR REPLACE FUNCTION {acquire_rw_fn}(p_name text, p_write boolean,
                     p_owner text, p_ttl bigint, p_wait_ms integer, p_ticket bigint,
                     p_ticket_ms bigint, p_channel text, p_tag text)
                 RETURNS TABLE (outcome text, fence bigint, slot integer, expires_in_ms bigint,
                                semaphore_permits integer, ticket bigint, queue_position integer,
                                cue bigint)
                 LANGUAGE plpgsql VOLATILE AS {tag}{rw_body}{tag};"
            )),
            // $1 schema_version, $2 created_schema.
            record_meta: audited(format!(
                "INSERT INTO {meta} (key, value) VALUES
                     ('schema_version', $1), ('{MARKER_KEY}', 1), ('{CREATED_SCHEMA_KEY}', $2)"
            )),
            // $1 schema_version.
            record_version: audited(format!(
                "UPDATE {meta} SET value = $1 WHERE key = 'schema_version'"
            )),
            // Layout 8 and older: the rows already there taken as this
            // timeline's (the upgrade runs on the primary): what that layout
            // did, so that an upgrade ends no lease. Idempotent.
            add_epochs: audited(format!(
                "ALTER TABLE {locks} ADD COLUMN IF NOT EXISTS epoch bigint NOT NULL DEFAULT 0;
                 ALTER TABLE {permits} ADD COLUMN IF NOT EXISTS epoch bigint NOT NULL DEFAULT 0;
                 UPDATE {locks} SET epoch = {TIMELINE} WHERE epoch = 0;
                 UPDATE {permits} SET epoch = {TIMELINE} WHERE epoch = 0;"
            )),
            read_meta: audited(format!("SELECT key, value FROM {meta}")),
            // No CASCADE: whatever someone else built on these objects stays,
            // and the drop fails rather than take it along.
            drop_objects: audited(format!(
                // By name: an older version's function had other arguments.
                "DROP FUNCTION IF EXISTS {acquire_fn};
                 DROP FUNCTION IF EXISTS {acquire_permit_fn};
                 DROP FUNCTION IF EXISTS {acquire_rw_fn};
                 DROP FUNCTION IF EXISTS {draw_fn};
                 DROP TABLE IF EXISTS {tickets};
                 DROP SEQUENCE IF EXISTS {ticket_numbers};
                 DROP TABLE IF EXISTS {permits};
                 DROP TABLE IF EXISTS {locks};
                 DROP SEQUENCE IF EXISTS {fences};
                 DROP TABLE IF EXISTS {meta};"
            )),
            drop_schema: audited(format!("DROP SCHEMA {s}")),
            // One statement. `live` reads the row as of the statement's
            // snapshot: when someone else's live row is there, nothing is
            // written (no row lock, no WAL) and the answer is "held". Only
            // otherwise does it call the acquire function (a one-time filter
            // skips it), which also answers the same owner's grant again —
            // confirmed by a write, never by this read. A `try_` call's
            // (never queued: no ticket given). $1 name, $2 owner, $3 ttl
            // ms, $4 the bound on lock waits in ms (NULL: none).
            acquire: audited(format!(
                "WITH {DURABLE_COMMIT_CTE},
                 clock AS (SELECT {NOW_MS} AS now_ms),
                 live AS (
                     SELECT l.fence, l.expires_at - c.now_ms AS expires_in_ms
                     FROM {locks} l, clock c
                     WHERE l.name = $1 AND l.expires_at > c.now_ms AND l.owner <> $2
                 )
                 SELECT false AS granted, fence, expires_in_ms, NULL::integer,
                        NULL::bigint, NULL::integer, NULL::bigint FROM live
                 UNION ALL
                 SELECT g.granted, g.fence, g.expires_in_ms, g.held_as_semaphore,
                        g.ticket, g.queue_position, g.cue
                 FROM {acquire_fn}($1, $2, $3, $4, NULL, NULL, NULL, NULL) g
                 WHERE NOT EXISTS (SELECT 1 FROM live) AND EXISTS (SELECT 1 FROM durable_commit)"
            )),
            // A waiting acquire's statement: the acquire function alone. The
            // statement names no table, so it takes no table lock before the
            // function has bounded its lock waits by `$4` (a table locked by
            // DDL or `LOCK TABLE` would hold it, unbounded, at planning time).
            // Every attempt of a waiting call runs it, to take or renew its
            // ticket. The same parameters as `acquire`, then $5 the ticket
            // (NULL: none yet), $6 the ticket's lease in ms (NULL: not
            // queued), $7 the channel and $8 the store tag its leaving is
            // told on.
            acquire_waiting: audited(format!(
                "WITH {DURABLE_COMMIT_CTE}
                 SELECT g.granted, g.fence, g.expires_in_ms, g.held_as_semaphore,
                        g.ticket, g.queue_position, g.cue
                 FROM {acquire_fn}($1, $2, $3, $4, $5, $6, $7, $8) g
                 WHERE EXISTS (SELECT 1 FROM durable_commit)"
            )),
            // One statement, as `acquire`: when the statement's snapshot
            // sees every permit live, of the count asked, none the owner's,
            // nothing is written and the answer is "held", with the soonest
            // expiry; otherwise the permit function decides. A `try_`
            // call's. $1 name, $2 permits, $3 owner, $4 ttl ms, $5 the bound
            // on lock waits in ms (NULL: none).
            acquire_permit: audited(format!(
                "WITH {DURABLE_COMMIT_CTE},
                 clock AS (SELECT {NOW_MS} AS now_ms),
                 seen AS (
                     SELECT count(*) AS live, min(p.expires_at) - min(c.now_ms) AS soonest,
                            coalesce(bool_or(p.owner = $3 OR p.permits <> $2), false) AS decide
                     FROM {permits} p, clock c
                     WHERE p.name = $1 AND p.expires_at > c.now_ms
                 ),
                 full_up AS (SELECT soonest FROM seen WHERE live >= $2 AND NOT decide)
                 SELECT 'held'::text AS outcome, 0::bigint, 0, soonest, 0,
                        NULL::bigint, NULL::integer, NULL::bigint FROM full_up
                 UNION ALL
                 SELECT g.outcome, g.fence, g.slot, g.expires_in_ms, g.live_permits,
                        g.ticket, g.queue_position, g.cue
                 FROM {acquire_permit_fn}($1, $2, $3, $4, $5, NULL, NULL, NULL, NULL) g
                 WHERE NOT EXISTS (SELECT 1 FROM full_up) AND EXISTS (SELECT 1 FROM durable_commit)"
            )),
            // A waiting permit acquire's statement: the function alone, for
            // the reason `acquire_waiting` gives. The same parameters, then
            // $6 to $9 as `acquire_waiting`'s $5 to $8.
            acquire_permit_waiting: audited(format!(
                "WITH {DURABLE_COMMIT_CTE}
                 SELECT g.outcome, g.fence, g.slot, g.expires_in_ms, g.live_permits,
                        g.ticket, g.queue_position, g.cue
                 FROM {acquire_permit_fn}($1, $2, $3, $4, $5, $6, $7, $8, $9) g
                 WHERE EXISTS (SELECT 1 FROM durable_commit)"
            )),
            // A reader-writer acquire, one statement as `acquire`: when
            // the statement's snapshot sees what refuses the mode — a live
            // writer for a reader; a live reader, or another's live writer,
            // for a writer — nothing is written and the answer is "held",
            // with the soonest end, without queueing on the name's advisory
            // lock; otherwise the function decides. A `try_` call's. $1
            // name, $2 write, $3 owner, $4 ttl ms, $5 the bound on lock
            // waits in ms (NULL: none).
            acquire_rw: audited(format!(
                "WITH {DURABLE_COMMIT_CTE},
                 clock AS (SELECT {NOW_MS} AS now_ms),
                 seen AS (
                     SELECT min(p.expires_at) - min(c.now_ms) AS soonest
                     FROM {permits} p, clock c
                     WHERE p.name = $1 AND p.expires_at > c.now_ms
                       AND p.permits = {READ_WRITE_PERMITS}
                       AND CASE WHEN $2 THEN p.slot >= 0
                                             OR (p.slot = {WRITER_SLOT} AND p.owner <> $3)
                                ELSE p.slot = {WRITER_SLOT} END
                 ),
                 refused AS (SELECT soonest FROM seen WHERE soonest IS NOT NULL)
                 SELECT 'held'::text AS outcome, 0::bigint, 0, soonest, 0,
                        NULL::bigint, NULL::integer, NULL::bigint FROM refused
                 UNION ALL
                 SELECT g.outcome, g.fence, g.slot, g.expires_in_ms, g.semaphore_permits,
                        g.ticket, g.queue_position, g.cue
                 FROM {acquire_rw_fn}($1, $2, $3, $4, $5, NULL, NULL, NULL, NULL) g
                 WHERE NOT EXISTS (SELECT 1 FROM refused) AND EXISTS (SELECT 1 FROM durable_commit)"
            )),
            // A waiting reader-writer acquire's statement: the function
            // alone, for the reason `acquire_waiting` gives. The same
            // parameters, then $6 to $9 as `acquire_waiting`'s $5 to $8.
            acquire_rw_waiting: audited(format!(
                "WITH {DURABLE_COMMIT_CTE}
                 SELECT g.outcome, g.fence, g.slot, g.expires_in_ms, g.semaphore_permits,
                        g.ticket, g.queue_position, g.cue
                 FROM {acquire_rw_fn}($1, $2, $3, $4, $5, $6, $7, $8, $9) g
                 WHERE EXISTS (SELECT 1 FROM durable_commit)"
            )),
            // $1 name, $2 owner, $3 fence, $4 ttl ms. A lease granted on
            // another timeline (before a promotion) is not renewed: lost.
            renew: audited(format!(
                "WITH {DURABLE_COMMIT_CTE}
                 UPDATE {locks} SET expires_at = {NOW_MS} + $4
                 WHERE name = $1 AND owner = $2 AND fence = $3 AND expires_at > {NOW_MS}
                   AND epoch = {TIMELINE} AND EXISTS (SELECT 1 FROM durable_commit)"
            )),
            // Every grant of a batch, as `renew` and `renew_permit` would,
            // in one statement: $1 a JSON array of {i, name, slot (null for
            // a lock), owner, fence, ttl}, no row twice; answers the `i` of
            // each renewed. It never waits for a row lock: it locks its
            // rows in order and skips those another transaction holds
            // (which the core then renews alone), so no batch deadlocks
            // with another, a purge or an acquire, nor waits on one.
            renew_batch: audited(format!(
                "WITH {DURABLE_COMMIT_CTE},
                 batch AS (
                     SELECT * FROM jsonb_to_recordset($1::jsonb)
                         AS b(i int4, name text, slot int4, owner text, fence int8, ttl int8)
                 ),
                 clock AS (SELECT {NOW_MS} AS now_ms, {TIMELINE} AS timeline),
                 own_locks AS (
                     SELECT l.name, b.i, b.ttl FROM {locks} l
                       JOIN batch b ON b.slot IS NULL AND l.name = b.name
                                   AND l.owner = b.owner AND l.fence = b.fence
                     ORDER BY l.name FOR UPDATE OF l SKIP LOCKED
                 ),
                 locks_renewed AS (
                     UPDATE {locks} l SET expires_at = c.now_ms + o.ttl
                       FROM own_locks o, clock c
                     WHERE l.name = o.name AND l.expires_at > c.now_ms
                       AND l.epoch = c.timeline AND EXISTS (SELECT 1 FROM durable_commit)
                     RETURNING o.i
                 ),
                 own_permits AS (
                     SELECT p.name, p.slot, b.i, b.ttl FROM {permits} p
                       JOIN batch b ON b.slot IS NOT NULL AND p.name = b.name
                                   AND p.slot = b.slot AND p.owner = b.owner
                                   AND p.fence = b.fence
                     ORDER BY p.name, p.slot FOR UPDATE OF p SKIP LOCKED
                 ),
                 permits_renewed AS (
                     UPDATE {permits} p SET expires_at = c.now_ms + o.ttl
                       FROM own_permits o, clock c
                     WHERE p.name = o.name AND p.slot = o.slot AND p.expires_at > c.now_ms
                       AND p.epoch = c.timeline AND EXISTS (SELECT 1 FROM durable_commit)
                     RETURNING o.i
                 )
                 SELECT i FROM locks_renewed UNION ALL SELECT i FROM permits_renewed"
            )),
            // $1 name, $2 slot, $3 owner, $4 fence, $5 ttl ms.
            renew_permit: audited(format!(
                "WITH {DURABLE_COMMIT_CTE}
                 UPDATE {permits} SET expires_at = {NOW_MS} + $5
                 WHERE name = $1 AND slot = $2 AND owner = $3 AND fence = $4
                   AND expires_at > {NOW_MS} AND epoch = {TIMELINE}
                   AND EXISTS (SELECT 1 FROM durable_commit)"
            )),
            // As `release`, of a permit: $1 name, $2 slot, $3 owner, $4
            // fence, $5 channel, $6 store tag.
            release_permit: audited(format!(
                "WITH {ASYNC_COMMIT_CTE},
                 gone AS (
                     DELETE FROM {permits} WHERE name = $1 AND slot = $2 AND owner = $3 AND fence = $4
                       AND EXISTS (SELECT 1 FROM async_commit)
                     RETURNING name
                 )
                 SELECT count(pg_notify($5, $6 || ':' || gone.name)::text) FROM gone"
            )),
            // The release notifies waiters in the same statement; NOTIFY is
            // delivered when it commits. The payload is "<store tag>:<name>",
            // so a store's listener can skip its own releases (it woke its
            // own waiters directly). It commits without waiting for the WAL
            // flush (`ASYNC_COMMIT_CTE`). $1 name, $2 owner, $3 fence, $4
            // channel, $5 store tag.
            release: audited(format!(
                "WITH {ASYNC_COMMIT_CTE},
                 gone AS (
                     DELETE FROM {locks} WHERE name = $1 AND owner = $2 AND fence = $3
                       AND EXISTS (SELECT 1 FROM async_commit)
                     RETURNING name
                 )
                 SELECT count(pg_notify($4, $5 || ':' || gone.name)::text) FROM gone"
            )),
            // $1 name.
            holder: audited(format!(
                "SELECT owner, fence, expires_at - {NOW_MS} FROM {locks}
                 WHERE name = $1 AND expires_at > {NOW_MS}"
            )),
            // $1 prefix, $2 the name to start after ('' from the first), $3
            // page size. Answers name, owner, fence, time left, slot and
            // permits (NULL for a lock), in name and slot order (a waiting
            // writer's intent is no grant: not listed): the first
            // $3 live rows of both tables (each read in key order, $3 at
            // most), then every live permit of the last one's name, so that
            // a page never splits a semaphore. Names compare as bytes
            // (COLLATE "C"), whatever the database's collation;
            // `starts_with` matches the prefix literally, unlike LIKE. One
            // snapshot for the page.
            list: audited(format!(
                "WITH clock AS (SELECT {NOW_MS} AS now_ms),
                 locks AS (
                     SELECT l.name, NULL::integer AS slot, NULL::integer AS permits,
                            l.owner, l.fence, l.expires_at
                     FROM {locks} l, clock c
                     WHERE starts_with(l.name, $1) AND l.name COLLATE \"C\" > $2
                       AND l.expires_at > c.now_ms
                     ORDER BY l.name COLLATE \"C\" LIMIT $3
                 ),
                 first_permits AS (
                     SELECT p.name, p.slot FROM {permits} p, clock c
                     WHERE starts_with(p.name, $1) AND p.name COLLATE \"C\" > $2
                       AND p.expires_at > c.now_ms AND p.slot <> {INTENT_SLOT}
                     ORDER BY p.name COLLATE \"C\", p.slot LIMIT $3
                 ),
                 page AS (
                     SELECT u.name FROM (SELECT name, slot FROM locks
                                         UNION ALL SELECT name, slot FROM first_permits) u
                     ORDER BY u.name COLLATE \"C\", u.slot NULLS FIRST LIMIT $3
                 ),
                 last AS (SELECT max(name COLLATE \"C\") AS name FROM page)
                 SELECT r.name, r.owner, r.fence, r.expires_at - c.now_ms, r.slot, r.permits
                 FROM (SELECT * FROM locks
                       UNION ALL
                       SELECT p.name, p.slot, p.permits, p.owner, p.fence, p.expires_at
                       FROM {permits} p, clock c
                       WHERE starts_with(p.name, $1) AND p.name COLLATE \"C\" > $2
                         AND p.expires_at > c.now_ms AND p.slot <> {INTENT_SLOT}) r, clock c
                 WHERE r.name COLLATE \"C\" <= (SELECT name FROM last)
                 ORDER BY r.name COLLATE \"C\", r.slot NULLS FIRST"
            )),
            // $1 name, $2 channel, $3 store tag, $4 the fence or NULL. Removes
            // the live lock (of that fence, when one is given), or the live
            // permit of that fence (fences are unique in the schema: one row
            // at most), answers it, and notifies waiters as a release does.
            // Durable (the operator is told the name is free; a crash must
            // not bring the grant back).
            force_release: audited(format!(
                "WITH {DURABLE_COMMIT_CTE},
                 gone_lock AS (
                     DELETE FROM {locks} WHERE name = $1 AND expires_at > {NOW_MS}
                       AND ($4::bigint IS NULL OR fence = $4)
                       AND EXISTS (SELECT 1 FROM durable_commit)
                     RETURNING owner, fence, expires_at
                 ),
                 gone_permit AS (
                     DELETE FROM {permits} WHERE name = $1 AND expires_at > {NOW_MS}
                       AND fence = $4 AND EXISTS (SELECT 1 FROM durable_commit)
                     RETURNING owner, fence, expires_at
                 ),
                 gone AS (SELECT * FROM gone_lock UNION ALL SELECT * FROM gone_permit)
                 SELECT owner, fence, expires_at - {NOW_MS}, pg_notify($2, $3 || ':' || $1)::text
                 FROM gone"
            )),
            // Before a raise, in its transaction: no grant locks a row or
            // writes while the raise retires every row (grants wait, then
            // see the raise whole; plain reads go on). EXCLUSIVE, not less:
            // a row lock a grant took (`FOR UPDATE`, which SHARE ROW
            // EXCLUSIVE lets through) would make the raise's own statement
            // wait, after its sequence moved. So the raise waits only here,
            // before anything is raised: a deadlock with a grant (which may
            // hold one table and want the other) rolls the raise back having
            // done nothing, or the grant, which runs again.
            lock_for_raise: audited(format!(
                "LOCK TABLE {locks}, {permits} IN EXCLUSIVE MODE"
            )),
            // $1 how far. Raises the sequence, durably (nextval and setval
            // give the transaction an id, so its commit flushes), and
            // retires every row granted before (epoch -1, no timeline's);
            // answers the lowest fence a later grant can get, and how many
            // fences were left. Past `MAX_FENCE`, nothing is set or retired
            // and the first column is NULL. Grants drawing between the
            // nextval and the setval could outrun a raise smaller than they
            // are many: the core asks at least 2^20.
            raise_fences: audited(format!(
                "WITH {DURABLE_COMMIT_CTE},
                 drawn AS (SELECT nextval({fences_regclass}::regclass) AS n,
                                  {TIMELINE} * {TIMELINE_STEP} AS base
                           FROM durable_commit),
                 room AS (SELECT n, base, greatest({max} - base - n, 0) AS left_over,
                                 {max} - base - n > $1 AS fits FROM drawn),
                 retired_locks AS (UPDATE {locks} SET epoch = -1
                                   WHERE epoch <> -1 AND (SELECT fits FROM room) RETURNING 1),
                 retired_permits AS (UPDATE {permits} SET epoch = -1
                                     WHERE epoch <> -1 AND (SELECT fits FROM room) RETURNING 1)
                 SELECT CASE WHEN fits THEN setval({fences_regclass}::regclass, n + $1) + 1 + base END,
                        left_over
                 FROM room",
                max = fence_to_sql(MAX_FENCE)
            )),
            // Each table's expired rows, one statement (and transaction)
            // each, so that a purge never holds rows of both tables (grants
            // lock a name's row in `locks` before its rows in `permits`).
            // Commits without waiting for the WAL flush, as a release does.
            purge: [locks.as_str(), permits.as_str()].map(|table| {
                audited(format!(
                    "WITH {ASYNC_COMMIT_CTE}
                     DELETE FROM {table}
                     WHERE expires_at <= {NOW_MS} AND EXISTS (SELECT 1 FROM async_commit)"
                ))
            }),
            // Lapsed tickets (waiters gone without leaving): no grant, so
            // not counted.
            // Rows an acquire holds are skipped, not waited for (it may
            // hold several of one name, in another order).
            purge_tickets: audited(format!(
                "WITH {ASYNC_COMMIT_CTE},
                 lapsed AS (
                     SELECT name, ticket FROM {tickets}
                     WHERE expires_at <= {NOW_MS} AND EXISTS (SELECT 1 FROM async_commit)
                     FOR UPDATE SKIP LOCKED
                 )
                 DELETE FROM {tickets} t USING lapsed
                 WHERE t.name = lapsed.name AND t.ticket = lapsed.ticket"
            )),
            // A waiter that stops waiting ungranted: its live ticket
            // lapsed at once (expiry 0, which no renewal gives: an attempt
            // of the call still on its way then draws no new ticket; a
            // later draw or purge deletes it), and the waiter behind it, in
            // any process, told by the ticket's number ("<store
            // tag>#<ticket>:<name>"). A lost leave is harmless: the ticket
            // lapses. $1 name, $2 ticket, $3 channel, $4 store tag.
            leave_queue: audited(format!(
                "WITH {ASYNC_COMMIT_CTE},
                 gone AS (
                     UPDATE {tickets} SET expires_at = 0 WHERE name = $1 AND ticket = $2
                       AND expires_at > {NOW_MS} AND EXISTS (SELECT 1 FROM async_commit)
                     RETURNING ticket
                 )
                 SELECT count(pg_notify($3, $4 || '#' || gone.ticket || ':' || $1)::text) FROM gone"
            )),
            // $1 name: its live tickets, oldest first.
            waiters: audited(format!(
                "SELECT ticket, owner, kind, expires_at - {NOW_MS}, {NOW_MS} - since FROM {tickets}
                 WHERE name = $1 AND expires_at > {NOW_MS} ORDER BY ticket"
            )),
        }
    }
}

/// A tag no other store shares: process id, a counter, and the clock.
fn store_tag() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{}.{n}.{nanos}", std::process::id())
}

/// An acquire's statement and its bound on lock waits: a waiting call (in
/// the queue, or with a `bound`) runs `waiting`, which bounds every lock
/// wait, the table's included, by the wait left in ms — truncated, as
/// every dialect's; the function bounds each lock wait by at least 1 ms (0
/// is still a bound; NULL, a wait with no end, is none) — and `try_` runs
/// `plain`, which may refuse without calling the function.
fn by_standing(
    queue: Queue,
    bound: Option<Instant>,
    plain: &SqlStr,
    waiting: &SqlStr,
) -> (SqlStr, Option<i32>, bool) {
    let wait_ms = bound.map(|bound| i32::try_from(lock_wait_ms(bound)).unwrap_or(i32::MAX));
    match (queue, bound) {
        (Queue::Never, None) => (plain.clone(), None, false),
        _ => (waiting.clone(), wait_ms, true),
    }
}

/// A ticket as the `tickets` table stores it (drawn from a `bigint`
/// sequence, so every ticket this engine hands out fits).
fn ticket_to_sql(ticket: u64) -> i64 {
    i64::try_from(ticket).unwrap_or(i64::MAX)
}

/// A grant's slot as the `permits` table stores it (`integer`): a permit's
/// or a reader's is below `MAX_PERMITS`, the writer's is
/// [`WRITER_SLOT`]: it fits.
fn slot_to_sql(slot: i64) -> i32 {
    i32::try_from(slot).unwrap_or(i32::MAX)
}

/// Each operation's statement with its binds, `$1`, `$2`, … in order,
/// sent by the store's [`Protocol`].
impl alkstore_sqlx::Statements for Statements {
    type Dialect = crate::connection::Postgres;

    /// READ COMMITTED pinned for the session, where the session is the
    /// store's own; behind a pooler in transaction mode each statement sets
    /// it for its own transaction instead.
    fn setup(&self) -> Option<alkstore_sqlx::Setup<Self::Dialect>> {
        match self.protocol {
            Protocol::Prepared => Some(std::sync::Arc::new(|conn: &mut PgConnection| {
                Box::pin(async move {
                    sqlx::raw_sql(SESSION_READ_COMMITTED)
                        .execute(conn)
                        .await
                        .map(drop)
                })
            })),
            Protocol::Simple => None,
        }
    }

    fn queues(&self) -> bool {
        true
    }

    fn acquire<'c>(
        &self,
        conn: &'c mut PgConnection,
        name: &str,
        owner: &str,
        ttl: LeaseMillis,
        queue: Queue,
        bound: Option<Instant>,
    ) -> StatementFuture<'c, Option<AcquireRow>> {
        let (statement, wait_ms, waiting) =
            by_standing(queue, bound, &self.acquire, &self.acquire_waiting);
        let call = Call::new(statement)
            .text(name)
            .text(owner)
            .int8(ttl.as_i64())
            .int4(wait_ms);
        let call = self.standing(call, queue, waiting);
        self.fetch_optional(conn, call)
    }

    fn acquire_permit<'c>(
        &self,
        conn: &'c mut PgConnection,
        name: &str,
        permits: u32,
        owner: &str,
        ttl: LeaseMillis,
        queue: Queue,
        bound: Option<Instant>,
    ) -> StatementFuture<'c, Option<PermitRow>> {
        let (statement, wait_ms, waiting) = by_standing(
            queue,
            bound,
            &self.acquire_permit,
            &self.acquire_permit_waiting,
        );
        let call = Call::new(statement)
            .text(name)
            // At most MAX_PERMITS (validated by the core), so it fits.
            .int4(i32::try_from(permits).unwrap_or(i32::MAX))
            .text(owner)
            .int8(ttl.as_i64())
            .int4(wait_ms);
        let call = self.standing(call, queue, waiting);
        self.fetch_optional(conn, call)
    }

    fn acquire_rw<'c>(
        &self,
        conn: &'c mut PgConnection,
        name: &str,
        mode: RwMode,
        owner: &str,
        ttl: LeaseMillis,
        queue: Queue,
        bound: Option<Instant>,
    ) -> StatementFuture<'c, Option<RwRow>> {
        let (statement, wait_ms, waiting) =
            by_standing(queue, bound, &self.acquire_rw, &self.acquire_rw_waiting);
        let call = Call::new(statement)
            .text(name)
            .boolean(mode == RwMode::Write)
            .text(owner)
            .int8(ttl.as_i64())
            .int4(wait_ms);
        let call = self.standing(call, queue, waiting);
        self.fetch_optional(conn, call)
    }

    fn leave_queue<'c>(
        &self,
        conn: &'c mut PgConnection,
        name: &str,
        ticket: i64,
    ) -> StatementFuture<'c, u64> {
        let call = Call::new(self.leave_queue.clone())
            .text(name)
            .int8(ticket)
            .text(&self.channel)
            .text(&self.tag);
        self.fetch_count(conn, call)
    }

    fn waiters<'c>(
        &self,
        conn: &'c mut PgConnection,
        name: &str,
    ) -> StatementFuture<'c, Vec<WaiterRow>> {
        self.fetch_all(conn, Call::new(self.waiters.clone()).text(name))
    }

    fn renew<'c>(
        &self,
        conn: &'c mut PgConnection,
        grant: &GrantKey,
        ttl: LeaseMillis,
    ) -> StatementFuture<'c, u64> {
        let call = match grant.row_slot() {
            None => Call::new(self.renew.clone())
                .text(&grant.name)
                .text(&grant.owner)
                .int8(fence_to_sql(grant.fence))
                .int8(ttl.as_i64()),
            Some(slot) => Call::new(self.renew_permit.clone())
                .text(&grant.name)
                .int4(slot_to_sql(slot))
                .text(&grant.owner)
                .int8(fence_to_sql(grant.fence))
                .int8(ttl.as_i64()),
        };
        Box::pin(self.protocol.execute(call, conn))
    }

    fn batches_renewals(&self) -> bool {
        true
    }

    fn renew_batch<'c>(
        &self,
        conn: &'c mut PgConnection,
        batch: &[(GrantKey, LeaseMillis)],
    ) -> StatementFuture<'c, Vec<usize>> {
        let grants: Vec<serde_json::Value> = batch
            .iter()
            .enumerate()
            .map(|(i, (grant, ttl))| {
                serde_json::json!({
                    "i": i,
                    "name": grant.name,
                    "slot": grant.row_slot().map(slot_to_sql),
                    "owner": grant.owner,
                    "fence": fence_to_sql(grant.fence),
                    "ttl": ttl.as_i64(),
                })
            })
            .collect();
        let call =
            Call::new(self.renew_batch.clone()).text(&serde_json::Value::from(grants).to_string());
        let renewed = self.fetch_all::<(i32,)>(conn, call);
        Box::pin(async move {
            Ok(renewed
                .await?
                .into_iter()
                .filter_map(|(i,)| usize::try_from(i).ok())
                .collect())
        })
    }

    fn release<'c>(
        &self,
        conn: &'c mut PgConnection,
        grant: &GrantKey,
    ) -> StatementFuture<'c, u64> {
        let call = match grant.row_slot() {
            None => Call::new(self.release.clone())
                .text(&grant.name)
                .text(&grant.owner)
                .int8(fence_to_sql(grant.fence)),
            Some(slot) => Call::new(self.release_permit.clone())
                .text(&grant.name)
                .int4(slot_to_sql(slot))
                .text(&grant.owner)
                .int8(fence_to_sql(grant.fence)),
        }
        .text(&self.channel)
        .text(&self.tag);
        self.fetch_count(conn, call)
    }

    fn holder<'c>(
        &self,
        conn: &'c mut PgConnection,
        name: &str,
    ) -> StatementFuture<'c, Option<HolderRow>> {
        self.fetch_optional(conn, Call::new(self.holder.clone()).text(name))
    }

    fn list<'c>(
        &self,
        conn: &'c mut PgConnection,
        prefix: &str,
        after: &str,
        limit: i64,
    ) -> StatementFuture<'c, Vec<ListedRow>> {
        let call = Call::new(self.list.clone())
            .text(prefix)
            .text(after)
            .int8(limit);
        self.fetch_all(conn, call)
    }

    fn force_release<'c>(
        &self,
        conn: &'c mut PgConnection,
        name: &str,
        fence: Option<i64>,
    ) -> StatementFuture<'c, Option<HolderRow>> {
        let call = Call::new(self.force_release.clone())
            .text(name)
            .text(&self.channel)
            .text(&self.tag)
            .int8(fence);
        // The fourth column is the notification's (empty) result.
        let removed = self.fetch_optional::<(String, i64, i64, Option<String>)>(conn, call);
        Box::pin(async move {
            Ok(removed
                .await?
                .map(|(owner, fence, left, _)| (owner, fence, left)))
        })
    }

    /// Three statements on the one connection: `locks`, then `permits`
    /// (counted), then lapsed tickets (not: no grant).
    fn purge<'c>(&self, conn: &'c mut PgConnection) -> StatementFuture<'c, u64> {
        let [locks, permits] = self.purge.clone().map(Call::new);
        let tickets = Call::new(self.purge_tickets.clone());
        let protocol = self.protocol;
        Box::pin(async move {
            let purged = protocol.execute(locks, &mut *conn).await?
                + protocol.execute(permits, &mut *conn).await?;
            protocol.execute(tickets, conn).await?;
            Ok(purged)
        })
    }

    /// One transaction: both tables locked against grants' writes, then
    /// the raise and the retirement in one statement.
    fn raise_fences<'c>(&self, conn: &'c mut PgConnection, by: i64) -> StatementFuture<'c, i64> {
        let lock = Call::new(self.lock_for_raise.clone()).in_transaction();
        let raise = Call::new(self.raise_fences.clone())
            .int8(by)
            .in_transaction();
        let protocol = self.protocol;
        Box::pin(async move {
            let mut tx = sqlx::Connection::begin(conn).await?;
            // The transaction's first statement: its isolation level.
            sqlx::raw_sql(READ_COMMITTED).execute(&mut *tx).await?;
            protocol.execute(lock, &mut *tx).await?;
            let row = protocol
                .fetch_optional(raise, &mut *tx)
                .await?
                .ok_or(sqlx::Error::RowNotFound)?;
            match row_as::<_, (Option<i64>, i64)>(row)? {
                (Some(next), _) => {
                    tx.commit().await?;
                    Ok(next)
                }
                (None, left) => Err(alkstore_sqlx::no_fence_left(fence_from_sql(left))),
            }
        })
    }
}

impl Statements {
    /// A waiting statement's last binds: the attempt's ticket and its
    /// lease (`NULL`: none yet; not queued), and where its leaving is told.
    /// A `try_` statement takes none.
    fn standing(&self, call: Call, queue: Queue, waiting: bool) -> Call {
        if !waiting {
            return call;
        }
        let ticket = match queue {
            Queue::Waiting { ticket, .. } => ticket.map(ticket_to_sql),
            Queue::Never => None,
        };
        call.int8(ticket)
            .int8(queue.lease().map(LeaseMillis::as_i64))
            .text(&self.channel)
            .text(&self.tag)
    }

    /// Runs `call` by the store's protocol; its first row read as `T`.
    fn fetch_optional<'c, T>(
        &self,
        conn: &'c mut PgConnection,
        call: Call,
    ) -> StatementFuture<'c, Option<T>>
    where
        T: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> + Send + 'c,
    {
        let protocol = self.protocol;
        Box::pin(async move {
            protocol
                .fetch_optional(call, conn)
                .await?
                .map(row_as)
                .transpose()
        })
    }

    /// Runs `call` by the store's protocol; every row read as `T`.
    fn fetch_all<'c, T>(
        &self,
        conn: &'c mut PgConnection,
        call: Call,
    ) -> StatementFuture<'c, Vec<T>>
    where
        T: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> + Send + 'c,
    {
        let protocol = self.protocol;
        Box::pin(async move {
            protocol
                .fetch_all(call, conn)
                .await?
                .into_iter()
                .map(row_as)
                .collect()
        })
    }

    /// Runs `call`, a statement answering one count (of the rows it
    /// removed, notifying for each), by the store's protocol.
    fn fetch_count<'c>(&self, conn: &'c mut PgConnection, call: Call) -> StatementFuture<'c, u64> {
        let counted = self.fetch_optional::<(i64,)>(conn, call);
        Box::pin(async move {
            let (count,) = counted.await?.ok_or(sqlx::Error::RowNotFound)?;
            Ok(count.unsigned_abs())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_doubles_inner_quotes() {
        assert_eq!(quote_ident("alkstore"), "\"alkstore\"");
        assert_eq!(
            quote_ident("a\"; DROP TABLE x; --"),
            "\"a\"\"; DROP TABLE x; --\""
        );
        assert_eq!(quote_literal("it's \\ here"), "E'it''s \\\\ here'");
    }

    #[test]
    fn each_schema_has_its_own_fence_lock_class() {
        assert_eq!(fence_lock_class("alkstore"), fence_lock_class("alkstore"));
        assert_ne!(fence_lock_class("alkstore"), fence_lock_class("alkstore2"));
        assert!(
            Statements::new("a", Protocol::Prepared)
                .create_acquire
                .as_str()
                .contains(&format!(
                    "pg_advisory_xact_lock({}, hashtext(p_name))",
                    fence_lock_class("a")
                ))
        );
    }

    #[test]
    fn the_dollar_tag_never_occurs_in_the_body() {
        assert_eq!(dollar_tag("plain"), "$alkstore$");
        let hostile = "x$alkstore$y$alkstorx$";
        let tag = dollar_tag(hostile);
        assert!(!hostile.contains(&tag), "{tag}");
        let statements = Statements::new("s$alkstore$; DROP SCHEMA public; --", Protocol::Prepared);
        assert!(statements.create_acquire.as_str().contains("$alkstorex$"));
    }
}
