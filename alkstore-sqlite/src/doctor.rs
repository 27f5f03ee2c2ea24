//! `alkstore doctor` for SQLite: the file's journal mode, read on a
//! read-only connection (a missing file is an error, never created), and
//! the contract's promises judged for one file on one host.

use std::path::Path;

use alkstore_core::BoxError;
use alkstore_core::doctor::{Finding, InspectFuture, Promise, Report, Verdict, inspecting};
use rusqlite::{Connection, OpenFlags};

use crate::sql;
use crate::url::Target;

/// Inspects the file (or in-memory database) `url` names.
pub(crate) fn inspect_url(url: &str) -> InspectFuture<'_> {
    inspecting(async move {
        match crate::url::parse(url)? {
            Target::Memory => Ok(in_memory()),
            Target::File(path) => tokio::task::spawn_blocking(move || inspect_file(&path)).await?,
        }
    })
}

fn in_memory() -> Report {
    Report::new(
        "sqlite",
        ":memory:",
        Vec::new(),
        vec![
            Finding::kept(Promise::Exclusion, "one process's private database"),
            Finding::new(
                Promise::NoGrantLostInACrash,
                Verdict::NotApplicable,
                "in memory: nothing survives the process",
            ),
            no_failover(Promise::NoGrantLostInAFailover),
            no_failover(Promise::FencesRiseAcrossAFailover),
        ],
    )
}

fn no_failover(promise: Promise) -> Finding {
    Finding::new(
        promise,
        Verdict::NotApplicable,
        "one file on one host: no failover (after restoring a copy of the file, run `alkstore raise-fences`)",
    )
}

fn inspect_file(path: &Path) -> Result<Report, BoxError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| format!("cannot open {} read-only: {e}", path.display()))?;
    let journal_mode: String = conn.query_row(sql::JOURNAL_MODE, [], |row| row.get(0))?;
    let next = conn
        .query_row(sql::LAST_FENCE, [], |row| row.get::<_, i64>(0))
        .map(|last| alkstore_core::fence_from_sql(last) + 1)
        .map_err(|e| format!("unknown: no store's fence counter in this file ({e})"));
    let crash = if journal_mode.eq_ignore_ascii_case("wal") {
        Finding::kept(
            Promise::NoGrantLostInACrash,
            "journal_mode = wal; grants, renewals and forced releases commit with synchronous = FULL (alkstore sets it per commit)",
        )
    } else {
        Finding::given_up(
            Promise::NoGrantLostInACrash,
            format!(
                "journal_mode = {journal_mode}: not a store alkstore opened (it sets wal), or changed since"
            ),
        )
    };
    Ok(Report::new(
        "sqlite",
        path.display().to_string(),
        vec![
            ("journal_mode".into(), journal_mode),
            alkstore_core::doctor::fences_left(next),
        ],
        vec![
            Finding::kept(
                Promise::Exclusion,
                "one file's write lock, on one host (not on a network file system)",
            ),
            crash,
            no_failover(Promise::NoGrantLostInAFailover),
            no_failover(Promise::FencesRiseAcrossAFailover),
        ],
    ))
}
