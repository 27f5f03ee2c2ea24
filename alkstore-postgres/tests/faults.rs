//! Faults against a real server: a holder process killed with SIGKILL, the
//! server stopped and restarted under load, the store's connections killed
//! with pg_terminate_backend, more waiters than connections, futures
//! dropped mid-call, a crash right after releases. The shared bodies are
//! `alkstore_contract_suite::faults` (MariaDB runs them too); this file is
//! PostgreSQL's `Admin`, the tests' glue, and what only PostgreSQL has.
//!
//! This binary gets a throwaway cluster of its own (the harness starts one per
//! test process), so restarting it disturbs no other test binary; the tests
//! here take turns through `SERIAL`.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use alkstore_contract_suite::faults::{self, Admin, TableLock};
use alkstore_contract_suite::support::assert_dead_holder_blocks_until_ttl;
use alkstore_core::Store;
use alkstore_postgres::PgStore;
use alkstore_testkit::pg::{Cluster, Server};
use async_trait::async_trait;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection};
use tokio::sync::Mutex;

static SERIAL: Mutex<()> = Mutex::const_new(());

const CHILD_SCHEMA: &str = "ALKSTORE_TEST_CHILD_SCHEMA";

/// The child side of `killed_holder_blocks_until_its_ttl`: takes the lock,
/// says so, and hangs until killed.
#[tokio::test]
#[ignore = "run by killed_holder_blocks_until_its_ttl in a child process"]
async fn child_holds_until_killed() {
    let schema = std::env::var(CHILD_SCHEMA).expect("started by the parent test");
    let url = std::env::var(alkstore_testkit::pg::URL_VAR).unwrap();
    let store = PgStore::connect(&url, &schema).await.unwrap();
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
    let Some((store, schema)) = common::store("sigkill").await else {
        return;
    };
    let fence = alkstore_testkit::child::hold_in_child_and_kill(
        "child_holds_until_killed",
        &[
            (CHILD_SCHEMA, &schema.name),
            (alkstore_testkit::pg::URL_VAR, &schema.url),
        ],
    );
    let (left, waited) = assert_dead_holder_blocks_until_ttl(&store, "job", "child", fence).await;
    eprintln!("sigkill: holder killed with {left:?} left; granted {waited:?} after asking");
    store.close().await.unwrap();
    schema.drop().await;
}

/// The harness's own cluster, which `test` stops and starts; `None` (the
/// reason printed) on a server given by URL, or none at all.
fn own_cluster(test: &str) -> Option<(&'static Server, &'static Cluster)> {
    let server = alkstore_testkit::pg::server()?;
    let Some(cluster) = &server.cluster else {
        eprintln!(
            "SKIPPED: {test} needs the harness's own cluster, not {}",
            alkstore_testkit::pg::URL_VAR
        );
        return None;
    };
    Some((server, cluster))
}

/// Median time from a release through another store to the grant of a
/// waiter on `store` (woken through its LISTEN connection).
async fn cross_store_handoff(store: &Arc<PgStore>, other: &PgStore, name: &str) -> Duration {
    let mut handoffs = Vec::new();
    for round in 0..3 {
        let name = format!("{name}-{round}");
        let held = other
            .try_lock(&name, "other", Duration::from_secs(30))
            .await
            .unwrap()
            .unwrap();
        let waiter = {
            let (store, name) = (store.clone(), name.clone());
            tokio::spawn(async move {
                let lock = store
                    .lock(
                        &name,
                        "waiter",
                        Duration::from_secs(30),
                        Duration::from_secs(20),
                    )
                    .await
                    .unwrap()
                    .unwrap();
                (Instant::now(), lock)
            })
        };
        tokio::time::sleep(Duration::from_millis(800)).await;
        let released = Instant::now();
        assert!(held.release().await.unwrap());
        let (granted, lock) = waiter.await.unwrap();
        handoffs.push(granted - released);
        lock.release().await.unwrap();
    }
    handoffs.sort();
    handoffs[1]
}

