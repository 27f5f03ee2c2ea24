//! `cargo xtask soak [minutes]`: a mixed workload per engine, looking for
//! what unit tests miss. 48 tasks over 8 independent stores on 12 names,
//! mixing `try_lock`, `lock`, renewals, releases, leases left to lapse,
//! dropped handles, `KeepAlive` with leases short enough to be lost,
//! `purge_expired`, `holder` and futures cancelled at random points; a
//! side task opens 8 stores on a new file, schema or prefix at once every
//! 5 s. The engines: SQLite, PostgreSQL and etcd (testkit's servers).
//!
//! It reports, per engine: operations, grants, errors, failed opens, the
//! history checker's verdict per name (no two holders at once, fences in
//! commit order), how long a lease outlived `KeepAlive`'s `lost()` signal,
//! and how far `lock(wait)` overran its wait. It fails (exit 1) on any
//! error, failed open or violation, or a lease that outlived its loss
//! signal by more than `OUTLIVED_BOUND`.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use alkstore_contract_suite::safety::Rng;
use alkstore_contract_suite::safety::history::{Interval, check};
use alkstore_core::{KeepAlive, LeaseStatus, Lock, LostReason, Store, unique_owner};
use alkstore_etcd::EtcdStore;
use alkstore_postgres::PgStore;
use alkstore_sqlite::SqliteStore;

const STORES: usize = 8;
const TASKS: usize = 48;
const NAMES: u64 = 12;
/// The documented bound: after `lost()` reports a lease not renewed in
/// time, the name is free within this. The keep-alive sends the release at
/// once; under this load (48 tasks and 16 stores' worth of work on 2 cores)
/// that release, and the `holder` polls that see it, take up to a few
/// hundred milliseconds. Without the release, a renewal landing late kept
/// the name for up to one more ttl.
const OUTLIVED_BOUND: Duration = Duration::from_secs(1);

type Opened = Pin<Box<dyn Future<Output = alkstore_core::Result<Arc<dyn Store>>> + Send>>;
/// Opens a store on target `n` (0: the soak's own; others: open rounds).
type Opener = Arc<dyn Fn(u64) -> Opened + Send + Sync>;

/// What one engine's soak saw.
#[derive(Default)]
struct Tally {
    ops: AtomicU64,
    grants: AtomicU64,
    errors: AtomicU64,
    first_errors: Mutex<Vec<String>>,
    opens: AtomicU64,
    failed_opens: AtomicU64,
    not_renewed: AtomicU64,
    revoked: AtomicU64,
    outlived: Mutex<Vec<Duration>>,
    overshoot: Mutex<Vec<Duration>>,
    histories: Mutex<HashMap<String, Vec<Interval>>>,
}

impl Tally {
    fn error(&self, what: &str, error: &dyn std::fmt::Debug) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first_errors.lock().unwrap();
        if first.len() < 10 {
            first.push(format!("{what}: {error:?}"));
        }
    }

    fn record(&self, name: &str, interval: Interval) {
        self.grants.fetch_add(1, Ordering::Relaxed);
        self.histories
            .lock()
            .unwrap()
            .entry(name.to_owned())
            .or_default()
            .push(interval);
    }
}

fn interval(lock: &dyn Lock, requested: Instant, start: Instant, end: Instant) -> Interval {
    Interval {
        owner: lock.owner().to_owned(),
        fence: lock.fence(),
        requested,
        start,
        end: end.min(lock.valid_until()),
        released: None,
    }
}

/// One task's loop until `until`.
async fn work(store: Arc<dyn Store>, tally: Arc<Tally>, seed: u64, until: Instant) {
    let mut rng = Rng::new(seed);
    while Instant::now() < until {
        tally.ops.fetch_add(1, Ordering::Relaxed);
        let name = format!("soak-{}", rng.below(NAMES));
        let roll = rng.below(100);
        if roll < 60 {
            acquire_and_hold(&*store, &tally, &mut rng, &name).await;
        } else if roll < 80 {
            keep(&*store, &tally, &mut rng, &name).await;
        } else if roll < 85 {
            if let Err(e) = store.purge_expired().await {
                tally.error("purge_expired", &e);
            }
        } else if let Err(e) = store.holder(&name).await {
            tally.error("holder", &e);
        }
    }
}

