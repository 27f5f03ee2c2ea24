//! Fences in commit order, with the race held open on purpose: a grant is
//! made to sleep inside its insert (a trigger), between the moment a careless
//! engine would draw its fence and the moment it holds the name's row,
//! while another store takes and gives back the name. This test binary
//! starts its own server, and only this file's tests sleep in it.

mod common;

use std::time::{Duration, Instant};

use alkstore_core::Store;
use alkstore_mysql::MySqlStore;

const TTL: Duration = Duration::from_secs(30);

/// Waits until a session of the server sleeps in `SLEEP()` (the trigger).
async fn until_someone_sleeps(store: &MySqlStore) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (sleeping,): (i64,) = sqlx::query_as(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE STATE = 'User sleep'",
        )
        .fetch_one(store.pool())
        .await
        .unwrap();
        if sleeping > 0 {
            return;
        }
        assert!(Instant::now() < deadline, "nobody slept");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A grant held up inside its insert, while another store's grant of the
/// same name commits and is released, still commits with the higher fence:
/// its fence is drawn only once its row is in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_slow_to_insert_still_draws_the_higher_fence() {
    let Some((slow_store, db)) = common::store("slow").await else {
        return;
    };
    let quoted = db.quoted();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TRIGGER {quoted}.slow_insert BEFORE INSERT ON {quoted}.locks FOR EACH ROW
         IF NEW.owner = 'slow' THEN DO SLEEP(1); END IF"
    )))
    .execute(slow_store.pool())
    .await
    .unwrap();
    let fast_store = MySqlStore::connect(&db.url, &db.name).await.unwrap();
    let slow = tokio::spawn(async move {
        let lock = slow_store.try_lock("n", "slow", TTL).await.unwrap();
        (slow_store, lock)
    });
    until_someone_sleeps(&fast_store).await;
    // The slow insert has not reached the index: the name is free.
    let fast = fast_store
        .try_lock("n", "fast", TTL)
        .await
        .unwrap()
        .expect("the slow grant has no row yet");
    let fast_fence = fast.fence();
    assert!(fast.release().await.unwrap());
    let (slow_store, slow) = slow.await.unwrap();
    let slow = slow.expect("the name was free again when the slow insert landed");
    assert!(
        slow.fence() > fast_fence,
        "the grant that committed last has fence {} below the earlier grant's {fast_fence}",
        slow.fence()
    );
    assert!(slow.release().await.unwrap());
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP TRIGGER {quoted}.slow_insert"
    )))
    .execute(slow_store.pool())
    .await
    .unwrap();
    fast_store.close().await.unwrap();
    slow_store.close().await.unwrap();
    db.drop().await;
}
