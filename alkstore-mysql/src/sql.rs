//! Every SQL text of the MariaDB/MySQL engine, composed in this one place.
//!
//! The caller's database name is the only piece of text spliced into SQL,
//! and only through [`quote_ident`]; every value is a bound parameter,
//! but for a batch of renewals (sent as several statements, which take no
//! parameters): JSON of numbers and hex strings ([`renew_batch_text`]).

use std::time::Instant;

use alkstore_core::{
    GrantKey, INTENT_SLOT, LeaseMillis, MAX_FENCE, MAX_READERS, Queue, READ_WRITE_PERMITS, RwMode,
    WRITER_SLOT, fence_from_sql, fence_to_sql,
};
use alkstore_sqlx::{
    AcquireRow, HolderRow, ListedRow, MARKER_KEY, PermitRow, RwRow, StatementFuture, WaiterRow,
    audited, lock_wait_ms, row_as, text,
};
use sqlx::{MySqlConnection, SqlStr};

/// The layout version this crate writes and reads.
/// 1's acquire procedure rolled the caller's transaction back when it
/// refused to run inside one; 2's fences were the sequence's values alone,
/// which a promoted replica hands out again: both upgraded in place
/// (`UPGRADABLE`), since only the procedure changed (and a `meta` row is
/// added).
/// 3's answered the same owner's grant again by reading it back, which a
/// grant whose wait for a semi-sync replica's acknowledgement was cut short
/// (its connection killed) is too, on the primary only: upgraded in place.
/// 4 had no semaphores (`permits`, `acquire_permit`, and an acquire
/// procedure that refuses a name live permits hold): upgraded in place.
/// 5 had no reader-writer locks (`acquire_rw`; their rows live in
/// `permits`, marked with permits 0): upgraded in place.
/// 6's rows did not say which server granted them, so that a row a
/// promotion revived was given back to its owner with its old fence, below
/// fences the old primary had handed out since, and renewed: upgraded in
/// place (`epoch`, each row's set to the upgrading server's `server_id`).
/// 7 had no queues (8: `tickets` and `ticket_numbers`, and procedures
/// that grant waiting calls in turn): upgraded in place.
/// 8's permit and reader procedures let a caller pass a waiter of another
/// kind queued before it (9: one queue across kinds): upgraded in place.
pub const SCHEMA_VERSION: i64 = 9;

/// Older layouts an opener upgrades in place, under the creation lock: the
/// procedures replaced (`CREATE OR REPLACE`), what is missing created, the
/// version recorded.
pub(crate) const UPGRADABLE: std::ops::RangeInclusive<i64> = 1..=8;

/// The `meta` key the acquire procedure counts up to confirm the same
/// owner's grant with a write of its own: a change that goes into the binary
/// log, so that its commit waits for a semi-sync replica (a write that
/// changes nothing would log nothing under row-based logging).
pub(crate) const CONFIRMATIONS_KEY: &str = "same_owner_confirmations";

/// The `meta` key holding the `server_id` of the server that drew the last
/// fence: a grant on another server (a promoted replica, a switchover) first
/// raises the sequence by [`PROMOTION_GAP`].
pub(crate) const DRAWN_BY_KEY: &str = "fences_drawn_by";

/// The `meta` key holding the epoch: a count raised by each change of the
/// server that draws fences (a promotion) and by each fence raise. A row
/// records the epoch that granted it; a row of an older epoch is not
/// renewed, and its owner's ask takes it over with a new fence. A count,
/// not a `server_id`: a server promoted back (a failback) starts a new
/// epoch too.
pub(crate) const EPOCH_KEY: &str = "epoch";

/// How far the sequence is raised when fences start being drawn on another
/// server: 2^32, above any number of grants an old primary can have handed
/// out that its replica never received.
pub(crate) const PROMOTION_GAP: i64 = 1 << 32;

/// The `meta` key that records whether alkstore created the database itself
/// (1) or found it (0): only a database it created is ever dropped.
pub(crate) const CREATED_DATABASE_KEY: &str = "created_database";

/// The `meta` key recorded once the `fences` sequence exists: from then on,
/// a missing sequence was dropped after fences were handed out.
pub(crate) const FENCES_CREATED_KEY: &str = "fences_created";

/// An expiry no row has: what `LEAST` is given for a grant that is not
/// there (MariaDB's `LEAST` answers NULL when any argument is NULL).
const NEVER: i64 = i64::MAX;

/// The widest name or owner, in bytes (`alkstore_core::MAX_NAME_BYTES`).
const TEXT_BYTES: usize = alkstore_core::MAX_NAME_BYTES;

/// The server's clock in whole Unix milliseconds, truncated (floor).
/// `UTC_TIMESTAMP(3)` is fixed for the statement (every decision in one
/// statement sees one instant, no earlier than the request's arrival) and
/// depends on no session time zone; counting from the epoch with
/// `TIMESTAMPDIFF` has no 2038 limit (`UNIX_TIMESTAMP(datetime)` answers
/// NULL past 2038-01-19 before MariaDB 11.5).
const NOW_MS: &str =
    "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)";

/// Where a batch of renewals goes in `Statements::renew_batch`'s text.
const BATCH_MARKER: &str = "<alkstore batch>";

/// `template` with `batch` spliced in at [`BATCH_MARKER`]: a JSON array of
/// `{i, name, in_permits, slot, owner, fence, ttl}` — `i` its position in
/// `batch`, name and owner as hex (no quote, backslash or character set
/// can reach the SQL text), `in_permits` 1 for a row of `permits` (a
/// permit, a reader's, a writer's) and 0 for a lock's — in key order
/// (name, then slot), so that every batch locks its rows in one order.
fn renew_batch_text(template: &str, batch: &[(GrantKey, LeaseMillis)]) -> SqlStr {
    let hex = |text: &str| -> String { text.bytes().map(|b| format!("{b:02X}")).collect() };
    let mut order: Vec<usize> = (0..batch.len()).collect();
    order.sort_by(|&a, &b| {
        let key = |at: usize| (batch[at].0.name.as_bytes(), batch[at].0.row_slot());
        key(a).cmp(&key(b))
    });
    let entries: Vec<String> = order
        .into_iter()
        .map(|i| {
            let (grant, ttl) = &batch[i];
            format!(
                r#"{{"i":{i},"name":"{}","in_permits":{},"slot":{},"owner":"{}","fence":{},"ttl":{}}}"#,
                hex(&grant.name),
                u8::from(grant.row_slot().is_some()),
                grant.row_slot().unwrap_or(0),
                hex(&grant.owner),
                fence_to_sql(grant.fence),
                ttl.as_i64()
            )
        })
        .collect();
    audited(template.replacen(BATCH_MARKER, &format!("[{}]", entries.join(",")), 1))
}

/// Run once on each new connection of the store: what the statements rely
/// on, whatever the server's or the role's defaults say. Autocommit on and
/// no chained transactions, so that a renewal or a release answered is a
/// renewal or a release committed; READ COMMITTED, so that the plain reads
/// never see another transaction's uncommitted row; `GROUP_CONCAT` long
/// enough for a batch of renewals' 500 positions (MySQL 8 and a lowered
/// server default cut it at 1024 bytes).
pub(crate) const SESSION_SETTINGS: &str =
    "SET SESSION autocommit = 1, SESSION completion_type = 'NO_CHAIN',
         SESSION group_concat_max_len = 1048576;
     SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED";

/// Inside the acquire procedure, before each statement that may wait for
/// a lock: with a wait, bound InnoDB's row-lock waits and the server's
/// metadata-lock waits to the whole seconds left until `wait_until` (under
/// one second, no wait at all). Past it the server raises 1205.
const BOUND_WAITS: &str = "IF wait_until IS NOT NULL THEN
            SET SESSION innodb_lock_wait_timeout =
                    GREATEST(0, TIMESTAMPDIFF(SECOND, SYSDATE(6), wait_until)),
                SESSION lock_wait_timeout =
                    GREATEST(0, TIMESTAMPDIFF(SECOND, SYSDATE(6), wait_until));
        END IF;";

/// Inside the acquire procedure: the session's own lock-wait settings back
/// (only [`BOUND_WAITS`] changed them, and only with a wait).
const RESTORE_WAITS: &str = "IF wait_until IS NOT NULL THEN
            SET SESSION innodb_lock_wait_timeout = saved_row_wait,
                SESSION lock_wait_timeout = saved_metadata_wait;
        END IF;";

/// How both acquire procedures begin (`procedure` names the refusal): a
/// call inside an open transaction is refused — outside the block with the
/// handlers, so that refusing does not roll the caller's transaction back —
/// then the clock and the wait bound are fixed, and the session's own wait
/// settings kept to be put back ([`RESTORE_WAITS`]).
fn procedure_opening(procedure: &str) -> String {
    format!(
        "MODIFIES SQL DATA
BEGIN
    IF @@in_transaction THEN
        SIGNAL SQLSTATE '25000'
            SET MESSAGE_TEXT = 'alkstore: {procedure} called inside an open transaction';
    END IF;
    BEGIN
        DECLARE now_ms BIGINT DEFAULT {NOW_MS};
        DECLARE wait_until DATETIME(6) DEFAULT SYSDATE(6) + INTERVAL p_wait_ms * 1000 MICROSECOND;
        DECLARE saved_row_wait BIGINT DEFAULT @@SESSION.innodb_lock_wait_timeout;
        DECLARE saved_metadata_wait BIGINT DEFAULT @@SESSION.lock_wait_timeout;
"
    )
}

/// Both acquire procedures' handlers (after their declarations): a
/// duplicate key is noted (`duplicate`, the insert that met another's), and
/// any other error rolls back, puts the session's waits back, and is raised
/// again.
fn procedure_handlers() -> String {
    format!(
        "DECLARE CONTINUE HANDLER FOR 1062 SET duplicate = TRUE;
        DECLARE EXIT HANDLER FOR SQLEXCEPTION
        BEGIN
            ROLLBACK;
            {RESTORE_WAITS}
            RESIGNAL;
        END;"
    )
}

/// Quotes an identifier: wrapped in backticks, inner backticks doubled. Safe
/// for any text without NUL (validated before).
pub(crate) fn quote_ident(ident: &str) -> String {
    format!("`{}`", ident.replace('`', "``"))
}

