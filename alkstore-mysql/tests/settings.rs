//! Hostile server defaults: the store pins what its statements rely on.
//! This test binary starts its own server and changes its global defaults,
//! so that no other test sees them.

mod common;

use std::time::Duration;

use alkstore_core::Store;
use alkstore_mysql::MySqlStore;
use sqlx::Connection;
use sqlx::mysql::MySqlConnection;

const TTL: Duration = Duration::from_secs(30);

/// The row as a connection of its own sees it (committed data only).
async fn committed_expiry(url: &str, database: &str, name: &str) -> Option<i64> {
    let mut conn = MySqlConnection::connect(url).await.unwrap();
    sqlx::query("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        .execute(&mut conn)
        .await
        .unwrap();
    let row: Option<(i64,)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT expires_at FROM `{database}`.locks WHERE name = ?"
    )))
    .bind(name.as_bytes())
    .fetch_optional(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();
    row.map(|(e,)| e)
}

/// With the server defaulting to no autocommit, chained transactions and
/// READ UNCOMMITTED, a grant, a renewal and a release answered are each
/// committed, and another store sees exactly that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answered_means_committed_whatever_the_server_defaults() {
    let Some(server) = alkstore_testkit::mysql::server() else {
        return;
    };
    let mut admin = MySqlConnection::connect(&server.url).await.unwrap();
    for setting in [
        "SET GLOBAL autocommit = 0",
        "SET GLOBAL completion_type = 'CHAIN'",
        "SET GLOBAL TRANSACTION ISOLATION LEVEL READ UNCOMMITTED",
    ] {
        sqlx::query(setting).execute(&mut admin).await.unwrap();
    }
    let database = alkstore_testkit::unique_name("defaults");
    let store = MySqlStore::connect(&server.url, &database).await.unwrap();
    let other = MySqlStore::connect(&server.url, &database).await.unwrap();
    for round in 0..3 {
        let lock = store.try_lock("job", "a", TTL).await.unwrap().unwrap();
        let fence = lock.fence();
        let granted = committed_expiry(&server.url, &database, "job").await;
        assert!(
            granted.is_some(),
            "round {round}: the grant is not committed"
        );
        assert!(other.try_lock("job", "b", TTL).await.unwrap().is_none());
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert!(lock.renew(TTL).await.unwrap());
        let renewed = committed_expiry(&server.url, &database, "job").await;
        assert!(
            renewed > granted,
            "round {round}: the renewal answered true is not committed ({renewed:?} after {granted:?})"
        );
        assert!(lock.release().await.unwrap());
        assert_eq!(
            committed_expiry(&server.url, &database, "job").await,
            None,
            "round {round}: the release is not committed"
        );
        let taken = other.try_lock("job", "b", TTL).await.unwrap().unwrap();
        assert!(taken.fence() > fence);
        assert!(taken.release().await.unwrap());
    }
    for setting in [
        "SET GLOBAL autocommit = 1",
        "SET GLOBAL completion_type = 'NO_CHAIN'",
        "SET GLOBAL TRANSACTION ISOLATION LEVEL REPEATABLE READ",
    ] {
        sqlx::query(setting).execute(&mut admin).await.unwrap();
    }
    other.close().await.unwrap();
    store.drop_database().await.unwrap();
    store.close().await.unwrap();
}
