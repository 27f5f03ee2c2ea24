//! Faults of a real three-member etcd cluster under load, each test on a
//! cluster of its own (testkit's `etcd::Cluster`): the leader killed, a
//! member paused and resumed, the whole cluster killed and restarted, the
//! cluster restored from a snapshot.
//! Writers on independent stores contend on 64 names. What must hold: no
//! acknowledged grant is lost, no name is granted while another owner's
//! acknowledged grant of it is live, fences rise per name in the order the
//! writers were told them and every fence after a fault is above every
//! fence acknowledged before it, and every call answers within the store's
//! timeout (5 s) plus a margin.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use alkstore_core::Store;
use alkstore_etcd::EtcdStore;
use alkstore_testkit::etcd::Cluster;

const TTL: Duration = Duration::from_secs(60);
const WRITERS: usize = 4;
const NAMES: usize = 64;
/// The longest one call may take: the store's 5 s timeout, and a margin
/// for a loaded machine.
const CALL_BOUND: Duration = Duration::from_secs(8);

/// One cluster at a time in this process (three etcd processes each).
static ONE_CLUSTER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A name's state as the writers were told it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Told {
    /// Granted to this owner with this fence, no release sent.
    Held(String, u64),
    /// A release of this grant was sent and not answered `true` (an error,
    /// or still in flight): it may have landed or not.
    Releasing(String, u64),
    /// A release of it answered `true`.
    Released,
}

#[derive(Debug, Default)]
struct Record {
    names: BTreeMap<String, Told>,
    /// Per name, every fence acknowledged, in the order told.
    fences: BTreeMap<String, Vec<u64>>,
    grants: usize,
    errors: Vec<String>,
    violations: Vec<String>,
    slowest: Duration,
}

impl Record {
    /// `owner` was told it holds `name` with `fence`: checks it against
    /// what was told before, and records it.
    fn told(&mut self, name: &str, owner: &str, fence: u64) {
        let current = self.names.get(name).cloned();
        if let Some(Told::Held(other, f)) = &current {
            if other != owner {
                self.violations.push(format!(
                    "{name} granted to {owner} (fence {fence}) while {other}'s acknowledged grant \
                     (fence {f}) was live"
                ));
            }
        }
        // Fences rise per name; the same one again only for the same live
        // grant (its owner asking again, its release not answered true).
        let same = (owner.to_owned(), fence);
        let again = matches!(
            &current,
            Some(Told::Held(o, f) | Told::Releasing(o, f)) if (o.clone(), *f) == same
        );
        if let Some(&last) = self.fences.get(name).and_then(|f| f.last()) {
            if fence < last || (fence == last && !again) {
                self.violations
                    .push(format!("{name}: fence {fence} told after {last}"));
            }
        }
        self.fences.entry(name.to_owned()).or_default().push(fence);
        self.names
            .insert(name.to_owned(), Told::Held(owner.to_owned(), fence));
        self.grants += 1;
    }

    fn highest_of(&self, name: &str) -> u64 {
        self.fences
            .get(name)
            .and_then(|f| f.iter().max().copied())
            .unwrap_or(0)
    }

    fn highest(&self) -> u64 {
        self.fences.values().flatten().copied().max().unwrap_or(0)
    }
}

fn writers(
    stores: &[Arc<EtcdStore>],
    record: Arc<Mutex<Record>>,
    stop: Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    stores
        .iter()
        .enumerate()
        .map(|(w, store)| {
            let (store, record, stop) = (store.clone(), record.clone(), stop.clone());
            tokio::spawn(async move {
                let owner = format!("writer{w}");
                // Every writer walks the names in the same order, so
                // that they contend for each name at once.
                let mut turn = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let name = format!("n{:02}", (turn / 2) % NAMES);
                    turn += 1;
                    let asked = Instant::now();
                    let answer = store.try_lock(&name, &owner, TTL).await;
                    let took = asked.elapsed();
                    let release = {
                        let mut r = record.lock().unwrap();
                        r.slowest = r.slowest.max(took);
                        match answer {
                            Ok(Some(lock)) => {
                                r.told(&name, &owner, lock.fence());
                                // Every other grant is released; the rest
                                // stay held (dropping a handle leaves its
                                // grant).
                                (turn % 4 == w % 4).then(|| {
                                    let releasing = Told::Releasing(owner.clone(), lock.fence());
                                    r.names.insert(name.clone(), releasing);
                                    lock
                                })
                            }
                            Ok(None) => None,
                            Err(error) => {
                                r.errors.push(format!("try_lock: {error}"));
                                None
                            }
                        }
                    };
                    if let Some(lock) = release {
                        let (asked, fence) = (Instant::now(), lock.fence());
                        let answer = lock.release().await;
                        let mut r = record.lock().unwrap();
                        r.slowest = r.slowest.max(asked.elapsed());
                        match answer {
                            // Unless another owner was told the name since.
                            Ok(true) => {
                                let ours = Told::Releasing(owner.clone(), fence);
                                if r.names.get(&name) == Some(&ours) {
                                    r.names.insert(name.clone(), Told::Released);
                                }
                            }
                            Ok(false) => r.errors.push(format!("release of {name}: false")),
                            Err(error) => r.errors.push(format!("release: {error}")),
                        }
                    }
                }
            })
        })
        .collect()
}

