//! `alkstore doctor` for MariaDB: the server's durability and replication
//! settings read on one connection (no store opened, nothing created), and
//! the contract's promises judged by them (docs/failover.md's table).

use std::collections::HashMap;

use alkstore_core::BoxError;
use alkstore_core::doctor::{Finding, InspectFuture, Promise, Report, Verdict, inspecting};
use sqlx::Connection;

use alkstore_sqlx::TlsLevel;

use crate::connection::MySql;
use crate::sql;

/// The longest `rpl_semi_sync_master_timeout` (ms): only at it does
/// semi-sync replication never fall back to asynchronous by itself (about
/// 49.7 days without a replica's answer).
const LONGEST_SEMI_SYNC_TIMEOUT: u64 = u32::MAX as u64;

/// Inspects the server `url` names, and the fences left in its store (the
/// URL's database, `alkstore` by default) when there is one.
pub(crate) fn inspect_url(url: &str) -> InspectFuture<'_> {
    inspecting(async move {
        let (url, database) = crate::url::parse(url)?;
        inspect(&url, &database).await
    })
}

async fn inspect(url: &str, database: &str) -> Result<Report, BoxError> {
    let (server, mut conn) = alkstore_sqlx::connect_url::<MySql>(url).await?;
    let asked = tls_asked(alkstore_sqlx::driver_options::<MySql>(url)?.get_ssl_mode());
    let mut shown: Vec<(String, String)> = sqlx::query_as(sql::DOCTOR_VARIABLES)
        .fetch_all(&mut conn)
        .await?;
    shown.extend(
        sqlx::query_as::<_, (String, String)>(sql::DOCTOR_STATUS)
            .fetch_all(&mut conn)
            .await?,
    );
    // The sequence's next value not yet handed to any connection's cache:
    // no fence below it is left, so what is left is at most this.
    let next = sqlx::query_as::<_, (i64,)>(sql::doctor_next_fence(database))
        .fetch_one(&mut conn)
        .await
        .map(|(next,)| alkstore_core::fence_from_sql(next))
        .map_err(|e| format!("unknown: no store's fences in database {database:?} ({e})"));
    let session_tls = sqlx::query_as::<_, (String, String)>(sql::DOCTOR_TLS)
        .fetch_all(&mut conn)
        .await
        .map(|rows| {
            let get = |name: &str| rows.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
            match (get("Ssl_version"), get("Ssl_cipher")) {
                (Some(version), Some(cipher)) if !cipher.is_empty() => {
                    format!("{version}, {cipher}")
                }
                _ => "not encrypted".to_owned(),
            }
        })
        .unwrap_or_else(|e| format!("unknown: {e}"));
    let _ = conn.close().await;
    shown.push(alkstore_core::doctor::fences_left(next));
    shown.push(("TLS asked (URL)".into(), asked));
    shown.push((
        "TLS of this session (Ssl_version, Ssl_cipher)".into(),
        session_tls,
    ));
    let observed = shown
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v.to_ascii_uppercase()))
        .collect();
    Ok(Report::new("mysql", server, shown, judge(&observed)))
}

/// What the URL's `ssl-mode` asks for, as doctor reports it.
fn tls_asked(mode: sqlx::mysql::MySqlSslMode) -> String {
    use sqlx::mysql::MySqlSslMode;
    let (name, level) = match mode {
        MySqlSslMode::Disabled => ("DISABLED", TlsLevel::Off),
        MySqlSslMode::Preferred => ("PREFERRED", TlsLevel::IfOffered),
        MySqlSslMode::Required => ("REQUIRED", TlsLevel::Unverified),
        MySqlSslMode::VerifyCa => ("VERIFY_CA", TlsLevel::CaVerified),
        MySqlSslMode::VerifyIdentity => ("VERIFY_IDENTITY", TlsLevel::FullyVerified),
    };
    format!("{level} (ssl-mode={name})")
}

/// The promises, judged by the variables and status the server showed
/// (names lowercased, values uppercased).
pub(crate) fn judge(observed: &HashMap<String, String>) -> Vec<Finding> {
    let get = |name: &str| observed.get(name).map_or("", String::as_str);
    let binary_log = get("log_bin") == "ON";
    let fences = if binary_log {
        Finding::kept(
            Promise::FencesRiseAcrossAFailover,
            "a grant on another server_id raises the sequence by 2^32, once per promotion, and takes over its owner's rows of the old one; after two promotions within one replication lag run `alkstore raise-fences`",
        )
    } else {
        Finding::new(
            Promise::FencesRiseAcrossAFailover,
            Verdict::NotApplicable,
            "log_bin = OFF: nothing replicates from this server",
        )
    };
    // A replica's own settings say nothing of the primary's commits, and a
    // read-only server grants nothing (alkstore's role is no superuser).
    if let Some(why) = replica(&get) {
        let unknown = |promise| {
            Finding::new(
                promise,
                Verdict::Unknown,
                format!("{why}: its settings are not the primary's; run doctor on the primary"),
            )
        };
        return vec![
            Finding::new(
                Promise::Exclusion,
                Verdict::NotApplicable,
                format!("{why}: it grants nothing; run doctor on the primary"),
            ),
            unknown(Promise::NoGrantLostInACrash),
            unknown(Promise::NoGrantLostInAFailover),
            fences,
        ];
    }
    let crash = crash(&get);
    let failover = failover(&get, &crash);
    vec![
        Finding::kept(
            Promise::Exclusion,
            "the grants of a name are serialised by its row lock on the primary",
        ),
        crash,
        failover,
        fences,
    ]
}

