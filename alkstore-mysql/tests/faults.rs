//! Faults against a real server: a holder process killed with SIGKILL, the
//! server stopped and restarted under load, and the store's sessions killed
//! with `KILL CONNECTION`.
//!
//! This binary gets a throwaway server of its own (the harness starts one per
//! test process), so restarting it disturbs no other test binary; the tests
//! here take turns through `SERIAL`.

mod common;

use std::sync::Arc;
use std::time::Duration;

use alkstore_contract_suite::load::{through_an_outage, through_killed_sessions};
use alkstore_contract_suite::safety::history::check;
use alkstore_contract_suite::support::{
    assert_dead_holder_blocks_until_ttl, assert_waits_out_a_table_lock,
};
use alkstore_core::Store;
use alkstore_mysql::MySqlStore;
use alkstore_testkit::mysql;
use tokio::sync::Mutex;

static SERIAL: Mutex<()> = Mutex::const_new(());

const CHILD_DATABASE: &str = "ALKSTORE_TEST_CHILD_DATABASE";

/// The child side of `killed_holder_blocks_until_its_ttl`: takes the lock,
/// says so, and hangs until killed.
#[tokio::test]
#[ignore = "run by killed_holder_blocks_until_its_ttl in a child process"]
async fn child_holds_until_killed() {
    let database = std::env::var(CHILD_DATABASE).expect("started by the parent test");
    let url = std::env::var(mysql::URL_VAR).unwrap();
    let store = MySqlStore::connect(&url, &database).await.unwrap();
    let lock = store
        .try_lock("job", "child", Duration::from_secs(2))
        .await
        .unwrap()
        .unwrap();
    alkstore_testkit::child::report_held_and_hang(lock.fence()).await;
}

/// A holder process killed with SIGKILL: nobody gets the lock before its TTL
/// runs out, and a waiter gets it once it has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_holder_blocks_until_its_ttl() {
    let _turn = SERIAL.lock().await;
    let Some((store, db)) = common::store("sigkill").await else {
        return;
    };
    let fence = alkstore_testkit::child::hold_in_child_and_kill(
        "child_holds_until_killed",
        &[(CHILD_DATABASE, &db.name), (mysql::URL_VAR, &db.url)],
    );
    let (left, waited) = assert_dead_holder_blocks_until_ttl(&store, "job", "child", fence).await;
    eprintln!("sigkill: holder killed with {left:?} left; granted {waited:?} after asking");
    store.close().await.unwrap();
    db.drop().await;
}

/// The server stopped (cleanly, then by a crash) and restarted under load:
/// operations fail with `Error::Database` (no panic, no hang), the same store
/// works again afterwards without reopening, fences keep rising, and no two
/// holders overlap across the outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_restart_under_load() {
    let _turn = SERIAL.lock().await;
    let Some(server) = mysql::server() else {
        return;
    };
    let Some(instance) = &server.instance else {
        eprintln!(
            "SKIPPED: server_restart_under_load needs the harness's own server, not {}",
            mysql::URL_VAR
        );
        return;
    };
    let database = alkstore_testkit::unique_name("restart");
    let store = Arc::new(MySqlStore::connect(&server.url, &database).await.unwrap());
    for signal in ["TERM", "KILL"] {
        let outage = through_an_outage(
            store.clone() as Arc<dyn Store>,
            8,
            async {
                let stopped = tokio::task::spawn_blocking(move || instance.stop(signal));
                stopped.await.unwrap().expect("stop the server");
            },
            async {
                let started = tokio::task::spawn_blocking(move || instance.start());
                started.await.unwrap().expect("start the server");
            },
        )
        .await;
        assert_eq!(check(&outage.history), Ok(()));
        assert!(
            outage.grants_before > 0 && outage.errors_during > 0,
            "no load, or no outage seen"
        );
        eprintln!(
            "restart (SIG{signal}): {} grants checked, {} errors (all Error::Database), \
             slowest op {} ms, recovered {:?} after start, violations: 0",
            outage.history.len(),
            outage.errors,
            outage.slowest_ms,
            outage.recovered_after
        );
    }
    store.drop_database().await.unwrap();
    store.close().await.unwrap();
}

