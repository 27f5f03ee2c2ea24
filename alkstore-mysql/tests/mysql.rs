//! What only the MariaDB/MySQL engine can show, against a real server: the
//! database name as data, names compared as bytes, concurrent opens, fences
//! across reconnects, and round trips per operation counted on the wire.

mod common;

use std::sync::Arc;
use std::time::Duration;

use alkstore_contract_suite::support::{
    assert_refused_within_wait, permit_round_trips, rw_round_trips,
};
use alkstore_contract_suite::{faults, opening, support};
use alkstore_core::{Error, Field, Store};
use alkstore_mysql::MySqlStore;
use alkstore_testkit::mysql;

const TTL: Duration = Duration::from_secs(30);

/// A database name full of backticks, quotes and SQL works, and touches
/// nothing outside itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_database_name_is_only_a_name() {
    let Some((bystander, bystander_db)) = common::store("bystander").await else {
        return;
    };
    let server = mysql::server().unwrap();
    let kept = bystander.try_lock("x", "a", TTL).await.unwrap().unwrap();
    for hostile in [
        "a`; DROP TABLE x; --",
        "it's \"quoted\" \\ spaced",
        "x`; DROP DATABASE mysql; --",
    ] {
        let name = format!("{hostile}{}", std::process::id() % 1000);
        let store = MySqlStore::connect(&server.url, &name).await.unwrap();
        assert_eq!(store.database(), name);
        let lock = store.try_lock("x", "b", TTL).await.unwrap().unwrap();
        let (found,): (String,) = sqlx::query_as(
            "SELECT CAST(SCHEMA_NAME AS CHAR) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?",
        )
        .bind(&name)
        .fetch_one(store.pool())
        .await
        .unwrap();
        assert_eq!(found, name);
        assert!(lock.release().await.unwrap());
        store.drop_database().await.unwrap();
        let (left,): (i64,) = sqlx::query_as(
            "SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?",
        )
        .bind(&name)
        .fetch_one(store.pool())
        .await
        .unwrap();
        assert_eq!(left, 0, "the database alkstore created is dropped");
        store.close().await.unwrap();
    }
    // The bystander and the server's own database are untouched.
    let holder = bystander.holder("x").await.unwrap().unwrap();
    assert_eq!(holder.fence, kept.fence());
    let (mysql_db,): (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = 'mysql'",
    )
    .fetch_one(bystander.pool())
    .await
    .unwrap();
    assert_eq!(mysql_db, 1);
    assert!(kept.release().await.unwrap());
    bystander.close().await.unwrap();
    bystander_db.drop().await;
}

/// Database names the server cannot hold as given are refused before
/// connecting.
#[tokio::test]
async fn bad_database_names_are_refused_before_any_connection() {
    // No server is contacted: the URL points nowhere.
    let url = "mysql://nobody@127.0.0.1:1";
    for database in ["", "a\0b", &"d".repeat(65), "trailing ", "   "] {
        match MySqlStore::connect(url, database).await {
            Err(Error::InvalidName { field, .. }) => assert_eq!(field, Field::Schema),
            other => panic!("{database:?}: expected InvalidName, got {other:?}"),
        }
    }
    match MySqlStore::connect(url, "locks\u{1F512}").await {
        Err(Error::InvalidName { field, .. }) => assert_eq!(field, Field::Schema),
        other => panic!("a character beyond U+FFFF: expected InvalidName, got {other:?}"),
    }
    for database in [
        "mysql",
        "information_schema",
        "SYS",
        "performance_schema",
        "#mysql50#x",
    ] {
        assert!(
            matches!(
                MySqlStore::connect(url, database).await,
                Err(Error::ReservedName { .. })
            ),
            "{database}"
        );
    }
}

/// Names and owners are bytes: names that a case-insensitive or
/// space-padding collation would merge are different locks, and an owner
/// differing only in case is another owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_and_owners_compare_as_bytes() {
    let Some((store, db)) = common::store("bytes").await else {
        return;
    };
    let upper = store.try_lock("Job", "a", TTL).await.unwrap().unwrap();
    let lower = store.try_lock("job", "a", TTL).await.unwrap();
    assert!(lower.is_some(), "`job` is not `Job`");
    let padded = store.try_lock("job ", "a", TTL).await.unwrap();
    assert!(padded.is_some(), "`job ` is not `job`");
    let accent = store.try_lock("jöb", "a", TTL).await.unwrap();
    assert!(accent.is_some(), "`jöb` is not `job`");
    assert!(
        store.try_lock("Job", "A", TTL).await.unwrap().is_none(),
        "owner `A` is not owner `a`"
    );
    assert_eq!(store.holder("Job").await.unwrap().unwrap().owner, "a");
    for lock in [Some(upper), lower, padded, accent].into_iter().flatten() {
        assert!(lock.release().await.unwrap());
    }
    store.close().await.unwrap();
    db.drop().await;
}

