//! `alkstore doctor` for MariaDB: the server's durability and replication
//! settings read on one connection (no store opened, nothing created), and
//! the contract's promises judged by them (docs/failover.md's table).

use std::collections::HashMap;

use alkstore_core::BoxError;
use alkstore_core::doctor::{Finding, InspectFuture, Promise, Report, Verdict, inspecting};
use sqlx::Connection;

use crate::connection::MySql;
use crate::sql;

/// The longest `rpl_semi_sync_master_timeout` (ms): only at it does
/// semi-sync replication never fall back to asynchronous by itself (about
/// 49.7 days without a replica's answer).
const LONGEST_SEMI_SYNC_TIMEOUT: u64 = u32::MAX as u64;

/// Inspects the server `url` names (its database ignored).
pub(crate) fn inspect_url(url: &str) -> InspectFuture<'_> {
    inspecting(async move { inspect(&crate::url::parse(url)?.0).await })
}

async fn inspect(url: &str) -> Result<Report, BoxError> {
    let (server, mut conn) = alkstore_sqlx::connect_url::<MySql>(url).await?;
    let mut shown: Vec<(String, String)> = sqlx::query_as(sql::DOCTOR_VARIABLES)
        .fetch_all(&mut conn)
        .await?;
    shown.extend(
        sqlx::query_as::<_, (String, String)>(sql::DOCTOR_STATUS)
            .fetch_all(&mut conn)
            .await?,
    );
    let _ = conn.close().await;
    let observed = shown
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v.to_ascii_uppercase()))
        .collect();
    Ok(Report::new("mysql", server, shown, judge(&observed)))
}

/// The promises, judged by the variables and status the server showed
/// (names lowercased, values uppercased).
pub(crate) fn judge(observed: &HashMap<String, String>) -> Vec<Finding> {
    let get = |name: &str| observed.get(name).map_or("", String::as_str);
    let flush = get("innodb_flush_log_at_trx_commit");
    // 3 is 1 with the log written at prepare too: as durable.
    let crash = if flush == "1" || flush == "3" {
        Finding::kept(
            Promise::NoGrantLostInACrash,
            format!(
                "innodb_flush_log_at_trx_commit = {flush}: every commit is on disk when answered"
            ),
        )
    } else {
        Finding::given_up(
            Promise::NoGrantLostInACrash,
            format!(
                "innodb_flush_log_at_trx_commit = {flush}: the commits of about the last second are lost in a crash"
            ),
        )
    };
    let binary_log = get("log_bin") == "ON";
    let failover = failover(&get, &crash);
    let fences = if binary_log {
        Finding::kept(
            Promise::FencesRiseAcrossAFailover,
            "a grant on another server_id raises the sequence by 2^32, once per promotion; after two promotions within one replication lag run `alkstore raise-fences`",
        )
    } else {
        Finding::new(
            Promise::FencesRiseAcrossAFailover,
            Verdict::NotApplicable,
            "log_bin = OFF: nothing replicates from this server",
        )
    };
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