/// The store's sessions killed mid-run with `KILL CONNECTION`: the store
/// recovers, a kept lease survives (the failed renewal is retried), and
/// nothing overlaps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_killed_mid_run() {
    let _turn = SERIAL.lock().await;
    let Some((store, db)) = common::store("kill").await else {
        return;
    };
    let store = Arc::new(store);
    let admin = MySqlStore::connect(&db.url, &db.name).await.unwrap();
    let (killed, grants, errors) =
        through_killed_sessions(store.clone() as Arc<dyn Store>, 6, || async {
            let sessions: Vec<(i64,)> = sqlx::query_as(
                "SELECT ID FROM information_schema.PROCESSLIST
                 WHERE ID <> CONNECTION_ID() AND USER = SUBSTRING_INDEX(CURRENT_USER(), '@', 1)
                   AND COMMAND <> 'Daemon'",
            )
            .fetch_all(admin.pool())
            .await
            .unwrap();
            let mut killed = 0;
            for (id,) in sessions {
                // Gone already, or the admin pool's own other connection: fine.
                if sqlx::raw_sql(sqlx::AssertSqlSafe(format!("KILL CONNECTION {id}")))
                    .execute(admin.pool())
                    .await
                    .is_ok()
                {
                    killed += 1;
                }
            }
            killed
        })
        .await;
    eprintln!(
        "kill: {killed} sessions killed, {grants} grants checked, {errors} errors, \
         kept lease held throughout, violations: 0"
    );
    store.close().await.unwrap();
    admin.close().await.unwrap();
    db.drop().await;
}

/// Kills every sleeping session of the server idle for at least `idle_for`
/// but the asker's and the one numbered `spare`, and waits until they are
/// gone; answers how many.
async fn kill_idle_sessions(
    admin: &mut sqlx::MySqlConnection,
    idle_for: Duration,
    spare: i64,
) -> usize {
    let ids: Vec<(i64,)> = sqlx::query_as(
        "SELECT ID FROM information_schema.PROCESSLIST
         WHERE ID <> CONNECTION_ID() AND ID <> ? AND COMMAND = 'Sleep' AND TIME_MS >= ?",
    )
    .bind(spare)
    .bind(idle_for.as_millis() as f64)
    .fetch_all(&mut *admin)
    .await
    .unwrap();
    for (id,) in &ids {
        // Gone already: fine.
        let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!("KILL CONNECTION {id}")))
            .execute(&mut *admin)
            .await;
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    for (id,) in &ids {
        loop {
            let (left,): (i64,) =
                sqlx::query_as("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?")
                    .bind(id)
                    .fetch_one(&mut *admin)
                    .await
                    .unwrap();
            if left == 0 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "killed sessions did not end"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    ids.len()
}

/// A waiting acquire whose idle connection the server ended meanwhile keeps
/// to its wait behind a table lock (`LOCK TABLES … WRITE`): the try on a new
/// connection is bounded like the first, and it answers `None` at its
/// deadline, not when the table lock ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_acquire_after_a_lost_connection_keeps_to_its_wait() {
    use sqlx::Connection;
    let _turn = SERIAL.lock().await;
    let Some((store, db)) = common::store("lostwait").await else {
        return;
    };
    // One connection of the store's own sits idle.
    assert!(store.holder("job").await.unwrap().is_none());
    let mut blocker = sqlx::MySqlConnection::connect(&db.url).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "LOCK TABLES `{}`.locks WRITE",
        db.name
    )))
    .execute(&mut blocker)
    .await
    .unwrap();
    let (blocker_id,): (i64,) = sqlx::query_as("SELECT CAST(CONNECTION_ID() AS SIGNED)")
        .fetch_one(&mut blocker)
        .await
        .unwrap();
    let mut other = sqlx::MySqlConnection::connect(&db.url).await.unwrap();
    assert!(kill_idle_sessions(&mut other, Duration::ZERO, blocker_id).await >= 1);
    assert_waits_out_a_table_lock(
        &store,
        "the waiting acquire outlived its wait behind the table lock",
        async {
            sqlx::raw_sql("UNLOCK TABLES")
                .execute(&mut blocker)
                .await
                .unwrap();
        },
    )
    .await;
    store.close().await.unwrap();
    let _ = blocker.close().await;
    let _ = other.close().await;
    db.drop().await;
}

/// An idle-session killer ends the store's sessions while a keep-alive
/// holds a lease: the lease survives, and the release afterwards, on a
/// connection that died while idle, answers `true` instead of an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_session_killer_is_invisible_to_the_holder() {
    use sqlx::Connection;
    let _turn = SERIAL.lock().await;
    let Some((store, db)) = common::store("idlekill").await else {
        return;
    };
    let admin = tokio::sync::Mutex::new(sqlx::MySqlConnection::connect(&db.url).await.unwrap());
    let killed =
        alkstore_contract_suite::load::through_an_idle_session_killer(&store, |idle_for| {
            let admin = &admin;
            async move { kill_idle_sessions(&mut *admin.lock().await, idle_for, 0).await as u64 }
        })
        .await;
    eprintln!("idle-session killer: {killed} sessions ended, lease kept, release answered true");
    store.close().await.unwrap();
    db.drop().await;
}
