//! `alkstore doctor` for PostgreSQL: the server's durability and replication
//! settings read on one connection (no store opened, nothing created), and
//! the contract's promises judged by them (docs/failover.md's table).

use std::collections::HashMap;

use alkstore_core::BoxError;
use alkstore_core::doctor::{Finding, InspectFuture, Promise, Report, Verdict, inspecting};
use sqlx::Connection;

use alkstore_sqlx::{Dialect, TlsLevel};

use crate::connection::Postgres;
use crate::protocol::{Call, Protocol};
use crate::sql;

/// Patroni, as the server's data directory shows it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) enum PatroniSeen {
    /// No `patroni.dynamic.json`: not run by Patroni.
    #[default]
    NotSeen,
    /// Run by Patroni, with these settings.
    Seen {
        synchronous_mode: bool,
        synchronous_mode_strict: bool,
    },
    /// The file could not be read (why).
    Unknown(String),
}

/// What stands between doctor and the server, as its probes showed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) enum PoolerSeen {
    /// The startup parameters reached the server: no pooler.
    #[default]
    NotSeen,
    /// A pooler; `transaction` when a connection's server process changed
    /// between its transactions (transaction pooling), `false` when it kept
    /// it (session pooling, as far as a probe can tell). `how` is what
    /// showed it.
    Seen {
        how: &'static str,
        transaction: bool,
    },
    /// The probe failed (why).
    Unknown(String),
}

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
    pub(crate) patroni: PatroniSeen,
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

