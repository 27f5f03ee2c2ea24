//! The `alkstore` binary end to end: locks are seeded and checked through
//! the library, the binary runs as a separate process against the same
//! store (an SQLite file, a PostgreSQL schema, a MariaDB database).

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use alkstore::Store;
use assert_cmd::Command;
use serde_json::{Value, json};

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_alkstore");

/// A lease that outlives every test.
const TTL: Duration = Duration::from_secs(60);

/// How long to wait for something that should come at once.
const PATIENCE: Duration = Duration::from_secs(10);

/// What one run of the binary did.
#[derive(Debug)]
struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs the binary with `--url url` and `args`, feeding it `stdin` if any
/// (else an empty stdin); `ALKSTORE_URL` is cleared.
fn run(url: &str, args: &[&str], stdin: Option<&str>) -> Ran {
    let mut cmd = Command::new(BIN);
    cmd.env_remove("ALKSTORE_URL")
        .arg("--url")
        .arg(url)
        .args(args);
    run_command(cmd, stdin)
}

/// Runs a prepared command of the binary (with a generous time limit).
fn run_command(mut cmd: Command, stdin: Option<&str>) -> Ran {
    cmd.timeout(Duration::from_secs(60));
    if let Some(input) = stdin {
        cmd.write_stdin(input);
    }
    let output = cmd.output().expect("the binary runs");
    Ran {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8(output.stdout).unwrap(),
        stderr: String::from_utf8(output.stderr).unwrap(),
    }
}

/// The URL of a fresh SQLite file in `dir`.
fn sqlite_url(dir: &tempfile::TempDir) -> String {
    format!("sqlite://{}", dir.path().join("locks.db").display())
}

/// (name, owner, fence) of each entry of a JSON array of grants.
fn grants(json: &str) -> Vec<(String, String, u64)> {
    let value: Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json}"));
    value
        .as_array()
        .unwrap_or_else(|| panic!("an array: {json}"))
        .iter()
        .map(grant)
        .collect()
}

/// (name, owner, fence) of one JSON grant; its `expires_in_ms` is within
/// the test's lease.
fn grant(entry: &Value) -> (String, String, u64) {
    let expires = entry["expires_in_ms"].as_u64().unwrap();
    assert!(expires <= TTL.as_millis() as u64, "{entry}");
    (
        entry["name"].as_str().unwrap().to_owned(),
        entry["owner"].as_str().unwrap().to_owned(),
        entry["fence"].as_u64().unwrap(),
    )
}

/// A (name, owner, fence) to compare with [`grants`].
fn triple(name: &str, owner: &str, fence: u64) -> (String, String, u64) {
    (name.to_owned(), owner.to_owned(), fence)
}

/// list, show and release, against the store at `url` (empty when given).
async fn list_show_release(url: &str) {
    let store = alkstore::open(url).await.unwrap();
    let a = store
        .try_lock("jobs/a", "owner-a", TTL)
        .await
        .unwrap()
        .unwrap();
    let b = store
        .try_lock("jobs/b", "owner-b", TTL)
        .await
        .unwrap()
        .unwrap();
    let other = store
        .try_lock("other", "owner-o", TTL)
        .await
        .unwrap()
        .unwrap();

    // list: a table of every live holder.
    let ran = run(url, &["list"], None);
    assert_eq!(ran.code, 0, "{ran:?}");
    for text in [
        "NAME",
        "OWNER",
        "FENCE",
        "EXPIRES IN",
        "jobs/a",
        "owner-a",
        "jobs/b",
        "owner-b",
        "other",
        "owner-o",
    ] {
        assert!(ran.stdout.contains(text), "{text} missing: {ran:?}");
    }

    // list --prefix --json: exactly the grants under the prefix.
    let ran = run(url, &["list", "--prefix", "jobs/", "--json"], None);
    assert_eq!(ran.code, 0, "{ran:?}");
    assert_eq!(
        grants(&ran.stdout),
        [
            triple("jobs/a", "owner-a", a.fence()),
            triple("jobs/b", "owner-b", b.fence())
        ]
    );
    // --limit caps the whole listing, in name order.
    let ran = run(url, &["list", "--json", "--limit", "2"], None);
    assert_eq!(ran.code, 0, "{ran:?}");
    assert_eq!(
        grants(&ran.stdout),
        [
            triple("jobs/a", "owner-a", a.fence()),
            triple("jobs/b", "owner-b", b.fence())
        ]
    );
    let ran = run(url, &["list", "--prefix", "nothing/", "--json"], None);
    assert_eq!((ran.code, grants(&ran.stdout)), (0, Vec::new()), "{ran:?}");

    // show: the holder, or exit 1 for a free name.
    let ran = run(url, &["show", "jobs/a"], None);
    assert_eq!(ran.code, 0, "{ran:?}");
    assert!(ran.stdout.contains("owner-a"), "{ran:?}");
    assert!(ran.stdout.contains(&a.fence().to_string()), "{ran:?}");
    let ran = run(url, &["show", "jobs/a", "--json"], None);
    let shown: Value = serde_json::from_str(&ran.stdout).unwrap();
    assert_eq!(grant(&shown), triple("jobs/a", "owner-a", a.fence()));
    waiters_are_shown(url, store.as_ref()).await;
    let ran = run(url, &["show", "free-name"], None);
    assert_eq!(ran.code, 1, "{ran:?}");
    let ran = run(url, &["show", "free-name", "--json"], None);
    assert_eq!((ran.code, ran.stdout.trim()), (1, "null"), "{ran:?}");

    // release --force --yes: the old handle learns it lost the lease.
    let ran = run(url, &["release", "--force", "jobs/a", "--yes"], None);
    assert_eq!(ran.code, 0, "{ran:?}");
    assert!(ran.stdout.contains("owner-a"), "{ran:?}");
    assert!(!a.renew(TTL).await.unwrap());
    assert_eq!(store.holder("jobs/a").await.unwrap(), None);
    let ran = run(url, &["release", "--force", "jobs/a", "--yes"], None);
    assert_eq!(ran.code, 1, "{ran:?}");
    // A free name: said so, nothing asked.
    let ran = run(url, &["release", "--force", "free-name"], Some("y\n"));
    assert_eq!(ran.code, 1, "{ran:?}");
    assert!(!ran.stderr.contains("[y/N]"), "{ran:?}");

    // The prompt names the holder; "n" keeps the lock, "y" releases it.
    let question = format!(
        "Release other held by owner-o (fence {})? [y/N]",
        other.fence()
    );
    let ran = run(url, &["release", "--force", "other"], Some("n\n"));
    assert_eq!(ran.code, 4, "{ran:?}");
    assert!(ran.stderr.contains(&question), "{ran:?}");
    assert_eq!(
        store.holder("other").await.unwrap().map(|h| h.fence),
        Some(other.fence())
    );
    // No answer at all (end of input) is no.
    let ran = run(url, &["release", "--force", "other"], Some(""));
    assert_eq!(ran.code, 4, "{ran:?}");
    let ran = run(url, &["release", "--force", "other"], Some("y\n"));
    assert_eq!(ran.code, 0, "{ran:?}");
    assert!(ran.stderr.contains(&question), "{ran:?}");
    assert_eq!(store.holder("other").await.unwrap(), None);
    assert!(!other.renew(TTL).await.unwrap());

    // Without --force, clap refuses: a usage error, and the lock stays.
    let ran = run(url, &["release", "jobs/b", "--yes"], None);
    assert_eq!(ran.code, 2, "{ran:?}");
    assert_eq!(
        store.holder("jobs/b").await.unwrap().map(|h| h.fence),
        Some(b.fence())
    );

    // The next grant of a force-released name has a higher fence.
    let again = store
        .try_lock("jobs/a", "owner-a2", TTL)
        .await
        .unwrap()
        .unwrap();
    assert!(again.fence() > a.fence());

    assert!(again.release().await.unwrap());
    assert!(b.release().await.unwrap());
    assert!(!a.release().await.unwrap());
    assert!(!other.release().await.unwrap());
    semaphores(url, store.as_ref()).await;
    reader_writer_locks(url, store.as_ref()).await;
    store.close().await.unwrap();
}