/// Several stores opening one new database at once all succeed, and share it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_opens_of_one_database_succeed() {
    let Some(server) = mysql::server() else {
        return;
    };
    let (url, database) = (&server.url, alkstore_testkit::unique_name("opens"));
    let stores = opening::concurrent_opens_succeed(|| {
        let (url, database) = (url.clone(), database.clone());
        async move { Ok(Arc::new(MySqlStore::connect(&url, &database).await?) as Arc<dyn Store>) }
    })
    .await;
    let sweeper = MySqlStore::connect(url, &database).await.unwrap();
    sweeper.drop_database().await.unwrap();
    sweeper.close().await.unwrap();
    for store in stores {
        store.close().await.unwrap();
    }
}

/// Fences keep rising across stores and reconnects (a new pool each time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_rise_across_reconnects() {
    let Some((store, db)) = common::store("reconnect").await else {
        return;
    };
    store.close().await.unwrap();
    opening::fences_rise_across_reconnects(|| async {
        Ok(Arc::new(MySqlStore::connect(&db.url, &db.name).await?) as Arc<dyn Store>)
    })
    .await;
    db.drop().await;
}

/// A table named `locks` that alkstore did not make is refused and left as
/// it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_alkstore_did_not_create_are_never_adopted() {
    let Some((store, db)) = common::store("foreign").await else {
        return;
    };
    let other = alkstore_testkit::unique_name("theirs");
    let quoted = format!("`{other}`");
    for statement in [
        format!("CREATE DATABASE {quoted}"),
        format!("CREATE TABLE {quoted}.locks (id INT PRIMARY KEY)"),
        format!("INSERT INTO {quoted}.locks VALUES (7)"),
    ] {
        common::sql(store.pool(), statement).await;
    }
    let refused = MySqlStore::connect(&db.url, &other).await.unwrap_err();
    assert!(
        refused
            .find_source::<alkstore_mysql::ForeignObjectsError>()
            .is_some(),
        "{refused:?}"
    );
    let (kept,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT id FROM {quoted}.locks"
    )))
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(kept, 7);
    common::sql(store.pool(), format!("DROP DATABASE {quoted}")).await;
    store.close().await.unwrap();
    db.drop().await;
}

/// Acquire, a refusal, renew, holder and release are one round trip each,
/// and a permit's acquire, refusal, renew and release,
/// counted on the wire through a proxy (after a warm-up, so that statement
/// preparation is cached as in steady state).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_round_trip_per_operation() {
    let Some(server) = mysql::server() else {
        return;
    };
    let (url, flights) = alkstore_testkit::wire::through_proxy(&server.url).await;
    let database = alkstore_testkit::unique_name("trips");
    let store = MySqlStore::connect(&url, &database).await.unwrap();
    for _ in 0..3 {
        let lock = store.try_lock("warm", "a", TTL).await.unwrap().unwrap();
        assert!(store.try_lock("warm", "b", TTL).await.unwrap().is_none());
        assert!(lock.renew(TTL).await.unwrap());
        store.holder("warm").await.unwrap();
        assert!(lock.release().await.unwrap());
    }
    let mut trips = Vec::new();
    for _ in 0..20 {
        let t0 = flights.count();
        let lock = store.try_lock("job", "a", TTL).await.unwrap().unwrap();
        let t1 = flights.count();
        assert!(store.try_lock("job", "b", TTL).await.unwrap().is_none());
        let t2 = flights.count();
        assert!(lock.renew(TTL).await.unwrap());
        let t3 = flights.count();
        store.holder("job").await.unwrap().unwrap();
        let t4 = flights.count();
        assert!(lock.release().await.unwrap());
        let t5 = flights.count();
        trips.push([t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4]);
    }
    for t in &trips {
        assert_eq!(
            t,
            &[1, 1, 1, 1, 1],
            "round trips of [acquire, refused, renew, holder, release]: {trips:?}"
        );
    }
    let trips = permit_round_trips(&store, || flights.count()).await;
    assert!(
        trips.iter().all(|t| t == &[1, 1, 1, 1]),
        "round trips of a permit's [acquire, refused, renew, release]: {trips:?}"
    );
    let trips = rw_round_trips(&store, || flights.count()).await;
    assert!(
        trips.iter().all(|t| t == &[1, 1, 1, 1, 1, 1]),
        "round trips of [read, write, refused writer, refused reader, renew, release]: {trips:?}"
    );
    store.drop_database().await.unwrap();
    store.close().await.unwrap();
}

