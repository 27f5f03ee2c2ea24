//! Opening a connection: settings, schema creation and the version check.

use std::time::Duration;

use alkstore_core::BoxError;
use rusqlite::{Connection, TransactionBehavior};

use crate::sql;

/// How long a statement waits for another connection's write lock before
/// failing with `SQLITE_BUSY` (reported as `Error::Database`, never a hang).
pub(crate) const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The file holds a schema written by a newer alkstore.
#[derive(Debug, thiserror::Error)]
#[error(
    "the database holds alkstore schema version {found}; this build knows version {known} and older"
)]
pub struct SchemaVersionError {
    /// The version found in the file.
    pub found: i64,
    /// The newest version this build understands.
    pub known: i64,
}

/// Applies the connection settings and creates the schema if it is missing.
pub(crate) fn prepare(conn: &mut Connection) -> Result<(), BoxError> {
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.execute_batch(sql::PRAGMAS)?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch(sql::CREATE_SCHEMA)?;
    let found: i64 = tx.query_row(sql::SCHEMA_VERSION_READ, [], |r| r.get(0))?;
    if found > sql::SCHEMA_VERSION {
        return Err(SchemaVersionError {
            found,
            known: sql::SCHEMA_VERSION,
        }
        .into());
    }
    tx.commit()?;
    Ok(())
}