/// Whether the database exists and which of alkstore's objects it holds
/// (bind the database name to each of the eight `?`).
pub(crate) const INSPECT: &str = "
SELECT EXISTS (SELECT 1 FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?),
       EXISTS (SELECT 1 FROM information_schema.TABLES
               WHERE TABLE_SCHEMA = ? AND TABLE_NAME = 'meta' AND TABLE_TYPE = 'BASE TABLE'),
       EXISTS (SELECT 1 FROM information_schema.TABLES
               WHERE TABLE_SCHEMA = ? AND TABLE_NAME = 'locks' AND TABLE_TYPE = 'BASE TABLE'),
       EXISTS (SELECT 1 FROM information_schema.TABLES
               WHERE TABLE_SCHEMA = ? AND TABLE_NAME = 'fences'),
       EXISTS (SELECT 1 FROM information_schema.ROUTINES
               WHERE ROUTINE_SCHEMA = ? AND ROUTINE_NAME = 'acquire' AND ROUTINE_TYPE = 'PROCEDURE')
         AND EXISTS (SELECT 1 FROM information_schema.ROUTINES
               WHERE ROUTINE_SCHEMA = ? AND ROUTINE_NAME = 'acquire_permit'
                 AND ROUTINE_TYPE = 'PROCEDURE')
         AND EXISTS (SELECT 1 FROM information_schema.ROUTINES
               WHERE ROUTINE_SCHEMA = ? AND ROUTINE_NAME = 'acquire_rw'
                 AND ROUTINE_TYPE = 'PROCEDURE'),
       EXISTS (SELECT 1 FROM information_schema.TABLES
               WHERE TABLE_SCHEMA = ? AND TABLE_NAME = 'permits' AND TABLE_TYPE = 'BASE TABLE')";

/// How many objects the database named `?` (bound four times) holds that
/// the asking role can see: tables and views, routines, events, triggers.
pub(crate) const COUNT_OBJECTS: &str = "
SELECT (SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = ?)
     + (SELECT COUNT(*) FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = ?)
     + (SELECT COUNT(*) FROM information_schema.EVENTS WHERE EVENT_SCHEMA = ?)
     + (SELECT COUNT(*) FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = ?)";

/// Whether the asking role holds `TRIGGER` and `EVENT` on the database named
/// `?`, globally or on the database itself (a grant on a pattern, or through
/// a role not set, does not count): only then does `information_schema`
/// show it every trigger and event there. One row of two flags.
pub(crate) const SEES_TRIGGERS_AND_EVENTS: &str = "
WITH me AS (
    SELECT CONCAT('''', SUBSTRING_INDEX(CURRENT_USER(), '@', 1), '''@''',
                  SUBSTRING_INDEX(CURRENT_USER(), '@', -1), '''') AS grantee
    UNION ALL SELECT CONCAT('''', CURRENT_ROLE(), '''') FROM DUAL WHERE CURRENT_ROLE() IS NOT NULL
),
held AS (
    SELECT PRIVILEGE_TYPE FROM information_schema.USER_PRIVILEGES
    WHERE GRANTEE IN (SELECT grantee FROM me)
    UNION ALL
    SELECT PRIVILEGE_TYPE FROM information_schema.SCHEMA_PRIVILEGES
    WHERE GRANTEE IN (SELECT grantee FROM me) AND TABLE_SCHEMA = ?
)
SELECT EXISTS (SELECT 1 FROM held WHERE PRIVILEGE_TYPE = 'TRIGGER'),
       EXISTS (SELECT 1 FROM held WHERE PRIVILEGE_TYPE = 'EVENT')";

/// How many triggers sit on alkstore's tables in the database named `?`:
/// someone else's, which dropping the tables would drop along.
pub(crate) const COUNT_TRIGGERS_ON_OURS: &str = "
SELECT COUNT(*) FROM information_schema.TRIGGERS
WHERE EVENT_OBJECT_SCHEMA = ? AND EVENT_OBJECT_TABLE IN ('locks', 'permits', 'tickets', 'meta')";

/// `alkstore doctor`: the durability and replication settings (`SHOW`
/// needs no privilege; a variable the server lacks, such as MySQL's
/// differently named semi-sync ones, is simply absent).
pub(crate) const DOCTOR_VARIABLES: &str = "SHOW GLOBAL VARIABLES WHERE Variable_name IN (
    'version', 'innodb_flush_log_at_trx_commit', 'innodb_doublewrite', 'sync_binlog', 'log_bin',
    'server_id', 'gtid_strict_mode', 'read_only', 'rpl_semi_sync_master_enabled',
    'rpl_semi_sync_master_wait_point', 'rpl_semi_sync_master_timeout',
    'rpl_semi_sync_master_wait_no_slave')";

/// `alkstore doctor`: whether semi-sync replication is in effect now (it
/// turns itself off after a timeout), how many semi-sync replicas are
/// connected, and whether this server replicates from another (a replica:
/// `Slaves_running` counts its running replication connections).
pub(crate) const DOCTOR_STATUS: &str = "SHOW GLOBAL STATUS WHERE Variable_name IN (
    'Rpl_semi_sync_master_status', 'Rpl_semi_sync_master_clients', 'Slaves_running')";

/// `alkstore doctor`: this session's TLS protocol and cipher (empty when
/// not encrypted).
pub(crate) const DOCTOR_TLS: &str =
    "SHOW SESSION STATUS WHERE Variable_name IN ('Ssl_version', 'Ssl_cipher')";

/// `alkstore doctor`: the `fences` sequence's next value that no
/// connection has cached yet, in `database` (read, not drawn).
pub(crate) fn doctor_next_fence(database: &str) -> SqlStr {
    audited(format!(
        "SELECT next_not_cached_value FROM {}.fences",
        quote_ident(database)
    ))
}

/// Takes the creation lock of the database named `?` (a session-level named
/// lock, released by [`UNLOCK_CREATION`] or when the session ends; the name
/// is lowercased, as servers with `lower_case_table_names` fold database
/// names, and hashed, as MySQL limits lock names to 64 characters). Answers
/// 1 when held.
pub(crate) const LOCK_CREATION: &str = "SELECT GET_LOCK(CONCAT('alkstore:', MD5(LOWER(?))), 60)";

/// Lets go of the creation lock of the database named `?`.
pub(crate) const UNLOCK_CREATION: &str = "SELECT RELEASE_LOCK(CONCAT('alkstore:', MD5(LOWER(?))))";

/// The statements of one store, composed once at open for its database.
/// Cloning one is a reference count, not a copy.
#[derive(Debug, Clone)]
pub(crate) struct Statements {
    pub(crate) create_database: SqlStr,
    /// Without and with `created_database` set.
    pub(crate) create_meta: [SqlStr; 2],
    pub(crate) create_locks: SqlStr,
    pub(crate) create_fences: SqlStr,
    pub(crate) create_permits: SqlStr,
    /// The queue's table and numbers, each made if missing.
    pub(crate) create_tickets: [SqlStr; 2],
    pub(crate) create_acquire: SqlStr,
    pub(crate) create_acquire_permit: SqlStr,
    pub(crate) create_acquire_rw: SqlStr,
    pub(crate) record_fences: SqlStr,
    pub(crate) record_version: SqlStr,
    pub(crate) record_drawn_by: SqlStr,
    /// Layout 6 and older: the `epoch` columns, then each row's.
    pub(crate) add_epochs: [SqlStr; 2],
    pub(crate) set_epochs: [SqlStr; 2],
    pub(crate) read_meta: SqlStr,
    pub(crate) fences_created: SqlStr,
    pub(crate) drop_objects: [SqlStr; 9],
    pub(crate) drop_database: SqlStr,
    pub(crate) acquire: SqlStr,
    pub(crate) acquire_permit: SqlStr,
    pub(crate) acquire_rw: SqlStr,
    pub(crate) renew: SqlStr,
    pub(crate) renew_permit: SqlStr,
    /// Every grant of a batch renewed, as text with [`BATCH_MARKER`] where
    /// the batch goes ([`renew_batch_text`]).
    pub(crate) renew_batch: String,
    pub(crate) release: SqlStr,
    pub(crate) release_permit: SqlStr,
    pub(crate) holder: SqlStr,
    pub(crate) list: SqlStr,
    pub(crate) force_release: SqlStr,
    pub(crate) force_release_permit: SqlStr,
    /// Expired locks (not gates), expired permits, gates: answers the
    /// first two's counts.
    pub(crate) purge: [SqlStr; 3],
    /// Lapsed tickets (not counted: no grant).
    pub(crate) purge_tickets: SqlStr,
    pub(crate) leave_queue: SqlStr,
    pub(crate) waiters: SqlStr,
    pub(crate) next_fence: SqlStr,
    /// A fence raise's new epoch.
    pub(crate) new_epoch: SqlStr,
    /// `SELECT SETVAL(fences, ` — the rest is a number, written in by
    /// `raise_fences` (MariaDB's `SETVAL` takes a literal only, and never
    /// moves the sequence down).
    set_fences_prefix: String,
}

