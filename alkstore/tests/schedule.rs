//! The schedule guard with replicas in separate processes: each replica is
//! this test binary running its ignored test `schedule_replica_child`, with
//! its own clock offset, its own store and connections, on every engine.
//! The parent reads the runs each child reports and checks each slot ran
//! once; a child set to crash dies (abort) inside its first run from a
//! given slot on, and its slot must not be run again by the others.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

use alkstore::schedule::Schedule;

const PERIOD: Duration = Duration::from_millis(500);
const SKEW: Duration = Duration::from_millis(100);
/// The line a child prints when it starts a slot's job.
const STARTED: &str = "STARTED ";

fn schedule(job: &str) -> Schedule {
    Schedule::every(job, PERIOD)
        .unwrap()
        .max_clock_skew(SKEW)
        .unwrap()
}

/// One replica, in a child process: runs the fleet driver's replica loop
/// over the slots its parent named, printing each slot it starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a child of the multi-process schedule tests"]
async fn schedule_replica_child() {
    use std::io::Write;
    use std::sync::Arc;

    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} not set"));
    let url = var("SCHED_URL");
    let offset: i64 = var("SCHED_OFFSET_MS").parse().unwrap();
    let first: u64 = var("SCHED_FIRST").parse().unwrap();
    let last: u64 = var("SCHED_LAST").parse().unwrap();
    let crash_at: Option<u64> = std::env::var("SCHED_CRASH_AT")
        .ok()
        .map(|v| v.parse().unwrap());
    let store: Arc<dyn alkstore::Store> = Arc::from(alkstore::open(&url).await.unwrap());
    let schedule =
        schedule(&var("SCHED_JOB")).clock(alkstore_contract_suite::fleet::shifted_clock(offset));
    let report: alkstore_contract_suite::fleet::Report = Arc::new(|slot| {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{STARTED}{slot}");
        let _ = out.flush();
    });
    let plan = alkstore_contract_suite::fleet::Plan {
        first,
        last,
        work: Duration::from_millis(20),
        late: Duration::from_millis(15),
    };
    // Dies inside its job: no release, no close, nothing after.
    let die: alkstore_contract_suite::fleet::Die = Arc::new(|| std::process::abort());
    let log = alkstore_contract_suite::fleet::replica(
        store.clone(),
        schedule,
        plan,
        crash_at,
        report,
        Some(die),
    )
    .await;
    assert!(!log.crashed, "a replica set to die returned instead");
    store.close().await.unwrap();
}

/// Runs one child per offset against `url`; slot → the children that
/// started it, and which children died.
fn run_children(
    url: &str,
    job: &str,
    offsets: &[i64],
    crash: &[Option<u64>],
    slots: u64,
) -> (u64, u64, BTreeMap<u64, Vec<usize>>, Vec<usize>) {
    // Far enough ahead for every child to start and connect.
    let first = schedule(job).slot_at(SystemTime::now()).index + 6;
    let last = first + slots - 1;
    let children: Vec<_> = offsets
        .iter()
        .enumerate()
        .map(|(i, offset)| {
            let mut command = Command::new(std::env::current_exe().unwrap());
            command
                .args([
                    "--exact",
                    "schedule_replica_child",
                    "--ignored",
                    "--nocapture",
                    "--quiet",
                ])
                .env("SCHED_URL", url)
                .env("SCHED_JOB", job)
                .env("SCHED_OFFSET_MS", offset.to_string())
                .env("SCHED_FIRST", first.to_string())
                .env("SCHED_LAST", last.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::null());
            if let Some(at) = crash.get(i).copied().flatten() {
                command.env("SCHED_CRASH_AT", (first + at).to_string());
            }
            command.spawn().expect("start a replica")
        })
        .collect();
    let mut runs: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    let mut died = Vec::new();
    for (i, mut child) in children.into_iter().enumerate() {
        let stdout = child.stdout.take().unwrap();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(slot) = line.strip_prefix(STARTED) {
                runs.entry(slot.trim().parse().unwrap())
                    .or_default()
                    .push(i);
            }
        }
        let status = child.wait().unwrap();
        // Died by a signal (its abort); a panic or error exit is a failure.
        if status.code().is_none() {
            died.push(i);
        } else {
            assert!(status.success(), "replica {i} failed: {status}");
        }
    }
    (first, last, runs, died)
}

/// Three healthy replicas in three processes, clocks 0, 50 and 100 ms
/// ahead (the bound is 100 ms), then the same with the replica furthest
/// ahead dying in its first run from the second slot on: each slot starts
/// exactly once.
fn each_slot_once_across_processes(url: &str) {
    let job = alkstore_testkit::unique_name("procs");
    let (first, last, runs, died) = run_children(url, &job, &[0, 50, 100], &[], 6);
    assert!(died.is_empty(), "healthy replicas died: {died:?}");
    for slot in first..=last {
        assert_eq!(
            runs.get(&slot).map(Vec::len),
            Some(1),
            "rule: each slot runs once across processes; slot {slot} was started by {:?} \
             (all: {runs:?})",
            runs.get(&slot)
        );
    }
    eprintln!("3 processes, slots {first}..={last}: {runs:?}");

    let job = alkstore_testkit::unique_name("crash");
    let (first, last, runs, died) =
        run_children(url, &job, &[0, 50, 100], &[None, None, Some(1)], 6);
    assert_eq!(
        died,
        [2],
        "the replica set to crash did not die in a run: {runs:?}"
    );
    for slot in first..=last {
        assert_eq!(
            runs.get(&slot).map(Vec::len),
            Some(1),
            "rule: a crashed run's slot is not run again, and every other slot runs once; \
             slot {slot} was started by {:?} (all: {runs:?})",
            runs.get(&slot)
        );
    }
    eprintln!("3 processes, one crashed, slots {first}..={last}: {runs:?}");
}

#[test]
fn sqlite_replicas_in_processes_run_each_slot_once() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("schedule.db").display());
    each_slot_once_across_processes(&url);
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_replicas_in_processes_run_each_slot_once() {
    let Some(server) = alkstore_testkit::pg::server() else {
        return;
    };
    let schema = alkstore_testkit::pg::unique_schema("schedule");
    let sep = if server.url.contains('?') { '&' } else { '?' };
    each_slot_once_across_processes(&format!("{}{sep}schema={schema}", server.url));
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let store = alkstore::postgres::PgStore::connect(&server.url, &schema)
            .await
            .unwrap();
        store.drop_schema().await.unwrap();
    });
}

#[cfg(feature = "mysql")]
#[test]
fn mysql_replicas_in_processes_run_each_slot_once() {
    let Some(server) = alkstore_testkit::mysql::server() else {
        return;
    };
    let database = alkstore_testkit::unique_name("schedule");
    each_slot_once_across_processes(&format!("{}/{database}", server.url));
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let store = alkstore::mysql::MySqlStore::connect(&server.url, &database)
            .await
            .unwrap();
        store.drop_database().await.unwrap();
    });
}
