//! What only the SQLite engine can show: several processes on one file, a
//! busy database, and the rows (or absence of rows) in the file itself.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use alkstore_contract_suite::support::{
    assert_dead_holder_blocks_until_ttl, assert_not_renewed_in_time, assert_refused_within_wait,
};
use alkstore_core::{Error, Store};
use alkstore_sqlite::SqliteStore;

/// Set in a child process: the file to contend on.
const CHILD_DB: &str = "ALKSTORE_TEST_CHILD_DB";
/// Set in a child process: the counter file to increment.
const CHILD_COUNTER: &str = "ALKSTORE_TEST_CHILD_COUNTER";
/// Cycles each process runs.
const CYCLES: u64 = 100;

/// One process's part: `CYCLES` times, wait for the lock, increment a plain
/// counter file with a read-modify-write that loses updates if two processes
/// ever hold the lock at once, release. Returns the fences it was granted.
async fn contend(db: &Path, counter: &Path, me: &str) -> Vec<u64> {
    let store = SqliteStore::open(db).await.unwrap();
    let mut fences = Vec::new();
    for _ in 0..CYCLES {
        let lock = store
            .lock(
                "shared",
                me,
                Duration::from_secs(30),
                Duration::from_secs(60),
            )
            .await
            .unwrap()
            .expect("granted within a minute");
        let value: u64 = std::fs::read_to_string(counter)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
        std::fs::write(counter, (value + 1).to_string()).unwrap();
        fences.push(lock.fence());
        assert!(lock.release().await.unwrap());
    }
    store.close().await.unwrap();
    fences
}

/// The child side of `processes_on_one_file_exclude_each_other`; does
/// nothing unless the parent started this binary with the child variables.
#[tokio::test]
#[ignore = "run by processes_on_one_file_exclude_each_other in a child process"]
async fn child_process_contender() {
    let db = PathBuf::from(std::env::var(CHILD_DB).expect("started by the parent test"));
    let counter = PathBuf::from(std::env::var(CHILD_COUNTER).unwrap());
    let fences = contend(&db, &counter, &format!("pid-{}", std::process::id())).await;
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
}

/// Three processes (this one and two children of this test binary) take one
/// lock on one file 100 times each: the unprotected counter comes out exact
/// and every fence is distinct.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_on_one_file_exclude_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("locks.db");
    let counter = dir.path().join("counter");
    std::fs::write(&counter, "0").unwrap();
    let children: Vec<_> = (0..2)
        .map(|_| {
            Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "child_process_contender",
                    "--ignored",
                    "--nocapture",
                ])
                .env(CHILD_DB, &db)
                .env(CHILD_COUNTER, &counter)
                .spawn()
                .unwrap()
        })
        .collect();
    let mine = contend(&db, &counter, "parent").await;
    for mut child in children {
        let status = tokio::task::spawn_blocking(move || child.wait())
            .await
            .unwrap()
            .unwrap();
        assert!(status.success(), "a child failed: {status}");
    }
    let total: u64 = std::fs::read_to_string(&counter).unwrap().parse().unwrap();
    assert_eq!(total, 3 * CYCLES, "lost updates: two holders at once");
    // The file's fence counter saw every grant of all three processes.
    let conn = rusqlite::Connection::open(&db).unwrap();
    let last: i64 = conn
        .query_row(
            "SELECT value FROM alkstore_meta WHERE key = 'last_fence'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(last as u64, 3 * CYCLES);
    assert!(mine.windows(2).all(|w| w[0] < w[1]));
}

/// A database another connection keeps write-locked gives `Error::Database`
/// after the busy timeout: no hang, no panic, and reads still work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_database_is_an_error_not_a_hang() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("locks.db");
    let store = SqliteStore::open(&db).await.unwrap();
    let blocker = rusqlite::Connection::open(&db).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let started = Instant::now();
    let result = store.try_lock("job", "a", Duration::from_secs(30)).await;
    assert!(matches!(result, Err(Error::Database { .. })), "{result:?}");
    let source = std::error::Error::source(result.as_ref().unwrap_err()).unwrap();
    assert!(source.to_string().contains("locked"), "{source}");
    assert!(started.elapsed() < Duration::from_secs(30));
    assert!(store.holder("job").await.unwrap().is_none());
    blocker.execute_batch("ROLLBACK").unwrap();
    let lock = store
        .try_lock("job", "a", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    assert!(lock.release().await.unwrap());
}