impl Statements {
    pub(crate) fn new(database: &str) -> Self {
        let db = quote_ident(database);
        let locks = format!("{db}.locks");
        let meta = format!("{db}.meta");
        let fences = format!("{db}.fences");
        let acquire_proc = format!("{db}.acquire");
        let permits = format!("{db}.permits");
        let acquire_permit_proc = format!("{db}.acquire_permit");
        let acquire_rw_proc = format!("{db}.acquire_rw");
        let tickets = format!("{db}.tickets");
        let ticket_numbers = format!("{db}.ticket_numbers");
        // The queue (fair waiting), read under the name's row lock (every
        // ticket of the name is written under it; a waiter that leaves
        // deletes its own): whether the attempt's own ticket is live and
        // owed the turn, whether any reader's is owed it, and what stands
        // ahead of the attempt — every live ticket older than its own
        // (every live one when it has none).
        let queue_variables = "        DECLARE q_mine BOOL;
        DECLARE q_owed BOOL;
        DECLARE q_owed_readers BOOL;
        DECLARE q_ahead BIGINT;
        DECLARE q_readers_ahead BIGINT;
        DECLARE q_permits_ahead BIGINT;
        DECLARE q_not_rw_ahead BIGINT;
        DECLARE q_writer_ahead BIGINT;
        DECLARE q_last BIGINT;
        DECLARE q_ticket BIGINT;
        DECLARE q_expires BIGINT;
";
        let read_the_line = format!(
            "            SELECT COALESCE(MAX(t.ticket = p_ticket), FALSE),
                   COALESCE(MAX(t.ticket = p_ticket AND t.owed), FALSE),
                   -- An owed reader behind a lock's or permit's waiter
                   -- holds no writer back (a ring otherwise).
                   COALESCE(MAX(t.kind = 'read' AND t.owed AND NOT EXISTS (
                       SELECT 1 FROM {tickets} o
                        WHERE o.name = p_name AND o.expires_at > now_ms
                          AND o.kind IN ('lock', 'permit') AND o.ticket < t.ticket)), FALSE),
                   MAX(IF(t.ticket = p_ticket, t.expires_at, NULL))
              INTO q_mine, q_owed, q_owed_readers, q_expires
              FROM {tickets} t WHERE t.name = p_name AND t.expires_at > now_ms;
            SELECT COUNT(*), COUNT(IF(kind = 'read', 1, NULL)),
                   COUNT(IF(kind = 'permit', 1, NULL)),
                   COUNT(IF(kind IN ('lock', 'permit'), 1, NULL)),
                   MIN(IF(kind = 'write', ticket, NULL)), MAX(ticket)
              INTO q_ahead, q_readers_ahead, q_permits_ahead, q_not_rw_ahead, q_writer_ahead,
                   q_last
              FROM {tickets}
             WHERE name = p_name AND expires_at > now_ms AND (NOT q_mine OR ticket < p_ticket);
"
        );
        // A plain (non-locking) look at the queue, before any lock. A
        // `try_` call refused by it (held, or anyone queued ahead) and a
        // waiting call whose ticket is live and not due for renewal
        // (`plain_enough`) are answered from plain reads, taking no lock
        // and writing nothing: most polls of a queued waiter, and every
        // `try_` call while a queue stands — which would otherwise take
        // the name's row lock from the waiter whose turn it is (lock waits
        // here are whole seconds: under one left, none at all). Anything
        // else (a ticket to draw or renew, a name that looks free in the
        // attempt's turn) goes on to the row lock, where the line is read
        // again.
        let read_the_line_plainly = format!(
            "{read_the_line}            SET q_ticket = IF(p_ticket_ms IS NULL, NULL, p_ticket);
"
        );
        let plain_enough = "(p_ticket_ms IS NULL
                      OR (q_mine AND q_expires - now_ms > p_ticket_ms * 3 DIV 4))";
        // A refusal under the name's row lock, ending the transaction: a
        // waiting call's (`p_ticket_ms` given) ticket renewed, or — none
        // live — a new one drawn at the back (the name's lapsed tickets
        // deleted first). `owed` (a reader's) is kept once set. Then
        // `queued` answers where it stands.
        let queue_up = |kind: &str, owed: &str| {
            format!(
                "IF p_ticket_ms IS NOT NULL THEN
                    {BOUND_WAITS}
                    IF q_mine THEN
                        -- Renewed once a quarter of its lease has passed,
                        -- or when it becomes owed: polls in between write
                        -- nothing. By the clock of this statement, after
                        -- the row lock's wait (`now_ms` is the call's
                        -- start). A waiter attempts again within its poll
                        -- ceiling, 50 ms, and at the latest half a lease
                        -- after this attempt began: a quarter of a lease
                        -- or more to spare.
                        IF q_expires - {NOW_MS} <= p_ticket_ms * 3 DIV 4
                           OR (({owed}) AND NOT q_owed) THEN
                            UPDATE {tickets} SET expires_at = {NOW_MS} + p_ticket_ms,
                                   owed = owed OR ({owed})
                             WHERE name = p_name AND ticket = p_ticket;
                        END IF;
                        SET q_ticket = p_ticket, q_owed = q_owed OR ({owed});
                    ELSEIF p_ticket IS NOT NULL AND EXISTS (
                        SELECT 1 FROM {tickets}
                         WHERE name = p_name AND ticket = p_ticket AND expires_at = 0) THEN
                        -- Its call left the queue (`leave_queue` marks the
                        -- ticket so) while this attempt was on its way: no
                        -- new place for a call that is gone.
                        SET q_ticket = NULL;
                    ELSE
                        DELETE FROM {tickets} WHERE name = p_name AND expires_at <= now_ms;
                        SET q_ticket = NEXTVAL({ticket_numbers});
                        INSERT INTO {tickets} (name, ticket, owner, kind, owed, expires_at,
                                               since)
                        VALUES (p_name, q_ticket, p_owner, {kind}, ({owed}),
                                {NOW_MS} + p_ticket_ms, {NOW_MS});
                        SET q_owed = ({owed});
                    END IF;
                END IF;
                -- Committed, not rolled back, also for a `try_` call: a
                -- gate this transaction inserted stays (rolled back, the
                -- inserts waiting on it would both go ahead and deadlock).
                COMMIT;
                {RESTORE_WAITS}"
            )
        };
        // A refusal's last columns: the ticket (NULL: not queued), how many
        // live tickets are ahead, and the cue — the ticket whose leaving it
        // waits for: the one just ahead; none for a reader owed its turn;
        // for another reader, the first writer ahead.
        let queued = |kind: &str| {
            format!(
                "q_ticket, q_ahead,
                       CASE WHEN {kind} = 'read' AND q_owed THEN NULL
                            WHEN {kind} = 'read' THEN COALESCE(q_writer_ahead, q_last)
                            ELSE q_last END"
            )
        };
        // A grant (or the owner's own grant given back) ends the attempt's
        // wait: its live ticket goes in the grant's transaction.
        let leave_the_line = format!(
            "IF q_mine THEN
                    {BOUND_WAITS}
                    DELETE FROM {tickets} WHERE name = p_name AND ticket = p_ticket;
                END IF;"
        );
        // Inside either procedure, under the name's row lock, before a
        // fence is drawn: fences drawn on another server than the last ones
        // (a promoted replica) first raise the sequence past every fence
        // the other may have handed out and not replicated. One grant does
        // it; the others wait for its row lock, then see it done. It also
        // starts a new epoch ([`EPOCH_KEY`]), and leaves the current one in
        // `current_epoch`, read under a shared lock held to the grant's
        // commit: a fence raise's new epoch waits for grants that read the
        // old one, and grants after it see the new one (a grant answered
        // after a raise is never born retired).
        let max = fence_to_sql(MAX_FENCE);
        let raise_after_promotion = format!(
            "SELECT MAX(value) INTO drawn_by FROM {meta} WHERE `key` = '{DRAWN_BY_KEY}';
            IF drawn_by IS NULL OR drawn_by <> @@server_id THEN
                UPDATE {meta} SET value = @@server_id
                 WHERE `key` = '{DRAWN_BY_KEY}' AND value <> @@server_id;
                IF ROW_COUNT() = 1 THEN
                    UPDATE {meta} SET value = value + 1 WHERE `key` = '{EPOCH_KEY}';
                    -- SETVAL takes a literal: the statement is made with the
                    -- number in it. A routine runs in its own database, so
                    -- `fences` needs no name spliced in.
                    -- Near the end of the fences, to the end (`MAX_FENCE`):
                    -- the grant's own draw then meets the sequence's end.
                    SET @alkstore_raise = CONCAT('DO SETVAL(fences, ',
                        LEAST(NEXTVAL({fences}), {max} - {PROMOTION_GAP}) + {PROMOTION_GAP}, ')');
                    PREPARE alkstore_raise FROM @alkstore_raise;
                    EXECUTE alkstore_raise;
                    DEALLOCATE PREPARE alkstore_raise;
                    SET @alkstore_raise = NULL;
                END IF;
            END IF;
            SELECT MAX(value) INTO current_epoch FROM {meta} WHERE `key` = '{EPOCH_KEY}'
              LOCK IN SHARE MODE;"
        );
        // The same owner's live grant of an older epoch (granted before a
        // promotion — a row the promotion revived, its release lost, or one
        // the old primary granted — or before a fence raise) is taken over
        // with a new fence and lease, under the row lock already held
        // (`table` names its table, `row` the condition that picks it): its
        // old fence may be below fences handed out since, and no renewal of
        // it is answered here. `answer` is the grant's answer.
        let refence_own = |table: &str, row: &str, answer: &str| {
            format!(
                "{raise_after_promotion}
                    IF held_epoch <> current_epoch THEN
                        UPDATE {table} SET fence = NEXTVAL({fences}),
                               expires_at = now_ms + p_ttl, epoch = current_epoch
                         WHERE {row};
                        {leave_the_line}
                        COMMIT;
                        {RESTORE_WAITS}
                        {answer};
                        LEAVE look;
                    END IF;"
            )
        };
        // The same owner's live grant is answered only once a write of ours
        // commits: its commit waits for a semi-sync replica, which then has
        // the grant too (the binary log is in order). Read back alone, the
        // row could be a grant whose wait for the replica was cut short (its
        // connection killed, the answer lost), on the primary only.
        let confirm_same_owner = format!(
            "INSERT INTO {meta} (`key`, value) VALUES ('{CONFIRMATIONS_KEY}', 1)
                        ON DUPLICATE KEY UPDATE value = value + 1;"
        );
        // The acquire procedure: one CALL, one round trip.
        //
        // 1. A plain (consistent, non-locking) read: someone else's live row
        //    answers "held" at once, and nothing is written or locked. The
        //    same owner's live row goes on to 2, where it is locked and
        //    confirmed by a write before it is answered.
        // 2. Otherwise one READ COMMITTED transaction, which draws a fence
        //    only while it holds the name's row lock: an expired row is
        //    locked (FOR UPDATE, waiting out a renewal, release or purge in
        //    flight) and taken over; a missing row is inserted (with fence 0)
        //    and then given its fence. Every earlier grant of the name drew
        //    its fence under the same row lock and committed before letting
        //    go of it, so the fence drawn here is above all of theirs: fences
        //    follow commit order. A semaphore's permits are granted under the
        //    same row lock (its "gate", below): with it held, live permits of
        //    the name refuse the lock, writing nothing.
        // 3. An insert that meets another transaction's insert of the name
        //    (duplicate key) rolls back at once — letting go of the shared
        //    lock the duplicate check took, so two losers cannot deadlock
        //    upgrading it — and looks again from 1.
        //
        // `p_wait_ms`, when given, fixes `wait_until` once; before each
        // statement that may wait for a lock (row locks, and metadata locks
        // behind DDL or LOCK TABLES), the waits are bounded by the whole
        // seconds left until it (both settings count whole seconds; under one
        // second, no wait at all), and the session's settings are restored
        // afterwards. Past it the server raises 1205, the transaction rolls
        // back, and a waiting acquire reports "held" having drawn no fence.
        // The procedure refuses to run inside an open transaction, whose
        // COMMIT would be the caller's.
        let (opening, handlers) = (procedure_opening("acquire"), procedure_handlers());
        let refence_own_lock = refence_own(
            &locks,
            "name = p_name",
            &format!("SELECT TRUE, LASTVAL({fences}), p_ttl, NULL, NULL, NULL, NULL"),
        );
        let queue_up_lock = queue_up("'lock'", "FALSE");
        let queued_lock = queued("'lock'");
        let create_acquire = format!(
            "CREATE OR REPLACE PROCEDURE {acquire_proc}(p_name VARBINARY({TEXT_BYTES}), \
                 p_owner VARBINARY({TEXT_BYTES}), p_ttl BIGINT, p_wait_ms BIGINT, \
                 p_ticket BIGINT, p_ticket_ms BIGINT)
{opening}{queue_variables}        DECLARE found INT;
        DECLARE held_owner VARBINARY({TEXT_BYTES});
        DECLARE held_fence BIGINT;
        DECLARE held_until BIGINT;
        DECLARE held_epoch BIGINT;
        DECLARE current_epoch BIGINT;
        DECLARE duplicate BOOL DEFAULT FALSE;
        DECLARE drawn_by BIGINT;
        DECLARE semaphore INT;
        {handlers}
        look: LOOP
            {BOUND_WAITS}
            SELECT COUNT(*), MAX(owner), MAX(fence), MAX(expires_at)
              INTO found, held_owner, held_fence, held_until
              FROM {locks} WHERE name = p_name;
{read_the_line_plainly}            -- Refused by these plain reads: the name held, or free with a
            -- waiter ahead.
            IF found = 1 AND held_until > now_ms AND held_owner <> p_owner AND {plain_enough} THEN
                {RESTORE_WAITS}
                SELECT FALSE, held_fence, held_until - now_ms, NULL, {queued_lock};
                LEAVE look;
            END IF;
            -- A semaphore's (or reader-writer lock's) live grants refuse
            -- by a plain read too, before the queue does: the other kind's
            -- answer is an error, whoever waits.
            SELECT MAX(permits) INTO semaphore FROM {permits}
             WHERE name = p_name AND expires_at > now_ms;
            IF semaphore IS NOT NULL THEN
                {RESTORE_WAITS}
                SELECT FALSE, 0, 0, semaphore, NULL, NULL, NULL;
                LEAVE look;
            END IF;
            IF (found = 0 OR held_until <= now_ms) AND q_ahead > 0 AND {plain_enough} THEN
                {RESTORE_WAITS}
                SELECT FALSE, 0, NULL, NULL, {queued_lock};
                LEAVE look;
            END IF;
            SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
            START TRANSACTION;
            {BOUND_WAITS}
            SELECT COUNT(*), MAX(owner), MAX(fence), MAX(expires_at), MAX(epoch)
              INTO found, held_owner, held_fence, held_until, held_epoch
              FROM {locks} WHERE name = p_name FOR UPDATE;
{read_the_line}            IF found = 1 AND held_until > now_ms AND held_owner = p_owner THEN
                {refence_own_lock}
                {BOUND_WAITS}
                {confirm_same_owner}
                {leave_the_line}
                COMMIT;
                {RESTORE_WAITS}
                SELECT TRUE, held_fence, held_until - now_ms, NULL, NULL, NULL, NULL;
                LEAVE look;
            END IF;
            IF found = 1 AND held_until > now_ms THEN
                {queue_up_lock}
                SELECT FALSE, held_fence, held_until - now_ms, NULL, {queued_lock};
                LEAVE look;
            END IF;
            SET duplicate = FALSE;
            IF found = 0 THEN
                -- Expired at once (0) until it is granted below. A refusal
                -- in turn commits it: fence 0, never a grant's, so no
                -- holder and purged uncounted, as a gate is.
                {BOUND_WAITS}
                INSERT INTO {locks} (name, owner, fence, expires_at)
                VALUES (p_name, p_owner, 0, 0);
            END IF;
            IF NOT duplicate AND found = 0 THEN
                -- The name's row is in (and locked) only now: the queue as
                -- it stands under it.
{read_the_line}            END IF;
            IF duplicate THEN
                ROLLBACK;
            ELSEIF q_ahead > 0 THEN
                -- Free, but a waiter queued before this attempt: its turn.
                {queue_up_lock}
                SELECT FALSE, 0, NULL, NULL, {queued_lock};
                LEAVE look;
            ELSE
                -- The name's row lock is held. Expired permits of the name
                -- are fenced off (expiry 0), waiting for a renewal of one in
                -- flight: it read its clock before the lease ran out and
                -- would otherwise land after this grant, on a row the grant
                -- never touched, bringing the permit back beside the lock;
                -- every later renewal of it answers lost (its holder can
                -- still release it; a purge removes it). Then live permits
                -- refuse.
                IF EXISTS (SELECT 1 FROM {permits}
                            WHERE name = p_name AND expires_at <= now_ms AND expires_at > 0) THEN
                    {BOUND_WAITS}
                    UPDATE {permits} SET expires_at = 0
                     WHERE name = p_name AND expires_at <= now_ms AND expires_at > 0;
                END IF;
                SELECT MAX(permits) INTO semaphore FROM {permits}
                 WHERE name = p_name AND expires_at > now_ms;
                IF semaphore IS NOT NULL THEN
                    ROLLBACK;
                    {RESTORE_WAITS}
                    SELECT FALSE, 0, 0, semaphore, NULL, NULL, NULL;
                    LEAVE look;
                END IF;
                {raise_after_promotion}
                UPDATE {locks} SET owner = p_owner, fence = NEXTVAL({fences}),
                       expires_at = now_ms + p_ttl, epoch = current_epoch
                 WHERE name = p_name;
                {leave_the_line}
                COMMIT;
                {RESTORE_WAITS}
                SELECT TRUE, LASTVAL({fences}), p_ttl, NULL, NULL, NULL, NULL;
                LEAVE look;
            END IF;
        END LOOP;
    END;
