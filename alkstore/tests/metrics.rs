//! The `metrics` feature: every operation counts its outcome with bounded
//! labels, read back through a test recorder. One test per binary: the
//! recorder is process-wide.
#![cfg(all(feature = "metrics", feature = "sqlite"))]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use alkstore::{KeepAlive, LostReason, Store};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

const TTL: Duration = Duration::from_secs(30);

/// A metric as `name{label=value,…}`, labels sorted.
fn key(name: &str, labels: &[(&str, &str)]) -> String {
    let mut labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    labels.sort();
    format!("{name}{{{}}}", labels.join(","))
}

/// What was recorded, summed over snapshots (a snapshot drains what it
/// reads): counters by `name{labels}`, and how many values each histogram got.
#[derive(Debug, Default)]
struct Recorded {
    counters: HashMap<String, u64>,
    histograms: HashMap<String, usize>,
}

impl Recorded {
    fn take(&mut self, snapshotter: &Snapshotter) {
        for (composite, _, _, value) in snapshotter.snapshot().into_vec() {
            let (_, k) = composite.into_parts();
            let labels: Vec<(&str, &str)> = k.labels().map(|l| (l.key(), l.value())).collect();
            for (_, value) in &labels {
                assert!(
                    !value.contains("secret"),
                    "a label holds a lock name or owner: {k:?}"
                );
            }
            let name = key(k.name(), &labels);
            match value {
                DebugValue::Counter(n) => *self.counters.entry(name).or_default() += n,
                DebugValue::Histogram(values) => {
                    *self.histograms.entry(name).or_default() += values.len()
                }
                DebugValue::Gauge(_) => {}
            }
        }
    }

    fn counted(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.counters.get(&key(name, labels)).copied().unwrap_or(0)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_are_counted_with_bounded_labels() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();

    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("metrics.db").display());
    let store: Arc<dyn Store> = alkstore::open(&url).await.unwrap().into();

