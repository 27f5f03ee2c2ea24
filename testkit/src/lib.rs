//! Test and benchmark support for alkstore (not published).
//!
//! One module per server kind finds the server its engine's tests run
//! against: [`pg::server`] (PostgreSQL) and [`mysql::server`] (MariaDB or
//! MySQL). Each uses the server at its URL variable when set; otherwise a
//! throwaway one this process starts from the installed binaries, on a free
//! loopback port in a temp dir (as the server's own user when run as root),
//! removed by a watchdog once this process exits ([`process`]); otherwise
//! none, and the caller skips — unless the engine is required (see
//! [`required`]), which turns the skip into a failure.

pub mod certs;
pub mod child;
pub mod etcd;
pub mod mysql;
pub mod patroni;
pub mod pg;
pub mod pgbouncer;
pub mod process;
pub mod wire;

/// Names the engines whose tests must not be skipped: comma-separated
/// engine names (`postgres`), or `all`. CI sets it.
pub const REQUIRE_VAR: &str = "ALKSTORE_REQUIRE";

/// The older way to require PostgreSQL (`=1`), still honoured.
pub const REQUIRE_PG_VAR: &str = "ALKSTORE_REQUIRE_PG";

/// Whether `engine`'s tests must fail rather than skip when its server
/// cannot be had: named in `ALKSTORE_REQUIRE` (or `all`), or, for
/// `postgres`, `ALKSTORE_REQUIRE_PG=1`.
pub fn required(engine: &str) -> bool {
    let listed = std::env::var(REQUIRE_VAR).unwrap_or_default();
    listed
        .split(',')
        .map(str::trim)
        .any(|name| name == engine || name == "all")
        || (engine == "postgres" && std::env::var(REQUIRE_PG_VAR).as_deref() == Ok("1"))
}

/// A name (of a schema, a database) no other test of any process uses:
/// `prefix`, the process id, a counter and the clock's nanoseconds.
pub fn unique_name(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{prefix}_{}_{}_{nanos}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}