/// Why the server is not a primary that grants: read-only, or replicating
/// from another server. `None` for a writable server replicating from none.
fn replica<'a>(get: &impl Fn(&str) -> &'a str) -> Option<String> {
    let read_only = get("read_only");
    // MariaDB 10.11 answers ON/OFF; later versions name levels (NO_LOCK…).
    if !read_only.is_empty() && read_only != "OFF" {
        return Some(format!(
            "read_only = {read_only}: this server takes no writes (a replica, or a primary fenced off)"
        ));
    }
    let running = get("slaves_running");
    if running.parse::<u64>().unwrap_or(0) > 0 {
        return Some(format!(
            "Slaves_running = {running}: this server is a replica of another"
        ));
    }
    None
}

/// No answered grant lost in a crash (a power loss included): the InnoDB
/// log flushed at commit, no torn pages, and with the binary log on, its
/// record of the commit synced too — it coordinates InnoDB's two-phase
/// commit, and at 1 InnoDB leaves its commit record unsynced, so recovery
/// rolls back a prepared transaction the binary log lost (MariaDB's
/// "binary log group commit and InnoDB flushing performance": with
/// `innodb_flush_log_at_trx_commit = 1`, `log_bin` and `sync_binlog = 0`,
/// commits are not guaranteed durable; 3 syncs InnoDB's commit as well).
fn crash<'a>(get: &impl Fn(&str) -> &'a str) -> Finding {
    let promise = Promise::NoGrantLostInACrash;
    let flush = get("innodb_flush_log_at_trx_commit");
    if flush != "1" && flush != "3" {
        return Finding::given_up(
            promise,
            format!(
                "innodb_flush_log_at_trx_commit = {flush}: the commits of about the last second are lost in a crash"
            ),
        );
    }
    if get("innodb_doublewrite") == "OFF" {
        return Finding::given_up(
            promise,
            "innodb_doublewrite = OFF: a page torn by a crash can corrupt the locks table",
        );
    }
    let sync_binlog = get("sync_binlog");
    if flush == "1" && get("log_bin") == "ON" && sync_binlog != "1" {
        return Finding::given_up(
            promise,
            format!(
                "sync_binlog = {sync_binlog} with log_bin = ON and innodb_flush_log_at_trx_commit = 1: InnoDB leaves the commit to the binary log, which a power loss can lose, and recovery then rolls the answered grant back (set sync_binlog = 1)"
            ),
        );
    }
    Finding::kept(
        promise,
        format!("innodb_flush_log_at_trx_commit = {flush}: every commit is on disk when answered"),
    )
}