/// A waiting acquire on a database another connection keeps write-locked
/// gives up when its wait runs out (`Ok(None)`, nothing written), not after
/// the 5 s busy timeout, and not with an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_acquire_on_a_busy_database_keeps_to_its_wait() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("locks.db");
    let store = SqliteStore::open(&db).await.unwrap();
    let blocker = rusqlite::Connection::open(&db).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let wait = Duration::from_millis(300);
    assert_refused_within_wait(
        &store,
        ("job", "a", Duration::from_secs(30)),
        wait,
        Duration::from_secs(2),
        "waited out the busy timeout instead of its own wait",
    )
    .await;
    blocker.execute_batch("ROLLBACK").unwrap();
    assert_eq!(row_count(&db), 0);
    // The busy timeout is back to normal: a later waiting acquire still
    // waits for a write lock released well within its wait.
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let unblock = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        blocker.execute_batch("ROLLBACK").unwrap();
    });
    let lock = store
        .lock("job", "a", Duration::from_secs(30), Duration::from_secs(10))
        .await
        .unwrap()
        .expect("granted once the write lock was let go");
    unblock.join().unwrap();
    assert_eq!(lock.fence(), 1, "the abandoned attempt drew a fence");
    assert!(lock.release().await.unwrap());
}

fn row_count(db: &Path) -> i64 {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.query_row("SELECT count(*) FROM alkstore_locks", [], |r| r.get(0))
        .unwrap()
}

/// Every refused call (bad name, owner or ttl) leaves the table empty.
#[tokio::test]
async fn refused_calls_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("locks.db");
    let store = SqliteStore::open(&db).await.unwrap();
    let ttl = Duration::from_secs(30);
    let long = "n".repeat(256);
    for (name, owner, ttl) in [
        ("", "a", ttl),
        ("a\0b", "a", ttl),
        (long.as_str(), "a", ttl),
        ("alkstore.x", "a", ttl),
        ("job", "", ttl),
        ("job", " ", ttl),
        ("job", "a\u{1b}", ttl),
        ("job", "a", Duration::ZERO),
        ("job", "a", Duration::MAX),
    ] {
        assert!(store.try_lock(name, owner, ttl).await.is_err());
        assert!(
            store
                .lock(name, owner, ttl, Duration::from_millis(10))
                .await
                .is_err()
        );
    }
    assert_eq!(row_count(&db), 0);
    store.close().await.unwrap();
}

/// Fences keep rising across a close and reopen of the file.
#[tokio::test]
async fn fences_survive_reopening_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("locks.db");
    let store = SqliteStore::open(&db).await.unwrap();
    let first = store
        .try_lock("job", "a", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    let fence = first.fence();
    assert!(first.release().await.unwrap());
    assert_eq!(store.purge_expired().await.unwrap(), 0);
    store.close().await.unwrap();
    let reopened = SqliteStore::open(&db).await.unwrap();
    let second = reopened
        .try_lock("job", "b", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    assert!(second.fence() > fence);
    assert!(second.release().await.unwrap());
}

/// A file written by a newer schema version is refused on open.
#[tokio::test]
async fn newer_schema_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("locks.db");
    SqliteStore::open(&db).await.unwrap().close().await.unwrap();
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute(
        "UPDATE alkstore_meta SET value = 99 WHERE key = 'schema_version'",
        [],
    )
    .unwrap();
    drop(conn);
    let err = SqliteStore::open(&db).await.unwrap_err();
    let found = err
        .find_source::<alkstore_sqlite::SchemaVersionError>()
        .expect("a schema version error");
    assert_eq!(found.found, 99);
}

