//! Every operation in a `tracing` span that names it and records its outcome.

use std::sync::Arc;
use std::time::Duration;

use alkstore_core::{Lock, Result, Store};
use tracing::instrument::WithSubscriber;

use crate::spans::{Seen, collecting};

const LONG: Duration = Duration::from_secs(30);

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
    let (subscriber, spans, _second) = collecting();
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

    // The batch a renewal went in has a span of its own
    // (`alkstore.renew_batch`), not an operation's.
    let seen: Vec<Seen> = spans
        .take()
        .into_iter()
        .filter(|s| s.name != "alkstore.renew_batch")
        .collect();
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
