//! A job run once per second across three replicas whose clocks disagree
//! (one 80 ms ahead, one 60 ms behind; the schedule allows for 200 ms): each
//! replica runs the schedule's loop on its own store, every slot is run by
//! exactly one of them, and the run is handed its claim's fence. At the end
//! the expired claims of past slots are purged.
//!
//! Run with `cargo run --example cron_once`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use alkstore::Store;
use alkstore::schedule::{Outcome, Schedule};

const SLOTS: u32 = 5;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("cron.db").display());
    let every_second = Schedule::every("report/every-second", Duration::from_secs(1))?
        .max_clock_skew(Duration::from_millis(200))?;
    // slot → the replicas that ran it.
    let runs: Arc<Mutex<BTreeMap<u64, Vec<usize>>>> = Arc::default();

    let mut replicas = Vec::new();
    for (replica, offset_ms) in [(0usize, 0i64), (1, 80), (2, -60)] {
        // Each replica opens its own store, as separate processes would.
        let store: Arc<dyn Store> = alkstore::open(&url).await?.into();
        let schedule = every_second.clone().clock(move || {
            let by = Duration::from_millis(offset_ms.unsigned_abs());
            if offset_ms >= 0 {
                SystemTime::now() + by
            } else {
                SystemTime::now() - by
            }
        });
        let runs = runs.clone();
        replicas.push(tokio::spawn(async move {
            let label = format!("replica-{replica}");
            let job = |run: alkstore::schedule::SlotRun| async move {
                // The work; write with `run.fence` wherever fences are checked.
                run.fence
            };
            let print = |outcome: &Outcome<u64>| {
                if let Outcome::Ran { slot, fence, .. } = outcome {
                    println!(
                        "slot {}: run by replica {replica} with fence {fence}",
                        slot.index
                    );
                    runs.lock()
                        .unwrap()
                        .entry(slot.index)
                        .or_default()
                        .push(replica);
                }
            };
            let lasting = Duration::from_secs(u64::from(SLOTS));
            let _ = tokio::time::timeout(lasting, schedule.run(&*store, &label, job, print)).await;
            store
        }));
    }
    let mut stores = Vec::new();
    for replica in replicas {
        stores.push(replica.await?);
    }

    let runs = runs.lock().unwrap().clone();
    for (slot, who) in &runs {
        assert_eq!(who.len(), 1, "slot {slot} ran {} times", who.len());
    }
    println!("{} slots, each run by exactly one replica", runs.len());
    // Claims hold to their slot's end plus the skew bound, then expire.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    println!(
        "purged {} expired claims of past slots",
        stores[0].purge_expired().await?
    );
    for store in stores {
        store.close().await?;
    }
    Ok(())
}
