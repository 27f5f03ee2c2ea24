//! PostgreSQL run by Patroni (etcd as its store) behind HAProxy, as the
//! test harness builds it (`alkstore_testkit::patroni`): a switchover and a
//! crash of the leader under load. With `synchronous_mode_strict`, no
//! acknowledged grant is lost; after each promotion every fence is above
//! every fence acknowledged before (its owner asking again included); and
//! while HAProxy still routes to the old leader, the store's errors say the
//! server is a standby, never a raw SQL message. With asynchronous
//! replication, a grant whose release was lost comes back re-fenced.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use alkstore_core::doctor::{Promise, Verdict};
use alkstore_core::{Error, Store};
use alkstore_postgres::{DeploymentError, PgStore};
use alkstore_testkit::patroni::{Cluster, Replication};

const TTL: Duration = Duration::from_secs(120);

/// One cluster at a time in this process: each is nine processes or more,
/// and two starting at once on a small machine slow both.
static ONE_CLUSTER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
const WRITERS: usize = 4;
const NAMES_PER_WRITER: usize = 8;

/// What the writers were told.
#[derive(Default)]
struct Told {
    /// Per name, its live acknowledged grant: owner and fence (a release
    /// acknowledged removes it).
    held: BTreeMap<String, (String, u64)>,
    /// Every fence acknowledged, in the order the writers heard them.
    fences: Vec<u64>,
    grants: usize,
    /// Errors by kind: "standby", "raw" (a read-only or recovery error
    /// not named as a standby), "other".
    errors: BTreeMap<&'static str, Vec<String>>,
}

/// The kind of an error a writer saw.
fn kind(error: &Error) -> &'static str {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    let mut raw = false;
    while let Some(e) = source {
        if matches!(
            e.downcast_ref::<DeploymentError>(),
            Some(DeploymentError::Standby { .. })
        ) {
            return "standby";
        }
        if let Some(sqlx::Error::Database(db)) = e.downcast_ref::<sqlx::Error>() {
            raw |= matches!(db.code().as_deref(), Some("25006" | "55000"));
        }
        source = e.source();
    }
    if raw { "raw" } else { "other" }
}