async fn acquire_and_hold(store: &dyn Store, tally: &Tally, rng: &mut Rng, name: &str) {
    let owner = unique_owner("soak").unwrap();
    let ttl = Duration::from_millis(50 + rng.below(400));
    let requested = Instant::now();
    let waiting = rng.below(2) == 0;
    let wait = Duration::from_millis(rng.below(200));
    let attempt = async {
        if waiting {
            store.lock(name, &owner, ttl, wait).await
        } else {
            store.try_lock(name, &owner, ttl).await
        }
    };
    // One in ten is cancelled at a random point.
    let got = if rng.below(10) == 0 {
        match tokio::time::timeout(Duration::from_micros(rng.below(3000)), attempt).await {
            Ok(got) => got,
            Err(_) => return,
        }
    } else {
        attempt.await
    };
    let lock = match got {
        Ok(Some(lock)) => lock,
        Ok(None) => {
            if waiting {
                let overran = requested.elapsed().saturating_sub(wait);
                tally.overshoot.lock().unwrap().push(overran);
            }
            return;
        }
        Err(e) => return tally.error("acquire", &e),
    };
    let start = Instant::now();
    tokio::time::sleep(Duration::from_millis(rng.below(30))).await;
    match rng.below(20) {
        // Renew, then release.
        0..=2 => {
            if let Err(e) = lock.renew(ttl).await {
                tally.error("renew", &e);
            }
        }
        // A renewal cancelled at a random point.
        3 | 4 => {
            let _ =
                tokio::time::timeout(Duration::from_micros(rng.below(2000)), lock.renew(ttl)).await;
        }
        // Dropped: the lease lapses.
        5 | 6 => {
            let end = lock.valid_until();
            tally.record(name, interval(&*lock, requested, start, end));
            return;
        }
        // Paused past the lease, then released (likely `false`).
        7 => tokio::time::sleep(ttl + Duration::from_millis(10)).await,
        _ => {}
    }
    let mut record = interval(&*lock, requested, start, Instant::now());
    match lock.release().await {
        Ok(_) => record.released = Some(Instant::now()),
        Err(e) => tally.error("release", &e),
    }
    tally.record(name, record);
}