END"
        );
        // A permit's procedure: one CALL, one round trip.
        //
        // 1. A plain read: every permit live, of the count asked, none the
        //    owner's: "held", nothing written or locked.
        // 2. Otherwise one READ COMMITTED transaction that first takes the
        //    name's gate: its row in `locks`, locked FOR UPDATE (inserted,
        //    expired, when missing: a duplicate rolls back and looks again,
        //    as the lock's insert does). The lock procedure takes the same
        //    row lock, so a name's grants — locks' and permits' — draw their
        //    fences one at a time, in commit order, and a name is never a
        //    lock and a semaphore at once. A live row there is a lock:
        //    refused.
        // 3. Under the gate: live permits of another count refuse; the
        //    owner's own live permit is locked and given back, confirmed by
        //    a write as the lock's is; else the lowest slot with no live
        //    permit (0, or one past a live slot) is locked — its expired row
        //    taken over, or a new row inserted — with the next fence.
        // Refusals roll back: nothing written, no fence drawn. Waits are
        // bounded as the lock procedure's are. A gate row (owner '', fence
        // 0, expired) is never a holder, is never listed, and is purged.
        // What the permit and reader-writer procedures share. Their first,
        // plain read: a live lock refuses, nothing locked or written.
        let refuse_a_live_lock = format!(
            "            {BOUND_WAITS}
            SELECT COUNT(*) INTO found FROM {locks} WHERE name = p_name AND expires_at > now_ms;
            IF found > 0 THEN
                {RESTORE_WAITS}
                SELECT 'lock', 0, 0, 0, 0, NULL, NULL, NULL;
                LEAVE look;
            END IF;
"
        );
        // Under the gate, the owner's own live grant in `permits` (its slot
        // and fence in `mine_slot`, `mine_fence`) locked and given back,
        // confirmed by a write as the lock's is; released or expired
        // meanwhile, look again. `last` is the answer's last column.
        let give_back = |last: &str| {
            let refence_own_permit = refence_own(
                &permits,
                "name = p_name AND slot = mine_slot",
                &format!(
                    "SELECT 'granted', LASTVAL({fences}), mine_slot, p_ttl, {last},
                            NULL, NULL, NULL"
                ),
            );
            format!(
                "                {BOUND_WAITS}
                SELECT COUNT(*), MAX(expires_at), MAX(epoch) INTO found, held_until, held_epoch
                  FROM {permits}
                 WHERE name = p_name AND slot = mine_slot AND fence = mine_fence
                   AND expires_at > now_ms FOR UPDATE;
                IF found = 1 THEN
                    {refence_own_permit}
                END IF;
                IF found = 1 THEN
                    {confirm_same_owner}
                    {leave_the_line}
                    COMMIT;
                    {RESTORE_WAITS}
                    SELECT 'granted', mine_fence, mine_slot, held_until - now_ms, {last},
                           NULL, NULL, NULL;
                    LEAVE look;
                END IF;
                ROLLBACK;
                ITERATE look;
"
            )
        };
        let give_the_permit_back = give_back("p_permits");
        let give_the_rw_grant_back = give_back("0");
        // How the permit and reader-writer procedures begin their
        // transaction: the name's gate — its row in `locks`, locked FOR
        // UPDATE (inserted, expired, when missing: a duplicate rolls back and
        // looks again, as the lock's insert does); a live row there is a
        // lock, refused. Then, under the gate, the name's expired lock and
        // permits-table rows, when there are any, are fenced off (expiry 0),
        // as the lock procedure does, before the decisions that follow (this
        // waits for a renewal in flight).
        let take_the_gate = format!(
            "            SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
            START TRANSACTION;
            {BOUND_WAITS}
            SELECT COUNT(*), MAX(expires_at) INTO found, held_until
              FROM {locks} WHERE name = p_name FOR UPDATE;
            IF found = 1 AND held_until > now_ms THEN
                ROLLBACK;
                {RESTORE_WAITS}
                SELECT 'lock', 0, 0, 0, 0, NULL, NULL, NULL;
                LEAVE look;
            END IF;
            SET duplicate = FALSE;
            IF found = 0 THEN
                {BOUND_WAITS}
                INSERT INTO {locks} (name, owner, fence, expires_at) VALUES (p_name, '', 0, 0);
            END IF;
            IF duplicate THEN
                ROLLBACK;
                ITERATE look;
            END IF;
            IF EXISTS (SELECT 1 FROM {locks}
                        WHERE name = p_name AND expires_at <= now_ms AND expires_at > 0)
               OR EXISTS (SELECT 1 FROM {permits}
                           WHERE name = p_name AND expires_at <= now_ms AND expires_at > 0)
            THEN
                {BOUND_WAITS}
                UPDATE {locks} SET expires_at = 0
                 WHERE name = p_name AND expires_at <= now_ms AND expires_at > 0;
                UPDATE {permits} SET expires_at = 0
                 WHERE name = p_name AND expires_at <= now_ms AND expires_at > 0;
            END IF;
{read_the_line}"
        );
        let opening = procedure_opening("acquire_permit");
        let queue_up_permit = queue_up("'permit'", "FALSE");
        let queued_permit = queued("'permit'");
        let create_acquire_permit = format!(
            "CREATE OR REPLACE PROCEDURE {acquire_permit_proc}(p_name VARBINARY({TEXT_BYTES}), \
                 p_permits INT, p_owner VARBINARY({TEXT_BYTES}), p_ttl BIGINT, p_wait_ms BIGINT, \
                 p_ticket BIGINT, p_ticket_ms BIGINT)
{opening}{queue_variables}        DECLARE found INT;
        DECLARE held_until BIGINT;
        DECLARE live INT;
        DECLARE soonest BIGINT;
        DECLARE other INT;
        DECLARE mine INT;
        DECLARE mine_slot INT;
        DECLARE mine_fence BIGINT;
        DECLARE free_slot INT;
        DECLARE held_epoch BIGINT;
        DECLARE current_epoch BIGINT;
        DECLARE duplicate BOOL DEFAULT FALSE;
        DECLARE drawn_by BIGINT;
        {handlers}
        look: LOOP
{refuse_a_live_lock}            SELECT COUNT(*), MIN(expires_at), MAX(IF(permits <> p_permits, permits, NULL)),
                   COALESCE(SUM(owner = p_owner), 0)
              INTO live, soonest, other, mine
              FROM {permits} WHERE name = p_name AND expires_at > now_ms;
            IF other IS NOT NULL THEN
                {RESTORE_WAITS}
                SELECT 'mismatch', 0, 0, 0, other, NULL, NULL, NULL;
                LEAVE look;
            END IF;
{read_the_line_plainly}            IF mine = 0 AND {plain_enough}
               AND (live >= p_permits OR p_permits - live <= q_ahead
                    OR q_permits_ahead < q_ahead) THEN
                {RESTORE_WAITS}
                SELECT 'held', 0, 0, soonest - now_ms, 0, {queued_permit};
                LEAVE look;
            END IF;
{take_the_gate}            SELECT COUNT(*), MIN(expires_at), MAX(IF(permits <> p_permits, permits, NULL)),
                   COUNT(IF(owner = p_owner, 1, NULL)), MAX(IF(owner = p_owner, slot, NULL)),
                   MAX(IF(owner = p_owner, fence, NULL))
              INTO live, soonest, other, mine, mine_slot, mine_fence
              FROM {permits} WHERE name = p_name AND expires_at > now_ms;
            IF other IS NOT NULL THEN
                ROLLBACK;
                {RESTORE_WAITS}
                SELECT 'mismatch', 0, 0, 0, other, NULL, NULL, NULL;
                LEAVE look;
            END IF;
            IF mine = 1 THEN
{give_the_permit_back}            END IF;
            IF live >= p_permits OR p_permits - live <= q_ahead OR q_permits_ahead < q_ahead THEN
                -- Every permit held, or the free ones owed to waiters
                -- queued before this attempt, or a waiter of another kind
                -- queued before it (one queue across kinds).
                {queue_up_permit}
                SELECT 'held', 0, 0, soonest - now_ms, 0, {queued_permit};
                LEAVE look;
            END IF;
            SELECT MIN(c.slot) INTO free_slot FROM (
                SELECT 0 AS slot
                UNION ALL
                SELECT slot + 1 FROM {permits} WHERE name = p_name AND expires_at > now_ms
            ) c
            WHERE c.slot < p_permits AND NOT EXISTS (
                SELECT 1 FROM {permits} q
                 WHERE q.name = p_name AND q.slot = c.slot AND q.expires_at > now_ms);
            IF free_slot IS NULL THEN
                -- Taken meanwhile: look again.
                ROLLBACK;
                ITERATE look;
            END IF;
            {BOUND_WAITS}
            SELECT COUNT(*), MAX(expires_at) INTO found, held_until FROM {permits}
             WHERE name = p_name AND slot = free_slot FOR UPDATE;
            IF found = 1 AND held_until > now_ms THEN
                -- Renewed meanwhile: look again.
                ROLLBACK;
                ITERATE look;
            END IF;
            {raise_after_promotion}
            SET duplicate = FALSE;
            IF found = 1 THEN
                UPDATE {permits} SET owner = p_owner, fence = NEXTVAL({fences}),
                       expires_at = now_ms + p_ttl, permits = p_permits, epoch = current_epoch
                 WHERE name = p_name AND slot = free_slot;
            ELSE
                -- Every insert of a permit runs under the name's gate.
                INSERT INTO {permits} (name, slot, owner, fence, expires_at, permits, epoch)
                VALUES (p_name, free_slot, p_owner, NEXTVAL({fences}), now_ms + p_ttl, p_permits,
                        current_epoch);
            END IF;
            IF duplicate THEN
                ROLLBACK;
            ELSE
                {leave_the_line}
                COMMIT;
                {RESTORE_WAITS}
                SELECT 'granted', LASTVAL({fences}), free_slot, p_ttl, p_permits,
                       NULL, NULL, NULL;
                LEAVE look;
            END IF;
        END LOOP;
    END;
END"
        );
        // A reader-writer lock's procedure: one CALL, one round trip. Its
        // rows live in `permits` with permits {READ_WRITE_PERMITS} (a
        // semaphore's are 1 or more): readers on slots 0.., the writer on
        // {WRITER_SLOT} (a waiting writer's intent of layout 7, on
        // {INTENT_SLOT}, is no longer read: the queue replaced it).
        //
        // 1. Plain reads: a live lock or a semaphore's live permits refuse;
        //    so does, for a `try_` call, what refuses the mode (a writer or
        //    {MAX_READERS} readers for a reader; a writer or readers for a
        //    writer).
        // 2. Otherwise one READ COMMITTED transaction under the name's gate,
        //    as the permit procedure's: expired rows fenced off, the rows
        //    and the queue read again; the owner's own grant of the mode
        //    given back (confirmed by a write); refused by what holds (a
        //    reader beside a writer is then owed the turn after it), or not
        //    its turn in the queue (phase-fair: a writer when nobody is
        //    queued ahead and no reader is owed the turn; a reader when no
        //    writer is queued ahead or its ticket is owed, and a slot is
        //    free past the readers ahead); else the grant's slot (the
        //    writer's, or the lowest free reader slot) locked and taken
        //    with the next fence, a writer's grant owing every queued
        //    reader the turn after it.
        let rows_of_the_name = format!(
            "SELECT MAX(IF(permits <> {READ_WRITE_PERMITS}, permits, NULL)),
                   MAX(IF(slot = {WRITER_SLOT}, owner, NULL)),
                   MAX(IF(slot = {WRITER_SLOT}, fence, NULL)),
                   MAX(IF(slot = {WRITER_SLOT}, expires_at, NULL)),
                   COUNT(IF(slot >= 0, 1, NULL)), MIN(IF(slot >= 0, expires_at, NULL)),
                   MAX(IF(slot >= 0 AND owner = p_owner, slot, NULL)),
                   MAX(IF(slot >= 0 AND owner = p_owner, fence, NULL))
              INTO other, writer_owner, writer_fence, writer_ends,
                   readers, readers_end, mine_slot, mine_fence
              FROM {permits} WHERE name = p_name AND expires_at > now_ms;
            IF p_write THEN
                SET mine_slot = {WRITER_SLOT};
                SET mine_fence = IF(writer_owner = p_owner, writer_fence, NULL);
            END IF;
            -- What refuses this mode, and when the first of it ends.
            IF p_write THEN
                SET refused = writer_owner IS NOT NULL OR readers > 0;
                SET refused_ends = LEAST(COALESCE(writer_ends, {NEVER}),
                                         COALESCE(readers_end, {NEVER}));
            ELSE
                SET refused = writer_owner IS NOT NULL OR readers >= {MAX_READERS};
                SET refused_ends = IF(writer_owner IS NOT NULL, writer_ends, readers_end);
            END IF;"
        );
        let kind_rw = "IF(p_write, 'write', 'read')";
        let queue_up_refused = queue_up(kind_rw, "NOT p_write AND writer_owner IS NOT NULL");
        let queue_up_out_of_turn = queue_up(kind_rw, "FALSE");
        let queued_rw = queued(kind_rw);
        // Not the attempt's turn in the queue (phase-fair), by the line read.
        let out_of_turn = format!(
            "((p_write AND (q_ahead > 0 OR q_owed_readers))
                 OR (NOT p_write AND NOT ((q_owed OR q_writer_ahead IS NULL)
                                          AND q_not_rw_ahead = 0
                                          AND {MAX_READERS} - readers > q_readers_ahead)))"
        );
        let opening = procedure_opening("acquire_rw");
        let create_acquire_rw = format!(
            "CREATE OR REPLACE PROCEDURE {acquire_rw_proc}(p_name VARBINARY({TEXT_BYTES}),                  p_write BOOL, p_owner VARBINARY({TEXT_BYTES}), p_ttl BIGINT, p_wait_ms BIGINT, \
                 p_ticket BIGINT, p_ticket_ms BIGINT)
{opening}{queue_variables}        DECLARE found INT;
        DECLARE held_until BIGINT;
        DECLARE other INT;
        DECLARE writer_owner VARBINARY({TEXT_BYTES});
        DECLARE writer_fence BIGINT;
        DECLARE writer_ends BIGINT;
        DECLARE readers INT;
        DECLARE readers_end BIGINT;
        DECLARE mine_slot INT;
        DECLARE mine_fence BIGINT;
        DECLARE refused BOOL;
        DECLARE refused_ends BIGINT;
        DECLARE grant_slot INT;
        DECLARE held_epoch BIGINT;
        DECLARE current_epoch BIGINT;
        DECLARE duplicate BOOL DEFAULT FALSE;
        DECLARE drawn_by BIGINT;
        {handlers}
        look: LOOP
{refuse_a_live_lock}            {rows_of_the_name}
            IF other IS NOT NULL THEN
                {RESTORE_WAITS}
                SELECT 'semaphore', 0, 0, 0, other, NULL, NULL, NULL;
                LEAVE look;
            END IF;
{read_the_line_plainly}            -- A waiting reader a writer holds the name from is answered
            -- plainly only once its ticket says it is owed the turn.
            IF mine_fence IS NULL AND refused AND {plain_enough}
               AND (p_ticket_ms IS NULL OR p_write OR writer_owner IS NULL OR q_owed) THEN
                {RESTORE_WAITS}
                SELECT 'held', 0, 0, refused_ends - now_ms, 0, {queued_rw};
                LEAVE look;
            END IF;
            IF mine_fence IS NULL AND {plain_enough} AND {out_of_turn}
               AND (p_ticket_ms IS NULL OR p_write OR writer_owner IS NULL OR q_owed) THEN
                {RESTORE_WAITS}
                SELECT 'held', 0, 0, readers_end - now_ms, 0, {queued_rw};
                LEAVE look;
            END IF;
{take_the_gate}            {rows_of_the_name}
            IF other IS NOT NULL THEN
                ROLLBACK;
                {RESTORE_WAITS}
                SELECT 'semaphore', 0, 0, 0, other, NULL, NULL, NULL;
                LEAVE look;
            END IF;
            IF mine_fence IS NOT NULL THEN
{give_the_rw_grant_back}            END IF;
            IF refused THEN
                {queue_up_refused}
                SELECT 'held', 0, 0, refused_ends - now_ms, 0, {queued_rw};
                LEAVE look;
            END IF;
            IF {out_of_turn} THEN
                {queue_up_out_of_turn}
                SELECT 'held', 0, 0, readers_end - now_ms, 0, {queued_rw};
                LEAVE look;
            END IF;
            IF p_write THEN
                SET grant_slot = {WRITER_SLOT};
            ELSE
                SELECT MIN(c.slot) INTO grant_slot FROM (
                    SELECT 0 AS slot
                    UNION ALL
                    SELECT slot + 1 FROM {permits}
                     WHERE name = p_name AND slot >= 0 AND expires_at > now_ms
                ) c
                WHERE c.slot < {MAX_READERS} AND NOT EXISTS (
                    SELECT 1 FROM {permits} q
                     WHERE q.name = p_name AND q.slot = c.slot AND q.expires_at > now_ms);
            END IF;
            IF grant_slot IS NULL THEN
                ROLLBACK;
                ITERATE look;
            END IF;
            {BOUND_WAITS}
            SELECT COUNT(*), MAX(expires_at) INTO found, held_until FROM {permits}
             WHERE name = p_name AND slot = grant_slot FOR UPDATE;
            IF found = 1 AND held_until > now_ms THEN
                ROLLBACK;
                ITERATE look;
            END IF;
            {raise_after_promotion}
            SET duplicate = FALSE;
            IF found = 1 THEN
                UPDATE {permits} SET owner = p_owner, fence = NEXTVAL({fences}),
                       expires_at = now_ms + p_ttl, permits = {READ_WRITE_PERMITS},
                       epoch = current_epoch
                 WHERE name = p_name AND slot = grant_slot;
            ELSE
                INSERT INTO {permits} (name, slot, owner, fence, expires_at, permits, epoch)
                VALUES (p_name, grant_slot, p_owner, NEXTVAL({fences}), now_ms + p_ttl,
                        {READ_WRITE_PERMITS}, current_epoch);
            END IF;
            IF duplicate THEN
                ROLLBACK;
            ELSE
                IF p_write THEN
                    {BOUND_WAITS}
                    UPDATE {tickets} SET owed = TRUE
                     WHERE name = p_name AND kind = 'read' AND NOT owed AND expires_at > now_ms;
                END IF;
                {leave_the_line}
                COMMIT;
                {RESTORE_WAITS}
                SELECT 'granted', LASTVAL({fences}), grant_slot, p_ttl, 0, NULL, NULL, NULL;
                LEAVE look;
            END IF;
        END LOOP;
    END;
END"
        );
        // A renewal's test that its row is of the current epoch, on the
        // server that draws fences (a promoted one that has drawn none yet
        // still names the old one: every row is older).
        let current_epoch = format!(
            "epoch = (SELECT value FROM {meta} WHERE `key` = '{EPOCH_KEY}')
                   AND @@server_id = (SELECT value FROM {meta} WHERE `key` = '{DRAWN_BY_KEY}')"
        );
        Statements {
            create_database: audited(format!(
                "CREATE DATABASE {db} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
            )),
            // With its marker rows, in one statement: a `meta` without the
            // marker is never alkstore's half-made one.
            create_meta: [false, true].map(|created_database| {
                audited(format!(
                    "CREATE TABLE {meta} (
                         `key` VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin PRIMARY KEY,
                         value BIGINT NOT NULL
                     ) ENGINE = InnoDB
                     SELECT 'schema_version' AS `key`, {SCHEMA_VERSION} AS value
                     UNION ALL SELECT '{MARKER_KEY}', 1
                     UNION ALL SELECT '{CREATED_DATABASE_KEY}', {}
                     UNION ALL SELECT '{DRAWN_BY_KEY}', @@server_id
                     UNION ALL SELECT '{EPOCH_KEY}', 1",
                    i64::from(created_database)
                ))
            }),
            // Names and owners are bytes, compared as bytes: no collation
            // may fold case or trailing spaces into one name.
            create_locks: audited(format!(
                "CREATE TABLE {locks} (
                     name       VARBINARY({TEXT_BYTES}) PRIMARY KEY,
                     owner      VARBINARY({TEXT_BYTES}) NOT NULL,
                     fence      BIGINT NOT NULL,
                     expires_at BIGINT NOT NULL, -- Unix milliseconds, server clock
                     epoch      BIGINT NOT NULL DEFAULT 0 -- the server_id that granted it
                 ) ENGINE = InnoDB"
            )),
            // InnoDB: each value drawn is logged before the grant that uses
            // it commits, so a crash never hands one out again.
            create_fences: audited(format!(
                "CREATE SEQUENCE {fences} START WITH 1 INCREMENT BY 1 NOCYCLE ENGINE = InnoDB"
            )),
            // As `locks`; one row per permit slot.
            create_permits: audited(format!(
                "CREATE TABLE {permits} (
                     name       VARBINARY({TEXT_BYTES}) NOT NULL,
                     slot       INT NOT NULL, -- 0 .. permits - 1
                     owner      VARBINARY({TEXT_BYTES}) NOT NULL,
                     fence      BIGINT NOT NULL,
                     expires_at BIGINT NOT NULL, -- Unix milliseconds, server clock
                     permits    INT NOT NULL, -- the semaphore's, as its grant asked
                     epoch      BIGINT NOT NULL DEFAULT 0, -- the server_id that granted it
                     PRIMARY KEY (name, slot)
                 ) ENGINE = InnoDB"
            )),
            create_tickets: [
                audited(format!(
                    "CREATE TABLE IF NOT EXISTS {tickets} (
                         name       VARBINARY({TEXT_BYTES}) NOT NULL,
                         ticket     BIGINT NOT NULL, -- from ticket_numbers: lower is earlier
                         owner      VARBINARY({TEXT_BYTES}) NOT NULL,
                         kind       VARCHAR(8) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
                         owed       BOOL NOT NULL, -- a reader's: owed the next turn
                         expires_at BIGINT NOT NULL, -- Unix milliseconds, server clock
                         since      BIGINT NOT NULL, -- when it was taken, server clock
                         PRIMARY KEY (name, ticket)
                     ) ENGINE = InnoDB"
                )),
                audited(format!(
                    "CREATE SEQUENCE IF NOT EXISTS {ticket_numbers}
                     START WITH 1 INCREMENT BY 1 NOCYCLE ENGINE = InnoDB"
                )),
            ],
            create_acquire: audited(create_acquire),
            create_acquire_permit: audited(create_acquire_permit),
            create_acquire_rw: audited(create_acquire_rw),
            record_fences: audited(format!(
                "INSERT IGNORE INTO {meta} (`key`, value) VALUES ('{FENCES_CREATED_KEY}', 1)"
            )),
            // For a layout before 3, whose `meta` had no such row.
            record_drawn_by: audited(format!(
                "INSERT IGNORE INTO {meta} (`key`, value)
                 VALUES ('{DRAWN_BY_KEY}', @@server_id), ('{EPOCH_KEY}', 1)"
            )),
            record_version: audited(format!(
                "UPDATE {meta} SET value = {SCHEMA_VERSION} WHERE `key` = 'schema_version'"
            )),
            add_epochs: [&locks, &permits].map(|table| {
                audited(format!(
                    "ALTER TABLE {table} ADD COLUMN IF NOT EXISTS epoch BIGINT NOT NULL DEFAULT 0"
                ))
            }),
            // The rows an older layout granted are taken as the current
            // epoch's (the upgrade runs on the primary): what that layout did.
            set_epochs: [&locks, &permits].map(|table| {
                audited(format!(
                    "UPDATE {table} SET epoch =
                         (SELECT value FROM {meta} WHERE `key` = '{EPOCH_KEY}')
                     WHERE epoch = 0 AND fence <> 0"
                ))
            }),
            read_meta: audited(format!("SELECT `key`, value FROM {meta}")),
            fences_created: audited(format!(
                "SELECT COUNT(*) FROM {meta} WHERE `key` = '{FENCES_CREATED_KEY}'"
            )),
            drop_objects: [
                audited(format!("DROP PROCEDURE IF EXISTS {acquire_proc}")),
                audited(format!("DROP PROCEDURE IF EXISTS {acquire_permit_proc}")),
                audited(format!("DROP PROCEDURE IF EXISTS {acquire_rw_proc}")),
                audited(format!("DROP TABLE IF EXISTS {tickets}")),
                audited(format!("DROP SEQUENCE IF EXISTS {ticket_numbers}")),
                audited(format!("DROP TABLE IF EXISTS {permits}")),
                audited(format!("DROP TABLE IF EXISTS {locks}")),
                audited(format!("DROP SEQUENCE IF EXISTS {fences}")),
                audited(format!("DROP TABLE IF EXISTS {meta}")),
            ],
            drop_database: audited(format!("DROP DATABASE {db}")),
            // name, owner, ttl ms, the bound on lock waits in ms (NULL:
            // none), the ticket (NULL: none yet), the ticket's lease in ms
            // (NULL: not queued, a `try_` call).
            acquire: audited(format!("CALL {acquire_proc}(?, ?, ?, ?, ?, ?)")),
            // name, permits, owner, ttl ms, then as `acquire`'s.
            acquire_permit: audited(format!("CALL {acquire_permit_proc}(?, ?, ?, ?, ?, ?, ?)")),
            // name, write, owner, ttl ms, then as `acquire`'s.
            acquire_rw: audited(format!("CALL {acquire_rw_proc}(?, ?, ?, ?, ?, ?, ?)")),
            // `FOUND_ROWS` (set by sqlx) makes the count the rows matched,
            // not the rows changed: a renewal within the same millisecond
            // still counts. A lease of an older epoch (granted before a
            // promotion or a fence raise, or on another server than the one
            // that draws fences now) is not renewed: lost. ttl ms, name,
            // owner, fence.
            renew: audited(format!(
                "UPDATE {locks} SET expires_at = {NOW_MS} + ?
                 WHERE name = ? AND owner = ? AND fence = ? AND expires_at > {NOW_MS}
                   AND {current_epoch}"
            )),
            // ttl ms, name, slot, owner, fence.
            renew_permit: audited(format!(
                "UPDATE {permits} SET expires_at = {NOW_MS} + ?
                 WHERE name = ? AND slot = ? AND owner = ? AND fence = ? AND expires_at > {NOW_MS}
                   AND {current_epoch}"
            )),
            // Every grant of a batch, as `renew` and `renew_permit` would,
            // in one round trip: statements sent together (no parameters
            // there: the batch is spliced in, JSON of numbers and hex
            // strings only, see `renew_batch_text`). One clock for all, in
            // one transaction: the batch's rows are locked first, skipping
            // any another transaction holds (the core renews those alone,
            // waiting as a lone renewal does), and only the rows locked are
            // renewed, then read back by their new expiry — which no other
            // write gives a row of this owner and fence. Rows are matched
            // in the batch's order (name, then slot: the key's). Should a
            // statement fail inside the transaction, the connection is
            // dropped, not reused, and the server rolls the rest back.
            renew_batch: {
                let batch = format!(
                    "JSON_TABLE(@alkstore_batch, '$[*]' COLUMNS (
                         i INT PATH '$.i',
                         name VARCHAR({hex}) CHARACTER SET ascii PATH '$.name',
                         in_permits INT PATH '$.in_permits',
                         slot BIGINT PATH '$.slot',
                         owner VARCHAR({hex}) CHARACTER SET ascii PATH '$.owner',
                         fence BIGINT PATH '$.fence',
                         ttl BIGINT PATH '$.ttl'
                     )) AS b",
                    hex = 2 * TEXT_BYTES
                );
                let lock_row = "b.in_permits = 0 AND l.name = UNHEX(b.name) \
                                AND l.owner = UNHEX(b.owner) AND l.fence = b.fence";
                let permit_row = "b.in_permits = 1 AND p.name = UNHEX(b.name) \
                                  AND p.slot = b.slot AND p.owner = UNHEX(b.owner) \
                                  AND p.fence = b.fence";
                format!(
                    "SET @alkstore_now = {NOW_MS}, @alkstore_batch = '{BATCH_MARKER}';
                     START TRANSACTION;
                     SELECT GROUP_CONCAT(b.i) INTO @alkstore_locked
                       FROM {batch} STRAIGHT_JOIN {locks} AS l ON {lock_row}
                        FOR UPDATE SKIP LOCKED;
                     UPDATE {batch} STRAIGHT_JOIN {locks} AS l ON {lock_row}
                        SET l.expires_at = @alkstore_now + b.ttl
                      WHERE FIND_IN_SET(b.i, @alkstore_locked)
                        AND l.expires_at > @alkstore_now AND {current_epoch};
                     SELECT GROUP_CONCAT(b.i) INTO @alkstore_locked
                       FROM {batch} STRAIGHT_JOIN {permits} AS p ON {permit_row}
                        FOR UPDATE SKIP LOCKED;
                     UPDATE {batch} STRAIGHT_JOIN {permits} AS p ON {permit_row}
                        SET p.expires_at = @alkstore_now + b.ttl
                      WHERE FIND_IN_SET(b.i, @alkstore_locked)
                        AND p.expires_at > @alkstore_now AND {current_epoch};
                     SELECT b.i FROM {batch} STRAIGHT_JOIN {locks} AS l ON {lock_row}
                      WHERE l.expires_at = @alkstore_now + b.ttl AND {current_epoch}
                     UNION ALL
                     SELECT b.i FROM {batch} STRAIGHT_JOIN {permits} AS p ON {permit_row}
                      WHERE p.expires_at = @alkstore_now + b.ttl AND {current_epoch};
                     COMMIT"
                )
            },
            // name, owner, fence.
            release: audited(format!(
                "DELETE FROM {locks} WHERE name = ? AND owner = ? AND fence = ?"
            )),
            // name, slot, owner, fence.
            release_permit: audited(format!(
                "DELETE FROM {permits} WHERE name = ? AND slot = ? AND owner = ? AND fence = ?"
            )),
            // name.
            holder: audited(format!(
                "SELECT owner, fence, expires_at - {NOW_MS} FROM {locks}
                 WHERE name = ? AND expires_at > {NOW_MS}"
            )),
            // Names: prefix, name to start after ('' from the first),
            // prefix, prefix. Binds: names, page size, names, page size,
            // page size, names. Answers name, owner, fence, time left,
            // slot and permits (NULL for a lock), in name and slot order (a
            // waiting writer's intent is no grant: not listed):
            // the first `limit` live rows of both tables (each read in key
            // order, `limit` at most), then every live permit of the last
            // one's name, so that a page never splits a semaphore. Names
            // are bytes (VARBINARY): `LEFT` and `LENGTH` count bytes, the
            // order is byte order, and the prefix matches literally, unlike
            // LIKE; `name >= prefix` lets the primary keys find the first
            // name of the prefix.
            list: audited(format!(
                "WITH page_locks AS (
                     SELECT name, NULL AS slot, NULL AS permits, owner, fence, expires_at
                     FROM {locks}
                     WHERE name >= ? AND name > ? AND LEFT(name, LENGTH(?)) = ?
                       AND expires_at > {NOW_MS}
                     ORDER BY name LIMIT ?
                 ),
                 first_permits AS (
                     SELECT name, slot FROM {permits}
                     WHERE name >= ? AND name > ? AND LEFT(name, LENGTH(?)) = ?
                       AND expires_at > {NOW_MS} AND slot <> {INTENT_SLOT}
                     ORDER BY name, slot LIMIT ?
                 ),
                 page AS (
                     SELECT u.name FROM (SELECT name, slot FROM page_locks
                                         UNION ALL SELECT name, slot FROM first_permits) u
                     ORDER BY u.name, u.slot LIMIT ?
                 )
                 SELECT name, owner, fence, expires_at - {NOW_MS}, slot, permits FROM page_locks
                 WHERE name <= (SELECT MAX(name) FROM page)
                 UNION ALL
                 SELECT name, owner, fence, expires_at - {NOW_MS}, slot, permits FROM {permits}
                 WHERE name >= ? AND name > ? AND LEFT(name, LENGTH(?)) = ?
                   AND expires_at > {NOW_MS} AND slot <> {INTENT_SLOT}
                   AND name <= (SELECT MAX(name) FROM page)
                 ORDER BY 1, 5"
            )),
            // name, fence or NULL, the same again. Removes the live lock
            // (of that fence, when one is given) and answers it, in one
            // statement (MariaDB's `DELETE … RETURNING`; MySQL 8 has none).
            force_release: audited(format!(
                "DELETE FROM {locks}
                 WHERE name = ? AND (fence = ? OR ? IS NULL) AND expires_at > {NOW_MS}
                 RETURNING owner, fence, expires_at - {NOW_MS}"
            )),
            // name, fence: the live permit of that fence, when no lock had it.
            force_release_permit: audited(format!(
                "DELETE FROM {permits} WHERE name = ? AND fence = ? AND expires_at > {NOW_MS}
                 RETURNING owner, fence, expires_at - {NOW_MS}"
            )),
            // Gates (owner '') and rows a refusal in turn left before any
            // grant (fence 0) are not locks: not counted, purged last, and
            // only once their semaphore has no live permit (so that a lock
            // asked of its name refuses by a plain read, writing nothing).
            purge: [
                audited(format!(
                    "DELETE FROM {locks} WHERE expires_at <= {NOW_MS} AND owner <> '' AND fence <> 0"
                )),
                audited(format!(
                    "DELETE FROM {permits} WHERE expires_at <= {NOW_MS}"
                )),
                audited(format!(
                    "DELETE FROM {locks} WHERE expires_at <= {NOW_MS} AND (owner = '' OR fence = 0)
                       AND NOT EXISTS (SELECT 1 FROM {permits} p
                                       WHERE p.name = {locks}.name AND p.expires_at > {NOW_MS})"
                )),
            ],
            purge_tickets: audited(format!(
                "DELETE FROM {tickets} WHERE expires_at <= {NOW_MS}"
            )),
            // name, ticket: a waiter that stops waiting ungranted. Its live
            // ticket lapsed at once (expiry 0, which no renewal gives: an
            // attempt of the call still on its way then draws no new
            // ticket; a later draw or purge deletes it).
            leave_queue: audited(format!(
                "UPDATE {tickets} SET expires_at = 0
                 WHERE name = ? AND ticket = ? AND expires_at > {NOW_MS}"
            )),
            // name: its live tickets, oldest first.
            waiters: audited(format!(
                "SELECT ticket, owner, kind, expires_at - {NOW_MS}, {NOW_MS} - since FROM {tickets}
                 WHERE name = ? AND expires_at > {NOW_MS} ORDER BY ticket"
            )),
            next_fence: audited(format!("SELECT NEXTVAL({fences})")),
            new_epoch: audited(format!(
                "UPDATE {meta} SET value = value + 1 WHERE `key` = '{EPOCH_KEY}'"
            )),
            set_fences_prefix: format!("SELECT SETVAL({fences}, "),
        }
    }
}

