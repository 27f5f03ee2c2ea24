//! Test and benchmark support for alkstore (not published).
//!
//! [`pg::server`] finds a PostgreSQL server for the tests: the one at
//! `ALKSTORE_PG_URL` when set; otherwise a throwaway cluster this process
//! starts with the installed `initdb` and `pg_ctl` on a free loopback port in a
//! temp dir (as the `postgres` user when run as root), stopped and removed by
//! a watchdog once this process exits; otherwise none, and the caller skips —
//! unless `ALKSTORE_REQUIRE_PG=1`, which turns the skip into a failure.

pub mod pg;
