//! A refused acquire writes nothing, by the server's own counters. This test
//! binary starts its own server and runs this one test, so the server-wide
//! counters move only with what it does.

mod common;

use std::time::Duration;

use alkstore_core::{Error, Store};

const TTL: Duration = Duration::from_secs(30);

/// The server's counters of rows written and of handler writes.
async fn writes(pool: &sqlx::MySqlPool) -> Vec<(String, i64)> {
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT VARIABLE_NAME, VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS
         WHERE VARIABLE_NAME IN ('HANDLER_WRITE', 'HANDLER_UPDATE', 'HANDLER_DELETE',
             'INNODB_LSN_CURRENT', 'COM_COMMIT', 'COM_ROLLBACK')
         ORDER BY VARIABLE_NAME",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    rows.into_iter()
        .map(|(k, v)| (k, v.parse().unwrap()))
        .collect()
}

/// The counters that differ between two readings, and by how much.
fn changed(before: &[(String, i64)], after: &[(String, i64)]) -> Vec<(String, i64)> {
    before
        .iter()
        .zip(after)
        .filter(|(b, a)| a.1 != b.1)
        .map(|(b, a)| (b.0.clone(), a.1 - b.1))
        .collect()
}

/// Waits until InnoDB's background work has caught up with what came
/// before, so that a count that follows does not take it for the
/// refusals': purge (MariaDB 10.11: `SET GLOBAL innodb_max_purge_lag_wait
/// = 0` returns once the history list is empty), then the page cleaner:
/// each of its flushes (about one a second) ends with a checkpoint that
/// logs redo of its own — 250 bytes, seen in the middle of a count, a
/// second after the writes before it — so it waits until no page is dirty
/// and the redo log stood still for 100 ms.
async fn settle(pool: &sqlx::MySqlPool) {
    sqlx::query("SET GLOBAL innodb_max_purge_lag_wait = 0")
        .execute(pool)
        .await
        .unwrap();
    let status = |name: &'static str| async move {
        let (value,): (String,) = sqlx::query_as(
            "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = ?",
        )
        .bind(name)
        .fetch_one(pool)
        .await
        .unwrap();
        value
    };
    let mut last = status("INNODB_LSN_CURRENT").await;
    for _ in 0..300 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let lsn = status("INNODB_LSN_CURRENT").await;
        let dirty = status("INNODB_BUFFER_POOL_PAGES_DIRTY").await;
        if lsn == last && dirty == "0" {
            return;
        }
        last = lsn;
    }
    panic!("InnoDB did not flush every dirty page within 30 s");
}

