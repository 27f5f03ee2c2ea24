//! A fresh store per case, and the runner that tears it down whatever happens.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use alkstore_core::Store;

/// The longest one case may run before it counts as hung.
const CASE_TIMEOUT: Duration = Duration::from_secs(120);

type Cleanup = Pin<Box<dyn Future<Output = ()> + Send>>;
type Opener = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Arc<dyn Store>> + Send>> + Send + Sync>;

/// A fresh, isolated, empty store for one case, and how to remove it after.
pub struct Fresh {
    /// The store under test.
    pub store: Arc<dyn Store>,
    cleanup: Option<Cleanup>,
    opener: Option<Opener>,
    opt_outs: Vec<(&'static str, String)>,
    clock: crate::LeaseClock,
}

impl Fresh {
    /// A store with nothing to clean up afterwards (in memory, or a temp file
    /// that removes itself).
    pub fn new(store: Arc<dyn Store>) -> Self {
        Fresh {
            store,
            cleanup: None,
            opener: None,
            opt_outs: Vec::new(),
            clock: crate::LeaseClock::MILLISECONDS,
        }
    }

    /// Declares how the engine's leases keep time (the default:
    /// [`LeaseClock::MILLISECONDS`](crate::LeaseClock::MILLISECONDS)): the
    /// cases scale their short leases and waits to it ([`crate::clock`]).
    /// One clock per test process: every fixture of the process declares
    /// the same.
    pub fn with_lease_clock(mut self, clock: crate::LeaseClock) -> Self {
        self.clock = clock;
        self
    }

    /// Skips the case named `case` on this engine, for `why` (an engine
    /// without a capability the case needs). Only by name — give it as
    /// [`case!`](crate::case)`(name)`, which the compiler checks — and
    /// visibly: the test prints `OPTED OUT: <case>: <why>` and `cargo xtask
    /// contract` shows `opt-out` in the engine's column.
    ///
    /// # Panics
    /// When no contract case has that name (a name not given through
    /// `case!`).
    pub fn opting_out(mut self, case: &'static str, why: impl Into<String>) -> Self {
        assert!(
            crate::list::all().iter().any(|c| c.name == case),
            "no contract case is named {case:?}"
        );
        self.opt_outs.push((case, why.into()));
        self
    }

    /// Opts out of every fair-waiting case (`waiters_are_granted_in_arrival_order`
    /// and the others of `alkstore_core::queue`'s rules) for `why`: for an
    /// engine that does not queue its waiters
    /// ([`Engine::queues`](alkstore_core::Engine::queues) is `false`), on
    /// which the first attempt to land after a release wins.
    pub fn without_queues(mut self, why: &str) -> Self {
        for case in crate::FAIR_WAITING_CASES {
            self = self.opting_out(case, why);
        }
        self
    }

    /// Runs `cleanup` after the case, whether it passed or failed (drop a
    /// schema, delete a file).
    pub fn with_cleanup(mut self, cleanup: impl Future<Output = ()> + Send + 'static) -> Self {
        self.cleanup = Some(Box::pin(cleanup));
        self
    }

