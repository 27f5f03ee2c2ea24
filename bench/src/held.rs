//! 10 000 held locks, each kept by a [`KeepAlive`]: the memory and CPU each
//! costs this process, and when their renewals land (spread, not bunched).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use alkstore_core::{KeepAlive, LeaseStatus, Lock, Result, Store};
use async_trait::async_trait;
use tokio::sync::Notify;

use crate::report::Row;

/// Locks held at once.
pub const HELD: usize = 10_000;
/// Their lease: renewed every 10 s (a third), by default.
const TTL: Duration = Duration::from_secs(30);
/// How long the renewals are watched: two renewal intervals and a bit.
const WINDOW: Duration = Duration::from_secs(21);
/// Renewals are counted per bucket of this length for the plot.
pub const BUCKET: Duration = Duration::from_millis(250);
/// Tasks taking the locks: as fast as the store grants, so that every lease
/// starts within a second or two of the others (the worst case for bunching).
const TAKERS: usize = 16;

/// A lock that notes when each renewal is sent.
#[derive(Debug)]
struct Noted {
    lock: Box<dyn Lock>,
    renewals: Arc<Mutex<Vec<Instant>>>,
}

#[async_trait]
impl Lock for Noted {
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
        self.lock.valid_until()
    }
    fn valid_until_lowered(&self) -> Option<Arc<Notify>> {
        self.lock.valid_until_lowered()
    }
    async fn renew(&self, ttl: Duration) -> Result<bool> {
        self.renewals.lock().unwrap().push(Instant::now());
        self.lock.renew(ttl).await
    }
    async fn release(self: Box<Self>) -> Result<bool> {
        self.lock.release().await
    }
    async fn release_shared(&self) -> Result<bool> {
        self.lock.release_shared().await
    }
}