/// 1000 refused acquires move no write counter (handler writes, updates and
/// deletes, the redo log's sequence number, commits and rollbacks), nor do
/// 1000 refusals a semaphore brings (every permit held, another count, a
/// permit of a lock's name, a lock of a semaphore's name), nor 1000 that a
/// reader-writer lock brings (a writer beside a reader, a reader beside a
/// writer, a reader of a lock's name, a lock and a permit of a reader-writer
/// lock's name); 1000 grants, the control, move them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_acquires_write_nothing() {
    let Some((store, db)) = common::store("refusal").await else {
        return;
    };
    // This test's own server: no background statistics updates (they log
    // redo of their own a while after rows change).
    for setting in [
        "SET GLOBAL innodb_stats_auto_recalc = OFF",
        // Every dirty page flushed soon, so that `settle` can wait for the
        // checkpoint to reach the end of the redo log.
        "SET GLOBAL innodb_max_dirty_pages_pct = 0",
    ] {
        sqlx::query(setting).execute(store.pool()).await.unwrap();
    }
    let held = store.try_lock("busy", "a", TTL).await.unwrap().unwrap();
    // Warm: every statement prepared, the holder's row cached.
    for _ in 0..10 {
        assert!(store.try_lock("busy", "b", TTL).await.unwrap().is_none());
    }
    settle(store.pool()).await;
    let before = writes(store.pool()).await;
    for _ in 0..1000 {
        assert!(store.try_lock("busy", "b", TTL).await.unwrap().is_none());
    }
    let after = writes(store.pool()).await;
    let moved = changed(&before, &after);
    assert!(moved.is_empty(), "1000 refusals wrote: {moved:?}");
    // A permit refused because every permit is held: its plain read.
    let permits: Vec<_> = {
        let mut held = Vec::new();
        for owner in ["a", "b"] {
            let permit = store.try_acquire_permit("pool", 2, owner, TTL).await;
            held.push(permit.unwrap().expect("a free permit"));
        }
        held
    };
    for _ in 0..10 {
        let refused = store.try_acquire_permit("pool", 2, "c", TTL).await;
        assert!(refused.unwrap().is_none());
    }
    // Every other refusal a semaphore brings, by a plain read too: another
    // count, a permit of a lock's name, a lock of a semaphore's name.
    let lock = store.try_lock("locked", "a", TTL).await.unwrap().unwrap();
    settle(store.pool()).await;
    let before = writes(store.pool()).await;
    for _ in 0..250 {
        let refused = store.try_acquire_permit("pool", 2, "c", TTL).await;
        assert!(refused.unwrap().is_none());
        let mismatch = store.try_acquire_permit("pool", 3, "c", TTL).await;
        assert!(matches!(mismatch, Err(Error::PermitsMismatch { .. })));
        let on_a_lock = store.try_acquire_permit("locked", 2, "c", TTL).await;
        assert!(matches!(on_a_lock, Err(Error::HeldAsOtherKind { .. })));
        let as_a_lock = store.try_lock("pool", "c", TTL).await;
        assert!(matches!(as_a_lock, Err(Error::HeldAsOtherKind { .. })));
    }
    let after = writes(store.pool()).await;
    let moved = changed(&before, &after);
    assert!(
        moved.is_empty(),
        "1000 refusals of permits wrote: {moved:?}"
    );
    for permit in permits {
        assert!(permit.release().await.unwrap());
    }
    // What a reader-writer lock refuses, by plain reads: a writer beside a
    // reader (a try, no intent), a reader beside a writer, a reader of a
    // lock's name, a lock and a permit of a reader-writer lock's name.
    let reader = store
        .try_read_lock("read", "a", TTL)
        .await
        .unwrap()
        .unwrap();
    let writer = store
        .try_write_lock("written", "a", TTL)
        .await
        .unwrap()
        .unwrap();
    // A writer beside a reader, a reader beside a writer: both refused.
    let refuse_beside = || async {
        let beside_a_reader = store.try_write_lock("read", "c", TTL).await;
        assert!(beside_a_reader.unwrap().is_none());
        let beside_a_writer = store.try_read_lock("written", "c", TTL).await;
        assert!(beside_a_writer.unwrap().is_none());
    };
    for _ in 0..10 {
        refuse_beside().await;
    }
    settle(store.pool()).await;
    let before = writes(store.pool()).await;
    for _ in 0..200 {
        refuse_beside().await;
        let of_a_lock = store.try_read_lock("locked", "c", TTL).await;
        assert!(matches!(of_a_lock, Err(Error::HeldAsOtherKind { .. })));
        let as_a_lock = store.try_lock("read", "c", TTL).await;
        assert!(matches!(as_a_lock, Err(Error::HeldAsOtherKind { .. })));
        let as_a_permit = store.try_acquire_permit("written", 2, "c", TTL).await;
        assert!(matches!(as_a_permit, Err(Error::HeldAsOtherKind { .. })));
    }
    let after = writes(store.pool()).await;
    let moved = changed(&before, &after);
    assert!(
        moved.is_empty(),
        "1000 refusals of reader-writer locks wrote: {moved:?}"
    );
    assert!(lock.release().await.unwrap());
    assert!(reader.release().await.unwrap() && writer.release().await.unwrap());
    // The control: grants do move the counters, so the check can see writes.
    let mut grants = Vec::new();
    for i in 0..1000 {
        let lock = store.try_lock(&format!("n{i}"), "a", TTL).await.unwrap();
        grants.push(lock.unwrap());
    }
    let granted = writes(store.pool()).await;
    let delta = |name: &str| {
        let of = |v: &[(String, i64)]| v.iter().find(|(k, _)| k == name).map(|(_, n)| *n);
        of(&granted).unwrap() - of(&after).unwrap()
    };
    assert!(
        delta("HANDLER_WRITE") >= 1000 && delta("INNODB_LSN_CURRENT") > 0,
        "1000 grants: {} handler writes, redo log moved {} bytes",
        delta("HANDLER_WRITE"),
        delta("INNODB_LSN_CURRENT")
    );
    for lock in grants {
        assert!(lock.release().await.unwrap());
    }
    assert!(held.release().await.unwrap());
    store.close().await.unwrap();
    db.drop().await;
}
