//! 10 000 held locks, each kept by a [`KeepAlive`]: the memory and CPU each
//! costs this process, when their renewals land (spread, not bunched), the
//! round trips they cost with renewals in batches and alone (the A/B of
//! issue 47, alternated), and 100 of them force-released mid-window by
//! another store: exactly those report their lease lost, and how soon
//! after their renewal is asked.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;

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

/// Locks force-released by another store mid-window.
const REVOKED: usize = 100;
/// When, into the window, they are force-released: each has a renewal
/// asked within a renewal interval (a third of `TTL`) after.
const REVOKE_AT: Duration = Duration::from_secs(7);

/// The renewals asked of the kept locks: which lock, when; and how many
/// answered `false`.
#[derive(Debug, Default)]
struct Asks {
    at: Mutex<Vec<(usize, Instant)>>,
    refused: AtomicU64,
}

/// A lock that notes when each renewal is asked, and a `false` answer.
#[derive(Debug)]
struct Noted {
    lock: Box<dyn Lock>,
    index: usize,
    asks: Arc<Asks>,
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
        self.asks
            .at
            .lock()
            .unwrap()
            .push((self.index, Instant::now()));
        let answer = self.lock.renew(ttl).await;
        if matches!(answer, Ok(false)) {
            self.asks.refused.fetch_add(1, Ordering::Relaxed);
        }
        answer
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
    /// Renewals asked per `BUCKET`, from the moment the last lock was taken.
    buckets: Vec<u64>,
    /// Round trips the renewals cost in the window: each renewal sent alone
    /// is one, a batch is one and a lost grant's renewal once more alone
    /// another (SQLite: transactions); on etcd, the calls the store sent.
    trips: u64,
    /// Batches sent in the window (`alkstore.renew_batch` spans): the
    /// round trips but for the lost grants' renewals alone (etcd: two
    /// calls each).
    batches: u64,
    /// Of the force-released locks, those whose keep-alive reported the
    /// lease lost.
    revoked_lost: usize,
    /// Keep-alives that reported their lease lost, not force-released.
    others_lost: usize,
    /// For each force-released lock that reported its loss: from its first
    /// renewal asked after the force release to the report, in ms.
    loss_ms: Vec<f64>,
}

impl Measured {
    fn to_json(&self) -> String {
        serde_json::json!({
            "memory": self.memory, "cpu_us": self.cpu_us,
            "buckets": self.buckets, "trips": self.trips, "batches": self.batches,
            "revoked_lost": self.revoked_lost, "others_lost": self.others_lost,
            "loss_ms": self.loss_ms,
        })
        .to_string()
    }

    fn from_json(bytes: &[u8]) -> Self {
        let value: serde_json::Value = serde_json::from_slice(bytes).expect("held-child's JSON");
        let number = |key: &str| value[key].as_u64().expect("a number");
        let list = |key: &str| value[key].as_array().expect("a list").clone();
        Measured {
            memory: number("memory"),
            cpu_us: number("cpu_us"),
            buckets: list("buckets")
                .iter()
                .map(|n| n.as_u64().expect("a count"))
                .collect(),
            trips: number("trips"),
            batches: number("batches"),
            revoked_lost: number("revoked_lost") as usize,
            others_lost: number("others_lost") as usize,
            loss_ms: list("loss_ms")
                .iter()
                .map(|n| n.as_f64().expect("ms"))
                .collect(),
        }
    }
}