/// A waiting acquire behind a table lock (`LOCK TABLES … WRITE`, as DDL or
/// a backup takes) keeps to its wait: the metadata-lock wait is bounded
/// like the row-lock waits, and it answers `None` at its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_acquire_behind_a_table_lock_keeps_to_its_wait() {
    let Some((store, db)) = common::store("mdl").await else {
        return;
    };
    use sqlx::Connection;
    let mut blocker = sqlx::mysql::MySqlConnection::connect(&db.url)
        .await
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "LOCK TABLES `{}`.locks WRITE",
        db.name
    )))
    .execute(&mut blocker)
    .await
    .unwrap();
    assert_refused_within_wait(
        &store,
        ("job", "a", TTL),
        Duration::from_millis(1500),
        Duration::from_millis(700),
        "the waiting acquire overran its wait behind the table lock",
    )
    .await;
    sqlx::raw_sql("UNLOCK TABLES")
        .execute(&mut blocker)
        .await
        .unwrap();
    let lock = store.try_lock("job", "a", TTL).await.unwrap().unwrap();
    assert!(lock.release().await.unwrap());
    blocker.close().await.unwrap();
    store.close().await.unwrap();
    db.drop().await;
}

/// A role with exactly the grants docs/engine-mysql.md lists (DML on
/// `locks` and `permits`, `SELECT` on `meta`, `EXECUTE` on the procedures)
/// opens a store an administrator made and takes, renews, inspects and
/// releases locks, permits and reader-writer grants,
/// though `information_schema` hides the `fences` sequence from it. When the
/// sequence is truly gone, a grant refuses with `LostFencesError`, draws
/// nothing, and the error's advice never restarts fences at 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_with_the_documented_grants_uses_the_store() {
    let Some((admin, db)) = common::store("leastpriv").await else {
        return;
    };
    let q = db.quoted();
    let (user, url) = role(
        &admin,
        &db,
        "app",
        &[
            format!("GRANT SELECT, INSERT, UPDATE, DELETE ON {q}.locks TO {{}}"),
            format!("GRANT SELECT, INSERT, UPDATE, DELETE ON {q}.permits TO {{}}"),
            format!("GRANT SELECT, DELETE ON {q}.tickets TO {{}}"),
            format!("GRANT SELECT ON {q}.meta TO {{}}"),
            format!("GRANT EXECUTE ON PROCEDURE {q}.acquire TO {{}}"),
            format!("GRANT EXECUTE ON PROCEDURE {q}.acquire_permit TO {{}}"),
            format!("GRANT EXECUTE ON PROCEDURE {q}.acquire_rw TO {{}}"),
        ],
    )
    .await;
    let app = MySqlStore::connect(&url, &db.name)
        .await
        .expect("the documented grants open the store");
    let lock = app.try_lock("job", "app", TTL).await.unwrap().unwrap();
    assert!(lock.renew(TTL).await.unwrap());
    assert!(app.try_lock("job", "other", TTL).await.unwrap().is_none());
    // A waiting call queues (its ticket written by the procedure, with its
    // definer's rights) and leaves the queue when its wait is over.
    let waited = app
        .lock("job", "other", TTL, Duration::from_millis(300))
        .await;
    assert!(waited.unwrap().is_none(), "held by app for the whole wait");
    assert!(app.waiters("job").await.unwrap().is_empty());
    assert_eq!(
        app.holder("job").await.unwrap().unwrap().fence,
        lock.fence()
    );
    assert_eq!(app.list("", None, 10).await.unwrap().len(), 1);
    let fence = lock.fence();
    assert!(lock.release().await.unwrap());
    let again = app.try_lock("job", "app", TTL).await.unwrap().unwrap();
    assert!(again.fence() > fence);
    assert!(app.force_release("job").await.unwrap().is_some());
    let permit = app.try_acquire_permit("pool", 2, "app", TTL).await;
    let permit = permit.unwrap().expect("a permit");
    assert!(permit.renew(TTL).await.unwrap());
    assert_eq!(app.holders("pool").await.unwrap().len(), 1);
    assert!(permit.release().await.unwrap());
    app.purge_expired().await.unwrap();

    common::sql(admin.pool(), format!("DROP SEQUENCE {q}.fences")).await;
    for store in [&app, &admin] {
        let error = store
            .try_lock("after", "app", TTL)
            .await
            .expect_err("a grant without the fences sequence");
        let lost = error
            .find_source::<alkstore_mysql::LostFencesError>()
            .unwrap_or_else(|| panic!("not LostFencesError: {error:?}"));
        let advice = lost.to_string();
        assert!(advice.contains("START WITH"), "{advice}");
        assert!(advice.contains("Do not drop"), "{advice}");
        assert!(store.holder("after").await.unwrap().is_none());
    }
    app.close().await.unwrap();
    common::sql(admin.pool(), format!("DROP USER {user}")).await;
    admin.drop_database().await.unwrap();
    admin.close().await.unwrap();
}

