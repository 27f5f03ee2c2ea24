//! Leader election with keep-alive: several replicas, one leader; the leader
//! is killed (its task aborted, nothing released) and another replica takes
//! over once the lease lapses, within one TTL; then the new leader steps down
//! gracefully and a third takes over at once. Every step prints its fence.
//!
//! Run with `cargo run --example leader`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use alkstore::{KeepAlive, Store};
use tokio::sync::mpsc;

const NAME: &str = "leader";
const TTL: Duration = Duration::from_millis(1500);

/// What replicas tell the operator.
enum Event {
    Elected { replica: usize, fence: u64 },
    SteppedDown { replica: usize },
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("leader.db").display());
    let started = Instant::now();
    let t = move || format!("{:>8.3?}", started.elapsed());
    let (events, mut elected) = mpsc::unbounded_channel();
    // Replicas that should step down when asked.
    let step_down: Arc<Mutex<Vec<usize>>> = Arc::default();

    let mut replicas = Vec::new();
    for replica in 0..3 {
        // Each replica opens its own store, as separate processes would.
        let store: Arc<dyn Store> = alkstore::open(&url).await?.into();
        let (events, step_down) = (events.clone(), step_down.clone());
        replicas.push(tokio::spawn(async move {
            run_replica(replica, store, events, step_down).await
        }));
    }

    let Some(Event::Elected {
        replica: first,
        fence,
    }) = elected.recv().await
    else {
        unreachable!("replicas only send elections first")
    };
    println!("{} replica {first} is leader, fence {fence}", t());
    tokio::time::sleep(TTL * 2).await;
    println!(
        "{} replica {first} still leads after {:?} (keep-alive renewing); killing it",
        t(),
        TTL * 2
    );
    replicas[first].abort();
    let killed_at = Instant::now();

    let Some(Event::Elected {
        replica: second,
        fence: fence2,
    }) = elected.recv().await
    else {
        unreachable!()
    };
    let gap = killed_at.elapsed();
    println!(
        "{} replica {second} took over {gap:.3?} after the kill (ttl {TTL:?}), fence {fence2} > {fence}",
        t()
    );
    assert!(fence2 > fence && gap <= TTL + Duration::from_millis(500));

    step_down.lock().unwrap().push(second);
    let Some(Event::SteppedDown { replica }) = elected.recv().await else {
        unreachable!()
    };
    let stepped_at = Instant::now();
    println!("{} replica {replica} stepped down and released", t());
    let Some(Event::Elected {
        replica: third,
        fence: fence3,
    }) = elected.recv().await
    else {
        unreachable!()
    };
    println!(
        "{} replica {third} took over {:.3?} after the release, fence {fence3} > {fence2}",
        t(),
        stepped_at.elapsed()
    );
    for replica in replicas {
        replica.abort();
    }
    Ok(())
}

async fn run_replica(
    me: usize,
    store: Arc<dyn Store>,
    events: mpsc::UnboundedSender<Event>,
    step_down: Arc<Mutex<Vec<usize>>>,
) -> alkstore::Result<()> {
    loop {
        // One holder per term: a fresh owner id for each campaign.
        let owner = alkstore::unique_owner(&format!("replica-{me}"))?;
        // Campaign: wait for the lease, woken by releases, polling for lapses.
        let Some(lock) = store
            .lock(NAME, &owner, TTL, Duration::from_secs(60))
            .await?
        else {
            continue;
        };
        let _ = events.send(Event::Elected {
            replica: me,
            fence: lock.fence(),
        });
        let kept = KeepAlive::start(lock, TTL)?;
        // Lead until the lease is lost or the operator asks us to step down.
        let asked_to_step_down = loop {
            tokio::select! {
                reason = kept.lost() => {
                    println!("replica {me}: lost leadership: {reason:?}");
                    break false;
                }
                _ = tokio::time::sleep(Duration::from_millis(50)) => {
                    if step_down.lock().unwrap().contains(&me) {
                        break true;
                    }
                }
            }
        };
        if asked_to_step_down {
            kept.release().await?;
            let _ = events.send(Event::SteppedDown { replica: me });
            // Sit out, so that another replica leads.
            std::future::pending::<()>().await;
        }
    }
}
