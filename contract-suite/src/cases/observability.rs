//! Every operation in a `tracing` span that names it and records its outcome.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use alkstore_core::{Lock, Result, Store};
use tracing::Dispatch;
use tracing::field::{Field, Visit};
use tracing::instrument::WithSubscriber;
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::NoSubscriber;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{Layer, Registry};

const LONG: Duration = Duration::from_secs(30);

/// One span: its name and every field recorded on it, as text.
#[derive(Debug, Clone, Default)]
struct Seen {
    name: &'static str,
    fields: BTreeMap<&'static str, String>,
}

impl Seen {
    fn field(&self, field: &str) -> Option<&str> {
        self.fields.get(field).map(String::as_str)
    }
}

impl Visit for Seen {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.fields.insert(field.name(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        // `%value` fields arrive here too; their Debug is their Display.
        self.fields.insert(field.name(), format!("{value:?}"));
    }
}

/// Collects the `alkstore.*` spans in the order they open — the order of
/// the operations, which run one after another — with every field recorded
/// on them. Not in the order they close: tracing drops a span's last
/// reference when it will, which was once after the next two operations
/// had ended (seen under load).
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Vec<Seen>>>);

/// Where a span's record sits in [`Spans`].
struct At(usize);

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Spans {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let name = attrs.metadata().name();
        if !name.starts_with("alkstore.") {
            return;
        }
        let mut seen = Seen {
            name,
            ..Seen::default()
        };
        attrs.record(&mut seen);
        if let Some(span) = ctx.span(id) {
            let mut all = self.0.lock().unwrap();
            all.push(seen);
            span.extensions_mut().insert(At(all.len() - 1));
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id)
            && let Some(At(at)) = span.extensions().get::<At>()
        {
            values.record(&mut self.0.lock().unwrap()[*at]);
        }
    }
}

/// A span's name and the fields it must carry (`None`: must not carry).
type Expected = (&'static str, Vec<(&'static str, Option<String>)>);

/// What the span of an acquire of "traced" by `owner` must record for `result`.
fn acquired(op: &'static str, owner: &str, result: &Result<Option<Box<dyn Lock>>>) -> Expected {
    let (outcome, fence) = match result {
        Ok(Some(lock)) => ("granted", Some(lock.fence().to_string())),
        Ok(None) => ("held elsewhere", None),
        Err(_) => ("error", None),
    };
    (
        op,
        vec![
            ("name", Some("traced".to_owned())),
            ("owner", Some(owner.to_owned())),
            ("outcome", Some(outcome.to_owned())),
            ("fence", fence),
        ],
    )
}

/// What the span of a renew or release of owner a's grant `fence` must
/// record, for what the call answered.
fn ended(op: &'static str, fence: u64, answered: bool) -> Expected {
    let outcome = match (op, answered) {
        ("alkstore.renew", true) => "renewed",
        ("alkstore.release", true) => "released",
        _ => "lost",
    };
    (
        op,
        vec![
            ("name", Some("traced".to_owned())),
            ("owner", Some("a".to_owned())),
            ("fence", Some(fence.to_string())),
            ("outcome", Some(outcome.to_owned())),
        ],
    )
}

/// Every operation runs in its own `tracing` span (`alkstore.try_lock`,
/// `alkstore.lock`, `alkstore.renew`, `alkstore.release`, `alkstore.holder`,
/// `alkstore.purge_expired`, `alkstore.close`) that names the lock and owner
/// and records the outcome its call returned: granted with its fence, held
/// elsewhere, error, renewed, released, lost, held or free, the number
/// purged, and a waiting acquire's attempts. Each span is held against what
/// its own call answered, so the case asks nothing of the engine's grants.
pub async fn operations_are_traced_with_their_outcome(store: Arc<dyn Store>) {
    let spans = Spans::default();
    let subscriber = Dispatch::new(Registry::default().with(spans.clone()));
    // tracing caches each callsite's interest for the whole process, and
    // while one dispatcher is registered it asks only the registering
    // thread's: a test thread without a subscriber touching these callsites
    // first would silence them here for good (tokio-rs/tracing#3611). With
    // a second live dispatcher every registration asks all of them.
    let _second = Dispatch::new(NoSubscriber::default());
    tracing::callsite::rebuild_interest_cache();
    let expected: Vec<Expected> = async {
        let mut expected = Vec::new();
        let first = store.try_lock("traced", "a", LONG).await;
        expected.push(acquired("alkstore.try_lock", "a", &first));
        let refused = store.try_lock("traced", "b", LONG).await;
        expected.push(acquired("alkstore.try_lock", "b", &refused));
        let waited = store
            .lock("traced", "b", LONG, Duration::from_millis(50))
            .await;
        expected.push(acquired("alkstore.lock", "b", &waited));
        let bad = store.try_lock("traced", "", LONG).await;
        expected.push(acquired("alkstore.try_lock", "", &bad));
        let holder = store.holder("traced").await.expect("holder");
        let outcome = if holder.is_some() { "held" } else { "free" };
        expected.push((
            "alkstore.holder",
            vec![
                ("name", Some("traced".to_owned())),
                ("outcome", Some(outcome.to_owned())),
            ],
        ));
        // A second handle of the grant outlives the first's release: its
        // renew and release are answered `false`.
        let again = store.try_lock("traced", "a", LONG).await;
        expected.push(acquired("alkstore.try_lock", "a", &again));
        for lock in [first, again].into_iter().flatten().flatten() {
            let fence = lock.fence();
            let renewed = lock.renew(LONG).await.expect("renew");
            expected.push(ended("alkstore.renew", fence, renewed));
            let released = lock.release().await.expect("release");
            expected.push(ended("alkstore.release", fence, released));
        }
        let purged = store.purge_expired().await.expect("purge_expired");
        expected.push((
            "alkstore.purge_expired",
            vec![("purged", Some(purged.to_string()))],
        ));
        store.close().await.expect("close");
        expected.push(("alkstore.close", vec![]));
        expected
    }
    .with_subscriber(subscriber)
    .await;

    let seen: Vec<Seen> = std::mem::take(&mut *spans.0.lock().unwrap());
    let names: Vec<&str> = seen.iter().map(|s| s.name).collect();
    let wanted: Vec<&str> = expected.iter().map(|(op, _)| *op).collect();
    assert_eq!(
        names, wanted,
        "rule: every operation runs in its own alkstore.* span; saw spans {names:?}, expected {wanted:?}"
    );
    for (span, (op, fields)) in seen.iter().zip(&expected) {
        for (field, value) in fields {
            assert_eq!(
                span.field(field),
                value.as_deref(),
                "rule: the {op} span records its call's {field}; saw {span:?}, expected {field} = {value:?}"
            );
        }
    }
    let attempts = seen[2]
        .field("attempts")
        .and_then(|a| a.parse::<u64>().ok());
    assert!(
        attempts.is_some_and(|a| a >= 1),
        "rule: a waiting acquire's span counts its attempts; saw {:?}, expected at least 1",
        seen[2]
    );
}
