//! A refused acquire writes nothing, by the server's own counters. This test
//! binary starts its own server and runs this one test, so the server-wide
//! counters move only with what it does.

mod common;

use std::time::Duration;

use alkstore_core::{Error, Store};

const TTL: Duration = Duration::from_secs(30);

/// The server's counters of what statements write: rows written,
/// updated and deleted through the handler, commits and rollbacks. Not the redo log's sequence number: InnoDB's own background
/// work (the page cleaner's checkpoints, purge) logs redo of its own at
/// moments no wait excludes (16 bytes seen in the middle of a count on a
/// loaded machine), and counts no row; every row a statement writes is
/// counted here, as the control at the end shows.
async fn writes(pool: &sqlx::MySqlPool) -> Vec<(String, i64)> {
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT VARIABLE_NAME, VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS
         WHERE VARIABLE_NAME IN ('HANDLER_WRITE', 'HANDLER_UPDATE', 'HANDLER_DELETE',
             'COM_COMMIT', 'COM_ROLLBACK')
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

/// 1000 refused acquires move no write counter (handler writes, updates and
/// deletes, commits and rollbacks), nor do
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
    // This test's own server: no background statistics updates (they
    // write rows of their own a while after rows change).
    sqlx::query("SET GLOBAL innodb_stats_auto_recalc = OFF")
        .execute(store.pool())
        .await
        .unwrap();
    let held = store.try_lock("busy", "a", TTL).await.unwrap().unwrap();
    // Warm: every statement prepared, the holder's row cached.
    for _ in 0..10 {
        assert!(store.try_lock("busy", "b", TTL).await.unwrap().is_none());
    }
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
        delta("HANDLER_WRITE") >= 1000 && delta("COM_COMMIT") > 0,
        "1000 grants: {} handler writes, {} commits",
        delta("HANDLER_WRITE"),
        delta("COM_COMMIT")
    );
    for lock in grants {
        assert!(lock.release().await.unwrap());
    }
    assert!(held.release().await.unwrap());
    store.close().await.unwrap();
    db.drop().await;
}