/// The server stopped and restarted under load: operations fail with
/// `Error::Database` (no panic, no hang), the same store works again
/// afterwards without reopening, its LISTEN connection comes back, and no
/// two holders overlap across the outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_restart_under_load() {
    let _turn = SERIAL.lock().await;
    let Some((server, cluster)) = own_cluster("server_restart_under_load") else {
        return;
    };
    let schema = alkstore_testkit::pg::unique_schema("restart");
    let store = Arc::new(PgStore::connect(&server.url, &schema).await.unwrap());
    let other = PgStore::connect(&server.url, &schema).await.unwrap();
    // Start the listener before the outage.
    let before = cross_store_handoff(&store, &other, "before").await;
    let outage = faults::server_restart_under_load(
        store.clone(),
        "pg_ctl stop -m fast",
        async {
            let stopped =
                tokio::task::spawn_blocking(move || cluster.pg_ctl(&["stop", "-m", "fast", "-w"]));
            assert!(stopped.await.unwrap(), "pg_ctl stop");
        },
        async {
            let started = tokio::task::spawn_blocking(move || cluster.pg_ctl(&["start"]));
            assert!(started.await.unwrap(), "pg_ctl start");
        },
    )
    .await;
    let after = cross_store_handoff(&store, &other, "after").await;
    assert!(
        after < Duration::from_millis(100),
        "LISTEN did not come back: handoff {after:?}"
    );
    eprintln!(
        "restart: recovered {:?} after start, handoff before {before:?} after {after:?}",
        outage.recovered_after
    );
    other.drop_schema().await.unwrap();
    store.close().await.unwrap();
    other.close().await.unwrap();
}

/// PostgreSQL's ways of ending sessions and locking a table, on
/// connections of the test's own.
struct Postgres {
    url: String,
    schema: String,
    admin: Mutex<PgConnection>,
}

impl Postgres {
    async fn new(url: &str, schema: &str) -> Self {
        Postgres {
            url: url.to_owned(),
            schema: schema.to_owned(),
            admin: Mutex::new(PgConnection::connect(url).await.unwrap()),
        }
    }
}

/// Terminates the backends `pids` and waits (10 s at most) until they are
/// gone; answers how many there were.
async fn terminate(admin: &mut PgConnection, pids: Vec<i32>) -> u64 {
    sqlx::query("SELECT count(pg_terminate_backend(pid)) FROM unnest($1::int[]) pid")
        .bind(&pids)
        .execute(&mut *admin)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)")
                .bind(&pids)
                .fetch_one(&mut *admin)
                .await
                .unwrap();
        if left == 0 {
            return pids.len() as u64;
        }
        assert!(Instant::now() < deadline, "terminated sessions did not end");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Client backends of the test database other than the asker's.
const OTHER_BACKENDS: &str = "SELECT pid FROM pg_stat_activity
     WHERE backend_type = 'client backend' AND datname = current_database()
       AND pid <> pg_backend_pid()";

#[async_trait]
impl Admin for Postgres {
    async fn end_sessions(&self) -> u64 {
        let mut admin = self.admin.lock().await;
        let pids = sqlx::query_scalar(OTHER_BACKENDS)
            .fetch_all(&mut *admin)
            .await
            .unwrap();
        terminate(&mut admin, pids).await
    }