/// `drop_database` keeps what alkstore did not create: an event in the
/// database keeps the database (and the event), and someone else's trigger
/// on alkstore's own table stops the drop before anything is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_keeps_events_and_triggers_alkstore_did_not_create() {
    let Some((store, db)) = common::store("dropkeeps").await else {
        return;
    };
    let q = db.quoted();
    let run = |statement: String| {
        let pool = store.pool().clone();
        async move {
            sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
                .execute(&pool)
                .await
                .unwrap()
        }
    };
    let count = |statement: String| {
        let pool = store.pool().clone();
        async move {
            let (n,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(statement))
                .fetch_one(&pool)
                .await
                .unwrap();
            n
        }
    };
    run(format!(
        "CREATE TRIGGER {q}.audit BEFORE DELETE ON {q}.locks FOR EACH ROW SET @x = 1"
    ))
    .await;
    let refused = store.drop_database().await.expect_err("a foreign trigger");
    assert!(
        refused
            .find_source::<alkstore_mysql::ForeignObjectsError>()
            .is_some(),
        "{refused:?}"
    );
    let locks = format!(
        "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = '{}' AND TABLE_NAME = 'locks'",
        db.name.replace('\'', "''")
    );
    assert_eq!(count(locks.clone()).await, 1, "dropped before refusing");
    run(format!("DROP TRIGGER {q}.audit")).await;

    run(format!(
        "CREATE EVENT {q}.nightly ON SCHEDULE EVERY 1 DAY DISABLE DO SET @x = 1"
    ))
    .await;
    store.drop_database().await.unwrap();
    let schema = format!(
        "SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = '{}'",
        db.name.replace('\'', "''")
    );
    assert_eq!(
        count(schema).await,
        1,
        "the database was dropped with its event"
    );
    assert_eq!(count(locks).await, 0, "alkstore's own objects stay");
    run(format!("DROP EVENT {q}.nightly")).await;
    run(format!("DROP DATABASE {q}")).await;
    store.close().await.unwrap();
}

/// The acquire procedure refuses to run inside the caller's open
/// transaction, and the refusal leaves that transaction as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_call_inside_a_transaction_keeps_the_callers_work() {
    use sqlx::Connection;
    let Some((store, db)) = common::store("intx").await else {
        return;
    };
    let q = db.quoted();
    let mut conn = sqlx::MySqlConnection::connect(&db.url).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "START TRANSACTION; INSERT INTO {q}.locks (name, owner, fence, expires_at) VALUES ('mine', 'me', 0, 0)"
    )))
    .execute(&mut conn)
    .await
    .unwrap();
    let refused = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CALL {q}.acquire('job', 'me', 1000, NULL, NULL, NULL)"
    )))
    .execute(&mut conn)
    .await
    .expect_err("acquire inside a transaction");
    assert!(
        refused.to_string().contains("open transaction"),
        "{refused}"
    );
    let (mine, open): (i64, i64) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT (SELECT COUNT(*) FROM {q}.locks WHERE name = 'mine'), CAST(@@in_transaction AS SIGNED)"
    )))
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(
        (mine, open),
        (1, 1),
        "the caller's transaction was rolled back"
    );
    sqlx::raw_sql("ROLLBACK").execute(&mut conn).await.unwrap();
    let _ = conn.close().await;
    assert!(store.holder("job").await.unwrap().is_none());
    store.drop_database().await.unwrap();
    store.close().await.unwrap();
}

