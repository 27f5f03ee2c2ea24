//! Faults against a real server: a holder process killed with SIGKILL, the
//! server stopped and restarted under load, the store's connections killed
//! with pg_terminate_backend, and more waiters than connections.
//!
//! This binary gets a throwaway cluster of its own (the harness starts one per
//! test process), so restarting it disturbs no other test binary; the tests
//! here take turns through `SERIAL`.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use alkstore_contract_suite::load::{through_an_outage, through_killed_sessions};
use alkstore_contract_suite::safety::history::check;
use alkstore_contract_suite::support::{
    assert_dead_holder_blocks_until_ttl, assert_waits_out_a_table_lock,
};
use alkstore_core::Store;
use alkstore_postgres::PgStore;
use alkstore_testkit::pg::{Cluster, Server};
use sqlx::postgres::PgPoolOptions;
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
    let outage = through_an_outage(
        store.clone() as Arc<dyn Store>,
        8,
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
    assert_eq!(check(&outage.history), Ok(()));
    assert!(
        outage.grants_before > 0 && outage.errors_during > 0,
        "no load, or no outage seen"
    );
    assert!(
        after < Duration::from_millis(100),
        "LISTEN did not come back: handoff {after:?}"
    );
    eprintln!(
        "restart: {} grants checked, {} errors (all Error::Database), slowest op {} ms, \
         recovered {:?} after start, handoff before {before:?} after {after:?}, violations: 0",
        outage.history.len(),
        outage.errors,
        outage.slowest_ms,
        outage.recovered_after
    );
    other.drop_schema().await.unwrap();
    store.close().await.unwrap();
    other.close().await.unwrap();
}

/// The store's server connections killed mid-run: the store recovers, a kept
/// lease survives (the failed renewal is retried), and nothing overlaps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_killed_mid_run() {
    let _turn = SERIAL.lock().await;
    let Some((store, schema)) = common::store("terminate").await else {
        return;
    };
    let store = Arc::new(store);
    let admin = PgStore::connect(&schema.url, &schema.name).await.unwrap();
    let (killed, grants, errors) =
        through_killed_sessions(store.clone() as Arc<dyn Store>, 6, || async {
            let (n,): (i64,) = sqlx::query_as(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                 WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()
                   AND datname = current_database() AND query NOT LIKE '%pg_stat_activity%'",
            )
            .fetch_one(admin.pool())
            .await
            .unwrap();
            n as u64
        })
        .await;
    eprintln!(
        "terminate: {killed} backends killed, {grants} grants checked, {errors} errors, \
         kept lease held throughout, violations: 0"
    );
    store.close().await.unwrap();
    admin.close().await.unwrap();
    schema.drop().await;
}

