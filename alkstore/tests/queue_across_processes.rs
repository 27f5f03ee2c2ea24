//! First come, first served across processes: waiters in child processes
//! (this test binary's ignored `child_waits_in_turn`, each a process of its
//! own with its own store) queue for a held lock one after another, one of
//! them is killed with SIGKILL while it waits, and the others are granted
//! in the order they asked, with rising fences. On every engine this
//! build has (SQLite always; PostgreSQL, MariaDB and etcd when their
//! features are on and their servers run).

use std::time::{Duration, Instant};

use alkstore::Store;
use alkstore_testkit::child;

const TTL: Duration = Duration::from_secs(60);
/// How long anything that should come soon may take: a child process's
/// start and open on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(60);

/// Set in a child: the store's URL, the lock's name, the waiter's owner.
const CHILD_URL: &str = "ALKSTORE_TEST_QUEUE_URL";
const CHILD_NAME: &str = "ALKSTORE_TEST_QUEUE_NAME";
const CHILD_OWNER: &str = "ALKSTORE_TEST_QUEUE_OWNER";

/// The child side: waits for the lock in turn, reports its fence, lets go.
#[tokio::test]
#[ignore = "run by the tests below in child processes"]
async fn child_waits_in_turn() {
    let var = |key| std::env::var(key).expect("started by a parent test");
    let store = alkstore::open(&var(CHILD_URL)).await.unwrap();
    let lock = store
        .lock(&var(CHILD_NAME), &var(CHILD_OWNER), TTL, PATIENCE)
        .await
        .unwrap()
        .expect("granted in turn");
    child::report_granted(lock.fence());
    assert!(lock.release().await.unwrap());
    store.close().await.unwrap();
}

/// Until `name`'s queue holds `count` waiters.
async fn until_queued(store: &dyn Store, name: &str, count: usize) {
    let deadline = Instant::now() + PATIENCE;
    while store.waiters(name).await.unwrap().len() < count {
        assert!(Instant::now() < deadline, "{count} waiters never queued");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Four waiting processes and a killed one, in arrival order p0, p1,
/// killed, p2, p3: granted p0, p1, p2, p3 (rising fences), the killed one's
/// place gone with its ticket's lease.
async fn fifo_across_processes(url: &str) {
    let store = alkstore::open(url).await.unwrap();
    let name = "across";
    let holder = store.try_lock(name, "holder", TTL).await.unwrap().unwrap();
    let mut waiting = Vec::new();
    for (place, owner) in ["p0", "p1", "killed", "p2", "p3"].into_iter().enumerate() {
        let child = child::spawn(
            "child_waits_in_turn",
            &[(CHILD_URL, url), (CHILD_NAME, name), (CHILD_OWNER, owner)],
        );
        until_queued(store.as_ref(), name, place + 1).await;
        waiting.push((owner, child));
    }
    let shown: Vec<String> = store
        .waiters(name)
        .await
        .unwrap()
        .into_iter()
        .map(|w| w.owner)
        .collect();
    assert_eq!(shown, ["p0", "p1", "killed", "p2", "p3"]);
    // Killed in its place: nothing leaves its ticket; it lapses.
    let killed = waiting.remove(2).1;
    tokio::task::spawn_blocking(move || killed.kill())
        .await
        .unwrap();
    assert!(holder.release().await.unwrap());
    let mut fences = Vec::new();
    for (owner, child) in waiting {
        let fence = tokio::task::spawn_blocking(move || child.granted())
            .await
            .unwrap();
        fences.push((owner, fence));
    }
    let order: Vec<&str> = {
        let mut by_fence = fences.clone();
        by_fence.sort_by_key(|(_, fence)| *fence);
        by_fence.into_iter().map(|(owner, _)| owner).collect()
    };
    assert_eq!(
        order,
        ["p0", "p1", "p2", "p3"],
        "rule: waiters in other processes are granted first come, first served ({fences:?})"
    );
    assert!(store.waiters(name).await.unwrap().is_empty());
    store.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_waiters_in_other_processes_go_in_turn() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    fifo_across_processes(&url).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_waiters_in_other_processes_go_in_turn() {
    let Some(server) = alkstore_testkit::pg::server() else {
        return;
    };
    let schema = alkstore_testkit::pg::unique_schema("across");
    let sep = if server.url.contains('?') { '&' } else { '?' };
    fifo_across_processes(&format!("{}{sep}schema={schema}", server.url)).await;
    let direct = alkstore::postgres::PgStore::connect(&server.url, &schema)
        .await
        .unwrap();
    direct.drop_schema().await.unwrap();
    direct.close().await.unwrap();
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_waiters_in_other_processes_go_in_turn() {
    let Some(server) = alkstore_testkit::mysql::server() else {
        return;
    };
    let database = alkstore_testkit::unique_name("across");
    fifo_across_processes(&format!("{}/{database}", server.url)).await;
    let direct = alkstore::mysql::MySqlStore::connect(&server.url, &database)
        .await
        .unwrap();
    direct.drop_database().await.unwrap();
    direct.close().await.unwrap();
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_waiters_in_other_processes_go_in_turn() {
    let Some(server) = alkstore_testkit::etcd::server() else {
        return;
    };
    let url = format!("{}/{}", server.url, alkstore_testkit::unique_name("across"));
    fifo_across_processes(&url).await;
    let direct = alkstore::etcd::EtcdStore::connect(&url).await.unwrap();
    direct.remove_store().await.unwrap();
    direct.close().await.unwrap();
}