/// This process's resident memory, in bytes (Linux; 0 elsewhere).
fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// CPU time this process has used, user and system (Linux; zero elsewhere).
fn cpu_time() -> Duration {
    let Some(stat) = std::fs::read_to_string("/proc/self/stat").ok() else {
        return Duration::ZERO;
    };
    // Fields after the command name (which may hold spaces), from field 3.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<u64> = after
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    // utime and stime are fields 14 and 15, in clock ticks (100 per second
    // on Linux).
    let ticks = fields.get(11).copied().unwrap_or(0) + fields.get(12).copied().unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

/// What the child process measured.
#[derive(Debug)]
struct Measured {
    /// Resident memory added by the held locks and their keep-alives.
    memory: u64,
    /// CPU the process used while watching.
    cpu_us: u64,
    /// Renewals per `BUCKET`, from the moment the last lock was taken.
    buckets: Vec<u64>,
    /// Keep-alives that reported their lease lost.
    lost: usize,
}

impl Measured {
    fn to_json(&self) -> String {
        serde_json::json!({
            "memory": self.memory, "cpu_us": self.cpu_us,
            "buckets": self.buckets, "lost": self.lost,
        })
        .to_string()
    }

    fn from_json(bytes: &[u8]) -> Self {
        let value: serde_json::Value = serde_json::from_slice(bytes).expect("held-child's JSON");
        let number = |key: &str| value[key].as_u64().expect("a number");
        Measured {
            memory: number("memory"),
            cpu_us: number("cpu_us"),
            buckets: value["buckets"]
                .as_array()
                .expect("buckets")
                .iter()
                .map(|n| n.as_u64().expect("a count"))
                .collect(),
            lost: number("lost") as usize,
        }
    }
}

/// Opens the store `engine` names at `location` (a file, or a URL and a
/// schema or database after a space).
async fn open(engine: &str, location: &str) -> Arc<dyn Store> {
    match (engine, location.split_once(' ')) {
        ("sqlite", _) => Arc::new(alkstore_sqlite::SqliteStore::open(location).await.unwrap()),
        ("postgres", Some((url, schema))) => Arc::new(
            alkstore_postgres::PgStore::connect(url, schema)
                .await
                .unwrap(),
        ),
        ("mysql", Some((url, database))) => Arc::new(
            alkstore_mysql::MySqlStore::connect(url, database)
                .await
                .unwrap(),
        ),
        _ => panic!("held-child: no engine {engine:?} at {location:?}"),
    }
}

/// The child process: takes `HELD` locks on the store at `location`, keeps
/// each alive, watches for `WINDOW`, releases them, and prints what it
/// measured as JSON. A process of its own, so that its memory and CPU are
/// the held locks' alone.
pub async fn child(engine: &str, location: &str) {
    let store = open(engine, location).await;
    let renewals: Arc<Mutex<Vec<Instant>>> = Arc::default();
    // One lock taken and released first: the store's connections and
    // statements are ready before the memory is read.
    let warm = store.try_lock("kept-warm", "keeper", TTL).await.unwrap();
    warm.expect("a name of its own is free")
        .release()
        .await
        .unwrap();
    let memory_before = resident_bytes();
    let takers: Vec<_> = (0..TAKERS)
        .map(|t| {
            let (store, renewals) = (store.clone(), renewals.clone());
            tokio::spawn(async move {
                let mut kept = Vec::with_capacity(HELD / TAKERS + 1);
                for i in (t..HELD).step_by(TAKERS) {
                    let lock = store
                        .try_lock(&format!("kept-{i}"), "keeper", TTL)
                        .await
                        .unwrap()
                        .expect("a name of its own is free");
                    let noted = Noted {
                        lock,
                        renewals: renewals.clone(),
                    };
                    kept.push(KeepAlive::start(Box::new(noted), TTL).unwrap());
                }
                kept
            })
        })
        .collect();
    let mut kept = Vec::with_capacity(HELD);
    for taker in takers {
        kept.extend(taker.await.unwrap());
    }
    let started = Instant::now();
    let memory = resident_bytes().saturating_sub(memory_before);
    let cpu_before = cpu_time();
    tokio::time::sleep(WINDOW).await;
    let cpu = cpu_time().saturating_sub(cpu_before);
    let lost = kept
        .iter()
        .filter(|k| matches!(k.status(), LeaseStatus::Lost(_)))
        .count();
    let times = std::mem::take(&mut *renewals.lock().unwrap());
    let mut buckets = vec![0u64; WINDOW.as_millis().div_ceil(BUCKET.as_millis()) as usize];
    for at in times.iter().filter(|at| **at >= started) {
        let k = ((*at - started).as_millis() / BUCKET.as_millis()) as usize;
        if let Some(bucket) = buckets.get_mut(k) {
            *bucket += 1;
        }
    }
    let releasers: Vec<_> = kept
        .into_iter()
        .map(|k| tokio::spawn(async move { k.release().await }))
        .collect();
    for releaser in releasers {
        releaser.await.unwrap().unwrap();
    }
    store.close().await.unwrap();
    let measured = Measured {
        memory,
        cpu_us: cpu.as_micros() as u64,
        buckets,
        lost,
    };
    println!("{}", measured.to_json());
}

/// Runs [`child`] on the store `engine` names at `location` and adds its
/// rows: memory and CPU per held lock, renewals per second (mean, and the
/// busiest second, which should stay near the mean), leases lost (0).
/// Returns the renewals per `BUCKET`, for the plot.
pub async fn run(engine: &'static str, location: &str, rows: &mut Vec<Row>) -> Vec<u64> {
    eprintln!("bench: {engine} {HELD} held locks with keep-alives, watched for {WINDOW:?}");
    let out = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args(["held-child", engine, location])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "held-child failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let measured = Measured::from_json(&out.stdout);
    let per_sec = (Duration::from_secs(1).as_millis() / BUCKET.as_millis()) as usize;
    let busiest = measured
        .buckets
        .windows(per_sec)
        .map(|w| w.iter().sum::<u64>())
        .max()
        .unwrap_or(0);
    let counted: u64 = measured.buckets.iter().sum();
    let mean = Row::rate(
        engine,
        format!("{HELD} kept locks: renewals per second, mean"),
        counted as f64 / WINDOW.as_secs_f64(),
    );
    // Spread, not bunched: the busiest second's renewals within 2× the
    // mean second's (a count, so its ratio is value ÷ floor).
    let busiest = Row {
        value: busiest as f64,
        unit: "",
        ..Row::rate(
            engine,
            format!("{HELD} kept locks: renewals in the busiest second"),
            0.0,
        )
    }
    .against(&mean, Some(2.0));
    rows.extend([
        Row {
            value: measured.memory as f64 / HELD as f64,
            unit: "B",
            ..Row::rate(engine, format!("{HELD} kept locks: memory per lock"), 0.0)
        },
        Row::time(
            engine,
            format!("{HELD} kept locks: CPU per lock per second"),
            Duration::from_micros(measured.cpu_us).div_f64(HELD as f64 * WINDOW.as_secs_f64()),
        ),
        mean,
        busiest,
        Row {
            value: measured.lost as f64,
            unit: "",
            ..Row::rate(engine, format!("{HELD} kept locks: leases lost"), 0.0)
        },
    ]);
    measured.buckets
}