/// More waiters than connections: waiting acquires hold no connection while
/// they wait, so every holder can release and every waiter gets its turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_waiters_than_connections() {
    let _turn = SERIAL.lock().await;
    let Some(server) = alkstore_testkit::pg::server() else {
        return;
    };
    let schema = alkstore_testkit::pg::unique_schema("starve");
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(&server.url)
        .await
        .unwrap();
    let store = Arc::new(PgStore::open(pool, &schema).await.unwrap());
    let slowest_release = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let (store, slowest_release) = (store.clone(), slowest_release.clone());
            tokio::spawn(async move {
                let lock = store
                    .lock(
                        "narrow",
                        &format!("w{i}"),
                        Duration::from_secs(10),
                        Duration::from_secs(60),
                    )
                    .await
                    .unwrap()
                    .expect("every waiter gets its turn");
                tokio::time::sleep(Duration::from_millis(5)).await;
                let began = Instant::now();
                assert!(lock.release().await.unwrap());
                slowest_release.fetch_max(began.elapsed().as_millis() as u64, Ordering::SeqCst);
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let took = started.elapsed();
    let slowest = slowest_release.load(Ordering::SeqCst);
    assert!(
        slowest < 1000,
        "a release waited {slowest} ms for a connection"
    );
    assert!(took < Duration::from_secs(30));
    eprintln!(
        "starvation: 40 waiters over 2 connections served in {took:?}, slowest release {slowest} ms"
    );
    store.drop_schema().await.unwrap();
    store.close().await.unwrap();
}

/// Client backends connected to the test database, other than the asker.
async fn backends(pool: &sqlx::PgPool) -> i64 {
    let (n,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM pg_stat_activity
         WHERE backend_type = 'client backend' AND datname = current_database() AND pid <> pg_backend_pid()",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    n
}

/// Futures dropped at random points leak no connection: afterwards the
/// store holds no more connections than its bound (plus its listener), and
/// every one of them can still be checked out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_futures_leak_no_connection() {
    let _turn = SERIAL.lock().await;
    let Some(server) = alkstore_testkit::pg::server() else {
        return;
    };
    let schema = alkstore_testkit::pg::unique_schema("cancel");
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect(&server.url)
        .await
        .unwrap();
    let before = backends(&admin).await;
    let pool = PgPoolOptions::new()
        .max_connections(3)
        .connect(&server.url)
        .await
        .unwrap();
    let store = Arc::new(PgStore::open(pool, &schema).await.unwrap());
    alkstore_contract_suite::cases::cancellation_leaves_no_trace(store.clone()).await;
    let during = backends(&admin).await - before;
    // 3 for operations, 1 for the listener, 1 the pool kept from schema setup.
    assert!(
        during <= 5,
        "{during} connections for a store bounded to 3 (+ listener)"
    );
    // Every permit came back: 30 concurrent operations on 3 connections finish.
    let all = futures::future::join_all((0..30).map(|i| {
        let store = store.clone();
        async move { store.holder(&format!("n{i}")).await }
    }));
    let results = tokio::time::timeout(Duration::from_secs(10), all)
        .await
        .expect("a checkout leaked");
    assert!(results.iter().all(Result::is_ok));
    eprintln!(
        "cancellation: {during} connections held after 300 dropped-or-finished operations (bound 3 + listener)"
    );
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

/// Terminates every idle client session of the test database but the
/// asker's, and waits until they are gone; answers how many there were.
async fn terminate_idle_sessions(admin: &mut sqlx::PgConnection, idle_for: Duration) -> usize {
    let pids: Vec<(i32,)> = sqlx::query_as(
        "SELECT pid FROM pg_stat_activity
         WHERE backend_type = 'client backend' AND datname = current_database()
           AND pid <> pg_backend_pid() AND state = 'idle'
           AND state_change < clock_timestamp() - $1 * interval '1 millisecond'",
    )
    .bind(idle_for.as_millis() as f64)
    .fetch_all(&mut *admin)
    .await
    .unwrap();
    let pids: Vec<i32> = pids.into_iter().map(|(pid,)| pid).collect();
    sqlx::query("SELECT count(pg_terminate_backend(pid)) FROM unnest($1::int[]) pid")
        .bind(&pids)
        .execute(&mut *admin)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (left,): (i64,) =
            sqlx::query_as("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)")
                .bind(&pids)
                .fetch_one(&mut *admin)
                .await
                .unwrap();
        if left == 0 {
            return pids.len();
        }
        assert!(Instant::now() < deadline, "terminated sessions did not end");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A waiting acquire whose idle connection the server ended meanwhile keeps
/// to its wait behind a table lock (an `ACCESS EXCLUSIVE` lock, as DDL or a
/// `LOCK TABLE` takes): the try on a new connection is bounded like the
/// first, and it answers `None` at its deadline, not when the table lock ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_acquire_after_a_lost_connection_keeps_to_its_wait() {
    use sqlx::Connection;
    let _turn = SERIAL.lock().await;
    let Some((store, schema)) = common::store("lostwait").await else {
        return;
    };
    // One connection of the store's own sits idle.
    assert!(store.holder("job").await.unwrap().is_none());
    let mut admin = sqlx::PgConnection::connect(&schema.url).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "BEGIN; LOCK TABLE {}.locks IN ACCESS EXCLUSIVE MODE",
        common::quoted_schema(&store)
    )))
    .execute(&mut admin)
    .await
    .unwrap();
    let mut other = sqlx::PgConnection::connect(&schema.url).await.unwrap();
    assert!(terminate_idle_sessions(&mut other, Duration::ZERO).await >= 1);
    assert_waits_out_a_table_lock(
        &store,
        "the waiting acquire outlived its wait behind the table lock",
        async {
            sqlx::raw_sql("ROLLBACK").execute(&mut admin).await.unwrap();
        },
    )
    .await;
    store.close().await.unwrap();
    let _ = admin.close().await;
    let _ = other.close().await;
    schema.drop().await;
}

/// An idle-session killer ends the store's sessions while a keep-alive
/// holds a lease: the lease survives, and the release afterwards, on a
/// connection that died while idle, answers `true` instead of an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_session_killer_is_invisible_to_the_holder() {
    use sqlx::Connection;
    let _turn = SERIAL.lock().await;
    let Some((store, schema)) = common::store("idlekill").await else {
        return;
    };
    let admin = tokio::sync::Mutex::new(sqlx::PgConnection::connect(&schema.url).await.unwrap());
    let killed =
        alkstore_contract_suite::load::through_an_idle_session_killer(&store, |idle_for| {
            let admin = &admin;
            async move { terminate_idle_sessions(&mut *admin.lock().await, idle_for).await as u64 }
        })
        .await;
    eprintln!("idle-session killer: {killed} sessions ended, lease kept, release answered true");
    store.close().await.unwrap();
    schema.drop().await;
}