/// Polls until `record` holds `grants` grants, for a minute at most; the
/// failure says what the writers met.
async fn until(record: &Mutex<Record>, grants: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        {
            let r = record.lock().unwrap();
            if r.grants >= grants {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "waited a minute for {what}: {} grants, {} errors, the last {:?}",
                r.grants,
                r.errors.len(),
                &r.errors[r.errors.len().saturating_sub(3)..]
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs the writers on `cluster`, applies `fault` once 100 grants were
/// told, lets `recover` run once the fault's effect is in (the writers
/// still going), and checks the record and the store once 100 more grants
/// were told after it.
async fn under_load(
    cluster: Arc<Cluster>,
    what: &str,
    fault: impl FnOnce(&Cluster) + Send + 'static,
    recover: impl FnOnce(&Cluster) + Send + 'static,
) {
    let url = format!("{}/faults", cluster.url());
    let mut stores = Vec::new();
    for _ in 0..WRITERS {
        stores.push(Arc::new(
            EtcdStore::connect(&url).await.expect("open a store"),
        ));
    }
    let record = Arc::new(Mutex::new(Record::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = writers(&stores, record.clone(), stop.clone());
    until(&record, 100, "100 grants before the fault").await;
    let before = record.lock().unwrap().highest();
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || fault(&c))
        .await
        .unwrap();
    let at_fault = record.lock().unwrap().grants;
    until(&record, at_fault + 100, "100 grants after the fault").await;
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || recover(&c))
        .await
        .unwrap();
    let at_recovery = record.lock().unwrap().grants;
    until(&record, at_recovery + 50, "50 grants after the recovery").await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    let record = std::mem::take(&mut *record.lock().unwrap());
    eprintln!(
        "{what}: {} grants, slowest call {:?}, {} errors, e.g. {:?}",
        record.grants,
        record.slowest,
        record.errors.len(),
        &record.errors[..record.errors.len().min(3)]
    );
    assert_eq!(record.violations, Vec::<String>::new(), "{what}");
    assert!(
        record.slowest < CALL_BOUND,
        "{what}: a call took {:?}",
        record.slowest
    );
    // After the fault, every new grant's fence is above every fence
    // acknowledged before it.
    let after_fault: Vec<u64> = record
        .fences
        .values()
        .flat_map(|f| f.iter().copied())
        .filter(|&f| f > before)
        .collect();
    assert!(!after_fault.is_empty(), "{what}: no grant after the fault");
    // No acknowledged live grant lost, and no name held by someone else.
    let store = &stores[0];
    for (name, told) in &record.names {
        let holder = store.holder(name).await.unwrap();
        match told {
            Told::Held(owner, fence) => {
                let holder = holder.unwrap_or_else(|| panic!("{what}: acknowledged {name} lost"));
                assert_eq!(
                    (holder.owner.as_str(), holder.fence),
                    (owner.as_str(), *fence),
                    "{what}: {name}"
                );
            }
            // A release not answered true may have landed or not.
            Told::Releasing(..) => {}
            Told::Released => assert!(
                holder.is_none() || holder.is_some_and(|h| h.fence > record.highest_of(name)),
                "{what}: {name} released, still held"
            ),
        }
    }
    let fresh = store
        .try_lock("fresh", "checker", TTL)
        .await
        .unwrap()
        .expect("a free name");
    assert!(
        fresh.fence() > record.highest(),
        "{what}: a new grant's fence {} is not above the highest told, {}",
        fresh.fence(),
        record.highest()
    );
    fresh.release().await.unwrap();
    for store in stores {
        store.close().await.unwrap();
    }
}

/// A cluster of three of this test's own (one named by `ALKSTORE_ETCD_URL`
/// cannot be killed: the tests then say so and skip).
fn start() -> Option<Arc<Cluster>> {
    use alkstore_testkit::etcd::{REQUIRE_NAME, URL_VAR};
    if std::env::var(URL_VAR).is_ok_and(|url| !url.is_empty()) {
        eprintln!("faults: {URL_VAR} names a cluster these tests cannot kill; skipped");
        return None;
    }
    match Cluster::start(3) {
        Ok(cluster) => Some(Arc::new(cluster)),
        Err(why) => {
            alkstore_testkit::process::skip_or_fail(REQUIRE_NAME, &why, "install etcd-server");
            None
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_killed_under_load_loses_no_acknowledged_grant() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(cluster) = start() else { return };
    let killed = Arc::new(Mutex::new(None));
    let (k1, k2) = (killed.clone(), killed.clone());
    under_load(
        cluster,
        "leader killed",
        move |c| {
            let leader = c.leader().expect("a leader");
            c.kill(leader).unwrap();
            *k1.lock().unwrap() = Some(leader);
        },
        move |c| {
            let leader = k2.lock().unwrap().expect("killed");
            c.restart(leader).unwrap();
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_leader_resumed_under_load_loses_no_acknowledged_grant() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(cluster) = start() else { return };
    let paused = Arc::new(Mutex::new(None));
    let (p1, p2) = (paused.clone(), paused.clone());
    under_load(
        cluster,
        "leader paused",
        move |c| {
            let leader = c.leader().expect("a leader");
            c.pause(leader).unwrap();
            *p1.lock().unwrap() = Some(leader);
        },
        move |c| {
            let leader = p2.lock().unwrap().expect("paused");
            c.resume(leader).unwrap();
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_cluster_restarted_under_load_loses_no_acknowledged_grant() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(cluster) = start() else { return };
    under_load(
        cluster,
        "cluster restarted",
        |c| {
            for member in 0..c.members.len() {
                c.kill(member).unwrap();
            }
            for member in 0..c.members.len() {
                c.restart(member).unwrap();
            }
        },
        |_| {},
    )
    .await;
}

/// Both followers of three killed: the leader is left without a quorum.
/// Every call to it answers an error within the URL's timeout (2 s here)
/// and a margin, never a hang, and never a renewal's `true`: a leader
/// refreshes a lease by itself, so the renewal's check must be a
/// linearizable read (a transaction of compares alone is served from the
/// member's own state — as the first run of this test under load showed,
/// answering true). Once the members are back, the grant made before is
/// still there and the store grants again, with a higher fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_without_quorum_answers_errors_in_bounded_time() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(cluster) = start() else { return };
    let leader = cluster.leader().expect("a leader");
    let followers: Vec<usize> = (0..3).filter(|&m| m != leader).collect();
    // The leader alone in the URL: the calls go to it.
    let url = format!(
        "etcd://{}/quorum?timeout=2s",
        cluster.members[leader].client
    );
    let store = EtcdStore::connect(&url).await.unwrap();
    let held = store.try_lock("held", "a", TTL).await.unwrap().unwrap();
    let (c, dead) = (cluster.clone(), followers.clone());
    tokio::task::spawn_blocking(move || {
        for member in dead {
            c.kill(member).unwrap();
        }
    })
    .await
    .unwrap();
    // At once, before the leader notices it has lost its quorum.
    let bound = Duration::from_secs(2) + Duration::from_secs(3);
    let asked = Instant::now();
    let renewed = held.renew(TTL).await;
    assert!(renewed.is_err(), "renewed without a quorum: {renewed:?}");
    let granted = store.try_lock("other", "b", TTL).await;
    assert!(granted.is_err(), "granted without a quorum: {granted:?}");
    let read = store.holder("held").await;
    assert!(
        read.is_err(),
        "a linearizable read without a quorum: {read:?}"
    );
    assert!(
        asked.elapsed() < 3 * bound,
        "three calls took {:?}",
        asked.elapsed()
    );
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || {
        for member in followers {
            c.restart(member).unwrap();
        }
    })
    .await
    .unwrap();
    let back = Instant::now();
    let other = loop {
        match store.try_lock("other", "b", TTL).await {
            Ok(granted) => break granted.expect("free"),
            Err(error) => assert!(
                back.elapsed() < Duration::from_secs(60),
                "no grant a minute after the quorum came back: {error}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        store.holder("held").await.unwrap().map(|h| h.fence),
        Some(held.fence()),
        "the grant made before survives"
    );
    assert!(other.fence() > held.fence());
    assert!(held.renew(TTL).await.unwrap());
}

/// A restore from a snapshot takes the cluster's revision back to the
/// snapshot's, so the fences after it would start again below fences
/// acknowledged before the disaster; the runbook's raise
/// (`raise_fences`, docs/engine-etcd.md) must put every later fence above
/// them. A holds 8 names when the snapshot is taken; after it, A releases
/// them and B is granted each (acknowledged), and 24 more names are
/// granted; then every member dies and the cluster is restored from the
/// snapshot. A grant before the raise shows the hazard (its fence is not
/// above the acknowledged ones: the restore did take revisions back);
/// after the raise, A's revived grants and B's lost ones renew `false`,
/// A asking again gets fences above every acknowledged one, B is refused
/// while A holds, and a new name's fence is above them too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_from_a_snapshot_keeps_later_fences_above_once_raised() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(cluster) = start() else { return };
    let url = format!("{}/restored", cluster.url());
    let a = EtcdStore::connect(&url).await.unwrap();
    let b = EtcdStore::connect(&url).await.unwrap();
    let names: Vec<String> = (0..8).map(|i| format!("revived{i}")).collect();
    // Each grant twice: A's own asking again is a second handle of the
    // same grant, kept to renew once the grant is revived.
    let (mut released, mut revived) = (Vec::new(), Vec::new());
    for name in &names {
        released.push(a.try_lock(name, "a", TTL).await.unwrap().expect("free"));
        revived.push(a.try_lock(name, "a", TTL).await.unwrap().expect("A's own"));
    }
    let snapshot = cluster.dir.join("snapshot.db");
    let (c, path) = (cluster.clone(), snapshot.clone());
    tokio::task::spawn_blocking(move || c.snapshot(&path))
        .await
        .unwrap()
        .expect("save a snapshot");

    let mut acknowledged = 0;
    let mut lost = Vec::new();
    for (name, grant) in names.iter().zip(released) {
        assert!(grant.release().await.unwrap());
        let taken = b.try_lock(name, "b", TTL).await.unwrap().expect("released");
        acknowledged = acknowledged.max(taken.fence());
        lost.push(taken);
    }
    for i in 0..24 {
        let later = b.try_lock(&format!("later{i}"), "b", TTL).await.unwrap();
        acknowledged = acknowledged.max(later.expect("free").fence());
    }

    let (c, path) = (cluster.clone(), snapshot.clone());
    tokio::task::spawn_blocking(move || c.restore(&path))
        .await
        .unwrap()
        .expect("restore the cluster from the snapshot");
    let back = Instant::now();
    let probe = loop {
        match a.try_lock("probe", "p", TTL).await {
            Ok(granted) => break granted.expect("free"),
            Err(error) => assert!(
                back.elapsed() < Duration::from_secs(60),
                "no grant a minute after the restore: {error}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        probe.fence() <= acknowledged,
        "the restore did not take the revision back (fence {} after it, {acknowledged} \
         acknowledged before): this test no longer shows what the raise is for",
        probe.fence()
    );

    let lowest = a
        .raise_fences(alkstore_core::DEFAULT_FENCE_RAISE)
        .await
        .unwrap();
    // Above every fence of the lost history too, as long as fewer
    // revisions were lost than the raise's size.
    assert!(
        lowest > acknowledged,
        "the raise's lowest later fence {lowest} is not above the {acknowledged} acknowledged"
    );
    for (grant, taken) in revived.iter().zip(&lost) {
        assert!(
            !grant.renew(TTL).await.unwrap(),
            "{}: A's revived grant renewed after the raise",
            grant.name()
        );
        assert!(
            !taken.renew(TTL).await.unwrap(),
            "{}: B's grant, lost with the restore, renewed",
            taken.name()
        );
    }
    for name in &names {
        let again = a.try_lock(name, "a", TTL).await.unwrap().expect("A's own");
        assert!(
            again.fence() > acknowledged,
            "{name}: A asked again after the raise and got {}, not above the {acknowledged} \
             acknowledged before the restore",
            again.fence()
        );
        assert!(again.fence() >= lowest);
        assert!(
            b.try_lock(name, "b", TTL).await.unwrap().is_none(),
            "{name}: B granted while A holds it"
        );
    }
    let fresh = b.try_lock("fresh", "b", TTL).await.unwrap().expect("free");
    assert!(fresh.fence() >= lowest);
    assert!(
        !probe.renew(TTL).await.unwrap(),
        "the probe's grant renewed after the raise"
    );
}