    let a = store
        .try_lock("secret-name", "secret-owner", TTL)
        .await
        .unwrap()
        .unwrap();
    assert!(
        store
            .try_lock("secret-name", "b", TTL)
            .await
            .unwrap()
            .is_none()
    );
    assert!(store.try_lock("", "b", TTL).await.is_err());
    assert!(a.renew(TTL).await.unwrap());
    assert!(a.renew(TTL).await.unwrap());
    // A waiter woken by the release: one handoff. Released only once the
    // waiter's fifth attempt was refused: its wake-up is armed, and its naps
    // have grown to 32 ms, so the release lands in a nap (or an attempt),
    // not in the microseconds between a nap's end and the next arming — a
    // release there is found by the next attempt, which is no handoff (seen
    // once after the first refusal, when the nap was 2 ms).
    let waiter = {
        let store = store.clone();
        tokio::spawn(async move { store.lock("secret-name", "c", TTL, TTL).await })
    };
    let mut recorded = Recorded::default();
    loop {
        recorded.take(&snapshotter);
        if recorded.counted(
            "alkstore_lock_refused_attempts_total",
            &[("engine", "sqlite")],
        ) >= 5
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(a.release().await.unwrap());
    let c = waiter.await.unwrap().unwrap().unwrap();
    // A lock whose wait runs out.
    assert!(
        store
            .lock("secret-name", "d", TTL, Duration::from_millis(20))
            .await
            .unwrap()
            .is_none()
    );
    // Forced: the keep-alive of c hears of it; c's renew and release answer false.
    let kept = KeepAlive::start(c, Duration::from_millis(600)).unwrap();
    assert!(store.force_release("secret-name").await.unwrap().is_some());
    assert_eq!(kept.lost().await, LostReason::Revoked);
    assert!(!kept.release().await.unwrap());
    assert!(store.force_release("secret-name").await.unwrap().is_none());
    // A semaphore's permits, under their own operations.
    let permit = store.try_acquire_permit("secret-pool", 1, "secret-owner", TTL);
    let permit = permit.await.unwrap().unwrap();
    let refused = store.try_acquire_permit("secret-pool", 1, "b", TTL).await;
    assert!(refused.unwrap().is_none());
    let mismatch = store.try_acquire_permit("secret-pool", 2, "b", TTL).await;
    assert!(mismatch.is_err());
    let wait = Duration::from_millis(20);
    let timed_out = store.acquire_permit("secret-pool", 1, "d", TTL, wait).await;
    assert!(timed_out.unwrap().is_none());
    assert!(store.force_release("secret-pool").await.is_err());
    assert!(permit.release().await.unwrap());
    // A reader-writer lock's grants, under their own operations.
    let reader = store.try_read_lock("secret-rw", "secret-owner", TTL);
    let reader = reader.await.unwrap().unwrap();
    assert!(
        store
            .try_write_lock("secret-rw", "w", TTL)
            .await
            .unwrap()
            .is_none()
    );
    let timed_out = store.write_lock("secret-rw", "w", TTL, wait).await;
    assert!(timed_out.unwrap().is_none());
    let held = store
        .try_lock("secret-locked", "l", TTL)
        .await
        .unwrap()
        .unwrap();
    let other_kind = store.try_read_lock("secret-locked", "r", TTL).await;
    assert!(other_kind.is_err(), "a lock's name: HeldAsOtherKind");
    let second = store.read_lock("secret-rw", "r2", TTL, wait).await;
    assert!(second.unwrap().unwrap().release().await.unwrap());
    assert!(reader.release().await.unwrap() && held.release().await.unwrap());
    store.close().await.unwrap();

    recorded.take(&snapshotter);
    let counted = |name: &str, labels: &[(&str, &str)]| recorded.counted(name, labels);
    let (counters, histograms) = (&recorded.counters, &recorded.histograms);
    let sqlite = ("engine", "sqlite");
    let acquire = "alkstore_acquire_total";
    assert_eq!(
        counted(
            acquire,
            &[sqlite, ("operation", "try_lock"), ("outcome", "granted")]
        ),
        2,
        "the first lock and the one beside a reader-writer lock: {counters:#?}"
    );
    assert_eq!(
        counted(
            acquire,
            &[sqlite, ("operation", "try_lock"), ("outcome", "held")]
        ),
        1
    );
    assert_eq!(
        counted(
            acquire,
            &[sqlite, ("operation", "try_lock"), ("outcome", "error")]
        ),
        1
    );
    assert_eq!(
        counted(
            acquire,
            &[sqlite, ("operation", "lock"), ("outcome", "granted")]
        ),
        1
    );
    assert_eq!(
        counted(
            acquire,
            &[sqlite, ("operation", "lock"), ("outcome", "held")]
        ),
        1
    );
    for (outcome, count) in [("granted", 1), ("held", 1), ("error", 1)] {
        let labels = [
            sqlite,
            ("operation", "try_acquire_permit"),
            ("outcome", outcome),
        ];
        assert_eq!(counted(acquire, &labels), count, "{outcome}: {counters:#?}");
    }
    let labels = [sqlite, ("operation", "acquire_permit"), ("outcome", "held")];
    assert_eq!(counted(acquire, &labels), 1);
    for (operation, outcome, count) in [
        ("try_read_lock", "granted", 1),
        ("try_read_lock", "error", 1),
        ("try_write_lock", "held", 1),
        ("write_lock", "held", 1),
        ("read_lock", "granted", 1),
    ] {
        let labels = [sqlite, ("operation", operation), ("outcome", outcome)];
        assert_eq!(
            counted(acquire, &labels),
            count,
            "{operation} {outcome}: {counters:#?}"
        );
    }
    assert!(counted("alkstore_lock_refused_attempts_total", &[sqlite]) >= 7);
    assert_eq!(
        counted(
            "alkstore_force_release_total",
            &[sqlite, ("outcome", "other_kind")]
        ),
        1
    );
    assert_eq!(
        counted("alkstore_renew_total", &[sqlite, ("outcome", "renewed")]),
        2
    );
    assert_eq!(
        counted("alkstore_renew_total", &[sqlite, ("outcome", "lost")]),
        1
    );
    assert_eq!(
        counted("alkstore_release_total", &[sqlite, ("outcome", "released")]),
        5,
        "a lock's, a permit's, two readers' and the lock beside them"
    );
    assert_eq!(
        counted("alkstore_release_total", &[sqlite, ("outcome", "lost")]),
        1
    );
    assert_eq!(
        counted(
            "alkstore_force_release_total",
            &[sqlite, ("outcome", "removed")]
        ),
        1
    );
    assert_eq!(
        counted(
            "alkstore_force_release_total",
            &[sqlite, ("outcome", "free")]
        ),
        1
    );
    assert_eq!(
        counted("alkstore_keepalive_lost_total", &[("reason", "revoked")]),
        1
    );
    let waits = |outcome| {
        histograms
            .get(&key(
                "alkstore_lock_wait_seconds",
                &[sqlite, ("outcome", outcome)],
            ))
            .copied()
    };
    assert_eq!(
        waits("granted"),
        Some(2),
        "a lock's and a reader's: {histograms:#?}"
    );
    assert_eq!(
        waits("held"),
        Some(3),
        "a lock's, a permit's and a writer's wait ran out"
    );
    assert_eq!(
        histograms
            .get(&key("alkstore_handoff_seconds", &[sqlite]))
            .copied(),
        Some(1),
        "the waiter woken by the release records one handoff: {histograms:#?}"
    );
}
