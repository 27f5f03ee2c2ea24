//! Opening a connection: settings, schema creation and the version check.

use std::time::{Duration, Instant};

use alkstore_core::{BoxError, SchemaVersionError};
use rusqlite::{Connection, ErrorCode, TransactionBehavior};

use crate::sql;

/// How long a statement waits for another connection's write lock before
/// failing with `SQLITE_BUSY` (reported as `Error::Database`, never a hang).
pub(crate) const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Puts the file in WAL mode. Switching the journal mode takes a lock that
/// SQLite does not wait for through the busy handler: when another process
/// is creating the same new file at that moment, the switch fails at once
/// with `SQLITE_BUSY`. So it is retried here, with a short pause, for as
/// long as the busy timeout would have waited.
fn switch_to_wal(conn: &Connection) -> rusqlite::Result<()> {
    let started = Instant::now();
    let mut pause = Duration::from_micros(500);
    loop {
        match conn.query_row(sql::WAL_MODE, [], |_| Ok(())) {
            Err(e)
                if e.sqlite_error_code() == Some(ErrorCode::DatabaseBusy)
                    && started.elapsed() < BUSY_TIMEOUT =>
            {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(20));
            }
            done => return done,
        }
    }
}

/// Applies the connection settings and creates the schema if it is missing.
pub(crate) fn prepare(conn: &mut Connection) -> Result<(), BoxError> {
    conn.busy_timeout(BUSY_TIMEOUT)?;
    switch_to_wal(conn)?;
    conn.execute_batch(sql::PRAGMAS)?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch(sql::CREATE_SCHEMA)?;
    for (table, add) in ["alkstore_locks", "alkstore_permits"]
        .into_iter()
        .zip(sql::ADD_EPOCH)
    {
        let has: i64 = tx.query_row(sql::HAS_EPOCH, [table], |r| r.get(0))?;
        if has == 0 {
            tx.execute(add, [])?;
        }
    }
    tx.execute(sql::UPGRADE, [])?;
    let found: i64 = tx.query_row(sql::SCHEMA_VERSION_READ, [], |r| r.get(0))?;
    SchemaVersionError::check(found, sql::SCHEMA_VERSION)?;
    tx.commit()?;
    Ok(())
}
