//! Faults against a real server: a holder process killed with SIGKILL, the
//! server stopped and restarted under load, the store's sessions killed
//! with `KILL CONNECTION`, more waiters than connections, futures dropped
//! mid-call. The bodies are `alkstore_contract_suite::faults`, shared with
//! PostgreSQL; this file is MariaDB's `Admin` and the tests' glue.
//!
//! This binary gets a throwaway server of its own (the harness starts one per
//! test process), so restarting it disturbs no other test binary; the tests
//! here take turns through `SERIAL`.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use alkstore_contract_suite::faults::{self, Admin, TableLock};
use alkstore_contract_suite::support::assert_dead_holder_blocks_until_ttl;
use alkstore_core::Store;
use alkstore_mysql::MySqlStore;
use alkstore_testkit::mysql;
use async_trait::async_trait;
use sqlx::{Connection, MySqlConnection};
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

/// MariaDB's ways of ending sessions and locking a table, on connections of
/// the test's own.
struct MariaDb {
    db: common::Database,
    admin: Mutex<MySqlConnection>,
}

impl MariaDb {
    async fn new(db: common::Database) -> Self {
        let admin = MySqlConnection::connect(&db.url).await.unwrap();
        MariaDb {
            db,
            admin: Mutex::new(admin),
        }
    }
}

/// Runs test-made SQL text.
async fn run(conn: &mut MySqlConnection, statement: String) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
        .execute(conn)
        .await
        .map(drop)
}

/// Kills each session of `ids` and waits (10 s at most) until all are
/// gone; answers how many were killed.
async fn kill(admin: &mut MySqlConnection, ids: &[i64]) -> u64 {
    let mut killed = 0;
    for id in ids {
        // Gone already: fine.
        if run(admin, format!("KILL CONNECTION {id}")).await.is_ok() {
            killed += 1;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    for id in ids {
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
            assert!(Instant::now() < deadline, "killed sessions did not end");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    killed
}

/// The test user's sessions on the server other than the asker's.
const OTHER_SESSIONS: &str = "SELECT ID FROM information_schema.PROCESSLIST
     WHERE ID <> CONNECTION_ID() AND USER = SUBSTRING_INDEX(CURRENT_USER(), '@', 1)
       AND COMMAND <> 'Daemon'";

#[async_trait]
impl Admin for MariaDb {
    async fn end_sessions(&self) -> u64 {
        let mut admin = self.admin.lock().await;
        let ids: Vec<i64> = sqlx::query_scalar(OTHER_SESSIONS)
            .fetch_all(&mut *admin)
            .await
            .unwrap();
        kill(&mut admin, &ids).await
    }

    async fn end_idle_sessions(&self, idle_for: Duration, spare: Option<i64>) -> u64 {
        let mut admin = self.admin.lock().await;
        let ids: Vec<i64> = sqlx::query_scalar(
            "SELECT ID FROM information_schema.PROCESSLIST
             WHERE ID <> CONNECTION_ID() AND ID <> ? AND COMMAND = 'Sleep' AND TIME_MS >= ?",
        )
        .bind(spare.unwrap_or(0))
        .bind(idle_for.as_millis() as f64)
        .fetch_all(&mut *admin)
        .await
        .unwrap();
        kill(&mut admin, &ids).await
    }

    async fn sessions(&self) -> i64 {
        let mut admin = self.admin.lock().await;
        let ids: Vec<i64> = sqlx::query_scalar(OTHER_SESSIONS)
            .fetch_all(&mut *admin)
            .await
            .unwrap();
        ids.len() as i64
    }

    async fn lock_table(&self) -> Box<dyn TableLock> {
        let mut conn = MySqlConnection::connect(&self.db.url).await.unwrap();
        let lock = format!("LOCK TABLES {}.locks WRITE", self.db.quoted());
        run(&mut conn, lock).await.unwrap();
        let session: i64 = sqlx::query_scalar("SELECT CAST(CONNECTION_ID() AS SIGNED)")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        Box::new(LockedTables { conn, session })
    }
}

/// A session holding `LOCK TABLES … WRITE`.
struct LockedTables {
    conn: MySqlConnection,
    session: i64,
}

#[async_trait]
impl TableLock for LockedTables {
    fn session(&self) -> i64 {
        self.session
    }

    async fn unlock(mut self: Box<Self>) {
        run(&mut self.conn, "UNLOCK TABLES".into()).await.unwrap();
        let _ = self.conn.close().await;
    }
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
        faults::server_restart_under_load(
            store.clone(),
            &format!("SIG{signal}"),
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
    }
    store.drop_database().await.unwrap();
    store.close().await.unwrap();
}

/// A store in a database of its own, with its admin.
async fn store(label: &str) -> Option<(Arc<MySqlStore>, MariaDb)> {
    let (store, db) = common::store(label).await?;
    Some((Arc::new(store), MariaDb::new(db).await))
}

/// The store's sessions killed mid-run with `KILL CONNECTION`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_killed_mid_run() {
    let _turn = SERIAL.lock().await;
    let Some((store, admin)) = store("kill").await else {
        return;
    };
    faults::connections_killed_mid_run(store.clone(), &admin).await;
    store.close().await.unwrap();
    admin.db.drop().await;
}

/// Behind `LOCK TABLES … WRITE`, after the store's idle session was killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_acquire_after_a_lost_connection_keeps_to_its_wait() {
    let _turn = SERIAL.lock().await;
    let Some((store, admin)) = store("lostwait").await else {
        return;
    };
    faults::a_waiting_acquire_after_a_lost_connection_keeps_to_its_wait(&*store, &admin).await;
    store.close().await.unwrap();
    admin.db.drop().await;
}

/// Sleeping sessions killed every 50 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_session_killer_is_invisible_to_the_holder() {
    let _turn = SERIAL.lock().await;
    let Some((store, admin)) = store("idlekill").await else {
        return;
    };
    faults::an_idle_session_killer_is_invisible_to_the_holder(&*store, &admin).await;
    store.close().await.unwrap();
    admin.db.drop().await;
}

