//! Two workers contend for one lock on the embedded SQLite default: one wins,
//! renews and releases; the other waits and takes over with a higher fence.
//!
//! Run with `cargo run --example quickstart`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use alkstore::Store;
use tokio::sync::Barrier;

const NAME: &str = "nightly-report";
const TTL: Duration = Duration::from_secs(5);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    let store: Arc<dyn Store> = alkstore::open(&url).await?.into();
    println!("opened {url}");

    let start = Arc::new(Barrier::new(2));
    let workers: Vec<_> = ["worker-a", "worker-b"]
        .into_iter()
        .map(|me| {
            let (store, start) = (store.clone(), start.clone());
            tokio::spawn(async move { work(store, start, me).await })
        })
        .collect();
    for worker in workers {
        worker.await??;
    }

    println!("holder at the end: {:?}", store.holder(NAME).await?);
    store.close().await?;
    Ok(())
}

async fn work(
    store: Arc<dyn Store>,
    start: Arc<Barrier>,
    me: &'static str,
) -> alkstore::Result<()> {
    // The label is for the reader; the owner id names this holder alone.
    let owner = alkstore::unique_owner(me)?;
    start.wait().await;
    match store.try_lock(NAME, &owner, TTL).await? {
        Some(lock) => {
            println!("{me}: won {NAME:?}, fence {}", lock.fence());
            tokio::time::sleep(Duration::from_millis(200)).await;
            let renewed = lock.renew(TTL).await?;
            let left = lock.valid_until().saturating_duration_since(Instant::now());
            println!("{me}: renewed = {renewed}, lease certainly valid for {left:.2?} more");
            tokio::time::sleep(Duration::from_millis(200)).await;
            let released = lock.release().await?;
            println!("{me}: released = {released}");
        }
        None => {
            let holder = store.holder(NAME).await?.expect("someone holds it");
            println!(
                "{me}: {NAME:?} is held by {} (fence {}); waiting",
                holder.owner, holder.fence
            );
            let asked = Instant::now();
            let lock = store
                .lock(NAME, &owner, TTL, Duration::from_secs(10))
                .await?
                .expect("granted within the wait");
            println!(
                "{me}: took over after {:.0?}, fence {} (higher than {})",
                asked.elapsed(),
                lock.fence(),
                holder.fence
            );
            println!("{me}: released = {}", lock.release().await?);
        }
    }
    Ok(())
}
