//! A reader-writer lock: six readers keep reading one customer's record,
//! their reads overlapping, and a writer comes to change it. Each opens its
//! own store (as separate processes would). Once the writer waits, new
//! readers wait behind it; the readers already in finish, the writer is
//! granted, and the readers go on after it, with fences above the
//! writer's. The lines printed are the holders as they change.
//!
//! Run with `cargo run --example rwlock`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use alkstore::{Access, Store};

const NAME: &str = "customer/42";
const READERS: usize = 6;
const TTL: Duration = Duration::from_secs(10);

#[tokio::main]
async fn main() -> Result<(), alkstore::BoxError> {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("rw.db").display());
    let started = Instant::now();
    let t = move || format!("{:>7.3?}", started.elapsed());

    // Readers: each reads three times, 200 ms a read, starting 50 ms apart,
    // so that some read is always in progress.
    let mut readers = Vec::new();
    for reader in 0..READERS {
        let store: Arc<dyn Store> = alkstore::open(&url).await?.into();
        readers.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50 * reader as u64)).await;
            let owner = alkstore::unique_owner(&format!("reader-{reader}"))?;
            let mut fences = Vec::new();
            for _ in 0..3 {
                let wait = Duration::from_secs(30);
                let read = store
                    .read_lock(NAME, &owner, TTL, wait)
                    .await?
                    .ok_or("no read within the wait")?;
                fences.push(read.fence());
                tokio::time::sleep(Duration::from_millis(200)).await;
                read.release().await?;
            }
            store.close().await?;
            Ok::<Vec<u64>, alkstore::BoxError>(fences)
        }));
    }

    // The writer comes while the reads overlap.
    let store: Arc<dyn Store> = alkstore::open(&url).await?.into();
    let writer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let asked = Instant::now();
        let write = store
            .write_lock(NAME, "writer", TTL, Duration::from_secs(30))
            .await?
            .ok_or("no write within the wait")?;
        let waited = asked.elapsed();
        let fence = write.fence();
        tokio::time::sleep(Duration::from_millis(100)).await; // the change
        write.release().await?;
        store.close().await?;
        Ok::<(Duration, u64), alkstore::BoxError>((waited, fence))
    });

    // The observer: its own store, reading the holders every 10 ms.
    let observer = alkstore::open(&url).await?;
    let mut last = Vec::new();
    while readers.iter().any(|r| !r.is_finished()) || !writer.is_finished() {
        let holders = observer.holders(NAME).await?;
        let now: Vec<(String, u64)> = holders
            .iter()
            .map(|h| {
                let who = h.holder.owner.split('@').next().unwrap_or_default();
                let how = match h.access {
                    Some(Access::Write) => "writes",
                    _ => "reads",
                };
                (format!("{who} {how}"), h.holder.fence)
            })
            .collect();
        if now != last {
            let shown: Vec<String> = now
                .iter()
                .map(|(who, fence)| format!("{who} (fence {fence})"))
                .collect();
            let shown = if shown.is_empty() {
                "free".to_owned()
            } else {
                shown.join(", ")
            };
            println!("{} {shown}", t());
            let writing = now.iter().any(|(who, _)| who.ends_with("writes"));
            assert!(!writing || now.len() == 1, "a writer holds the name alone");
            last = now;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (waited, write_fence) = writer.await??;
    let mut after = 0;
    for reader in readers {
        after += reader.await??.iter().filter(|f| **f > write_fence).count();
    }
    println!(
        "{} the writer waited {waited:?} for the reads in progress (each 200 ms); \
         {after} reads came after it, every one with a fence above its {write_fence}",
        t()
    );
    observer.close().await?;
    Ok(())
}