/// Counts the `alkstore.renew_batch` spans opened: the process's only
/// subscriber, interested in nothing else.
struct BatchCounter(Arc<AtomicU64>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for BatchCounter {
    fn register_callsite(
        &self,
        metadata: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        if metadata.name() == "alkstore.renew_batch" {
            tracing::subscriber::Interest::always()
        } else {
            tracing::subscriber::Interest::never()
        }
    }

    fn enabled(
        &self,
        metadata: &tracing::Metadata<'_>,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        metadata.name() == "alkstore.renew_batch"
    }

    fn on_new_span(
        &self,
        _: &tracing::span::Attributes<'_>,
        _: &tracing::span::Id,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// Opens the store `engine` names at `location` (a file, a URL and a
/// schema or database after a space, or an etcd URL), its renewals in
/// batches or not; and, on etcd, the count of calls it sent.
async fn open(
    engine: &str,
    location: &str,
    batched: bool,
) -> (Arc<dyn Store>, Option<alkstore_etcd::raw::Raw>) {
    match (engine, location.split_once(' ')) {
        ("sqlite", _) => {
            let store = alkstore_sqlite::SqliteStore::open(location).await.unwrap();
            (Arc::new(store.renewals_in_batches(batched)), None)
        }
        ("postgres", Some((url, schema))) => {
            let store = alkstore_postgres::PgStore::connect(url, schema).await;
            (Arc::new(store.unwrap().renewals_in_batches(batched)), None)
        }
        ("mysql", Some((url, database))) => {
            let store = alkstore_mysql::MySqlStore::connect(url, database).await;
            (Arc::new(store.unwrap().renewals_in_batches(batched)), None)
        }
        ("etcd", None) => {
            let store = alkstore_etcd::EtcdStore::connect(location).await.unwrap();
            let store = store.renewals_in_batches(batched);
            let calls = alkstore_etcd::raw::Raw::of(&store);
            (Arc::new(store), Some(calls))
        }
        _ => panic!("held-child: no engine {engine:?} at {location:?}"),
    }
}

/// The child process: takes `HELD` locks on the store at `location`, keeps
/// each alive, watches for `WINDOW` (force-releasing `REVOKED` of them
/// from another store `REVOKE_AT` into it), releases them, and prints what
/// it measured as JSON. A process of its own, so that its memory and CPU
/// are the held locks' alone; `mode` is "batched" or "alone".
pub async fn child(engine: &str, location: &str, mode: &str) {
    use tracing_subscriber::layer::SubscriberExt;
    let batched = match mode {
        "batched" => true,
        "alone" => false,
        other => panic!("held-child: no mode {other:?}"),
    };
    let batches = Arc::new(AtomicU64::new(0));
    let counter = tracing_subscriber::registry().with(BatchCounter(batches.clone()));
    tracing::subscriber::set_global_default(counter).unwrap();
    let (store, calls) = open(engine, location, batched).await;
    let (other, _) = open(engine, location, true).await;
    let asks: Arc<Asks> = Arc::default();
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
            let (store, asks) = (store.clone(), asks.clone());
            tokio::spawn(async move {
                let mut kept = Vec::with_capacity(HELD / TAKERS + 1);
                for index in (t..HELD).step_by(TAKERS) {
                    let lock = store
                        .try_lock(&format!("kept-{index}"), "keeper", TTL)
                        .await
                        .unwrap()
                        .expect("a name of its own is free");
                    let noted = Noted {
                        lock,
                        index,
                        asks: asks.clone(),
                    };
                    kept.push((index, KeepAlive::start(Box::new(noted), TTL).unwrap()));
                }
                kept
            })
        })
        .collect();
    let mut kept = Vec::with_capacity(HELD);
    for taker in takers {
        kept.extend(taker.await.unwrap());
    }
    kept.sort_by_key(|(index, _)| *index);
    let kept: Vec<KeepAlive> = kept.into_iter().map(|(_, k)| k).collect();
    let started = Instant::now();
    let memory = resident_bytes().saturating_sub(memory_before);
    let cpu_before = cpu_time();
    let trips_so_far = || match &calls {
        Some(calls) => calls.calls_sent(),
        None if batched => batches.load(Ordering::Relaxed) + asks.refused.load(Ordering::Relaxed),
        None => asks.at.lock().unwrap().len() as u64,
    };
    let trips_before = trips_so_far();
    let revoked: Vec<usize> = (0..HELD).step_by(HELD / REVOKED).collect();
    // Each force-released lock's report of its loss, when it comes.
    let reports: Vec<_> = revoked
        .iter()
        .map(|&index| {
            let mut status = kept[index].watch();
            tokio::spawn(async move {
                let _ = status.wait_for(|s| matches!(s, LeaseStatus::Lost(_))).await;
                Instant::now()
            })
        })
        .collect();
    let batches_before = batches.load(Ordering::Relaxed);
    tokio::time::sleep(REVOKE_AT).await;
    let mut revoked_at = HashMap::new();
    for &index in &revoked {
        let fence = kept[index].lock().fence();
        let forced = other.force_release(&format!("kept-{index}")).await.unwrap();
        assert_eq!(
            forced.map(|h| h.fence),
            Some(fence),
            "kept-{index} was held"
        );
        revoked_at.insert(index, Instant::now());
    }
    tokio::time::sleep_until((started + WINDOW).into()).await;
    let cpu = cpu_time().saturating_sub(cpu_before);
    let trips = trips_so_far() - trips_before;
    let batches = batches.load(Ordering::Relaxed) - batches_before;
    let lost: Vec<usize> = (0..HELD)
        .filter(|&index| matches!(kept[index].status(), LeaseStatus::Lost(_)))
        .collect();
    let revoked_lost = lost.iter().filter(|i| revoked_at.contains_key(i)).count();
    let times = std::mem::take(&mut *asks.at.lock().unwrap());
    let mut loss_ms = Vec::new();
    for (&index, report) in revoked.iter().zip(reports) {
        if !report.is_finished() {
            report.abort();
            continue;
        }
        let reported = report.await.unwrap();
        let asked = times
            .iter()
            .filter(|(i, at)| *i == index && *at >= revoked_at[&index])
            .map(|(_, at)| *at)
            .min();
        if let Some(asked) = asked {
            loss_ms.push(reported.saturating_duration_since(asked).as_secs_f64() * 1e3);
        }
    }
    let mut buckets = vec![0u64; WINDOW.as_millis().div_ceil(BUCKET.as_millis()) as usize];
    for (_, at) in times.iter().filter(|(_, at)| *at >= started) {
        let k = ((*at - started).as_millis() / BUCKET.as_millis()) as usize;
        if let Some(bucket) = buckets.get_mut(k) {
            *bucket += 1;
        }
    }
    // 64 at a time: etcd answers "too many requests" to 10 000 at once.
    let released = futures::stream::iter(kept)
        .map(|k| async move { k.release().await })
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await;
    for release in released {
        release.unwrap();
    }
    store.close().await.unwrap();
    other.close().await.unwrap();
    let measured = Measured {
        memory,
        cpu_us: cpu.as_micros() as u64,
        buckets,
        trips,
        batches,
        revoked_lost,
        others_lost: lost.len() - revoked_lost,
        loss_ms,
    };
    println!("{}", measured.to_json());
}

/// Child runs of each mode, alternated (batched, alone, batched, alone).
const ROUNDS: usize = 2;

/// One [`child`] run on the store `engine` names at `location`.
async fn child_run(engine: &str, location: &str, mode: &str) -> Measured {
    eprintln!(
        "bench: {engine} {HELD} held locks with keep-alives ({mode}), watched for {WINDOW:?}"
    );
    let out = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args(["held-child", engine, location, mode])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "held-child failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Measured::from_json(&out.stdout)
}

/// The middle value (the mean of the two middle ones for an even count).
fn middle(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => values[n / 2],
        _ => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// Runs [`child`] on the store `engine` names at `location`, renewals in
/// batches and alone in turn, and adds its rows (medians of each mode):
/// memory and CPU per held lock, renewals per second (mean, and the
/// busiest second, which should stay near the mean), round trips per
/// second in batches next to alone, the force-released leases reported
/// lost and how soon, and no other lease lost. Returns the renewals per
/// `BUCKET` of the first batched run, for the plot.
pub async fn run(engine: &'static str, location: &str, rows: &mut Vec<Row>) -> Vec<u64> {
    let mut batched = Vec::new();
    let mut alone = Vec::new();
    for _ in 0..ROUNDS {
        batched.push(child_run(engine, location, "batched").await);
        alone.push(child_run(engine, location, "alone").await);
    }
    let per_sec = (Duration::from_secs(1).as_millis() / BUCKET.as_millis()) as usize;
    let of = |runs: &[Measured], figure: &dyn Fn(&Measured) -> f64| {
        middle(runs.iter().map(figure).collect())
    };
    let busiest = |m: &Measured| {
        m.buckets
            .windows(per_sec)
            .map(|w| w.iter().sum::<u64>())
            .max()
            .unwrap_or(0) as f64
    };
    let window = WINDOW.as_secs_f64();
    let asked = |m: &Measured| m.buckets.iter().sum::<u64>() as f64 / window;
    let mean = Row::rate(
        engine,
        format!("{HELD} kept locks: renewals per second, mean"),
        of(&batched, &asked),
    );
    // Spread, not bunched: the busiest second's renewals within 2× the
    // mean second's (a count, so its ratio is value ÷ floor).
    let busiest = Row {
        value: of(&batched, &busiest),
        unit: "",
        ..Row::rate(
            engine,
            format!("{HELD} kept locks: renewals in the busiest second"),
            0.0,
        )
    }
    .against(&mean, Some(2.0));
    // Round trips are counted, not rated: lower is better, its ratio
    // value ÷ floor.
    let trips = |runs: &[Measured], how: &str| Row {
        value: of(runs, &|m| m.trips as f64 / window),
        unit: "rt/s",
        ..Row::rate(
            engine,
            format!("{HELD} kept locks: renewal round trips/s, {how}"),
            0.0,
        )
    };
    let alone_trips = trips(&alone, "alone");
    let batched_trips = trips(&batched, "in batches").against(&alone_trips, None);
    let batches = Row {
        value: of(&batched, &|m| m.batches as f64 / window),
        unit: "n/s",
        ..Row::rate(engine, format!("{HELD} kept locks: batches/s"), 0.0)
    };
    let count = |figure: String, value: f64| Row {
        value,
        unit: "",
        ..Row::rate(engine, figure, 0.0)
    };
    let mut loss_rows = Vec::new();
    for (runs, how) in [(&batched, "in batches"), (&alone, "alone")] {
        let all: Vec<f64> = runs.iter().flat_map(|m| m.loss_ms.clone()).collect();
        let worst = all.iter().copied().fold(0.0, f64::max);
        loss_rows.extend([
            count(
                format!("{REVOKED} force-released: reported lost, {how}"),
                of(runs, &|m| m.revoked_lost as f64),
            ),
            count(
                format!("others reported lost (0), {how}"),
                of(runs, &|m| m.others_lost as f64),
            ),
            Row::time(
                engine,
                format!("loss reported after its renewal's ask p50, {how}"),
                Duration::from_secs_f64(middle(all) / 1e3),
            ),
            Row::time(
                engine,
                format!("loss reported after its renewal's ask max, {how}"),
                Duration::from_secs_f64(worst / 1e3),
            ),
        ]);
    }
    rows.extend([
        Row {
            value: of(&batched, &|m| m.memory as f64) / HELD as f64,
            unit: "B",
            ..Row::rate(engine, format!("{HELD} kept locks: memory per lock"), 0.0)
        },
        Row::time(
            engine,
            format!("{HELD} kept locks: CPU per lock per second"),
            Duration::from_secs_f64(of(&batched, &|m| m.cpu_us as f64) / 1e6)
                .div_f64(HELD as f64 * window),
        ),
        mean,
        busiest,
        alone_trips,
        batched_trips,
        batches,
    ]);
    rows.extend(loss_rows);
    batched.swap_remove(0).buckets
}