/// A store over a pool of `connections`, in a database of its own, with
/// its admin and the sessions there were before it opened.
async fn bounded_store(label: &str, connections: u32) -> Option<(Arc<MySqlStore>, MariaDb, i64)> {
    let server = mysql::server()?;
    let db = common::Database {
        url: server.url.clone(),
        name: alkstore_testkit::unique_name(label),
    };
    let admin = MariaDb::new(db).await;
    let before = admin.sessions().await;
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(connections)
        .connect(&server.url)
        .await
        .unwrap();
    let store = MySqlStore::open(pool, &admin.db.name).await.unwrap();
    Some((Arc::new(store), admin, before))
}

/// A store over a pool of 2 connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_waiters_than_connections() {
    let _turn = SERIAL.lock().await;
    let Some((store, admin, _)) = bounded_store("starve", 2).await else {
        return;
    };
    faults::more_waiters_than_connections(store.clone()).await;
    store.close().await.unwrap();
    admin.db.drop().await;
}

/// A store over a pool of 3 connections: at most 4 sessions (3 for
/// operations, 1 the pool kept from opening). Sessions are counted per
/// server, so only on the harness's own, which nothing else uses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_futures_leak_no_connection() {
    let _turn = SERIAL.lock().await;
    if mysql::server().is_some_and(|server| server.instance.is_none()) {
        eprintln!(
            "SKIPPED: cancelled_futures_leak_no_connection needs the harness's own server, not {}",
            mysql::URL_VAR
        );
        return;
    }
    let Some((store, admin, before)) = bounded_store("cancel", 3).await else {
        return;
    };
    faults::cancelled_futures_leak_no_connection(store.clone(), &admin, before, 4).await;
    store.close().await.unwrap();
    admin.db.drop().await;
}
