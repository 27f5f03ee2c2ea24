//! A fresh store per case, and the runner that tears it down whatever happens.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use alkstore_core::Store;

/// The longest one case may run before it counts as hung.
const CASE_TIMEOUT: Duration = Duration::from_secs(120);

type Cleanup = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A fresh, isolated, empty store for one case, and how to remove it after.
pub struct Fresh {
    /// The store under test.
    pub store: Arc<dyn Store>,
    cleanup: Option<Cleanup>,
}

impl Fresh {
    /// A store with nothing to clean up afterwards (in memory, or a temp file
    /// that removes itself).
    pub fn new(store: Arc<dyn Store>) -> Self {
        Fresh {
            store,
            cleanup: None,
        }
    }

    /// Runs `cleanup` after the case, whether it passed or failed (drop a
    /// schema, delete a file).
    pub fn with_cleanup(mut self, cleanup: impl Future<Output = ()> + Send + 'static) -> Self {
        self.cleanup = Some(Box::pin(cleanup));
        self
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
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime for the case");
    runtime.block_on(async {
        let Some(fresh) = fresh().await else {
            return;
        };
        let outcome = tokio::spawn(tokio::time::timeout(
            CASE_TIMEOUT,
            case(fresh.store.clone()),
        ))
        .await;
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