/// A server that refuses the connection is answered at once (not after the
/// pool's 10 s timeout), with its cause and where the connection went, and
/// no password; so is a wrong password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_connect_answers_at_once_with_its_cause() {
    let connect = |url: String| async move {
        Ok(Arc::new(MySqlStore::connect(&url, "s").await?) as Arc<dyn Store>)
    };
    let refused = "mysql://u:pw-secret@127.0.0.1:1/x";
    let wrong = mysql::server().map(|server| {
        let mut url = url::Url::parse(&server.url).unwrap();
        url.set_password(Some("not-the-password")).unwrap();
        (url.to_string(), "Access denied")
    });
    opening::a_failed_connect_answers_at_once_with_its_cause(connect, refused, wrong).await;
}

/// A store of layout 1 (whose acquire procedure rolled the caller's
/// transaction back when it refused) is upgraded in place when opened: the
/// procedure made again, the version recorded, the fences kept rising.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layout_1_is_upgraded_in_place() {
    let Some((store, db)) = common::store("upgrade1").await else {
        return;
    };
    let q = db.quoted();
    let lock = store.try_lock("job", "a", TTL).await.unwrap().unwrap();
    let before = lock.fence();
    assert!(lock.release().await.unwrap());
    // Back to layout 1: a procedure of its own, its version.
    common::sql(
        store.pool(),
        format!(
            "DROP PROCEDURE {q}.acquire;
         CREATE PROCEDURE {q}.acquire(p_name VARBINARY(255), p_owner VARBINARY(255), \
             p_ttl BIGINT, p_wait_ms BIGINT) SELECT 'layout 1';
         UPDATE {q}.meta SET value = 1 WHERE `key` = 'schema_version'"
        ),
    )
    .await;
    store.close().await.unwrap();
    let reopened = db.reopened().await;
    let after = reopened.try_lock("job", "a", TTL).await.unwrap().unwrap();
    assert!(after.fence() > before);
    assert!(after.release().await.unwrap());
    reopened.drop_database().await.unwrap();
    reopened.close().await.unwrap();
}

/// A store of layout 4 (no semaphores: no `permits` table, no
/// `acquire_permit` procedure) is upgraded in place when opened: both made,
/// the lock procedure replaced, the version recorded, a live lock and the
/// fences kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layout_4_is_upgraded_in_place_with_semaphores() {
    let Some((store, db)) = common::store("upgrade4").await else {
        return;
    };
    let q = db.quoted();
    let held = store.try_lock("held", "a", TTL).await.unwrap().unwrap();
    common::sql(
        store.pool(),
        format!(
            "DROP PROCEDURE {q}.acquire_permit;
         DROP TABLE {q}.permits;
         UPDATE {q}.meta SET value = 4 WHERE `key` = 'schema_version'"
        ),
    )
    .await;
    held.let_lapse();
    store.close().await.unwrap();
    let reopened = db.reopened().await;
    let holder = reopened.holder("held").await.unwrap().expect("still held");
    let permit = reopened.try_acquire_permit("pool", 2, "b", TTL).await;
    let permit = permit.unwrap().expect("a permit after the upgrade");
    assert!(permit.fence() > holder.fence);
    let clash = reopened.try_lock("pool", "c", TTL).await;
    assert!(
        matches!(clash, Err(alkstore_core::Error::HeldAsOtherKind { .. })),
        "{clash:?}"
    );
    assert!(permit.release().await.unwrap());
    reopened.drop_database().await.unwrap();
    reopened.close().await.unwrap();
}

/// A role that cannot see every trigger and event of the database (no
/// `TRIGGER` or `EVENT` on it) is refused `drop_database` before anything is
/// dropped: an event it cannot see stays, and so do alkstore's objects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_blind_to_triggers_and_events_drops_nothing() {
    let Some((admin, db)) = common::store("blinddrop").await else {
        return;
    };
    let q = db.quoted();
    let (user, url) = role(
        &admin,
        &db,
        "blind",
        &[
            format!("GRANT ALL PRIVILEGES ON {q}.* TO {{}}"),
            format!("REVOKE TRIGGER, EVENT ON {q}.* FROM {{}}"),
        ],
    )
    .await;
    common::sql(
        admin.pool(),
        format!("CREATE EVENT {q}.theirs ON SCHEDULE EVERY 1 DAY DISABLE DO SET @x = 1"),
    )
    .await;
    let blind = MySqlStore::connect(&url, &db.name).await.unwrap();
    let refused = blind
        .drop_database()
        .await
        .expect_err("a role blind to events");
    let why = refused
        .find_source::<alkstore_mysql::CannotSeeEverythingError>()
        .unwrap_or_else(|| panic!("not CannotSeeEverythingError: {refused:?}"));
    assert_eq!(why.privilege, "TRIGGER");
    let count = |table: &'static str| {
        let pool = admin.pool().clone();
        let name = db.name.clone();
        async move {
            let (n,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "SELECT COUNT(*) FROM information_schema.{table} WHERE {} = ?",
                if table == "EVENTS" {
                    "EVENT_SCHEMA"
                } else {
                    "TABLE_SCHEMA"
                }
            )))
            .bind(name)
            .fetch_one(&pool)
            .await
            .unwrap();
            n
        }
    };
    assert_eq!(count("EVENTS").await, 1, "the event was dropped");
    assert!(count("TABLES").await >= 2, "alkstore's tables were dropped");
    blind.close().await.unwrap();
    for statement in [
        format!("DROP EVENT {q}.theirs"),
        format!("DROP USER {user}"),
    ] {
        common::sql(admin.pool(), statement).await;
    }
    admin.drop_database().await.unwrap();
    admin.close().await.unwrap();
}

