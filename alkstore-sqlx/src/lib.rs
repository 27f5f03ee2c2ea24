//! The connections an alkstore engine built on sqlx runs its lock
//! operations on: one checkout, one statement, one round trip — whatever the
//! database.
//!
//! sqlx's pool pings every connection it takes back (a second round trip per
//! operation, measured on the wire by the PostgreSQL engine's tests), so a
//! store keeps its own small set of connections, made with the pool's
//! connect options and bounded by its `max_connections`. A connection goes
//! back only after its statement finished cleanly; one whose future was
//! dropped mid-statement, or that failed, is closed instead, so no connection
//! in an unknown state is ever reused.
//!
//! What differs per database is a [`Dialect`]: what to run on each new
//! connection, and which errors prove what about the statement.
//!
//! ```
//! use alkstore_sqlx::{Connections, Dialect, OnLostConnection, TlsNames};
//! use sqlx::postgres::{PgConnectOptions, PgConnection};
//!
//! struct Postgres;
//!
//! impl Dialect for Postgres {
//!     type Database = sqlx::Postgres;
//!     const ENGINE: &'static str = "postgres";
//!     const TLS: TlsNames = TlsNames {
//!         mode: &["sslmode"],
//!         modes: &["disable", "prefer", "require", "verify-ca", "verify-full"],
//!         taken_as: &[],
//!         unverified: ("require", "verify-ca"),
//!         fully_verified: "verify-full",
//!         root_cert: &["sslrootcert"],
//!         system_roots: None,
//!         cert: &["sslcert"],
//!         key: &["sslkey"],
//!         unsupported: &[],
//!     };
//!     fn store_options(pool: &PgConnectOptions) -> PgConnectOptions {
//!         pool.clone()
//!     }
//!     fn connection_lost(error: &sqlx::Error) -> bool {
//!         matches!(error, sqlx::Error::Io(_))
//!     }
//!     fn rolled_back(error: &sqlx::Error) -> bool {
//!         matches!(error, sqlx::Error::Database(e) if e.code().as_deref() == Some("40P01"))
//!     }
//!     fn lock_wait_ended(error: &sqlx::Error) -> bool {
//!         matches!(error, sqlx::Error::Database(e) if e.code().as_deref() == Some("55P03"))
//!     }
//!     fn server(options: &PgConnectOptions) -> String {
//!         format!("{}:{}", options.get_host(), options.get_port())
//!     }
//!     async fn prepare(_: &mut PgConnection) -> Result<(), sqlx::Error> {
//!         Ok(())
//!     }
//! }
//!
//! # async fn example(name: &str) -> Result<(), alkstore_core::BoxError> {
//! let connections = Connections::<Postgres>::new(PgConnectOptions::new(), 4);
//! // One statement, which may run again after a lost connection; no deadline.
//! let (one,): (i32,) = connections
//!     .run(OnLostConnection::RunAgain, None, |conn, _| {
//!         Box::pin(sqlx::query_as("SELECT 1").fetch_one(conn))
//!     })
//!     .await?;
//! # Ok(())
//! # }
//! # fn main() {}
//! ```

mod connections;
mod dialect;
mod engine;
pub mod lifecycle;
mod namespace;
mod tls;

pub use connections::{
    ANSWER_WITHIN, CONNECT_TIMEOUT, ConnectError, Connections, DEFAULT_MAX_CONNECTIONS, NoAnswer,
    NoServerConnection, OnLostConnection, OutOfTime, RETRY_GRACE, ROLLED_BACK_RETRIES, Setup,
    StatementFuture, Try, check_connect, connect, connect_pool, connect_pool_with, connect_url,
    driver_options,
};
pub use dialect::{Conn, Dialect, Options, lock_wait_ms, no_fence_left, ran_out_of_time};
pub use engine::{
    AcquireRow, HolderRow, ListedRow, PermitOutcome, PermitRow, Polling, QueueColumns, RwRow,
    SqlxEngine, Statements, TURN_POLL_CEILING, WaiterRow, Wakeups,
};
pub use namespace::{
    ForeignObjectsError, Layout, LostFencesError, MARKER_KEY, Meta, Namespace, Objects,
};
pub use tls::{TlsLevel, TlsNames, TlsParams};

use alkstore_core::BoxError;

/// Composed SQL text marked as audited for sqlx: the engine's one place that
/// composes SQL (its `sql.rs`) vouches that the only text spliced in is its
/// namespace's name, quoted there.
pub fn audited(text: String) -> sqlx::SqlStr {
    use sqlx::SqlSafeStr;
    sqlx::AssertSqlSafe(std::sync::Arc::<str>::from(text)).into_sql_str()
}

/// The answer of a statement that removes one grant (a release, a forced
/// release of one fence), run again after a lost connection: what the try
/// found and removed is the answer — a second try that removes the grant
/// proves the first did not, as a grant's fence is never handed out twice.
/// A second try that finds nothing cannot tell whether the first removed
/// it or someone else did: [`OutcomeUnknown`](alkstore_core::OutcomeUnknown),
/// never a guess.
pub fn removed<T>(
    found: Option<T>,
    after_lost_connection: bool,
    operation: &'static str,
) -> Result<Option<T>, BoxError> {
    match found {
        None if after_lost_connection => Err(alkstore_core::OutcomeUnknown { operation }.into()),
        found => Ok(found),
    }
}

/// Reads a row as the tuple `T`, for sqlx's `Query::try_map`: a row of
/// another shape is an error, not a panic.
pub fn row_as<R, T>(row: R) -> Result<T, sqlx::Error>
where
    R: sqlx::Row,
    T: for<'r> sqlx::FromRow<'r, R>,
{
    T::from_row(&row)
}

/// Bytes the database returned as text: alkstore wrote them from `&str`,
/// so anything else is a decoding error.
pub fn text(bytes: Vec<u8>) -> Result<String, sqlx::Error> {
    String::from_utf8(bytes).map_err(|e| sqlx::Error::Decode(e.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_try_that_removes_the_grant_answers_it() {
        assert_eq!(removed(Some(7), true, "release").unwrap(), Some(7));
        assert_eq!(removed(Some(7), false, "release").unwrap(), Some(7));
        assert_eq!(removed::<u8>(None, false, "release").unwrap(), None);
    }

    #[test]
    fn a_second_try_that_finds_nothing_answers_unknown_not_false() {
        let error = removed::<u8>(None, true, "release").unwrap_err();
        let unknown = error
            .downcast_ref::<alkstore_core::OutcomeUnknown>()
            .expect("OutcomeUnknown");
        assert_eq!(unknown.operation, "release");
        assert!(error.to_string().contains("release"), "{error}");
    }
}
