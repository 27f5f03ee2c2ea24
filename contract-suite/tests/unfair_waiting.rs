//! A store told to wait unfairly (`EngineStore::fair_waiting(false)`) on
//! an engine that queues: its waiting calls take no place in the queue,
//! and never go ahead of a fair store's waiters that do.

use std::sync::Arc;
use std::time::{Duration, Instant};

use alkstore_contract_suite::reference::MemoryEngine;
use alkstore_core::{EngineStore, Store};

const TTL: Duration = Duration::from_secs(30);
const WAIT: Duration = Duration::from_secs(10);

/// Until `name`'s queue holds `count` waiters (10 s at most).
async fn until_queued(store: &dyn Store, name: &str, count: usize) {
    let deadline = Instant::now() + WAIT;
    while store.waiters(name).await.unwrap().len() < count {
        assert!(Instant::now() < deadline, "{count} waiters never queued");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

// One thread: a spawned task runs when the test yields, so the order of
// the waiters' first attempts is the order below, not a hope.
#[tokio::test(flavor = "current_thread")]
async fn an_unfair_waiter_takes_no_place_and_goes_after_the_queue() {
    let engine = MemoryEngine::default();
    let fair = Arc::new(EngineStore::new(engine.clone()));
    let unfair = Arc::new(EngineStore::new(engine.clone()).fair_waiting(false));
    let holder = fair.try_lock("n", "holder", TTL).await.unwrap().unwrap();

    // A whole unfair wait, the queue read all along (its first attempt
    // runs before the first read): never a place.
    let short = unfair.lock("n", "short", TTL, Duration::from_millis(300));
    let watching = async {
        let mut reads = 0;
        loop {
            let waiters = fair.waiters("n").await.unwrap();
            assert!(
                waiters.is_empty(),
                "an unfair waiter took a place: {waiters:?}"
            );
            reads += 1;
            tokio::time::sleep(Duration::from_millis(5)).await;
            if reads >= 40 {
                return reads;
            }
        }
    };
    let (refused, reads) = tokio::join!(short, watching);
    assert!(refused.unwrap().is_none(), "held for the whole wait");
    assert!(reads >= 40);

    let barging = {
        let unfair = unfair.clone();
        tokio::spawn(async move { unfair.lock("n", "unfair", TTL, WAIT).await })
    };
    // The unfair waiter's first attempt runs (refused, no ticket) before a
    // fair waiter comes: that one is still first in the queue.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(fair.waiters("n").await.unwrap().is_empty());
    let queued = {
        let fair = fair.clone();
        tokio::spawn(async move { fair.lock("n", "fair", TTL, WAIT).await })
    };
    until_queued(fair.as_ref(), "n", 1).await;
    let waiters = fair.waiters("n").await.unwrap();
    assert_eq!(waiters.len(), 1, "{waiters:?}");
    assert_eq!(waiters[0].owner, "fair");

    assert!(holder.release().await.unwrap());
    let first = queued.await.unwrap().unwrap().expect("the queued waiter");
    assert!(
        !barging.is_finished(),
        "the unfair waiter went ahead of the queue"
    );
    let first_fence = first.fence();
    assert!(first.release().await.unwrap());
    let second = barging
        .await
        .unwrap()
        .unwrap()
        .expect("then the unfair one");
    assert!(second.fence() > first_fence);
    assert!(second.release().await.unwrap());
}