    /// Idle ones only: a backend holding a table lock in its transaction is
    /// `idle in transaction`, spared without being named.
    async fn end_idle_sessions(&self, idle_for: Duration, _spare: Option<i64>) -> u64 {
        let mut admin = self.admin.lock().await;
        let pids = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "{OTHER_BACKENDS} AND state = 'idle'
               AND state_change < clock_timestamp() - $1 * interval '1 millisecond'"
        )))
        .bind(idle_for.as_millis() as f64)
        .fetch_all(&mut *admin)
        .await
        .unwrap();
        terminate(&mut admin, pids).await
    }

    async fn sessions(&self) -> i64 {
        let mut admin = self.admin.lock().await;
        let pids: Vec<i32> = sqlx::query_scalar(OTHER_BACKENDS)
            .fetch_all(&mut *admin)
            .await
            .unwrap();
        pids.len() as i64
    }

    async fn lock_table(&self) -> Box<dyn TableLock> {
        let mut conn = PgConnection::connect(&self.url).await.unwrap();
        let schema = format!("\"{}\"", self.schema.replace('"', "\"\""));
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "BEGIN; LOCK TABLE {schema}.locks IN ACCESS EXCLUSIVE MODE"
        )))
        .execute(&mut conn)
        .await
        .unwrap();
        let session: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        Box::new(LockedTable {
            conn,
            session: i64::from(session),
        })
    }
}

/// A transaction holding an `ACCESS EXCLUSIVE` lock on `locks`.
struct LockedTable {
    conn: PgConnection,
    session: i64,
}

#[async_trait]
impl TableLock for LockedTable {
    fn session(&self) -> i64 {
        self.session
    }

    async fn unlock(mut self: Box<Self>) {
        sqlx::raw_sql("ROLLBACK")
            .execute(&mut self.conn)
            .await
            .unwrap();
        let _ = self.conn.close().await;
    }
}

/// A store in a schema of its own, with its admin.
async fn store(label: &str) -> Option<(Arc<PgStore>, Postgres, common::Schema)> {
    let (store, schema) = common::store(label).await?;
    let admin = Postgres::new(&schema.url, &schema.name).await;
    Some((Arc::new(store), admin, schema))
}

/// The store's backends terminated mid-run with `pg_terminate_backend`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_killed_mid_run() {
    let _turn = SERIAL.lock().await;
    let Some((store, admin, schema)) = store("terminate").await else {
        return;
    };
    faults::connections_killed_mid_run(store.clone(), &admin).await;
    store.close().await.unwrap();
    schema.drop().await;
}

/// A store over a pool of `connections`, in a schema of its own, with its
/// admin and the backends there were before it opened.
async fn bounded_store(label: &str, connections: u32) -> Option<(Arc<PgStore>, Postgres, i64)> {
    let server = alkstore_testkit::pg::server()?;
    let schema = alkstore_testkit::pg::unique_schema(label);
    let admin = Postgres::new(&server.url, &schema).await;
    let before = admin.sessions().await;
    let pool = PgPoolOptions::new()
        .max_connections(connections)
        .connect(&server.url)
        .await
        .unwrap();
    let store = PgStore::open(pool, &schema).await.unwrap();
    Some((Arc::new(store), admin, before))
}

/// A store over a pool of 2 connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_waiters_than_connections() {
    let _turn = SERIAL.lock().await;
    let Some((store, _, _)) = bounded_store("starve", 2).await else {
        return;
    };
    faults::more_waiters_than_connections(store.clone()).await;
    store.drop_schema().await.unwrap();
    store.close().await.unwrap();
}

/// A store over a pool of 3 connections: at most 5 backends (3 for
/// operations, 1 for the listener, 1 the pool kept from opening).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_futures_leak_no_connection() {
    let _turn = SERIAL.lock().await;
    let Some((store, admin, before)) = bounded_store("cancel", 3).await else {
        return;
    };
    faults::cancelled_futures_leak_no_connection(store.clone(), &admin, before, 5).await;
    store.drop_schema().await.unwrap();
    store.close().await.unwrap();
}