/// Fences drawn on another server than the last ones (as on a replica just
/// promoted: `meta` says which `server_id` drew the last fence) start above
/// every fence the other server may have handed out and not replicated:
/// the sequence is raised by 2^32, once, by the first grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_drawn_on_another_server_start_2_pow_32_higher() {
    let Some((store, db)) = common::store("promoted").await else {
        return;
    };
    let q = db.quoted();
    let first = store.try_lock("a", "x", TTL).await.unwrap().unwrap();
    let before = first.fence();
    assert!(first.release().await.unwrap());
    // As a replica's copy of `meta` reads after its primary drew fences.
    common::sql(
        store.pool(),
        format!("UPDATE {q}.meta SET value = @@server_id + 1 WHERE `key` = 'fences_drawn_by'"),
    )
    .await;
    let contenders: Vec<_> = (0..8)
        .map(|i| {
            let store = &store;
            async move {
                let lock = store
                    .try_lock(&format!("n{i}"), "x", TTL)
                    .await
                    .unwrap()
                    .unwrap();
                let fence = lock.fence();
                assert!(lock.release().await.unwrap());
                fence
            }
        })
        .collect();
    let mut fences = futures::future::join_all(contenders).await;
    fences.sort();
    assert!(
        fences[0] > before + (1 << 32),
        "fences {fences:?} after {before}: not raised past the other server's"
    );
    assert!(
        fences[7] < before + (1 << 33),
        "raised more than once: {fences:?} after {before}"
    );
    store.drop_database().await.unwrap();
    store.close().await.unwrap();
}

/// Makes a role of its own for this process (`'{prefix}{pid}'@'%'`) with
/// `grants` (each with `{}` where the role goes); answers the role as SQL
/// names it and a URL that logs in as it.
async fn role(
    admin: &MySqlStore,
    db: &common::Database,
    prefix: &str,
    grants: &[String],
) -> (String, String) {
    let name = format!("{prefix}{}", std::process::id());
    let password = format!("{prefix}-secret-1");
    let user = format!("'{name}'@'%'");
    let mut statements = vec![format!("CREATE USER {user} IDENTIFIED BY '{password}'")];
    statements.extend(grants.iter().map(|grant| grant.replace("{}", &user)));
    for statement in statements {
        common::sql(admin.pool(), statement).await;
    }
    let (_, host) = db.url.rsplit_once('@').expect("a URL with credentials");
    (user, format!("mysql://{name}:{password}@{host}"))
}

/// A late renewal on MariaDB: a session whose clock is set back, with `SET
/// timestamp`, to before the lease's end, renewing in a transaction left
/// open.
struct LateRenewal {
    conn: sqlx::MySqlConnection,
    database: String,
    expires_at: i64,
}

#[async_trait::async_trait]
impl faults::LateRenewal for LateRenewal {
    async fn before_expiry(&mut self, name: &str, permit: bool) {
        let table = if permit { "permits" } else { "locks" };
        let q = &self.database;
        let (expires_at,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT expires_at FROM {q}.{table} WHERE name = ?"
        )))
        .bind(name.as_bytes())
        .fetch_one(&mut self.conn)
        .await
        .unwrap();
        self.expires_at = expires_at;
    }

    async fn renew(&mut self, name: &str, permit: bool, fence: u64) -> u64 {
        const NOW: &str =
            "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)";
        let table = if permit { "permits" } else { "locks" };
        let (q, before) = (&self.database, (self.expires_at - 50) as f64 / 1000.0);
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "SET timestamp = {before}; START TRANSACTION"
        )))
        .execute(&mut self.conn)
        .await
        .unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {q}.{table} SET expires_at = {NOW} + 60000
             WHERE name = ? AND owner = 'a' AND fence = ? AND expires_at > {NOW}"
        )))
        .bind(name.as_bytes())
        .bind(fence as i64)
        .execute(&mut self.conn)
        .await
        .unwrap()
        .rows_affected()
    }

    async fn commit(&mut self) {
        sqlx::raw_sql("COMMIT")
            .execute(&mut self.conn)
            .await
            .unwrap();
    }
}

