//! `alkstore doctor` for PostgreSQL: the server's durability and replication
//! settings read on one connection (no store opened, nothing created), and
//! the contract's promises judged by them (docs/failover.md's table).

use std::collections::HashMap;

use alkstore_core::BoxError;
use alkstore_core::doctor::{Finding, InspectFuture, Promise, Report, Verdict, inspecting};
use sqlx::Connection;

use alkstore_sqlx::Dialect;

use crate::connection::Postgres;
use crate::protocol::{Call, Protocol};
use crate::sql;

/// What the server showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Observed {
    /// `pg_settings` by name.
    pub(crate) settings: HashMap<String, String>,
    pub(crate) in_recovery: bool,
    /// Whether the role may read which standbys are synchronous.
    pub(crate) sees_standbys: bool,
    pub(crate) standbys: i64,
    pub(crate) synchronous_standbys: i64,
}

impl Observed {
    fn setting(&self, name: &str) -> &str {
        self.settings.get(name).map_or("", String::as_str)
    }
}

/// Inspects the server `url` names, and the fences left in its store (the
/// `schema` parameter's, `alkstore` by default) when there is one.
pub(crate) fn inspect_url(url: &str) -> InspectFuture<'_> {
    inspecting(async move {
        let url = crate::url::parse(url)?;
        inspect(&url).await
    })
}

/// The rows `call` answers, by the URL's protocol, read as `T`.
async fn read<T>(
    protocol: Protocol,
    conn: &mut sqlx::PgConnection,
    call: Call,
) -> Result<Vec<T>, sqlx::Error>
where
    T: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>,
{
    protocol
        .fetch_all(call, conn)
        .await?
        .into_iter()
        .map(alkstore_sqlx::row_as)
        .collect()
}

async fn inspect(url: &crate::url::Parsed) -> Result<Report, BoxError> {
    let schema = url.schema();
    let protocol = crate::Deployment::new().pooler(url.pooler).protocol();
    let options = crate::connection::options(&url.driver)?;
    let mut conn = alkstore_sqlx::connect::<Postgres>(&options).await?;
    let server = Postgres::server(&options);
    let settings: Vec<(String, String)> =
        read(protocol, &mut conn, Call::new(sql::DOCTOR_SETTINGS)).await?;
    let (in_recovery, sees_standbys, standbys, synchronous_standbys): (bool, bool, i64, i64) =
        read(protocol, &mut conn, Call::new(sql::DOCTOR_STANDBYS))
            .await?
            .pop()
            .ok_or(sqlx::Error::RowNotFound)?;
    // The lowest fence a later grant can get (a standby draws none).
    let next = match in_recovery {
        true => Err("n/a: a standby draws no fences".to_owned()),
        false => read::<(Option<i64>,)>(
            protocol,
            &mut conn,
            Call::new(sql::doctor_next_fence())
                .text(&format!("{}.fences", sql::quote_ident(&schema))),
        )
        .await
        .map_err(|e| format!("unknown: {e}"))
        .and_then(|rows| {
            rows.into_iter()
                .next()
                .and_then(|(next,)| next)
                .map(alkstore_core::fence_from_sql)
                .ok_or_else(|| format!("unknown: no store in schema {schema:?}"))
        }),
    };
    let _ = conn.close().await;
    let observed = Observed {
        settings: settings.iter().cloned().collect(),
        in_recovery,
        sees_standbys,
        standbys,
        synchronous_standbys,
    };
    let mut shown = settings;
    shown.sort();
    shown.push(("in recovery (a standby)".into(), in_recovery.to_string()));
    shown.push(("standbys streaming".into(), standbys.to_string()));
    shown.push((
        "synchronous standbys now".into(),
        if sees_standbys {
            synchronous_standbys.to_string()
        } else {
            "unknown (needs pg_read_all_stats)".into()
        },
    ));
    shown.push(alkstore_core::doctor::fences_left(next));
    Ok(Report::new("postgres", server, shown, judge(&observed)))
}

/// The promises, judged by what the server showed.
pub(crate) fn judge(observed: &Observed) -> Vec<Finding> {
    let exclusion = if observed.in_recovery {
        Finding::new(
            Promise::Exclusion,
            Verdict::NotApplicable,
            "this server is a standby (in recovery): it grants nothing; run doctor on the primary",
        )
    } else {
        Finding::kept(
            Promise::Exclusion,
            "the grants of a name are serialised on the primary",
        )
    };
    let crash = match (
        observed.setting("fsync"),
        observed.setting("full_page_writes"),
    ) {
        ("on", "on") => Finding::kept(
            Promise::NoGrantLostInACrash,
            "fsync = on, full_page_writes = on; grants commit with synchronous_commit at least on, whatever its default",
        ),
        ("on", _) => Finding::given_up(
            Promise::NoGrantLostInACrash,
            "full_page_writes = off: a page torn by a crash can corrupt the locks table",
        ),
        _ => Finding::given_up(
            Promise::NoGrantLostInACrash,
            "fsync = off: a crash can lose any commit",
        ),
    };
    // A standby's own settings say nothing of the primary's commits.
    let (crash, failover) = if observed.in_recovery {
        let unknown = |promise| {
            Finding::new(
                promise,
                Verdict::Unknown,
                "this server is a standby: its settings are not the primary's; run doctor on the primary",
            )
        };
        (
            unknown(Promise::NoGrantLostInACrash),
            unknown(Promise::NoGrantLostInAFailover),
        )
    } else {
        let failover = failover(observed, &crash);
        (crash, failover)
    };
    let fences = if observed.setting("wal_level") == "minimal" {
        Finding::new(
            Promise::FencesRiseAcrossAFailover,
            Verdict::NotApplicable,
            "wal_level = minimal: no standby can stream from this server",
        )
    } else {
        Finding::kept(
            Promise::FencesRiseAcrossAFailover,
            "a fence's high part is the WAL timeline, which every promotion raises; after a restore into a new cluster run `alkstore raise-fences`",
        )
    };
    vec![exclusion, crash, failover, fences]
}