/// Whether the server `url` names is in recovery (a standby): one
/// connection, one simple statement, within the connect timeout.
pub(crate) fn standby_url(url: &str) -> alkstore_core::url::StandbyFuture<'_> {
    Box::pin(async move {
        let failed = |e: BoxError| alkstore_core::Error::database("standby", e);
        let url = crate::url::parse(url).map_err(|e| failed(e.into()))?;
        let options = crate::connection::options(&url.driver)?;
        let read = async {
            let mut conn = alkstore_sqlx::connect::<Postgres>(&options).await?;
            let row = sqlx::raw_sql(sql::IN_RECOVERY).fetch_one(&mut conn).await?;
            let standby: bool = sqlx::Row::try_get(&row, 0)?;
            let _ = conn.close().await;
            Ok::<bool, BoxError>(standby)
        };
        match tokio::time::timeout(alkstore_sqlx::CONNECT_TIMEOUT, read).await {
            Ok(standby) => standby.map_err(failed),
            Err(_) => Err(failed("no answer within the connect timeout".into())),
        }
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
    // Simple statements, whatever the URL says: they work through any
    // pooler, so that doctor can tell what the pooler is.
    let protocol = Protocol::Simple;
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
    let patroni =
        match read::<(bool, String, String)>(protocol, &mut conn, Call::new(sql::DOCTOR_PATRONI))
            .await
        {
            Ok(rows) => match rows.into_iter().next() {
                Some((true, mode, strict)) => PatroniSeen::Seen {
                    synchronous_mode: matches!(mode.as_str(), "true" | "on" | "quorum"),
                    synchronous_mode_strict: matches!(strict.as_str(), "true" | "on"),
                },
                _ => PatroniSeen::NotSeen,
            },
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("42501") => {
                PatroniSeen::Unknown(
                    "reading patroni.dynamic.json needs superuser or pg_read_server_files".into(),
                )
            }
            Err(error) => PatroniSeen::Unknown(error.to_string()),
        };
    let session_tls = read::<(String,)>(protocol, &mut conn, Call::new(sql::DOCTOR_TLS))
        .await
        .map_err(|e| format!("unknown: {e}"))
        .and_then(|rows| {
            rows.into_iter()
                .next()
                .map(|(tls,)| tls)
                .ok_or_else(|| "unknown".into())
        })
        .unwrap_or_else(|why| why);
    let _ = conn.close().await;
    // Bounded: a session pooler with no server connection free queues a
    // probe's statements without end.
    let pooler = tokio::time::timeout(2 * alkstore_sqlx::CONNECT_TIMEOUT, pooler(&options))
        .await
        .unwrap_or_else(|_| {
            PoolerSeen::Unknown(
                "the probe had no answer within 20 s (a pool with no server connection free?)"
                    .into(),
            )
        });
    let observed = Observed {
        settings: settings.iter().cloned().collect(),
        in_recovery,
        sees_standbys,
        standbys,
        synchronous_standbys,
        patroni,
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
    shown.push((
        "Patroni".into(),
        match &observed.patroni {
            PatroniSeen::NotSeen => "not seen (no patroni.dynamic.json)".into(),
            PatroniSeen::Seen {
                synchronous_mode,
                synchronous_mode_strict,
            } => format!(
                "synchronous_mode = {synchronous_mode}, synchronous_mode_strict = {synchronous_mode_strict}"
            ),
            PatroniSeen::Unknown(why) => format!("unknown: {why}"),
        },
    ));
    shown.push((
        "pooler".into(),
        match &pooler {
            PoolerSeen::NotSeen => "none seen (startup parameters reach the server)".into(),
            PoolerSeen::Seen { how, transaction } => format!(
                "{how}; {}",
                match transaction {
                    true => "transaction mode (a connection's server process changed between its transactions)",
                    false => "session mode, as far as a probe can tell (a connection kept its server process)",
                }
            ),
            PoolerSeen::Unknown(why) => format!("unknown: {why}"),
        },
    ));
    shown.push(("TLS asked (URL)".into(), tls_asked(options.get_ssl_mode())));
    // Behind a pooler the server sees the pooler's session, not this one.
    let behind_a_pooler =
        url.pooler != crate::Pooler::None || matches!(pooler, PoolerSeen::Seen { .. });
    shown.push((
        match behind_a_pooler {
            false => "TLS of this session (pg_stat_ssl)",
            true => "TLS of the pooler's session to the server (pg_stat_ssl)",
        }
        .into(),
        session_tls,
    ));
    shown.push((
        "URL pooler".into(),
        format!("{:?}", url.pooler).to_lowercase(),
    ));
    let warnings = warnings(&pooler, url.pooler);
    Ok(Report::new("postgres", server, shown, judge(&observed))
        .with_warnings(warnings)
        .with_standby(in_recovery))
}

/// What the URL's `sslmode` asks for, as doctor reports it.
fn tls_asked(mode: sqlx::postgres::PgSslMode) -> String {
    use sqlx::postgres::PgSslMode;
    let (name, level) = match mode {
        PgSslMode::Disable => ("disable", TlsLevel::Off),
        PgSslMode::Allow => ("allow", TlsLevel::IfOffered),
        PgSslMode::Prefer => ("prefer", TlsLevel::IfOffered),
        PgSslMode::Require => ("require", TlsLevel::Unverified),
        PgSslMode::VerifyCa => ("verify-ca", TlsLevel::CaVerified),
        PgSslMode::VerifyFull => ("verify-full", TlsLevel::FullyVerified),
    };
    format!("{level} (sslmode={name})")
}

/// What to warn of: a pooler in transaction mode the URL does not name.
fn warnings(pooler: &PoolerSeen, told: crate::Pooler) -> Vec<String> {
    match (pooler, told) {
        (
            PoolerSeen::Seen {
                transaction: true, ..
            },
            told,
        ) if told != crate::Pooler::Transaction => {
            vec![
                "a pooler in transaction mode stands between the store and PostgreSQL, and the \
                 URL does not say so: the store's prepared statements fail there; add \
                 pooler=transaction to the URL (docs/deployments.md)"
                    .into(),
            ]
        }
        _ => Vec::new(),
    }
}

/// Probes what stands between: a connection whose startup `options` set a
/// setting (refused, or not reaching the server: a pooler), then, when a
/// pooler is there, whether a connection keeps its server process while
/// another connection holds a transaction open (transaction pooling hands
/// the free one out to the next client, and PgBouncer the one given back
/// last: the one the first connection had).
async fn pooler(options: &sqlx::postgres::PgConnectOptions) -> PoolerSeen {
    let probe = options.clone().options([(sql::DOCTOR_PROBE_SETTING, "on")]);
    let how = match alkstore_sqlx::connect::<Postgres>(&probe).await {
        Ok(mut conn) => {
            let seen = sqlx::raw_sql(sql::DOCTOR_PROBE_READ)
                .fetch_one(&mut conn)
                .await
                .and_then(|row| sqlx::Row::try_get::<Option<String>, _>(&row, 0));
            let _ = conn.close().await;
            match seen {
                Ok(Some(on)) if on == "on" => return PoolerSeen::NotSeen,
                Ok(_) => "a pooler: the startup parameters do not reach the server",
                Err(error) => return PoolerSeen::Unknown(error.to_string()),
            }
        }
        Err(error) => {
            let text = format!("{:?}", std::error::Error::source(&error));
            match text.contains("unsupported startup parameter") {
                true => "a pooler: it refuses the startup parameter options (PgBouncer does)",
                false => return PoolerSeen::Unknown(error.to_string()),
            }
        }
    };
    match transaction_pooling(options).await {
        Ok(transaction) => PoolerSeen::Seen { how, transaction },
        Err(error) => PoolerSeen::Unknown(format!("{how}; its mode: {error}")),
    }
}

/// The server process `conn` runs on now.
async fn backend(conn: &mut sqlx::PgConnection) -> Result<i32, sqlx::Error> {
    let row = sqlx::raw_sql(sql::DOCTOR_BACKEND).fetch_one(conn).await?;
    sqlx::Row::try_get(&row, 0)
}

/// Whether a connection's server process changes while another connection
/// holds a transaction open on it. The second connection opens a
/// transaction until it lands on the server process the first had (a
/// transaction pooler hands the one given back last to the next client;
/// others' traffic may interfere, so a few tries); only then does the first
/// ask again. In session mode the second never lands there: no change.
async fn transaction_pooling(options: &sqlx::postgres::PgConnectOptions) -> Result<bool, BoxError> {
    let mut first = alkstore_sqlx::connect::<Postgres>(options).await?;
    let mut second = alkstore_sqlx::connect::<Postgres>(options).await?;
    let mut changed = false;
    for _ in 0..5 {
        let before = backend(&mut first).await?;
        sqlx::raw_sql("BEGIN").execute(&mut second).await?;
        let taken = backend(&mut second).await? == before;
        let after = backend(&mut first).await?;
        sqlx::raw_sql("ROLLBACK").execute(&mut second).await?;
        if taken {
            changed = after != before;
            break;
        }
    }
    let _ = first.close().await;
    let _ = second.close().await;
    Ok(changed)
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
    if let PatroniSeen::Seen {
        synchronous_mode: true,
        synchronous_mode_strict: false,
    } = observed.patroni
    {
        return Finding::given_up(
            promise,
            "Patroni's synchronous_mode is on without synchronous_mode_strict: when the synchronous standby goes away, Patroni empties synchronous_standby_names and grants commit on the primary alone, which a failover then loses; set synchronous_mode_strict: true (and run two standbys, so that grants need not wait for one)",
        );
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
            patroni: PatroniSeen::NotSeen,
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
    fn patronis_synchronous_mode_without_strict_gives_the_failover_promise_up() {
        let patroni = |synchronous_mode, synchronous_mode_strict| {
            let mut seen = observed(&[("synchronous_standby_names", "node1")], 1);
            seen.patroni = PatroniSeen::Seen {
                synchronous_mode,
                synchronous_mode_strict,
            };
            judge(&seen).remove(2)
        };
        let loose = patroni(true, false);
        assert_eq!(loose.verdict, GivenUp);
        assert!(loose.because.contains("synchronous_mode_strict"));
        assert_eq!(patroni(true, true).verdict, Kept);
    }

    #[test]
    fn only_an_untold_transaction_pooler_is_warned_of() {
        let seen = |transaction| PoolerSeen::Seen {
            how: "a pooler",
            transaction,
        };
        assert_eq!(warnings(&seen(true), crate::Pooler::None).len(), 1);
        assert_eq!(warnings(&seen(true), crate::Pooler::Session).len(), 1);
        assert!(warnings(&seen(true), crate::Pooler::Transaction).is_empty());
        assert!(warnings(&seen(false), crate::Pooler::None).is_empty());
        assert!(warnings(&PoolerSeen::NotSeen, crate::Pooler::None).is_empty());
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
