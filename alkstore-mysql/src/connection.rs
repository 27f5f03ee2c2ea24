//! What the shared connection layer needs to know about MariaDB and MySQL.

use alkstore_core::BoxError;
use alkstore_sqlx::{Dialect, TlsNames};
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlDatabaseError, MySqlSslMode};

/// MariaDB's and MySQL's answers to the connection layer's questions.
#[derive(Debug)]
pub(crate) struct MySql;

/// The server's error number, when the error is the server's.
pub(crate) fn error_number(error: &sqlx::Error) -> Option<u16> {
    match error {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<MySqlDatabaseError>()
            .map(|e| e.number()),
        _ => None,
    }
}

/// `ER_SERVER_SHUTDOWN`, `ER_CONNECTION_KILLED` (MariaDB),
/// `ER_CLIENT_INTERACTION_TIMEOUT` (MySQL 8): the server ended the session.
const SESSION_ENDED: [u16; 3] = [1053, 1927, 4031];

/// `ER_ACCESS_DENIED_ERROR`.
const ACCESS_DENIED: u16 = 1045;

/// A login without TLS refused as "Access denied", which is also how
/// MariaDB refuses one on a server that accepts only TLS.
#[derive(Debug, thiserror::Error)]
#[error(
    "access denied to a login without TLS (ssl-mode=DISABLED): if the user and password \
     are right, the server accepts only TLS (require_secure_transport, as managed \
     services set it): use ssl-mode=VERIFY_IDENTITY (or REQUIRED)"
)]
struct DeniedWithoutTls(#[source] sqlx::Error);

/// `ER_NO_SUCH_TABLE`.
const NO_SUCH_TABLE: u16 = 1146;

/// `ER_LOCK_DEADLOCK`: the server rolled the whole transaction back.
pub(crate) const DEADLOCK: u16 = 1213;

/// `ER_LOCK_WAIT_TIMEOUT`: a lock wait ran past `innodb_lock_wait_timeout`.
pub(crate) const LOCK_WAIT_TIMEOUT: u16 = 1205;

/// `ER_SEQUENCE_RUN_OUT`: `NEXTVAL` past the sequence's end, which is
/// `MAX_FENCE`.
const SEQUENCE_RUN_OUT: u16 = 4084;

/// Whether `error` is the `fences` sequence's end.
pub(crate) fn sequence_ran_out(error: &sqlx::Error) -> bool {
    error_number(error) == Some(SEQUENCE_RUN_OUT)
}

impl Dialect for MySql {
    type Database = sqlx::MySql;

    const ENGINE: &'static str = "mysql";

    /// The `mysql` client's names and values, and the driver's aliases.
    const TLS: TlsNames = TlsNames {
        mode: &["ssl-mode", "sslmode"],
        modes: &[
            "DISABLED",
            "PREFERRED",
            "REQUIRED",
            "VERIFY_CA",
            "VERIFY_IDENTITY",
        ],
        taken_as: &[],
        unverified: ("REQUIRED", "VERIFY_CA"),
        fully_verified: "VERIFY_IDENTITY",
        root_cert: &["ssl-ca", "sslca"],
        system_roots: None,
        cert: &["ssl-cert", "sslcert"],
        key: &["ssl-key", "sslkey"],
        unsupported: &[
            "ssl",
            "ssl-verify-server-cert",
            "ssl-capath",
            "ssl-cipher",
            "ssl-crl",
            "ssl-crlpath",
            "ssl-fp",
            "ssl-fplist",
            "tls-version",
            "tls-ciphersuites",
        ],
    };

    /// The session time zone pinned to UTC (the statements read
    /// `UTC_TIMESTAMP`, which needs none; a user's own reads of the table
    /// are then in UTC too).
    fn store_options(pool: &MySqlConnectOptions) -> MySqlConnectOptions {
        pool.clone().timezone(Some(String::from("+00:00")))
    }

    /// `ER_NO_SUCH_TABLE` naming the `fences` sequence (dropped after the
    /// store was opened, or before, by a role that cannot see it): the
    /// procedure's transaction rolled back, nothing drawn.
    fn fences_gone(error: &sqlx::Error) -> bool {
        error_number(error) == Some(NO_SUCH_TABLE)
            && matches!(error, sqlx::Error::Database(db) if db.message().contains(".fences'"))
    }

    /// The sequence's end (`MAX_FENCE`): the procedure's transaction
    /// rolled back, nothing written.
    fn no_fence_left(error: &sqlx::Error) -> bool {
        sequence_ran_out(error)
    }

    /// `ER_ACCESS_DENIED_ERROR` on a login the URL sent without TLS:
    /// MariaDB answers so when `require_secure_transport` refuses it.
    fn explain_connect(error: sqlx::Error, options: &MySqlConnectOptions) -> BoxError {
        if error_number(&error) == Some(ACCESS_DENIED)
            && matches!(options.get_ssl_mode(), MySqlSslMode::Disabled)
        {
            return Box::new(DeniedWithoutTls(error));
        }
        error.into()
    }

    fn connection_lost(error: &sqlx::Error) -> bool {
        matches!(error, sqlx::Error::Io(_))
            || error_number(error).is_some_and(|n| SESSION_ENDED.contains(&n))
    }

    fn rolled_back(error: &sqlx::Error) -> bool {
        error_number(error) == Some(DEADLOCK)
    }

    /// `ER_LOCK_WAIT_TIMEOUT`, past the acquire procedure's bound.
    fn lock_wait_ended(error: &sqlx::Error) -> bool {
        error_number(error) == Some(LOCK_WAIT_TIMEOUT)
    }

    fn server(options: &MySqlConnectOptions) -> String {
        match options.get_socket() {
            Some(socket) => socket.display().to_string(),
            None => format!("{}:{}", options.get_host(), options.get_port()),
        }
    }

    async fn prepare(conn: &mut MySqlConnection) -> Result<(), sqlx::Error> {
        sqlx::raw_sql(crate::sql::SESSION_SETTINGS)
            .execute(conn)
            .await
            .map(drop)
    }
}