/// A version 1 file (no permits table), a version 2 file (no
/// reader-writer rows), a version 3 file (no `epoch` columns) and a
/// version 4 file (no tickets table) are upgraded in place on open: the
/// live lock and the fence counter stay (the lock is given back to its
/// owner with its fence: not retired), semaphores, reader-writer locks and
/// queues work, and the file then says version 5, which an older build
/// refuses.
#[tokio::test]
async fn older_files_are_upgraded_in_place() {
    let permits_table = "CREATE TABLE alkstore_permits (name TEXT NOT NULL, slot INTEGER NOT NULL,
             owner TEXT NOT NULL, fence INTEGER NOT NULL, expires_at INTEGER NOT NULL,
             permits INTEGER NOT NULL, PRIMARY KEY (name, slot)) WITHOUT ROWID;";
    for (version, extra) in [
        (1, ""),
        (2, permits_table),
        (3, permits_table),
        (4, permits_table),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join(format!("v{version}.db"));
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.execute_batch(&format!(
            "CREATE TABLE alkstore_meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
             CREATE TABLE alkstore_locks (name TEXT PRIMARY KEY, owner TEXT NOT NULL,
                 fence INTEGER NOT NULL, expires_at INTEGER NOT NULL) WITHOUT ROWID;
             {extra}
             INSERT INTO alkstore_meta VALUES ('schema_version', {version}), ('last_fence', 41);
             INSERT INTO alkstore_locks VALUES ('held', 'old', 41, 99999999999999);"
        ))
        .unwrap();
        drop(conn);
        let store = SqliteStore::open(&db).await.unwrap();
        let holder = store
            .holder("held")
            .await
            .unwrap()
            .expect("the live lock stays");
        assert_eq!((holder.owner.as_str(), holder.fence), ("old", 41));
        let ttl = Duration::from_secs(30);
        let again = store.try_lock("held", "old", ttl).await.unwrap().unwrap();
        assert_eq!(
            again.fence(),
            41,
            "a grant of the older file is not retired"
        );
        assert!(again.renew(ttl).await.unwrap());
        again.let_lapse();
        let permit = store
            .try_acquire_permit("pool", 2, "a", ttl)
            .await
            .unwrap()
            .expect("a permit of a free semaphore");
        assert_eq!(permit.fence(), 42, "fences go on from the file's counter");
        let reader = store
            .try_read_lock("shared", "r", ttl)
            .await
            .unwrap()
            .expect("a reader of a free name");
        assert_eq!(reader.fence(), 43);
        // A waiter queues behind the old file's lock.
        assert!(
            store
                .lock("held", "new", ttl, Duration::from_millis(50))
                .await
                .unwrap()
                .is_none()
        );
        let queued = store.lock("held", "queued", ttl, Duration::from_secs(5));
        let seen = async {
            loop {
                let waiters = store.waiters("held").await.unwrap();
                if let Some(waiter) = waiters.iter().find(|w| w.owner == "queued") {
                    break waiter.kind;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::select! {
            kind = seen => assert_eq!(kind, "lock"),
            _ = queued => panic!("a waiter behind a live lock of 30 s is not granted in 5 s"),
        }
        assert!(permit.release().await.unwrap() && reader.release().await.unwrap());
        store.close().await.unwrap();
        let conn = rusqlite::Connection::open(&db).unwrap();
        let found: i64 = conn
            .query_row(
                "SELECT value FROM alkstore_meta WHERE key = 'schema_version'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(found, 5, "version {version} upgraded");
    }
}

/// Set in a child process: hold the lock on this file until killed.
const CHILD_HOLD_DB: &str = "ALKSTORE_TEST_CHILD_HOLD_DB";

/// The child side of `killed_holder_blocks_until_its_ttl`.
#[tokio::test]
#[ignore = "run by killed_holder_blocks_until_its_ttl in a child process"]
async fn child_holds_until_killed() {
    let db = PathBuf::from(std::env::var(CHILD_HOLD_DB).expect("started by the parent test"));
    let store = SqliteStore::open(&db).await.unwrap();
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
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("locks.db");
    let fence = alkstore_testkit::child::hold_in_child_and_kill(
        "child_holds_until_killed",
        &[(CHILD_HOLD_DB, db.to_str().unwrap())],
    );
    let store = SqliteStore::open(&db).await.unwrap();
    let (left, waited) = assert_dead_holder_blocks_until_ttl(&store, "job", "child", fence).await;
    eprintln!("sigkill: holder killed with {left:?} left; granted {waited:?} after asking");
}

/// An empty path is refused, not turned into SQLite's hidden temporary database.
#[tokio::test]
async fn empty_path_is_refused() {
    let err = SqliteStore::open("").await.unwrap_err();
    assert!(
        err.find_source::<alkstore_sqlite::EmptyPath>().is_some(),
        "{err:?}"
    );
}

/// Set in a child process: the directory of the new files to open.
const CHILD_OPEN_DIR: &str = "ALKSTORE_TEST_CHILD_OPEN_DIR";
/// Set in a child process: when round 0 starts, in Unix milliseconds.
const CHILD_OPEN_START: &str = "ALKSTORE_TEST_CHILD_OPEN_START";
/// Rounds of concurrent opens, and the time between their starts.
const OPEN_ROUNDS: u64 = 40;
const OPEN_ROUND_GAP_MS: u64 = 60;

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The child side of `processes_opening_one_new_file_at_once_all_succeed`:
/// in each round, at the same instant as the other children, open a file
/// that does not exist yet and take a lock in it.
#[tokio::test]
#[ignore = "run by processes_opening_one_new_file_at_once_all_succeed in a child process"]
async fn child_opens_new_files() {
    let dir = PathBuf::from(std::env::var(CHILD_OPEN_DIR).expect("started by the parent test"));
    let start: u64 = std::env::var(CHILD_OPEN_START).unwrap().parse().unwrap();
    let me = format!("pid-{}", std::process::id());
    let mut failures = Vec::new();
    for round in 0..OPEN_ROUNDS {
        let at = start + round * OPEN_ROUND_GAP_MS;
        while unix_ms() < at {
            std::hint::spin_loop();
        }
        let db = dir.join(format!("round-{round}.db"));
        match SqliteStore::open(&db).await {
            Ok(store) => {
                let lock = store
                    .lock("job", &me, Duration::from_secs(30), Duration::from_secs(10))
                    .await
                    .unwrap()
                    .expect("granted within the wait");
                assert!(lock.release().await.unwrap());
                store.close().await.unwrap();
            }
            Err(error) => failures.push(format!("round {round}: {error:?}")),
        }
    }
    assert!(failures.is_empty(), "opens failed: {failures:#?}");
}

/// Eight processes open one file that does not exist yet at the same
/// instant, 40 times over: every open succeeds (DESIGN: opening is safe
/// when several processes open at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_opening_one_new_file_at_once_all_succeed() {
    let dir = tempfile::tempdir().unwrap();
    // Time for every child to start before the first round.
    let start = unix_ms() + 1500;
    let children: Vec<_> = (0..8)
        .map(|_| {
            Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "child_opens_new_files", "--ignored", "--quiet"])
                .env(CHILD_OPEN_DIR, dir.path())
                .env(CHILD_OPEN_START, start.to_string())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut failed = Vec::new();
    for child in children {
        let output = tokio::task::spawn_blocking(move || child.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        if !output.status.success() {
            // libtest reports a failed test on stdout.
            failed.push(format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ));
        }
    }
    assert!(failed.is_empty(), "children failed:\n{}", failed.join("\n"));
}

/// A store's lock handle that counts how often its deadline is read; it
/// passes the lowering signal on.
#[derive(Debug)]
struct ReadsCounted {
    lock: Box<dyn alkstore_core::Lock>,
    reads: Arc<AtomicUsize>,
}

#[async_trait::async_trait]
impl alkstore_core::Lock for ReadsCounted {
    fn name(&self) -> &str {
        self.lock.name()
    }
    fn owner(&self) -> &str {
        self.lock.owner()
    }
    fn fence(&self) -> u64 {
        self.lock.fence()
    }
    fn valid_until(&self) -> Instant {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.lock.valid_until()
    }
    fn valid_until_lowered(&self) -> Option<Arc<tokio::sync::Notify>> {
        self.lock.valid_until_lowered()
    }
    async fn renew(&self, ttl: Duration) -> alkstore_core::Result<bool> {
        self.lock.renew(ttl).await
    }
    async fn release(self: Box<Self>) -> alkstore_core::Result<bool> {
        self.lock.release().await
    }
    async fn release_shared(&self) -> alkstore_core::Result<bool> {
        self.lock.release_shared().await
    }
}

/// A keep-alive hears at once of its grant released through a twin handle
/// (the store signals the lowered deadline; nothing polls): `Revoked` well
/// before the first renewal would have been due (10 s at the soonest).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keepalive_hears_of_a_twins_release_at_once() {
    use alkstore_core::{KeepAlive, LostReason};
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("locks.db"))
        .await
        .unwrap();
    let ttl = Duration::from_secs(120);
    let lock = store.try_lock("job", "a", ttl).await.unwrap().unwrap();
    let twin = store.try_lock("job", "a", ttl).await.unwrap().unwrap();
    let reads = Arc::new(AtomicUsize::new(0));
    let counted = Box::new(ReadsCounted {
        lock,
        reads: reads.clone(),
    });
    let kept = KeepAlive::start(counted, ttl).unwrap();
    // Released once the keep-alive waits for its first renewal: it reads
    // the deadline once to start, and again after it began listening for a
    // lowering (had it not read it yet, it would find it lowered, signal or
    // not).
    while reads.load(Ordering::SeqCst) < 2 {
        tokio::task::yield_now().await;
    }
    let released = std::time::Instant::now();
    assert!(twin.release().await.unwrap());
    assert_eq!(kept.lost().await, LostReason::Revoked);
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "heard of the release only after {:?}",
        released.elapsed()
    );
}

