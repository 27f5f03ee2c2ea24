//! Failover against real servers: a primary with a streaming standby on
//! loopback (each test starts a pair of its own), load on 64 names, the
//! primary killed and the standby promoted, as a failover manager would.
//!
//! Asynchronous: WAL shipping is cut 1 s before the kill (a network split),
//! so the promotion loses acknowledged grants — and still every fence the
//! promoted server hands out is above every fence handed out before.
//! Synchronous: no acknowledged grant is lost.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use alkstore_core::Store;
use alkstore_postgres::PgStore;
use alkstore_testkit::pg::{Pair, unique_schema};
use sqlx::Connection;
use sqlx::postgres::PgConnection;

const NAMES: usize = 64;
const TTL: Duration = Duration::from_secs(60);

/// Waits until the standby has replayed everything the primary wrote.
async fn until_caught_up(pair: &Pair) {
    let mut primary = PgConnection::connect(&pair.primary_url).await.unwrap();
    let mut standby = PgConnection::connect(&pair.standby_url).await.unwrap();
    let (target,): (String,) = sqlx::query_as("SELECT pg_current_wal_lsn()::text")
        .fetch_one(&mut primary)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (behind,): (bool,) =
            sqlx::query_as("SELECT coalesce(pg_last_wal_replay_lsn() < $1::pg_lsn, true)")
                .bind(&target)
                .fetch_one(&mut standby)
                .await
                .unwrap();
        if !behind {
            return;
        }
        assert!(Instant::now() < deadline, "the standby did not catch up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the standby's WAL receiver is gone after [`Pair::cut`].
async fn until_cut(pair: &Pair) {
    pair.cut().unwrap();
    let mut standby = PgConnection::connect(&pair.standby_url).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (receiving,): (i64,) = sqlx::query_as("SELECT count(*) FROM pg_stat_wal_receiver")
            .fetch_one(&mut standby)
            .await
            .unwrap();
        if receiving == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "the standby kept receiving WAL");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What the writer saw: the highest fence any grant answered, and each
/// name's grant still held at the kill (owner, fence).
#[derive(Debug, Default)]
struct Written {
    highest: u64,
    held: HashMap<String, (String, u64)>,
    grants: u64,
}

/// Grants, releases and forced releases on every name in turns for
/// `for_how_long`, ending with a round whose grants are held.
async fn write(store: &PgStore, written: &mut Written, round: &mut u64, for_how_long: Duration) {
    let until = Instant::now() + for_how_long;
    while Instant::now() < until || *round % 2 == 0 {
        *round += 1;
        for i in 0..NAMES {
            let name = format!("n{i}");
            let owner = format!("w{round}");
            if let Some((_, fence)) = written.held.remove(&name) {
                // Every other round: let the operator remove it instead.
                if *round % 3 == 0 {
                    store.force_release_grant(&name, fence).await.unwrap();
                } else {
                    store.force_release(&name).await.unwrap();
                }
            }
            let lock = store
                .try_lock(&name, &owner, TTL)
                .await
                .unwrap()
                .expect("the writer is the only one granting");
            written.highest = written.highest.max(lock.fence());
            written.grants += 1;
            if *round % 2 == 0 {
                assert!(lock.release().await.unwrap());
            } else {
                written.held.insert(name, (owner, lock.fence()));
                lock.let_lapse();
            }
        }
    }
}

/// After the promotion: every name granted on the promoted server (the old
/// grants removed by force first), each fence checked against the highest
/// handed out before. Answers (fences not above, acknowledged grants lost).
async fn after_promotion(promoted: &PgStore, written: &Written) -> (usize, usize) {
    let mut lost = 0;
    for (name, (owner, fence)) in &written.held {
        let holder = promoted.holder(name).await.unwrap();
        if holder.map(|h| (h.owner, h.fence)) != Some((owner.clone(), *fence)) {
            lost += 1;
        }
    }
    let mut below = 0;
    for i in 0..NAMES {
        let name = format!("n{i}");
        promoted.force_release(&name).await.unwrap();
        let lock = promoted
            .try_lock(&name, "after", TTL)
            .await
            .unwrap()
            .expect("free after the forced release");
        if lock.fence() <= written.highest {
            below += 1;
            eprintln!(
                "{name}: fence {} after {} was handed out",
                lock.fence(),
                written.highest
            );
        }
        assert!(lock.release().await.unwrap());
    }
    (below, lost)
}

/// Asynchronous replication, WAL shipping cut 1 s before the primary is
/// killed: the promotion loses acknowledged grants (asynchronous
/// replication promises no more), but every fence the promoted server
/// hands out is above every fence the old primary handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_rise_across_an_asynchronous_promotion() {
    let Some(pair) = Pair::start(false) else {
        return;
    };
    let schema = unique_schema("failover");
    let store = PgStore::connect(&pair.primary_url, &schema).await.unwrap();
    let (mut written, mut round) = (Written::default(), 0);
    write(&store, &mut written, &mut round, Duration::from_millis(500)).await;
    until_caught_up(&pair).await;
    until_cut(&pair).await;
    write(&store, &mut written, &mut round, Duration::from_secs(1)).await;
    pair.kill_primary().unwrap();
    pair.promote().unwrap();
    store.close().await.unwrap();
    let promoted = PgStore::connect(&pair.standby_url, &schema).await.unwrap();
    let (below, lost) = after_promotion(&promoted, &written).await;
    eprintln!(
        "asynchronous failover: {} grants, highest fence {}; {lost} of {} acknowledged held \
         grants lost; {below} of {NAMES} names granted a fence not above it",
        written.grants,
        written.highest,
        written.held.len()
    );
    assert!(
        lost > 0,
        "the cut lost nothing: the test did not test a lossy promotion"
    );
    assert_eq!(below, 0, "fences went down across the promotion");
    promoted.close().await.unwrap();
}

/// Synchronous replication (`synchronous_standby_names = '*'`), the primary
/// killed under load: every grant acknowledged and still held is on the
/// promoted server, with its fence, and new fences are above every fence
/// handed out before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_grants_survive_a_synchronous_promotion() {
    let Some(pair) = Pair::start(true) else {
        return;
    };
    let schema = unique_schema("syncfail");
    let store = PgStore::connect(&pair.primary_url, &schema).await.unwrap();
    let (mut written, mut round) = (Written::default(), 0);
    write(&store, &mut written, &mut round, Duration::from_secs(1)).await;
    pair.kill_primary().unwrap();
    pair.promote().unwrap();
    store.close().await.unwrap();
    let promoted = PgStore::connect(&pair.standby_url, &schema).await.unwrap();
    let (below, lost) = after_promotion(&promoted, &written).await;
    eprintln!(
        "synchronous failover: {} grants, highest fence {}; {lost} of {} acknowledged held \
         grants lost; {below} of {NAMES} names granted a fence not above it",
        written.grants,
        written.highest,
        written.held.len()
    );
    assert_eq!(
        lost, 0,
        "acknowledged grants lost under synchronous replication"
    );
    assert_eq!(below, 0, "fences went down across the promotion");
    promoted.close().await.unwrap();
}