/// A slot or a count of permits, as MariaDB answers integers (`BIGINT`
/// through a procedure's or a union's result).
fn int(value: i64) -> Result<i32, sqlx::Error> {
    i32::try_from(value).map_err(|e| sqlx::Error::Decode(e.into()))
}

/// A lock acquire's answer as the procedure returns it: granted, fence,
/// lease left, a semaphore's permits, ticket, position, cue (integers as
/// `BIGINT`).
type LockColumns = (
    i64,
    i64,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
);

/// A permit or reader-writer acquire's answer as the procedure returns it
/// (its outcome as bytes, integers as `BIGINT`).
fn outcome_row(row: sqlx::mysql::MySqlRow) -> Result<PermitRow, sqlx::Error> {
    type Columns = (
        Vec<u8>,
        i64,
        i64,
        Option<i64>,
        i64,
        Option<i64>,
        Option<i64>,
        Option<i64>,
    );
    let (outcome, fence, slot, left, last, ticket, position, cue): Columns = row_as(row)?;
    let position = position.map(int).transpose()?;
    Ok((
        text(outcome)?,
        fence,
        int(slot)?,
        left,
        int(last)?,
        ticket,
        position,
        cue,
    ))
}

/// An attempt's ticket and the ticket's lease in ms, as the procedures
/// take them (`NULL`, `NULL` for a `try_` call).
fn standing(queue: Queue) -> (Option<i64>, Option<i64>) {
    match queue {
        Queue::Never => (None, None),
        Queue::Waiting { ticket, lease } => (
            // Drawn from a BIGINT sequence: every ticket handed out fits.
            ticket.map(|t| i64::try_from(t).unwrap_or(i64::MAX)),
            Some(lease.as_i64()),
        ),
    }
}

