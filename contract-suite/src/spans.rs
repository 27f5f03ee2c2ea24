//! The `alkstore.*` tracing spans of a store's calls, collected: what the
//! observability case checks, and how the wake-up cases learn whether a
//! release woke a waiter (its span's `woken`) rather than its poll.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tracing::Dispatch;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::NoSubscriber;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{Layer, Registry};

/// One span: its name and every field recorded on it, as text.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// The span's name (`alkstore.lock`, …).
    pub name: &'static str,
    fields: BTreeMap<&'static str, String>,
}

impl Seen {
    /// The value recorded for `field`, as text.
    pub fn field(&self, field: &str) -> Option<&str> {
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
pub struct Spans(Arc<Mutex<Vec<Seen>>>);

impl Spans {
    /// The spans collected so far, taken out.
    pub fn take(&self) -> Vec<Seen> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

/// A dispatcher that collects `alkstore.*` spans into the [`Spans`] it
/// answers, and a second dispatcher to hold for as long as it is used.
/// tracing caches each callsite's interest for the whole process, and
/// while one dispatcher is registered it asks only the registering
/// thread's: a test thread without a subscriber touching these callsites
/// first would silence them here for good (tokio-rs/tracing#3611). With a
/// second live dispatcher every registration asks all of them.
pub fn collecting() -> (Dispatch, Spans, Dispatch) {
    let spans = Spans::default();
    let subscriber = Dispatch::new(Registry::default().with(spans.clone()));
    let second = Dispatch::new(NoSubscriber::default());
    tracing::callsite::rebuild_interest_cache();
    (subscriber, spans, second)
}

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

/// Whether the last `op` span among `spans` (a waiting call's:
/// `alkstore.lock`, `alkstore.acquire_permit`, …) says a release woke the
/// attempt that won, not its poll.
pub fn woken_in(spans: &[Seen], op: &str) -> bool {
    spans
        .iter()
        .rev()
        .find(|s| s.name == op)
        .and_then(|s| s.field("woken"))
        == Some("true")
}

/// The sizes of the renewal batches among `spans` (their
/// `alkstore.renew_batch` spans), in the order they were sent.
pub fn renewal_batches(spans: &[Seen]) -> Vec<usize> {
    spans
        .iter()
        .filter(|s| s.name == "alkstore.renew_batch")
        .filter_map(|s| s.field("size")?.parse().ok())
        .collect()
}

/// `future`, its spans collected by `subscriber` (from [`collecting`]),
/// wherever it runs (a task spawned with it too).
pub fn collected<F: std::future::Future>(
    future: F,
    subscriber: &Dispatch,
) -> tracing::instrument::WithDispatch<F> {
    tracing::instrument::WithSubscriber::with_subscriber(future, subscriber.clone())
}