/// A renewal that read the server's clock before its lease ran out and
/// commits after it never brings the other kind back
/// (`faults::a_late_renewal_never_brings_the_other_kind_back`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_renewal_never_brings_the_other_kind_back() {
    use sqlx::Connection;
    let Some((store, db)) = common::store("laterenew").await else {
        return;
    };
    let store: Arc<dyn Store> = Arc::new(store);
    let (url, quoted) = (db.url.clone(), db.quoted());
    faults::a_late_renewal_never_brings_the_other_kind_back(store.clone(), || async {
        LateRenewal {
            conn: sqlx::MySqlConnection::connect(&url).await.unwrap(),
            database: quoted.clone(),
            expires_at: 0,
        }
    })
    .await;
    store.close().await.unwrap();
    db.drop().await;
}

/// A store of layout 7 (no queues: no `tickets` table or `ticket_numbers`
/// sequence, and procedures of other arguments) is upgraded in place when
/// opened: the procedures replaced, the queue's objects made, and a waiting
/// call queued, shown, and granted in turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layout_7_is_upgraded_in_place_with_queues() {
    let Some((store, db)) = common::store("upgrade7").await else {
        return;
    };
    let q = db.quoted();
    let held = store.try_lock("held", "a", TTL).await.unwrap().unwrap();
    common::sql(
        store.pool(),
        format!(
            "DROP TABLE {q}.tickets;
             DROP SEQUENCE {q}.ticket_numbers;
             CREATE OR REPLACE PROCEDURE {q}.acquire(p_name VARBINARY(255),
                 p_owner VARBINARY(255), p_ttl BIGINT, p_wait_ms BIGINT)
                 SELECT FALSE, 0, 0, NULL;
             UPDATE {q}.meta SET value = 7 WHERE `key` = 'schema_version'"
        ),
    )
    .await;
    let reopened = Arc::new(db.reopened().await);
    support::queues_and_grants_in_turn(reopened.clone(), "held", held).await;
    store.close().await.unwrap();
    reopened.drop_database().await.unwrap();
    reopened.close().await.unwrap();
}

/// A store of layout 6 (rows that do not say which server granted them)
/// is upgraded in place when opened by another store while the first
/// holds grants: its rows are taken as this server's, so that they stay
/// renewable and are given back to their owners with their fences.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layout_6_is_upgraded_in_place_with_epochs() {
    let Some((store, db)) = common::store("upgrade6").await else {
        return;
    };
    let q = db.quoted();
    let held = store.try_lock("held", "a", TTL).await.unwrap().unwrap();
    let permit = store.try_acquire_permit("pool", 2, "b", TTL).await;
    let permit = permit.unwrap().unwrap();
    common::sql(
        store.pool(),
        format!(
            "ALTER TABLE {q}.locks DROP COLUMN epoch;
             ALTER TABLE {q}.permits DROP COLUMN epoch;
             UPDATE {q}.meta SET value = 6 WHERE `key` = 'schema_version'"
        ),
    )
    .await;
    let reopened = db.reopened().await;
    assert!(held.renew(TTL).await.unwrap(), "a grant of this server");
    assert!(permit.renew(TTL).await.unwrap(), "a permit of this server");
    let again = reopened.try_lock("held", "a", TTL).await.unwrap().unwrap();
    assert_eq!(again.fence(), held.fence(), "given back, not fenced anew");
    let again_permit = reopened.try_acquire_permit("pool", 2, "b", TTL).await;
    let again_permit = again_permit.unwrap().unwrap();
    assert_eq!(again_permit.fence(), permit.fence());
    for lock in [again, again_permit] {
        assert!(lock.release().await.unwrap());
    }
    assert!(!held.release().await.unwrap(), "its twin released it");
    assert!(!permit.release().await.unwrap(), "its twin released it");
    store.close().await.unwrap();
    reopened.drop_database().await.unwrap();
    reopened.close().await.unwrap();
}

