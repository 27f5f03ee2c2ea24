//! Test and benchmark support for alkstore (not published).
//!
//! [`pg::server`] finds a PostgreSQL server for the tests: the one at
//! `ALKSTORE_PG_URL` when set; otherwise a throwaway cluster this process
//! starts with the installed `initdb` and `pg_ctl` on a free loopback port in a
//! temp dir (as the `postgres` user when run as root), stopped and removed by
//! a watchdog once this process exits; otherwise none, and the caller skips —
//! unless the engine is required (see [`required`]), which turns the skip
//! into a failure.

pub mod pg;

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