/// A kept lease, some with a ttl too short to be kept under this load.
async fn keep(store: &dyn Store, tally: &Tally, rng: &mut Rng, name: &str) {
    let owner = unique_owner("kept").unwrap();
    let ttl = [40, 150, 600][rng.below(3) as usize];
    let ttl = Duration::from_millis(ttl);
    let requested = Instant::now();
    let lock = match store.try_lock(name, &owner, ttl).await {
        Ok(Some(lock)) => lock,
        Ok(None) => return,
        Err(e) => return tally.error("try_lock", &e),
    };
    let start = Instant::now();
    let fence = lock.fence();
    let kept = match KeepAlive::start(lock, ttl) {
        Ok(kept) => kept,
        Err(e) => return tally.error("keep_alive", &e),
    };
    let hold = Duration::from_millis(200 + rng.below(1300));
    tokio::select! {
        reason = kept.lost() => {
            let lost_at = Instant::now();
            tally.record(name, interval(kept.lock(), requested, start, lost_at));
            match reason {
                LostReason::Revoked => {
                    tally.revoked.fetch_add(1, Ordering::Relaxed);
                }
                LostReason::NotRenewedInTime { .. } => {
                    tally.not_renewed.fetch_add(1, Ordering::Relaxed);
                    // How long the lease outlives the signal.
                    loop {
                        match store.holder(name).await {
                            Ok(Some(h)) if h.fence == fence => {}
                            Ok(_) => break,
                            Err(e) => return tally.error("holder", &e),
                        }
                        if lost_at.elapsed() > Duration::from_secs(5) {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                    tally.outlived.lock().unwrap().push(lost_at.elapsed());
                }
                _ => {}
            }
        }
        _ = tokio::time::sleep(hold) => {
            let end = match kept.status() {
                LeaseStatus::Held { valid_until } => valid_until.min(Instant::now()),
                LeaseStatus::Lost(_) => start,
            };
            let mut record = interval(kept.lock(), requested, start, end);
            match kept.release().await {
                Ok(_) => record.released = Some(Instant::now()),
                Err(e) => tally.error("keep_alive release", &e),
            }
            tally.record(name, record);
        }
    }
}

/// Every 5 s, opens 8 stores on a new target at once.
async fn open_rounds(open: Opener, tally: Arc<Tally>, until: Instant) {
    let mut round = 1;
    while Instant::now() < until {
        let opened = futures_join(STORES, |_| open(round)).await;
        for store in opened {
            tally.opens.fetch_add(1, Ordering::Relaxed);
            match store {
                Ok(store) => {
                    let _ = store.close().await;
                }
                Err(e) => {
                    tally.failed_opens.fetch_add(1, Ordering::Relaxed);
                    tally.error("open", &e);
                }
            }
        }
        round += 1;
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

/// Runs `n` futures made by `make` at once; their results in order.
async fn futures_join<T: Send + 'static>(
    n: usize,
    make: impl Fn(usize) -> Pin<Box<dyn Future<Output = T> + Send>>,
) -> Vec<T> {
    let tasks: Vec<_> = (0..n).map(|i| tokio::spawn(make(i))).collect();
    let mut out = Vec::with_capacity(n);
    for task in tasks {
        out.push(task.await.expect("an open task panicked"));
    }
    out
}

fn quantile(samples: &mut [Duration], q: f64) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    samples.sort();
    samples[((samples.len() - 1) as f64 * q).round() as usize]
}

/// Soaks one engine; true when it found nothing wrong.
async fn soak(engine: &str, open: Opener, length: Duration) -> bool {
    let tally = Arc::new(Tally::default());
    let stores = futures_join(STORES, |_| open(0)).await;
    let stores: Vec<Arc<dyn Store>> = stores
        .into_iter()
        .map(|s| s.expect("the soak's own stores open"))
        .collect();
    let until = Instant::now() + length;
    let seed = Rng::from_clock(engine).next_u64();
    let opener = tokio::spawn(open_rounds(open.clone(), tally.clone(), until));
    let workers: Vec<_> = (0..TASKS)
        .map(|t| {
            let store = stores[t % STORES].clone();
            tokio::spawn(work(
                store,
                tally.clone(),
                seed.wrapping_add(t as u64),
                until,
            ))
        })
        .collect();
    for worker in workers {
        worker.await.expect("a soak task panicked");
    }
    opener.await.expect("the open rounds panicked");
    for store in &stores {
        store.close().await.unwrap();
    }

    let histories = std::mem::take(&mut *tally.histories.lock().unwrap());
    let mut violations = Vec::new();
    for (name, history) in &histories {
        if let Err(v) = check(history) {
            violations.push(format!("{name}: {v:?}"));
        }
    }
    let mut outlived = std::mem::take(&mut *tally.outlived.lock().unwrap());
    let mut overshoot = std::mem::take(&mut *tally.overshoot.lock().unwrap());
    let worst_outlived = outlived.iter().max().copied().unwrap_or_default();
    println!("## {engine}: {:?}", length);
    println!(
        "ops {}, grants {}, errors {}, opens {} (failed {}), violations {}",
        tally.ops.load(Ordering::Relaxed),
        tally.grants.load(Ordering::Relaxed),
        tally.errors.load(Ordering::Relaxed),
        tally.opens.load(Ordering::Relaxed),
        tally.failed_opens.load(Ordering::Relaxed),
        violations.len()
    );
    println!(
        "keep-alive losses: not renewed in time {}, revoked {}; lease outlived lost(): p50 {:?}, p99 {:?}, max {:?} (bound {:?})",
        tally.not_renewed.load(Ordering::Relaxed),
        tally.revoked.load(Ordering::Relaxed),
        quantile(&mut outlived, 0.5),
        quantile(&mut outlived, 0.99),
        worst_outlived,
        OUTLIVED_BOUND
    );
    println!(
        "lock(wait) overran its wait ({} timeouts): p50 {:?}, p99 {:?}, max {:?}",
        overshoot.len(),
        quantile(&mut overshoot, 0.5),
        quantile(&mut overshoot, 0.99),
        overshoot.iter().max().copied().unwrap_or_default()
    );
    for line in tally.first_errors.lock().unwrap().iter().chain(&violations) {
        println!("  {line}");
    }
    tally.errors.load(Ordering::Relaxed) == 0
        && violations.is_empty()
        && worst_outlived <= OUTLIVED_BOUND
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let minutes = match std::env::args().nth(1) {
        None => 4.0,
        Some(arg) => match arg.parse::<f64>() {
            Ok(m) if m.is_finite() && m > 0.0 && m <= 24.0 * 60.0 => m,
            _ => {
                eprintln!(
                    "soak: minutes per engine must be a number above 0 (at most a day), got {arg:?}"
                );
                return std::process::ExitCode::from(2);
            }
        },
    };
    let length = Duration::from_secs_f64(minutes * 60.0);
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().to_owned();
    let sqlite: Opener = Arc::new(move |n| {
        let path = base.join(format!("soak-{n}.db"));
        Box::pin(async move {
            let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).await?);
            Ok(store)
        })
    });
    let mut ok = soak("sqlite", sqlite, length).await;
    match alkstore_testkit::pg::server() {
        Some(server) => {
            let url = server.url.clone();
            let prefix = alkstore_testkit::pg::unique_schema("soak");
            let schemas = Arc::new(Mutex::new(Vec::new()));
            let made = schemas.clone();
            let postgres: Opener = Arc::new(move |n| {
                let (url, schema) = (url.clone(), format!("{prefix}_{n}"));
                made.lock().unwrap().push(schema.clone());
                Box::pin(async move {
                    let store: Arc<dyn Store> = Arc::new(PgStore::connect(&url, &schema).await?);
                    Ok(store)
                })
            });
            ok &= soak("postgres", postgres, length).await;
            let mut dropped: Vec<String> = schemas.lock().unwrap().clone();
            dropped.sort();
            dropped.dedup();
            for schema in dropped {
                if let Ok(store) = PgStore::connect(&server.url, &schema).await {
                    let _ = store.drop_schema().await;
                    let _ = store.close().await;
                }
            }
        }
        None => {
            println!("postgres: SKIPPED (no server)");
            ok = false;
        }
    }
    // etcd with the soak's short leases unscaled: each is a whole second
    // on the server, while its holder counts only the ttl asked, so more
    // grants are refused and none is checked against more than it had.
    match alkstore_testkit::etcd::server() {
        Some(server) => {
            let base = format!("{}/{}", server.url, alkstore_testkit::unique_name("soak"));
            let made = Arc::new(Mutex::new(Vec::new()));
            let (url, opened) = (base.clone(), made.clone());
            let etcd: Opener = Arc::new(move |n| {
                let url = format!("{url}/{n}");
                opened.lock().unwrap().push(url.clone());
                Box::pin(async move {
                    let store: Arc<dyn Store> = Arc::new(EtcdStore::connect(&url).await?);
                    Ok(store)
                })
            });
            ok &= soak("etcd", etcd, length).await;
            let mut removed: Vec<String> = made.lock().unwrap().clone();
            removed.sort();
            removed.dedup();
            for url in removed {
                if let Ok(store) = EtcdStore::connect(&url).await {
                    let _ = store.remove_store().await;
                }
            }
        }
        None => {
            println!("etcd: SKIPPED (no cluster)");
            ok = false;
        }
    }
    if ok {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}