fn failover(observed: &Observed, crash: &Finding) -> Finding {
    let promise = Promise::NoGrantLostInAFailover;
    if crash.verdict == Verdict::GivenUp {
        return Finding::given_up(promise, format!("as for a crash: {}", crash.because));
    }
    let names = observed.setting("synchronous_standby_names");
    if names.is_empty() {
        return Finding::given_up(
            promise,
            "synchronous_standby_names is empty: replication is asynchronous, and a promoted standby lacks what it had not received",
        );
    }
    let commit = observed.setting("synchronous_commit");
    if commit == "local" {
        return Finding::given_up(
            promise,
            "synchronous_commit = local: commits do not wait for a standby",
        );
    }
    if !observed.sees_standbys {
        return Finding::new(
            promise,
            Verdict::Unknown,
            format!(
                "synchronous_standby_names = '{names}', but this role cannot see which standbys are synchronous now: grant it pg_read_all_stats"
            ),
        );
    }
    let waits = match commit {
        "remote_write" => {
            "to have received it (remote_write: lost if the standby's OS crashes too)"
        }
        "remote_apply" => "to have applied it",
        // `on`, or `off`, which a grant raises to `on` for itself.
        _ => "to have flushed it",
    };
    let now = match observed.synchronous_standbys {
        0 => "no synchronous standby is connected now: grants wait until one is".to_owned(),
        n => format!("{n} synchronous now"),
    };
    Finding::kept(
        promise,
        format!(
            "synchronous_standby_names = '{names}': a grant is answered once a standby is known {waits}; {now}. Never cancel an alkstore backend (terminate it)"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observed(settings: &[(&str, &str)], synchronous_standbys: i64) -> Observed {
        let mut all: HashMap<String, String> = [
            ("fsync", "on"),
            ("full_page_writes", "on"),
            ("synchronous_commit", "on"),
            ("synchronous_standby_names", ""),
            ("wal_level", "replica"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        for (k, v) in settings {
            all.insert((*k).to_owned(), (*v).to_owned());
        }
        Observed {
            settings: all,
            in_recovery: false,
            sees_standbys: true,
            standbys: synchronous_standbys,
            synchronous_standbys,
        }
    }

    fn verdicts(observed: &Observed) -> Vec<Verdict> {
        judge(observed).into_iter().map(|f| f.verdict).collect()
    }

    use Verdict::{GivenUp, Kept, NotApplicable, Unknown};

    #[test]
    fn each_setting_that_gives_a_promise_up_is_named() {
        assert_eq!(
            verdicts(&observed(&[], 0)),
            [Kept, Kept, GivenUp, Kept],
            "asynchronous"
        );
        let sync = [("synchronous_standby_names", "*")];
        assert_eq!(verdicts(&observed(&sync, 1)), [Kept, Kept, Kept, Kept]);
        let off = [
            ("synchronous_standby_names", "*"),
            ("synchronous_commit", "off"),
        ];
        assert_eq!(verdicts(&observed(&off, 1)), [Kept, Kept, Kept, Kept]);
        let local = [
            ("synchronous_standby_names", "*"),
            ("synchronous_commit", "local"),
        ];
        let findings = judge(&observed(&local, 1));
        assert_eq!(findings[2].verdict, GivenUp);
        assert!(findings[2].because.contains("synchronous_commit = local"));
        let unsafe_crash = [("synchronous_standby_names", "*"), ("fsync", "off")];
        let findings = judge(&observed(&unsafe_crash, 1));
        assert_eq!(findings[1].verdict, GivenUp);
        assert_eq!(findings[2].verdict, GivenUp);
        assert!(findings[2].because.contains("fsync = off"));
        let torn = judge(&observed(&[("full_page_writes", "off")], 0));
        assert!(torn[1].because.contains("full_page_writes = off"));
        let minimal = [("wal_level", "minimal")];
        assert_eq!(verdicts(&observed(&minimal, 0))[3], NotApplicable);
    }

    #[test]
    fn a_standby_is_judged_unknown_not_kept() {
        let mut standby = observed(&[("synchronous_standby_names", "*")], 0);
        standby.in_recovery = true;
        assert_eq!(verdicts(&standby), [NotApplicable, Unknown, Unknown, Kept]);
    }

    #[test]
    fn a_role_that_cannot_see_the_standbys_gets_unknown_and_what_to_grant() {
        let mut blind = observed(&[("synchronous_standby_names", "*")], 0);
        blind.sees_standbys = false;
        let findings = judge(&blind);
        assert_eq!(findings[2].verdict, Unknown);
        assert!(findings[2].because.contains("pg_read_all_stats"));
    }
}