fn failover<'a>(get: &impl Fn(&str) -> &'a str, crash: &Finding) -> Finding {
    let promise = Promise::NoGrantLostInAFailover;
    let given_up = |because: String| Finding::given_up(promise, because);
    if crash.verdict == Verdict::GivenUp {
        return given_up(format!("as for a crash: {}", crash.because));
    }
    if get("log_bin") != "ON" {
        return given_up("log_bin = OFF: nothing replicates from this server".into());
    }
    let sync_binlog = get("sync_binlog");
    if sync_binlog != "1" {
        return given_up(format!(
            "sync_binlog = {sync_binlog}: after a crash the binary log can lack commits that were answered"
        ));
    }
    if !get("version").contains("MARIADB") {
        return Finding::new(
            promise,
            Verdict::Unknown,
            format!(
                "version {}: not MariaDB, whose semi-sync settings these are (the engine needs MariaDB's sequences)",
                get("version")
            ),
        );
    }
    if get("rpl_semi_sync_master_enabled") != "ON" {
        return given_up(
            "rpl_semi_sync_master_enabled is not ON: replication is asynchronous, and a promoted replica lacks what it had not received".into(),
        );
    }
    if get("rpl_semi_sync_master_wait_point") != "AFTER_SYNC" {
        return given_up(format!(
            "rpl_semi_sync_master_wait_point = {}: other sessions see a commit before a replica has it (AFTER_SYNC does not)",
            get("rpl_semi_sync_master_wait_point")
        ));
    }
    if get("rpl_semi_sync_master_wait_no_slave") != "ON" {
        return given_up(
            "rpl_semi_sync_master_wait_no_slave = OFF: with no replica connected, commits do not wait".into(),
        );
    }
    let timeout = get("rpl_semi_sync_master_timeout");
    if timeout.parse::<u64>().unwrap_or(0) < LONGEST_SEMI_SYNC_TIMEOUT {
        return given_up(format!(
            "rpl_semi_sync_master_timeout = {timeout} ms: a replica silent that long and semi-sync falls back to asynchronous, answering commits no replica has (the longest, {LONGEST_SEMI_SYNC_TIMEOUT}, is about 49.7 days)"
        ));
    }
    if get("rpl_semi_sync_master_status") != "ON" {
        return given_up(
            "Rpl_semi_sync_master_status = OFF: semi-sync replication is not in effect now".into(),
        );
    }
    Finding::kept(
        promise,
        format!(
            "semi-sync AFTER_SYNC, no fallback: a grant is answered once a replica has it ({} semi-sync replicas now)",
            get("rpl_semi_sync_master_clients")
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observed(changes: &[(&str, &str)]) -> HashMap<String, String> {
        let mut all: HashMap<String, String> = [
            ("innodb_flush_log_at_trx_commit", "1"),
            ("sync_binlog", "1"),
            ("log_bin", "ON"),
            ("rpl_semi_sync_master_enabled", "ON"),
            ("rpl_semi_sync_master_wait_point", "AFTER_SYNC"),
            ("rpl_semi_sync_master_wait_no_slave", "ON"),
            ("rpl_semi_sync_master_timeout", "4294967295"),
            ("rpl_semi_sync_master_status", "ON"),
            ("rpl_semi_sync_master_clients", "1"),
            ("innodb_doublewrite", "ON"),
            ("read_only", "OFF"),
            ("slaves_running", "0"),
            ("version", "10.11.6-MARIADB-0+DEB12U1-LOG"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        for (k, v) in changes {
            all.insert((*k).to_owned(), (*v).to_owned());
        }
        all
    }

    #[test]
    fn a_replica_or_a_read_only_server_is_not_judged_as_a_primary() {
        for change in [("read_only", "ON"), ("slaves_running", "1")] {
            let findings = judge(&observed(&[change]));
            assert_eq!(findings[0].verdict, Verdict::NotApplicable, "{change:?}");
            assert_eq!(findings[1].verdict, Verdict::Unknown, "{change:?}");
            assert_eq!(findings[2].verdict, Verdict::Unknown, "{change:?}");
            assert!(findings[2].because.to_lowercase().contains(change.0));
            assert!(findings[2].because.contains("run doctor on the primary"));
        }
    }

    #[test]
    fn each_setting_that_gives_the_crash_promise_up_is_named() {
        for (changes, named) in [
            (
                &[("innodb_flush_log_at_trx_commit", "2")][..],
                "innodb_flush_log_at_trx_commit",
            ),
            (&[("innodb_doublewrite", "OFF")][..], "innodb_doublewrite"),
            (&[("sync_binlog", "0")][..], "sync_binlog"),
        ] {
            let findings = judge(&observed(changes));
            assert_eq!(findings[1].verdict, Verdict::GivenUp, "{named}");
            assert!(
                findings[1].because.contains(named),
                "{}",
                findings[1].because
            );
        }
        // Without the binary log, or with InnoDB syncing its own commit (3),
        // sync_binlog does not matter to a crash.
        for changes in [
            &[("sync_binlog", "0"), ("log_bin", "OFF")][..],
            &[
                ("sync_binlog", "0"),
                ("innodb_flush_log_at_trx_commit", "3"),
            ][..],
        ] {
            assert_eq!(
                judge(&observed(changes))[1].verdict,
                Verdict::Kept,
                "{changes:?}"
            );
        }
    }

    #[test]
    fn lossless_semi_sync_keeps_every_promise() {
        let findings = judge(&observed(&[]));
        assert!(
            findings.iter().all(|f| f.verdict == Verdict::Kept),
            "{findings:?}"
        );
    }

    #[test]
    fn each_setting_that_gives_the_failover_promise_up_is_named() {
        for (setting, value) in [
            ("innodb_flush_log_at_trx_commit", "2"),
            ("sync_binlog", "0"),
            ("log_bin", "OFF"),
            ("rpl_semi_sync_master_enabled", "OFF"),
            ("rpl_semi_sync_master_wait_point", "AFTER_COMMIT"),
            ("rpl_semi_sync_master_wait_no_slave", "OFF"),
            ("rpl_semi_sync_master_timeout", "10000"),
            ("rpl_semi_sync_master_status", "OFF"),
        ] {
            let findings = judge(&observed(&[(setting, value)]));
            let failover = &findings[2];
            assert_eq!(failover.verdict, Verdict::GivenUp, "{setting}");
            assert!(
                failover.because.to_lowercase().contains(setting),
                "{setting}: {}",
                failover.because
            );
        }
        let mysql = judge(&observed(&[("version", "8.0.36")]));
        assert_eq!(mysql[2].verdict, Verdict::Unknown);
        assert!(mysql[2].because.contains("not MariaDB"));
    }
}