/// A holder's row as the database returns it (names and owners are bytes).
fn holder_row(row: sqlx::mysql::MySqlRow) -> Result<HolderRow, sqlx::Error> {
    let (owner, fence, left): (Vec<u8>, i64, i64) = row_as(row)?;
    Ok((text(owner)?, fence, left))
}

/// Each operation's statement with its binds, `?` by `?` in order. Names
/// and owners are bound as bytes (the columns are `VARBINARY`).
impl alkstore_sqlx::Statements for Statements {
    type Dialect = crate::connection::MySql;

    fn acquire<'c>(
        &self,
        conn: &'c mut MySqlConnection,
        name: &str,
        owner: &str,
        ttl: LeaseMillis,
        queue: Queue,
        bound: Option<Instant>,
    ) -> StatementFuture<'c, Option<AcquireRow>> {
        let (ticket, ticket_ms) = standing(queue);
        Box::pin(
            sqlx::query(self.acquire.clone())
                .bind(name.as_bytes())
                .bind(owner.as_bytes())
                .bind(ttl.as_i64())
                .bind(bound.map(lock_wait_ms))
                .bind(ticket)
                .bind(ticket_ms)
                .try_map(|row| {
                    let (granted, fence, left, semaphore, ticket, position, cue): LockColumns =
                        row_as(row)?;
                    let semaphore = semaphore.map(int).transpose()?;
                    let position = position.map(int).transpose()?;
                    Ok((granted != 0, fence, left, semaphore, ticket, position, cue))
                })
                .fetch_optional(conn),
        )
    }

    fn acquire_permit<'c>(
        &self,
        conn: &'c mut MySqlConnection,
        name: &str,
        permits: u32,
        owner: &str,
        ttl: LeaseMillis,
        queue: Queue,
        bound: Option<Instant>,
    ) -> StatementFuture<'c, Option<PermitRow>> {
        let (ticket, ticket_ms) = standing(queue);
        Box::pin(
            sqlx::query(self.acquire_permit.clone())
                .bind(name.as_bytes())
                .bind(permits)
                .bind(owner.as_bytes())
                .bind(ttl.as_i64())
                .bind(bound.map(lock_wait_ms))
                .bind(ticket)
                .bind(ticket_ms)
                .try_map(outcome_row)
                .fetch_optional(conn),
        )
    }

    fn acquire_rw<'c>(
        &self,
        conn: &'c mut MySqlConnection,
        name: &str,
        mode: RwMode,
        owner: &str,
        ttl: LeaseMillis,
        queue: Queue,
        bound: Option<Instant>,
    ) -> StatementFuture<'c, Option<RwRow>> {
        let (ticket, ticket_ms) = standing(queue);
        Box::pin(
            sqlx::query(self.acquire_rw.clone())
                .bind(name.as_bytes())
                .bind(mode == RwMode::Write)
                .bind(owner.as_bytes())
                .bind(ttl.as_i64())
                .bind(bound.map(lock_wait_ms))
                .bind(ticket)
                .bind(ticket_ms)
                .try_map(outcome_row)
                .fetch_optional(conn),
        )
    }

    fn queues(&self) -> bool {
        true
    }

    fn leave_queue<'c>(
        &self,
        conn: &'c mut MySqlConnection,
        name: &str,
        ticket: i64,
    ) -> StatementFuture<'c, u64> {
        let leave = sqlx::query(self.leave_queue.clone())
            .bind(name.as_bytes())
            .bind(ticket);
        Box::pin(async move { Ok(leave.execute(conn).await?.rows_affected()) })
    }

    fn waiters<'c>(
        &self,
        conn: &'c mut MySqlConnection,
        name: &str,
    ) -> StatementFuture<'c, Vec<WaiterRow>> {
        Box::pin(
            sqlx::query(self.waiters.clone())
                .bind(name.as_bytes())
                .try_map(|row| {
                    let (ticket, owner, kind, left, waited): (i64, Vec<u8>, Vec<u8>, i64, i64) =
                        row_as(row)?;
                    Ok((ticket, text(owner)?, text(kind)?, left, waited))
                })
                .fetch_all(conn),
        )
    }

    fn renew<'c>(
        &self,
        conn: &'c mut MySqlConnection,
        grant: &GrantKey,
        ttl: LeaseMillis,
    ) -> StatementFuture<'c, u64> {
        let renew = match grant.row_slot() {
            None => sqlx::query(self.renew.clone())
                .bind(ttl.as_i64())
                .bind(grant.name.as_bytes())
                .bind(grant.owner.as_bytes())
                .bind(fence_to_sql(grant.fence)),
            Some(slot) => sqlx::query(self.renew_permit.clone())
                .bind(ttl.as_i64())
                .bind(grant.name.as_bytes())
                .bind(slot)
                .bind(grant.owner.as_bytes())
                .bind(fence_to_sql(grant.fence)),
        };
        Box::pin(async move { Ok(renew.execute(conn).await?.rows_affected()) })
    }

    fn batches_renewals(&self) -> bool {
        true
    }

    fn renew_batch<'c>(
        &self,
        conn: &'c mut MySqlConnection,
        batch: &[(GrantKey, LeaseMillis)],
    ) -> StatementFuture<'c, Vec<usize>> {
        use sqlx::Row;
        let text = renew_batch_text(&self.renew_batch, batch);
        Box::pin(async move {
            let rows = sqlx::raw_sql(text).fetch_all(conn).await?;
            rows.iter()
                .map(|row| {
                    let i: i64 = row.try_get(0)?;
                    usize::try_from(i).map_err(|e| sqlx::Error::Decode(e.into()))
                })
                .collect()
        })
    }

    fn release<'c>(
        &self,
        conn: &'c mut MySqlConnection,
        grant: &GrantKey,
    ) -> StatementFuture<'c, u64> {
        let release = match grant.row_slot() {
            None => sqlx::query(self.release.clone())
                .bind(grant.name.as_bytes())
                .bind(grant.owner.as_bytes())
                .bind(fence_to_sql(grant.fence)),
            Some(slot) => sqlx::query(self.release_permit.clone())
                .bind(grant.name.as_bytes())
                .bind(slot)
                .bind(grant.owner.as_bytes())
                .bind(fence_to_sql(grant.fence)),
        };
        Box::pin(async move { Ok(release.execute(conn).await?.rows_affected()) })
    }

    fn holder<'c>(
        &self,
        conn: &'c mut MySqlConnection,
        name: &str,
    ) -> StatementFuture<'c, Option<HolderRow>> {
        Box::pin(
            sqlx::query(self.holder.clone())
                .bind(name.as_bytes())
                .try_map(holder_row)
                .fetch_optional(conn),
        )
    }

    fn list<'c>(
        &self,
        conn: &'c mut MySqlConnection,
        prefix: &str,
        after: &str,
        limit: i64,
    ) -> StatementFuture<'c, Vec<ListedRow>> {
        let (prefix, after) = (prefix.as_bytes(), after.as_bytes());
        let names = |query: sqlx::query::Query<'static, _, _>| {
            query.bind(prefix).bind(after).bind(prefix).bind(prefix)
        };
        let list = sqlx::query(self.list.clone());
        let list = names(names(names(list).bind(limit)).bind(limit).bind(limit));
        Box::pin(
            list.try_map(|row| {
                type Row = (Vec<u8>, Vec<u8>, i64, i64, Option<i64>, Option<i64>);
                let (name, owner, fence, left, slot, permits): Row = row_as(row)?;
                let (slot, permits) = (slot.map(int).transpose()?, permits.map(int).transpose()?);
                Ok((text(name)?, text(owner)?, fence, left, slot, permits))
            })
            .fetch_all(conn),
        )
    }

    fn force_release<'c>(
        &self,
        conn: &'c mut MySqlConnection,
        name: &str,
        fence: Option<i64>,
    ) -> StatementFuture<'c, Option<HolderRow>> {
        let lock = sqlx::query(self.force_release.clone())
            .bind(name.as_bytes())
            .bind(fence)
            .bind(fence)
            .try_map(holder_row);
        // A permit goes only by its fence, when no lock had it (fences are
        // unique in the database: one of the two at most).
        let permit = fence.map(|fence| {
            sqlx::query(self.force_release_permit.clone())
                .bind(name.as_bytes())
                .bind(fence)
                .try_map(holder_row)
        });
        Box::pin(async move {
            match (lock.fetch_optional(&mut *conn).await?, permit) {
                (None, Some(permit)) => permit.fetch_optional(conn).await,
                (removed, _) => Ok(removed),
            }
        })
    }

    /// Three statements on the one connection; a purge is not one round
    /// trip, and each deletes only rows nobody can renew.
    fn purge<'c>(&self, conn: &'c mut MySqlConnection) -> StatementFuture<'c, u64> {
        let [locks, permits, gates] = self.purge.clone().map(sqlx::query);
        let tickets = sqlx::query(self.purge_tickets.clone());
        Box::pin(async move {
            let purged = locks.execute(&mut *conn).await?.rows_affected()
                + permits.execute(&mut *conn).await?.rows_affected();
            gates.execute(&mut *conn).await?;
            tickets.execute(conn).await?;
            Ok(purged)
        })
    }

    /// Three statements on the one connection: `SETVAL` takes a literal
    /// only. Grants drawing between the first two cannot outrun a raise of
    /// at least 2^20 (the core's least), and `SETVAL` never lowers. Then a
    /// new epoch retires every row granted before. A raise past
    /// `MAX_FENCE` (the sequence's end) is refused before anything is set.
    fn raise_fences<'c>(&self, conn: &'c mut MySqlConnection, by: i64) -> StatementFuture<'c, i64> {
        let next = sqlx::query(self.next_fence.clone()).try_map(row_as::<_, (i64,)>);
        let prefix = self.set_fences_prefix.clone();
        let new_epoch = sqlx::query(self.new_epoch.clone());
        Box::pin(async move {
            let drawn = match next.fetch_one(&mut *conn).await {
                Ok((drawn,)) => drawn,
                Err(error) if crate::connection::sequence_ran_out(&error) => {
                    return Err(alkstore_sqlx::no_fence_left(0));
                }
                Err(error) => return Err(error),
            };
            let left = fence_to_sql(MAX_FENCE).saturating_sub(drawn);
            if by >= left {
                return Err(alkstore_sqlx::no_fence_left(fence_from_sql(left)));
            }
            let target = drawn + by;
            sqlx::query(audited(format!("{prefix}{target})")))
                .execute(&mut *conn)
                .await?;
            new_epoch.execute(conn).await?;
            Ok(target + 1)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_doubles_inner_backticks() {
        assert_eq!(quote_ident("alkstore"), "`alkstore`");
        assert_eq!(
            quote_ident("a`; DROP DATABASE x; --"),
            "`a``; DROP DATABASE x; --`"
        );
    }
}