/// A keep-alive that cannot renew in time (another connection keeps the file
/// write-locked) says so, then releases the grant: when the write lock goes
/// and the renewal it gave up on lands, the name is still free at once, not
/// one ttl later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_the_keepalive_gave_up_on_frees_the_name() {
    use alkstore_core::KeepAlive;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("locks.db");
    let store = SqliteStore::open(&db).await.unwrap();
    let other = SqliteStore::open(&db).await.unwrap();
    let ttl = Duration::from_secs(3);
    let lock = store.try_lock("job", "a", ttl).await.unwrap().unwrap();
    let blocker = rusqlite::Connection::open(&db).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let kept = KeepAlive::start(lock, ttl).unwrap();
    assert_not_renewed_in_time(&kept).await;
    // The renewal given up on (sent within the first second, so it would
    // extend the lease to 4 s at most, 1.3 s from here) is still queued;
    // let it through.
    blocker.execute_batch("ROLLBACK").unwrap();
    let next = other
        .lock("job", "b", ttl, Duration::from_millis(500))
        .await
        .unwrap()
        .expect("the name was freed, not held for another ttl");
    assert!(next.release().await.unwrap());
    assert!(!kept.release().await.unwrap(), "already released");
}

/// Renewals asked for at once go to SQLite together (`alkstore.renew_batch`
/// spans: one transaction, one synced commit each), and each handle gets
/// its own answer: the grants another store force-released answer `false`,
/// the others `true`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_asked_at_once_go_together_and_each_is_answered_alone() {
    use alkstore_contract_suite::spans::{collected, collecting, renewal_batches};
    const LOCKS: usize = 50;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("renewals.db");
    let (store, other) = (
        SqliteStore::open(&db).await.unwrap(),
        SqliteStore::open(&db).await.unwrap(),
    );
    let owner = alkstore_core::unique_owner("renewer").unwrap();
    let ttl = Duration::from_secs(60);
    let mut locks = Vec::new();
    for i in 0..LOCKS {
        let lock = store.try_lock(&format!("n{i}"), &owner, ttl).await.unwrap();
        locks.push(lock.expect("a free name"));
    }
    for i in (0..LOCKS).step_by(10) {
        other
            .force_release(&format!("n{i}"))
            .await
            .unwrap()
            .unwrap();
    }
    let (subscriber, spans, _) = collecting();
    let renewals = futures::future::join_all(locks.iter().map(|lock| lock.renew(ttl)));
    let answers = collected(renewals, &subscriber).await;
    for (i, answer) in answers.into_iter().enumerate() {
        assert_eq!(answer.unwrap(), i % 10 != 0, "n{i}");
    }
    let batches = renewal_batches(&spans.take());
    assert_eq!(batches.iter().sum::<usize>(), LOCKS, "{batches:?}");
    // The first renewal may go alone, at once; the rest wait for a beat.
    assert!(batches.len() <= 3, "{batches:?}");
    for lock in locks {
        lock.let_lapse();
    }
}