/// Writers on `store` until `stop`: each grants its names in turn, and
/// releases every other grant, recording what it was told.
fn writers(
    store: Arc<dyn Store>,
    told: Arc<Mutex<Told>>,
    stop: Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..WRITERS)
        .map(|w| {
            let (store, told, stop) = (store.clone(), told.clone(), stop.clone());
            tokio::spawn(async move {
                let owner = alkstore_core::unique_owner(&format!("writer{w}")).unwrap();
                let mut turn = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let name = format!("w{w}-{}", turn % NAMES_PER_WRITER);
                    turn += 1;
                    match store.try_lock(&name, &owner, TTL).await {
                        Ok(Some(lock)) => {
                            let fence = lock.fence();
                            {
                                let mut told = told.lock().unwrap();
                                told.held.insert(name.clone(), (owner.clone(), fence));
                                told.fences.push(fence);
                                told.grants += 1;
                            }
                            if turn % 2 == 0 {
                                match lock.release().await {
                                    Ok(_) => {
                                        told.lock().unwrap().held.remove(&name);
                                    }
                                    Err(error) => {
                                        // Released or not: unknown, so
                                        // not counted as held.
                                        let mut told = told.lock().unwrap();
                                        told.held.remove(&name);
                                        told.errors
                                            .entry(kind(&error))
                                            .or_default()
                                            .push(format!("{error:?}"));
                                    }
                                }
                            }
                        }
                        Ok(None) => {}
                        Err(error) => {
                            let mut told = told.lock().unwrap();
                            told.errors
                                .entry(kind(&error))
                                .or_default()
                                .push(format!("{error:?}"));
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
        })
        .collect()
}

/// A fence's timeline: its high part (docs/engine-postgres.md, "Fencing":
/// timeline × 2^44 + a draw of the schema's sequence).
fn timeline(fence: u64) -> u64 {
    fence >> 44
}

/// After a promotion: every fence acknowledged on the new timeline is above
/// every one acknowledged on an older; every acknowledged live grant is
/// still there; its owner asking again keeps it when the new timeline
/// granted it, and otherwise gets a fence above every fence acknowledged
/// before the promotion; a free name's fence is above all.
async fn check_after_promotion(store: &dyn Store, told: &Told, round: &str) {
    assert!(told.grants > 20, "{round}: only {} grants", told.grants);
    assert_eq!(
        told.errors.get("raw"),
        None,
        "{round}: raw read-only errors"
    );
    let newest = told.fences.iter().copied().map(timeline).max().unwrap();
    let before = told
        .fences
        .iter()
        .copied()
        .filter(|&f| timeline(f) < newest);
    let (highest_before, lowest_after) = (
        before.max().expect("grants before the promotion"),
        told.fences
            .iter()
            .copied()
            .filter(|&f| timeline(f) == newest)
            .min(),
    );
    let lowest_after = lowest_after.expect("grants after the promotion");
    assert!(
        lowest_after > highest_before,
        "{round}: {lowest_after} after, {highest_before} before"
    );
    for (name, (owner, fence)) in &told.held {
        let holder = store.holder(name).await.unwrap();
        let holder = holder.unwrap_or_else(|| panic!("{round}: acknowledged grant {name} lost"));
        assert_eq!(
            (&holder.owner, holder.fence),
            (owner, *fence),
            "{round}: {name}"
        );
        let again = store
            .try_lock(name, owner, TTL)
            .await
            .unwrap()
            .expect("its own owner");
        if timeline(*fence) == newest {
            assert_eq!(again.fence(), *fence, "{round}: {name} kept");
        } else {
            assert!(
                again.fence() > highest_before,
                "{round}: {name} re-asked got {} below {highest_before}",
                again.fence(),
            );
        }
        again.release().await.unwrap();
    }
    let fresh = store
        .try_lock("fresh", "checker", TTL)
        .await
        .unwrap()
        .expect("free");
    assert!(
        fresh.fence() > *told.fences.iter().max().unwrap(),
        "{round}: fresh fence"
    );
    fresh.release().await.unwrap();
}

/// Polls `done` every 20 ms, for three minutes at most (a crashed leader
/// replaced while a second full test run loads the machine once took more
/// than one), then fails naming `what` and what `seen` tells of it.
async fn until(done: &dyn Fn() -> bool, what: &str, seen: &dyn Fn() -> String) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "waited three minutes for {what}: {}",
            seen()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn under_load(
    cluster: &Cluster,
    round: &str,
    promote: impl FnOnce() -> Result<(), String> + Send + 'static,
) -> Told {
    let store: Arc<dyn Store> = Arc::new(
        PgStore::connect(&cluster.url, &format!("patroni_{round}"))
            .await
            .unwrap(),
    );
    let told = Arc::new(Mutex::new(Told::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = writers(store.clone(), told.clone(), stop.clone());
    // Some grants on the old leader, the promotion, then some on the new
    // one (a synchronous leader grants once its standby is back).
    let granted = |fences: &dyn Fn(&[u64]) -> bool| {
        let told = told.clone();
        let ok = move || fences(&told.lock().unwrap().fences);
        ok()
    };
    // What the writers heard so far, should a wait run out.
    let seen = || {
        let told = told.lock().unwrap();
        let errors: Vec<String> = told
            .errors
            .iter()
            .map(|(kind, all)| {
                format!(
                    "{kind}: {} (last two {:?})",
                    all.len(),
                    all.iter().rev().take(2).collect::<Vec<_>>()
                )
            })
            .collect();
        // And what Patroni says of its members.
        let members = cluster
            .patronictl(&["list"])
            .unwrap_or_else(|e| format!("patronictl list failed: {e}"));
        format!(
            "{} grants, fences {:?}…, errors {errors:?}; members:\n{members}",
            told.grants,
            told.fences.iter().rev().take(3).collect::<Vec<_>>()
        )
    };
    until(&|| granted(&|f| f.len() >= 20), "grants before", &seen).await;
    let before = told
        .lock()
        .unwrap()
        .fences
        .iter()
        .copied()
        .map(timeline)
        .max()
        .unwrap();
    tokio::task::spawn_blocking(promote).await.unwrap().unwrap();
    until(
        &|| granted(&|f| f.iter().filter(|&&x| timeline(x) > before).count() >= 20),
        "grants after",
        &seen,
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    let told = std::mem::take(&mut *told.lock().unwrap());
    for (kind, errors) in &told.errors {
        let mut seen: Vec<&String> = errors.iter().collect();
        seen.dedup();
        eprintln!(
            "{round}: {kind} errors, e.g. {:?}",
            &seen[..seen.len().min(3)]
        );
    }
    check_after_promotion(store.as_ref(), &told, round).await;
    store.close().await.unwrap();
    told
}

/// Two switchovers under load, each to the synchronous standby (the second
/// may go back to the first leader, which rejoined as a standby).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switchovers_under_load_lose_no_grant_and_raise_every_fence() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(cluster) = Cluster::start(Replication::SynchronousStrict, 3) else {
        return;
    };
    let report = (alkstore_postgres::ENGINE.inspect)(&cluster.url)
        .await
        .unwrap();
    let failover = report.finding(Promise::NoGrantLostInAFailover).unwrap();
    assert_eq!(failover.verdict, Verdict::Kept, "{report:?}");
    let cluster = Arc::new(cluster);
    for round in ["there", "back"] {
        let leader = cluster.leader().expect("a leader");
        let to = cluster.synchronous_standby().unwrap_or_else(|| {
            panic!(
                "a synchronous standby: {:?}",
                cluster.query(
                    leader,
                    "SELECT application_name, sync_state FROM pg_stat_replication"
                )
            )
        });
        let c = cluster.clone();
        let told = under_load(&cluster, round, move || {
            c.switchover(to)?;
            c.until_new_leader(leader, Duration::from_secs(60))
                .map(drop)
        })
        .await;
        eprintln!(
            "{round}: {} grants, errors: {:?}",
            told.grants,
            told.errors
                .iter()
                .map(|(k, v)| (k, v.len()))
                .collect::<Vec<_>>()
        );
        cluster
            .until_streaming(true, Duration::from_secs(60))
            .unwrap();
    }
}

/// The leader dies (Patroni and PostgreSQL killed) under load; the
/// synchronous standby is promoted once the leader key expires, and the
/// third node becomes its synchronous standby (strict: grants wait for one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_under_load_loses_no_grant_and_raises_every_fence() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(cluster) = Cluster::start(Replication::SynchronousStrict, 3) else {
        return;
    };
    let cluster = Arc::new(cluster);
    let leader = cluster.leader().expect("a leader");
    let c = cluster.clone();
    let told = under_load(&cluster, "crash", move || {
        c.crash(leader)?;
        c.until_new_leader(leader, Duration::from_secs(90))
            .map(drop)
    })
    .await;
    eprintln!(
        "crash: {} grants, errors: {:?}",
        told.grants,
        told.errors
            .iter()
            .map(|(k, v)| (k, v.len()))
            .collect::<Vec<_>>()
    );
}

/// Asynchronous replication (Patroni's default) and a leader that dies
/// after its standby stopped receiving: what it acknowledged since is lost,
/// as asynchronous replication allows. Owner A's grants were replicated,
/// then A released them and B was granted them, on the leader alone. After
/// the promotion A's grants are back (its releases lost); A asking again
/// must get a fence above B's lost, acknowledged one, which a resource may
/// have seen, never A's old fence back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_asynchronous_crash_refences_every_revived_grant() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(cluster) = Cluster::start(Replication::Asynchronous, 2) else {
        return;
    };
    let cluster = Arc::new(cluster);
    let store = PgStore::connect(&cluster.url, "patroni_revived")
        .await
        .unwrap();
    let names: Vec<String> = (0..10).map(|i| format!("revived{i}")).collect();
    let mut first = BTreeMap::new();
    for name in &names {
        let lock = store.try_lock(name, "a", TTL).await.unwrap().expect("free");
        first.insert(name.clone(), lock);
    }
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || {
        c.until_replayed(Duration::from_secs(60))?;
        c.hold_replication(c.leader().ok_or("no leader")?)
    })
    .await
    .unwrap()
    .unwrap();
    let mut old_fences = BTreeMap::new();
    for (name, lock) in first {
        old_fences.insert(name, lock.fence());
        lock.release().await.unwrap();
    }
    let mut acknowledged = 0;
    for name in &names {
        let lock = store
            .try_lock(name, "b", TTL)
            .await
            .unwrap()
            .expect("released");
        acknowledged = acknowledged.max(lock.fence());
    }
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || {
        let leader = c.leader().ok_or("no leader")?;
        c.crash(leader)?;
        c.until_new_leader(leader, Duration::from_secs(90))
    })
    .await
    .unwrap()
    .unwrap();
    for name in &names {
        // The store's pool reconnects through HAProxy; its first attempts
        // may still meet the old leader's closed connections.
        let holder = loop {
            match store.holder(name).await {
                Ok(holder) => break holder,
                Err(error) => eprintln!("{name}: {error}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let holder = holder.expect("A's grant revived");
        assert_eq!(
            (holder.owner.as_str(), holder.fence),
            ("a", old_fences[name]),
            "{name}: the scenario needs A's replicated grant back"
        );
        let again = store
            .try_lock(name, "a", TTL)
            .await
            .unwrap()
            .expect("A's own");
        assert!(
            again.fence() > acknowledged,
            "{name}: A asked again and got {}, below B's acknowledged {acknowledged}",
            again.fence()
        );
        assert!(store.try_lock(name, "b", TTL).await.unwrap().is_none());
    }
    let fresh = store
        .try_lock("fresh", "checker", TTL)
        .await
        .unwrap()
        .expect("free");
    assert!(fresh.fence() > acknowledged);
    store.close().await.unwrap();
}

/// Patroni's `synchronous_mode` without `synchronous_mode_strict`: doctor
/// gives the failover promise up and says which setting to change, though
/// a synchronous standby is there now (Patroni drops it when it goes away).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_gives_up_on_synchronous_mode_without_strict() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(cluster) = Cluster::start(Replication::Synchronous, 2) else {
        return;
    };
    let report = (alkstore_postgres::ENGINE.inspect)(&cluster.url)
        .await
        .unwrap();
    let failover = report.finding(Promise::NoGrantLostInAFailover).unwrap();
    assert_eq!(failover.verdict, Verdict::GivenUp, "{report:?}");
    assert!(
        failover.because.contains("synchronous_mode_strict"),
        "{report:?}"
    );
    let patroni = report.setting("Patroni").unwrap();
    assert!(
        patroni.contains("synchronous_mode_strict = false"),
        "{report:?}"
    ); // The harness's own stop (the one its watchdog runs) leaves nothing.
    assert_eq!(cluster.stop(), Vec::<String>::new());
}