/// show lists a held name's waiters below its holder: a waiting call of
/// another store, its owner and what it waits for. The waiting call is
/// then dropped: it leaves.
async fn waiters_are_shown(url: &str, store: &dyn Store) {
    let other = alkstore::open(url).await.unwrap();
    let waiting =
        tokio::spawn(async move { other.lock("jobs/a", "waiter-w", TTL, PATIENCE).await });
    let deadline = Instant::now() + PATIENCE;
    while store.waiters("jobs/a").await.unwrap().is_empty() {
        assert!(Instant::now() < deadline, "the waiting call never queued");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let ran = run(url, &["show", "jobs/a"], None);
    assert_eq!(ran.code, 0, "{ran:?}");
    for text in [
        "owner-a",
        "1 waiting",
        "PLACE",
        "WAITING",
        "waiter-w",
        "lock",
    ] {
        assert!(ran.stdout.contains(text), "{text} missing: {ran:?}");
    }
    waiting.abort();
    while !store.waiters("jobs/a").await.unwrap().is_empty() {
        assert!(Instant::now() < deadline, "the dropped waiter never left");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// list, show and release of a reader-writer lock's grants: its readers
/// in slot order with their access, then its writer; `release --force` of
/// the name is refused, one grant goes by `--fence`.
async fn reader_writer_locks(url: &str, store: &dyn Store) {
    let r0 = store
        .try_read_lock("shared", "r0", TTL)
        .await
        .unwrap()
        .unwrap();
    let r1 = store
        .try_read_lock("shared", "r1", TTL)
        .await
        .unwrap()
        .unwrap();
    let w = store
        .try_write_lock("sole", "w", TTL)
        .await
        .unwrap()
        .unwrap();
    let ran = run(url, &["list", "--prefix", "s", "--json"], None);
    let value: Value = serde_json::from_str(&ran.stdout).unwrap_or_else(|e| panic!("{e}: {ran:?}"));
    let seen: Vec<(String, String, Value, Value)> = value
        .as_array()
        .unwrap_or_else(|| panic!("an array: {ran:?}"))
        .iter()
        .map(|e| {
            let (name, owner, _) = grant(e);
            (name, owner, e["access"].clone(), e["slot"].clone())
        })
        .collect();
    let expected = [
        ("shared", "r0", json!("read"), json!(0)),
        ("shared", "r1", json!("read"), json!(1)),
        ("sole", "w", json!("write"), Value::Null),
    ]
    .map(|(n, o, a, s)| (n.to_owned(), o.to_owned(), a, s));
    assert_eq!(seen, expected, "{ran:?}");
    let ran = run(url, &["show", "shared"], None);
    for text in ["GRANT", "read", "r0", "r1"] {
        assert!(ran.stdout.contains(text), "{text} missing: {ran:?}");
    }
    let ran = run(url, &["release", "--force", "shared", "--yes"], None);
    assert_eq!(ran.code, 3, "{ran:?}");
    assert!(ran.stderr.contains("reader-writer"), "{ran:?}");
    assert_eq!(store.holders("shared").await.unwrap().len(), 2);
    let fence = r1.fence().to_string();
    let ran = run(
        url,
        &["release", "--force", "shared", "--fence", &fence],
        Some("y\n"),
    );
    assert_eq!(ran.code, 0, "{ran:?}");
    assert!(ran.stderr.contains("read)"), "{ran:?}");
    assert!(!r1.renew(TTL).await.unwrap());
    let fence = w.fence().to_string();
    let ran = run(
        url,
        &["release", "--force", "sole", "--fence", &fence, "--yes"],
        None,
    );
    assert_eq!(ran.code, 0, "{ran:?}");
    assert!(!w.renew(TTL).await.unwrap());
    assert!(r0.release().await.unwrap());
}

/// list, show and release of a semaphore's permits: one row each, with its
/// slot; `release --force` of the name is refused, one permit goes by
/// `--fence`.
async fn semaphores(url: &str, store: &dyn Store) {
    let mut permits = Vec::new();
    for owner in ["p0", "p1", "p2"] {
        let permit = store.try_acquire_permit("pool", 3, owner, TTL).await;
        permits.push(permit.unwrap().unwrap());
    }
    let slots = |json: &str| -> Vec<(String, u64, u64)> {
        let value: Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json}"));
        let entries = value
            .as_array()
            .unwrap_or_else(|| panic!("an array: {json}"));
        entries
            .iter()
            .map(|e| {
                let (_, owner, _) = grant(e);
                (
                    owner,
                    e["slot"].as_u64().unwrap(),
                    e["permits"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    let expected = [0, 1, 2].map(|slot| (format!("p{slot}"), slot, 3));
    let ran = run(url, &["list", "--prefix", "pool", "--json"], None);
    assert_eq!(slots(&ran.stdout), expected, "{ran:?}");
    let ran = run(url, &["show", "pool", "--json"], None);
    assert_eq!(
        (ran.code, slots(&ran.stdout)),
        (0, expected.to_vec()),
        "{ran:?}"
    );
    let ran = run(url, &["show", "pool"], None);
    for text in ["GRANT", "0 of 3", "1 of 3", "2 of 3", "p2"] {
        assert!(ran.stdout.contains(text), "{text} missing: {ran:?}");
    }

    // The name: refused, with or without --yes; nothing removed.
    for stdin in [None, Some("y\n")] {
        let args: &[&str] = match stdin {
            None => &["release", "--force", "pool", "--yes"],
            Some(_) => &["release", "--force", "pool"],
        };
        let ran = run(url, args, stdin);
        assert_eq!(ran.code, 3, "{ran:?}");
        assert!(ran.stderr.contains("semaphore"), "{ran:?}");
    }
    assert_eq!(store.holders("pool").await.unwrap().len(), 3);

    // One permit, by its fence, confirmed.
    let fence = permits[1].fence().to_string();
    let ran = run(
        url,
        &["release", "--force", "pool", "--fence", &fence],
        Some("y\n"),
    );
    assert_eq!(ran.code, 0, "{ran:?}");
    assert!(ran.stderr.contains("permit 1 of 3"), "{ran:?}");
    assert!(!permits[1].renew(TTL).await.unwrap());
    assert_eq!(store.holders("pool").await.unwrap().len(), 2);
    // A fence no live grant has: nothing there.
    let ran = run(
        url,
        &["release", "--force", "pool", "--fence", &fence, "--yes"],
        None,
    );
    assert_eq!(ran.code, 1, "{ran:?}");
    for permit in permits {
        permit.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_list_show_release() {
    let dir = tempfile::tempdir().unwrap();
    list_show_release(&sqlite_url(&dir)).await;
}

/// Runs `check` on the URL of a new store in a schema of its own on the
/// test server, then drops the schema.
async fn on_a_postgres_store<F: Future<Output = ()>>(
    prefix: &str,
    check: impl FnOnce(String) -> F,
) {
    let Some(server) = alkstore_testkit::pg::server() else {
        return;
    };
    let schema = alkstore_testkit::pg::unique_schema(prefix);
    let sep = if server.url.contains('?') { '&' } else { '?' };
    check(format!("{}{sep}schema={schema}", server.url)).await;
    let direct = alkstore::postgres::PgStore::connect(&server.url, &schema)
        .await
        .unwrap();
    direct.drop_schema().await.unwrap();
    direct.close().await.unwrap();
}

/// Runs `check` on the URL of a new store in a database of its own on the
/// test server, then drops the database.
async fn on_a_mysql_store<F: Future<Output = ()>>(prefix: &str, check: impl FnOnce(String) -> F) {
    let Some(server) = alkstore_testkit::mysql::server() else {
        return;
    };
    let database = alkstore_testkit::unique_name(prefix);
    check(format!("{}/{database}", server.url)).await;
    let direct = alkstore::mysql::MySqlStore::connect(&server.url, &database)
        .await
        .unwrap();
    direct.drop_database().await.unwrap();
    direct.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_list_show_release() {
    on_a_postgres_store("cli", |url| async move { list_show_release(&url).await }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_list_show_release() {
    on_a_mysql_store("cli", |url| async move { list_show_release(&url).await }).await;
}

/// Runs `check` on the URL of a new store under a prefix of its own on the
/// test etcd cluster, then removes its keys.
async fn on_an_etcd_store<F: Future<Output = ()>>(prefix: &str, check: impl FnOnce(String) -> F) {
    let Some(server) = alkstore_testkit::etcd::server() else {
        return;
    };
    let url = format!("{}/{}", server.url, alkstore_testkit::unique_name(prefix));
    check(url.clone()).await;
    let direct = alkstore::etcd::EtcdStore::connect(&url).await.unwrap();
    direct.remove_store().await.unwrap();
    direct.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_list_show_release() {
    on_an_etcd_store("cli", |url| async move { list_show_release(&url).await }).await;
}

/// doctor on etcd: the testkit's three members keep the failover promise;
/// an etcd with the lease bugs of leader changes gives exclusion up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_judges_an_etcd_cluster() {
    let Some(server) = alkstore_testkit::etcd::server() else {
        return;
    };
    if server.cluster.is_none() {
        return; // only the harness's own cluster is known to have three members
    }
    let url = format!("{}/{}", server.url, alkstore_testkit::unique_name("doctor"));
    let (code, verdicts) = doctor(&url);
    // The failover promise is kept by three members; exclusion is given up
    // on an etcd with the lease bugs of leader changes (Debian's 3.4.23),
    // and doctor then exits 5.
    let failover = &verdicts["no_grant_lost_in_a_failover"];
    assert_eq!(failover.0, "kept", "{verdicts:?}");
    assert!(failover.1.contains("3 voting members"), "{verdicts:?}");
    let exclusion = &verdicts["exclusion"];
    match exclusion.0.as_str() {
        "kept" => assert_eq!(code, 0, "{verdicts:?}"),
        _ => {
            assert_eq!(exclusion.0, "given up", "{verdicts:?}");
            assert!(exclusion.1.contains("upgrade"), "{verdicts:?}");
            assert_eq!(code, 5, "{verdicts:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_deletes_expired_rows_and_says_how_many() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(&dir);
    let store = alkstore::open(&url).await.unwrap();
    let short_ttl = Duration::from_millis(200);
    let short = store
        .try_lock("short", "o", short_ttl)
        .await
        .unwrap()
        .unwrap();
    let live = store.try_lock("live", "o", TTL).await.unwrap().unwrap();
    // Wait out the whole lease, then until the store agrees it is over.
    tokio::time::sleep(short_ttl).await;
    let deadline = Instant::now() + PATIENCE;
    while store.holder("short").await.unwrap().is_some() {
        assert!(Instant::now() < deadline, "the lease never ended");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let ran = run(&url, &["purge"], None);
    assert_eq!(
        (ran.code, ran.stdout.as_str()),
        (0, "purged 1 expired lock\n"),
        "{ran:?}"
    );
    let ran = run(&url, &["purge", "--json"], None);
    let purged: Value = serde_json::from_str(&ran.stdout).unwrap();
    assert_eq!(purged, serde_json::json!({ "purged": 0 }));
    assert_eq!(
        store.holder("live").await.unwrap().map(|h| h.fence),
        Some(live.fence())
    );

    assert!(!short.release().await.unwrap());
    assert!(live.release().await.unwrap());
    store.close().await.unwrap();
}

/// `raise-fences` lifts every later fence by what it is asked (2^40 by
/// default) and says from where; a raise out of range is refused, exit 3,
/// and raises nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raise_fences_lifts_every_later_fence() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(&dir);
    let store = alkstore::open(&url).await.unwrap();
    let first = store.try_lock("job", "o", TTL).await.unwrap().unwrap();
    let before = first.fence();
    assert!(first.release().await.unwrap());

    let ran = run(&url, &["raise-fences", "--by", "1"], None);
    assert_eq!(ran.code, 3, "{ran:?}");
    assert!(ran.stderr.contains("invalid fence raise 1"), "{ran:?}");
    let ran = run(&url, &["raise-fences", "--json"], None);
    assert_eq!(ran.code, 0, "{ran:?}");
    let raised: Value = serde_json::from_str(&ran.stdout).unwrap();
    assert_eq!(raised["raised_by"], 1u64 << 40);
    let next = raised["next_fence_at_least"].as_u64().unwrap();
    assert!(next > before + (1 << 40), "{raised}");
    let ran = run(&url, &["raise-fences", "--by", "1048576"], None);
    assert_eq!(ran.code, 0, "{ran:?}");
    assert!(
        ran.stdout.starts_with("fences raised by 1048576: "),
        "{ran:?}"
    );

    let after = store.try_lock("job", "o", TTL).await.unwrap().unwrap();
    assert!(
        after.fence() >= next + (1 << 20),
        "fence {} after {ran:?}",
        after.fence()
    );
    assert!(after.release().await.unwrap());
    store.close().await.unwrap();
}

/// The operator is shown one grant and answers yes; meanwhile that grant
/// was released and another holder took the name. The answer removes
/// nothing: the new holder keeps the lock, and the binary says why (exit 4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmed_release_removes_only_the_grant_shown() {
    use std::io::{Read, Write};

    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(&dir);
    let store = alkstore::open(&url).await.unwrap();
    let shown = store.try_lock("swap", "first", TTL).await.unwrap().unwrap();
    let mut child = Running(
        std::process::Command::new(BIN)
            .env_remove("ALKSTORE_URL")
            .args(["--url", url.as_str(), "release", "--force", "swap"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let child = &mut child.0;
    // Wait for the question (it ends without a newline).
    let mut stderr = child.stderr.take().unwrap();
    let mut seen = Vec::new();
    let mut byte = [0u8; 1];
    while !String::from_utf8_lossy(&seen).contains("[y/N] ") {
        assert_eq!(stderr.read(&mut byte).unwrap(), 1, "no question: {seen:?}");
        seen.push(byte[0]);
    }
    assert!(shown.release().await.unwrap());
    let next = store
        .try_lock("swap", "second", TTL)
        .await
        .unwrap()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"y\n").unwrap();
    let status = child.wait().unwrap();
    let mut rest = String::new();
    stderr.read_to_string(&mut rest).unwrap();
    assert_eq!(status.code(), Some(4), "{rest}");
    assert!(rest.contains("the holder changed"), "{rest}");
    assert_eq!(
        store
            .holder("swap")
            .await
            .unwrap()
            .map(|h| (h.owner, h.fence)),
        Some(("second".to_owned(), next.fence())),
        "the confirmed release removed a grant the operator never saw"
    );
    assert!(next.release().await.unwrap());
    store.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_url_can_come_from_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(&dir);
    let store = alkstore::open(&url).await.unwrap();
    let lock = store
        .try_lock("jobs/env", "owner-e", TTL)
        .await
        .unwrap()
        .unwrap();

    let mut cmd = Command::new(BIN);
    cmd.env("ALKSTORE_URL", &url).args(["show", "jobs/env"]);
    let ran = run_command(cmd, None);
    assert_eq!(ran.code, 0, "{ran:?}");
    assert!(ran.stdout.contains("owner-e"), "{ran:?}");

    // Neither --url nor the variable: a usage error.
    let mut cmd = Command::new(BIN);
    cmd.env_remove("ALKSTORE_URL").args(["show", "jobs/env"]);
    assert_eq!(run_command(cmd, None).code, 2);

    assert!(lock.release().await.unwrap());
    store.close().await.unwrap();
}

#[test]
fn help_names_the_variable_but_never_its_value() {
    let mut cmd = Command::new(BIN);
    cmd.env("ALKSTORE_URL", "postgres://app:S3cretPw@db/app")
        .arg("--help");
    let ran = run_command(cmd, None);
    assert_eq!(ran.code, 0, "{ran:?}");
    assert!(ran.stdout.contains("ALKSTORE_URL"), "{ran:?}");
    assert!(ran.stdout.contains("Exit codes"), "{ran:?}");
    assert!(
        !ran.stdout.contains("S3cretPw") && !ran.stderr.contains("S3cretPw"),
        "{ran:?}"
    );
}

#[test]
fn bad_urls_exit_3_with_the_cause() {
    for (url, command) in ["redis://nowhere/0", "locks.db", "sqlite://"]
        .into_iter()
        .flat_map(|url| [(url, "list"), (url, "doctor")])
    {
        let ran = run(url, &[command], None);
        assert_eq!(ran.code, 3, "{url}: {ran:?}");
        assert!(ran.stderr.starts_with("alkstore: "), "{url}: {ran:?}");
        assert!(ran.stderr.contains("\n  caused by: "), "{url}: {ran:?}");
        assert_eq!(ran.stdout, "", "{url}: {ran:?}");
    }
}

/// A server that refuses the connection is answered at once (not after the
/// pool's 10 s timeout), saying where the connection went and why.
#[test]
fn a_refused_connection_exits_3_at_once_with_where_and_why() {
    for url in [
        "postgres://u:pw@127.0.0.1:1/x",
        "mysql://u:pw@127.0.0.1:1/x",
    ] {
        for command in ["list", "doctor"] {
            let asked = std::time::Instant::now();
            let ran = run(url, &[command], None);
            let took = asked.elapsed();
            assert_eq!(ran.code, 3, "{url} {command}: {ran:?}");
            assert!(
                took < Duration::from_secs(3),
                "{url} {command}: answered after {took:?}"
            );
            assert!(
                ran.stderr.contains("cannot connect to 127.0.0.1:1"),
                "{url} {command}: {ran:?}"
            );
            assert!(
                ran.stderr.contains("Connection refused"),
                "{url} {command}: {ran:?}"
            );
        }
    }
}

/// Nothing listens on port 1: the driver's own error, which must not carry
/// the password in any form, nor may anything else printed.
#[test]
fn no_output_holds_the_password() {
    let urls = [
        "postgres://user:S3cretPw@127.0.0.1:1/db",
        "postgres://user:S3cret%50w@127.0.0.1:1/db",
        "postgres://user@127.0.0.1:1/db?password=S3cretPw",
        "mysql://user:S3cretPw@127.0.0.1:1/db",
        "postgres://user:S3cretPw@127.0.0.1:notaport/db",
    ];
    // At once: a refused connection is retried until the connect timeout.
    std::thread::scope(|scope| {
        for url in urls {
            scope.spawn(move || {
                let ran = run(url, &["list"], None);
                assert_eq!(ran.code, 3, "{url}: {ran:?}");
                assert!(ran.stderr.starts_with("alkstore: "), "{url}: {ran:?}");
                for secret in ["S3cretPw", "S3cret%50w"] {
                    assert!(
                        !ran.stdout.contains(secret) && !ran.stderr.contains(secret),
                        "{url}: {ran:?}"
                    );
                }
            });
        }
    });
}

/// A running binary (a `watch`, a question waiting for its answer), killed
/// when dropped (also when the test fails).
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The lines `stdout` gives, sent as they come by a thread; the channel
/// closes at end of output.
fn lines_of(stdout: ChildStdout) -> mpsc::Receiver<String> {
    let (send, receive) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if send.send(line).is_err() {
                break;
            }
        }
    });
    receive
}

/// The next line, within [`PATIENCE`].
fn next_line(lines: &mpsc::Receiver<String>) -> String {
    lines
        .recv_timeout(PATIENCE)
        .expect("watch prints a line within 10 s")
}

/// A watch line starts with a UTC timestamp such as `2024-05-01T12:34:56.789Z`.
fn assert_timestamped(line: &str) {
    let stamp = line.split_whitespace().next().unwrap_or_default();
    assert!(
        stamp.len() == 24
            && stamp.as_bytes()[4] == b'-'
            && stamp.contains('T')
            && stamp.ends_with('Z'),
        "{line}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_prints_each_change_of_holder() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(&dir);
    let store = alkstore::open(&url).await.unwrap();
    let first = store.try_lock("jobs/w", "w1", TTL).await.unwrap().unwrap();

    let child = std::process::Command::new(BIN)
        .env_remove("ALKSTORE_URL")
        .args(["--url", &url, "watch", "jobs/w", "--interval", "50"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut watch = Running(child);
    let lines = lines_of(watch.0.stdout.take().unwrap());

    let line = next_line(&lines);
    assert_timestamped(&line);
    assert!(
        line.contains(&format!("held by w1 (fence {}", first.fence())),
        "{line}"
    );

    assert!(first.release().await.unwrap());
    let line = next_line(&lines);
    assert_timestamped(&line);
    assert!(line.ends_with(" free"), "{line}");

    let second = store.try_lock("jobs/w", "w2", TTL).await.unwrap().unwrap();
    let line = next_line(&lines);
    assert_timestamped(&line);
    assert!(
        line.contains(&format!("held by w2 (fence {}", second.fence())),
        "{line}"
    );

    // Ctrl-C ends it with exit 0 (where `kill` can send one).
    let interrupted = std::process::Command::new("kill")
        .args(["-INT", &watch.0.id().to_string()])
        .status()
        .is_ok_and(|status| status.success());
    if interrupted {
        // The output ends (and nothing more was printed) ...
        assert_eq!(
            lines.recv_timeout(PATIENCE),
            Err(mpsc::RecvTimeoutError::Disconnected)
        );
        // ... because the process exited, successfully.
        let status = watch.0.wait().unwrap();
        assert!(status.success(), "{status}");
    } else {
        eprintln!("no `kill` to send SIGINT with: the watch is killed instead");
    }
    drop(watch);

    assert!(second.release().await.unwrap());
    store.close().await.unwrap();
}

/// `doctor --json` on `url`: the exit code, and each promise's verdict and
/// reason by the promise's key.
fn doctor(url: &str) -> (i32, std::collections::HashMap<String, (String, String)>) {
    let ran = run(url, &["doctor", "--json"], None);
    assert!(
        ran.code == 0 || ran.code == 5,
        "doctor failed on {}: {ran:?}",
        alkstore::engine::url::masked(url)
    );
    let report: Value = serde_json::from_str(&ran.stdout).unwrap();
    let verdicts = report["promises"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let text = |key: &str| p[key].as_str().unwrap().to_owned();
            (text("promise"), (text("verdict"), text("because")))
        })
        .collect();
    (ran.code, verdicts)
}

/// Asserts each promise's verdict, and that the failover finding's reason
/// says `why`.
fn assert_verdicts(
    verdicts: &std::collections::HashMap<String, (String, String)>,
    failover: &str,
    why: &str,
) {
    let verdict = |key: &str| verdicts[key].0.as_str();
    assert_eq!(verdict("exclusion"), "kept", "{verdicts:?}");
    assert_eq!(verdict("no_grant_lost_in_a_crash"), "kept", "{verdicts:?}");
    assert_eq!(
        verdict("no_grant_lost_in_a_failover"),
        failover,
        "{verdicts:?}"
    );
    assert!(
        verdicts["no_grant_lost_in_a_failover"].1.contains(why),
        "{verdicts:?}"
    );
}

/// PostgreSQL: a default cluster (asynchronous if anything: the failover
/// promise given up, exit 5), a synchronous pair (every promise kept,
/// exit 0), the same read by a role that cannot see which standbys are
/// synchronous (unknown, exit 5, what to grant), an asynchronous pair
/// (given up). Nothing is created: doctor opens no store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_judges_postgres_deployments() {
    let Some(server) = alkstore_testkit::pg::server() else {
        return;
    };
    if server.cluster.is_some() {
        let (code, verdicts) = doctor(&server.url);
        assert_eq!(code, 5);
        assert_verdicts(&verdicts, "given up", "synchronous_standby_names is empty");
        assert_eq!(verdicts["fences_rise_across_a_failover"].0, "kept");
    }
    let Some(sync) = alkstore_testkit::pg::Pair::start(true) else {
        return;
    };
    let mut admin = <sqlx::PgConnection as sqlx::Connection>::connect(&sync.primary_url)
        .await
        .unwrap();
    let (code, verdicts) = doctor(&sync.primary_url);
    assert_eq!(code, 0, "{verdicts:?}");
    assert_verdicts(&verdicts, "kept", "1 synchronous now");
    let table = run(&sync.primary_url, &["doctor"], None);
    assert_eq!(table.code, 0, "{table:?}");
    assert!(
        table.stdout.lines().any(
            |l| l.starts_with("no answered grant lost in a failover") && l.contains("  kept  ")
        ),
        "{table:?}"
    );

    sqlx::query("CREATE ROLE plain LOGIN PASSWORD 'plain'")
        .execute(&mut admin)
        .await
        .unwrap();
    let plain = format!(
        "postgres://plain:plain@127.0.0.1:{}/postgres",
        sync.primary.port
    );
    let (code, verdicts) = doctor(&plain);
    assert_eq!(code, 5);
    assert_verdicts(&verdicts, "unknown", "grant it pg_read_all_stats");
    let (objects,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM pg_namespace WHERE nspname NOT LIKE 'pg\\_%' AND nspname NOT IN ('public', 'information_schema')",
    )
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert_eq!(objects, 0, "doctor created a schema");

    let Some(asynchronous) = alkstore_testkit::pg::Pair::start(false) else {
        return;
    };
    let (code, verdicts) = doctor(&asynchronous.primary_url);
    assert_eq!(code, 5);
    assert_verdicts(&verdicts, "given up", "synchronous_standby_names is empty");
}

/// MariaDB: the default test server (no binary log: nothing replicates,
/// the failover promise given up), a primary with an asynchronous replica
/// (given up: no semi-sync; `sync_binlog = 0` first), and one with lossless
/// semi-sync replication (every promise kept, exit 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_judges_mariadb_deployments() {
    let Some(server) = alkstore_testkit::mysql::server() else {
        return;
    };
    if server.instance.is_some() {
        let (code, verdicts) = doctor(&server.url);
        assert_eq!(code, 5);
        assert_verdicts(&verdicts, "given up", "log_bin = OFF");
    }
    let Some(asynchronous) = alkstore_testkit::mysql::Pair::start(false) else {
        return;
    };
    // The binary log on, sync_binlog = 0 (the default): a power loss can
    // lose an answered commit's binary-log record, and recovery then
    // rolls the commit back.
    let (code, verdicts) = doctor(&asynchronous.primary_url);
    assert_eq!(code, 5);
    assert_crash_given_up(&verdicts, "sync_binlog = 0");
    // A replica grants nothing, and its settings are not the primary's.
    let (code, verdicts) = doctor(&asynchronous.replica_url);
    assert_eq!(code, 5, "{verdicts:?}");
    assert_not_a_primary(&verdicts, "Slaves_running = 1");
    let Some(semi_sync) = alkstore_testkit::mysql::Pair::start(true) else {
        return;
    };
    let (code, verdicts) = doctor(&semi_sync.primary_url);
    assert_eq!(code, 0, "{verdicts:?}");
    assert_verdicts(&verdicts, "kept", "1 semi-sync replicas now");
    // The same primary made read-only, as a failover manager fences off a
    // demoted one.
    run_sql(&semi_sync.primary_url, "SET GLOBAL read_only = ON").await;
    let (code, verdicts) = doctor(&semi_sync.primary_url);
    assert_eq!(code, 5, "{verdicts:?}");
    assert_not_a_primary(&verdicts, "read_only = ON");
    // Torn pages: a crash can corrupt the table.
    let Some(torn) = alkstore_testkit::mysql::own_server(&["--innodb-doublewrite=0"]) else {
        return;
    };
    let (code, verdicts) = doctor(&torn.url);
    assert_eq!(code, 5, "{verdicts:?}");
    assert_crash_given_up(&verdicts, "innodb_doublewrite = OFF");
}

/// Runs one statement on the server `url` names.
async fn run_sql(url: &str, statement: &'static str) {
    use sqlx::Connection;
    let mut conn = sqlx::MySqlConnection::connect(url).await.unwrap();
    sqlx::query(statement).execute(&mut conn).await.unwrap();
}

/// The crash promise given up for `why` (and so the failover promise).
fn assert_crash_given_up(
    verdicts: &std::collections::HashMap<String, (String, String)>,
    why: &str,
) {
    let (verdict, because) = &verdicts["no_grant_lost_in_a_crash"];
    assert_eq!(
        (verdict.as_str(), because.contains(why)),
        ("given up", true),
        "{verdicts:?}"
    );
    assert_eq!(
        verdicts["no_grant_lost_in_a_failover"].0, "given up",
        "{verdicts:?}"
    );
}

/// A server that is no primary: exclusion n/a, the durability promises
/// unknown, each saying `why` and to run doctor on the primary.
fn assert_not_a_primary(verdicts: &std::collections::HashMap<String, (String, String)>, why: &str) {
    assert_eq!(verdicts["exclusion"].0, "n/a", "{verdicts:?}");
    for promise in ["no_grant_lost_in_a_crash", "no_grant_lost_in_a_failover"] {
        let (verdict, because) = &verdicts[promise];
        assert_eq!(verdict, "unknown", "{verdicts:?}");
        assert!(because.contains(why), "{verdicts:?}");
        assert!(
            because.contains("run doctor on the primary"),
            "{verdicts:?}"
        );
    }
}

/// SQLite: a store's file keeps what one host can (exit 0); a missing file
/// is an error (exit 3), and is not created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_judges_an_sqlite_file_and_creates_none() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(&dir);
    alkstore::open(&url).await.unwrap().close().await.unwrap();
    let (code, verdicts) = doctor(&url);
    assert_eq!(code, 0, "{verdicts:?}");
    assert_eq!(verdicts["no_grant_lost_in_a_crash"].0, "kept");
    assert_eq!(verdicts["no_grant_lost_in_a_failover"].0, "n/a");
    let missing = format!("sqlite://{}", dir.path().join("missing.db").display());
    let ran = run(&missing, &["doctor"], None);
    assert_eq!(ran.code, 3, "{ran:?}");
    assert!(ran.stderr.contains("read-only"), "{ran:?}");
    assert!(!dir.path().join("missing.db").exists());
}

/// `doctor` shows the fences left in the URL's store, on every engine: up
/// to `MAX_FENCE` from the lowest fence a later grant can get (what a
/// raise answers), read without drawing one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_shows_the_fences_left() {
    let dir = tempfile::tempdir().unwrap();
    assert_fences_left_shown(&sqlite_url(&dir)).await;
    on_a_postgres_store(
        "left",
        |url| async move { assert_fences_left_shown(&url).await },
    )
    .await;
    on_a_mysql_store(
        "left",
        |url| async move { assert_fences_left_shown(&url).await },
    )
    .await;
}

/// Past the end of the fences (a grant refused there still moved
/// PostgreSQL's sequence), `doctor` says none is left, on every engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_shows_no_fences_left_past_the_end() {
    let dir = tempfile::tempdir().unwrap();
    assert_none_left_shown(sqlite_url(&dir)).await;
    on_a_postgres_store("end", assert_none_left_shown).await;
    on_a_mysql_store("end", assert_none_left_shown).await;
}

/// Raises the store `url` names to its last fences, grants until refused,
/// and checks what `doctor` says is left.
async fn assert_none_left_shown(url: String) {
    let store = alkstore::open(&url).await.unwrap();
    while store.raise_fences(alkstore::MAX_FENCE_RAISE).await.is_ok() {}
    let held = store.try_lock("held", "o", TTL).await.unwrap().unwrap();
    let left = alkstore::MAX_FENCE - held.fence();
    store.raise_fences(left - 4).await.unwrap();
    let mut grants = 0;
    let refused = loop {
        match store.try_lock(&format!("n{grants}"), "o", TTL).await {
            Ok(Some(lock)) => lock.let_lapse(),
            other => break other,
        }
        grants += 1;
        assert!(grants < 16, "the fences end");
    };
    assert!(
        matches!(
            refused,
            Err(alkstore::Error::FencesExhausted { left: 0, .. })
        ),
        "{refused:?}"
    );
    held.let_lapse();
    store.close().await.unwrap();
    let ran = run(&url, &["doctor", "--json"], None);
    let report: Value = serde_json::from_str(&ran.stdout).unwrap();
    let shown = report["settings"]["fences left"].as_str().unwrap();
    let url = alkstore::engine::url::masked(&url);
    assert!(shown.starts_with("0 grants, 0 raises"), "{url}: {shown}");
}

/// Opens the store `url` names, grants once, raises by the default, and
/// checks what `doctor` says is left.
async fn assert_fences_left_shown(url: &str) {
    let store = alkstore::open(url).await.unwrap();
    let lock = store.try_lock("job", "o", TTL).await.unwrap().unwrap();
    assert!(lock.release().await.unwrap());
    let next = store
        .raise_fences(alkstore::DEFAULT_FENCE_RAISE)
        .await
        .unwrap();
    store.close().await.unwrap();
    let ran = run(url, &["doctor", "--json"], None);
    let report: Value = serde_json::from_str(&ran.stdout).unwrap();
    let left = report["settings"]["fences left"].as_str().unwrap();
    let expected = alkstore::MAX_FENCE - next + 1;
    let shown = format!("{expected} grants, {} raises of 2^40", expected >> 40);
    let url = alkstore::engine::url::masked(url);
    assert!(left.starts_with(&shown), "{url}: {left}, expected {shown}");
}

/// `list`, `show` and `watch` on a standby say so on stderr (what it shows
/// may be behind the primary); on the primary they say nothing of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reading_a_standby_is_warned_of() {
    let Some(pair) = alkstore_testkit::pg::Pair::start(false) else {
        return;
    };
    let schema = alkstore_testkit::pg::unique_schema("standby_cli");
    let primary = alkstore::open(&format!("{}?schema={schema}", pair.primary_url))
        .await
        .unwrap();
    let lock = primary
        .try_lock("job", "owner", Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    let standby_url = format!("{}?schema={schema}", pair.standby_url);
    // Until the standby has the grant.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !run(&standby_url, &["show", "job"], None)
        .stdout
        .contains("owner")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the standby never caught up"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for args in [&["show", "job"][..], &["list"][..]] {
        let on_standby = run(&standby_url, args, None);
        assert_eq!(on_standby.code, 0, "{on_standby:?}");
        assert!(on_standby.stderr.contains("is a standby"), "{on_standby:?}");
        let on_primary = run(&format!("{}?schema={schema}", pair.primary_url), args, None);
        assert_eq!(on_primary.code, 0, "{on_primary:?}");
        assert!(!on_primary.stderr.contains("standby"), "{on_primary:?}");
    }
    let mut watch = std::process::Command::new(BIN)
        .env_remove("ALKSTORE_URL")
        .args(["--url", &standby_url, "watch", "job"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let lines = lines_of(watch.stdout.take().unwrap());
    assert!(next_line(&lines).contains("owner"));
    let _ = watch.kill();
    let output = watch.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("is a standby"), "{stderr}");
    lock.release().await.unwrap();
}

/// `doctor` through PgBouncer names it and its mode, and warns (exit 5)
/// when the URL does not say `pooler=transaction` in front of a pooler in
/// transaction mode; straight to the server, it sees none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_names_the_pooler_and_its_mode() {
    use alkstore_testkit::pgbouncer::{Mode, shared};
    let Some(server) = alkstore_testkit::pg::server() else {
        return;
    };
    let (Some(session), Some(transaction)) = (shared(Mode::Session), shared(Mode::Transaction))
    else {
        return;
    };
    let report = |url: &str| {
        let ran = run(url, &["doctor", "--json"], None);
        let json: Value =
            serde_json::from_str(&ran.stdout).unwrap_or_else(|e| panic!("{e}: {ran:?}"));
        (ran.code, json)
    };
    let pooler = |json: &Value| json["settings"]["pooler"].as_str().unwrap().to_owned();
    let warnings = |json: &Value| json["warnings"].as_array().unwrap().len();

    let (_, direct) = report(&server.url);
    assert!(pooler(&direct).starts_with("none seen"), "{direct}");
    assert_eq!(warnings(&direct), 0);

    let (code, untold) = report(&transaction.url_for("postgres", ""));
    assert!(pooler(&untold).contains("transaction mode"), "{untold}");
    assert!(
        pooler(&untold).contains("refuses the startup parameter options"),
        "{untold}"
    );
    assert_eq!(code, 5);
    assert!(
        untold["warnings"][0]
            .as_str()
            .unwrap()
            .contains("pooler=transaction"),
        "{untold}"
    );
    let table = run(&transaction.url_for("postgres", ""), &["doctor"], None);
    assert!(
        table
            .stdout
            .contains("WARNING: a pooler in transaction mode"),
        "{table:?}"
    );

    let (_, told) = report(&transaction.url_for("postgres", "pooler=transaction"));
    assert!(pooler(&told).contains("transaction mode"), "{told}");
    assert_eq!(warnings(&told), 0, "{told}");

    let (_, sessions) = report(&session.url_for("postgres", "pooler=session"));
    assert!(pooler(&sessions).contains("session mode"), "{sessions}");
    assert_eq!(warnings(&sessions), 0, "{sessions}");
}

/// The CLI reaches a PostgreSQL that accepts only TLS with libpq's
/// parameters in its URL: `list` reads the store, `doctor` says what the
/// URL asks and what the server saw; a bad `sslmode` is refused with the
/// parameter named and the password masked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_speaks_tls_with_libpqs_parameters() {
    let Some(server) = alkstore_testkit::pg::TlsOwn::start() else {
        return;
    };
    let schema = alkstore_testkit::pg::unique_schema("clitls");
    let url = format!(
        "{}?schema={schema}&sslmode=verify-full&sslrootcert={}",
        server.url,
        server.certs.ca.display()
    );
    let store = alkstore::open(&url).await.unwrap();
    let lock = store.try_lock("n", "a", TTL).await.unwrap().unwrap();
    let listed = run(&url, &["list", "--json"], None);
    assert_eq!(listed.code, 0, "{listed:?}");
    assert_eq!(grants(&listed.stdout).len(), 1, "{listed:?}");
    lock.release().await.unwrap();
    store.close().await.unwrap();
    let report = run(&url, &["doctor"], None);
    assert!(
        report.stdout.contains("(sslmode=verify-full)") && report.stdout.contains("TLSv1.3"),
        "{report:?}"
    );
    let password = server.url.split(['@', ':']).nth(2).unwrap();
    let bad = run(&format!("{}?sslmode=bogus", server.url), &["list"], None);
    assert_ne!(bad.code, 0, "{bad:?}");
    assert!(bad.stderr.contains("`sslmode` is one of"), "{bad:?}");
    assert!(!bad.stderr.contains(password), "{bad:?}");
}