/// Releases commit without waiting for the WAL flush: a crash (`pg_ctl stop
/// -m immediate`, no shutdown checkpoint) right after 400 grants and the
/// release of every other one may undo the last releases. None of that may
/// grant anything twice: after the restart every kept grant is there (same
/// owner, same fence); every released name is either free or still its old
/// grant (ending within its lease); and every released name is granted to
/// another owner within that lease, with a fence above every fence handed
/// out before. (That grants themselves commit durably is shown by the
/// trigger test in deployment.rs: here the releases' WAL, written after the
/// grants, is flushed in pages by the WAL writer, and takes the grants along
/// — an engine with asynchronous grants passed this test twice.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_right_after_releases_grants_nothing_twice() {
    let _turn = SERIAL.lock().await;
    let Some((server, cluster)) = own_cluster("a_crash_right_after_releases_grants_nothing_twice")
    else {
        return;
    };
    const NAMES: usize = 400;
    let ttl = Duration::from_secs(4);
    let schema = alkstore_testkit::pg::unique_schema("crash");
    let store = PgStore::connect(&server.url, &schema).await.unwrap();
    let mut granted = Vec::new();
    for i in 0..NAMES {
        let name = format!("n{i}");
        let lock = store.try_lock(&name, "first", ttl).await.unwrap().unwrap();
        granted.push((name, lock));
    }
    let highest = granted.iter().map(|(_, lock)| lock.fence()).max().unwrap();
    let released_by = Instant::now();
    let mut kept = Vec::new();
    let mut released = Vec::new();
    for (i, (name, lock)) in granted.into_iter().enumerate() {
        if i % 2 == 0 {
            released.push((name, lock.fence()));
            assert!(lock.release().await.unwrap());
        } else {
            kept.push((name, lock));
        }
    }
    let crashed = tokio::task::spawn_blocking(move || cluster.pg_ctl(&["stop", "-m", "immediate"]));
    assert!(crashed.await.unwrap(), "pg_ctl stop -m immediate");
    let started = tokio::task::spawn_blocking(move || cluster.pg_ctl(&["start"]));
    assert!(started.await.unwrap(), "pg_ctl start");

    for (name, lock) in &kept {
        let holder = store.holder(name).await.unwrap();
        assert_eq!(
            holder.map(|h| (h.owner, h.fence)),
            Some(("first".to_owned(), lock.fence())),
            "{name}: a grant answered before the crash was lost in it"
        );
    }
    let mut undone = 0;
    for (name, fence) in &released {
        if let Some(holder) = store.holder(name).await.unwrap() {
            undone += 1;
            assert_eq!(
                (holder.owner.as_str(), holder.fence),
                ("first", *fence),
                "{name}: after the crash, held by another grant than the released one"
            );
            assert!(holder.expires_in <= ttl, "{name}: {holder:?}");
        }
    }
    for (name, _) in &released {
        let wait =
            (released_by + ttl).saturating_duration_since(Instant::now()) + Duration::from_secs(1);
        let lock = store
            .lock(name, "second", Duration::from_secs(30), wait)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{name} not free again within its lease"));
        assert!(
            lock.fence() > highest,
            "{name}: fence {} handed out again (highest before the crash {highest})",
            lock.fence()
        );
        assert!(lock.release().await.unwrap());
    }
    eprintln!(
        "crash after releases: {} grants kept, {undone} of {} releases undone by the crash, \
         every released name granted again above fence {highest}, nothing granted twice",
        kept.len(),
        released.len()
    );
    store.drop_schema().await.unwrap();
    store.close().await.unwrap();
}

/// Behind an `ACCESS EXCLUSIVE` lock, after the store's idle backend was
/// terminated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_acquire_after_a_lost_connection_keeps_to_its_wait() {
    let _turn = SERIAL.lock().await;
    let Some((store, admin, schema)) = store("lostwait").await else {
        return;
    };
    faults::a_waiting_acquire_after_a_lost_connection_keeps_to_its_wait(&*store, &admin).await;
    store.close().await.unwrap();
    schema.drop().await;
}

/// Idle backends terminated every 50 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_session_killer_is_invisible_to_the_holder() {
    let _turn = SERIAL.lock().await;
    let Some((store, admin, schema)) = store("idlekill").await else {
        return;
    };
    faults::an_idle_session_killer_is_invisible_to_the_holder(&*store, &admin).await;
    store.close().await.unwrap();
    schema.drop().await;
}
