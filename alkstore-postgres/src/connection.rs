//! What the shared connection layer needs to know about PostgreSQL.

use alkstore_core::{BoxError, Error};
use alkstore_sqlx::{Dialect, TlsNames};
use sqlx::postgres::{PgConnectOptions, PgConnection};

/// The connect options of a driver URL, as the store makes its connections.
pub(crate) fn options(url: &str) -> Result<PgConnectOptions, Error> {
    let options = alkstore_sqlx::driver_options::<Postgres>(url)
        .map_err(|e| Error::database("connect", e))?;
    Ok(store_options(&options))
}

/// The options of every connection the store makes (its pool's, its own,
/// its listener's): no `extra_float_digits` startup parameter, which
/// PgBouncer refuses unless told to ignore it (the store reads no float).
/// No startup `options` either (PgBouncer refuses those too): what the
/// statements need of the session is set after connecting, or per
/// transaction behind a pooler in transaction mode.
pub(crate) fn store_options(options: &PgConnectOptions) -> PgConnectOptions {
    options.clone().extra_float_digits(None)
}

/// PostgreSQL's answers to the connection layer's questions.
#[derive(Debug)]
pub(crate) struct Postgres;

fn sqlstate(error: &sqlx::Error) -> Option<String> {
    match error {
        sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
        _ => None,
    }
}

impl Dialect for Postgres {
    type Database = sqlx::Postgres;

    const ENGINE: &'static str = "postgres";

    /// libpq's names and values, and the driver's aliases.
    const TLS: TlsNames = TlsNames {
        mode: &["sslmode", "ssl-mode"],
        modes: &[
            "disable",
            "allow",
            "prefer",
            "require",
            "verify-ca",
            "verify-full",
        ],
        taken_as: &[("allow", "prefer")],
        unverified: ("require", "verify-ca"),
        fully_verified: "verify-full",
        root_cert: &["sslrootcert", "ssl-root-cert", "ssl-ca"],
        system_roots: Some("system"),
        cert: &["sslcert", "ssl-cert"],
        key: &["sslkey", "ssl-key"],
        unsupported: &[
            "sslpassword",
            "sslcrl",
            "sslcrldir",
            "sslsni",
            "sslcompression",
            "sslnegotiation",
            "sslcertmode",
            "ssl_min_protocol_version",
            "ssl_max_protocol_version",
        ],
    };

    /// As [`store_options`]; READ COMMITTED is pinned by the statements'
    /// [`Setup`](alkstore_sqlx::Setup), or per transaction.
    fn store_options(pool: &PgConnectOptions) -> PgConnectOptions {
        store_options(pool)
    }

    /// A standby answering, or a pooler in transaction mode dropping the
    /// store's prepared statements: named as such ([`crate::errors`]).
    fn explain(error: sqlx::Error) -> BoxError {
        crate::errors::explain(error)
    }

    /// An I/O failure, or the server saying it terminated the session
    /// (admin shutdown, crash shutdown, `pg_terminate_backend`).
    fn connection_lost(error: &sqlx::Error) -> bool {
        matches!(error, sqlx::Error::Io(_))
            || matches!(
                sqlstate(error).as_deref(),
                Some("57P01" | "57P02" | "57P03")
            )
    }

    /// `deadlock_detected` and `serialization_failure`: the transaction was
    /// rolled back whole.
    fn rolled_back(error: &sqlx::Error) -> bool {
        matches!(sqlstate(error).as_deref(), Some("40P01" | "40001"))
    }

    /// `lock_not_available`: a lock wait past the `lock_timeout` the acquire
    /// function set from the wait left.
    fn lock_wait_ended(error: &sqlx::Error) -> bool {
        sqlstate(error).as_deref() == Some("55P03")
    }

    /// The fence-drawing function's own error: past `MAX_FENCE`.
    fn no_fence_left(error: &sqlx::Error) -> bool {
        sqlstate(error).as_deref() == Some(crate::sql::NO_FENCE_LEFT)
    }

    fn server(options: &PgConnectOptions) -> String {
        match options.get_socket() {
            Some(socket) => socket.display().to_string(),
            None => format!("{}:{}", options.get_host(), options.get_port()),
        }
    }

    /// Nothing: what the statements need of the session is set by their
    /// [`Setup`](alkstore_sqlx::Setup) (READ COMMITTED, where the session
    /// keeps it) or by each statement for its own transaction
    /// (`synchronous_commit`, and READ COMMITTED behind a pooler in
    /// transaction mode), which survives a settings reload under an open
    /// connection and a transaction-pooling proxy.
    async fn prepare(_conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        Ok(())
    }
}
