//! A semaphore: eight workers share three permits of one name. Each worker
//! opens its own store (as separate processes would), waits for a permit,
//! works a while holding it, and releases it; an observer prints the
//! holders — slot, owner, fence — each time they change. Never more than
//! three at once, and every grant's fence above the ones before it.
//!
//! Run with `cargo run --example semaphore`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use alkstore::Store;

const NAME: &str = "exports";
const PERMITS: u32 = 3;
const WORKERS: usize = 8;
const TTL: Duration = Duration::from_secs(10);

#[tokio::main]
async fn main() -> Result<(), alkstore::BoxError> {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("permits.db").display());
    let started = Instant::now();
    let t = move || format!("{:>7.3?}", started.elapsed());

    let mut workers = Vec::new();
    for worker in 0..WORKERS {
        let store: Arc<dyn Store> = alkstore::open(&url).await?.into();
        workers.push(tokio::spawn(async move {
            let owner = alkstore::unique_owner(&format!("worker-{worker}"))?;
            let wait = Duration::from_secs(30);
            let permit = store
                .acquire_permit(NAME, PERMITS, &owner, TTL, wait)
                .await?
                .ok_or("no permit within the wait")?;
            // Work, holding the permit; its fence goes with what it writes.
            let work = Duration::from_millis(150 + 60 * worker as u64);
            tokio::time::sleep(work).await;
            let released = permit.release().await?;
            store.close().await?;
            Ok::<bool, alkstore::BoxError>(released)
        }));
    }

    // The observer: its own store, reading the permits every 10 ms.
    let observer = alkstore::open(&url).await?;
    let mut last = Vec::new();
    let mut most = 0;
    let mut last_fence = 0;
    while workers.iter().any(|w| !w.is_finished()) {
        let holders = observer.holders(NAME).await?;
        let now: Vec<(u32, u64)> = holders
            .iter()
            .filter_map(|h| Some((h.permit?.slot, h.holder.fence)))
            .collect();
        if now != last {
            let shown: Vec<String> = holders
                .iter()
                .filter_map(|h| {
                    let owner = h.holder.owner.split('@').next().unwrap_or_default();
                    let slot = h.permit?.slot;
                    Some(format!("{slot}:{owner} (fence {})", h.holder.fence))
                })
                .collect();
            println!(
                "{} {} of {PERMITS} held  {}",
                t(),
                holders.len(),
                shown.join(", ")
            );
            most = most.max(holders.len());
            let mut new: Vec<u64> = now
                .iter()
                .filter(|held| !last.contains(held))
                .map(|(_, fence)| *fence)
                .collect();
            new.sort_unstable();
            for fence in new {
                assert!(
                    fence > last_fence,
                    "a new grant's fence is above the ones seen before"
                );
                last_fence = fence;
            }
            last = now;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for worker in workers {
        assert!(worker.await??, "each worker released its own live permit");
    }
    println!(
        "{} all {WORKERS} workers done; at most {most} of {PERMITS} permits held at once",
        t()
    );
    assert!(most <= PERMITS as usize);
    observer.close().await?;
    Ok(())
}
