//! A load for engines' fault tests: workers taking one lock in turns while
//! the test breaks the server underneath, every grant recorded for the
//! [history checker](crate::safety::history::check).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use alkstore_core::{Error, Store};
use tokio::sync::Mutex;

use crate::safety::history::Interval;

/// What a load run saw.
#[derive(Debug, Default)]
pub struct Load {
    /// Every grant, for the history checker.
    pub history: Mutex<Vec<Interval>>,
    /// Grants so far.
    pub grants: AtomicU64,
    /// Failed operations so far (each an `Error::Database`).
    pub errors: AtomicU64,
    /// The slowest lock call, in milliseconds.
    pub slowest_ms: AtomicU64,
    /// Set to stop the workers.
    pub stop: AtomicBool,
}

/// `workers` tasks taking the lock `loaded` in turns (500 ms leases, 300 ms
/// waits, held 2 ms) until `load.stop` is set; every operation must end
/// within 20 s and every error must be an `Error::Database` (the task
/// panics otherwise: join the handles to see it).
pub fn start_load(
    store: Arc<dyn Store>,
    workers: usize,
    load: Arc<Load>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..workers)
        .map(|w| {
            let (store, load) = (store.clone(), load.clone());
            tokio::spawn(async move {
                let owner = format!("worker-{w}");
                while !load.stop.load(Ordering::SeqCst) {
                    let began = Instant::now();
                    let attempt = tokio::time::timeout(
                        Duration::from_secs(20),
                        store.lock(
                            "loaded",
                            &owner,
                            Duration::from_millis(500),
                            Duration::from_millis(300),
                        ),
                    )
                    .await
                    .expect("an operation hung past 20 s");
                    load.slowest_ms
                        .fetch_max(began.elapsed().as_millis() as u64, Ordering::SeqCst);
                    match attempt {
                        Ok(Some(lock)) => {
                            let start = Instant::now();
                            tokio::time::sleep(Duration::from_millis(2)).await;
                            let end = Instant::now().min(lock.valid_until());
                            let fence = lock.fence();
                            load.grants.fetch_add(1, Ordering::SeqCst);
                            if let Err(error) = lock.release().await {
                                assert!(matches!(error, Error::Database { .. }), "{error:?}");
                                load.errors.fetch_add(1, Ordering::SeqCst);
                            }
                            load.history.lock().await.push(Interval {
                                owner: owner.clone(),
                                fence,
                                requested: began,
                                start,
                                end,
                                released: Some(Instant::now()),
                            });
                        }
                        Ok(None) => {}
                        Err(error) => {
                            assert!(matches!(error, Error::Database { .. }), "{error:?}");
                            load.errors.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                }
            })
        })
        .collect()
}

/// What a load saw through an outage ([`through_an_outage`]).
#[derive(Debug)]
pub struct Outage {
    /// Every grant of the run, for the history checker.
    pub history: Vec<Interval>,
    /// Grants before the server was stopped.
    pub grants_before: u64,
    /// Failed operations while it was down.
    pub errors_during: u64,
    /// Failed operations in all.
    pub errors: u64,
    /// The slowest lock call, in milliseconds.
    pub slowest_ms: u64,
    /// From the server's start to the 20th grant after it.
    pub recovered_after: Duration,
}

/// `workers` tasks of [`start_load`] on `store` for a second, then `stop`
/// (the server goes down), a second of outage, `start` (it comes back), and
/// the load again until 20 more grants — within 30 s, or the store did not
/// recover (a panic). The workers are stopped and joined (a worker's panic
/// fails the caller) before the figures come back.
pub async fn through_an_outage(
    store: Arc<dyn Store>,
    workers: usize,
    stop: impl std::future::Future<Output = ()>,
    start: impl std::future::Future<Output = ()>,
) -> Outage {
    let load = Arc::new(Load::default());
    let tasks = start_load(store, workers, load.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let grants_before = load.grants.load(Ordering::SeqCst);
    stop.await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let errors_during = load.errors.load(Ordering::SeqCst);
    start.await;
    let restarted = Instant::now();
    let grants_at_restart = load.grants.load(Ordering::SeqCst);
    while load.grants.load(Ordering::SeqCst) < grants_at_restart + 20 {
        assert!(
            restarted.elapsed() < Duration::from_secs(30),
            "the store did not recover"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let recovered_after = restarted.elapsed();
    load.stop.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await.expect("a worker panicked");
    }
    Outage {
        history: std::mem::take(&mut *load.history.lock().await),
        grants_before,
        errors_during,
        errors: load.errors.load(Ordering::SeqCst),
        slowest_ms: load.slowest_ms.load(Ordering::SeqCst),
        recovered_after,
    }
}

/// `workers` tasks of [`start_load`] on `store` while `kill` — called five
/// times, 300 ms apart — ends the store's server sessions (returning how many
/// it ended), and a [`KeepAlive`](alkstore_core::KeepAlive) holds the name
/// `kept` (900 ms leases) throughout. Then checks, panicking otherwise: the
/// kept lease was never lost and still has its fence, the history checker
/// finds nothing, and something was killed. Returns (sessions killed, grants
/// checked, failed operations).
pub async fn through_killed_sessions<K, KF>(
    store: Arc<dyn Store>,
    workers: usize,
    mut kill: K,
) -> (u64, usize, u64)
where
    K: FnMut() -> KF,
    KF: std::future::Future<Output = u64>,
{
    let ttl = Duration::from_millis(900);
    let kept_lock = store
        .try_lock("kept", "keeper", ttl)
        .await
        .expect("take the kept lock")
        .expect("the kept name is free");
    let kept_fence = kept_lock.fence();
    let kept = alkstore_core::KeepAlive::start(kept_lock, ttl).expect("keep the lease");
    let load = Arc::new(Load::default());
    let tasks = start_load(store.clone(), workers, load.clone());
    let mut killed = 0;
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        killed += kill().await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    load.stop.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await.expect("a worker panicked");
    }
    assert!(
        matches!(kept.status(), alkstore_core::LeaseStatus::Held { .. }),
        "kept lease lost: {:?}",
        kept.status()
    );
    let holder = store.holder("kept").await.expect("read the kept name");
    assert_eq!(holder.map(|h| h.fence), Some(kept_fence));
    let history = std::mem::take(&mut *load.history.lock().await);
    assert_eq!(crate::safety::history::check(&history), Ok(()));
    assert!(killed > 0, "no session was killed");
    assert!(kept.release().await.expect("release the kept lease"));
    (killed, history.len(), load.errors.load(Ordering::SeqCst))
}

/// An idle-session killer (a pooler, a firewall, the server's
/// `idle_session_timeout`), after DistributedLock's `TestIdleSessionKiller`:
/// a [`KeepAlive`](alkstore_core::KeepAlive) holds a 1 s lease while
/// `kill_idle(after)` ends every session of the store idle longer than
/// `after` (100 ms), every 50 ms for 3 s; the lease must survive (renewals
/// retry on new connections). Then, with the keep-alive stopped, every idle
/// session is ended once more and the holder releases: the release meets a
/// connection that died while idle, and must answer `true` like any other;
/// a forced release of a grant already gone, likewise after a kill, answers
/// `OutcomeUnknown`. Answers how many sessions were ended.
pub async fn through_an_idle_session_killer<K, KF>(store: &dyn Store, mut kill_idle: K) -> u64
where
    K: FnMut(Duration) -> KF,
    KF: std::future::Future<Output = u64>,
{
    let ttl = Duration::from_secs(1);
    let lock = store
        .try_lock("idle-killed", "keeper", ttl)
        .await
        .expect("take the lock")
        .expect("the name is free");
    let fence = lock.fence();
    let kept = alkstore_core::KeepAlive::start(lock, ttl).expect("keep the lease");
    let began = Instant::now();
    let mut killed = 0;
    while began.elapsed() < Duration::from_secs(3) {
        killed += kill_idle(Duration::from_millis(100)).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        killed >= 2,
        "rule: the killer ends idle sessions; saw {killed} ended, expected ≥ 2"
    );
    let lock = kept.stop().await.unwrap_or_else(|lost| {
        panic!("rule: a kept lease survives idle sessions being killed; saw it lost: {lost}")
    });
    let holder = store.holder("idle-killed").await.expect("read the holder");
    assert_eq!(
        holder.map(|h| h.fence),
        Some(fence),
        "rule: the kept grant is still the holder after the killer's run"
    );
    let last = kill_idle(Duration::ZERO).await;
    assert!(
        last >= 1,
        "rule: the store's connection sat idle to be killed; saw none"
    );
    let released = lock.release().await;
    assert!(
        matches!(released, Ok(true)),
        "rule: a release on a connection that died while idle answers true; saw {released:?}"
    );
    assert!(store.holder("idle-killed").await.expect("read").is_none());
    // A forced release of a grant already gone, on a connection that died
    // while idle: the second try finds nothing, and cannot tell whether the
    // first removed it — unknown, not a guessed "not there".
    let again = store
        .try_lock("idle-killed", "keeper", ttl)
        .await
        .expect("take the lock again")
        .expect("the name is free");
    let gone = again.fence();
    assert!(again.release().await.expect("release"));
    let more = kill_idle(Duration::ZERO).await;
    assert!(
        more >= 1,
        "rule: the store's connection sat idle to be killed; saw none"
    );
    let stale = store.force_release_grant("idle-killed", gone).await;
    assert!(
        stale
            .as_ref()
            .err()
            .and_then(|e| e.find_source::<alkstore_core::OutcomeUnknown>())
            .is_some(),
        "rule: a forced release that cannot confirm what a lost connection did answers \
         OutcomeUnknown; saw {stale:?}"
    );
    killed + last + more
}
