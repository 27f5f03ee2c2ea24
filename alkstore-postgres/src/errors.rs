//! Raw server errors that say something about the deployment, named as
//! such with the fix: a standby answering where the primary should, a
//! pooler in transaction mode under a store that was not told of it, a
//! pooler refusing a startup parameter.

use alkstore_core::BoxError;

/// `read_only_sql_transaction`: a write refused by a standby (or by a
/// session set read-only).
const READ_ONLY: &str = "25006";
/// `object_not_in_prerequisite_state`, which a WAL function
/// (`pg_current_wal_lsn`, read for the timeline) raises during recovery.
const NOT_IN_PREREQUISITE_STATE: &str = "55000";
/// `duplicate_prepared_statement`: a name this connection prepares is
/// taken on the server connection.
const DUPLICATE_PREPARED: &str = "42P05";
/// `invalid_sql_statement_name`: a statement this connection prepared is
/// missing on the server connection.
const NO_SUCH_PREPARED: &str = "26000";
/// `protocol_violation`, which PgBouncer answers a startup parameter with.
const PROTOCOL_VIOLATION: &str = "08P01";

/// What the deployment did to a statement, and what to change.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeploymentError {
    /// The server is a standby (read-only), or the session was set
    /// read-only: a failover or switchover is under way and the route still
    /// goes to the old primary, or the URL names a replica. Nothing was
    /// written.
    #[error(
        "the server is a standby (read-only): a failover or switchover is under way, or the \
         URL names a replica (or the role or database is set default_transaction_read_only); \
         alkstore writes on the primary only — point the URL at the primary (a route that \
         follows the leader, such as HAProxy on Patroni's /primary check) and try again"
    )]
    Standby {
        /// The server's own error.
        #[source]
        source: sqlx::Error,
    },
    /// The server connection under this client connection changed between
    /// statements: a pooler in transaction mode, which the store was not
    /// told of, dropped or mixed up its prepared statements.
    #[error(
        "the server lost this connection's prepared statements: a pooler in transaction \
         mode (PgBouncer pool_mode = transaction, RDS Proxy, Supavisor) stands between the \
         store and PostgreSQL; add pooler=transaction to the URL \
         (Deployment::pooler(Pooler::Transaction))"
    )]
    TransactionPooler {
        /// The server's own error.
        #[source]
        source: sqlx::Error,
    },
    /// The pool had no connection for the open in time.
    #[error(
        "no connection from the pool within its acquire timeout: every one is busy, or a \
         pooler in session mode has no server connection free for a new one (each client \
         connection keeps one); raise the pooler's pool (PgBouncer: default_pool_size, \
         max_db_connections), use transaction mode, or lower the pools' max_connections"
    )]
    PoolExhausted {
        /// The pool's own error.
        #[source]
        source: sqlx::Error,
    },
    /// A pooler refused a startup parameter the connection sent.
    #[error(
        "a pooler refused the startup parameter {parameter}: add it to PgBouncer's \
         ignore_startup_parameters, or leave it out of the pool's connect options \
         (the store's own connections send none)"
    )]
    StartupParameter {
        /// The parameter's name.
        parameter: String,
        /// The pooler's own error.
        #[source]
        source: sqlx::Error,
    },
}

/// `error` named as a [`DeploymentError`] when it is one of theirs;
/// otherwise as it is.
pub(crate) fn explain(error: sqlx::Error) -> BoxError {
    let (code, message, routine) = match &error {
        sqlx::Error::Database(db) => {
            let pg = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>();
            (
                db.code().map(|c| c.into_owned()).unwrap_or_default(),
                db.message().to_owned(),
                pg.and_then(|e| e.routine()).unwrap_or_default().to_owned(),
            )
        }
        sqlx::Error::PoolTimedOut => {
            return DeploymentError::PoolExhausted { source: error }.into();
        }
        _ => return error.into(),
    };
    let explained = match code.as_str() {
        READ_ONLY => DeploymentError::Standby { source: error },
        // The WAL function the timeline is read with, by its C name (the
        // message is in the server's language).
        NOT_IN_PREREQUISITE_STATE if routine.starts_with("pg_current_wal") => {
            DeploymentError::Standby { source: error }
        }
        DUPLICATE_PREPARED | NO_SUCH_PREPARED if message.contains("sqlx_s_") => {
            DeploymentError::TransactionPooler { source: error }
        }
        // A statement of ours bound on a server connection where the name
        // is another client's statement with other parameters.
        PROTOCOL_VIOLATION if message.contains("sqlx_s_") => {
            DeploymentError::TransactionPooler { source: error }
        }
        PROTOCOL_VIOLATION => match message.strip_prefix("unsupported startup parameter: ") {
            Some(parameter) => DeploymentError::StartupParameter {
                parameter: parameter.trim().to_owned(),
                source: error,
            },
            None => return error.into(),
        },
        _ => return error.into(),
    };
    explained.into()
}

/// As [`explain`], for an error already boxed (the open's): a raw sqlx
/// error at its top is named; any other is left as it is.
pub(crate) fn explain_boxed(error: BoxError) -> BoxError {
    match error.downcast::<sqlx::Error>() {
        Ok(error) => explain(*error),
        Err(other) => other,
    }
}
