//! Failover against real servers: a primary with a streaming standby on
//! loopback (each test starts a pair of its own), load on 64 names, the
//! primary killed and the standby promoted, as a failover manager would.
//!
//! Asynchronous: WAL shipping is cut 1 s before the kill (a network split),
//! so the promotion loses acknowledged grants — and still every fence the
//! promoted server hands out is above every fence handed out before.
//! Synchronous: no acknowledged grant is lost.

use std::time::{Duration, Instant};

use alkstore_contract_suite::failover::{AfterPromotion, Written, after_promotion, write};
use alkstore_core::Store;
use alkstore_postgres::PgStore;
use alkstore_testkit::pg::{Pair, unique_schema};
use sqlx::Connection;
use sqlx::postgres::PgConnection;

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
    let mut written = Written::default();
    write(&store, &mut written, Duration::from_millis(500)).await;
    until_caught_up(&pair).await;
    until_cut(&pair).await;
    write(&store, &mut written, Duration::from_secs(1)).await;
    pair.kill_primary().unwrap();
    pair.promote().unwrap();
    store.close().await.unwrap();
    let promoted = PgStore::connect(&pair.standby_url, &schema).await.unwrap();
    let AfterPromotion {
        fences_not_above: below,
        acknowledged_lost: lost,
    } = after_promotion(&promoted, &written)
        .await
        .report("asynchronous", &written);
    assert!(
        lost > 0,
        "the cut lost nothing: the test did not test a lossy promotion"
    );
    assert_eq!(below, 0, "fences went down across the promotion");
    promoted.close().await.unwrap();
}

/// Synchronous replication (`synchronous_standby_names = '*'`): load on
/// every name, then WAL shipping cut and 1 s more load — whose grants wait
/// for the standby and are never answered — then the primary killed and the
/// standby promoted. Every grant answered and still held is on the promoted
/// server, with its fence (under asynchronous replication, the grants
/// answered after the cut are lost: this test fails there), and new fences
/// are above every fence handed out before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_grants_survive_a_synchronous_promotion() {
    let Some(pair) = Pair::start(true) else {
        return;
    };
    let schema = unique_schema("syncfail");
    let store = PgStore::connect(&pair.primary_url, &schema).await.unwrap();
    let mut written = Written::default();
    write(&store, &mut written, Duration::from_millis(500)).await;
    until_cut(&pair).await;
    // Grants now wait for a standby that hears nothing: none is answered,
    // and the writer is dropped in the middle of one.
    let _ = tokio::time::timeout(
        Duration::from_secs(1),
        write(&store, &mut written, Duration::from_secs(1)),
    )
    .await;
    pair.kill_primary().unwrap();
    pair.promote().unwrap();
    store.close().await.unwrap();
    let promoted = PgStore::connect(&pair.standby_url, &schema).await.unwrap();
    let AfterPromotion {
        fences_not_above: below,
        acknowledged_lost: lost,
    } = after_promotion(&promoted, &written)
        .await
        .report("synchronous", &written);
    assert!(
        !written.held.is_empty(),
        "precondition: the writer held answered grants at the kill"
    );
    assert_eq!(
        lost, 0,
        "acknowledged grants lost under synchronous replication"
    );
    assert_eq!(below, 0, "fences went down across the promotion");
    promoted.close().await.unwrap();
}
