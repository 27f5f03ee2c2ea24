//! The owner trap, caught where it happens: tasks of one process that share
//! one owner string get one grant twice, and the store says so in a
//! `tracing` warning — once per grant, and never for per-holder owners.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use alkstore_core::{Store, unique_owner};
use alkstore_sqlite::SqliteStore;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::{Layer, Registry};

const TTL: Duration = Duration::from_secs(30);

/// Counts warnings about a grant handed out twice, keeping their fields.
#[derive(Clone, Default)]
struct SharedGrantWarnings {
    count: Arc<AtomicUsize>,
    fields: Arc<Mutex<Vec<String>>>,
}

struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!("{}={:?} ", field.name(), value));
    }
}

impl<S: tracing::Subscriber> Layer<S> for SharedGrantWarnings {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if *event.metadata().level() != tracing::Level::WARN {
            return;
        }
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        if fields.0.contains("an owner string names one holder") {
            self.count.fetch_add(1, Ordering::SeqCst);
            self.fields.lock().unwrap().push(fields.0);
        }
    }
}

/// Runs `body` on a current-thread runtime with the counting layer as the
/// thread's subscriber (every event of the store's calls is emitted on it).
fn with_warnings<F: std::future::Future<Output = ()>>(
    body: impl FnOnce(Arc<SqliteStore>) -> F,
) -> SharedGrantWarnings {
    let warnings = SharedGrantWarnings::default();
    let _guard = tracing::subscriber::set_default(Registry::default().with(warnings.clone()));
    // Callsite interest is cached process-wide and, with one dispatcher
    // registered, taken from the registering thread's: a second live one
    // makes every registration ask all (tokio-rs/tracing#3611).
    let _second = tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default());
    tracing::callsite::rebuild_interest_cache();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let store = Arc::new(SqliteStore::open_in_memory().await.unwrap());
            body(store.clone()).await;
            store.close().await.unwrap();
        });
    warnings
}

/// Two tasks share the host's name as owner: the second gets the first
/// one's grant, and the store warns once, naming the lock.
#[test]
fn tasks_sharing_an_owner_string_are_warned_of_once() {
    let warnings = with_warnings(|store| async move {
        let first = store
            .try_lock("report", "host-a", TTL)
            .await
            .unwrap()
            .unwrap();
        let second = store
            .try_lock("report", "host-a", TTL)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(first.fence(), second.fence(), "one grant, twice");
        // A third time is the same grant: no second warning.
        let third = store
            .try_lock("report", "host-a", TTL)
            .await
            .unwrap()
            .unwrap();
        assert!(first.release().await.unwrap());
        drop((second, third));
    });
    assert_eq!(warnings.count.load(Ordering::SeqCst), 1);
    let fields = warnings.fields.lock().unwrap()[0].clone();
    assert!(
        fields.contains("name=report") && fields.contains("owner=host-a"),
        "{fields}"
    );
}

/// Per-holder owners: one holder wins, the other is refused, a later holder
/// takes over after the release; the same owner asking again after its
/// release gets a new grant. No warning in any of it.
#[test]
fn per_holder_owners_are_never_warned_of() {
    let warnings = with_warnings(|store| async move {
        let (a, b) = (unique_owner("a").unwrap(), unique_owner("b").unwrap());
        let first = store.try_lock("report", &a, TTL).await.unwrap().unwrap();
        assert!(store.try_lock("report", &b, TTL).await.unwrap().is_none());
        assert!(first.release().await.unwrap());
        let second = store.try_lock("report", &b, TTL).await.unwrap().unwrap();
        let second_fence = second.fence();
        assert!(second.release().await.unwrap());
        // The same owner again, with no handle of its grant left: a new grant.
        let again = store.try_lock("report", &b, TTL).await.unwrap().unwrap();
        assert!(again.fence() > second_fence);
        assert!(again.release().await.unwrap());
    });
    assert_eq!(warnings.count.load(Ordering::SeqCst), 0);
}