    /// How to open another, independent store on the same storage (its own
    /// connections, as another process would have): the cases that race
    /// independent stores call it. Without it they race clones of one store,
    /// which can hide races between connections, and say so.
    pub fn with_peers<F, Fut>(mut self, open: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Arc<dyn Store>> + Send + 'static,
    {
        self.opener = Some(Arc::new(move || Box::pin(open())));
        self
    }
}

/// The store under test and its independent peers, for the cases that race
/// several stores on one storage.
pub struct Stores {
    /// The store under test.
    pub store: Arc<dyn Store>,
    opener: Option<Opener>,
    opened: Arc<Mutex<Vec<Arc<dyn Store>>>>,
}

impl Stores {
    /// `n` stores on the storage of the store under test, each independent
    /// (the store under test is the first). The runner closes them after the
    /// case. Without an opener ([`Fresh::with_peers`]) every one is the store
    /// under test itself.
    pub async fn open(&self, n: usize) -> Vec<Arc<dyn Store>> {
        let mut stores = vec![self.store.clone()];
        let Some(open) = &self.opener else {
            eprintln!(
                "note: the engine's fixture opens no peers (Fresh::with_peers); \
                 racing {n} clones of one store"
            );
            stores.resize(n.max(1), self.store.clone());
            return stores;
        };
        for _ in 1..n {
            let peer = open().await;
            self.opened.lock().unwrap().push(peer.clone());
            stores.push(peer);
        }
        stores
    }
}

/// Runs one case on a fresh store from `fresh`, on a runtime of its own, then
/// cleans up; a failing case fails the calling test with its own message.
///
/// `fresh` returning `None` means the engine is unavailable: the test returns
/// without running (the fixture says why).
pub fn run<F, FFut, C, CFut>(fresh: F, case: C)
where
    F: FnOnce() -> FFut,
    FFut: Future<Output = Option<Fresh>>,
    C: FnOnce(Arc<dyn Store>) -> CFut,
    CFut: Future<Output = ()> + Send + 'static,
{
    run_with_peers(fresh, |stores: Stores| case(stores.store));
}

/// As [`run`], for a case that takes [`Stores`] (the store under test and
/// its independent peers); the peers it opened are closed after it.
pub fn run_with_peers<F, FFut, C, CFut>(fresh: F, case: C)
where
    F: FnOnce() -> FFut,
    FFut: Future<Output = Option<Fresh>>,
    C: FnOnce(Stores) -> CFut,
    CFut: Future<Output = ()> + Send + 'static,
{
    run_named(None, fresh, case);
}

/// Runs the contract case `case` as [`run`] does, unless the engine's
/// fixture opted out of it by name ([`Fresh::opting_out`]).
pub fn run_case<F, FFut>(fresh: F, case: crate::Case)
where
    F: FnOnce() -> FFut,
    FFut: Future<Output = Option<Fresh>>,
{
    match case.run {
        crate::CaseFn::Single(f) => run_named(Some(case.name), fresh, move |s: Stores| f(s.store)),
        crate::CaseFn::Peers(f) => run_named(Some(case.name), fresh, f),
    }
}

fn run_named<F, FFut, C, CFut>(name: Option<&str>, fresh: F, case: C)
where
    F: FnOnce() -> FFut,
    FFut: Future<Output = Option<Fresh>>,
    C: FnOnce(Stores) -> CFut,
    CFut: Future<Output = ()> + Send + 'static,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime for the case");
    runtime.block_on(async {
        let Some(fresh) = fresh().await else {
            return;
        };
        crate::clock::declare(fresh.clock);
        if let Some((case, why)) = fresh.opt_outs.iter().find(|(case, _)| Some(*case) == name) {
            say_past_the_capture(&format!("OPTED OUT: {case}: {why}"));
            let _ = fresh.store.close().await;
            if let Some(cleanup) = fresh.cleanup {
                cleanup.await;
            }
            return;
        }
        let opened = Arc::new(Mutex::new(Vec::new()));
        let stores = Stores {
            store: fresh.store.clone(),
            opener: fresh.opener,
            opened: opened.clone(),
        };
        let outcome = tokio::spawn(tokio::time::timeout(CASE_TIMEOUT, case(stores))).await;
        let peers = std::mem::take(&mut *opened.lock().unwrap());
        for peer in peers {
            let _ = peer.close().await;
        }
        let _ = fresh.store.close().await;
        if let Some(cleanup) = fresh.cleanup {
            cleanup.await;
        }
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(_)) => panic!("the case did not finish within {CASE_TIMEOUT:?}"),
            Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
            Err(join) => panic!("the case was cancelled: {join}"),
        }
    });
}

/// Runs `case` as [`run`] does and says how it ended instead of failing the
/// caller: `Err` holds the case's panic message. For runners that expect
/// some cases to fail (the gallery of broken engines).
pub fn verdict<F, FFut>(fresh: F, case: crate::Case) -> Result<(), String>
where
    F: FnOnce() -> FFut,
    FFut: Future<Output = Option<Fresh>>,
{
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match case.run {
        crate::CaseFn::Single(f) => run(fresh, f),
        crate::CaseFn::Peers(f) => run_with_peers(fresh, f),
    }));
    ran.map_err(|payload| {
        payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "a panic without a message".to_owned())
    })
}

/// Writes `line` to the process's standard error past the test harness's
/// output capture (through /dev/stderr), so that a plain `cargo test` shows
/// it and `cargo xtask contract` finds it in a recorded run's output.
fn say_past_the_capture(line: &str) {
    use std::io::Write;
    let direct = std::fs::OpenOptions::new()
        .append(true)
        .open("/dev/stderr")
        // One write, line and newline: lines of tests running at once
        // never interleave.
        .and_then(|mut stderr| stderr.write_all(format!("{line}\n").as_bytes()));
    if direct.is_err() {
        eprintln!("{line}");
    }
}
