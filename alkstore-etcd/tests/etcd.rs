//! The etcd engine beyond the contract suite: bad URLs and unreachable
//! clusters answer a clear error in bounded time, a prefix holding other
//! keys is refused, and doctor reads the cluster.

use std::time::{Duration, Instant};

use alkstore_core::doctor::{Promise, Verdict};
use alkstore_core::{Error, Store};
use alkstore_etcd::{EtcdStore, ForeignPrefix, LeaseTooLong};

fn url(prefix: &str) -> Option<String> {
    let server = alkstore_testkit::etcd::server()?;
    Some(format!(
        "{}/{}",
        server.url,
        alkstore_testkit::unique_name(prefix)
    ))
}

#[tokio::test]
async fn an_unreachable_cluster_is_an_error_within_the_timeout() {
    // Nothing listens on a port just freed.
    let port = alkstore_testkit::process::free_port().unwrap();
    let asked = Instant::now();
    let opened = tokio::time::timeout(
        Duration::from_secs(30),
        EtcdStore::connect(&format!("etcd://127.0.0.1:{port}/x?timeout=1s")),
    )
    .await
    .expect("an answer, not a hang");
    let error = opened.expect_err("nothing to open");
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "answered after {:?}",
        asked.elapsed()
    );
    assert!(
        matches!(
            error,
            Error::Database {
                operation: "open",
                ..
            }
        ),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_prefix_holding_other_keys_is_refused() {
    let Some(url) = url("foreign") else { return };
    let store = EtcdStore::connect(&url).await.unwrap();
    let lock = store
        .try_lock("job", "a", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    // A prefix inside the store's: its keys are not an alkstore store's.
    let error = EtcdStore::connect(&format!("{url}/g")).await.unwrap_err();
    let foreign = error.find_source::<ForeignPrefix>();
    assert!(foreign.is_some(), "{error:?}");
    assert!(error.to_string().contains("open"), "{error}");
    // The store itself opens again, and is untouched.
    let again = EtcdStore::connect(&url).await.unwrap();
    assert_eq!(
        again.holder("job").await.unwrap().map(|h| h.fence),
        Some(lock.fence())
    );
    lock.release().await.unwrap();
    store.remove_store().await.unwrap();
}

#[tokio::test]
async fn bad_urls_open_nothing() {
    for bad in [
        "etcd://127.0.0.1/x",
        "etcd://user@127.0.0.1:2379/x",
        "etcd://user:secret@127.0.0.1/x",
        "etcd://127.0.0.1:2379/x?timeout=0s",
    ] {
        let error = EtcdStore::connect(bad).await.unwrap_err();
        let url = error.find_source::<alkstore_core::UrlError>();
        assert!(url.is_some(), "{bad}: {error:?}");
        assert!(!error.to_string().contains("secret"), "{error}");
    }
}

/// Whether etcd `version` is a 3.4 before 3.4.32 or a 3.5 before 3.5.14.
fn old_lease_bugs(version: &str) -> bool {
    let parts: Vec<u32> = version.split('.').filter_map(|p| p.parse().ok()).collect();
    matches!(parts.as_slice(), [3, 4, p] if *p < 32)
        || matches!(parts.as_slice(), [3, 5, p] if *p < 14)
}

/// doctor on the harness's three members: every promise kept, but for
/// exclusion on an etcd with the lease bugs of leader changes.
#[tokio::test]
async fn doctor_reads_the_members_and_judges_the_version() {
    let Some(url) = url("doctor") else { return };
    // Only the harness's own cluster is known to have three members.
    let ours = alkstore_testkit::etcd::server().is_some_and(|s| s.cluster.is_some());
    let report = (alkstore_etcd::ENGINE.inspect)(&url).await.unwrap();
    let setting = |name: &str| report.setting(name).unwrap_or_default().to_owned();
    assert_ne!(setting("leader"), "none", "{report:?}");
    assert!(setting("version").starts_with('3'), "{report:?}");
    if !ours {
        return;
    }
    assert_eq!(setting("members").split(", ").count(), 3, "{report:?}");
    // Each member asked for its own version.
    let versions: Vec<String> = setting("member versions")
        .split(", ")
        .map(str::to_owned)
        .collect();
    assert_eq!(versions.len(), 3, "{report:?}");
    assert!(
        versions.iter().all(|v| v.ends_with(&setting("version"))),
        "{report:?}"
    );
    for promise in Promise::ALL {
        let finding = report.finding(promise).unwrap();
        // Debian's etcd (3.4.23) has the lease bugs of leader changes.
        let expected = match (promise, old_lease_bugs(&setting("version"))) {
            (Promise::Exclusion, true) => Verdict::GivenUp,
            _ => Verdict::Kept,
        };
        assert_eq!(finding.verdict, expected, "{finding:?}");
        if expected == Verdict::GivenUp {
            assert!(finding.because.contains("3.4.32"), "{finding:?}");
        }
    }
    assert!(report.warnings.is_empty(), "{report:?}");
}

/// etcd's longest lease is 9,000,000,000 s: a grant asking more gets the
/// longest and its handle promises no more; a renewal asking more is
/// refused with `LeaseTooLong` before anything is sent, the lease left as
/// it was (a renewal of a length etcd grants still answers true).
#[tokio::test]
async fn a_ttl_past_etcds_longest_lease() {
    let Some(url) = url("longest") else { return };
    let store = EtcdStore::connect(&url).await.unwrap();
    let longest = Duration::from_secs(9_000_000_000);
    let asked = Instant::now();
    let lock = store
        .try_lock("job", "a", Duration::from_secs(20_000_000_000))
        .await
        .unwrap()
        .unwrap();
    assert!(lock.valid_until() <= asked + longest + Duration::from_secs(1));
    let holder = store.holder("job").await.unwrap().unwrap();
    assert!(holder.expires_in <= longest, "{holder:?}");
    let refused = lock.renew(Duration::from_secs(10_000_000_000)).await;
    let error = refused.expect_err("a renewal past the longest lease");
    let too_long = error.find_source::<LeaseTooLong>();
    assert_eq!(
        too_long,
        Some(&LeaseTooLong {
            asked: 10_000_000_000
        }),
        "{error:?}"
    );
    assert_eq!(
        store.holder("job").await.unwrap().map(|h| h.fence),
        Some(lock.fence())
    );
    assert!(lock.renew(Duration::from_secs(30)).await.unwrap());
    lock.release().await.unwrap();
    store.remove_store().await.unwrap();
    store.close().await.unwrap();
    assert!(store.shortest_lease().await.is_err(), "closed");
}

/// A ttl of no whole number of seconds is granted rounded up (others see
/// the name held that long), but its holder is promised only the ttl it
/// asked, counted from the ask: a lock, a permit and a reader, each asked
/// for 1.5 s, have `valid_until` at most 1.5 s after the call began, and
/// a renewal of 1.5 s at most 1.5 s after its batch could go (a renewal
/// waits at most a beat for its batch; a store's first goes at once).
#[tokio::test]
async fn a_holder_is_promised_the_ttl_asked_not_the_rounded_lease() {
    let Some(url) = url("rounded") else { return };
    let store = EtcdStore::connect(&url).await.unwrap();
    let ttl = Duration::from_millis(1500);
    let promised = |by: Instant, until: Instant, what: &str| {
        assert!(
            until <= by + ttl,
            "{what}: promised {:?} from the ask, asked {ttl:?}",
            until - by
        );
    };
    let asked = Instant::now();
    let lock = store.try_lock("lock", "a", ttl).await.unwrap().unwrap();
    promised(asked, lock.valid_until(), "a lock");
    let asked = Instant::now();
    let permit = store
        .try_acquire_permit("pool", 2, "a", ttl)
        .await
        .unwrap()
        .unwrap();
    promised(asked, permit.valid_until(), "a permit");
    let asked = Instant::now();
    let reader = store.try_read_lock("rw", "a", ttl).await.unwrap().unwrap();
    promised(asked, reader.valid_until(), "a reader");
    let asked = Instant::now();
    assert!(lock.renew(ttl).await.unwrap());
    // etcd's beat: two of the core's.
    promised(
        asked + 2 * alkstore_core::RENEWAL_BEAT,
        lock.valid_until(),
        "a renewal",
    );
    store.remove_store().await.unwrap();
}

/// A release in one store wakes a waiter in another, through the watch
/// (the waiter's own polls come at most every 250 ms): over five rounds,
/// each waiter waiting long enough for its back-off to reach that ceiling
/// first, the attempt that wins is woken by the release (its span says so)
/// in most rounds. (The contract's
/// `lock_woken_by_release` runs holder and waiter on one store, where the
/// store's own release wakes its waiters.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_in_one_store_wakes_a_waiter_in_another() {
    let Some(url) = url("wake") else { return };
    let holder = EtcdStore::connect(&url).await.unwrap();
    let waiter = std::sync::Arc::new(EtcdStore::connect(&url).await.unwrap());
    let ttl = Duration::from_secs(30);
    let mut handoffs = Vec::new();
    let (subscriber, spans, _second) = alkstore_contract_suite::spans::collecting();
    for round in 0..5 {
        let name = format!("wake{round}");
        let held = holder.try_lock(&name, "a", ttl).await.unwrap().unwrap();
        let waiting = {
            let (waiter, name) = (waiter.clone(), name.clone());
            let waiting = async move {
                let asked = Instant::now();
                let lock = waiter.lock(&name, "b", ttl, Duration::from_secs(20)).await;
                (asked, Instant::now(), lock.unwrap().expect("granted"))
            };
            tokio::spawn(alkstore_contract_suite::spans::collected(
                waiting,
                &subscriber,
            ))
        };
        tokio::time::sleep(alkstore_contract_suite::support::before_letting_go(round)).await;
        assert!(!waiting.is_finished(), "round {round}: granted while held");
        let released = Instant::now();
        assert!(held.release().await.unwrap());
        let (asked, granted, lock) = waiting.await.unwrap();
        assert!(
            released >= asked + Duration::from_millis(400),
            "round {round}: waited too little"
        );
        handoffs.push(alkstore_contract_suite::support::Handoff {
            took: granted - released,
            woken: alkstore_contract_suite::spans::woken_in(&spans.take(), "alkstore.lock"),
        });
        assert!(lock.release().await.unwrap());
    }
    alkstore_contract_suite::support::assert_woken(&handoffs, "a release in another store");
    holder.remove_store().await.unwrap();
}

/// Compaction drops old revisions of keys, never the revision counter:
/// after the cluster is compacted at the newest revision, a grant made
/// before renews, shows in a listing and releases, and every grant after
/// has a fence above every one before.
#[tokio::test]
async fn compaction_leaves_fences_rising_and_grants_whole() {
    let Some(url) = url("compacted") else { return };
    let Some(cluster) = alkstore_testkit::etcd::server().and_then(|s| s.cluster.as_ref()) else {
        eprintln!("compaction: ALKSTORE_ETCD_URL names a cluster this test will not compact");
        return;
    };
    let store = EtcdStore::connect(&url).await.unwrap();
    let ttl = Duration::from_secs(30);
    let held = store.try_lock("held", "a", ttl).await.unwrap().unwrap();
    let mut highest = held.fence();
    for i in 0..10 {
        let lock = store
            .try_lock(&format!("n{i}"), "a", ttl)
            .await
            .unwrap()
            .unwrap();
        highest = highest.max(lock.fence());
        assert!(lock.release().await.unwrap());
    }
    // A fresh prefix's fence base is 0: the newest fence is a revision.
    cluster
        .etcdctl(&["compact", &highest.to_string()])
        .expect("compact the cluster");
    // Compacted: a read at a revision before it is refused.
    let old_read = cluster.etcdctl(&["get", "x", &format!("--rev={}", highest - 1)]);
    assert!(
        old_read.as_ref().is_err_and(|e| e.contains("compacted")),
        "a read before the compaction: {old_read:?}"
    );
    assert!(held.renew(ttl).await.unwrap(), "a grant from before renews");
    let listed = store.list("", None, 100).await.unwrap();
    assert_eq!(
        listed.iter().map(|l| l.name.as_str()).collect::<Vec<_>>(),
        ["held"]
    );
    let after = store.try_lock("after", "b", ttl).await.unwrap().unwrap();
    assert!(after.fence() > highest, "{} after {highest}", after.fence());
    assert!(held.release().await.unwrap());
    assert!(after.release().await.unwrap());
    store.remove_store().await.unwrap();
}

/// Renewals asked for at once go to the cluster together: per batch
/// (`alkstore.renew_batch` spans) a keep-alive stream and a read-only
/// transaction checking the grants for every 100 grants, counted as the
/// store's calls — locks', permits', readers' and writers' alike, two
/// handles of one grant included; each handle gets its own answer: the
/// grants another store force-released answer `false`, the others `true`.
/// 150 locks, past etcd's 128 operations in one transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_asked_at_once_go_in_two_calls_and_each_is_answered_alone() {
    use alkstore_contract_suite::support::{
        assert_only_the_force_released_are_lost, renew_at_once, renewal_batch_handles,
    };
    let Some(url) = url("batch") else {
        return;
    };
    let store = EtcdStore::connect(&url).await.unwrap();
    let other = EtcdStore::connect(&url).await.unwrap();
    let raw = alkstore_etcd::raw::Raw::of(&store);
    let owner = alkstore_core::unique_owner("renewer").unwrap();
    let ttl = Duration::from_secs(30);
    let name = |i: usize| format!("n{i}'\\\"é");
    let locks = renewal_batch_handles(&store, 150, name, &owner, ttl).await;
    let renew_all = || renew_at_once(&locks, ttl);
    let before = raw.calls_sent();
    let (answers, batches) = renew_all().await;
    assert!(answers.into_iter().all(|a| a.unwrap()));
    // A keep-alive stream per 100 leases and a read per 100 grants: the
    // twin's lease is kept alive once, so its batch may need one stream
    // fewer.
    let reads: usize = batches.iter().map(|size| size.div_ceil(100)).sum();
    let fewest: usize = batches.iter().map(|size| (size - 1).div_ceil(100)).sum();
    let sent = usize::try_from(raw.calls_sent() - before).unwrap();
    assert!(
        (reads + fewest..=2 * reads).contains(&sent),
        "{sent} calls for batches {batches:?}"
    );
    let released = [0, 10, 20, 30].map(name);
    assert_only_the_force_released_are_lost(&other, &locks, &released, ttl).await;
    for lock in locks {
        lock.let_lapse();
    }
    store.remove_store().await.unwrap();
}