/// Renewals asked for at once go to the server in one round trip per batch
/// (`alkstore.renew_batch` spans; flights counted on the wire), locks',
/// permits', readers' and writers' alike, two handles of one grant
/// included, names with quotes, backslashes, accents and bytes of every
/// kind too; each handle gets its own answer: the grants another store
/// force-released answer `false`, the others `true`, and a renewed lease
/// is extended on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_asked_at_once_go_in_one_round_trip_and_each_is_answered_alone() {
    use alkstore_contract_suite::support::{
        assert_only_the_force_released_are_lost, renew_at_once, renewal_batch_handles,
    };
    let Some(server) = mysql::server() else {
        return;
    };
    let (url, flights) = alkstore_testkit::wire::through_proxy(&server.url).await;
    let database = alkstore_testkit::unique_name("batch");
    // One connection: batches that overlap (a beat apart, on a loaded
    // machine) take turns on it rather than open another (several flights).
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .connect_lazy(&url)
        .unwrap();
    let store = MySqlStore::open(pool, &database).await.unwrap();
    let other = MySqlStore::connect(&server.url, &database).await.unwrap();
    let owner = alkstore_core::unique_owner("renewer'\\").unwrap();
    let short = Duration::from_secs(15);
    let name = |i: usize| format!("n{i}'\\\"é`;🔒");
    let locks = renewal_batch_handles(&store, 40, name, &owner, short).await;
    let renew_all = || renew_at_once(&locks, TTL);
    // Once to open the connection (several flights), then counted.
    renew_all().await;
    let before = flights.count();
    let (answers, batches) = renew_all().await;
    assert!(answers.into_iter().all(|a| a.unwrap()));
    assert_eq!(
        flights.count() - before,
        batches.len() as u64,
        "a round trip per batch: {batches:?}"
    );
    let released = [0, 10, 20, 30].map(name);
    assert_only_the_force_released_are_lost(&other, &locks, &released, TTL).await;
    // Extended on the server: live well past the lease they had.
    let (live,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT (SELECT count(*) FROM `{database}`.locks
                 WHERE expires_at > UNIX_TIMESTAMP(NOW(3)) * 1000 + 20000)
              + (SELECT count(*) FROM `{database}`.permits
                 WHERE expires_at > UNIX_TIMESTAMP(NOW(3)) * 1000 + 20000)"
    )))
    .fetch_one(other.pool())
    .await
    .unwrap();
    assert_eq!(
        live,
        36 + 3,
        "36 locks, the permit, the reader and the writer"
    );
    for lock in locks {
        lock.let_lapse();
    }
    store.drop_database().await.unwrap();
    store.close().await.unwrap();
    other.close().await.unwrap();
}

/// A batch never waits for a row another transaction holds: that grant is
/// renewed alone (waiting, as a renewal always did), and the rest of its
/// batch is answered while the row is still held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_row_holds_up_no_other_renewal_of_its_batch() {
    use sqlx::Connection;
    let Some(server) = mysql::server() else {
        return;
    };
    let database = alkstore_testkit::unique_name("busy");
    let store = MySqlStore::connect(&server.url, &database).await.unwrap();
    let owner = alkstore_core::unique_owner("renewer").unwrap();
    let mut locks = Vec::new();
    for i in 0..10 {
        let lock = store.try_lock(&format!("b{i}"), &owner, TTL).await;
        locks.push(lock.unwrap().expect("a free name"));
    }
    let permit = store.try_acquire_permit("sem", 2, &owner, TTL).await;
    locks.push(permit.unwrap().expect("a free permit"));
    let mut admin = sqlx::MySqlConnection::connect(&server.url).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "START TRANSACTION; SELECT 1 FROM `{database}`.locks WHERE name = 'b1' FOR UPDATE"
    )))
    .execute(&mut admin)
    .await
    .unwrap();
    let busy = locks.remove(1);
    let held_up = tokio::spawn(async move { busy.renew(TTL).await.map(|r| (r, busy)) });
    let others = futures::future::join_all(locks.iter().map(|lock| lock.renew(TTL)));
    let answers = tokio::time::timeout(Duration::from_secs(20), others)
        .await
        .expect("the rest of the batch answered while the row is held");
    assert!(answers.into_iter().all(|a| a.unwrap()));
    assert!(
        !held_up.is_finished(),
        "the busy row's renewal did not wait for it"
    );
    sqlx::raw_sql("COMMIT").execute(&mut admin).await.unwrap();
    let (renewed, busy) = held_up.await.unwrap().unwrap();
    assert!(renewed, "renewed once the row was free");
    busy.let_lapse();
    for lock in locks {
        lock.let_lapse();
    }
    store.drop_database().await.unwrap();
    store.close().await.unwrap();
}
