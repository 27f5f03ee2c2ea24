//! What the shared layer needs to know about one database.

use std::future::Future;

use alkstore_core::BoxError;
use sqlx::{Connection, Database};

use crate::connections::OutOfTime;
use crate::tls::TlsNames;

/// What the connection layer needs to know about one database.
pub trait Dialect: Send + Sync + 'static {
    /// sqlx's database type.
    type Database: Database;

    /// The engine's name, as metrics label it and URLs' engines are
    /// listed (`"postgres"`, `"mysql"`).
    const ENGINE: &'static str;

    /// How its URLs name their TLS parameters.
    const TLS: TlsNames;

    /// The connect options of the store's own connections, made from the
    /// pool's: with whatever the statements rely on pinned (an isolation
    /// level, a time zone), whatever the role's or server's defaults say.
    fn store_options(pool: &Options<Self>) -> Options<Self>;

    /// The connection was gone before or while the statement ran: an I/O
    /// failure, or the server saying it ended the session. It does not prove
    /// the statement never committed.
    fn connection_lost(error: &sqlx::Error) -> bool;

    /// The server rolled the statement's whole transaction back (a deadlock
    /// victim, a serialization failure): nothing of it committed, so running
    /// it again is safe for any statement.
    fn rolled_back(error: &sqlx::Error) -> bool;

    /// The server cut a lock wait at the bound the statement set for it
    /// (and rolled the transaction back): a waiting acquire ran out of its
    /// wait, having written nothing.
    fn lock_wait_ended(error: &sqlx::Error) -> bool;

    /// The acquire statement found no `fences` sequence to draw from
    /// (dropped after the store was opened): nothing was drawn, and the
    /// engine answers [`LostFencesError`](crate::LostFencesError). The
    /// default: never (the database says so in another way).
    fn fences_gone(error: &sqlx::Error) -> bool {
        let _ = error;
        false
    }

    /// The acquire statement found no fence left below `MAX_FENCE`: it
    /// wrote nothing, and the engine answers
    /// [`NoFenceLeft`](alkstore_core::NoFenceLeft). The default: never.
    fn no_fence_left(error: &sqlx::Error) -> bool {
        let _ = error;
        false
    }

    /// A statement's error as the store answers it: where the dialect
    /// knows what a raw error means for the deployment (a standby answering,
    /// a pooler dropping prepared statements), an error that names the cause
    /// and the fix, with the raw one as its source. The default: as it is.
    fn explain(error: sqlx::Error) -> BoxError {
        error.into()
    }

    /// A connection's refusal as the store answers it: where the server's
    /// own words hide the cause (MariaDB answers a login without TLS on a
    /// server that requires it with "Access denied"), an error that names
    /// it, with the raw one as its source. The default: as it is.
    fn explain_connect(error: sqlx::Error, _options: &Options<Self>) -> BoxError {
        error.into()
    }

    /// Where connections go, for an error to say (host and port, or the
    /// socket; never a password).
    fn server(options: &Options<Self>) -> String;

    /// Runs once on each new connection, before its first statement.
    fn prepare(
        conn: &mut <Self::Database as Database>::Connection,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
}

/// [`NoFenceLeft`](alkstore_core::NoFenceLeft) as a statement's error, for
/// a raise refused at the end of the fences (the core finds it in the
/// source chain).
pub fn no_fence_left(left: u64) -> sqlx::Error {
    sqlx::Error::Decode(Box::new(alkstore_core::NoFenceLeft { left }))
}

/// The connect options of a dialect's database.
pub type Options<D> = <<<D as Dialect>::Database as Database>::Connection as Connection>::Options;

/// The connection type of a dialect's database.
pub type Conn<D> = <<D as Dialect>::Database as Database>::Connection;

/// True when a waiting acquire ran out of its wait before it could decide:
/// no connection in time ([`OutOfTime`]), or a lock wait the server cut at
/// the statement's bound ([`Dialect::lock_wait_ended`]). The transaction
/// rolled back (or never started): nothing was written.
pub fn ran_out_of_time<D: Dialect>(error: &BoxError) -> bool {
    error.is::<OutOfTime>()
        || error
            .downcast_ref::<sqlx::Error>()
            .is_some_and(D::lock_wait_ended)
}

/// The longest lock wait a statement is given: a year (MariaDB's
/// `lock_wait_timeout` goes no higher).
const MAX_LOCK_WAIT_MS: u128 = 365 * 24 * 3600 * 1000;

/// A waiting acquire's bound on its lock waits on the server: the time left
/// until `bound`, in whole milliseconds (truncated: the server's wait ends
/// no later than the caller's), at most a year.
pub fn lock_wait_ms(bound: std::time::Instant) -> i64 {
    let left = bound.saturating_duration_since(std::time::Instant::now());
    // At most a year, so it fits.
    left.as_millis().min(MAX_LOCK_WAIT_MS) as i64
}
