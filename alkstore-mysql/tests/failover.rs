//! Failover against real servers: a MariaDB primary with a GTID replica on
//! loopback (the test starts a pair of its own), load on 64 names, the
//! binary log's shipping cut 1 s before the primary is killed, and the
//! replica promoted as a failover manager would (`STOP SLAVE; RESET SLAVE
//! ALL`). The promotion loses acknowledged grants (asynchronous replication
//! promises no more) — and still every fence the promoted server hands out
//! is above every fence handed out before.

use std::time::{Duration, Instant};

use alkstore_contract_suite::failover::{AfterPromotion, Written, after_promotion, write};
use alkstore_core::Store;
use alkstore_mysql::MySqlStore;
use alkstore_testkit::mysql::Pair;
use sqlx::Connection;
use sqlx::mysql::MySqlConnection;

/// Waits until the replica has applied everything the primary logged.
async fn until_caught_up(pair: &Pair) {
    let mut primary = MySqlConnection::connect(&pair.primary_url).await.unwrap();
    let mut replica = MySqlConnection::connect(&pair.replica_url).await.unwrap();
    let (position,): (String,) = sqlx::query_as("SELECT CAST(@@gtid_binlog_pos AS CHAR)")
        .fetch_one(&mut primary)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (reached,): (i64,) = sqlx::query_as("SELECT CAST(MASTER_GTID_WAIT(?, 1) AS SIGNED)")
            .bind(&position)
            .fetch_one(&mut replica)
            .await
            .unwrap();
        if reached == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "the replica did not catch up");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_rise_across_an_asynchronous_promotion() {
    let Some(pair) = Pair::start(false) else {
        return;
    };
    let database = alkstore_testkit::unique_name("failover");
    let store = MySqlStore::connect(&pair.primary_url, &database)
        .await
        .unwrap();
    let mut written = Written::default();
    write(&store, &mut written, Duration::from_millis(500)).await;
    until_caught_up(&pair).await;
    pair.cut().unwrap();
    write(&store, &mut written, Duration::from_secs(1)).await;
    pair.kill_primary().unwrap();
    pair.promote().unwrap();
    store.close().await.unwrap();
    let promoted = MySqlStore::connect(&pair.replica_url, &database)
        .await
        .unwrap();
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
