//! What only the PostgreSQL engine can show, against a real server: the
//! schema name as data, concurrent opens, wake-ups across stores, the WAL a
//! refusal writes, and round trips per operation counted on the wire.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use alkstore_contract_suite::support::{
    assert_waits_out_a_table_lock, error_chain, permit_round_trips, rw_round_trips,
};
use alkstore_contract_suite::{faults, opening, support};
use alkstore_core::{Error, Field, Store};
use alkstore_postgres::PgStore;
use sqlx::Row;

const TTL: Duration = Duration::from_secs(30);

/// A schema name full of quotes, spaces and SQL works, and touches nothing
/// outside itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_schema_name_is_only_a_name() {
    let Some(server) = alkstore_testkit::pg::server() else {
        return;
    };
    let bystander = alkstore_testkit::pg::unique_schema("bystander");
    let bystander_store = PgStore::connect(&server.url, &bystander).await.unwrap();
    let kept = bystander_store
        .try_lock("x", "a", TTL)
        .await
        .unwrap()
        .unwrap();
    for hostile in [
        "a\"; DROP TABLE x; --",
        "it's \"quoted\" \\ spaced",
        "x\"; DROP SCHEMA public CASCADE; --",
    ] {
        let name = format!("{hostile}{}", std::process::id() % 1000);
        let store = PgStore::connect(&server.url, &name).await.unwrap();
        assert_eq!(store.schema(), name);
        let lock = store.try_lock("x", "b", TTL).await.unwrap().unwrap();
        let (found,): (String,) =
            sqlx::query_as("SELECT nspname::text FROM pg_namespace WHERE nspname = $1")
                .bind(&name)
                .fetch_one(store.pool())
                .await
                .unwrap();
        assert_eq!(found, name);
        assert!(lock.release().await.unwrap());
        store.drop_schema().await.unwrap();
        store.close().await.unwrap();
    }
    // The bystander schema and the public schema are untouched.
    let holder = bystander_store.holder("x").await.unwrap().unwrap();
    assert_eq!(holder.fence, kept.fence());
    let (public,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM pg_namespace WHERE nspname = 'public'")
            .fetch_one(bystander_store.pool())
            .await
            .unwrap();
    assert_eq!(public, 1);
    assert!(kept.release().await.unwrap());
    bystander_store.drop_schema().await.unwrap();
}

/// Schema names PostgreSQL cannot hold as given are refused before connecting.
#[tokio::test]
async fn bad_schema_names_are_refused_before_any_connection() {
    // No server is contacted: the URL points nowhere.
    let url = "postgres://nobody@127.0.0.1:1/none";
    for (schema, field) in [
        ("", Field::Schema),
        ("a\0b", Field::Schema),
        (&"s".repeat(64)[..], Field::Schema),
    ] {
        match PgStore::connect(url, schema).await {
            Err(Error::InvalidName { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{schema:?}: expected InvalidName, got {other:?}"),
        }
    }
    assert!(matches!(
        PgStore::connect(url, "pg_catalog").await,
        Err(Error::ReservedName { .. })
    ));
}

/// Several stores opening one new schema at once all succeed, and share it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_opens_of_one_schema_succeed() {
    let Some(server) = alkstore_testkit::pg::server() else {
        return;
    };
    let (url, schema) = (&server.url, alkstore_testkit::pg::unique_schema("opens"));
    let stores = opening::concurrent_opens_succeed(|| {
        let (url, schema) = (url.clone(), schema.clone());
        async move { Ok(Arc::new(PgStore::connect(&url, &schema).await?) as Arc<dyn Store>) }
    })
    .await;
    let sweeper = PgStore::connect(url, &schema).await.unwrap();
    sweeper.drop_schema().await.unwrap();
    sweeper.close().await.unwrap();
    for store in stores {
        store.close().await.unwrap();
    }
}

/// A waiter on one store is woken by a release made through another store
/// (another pool, as another host would): LISTEN/NOTIFY, not the poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_through_another_store_wakes_the_waiter() {
    let Some((holder_store, schema)) = common::store("notify").await else {
        return;
    };
    let waiter_store = Arc::new(PgStore::connect(&schema.url, &schema.name).await.unwrap());
    let mut handoffs = Vec::new();
    for round in 0..5 {
        let name = format!("handoff-{round}");
        let held = holder_store
            .try_lock(&name, "holder", TTL)
            .await
            .unwrap()
            .unwrap();
        let waiter = {
            let (store, name) = (waiter_store.clone(), name.clone());
            tokio::spawn(async move {
                let asked_at = Instant::now();
                let lock = store
                    .lock(&name, "waiter", TTL, Duration::from_secs(20))
                    .await
                    .unwrap()
                    .unwrap();
                (asked_at, Instant::now(), lock)
            })
        };
        // Long enough for the waiter's back-off to reach its 250 ms ceiling.
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert!(!waiter.is_finished(), "granted while the name was held");
        let released_at = Instant::now();
        assert!(held.release().await.unwrap());
        let (asked_at, granted_at, lock) = waiter.await.unwrap();
        assert!(
            released_at - asked_at >= Duration::from_millis(500),
            "the waiter started late"
        );
        handoffs.push(granted_at - released_at);
        assert!(lock.release().await.unwrap());
    }
    handoffs.sort();
    assert!(
        handoffs[2] < Duration::from_millis(50),
        "release → grant across stores: {handoffs:?}"
    );
    waiter_store.close().await.unwrap();
    holder_store.close().await.unwrap();
    schema.drop().await;
}

/// Statistics of this schema's statements, from pg_stat_statements; `None`
/// when the server does not load it (an external server may not).
async fn statement_stats(store: &PgStore) -> Option<Vec<(String, i64, i64)>> {
    sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(store.pool())
        .await
        .ok()?;
    let rows = sqlx::query(
        "SELECT query, sum(calls)::bigint, sum(wal_records)::bigint FROM pg_stat_statements
         WHERE query LIKE '%' || $1 || '%' GROUP BY query",
    )
    .bind(format!("\"{}\"", store.schema()))
    .fetch_all(store.pool())
    .await
    .ok()?;
    Some(
        rows.iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect(),
    )
}

fn calls_and_wal(stats: &[(String, i64, i64)], needle: &str) -> (i64, i64) {
    stats
        .iter()
        .filter(|(query, _, _)| query.contains(needle))
        .fold((0, 0), |(c, w), (_, calls, wal)| (c + calls, w + wal))
}

/// A refused acquire writes no WAL: 1000 refusals, 0 WAL records, while the
/// grants themselves do write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_acquire_writes_no_wal() {
    let Some((store, schema)) = common::store("nowal").await else {
        return;
    };
    let held = store
        .try_lock("busy", "holder", TTL)
        .await
        .unwrap()
        .unwrap();
    let Some(before) = statement_stats(&store).await else {
        eprintln!("SKIPPED: pg_stat_statements is not loaded on this server");
        return;
    };
    for i in 0..1000 {
        assert!(
            store
                .try_lock("busy", &format!("c{i}"), TTL)
                .await
                .unwrap()
                .is_none()
        );
    }
    let after = statement_stats(&store).await.unwrap();
    // The acquire statement (its grant path's nested statements are counted
    // in its own WAL figure too).
    let (calls_before, wal_before) = calls_and_wal(&before, "UNION ALL");
    let (calls_after, wal_after) = calls_and_wal(&after, "UNION ALL");
    assert_eq!(calls_after - calls_before, 1000);
    assert_eq!(wal_after - wal_before, 0, "refusals wrote WAL");
    assert!(wal_before > 0, "the grant itself should have written WAL");
    assert!(held.release().await.unwrap());
    store.close().await.unwrap();
    schema.drop().await;
}

/// A refused permit or reader-writer grant writes no WAL, however it is
/// refused: every permit held (the statement's own read), another count, a
/// lock's name (the function's decisions), a semaphore's name asked as a
/// lock; a writer beside a reader and a reader beside a writer (the
/// statement's own read), a reader of a lock's name (the function's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_permits_write_no_wal() {
    let Some((store, schema)) = common::store("nowalpermits").await else {
        return;
    };
    let held: Vec<_> = both_permits_held(&store).await;
    let lock = store
        .try_lock("locked", "holder", TTL)
        .await
        .unwrap()
        .unwrap();
    let reader = store.try_read_lock("read", "holder", TTL).await.unwrap();
    let writer = store
        .try_write_lock("written", "holder", TTL)
        .await
        .unwrap();
    // Warm: each refusal once, so that the function's statements are
    // planned (catalog reads, which may prune catalog pages other tests'
    // DDL left behind, and log that) before the count begins.
    refuse_every_way(&store, "warm").await;
    let Some(before) = statement_stats(&store).await else {
        eprintln!("SKIPPED: pg_stat_statements is not loaded on this server");
        return;
    };
    for i in 0..250 {
        refuse_every_way(&store, &format!("c{i}")).await;
    }
    let after = statement_stats(&store).await.unwrap();

    let (permit_calls_before, permit_wal_before) = calls_and_wal(&before, "full_up");
    let (permit_calls_after, permit_wal_after) = calls_and_wal(&after, "full_up");
    let (lock_calls_before, lock_wal_before) = calls_and_wal(&before, "UNION ALL");
    let (lock_calls_after, lock_wal_after) = calls_and_wal(&after, "UNION ALL");
    assert_eq!(permit_calls_after - permit_calls_before, 750);
    // "UNION ALL" matches the three kinds' `try_` statements.
    assert_eq!(lock_calls_after - lock_calls_before, 1750);
    assert_eq!(
        permit_wal_after - permit_wal_before,
        0,
        "permit refusals wrote WAL"
    );
    assert_eq!(lock_wal_after - lock_wal_before, 0, "refusals wrote WAL");
    assert!(permit_wal_before > 0, "the grants themselves write WAL");
    let (rw_calls_before, rw_wal_before) = calls_and_wal(&before, "acquire_rw");
    let (rw_calls_after, rw_wal_after) = calls_and_wal(&after, "acquire_rw");
    assert_eq!(rw_calls_after - rw_calls_before, 750);
    assert_eq!(
        rw_wal_after - rw_wal_before,
        0,
        "reader-writer refusals wrote WAL"
    );
    for grant in [reader, writer] {
        assert!(grant.expect("a free name").release().await.unwrap());
    }
    for permit in held {
        assert!(permit.release().await.unwrap());
    }
    assert!(lock.release().await.unwrap());
    store.close().await.unwrap();
    schema.drop().await;
}

/// The seven refusals of `refused_permits_write_no_wal`, by `owner`: every
/// permit held, another count, a lock's name, a semaphore's name as a lock;
/// a writer beside a reader, a reader beside a writer (the statement's own
/// read), a reader of a lock's name (the function's decision).
async fn refuse_every_way(store: &PgStore, owner: &str) {
    let full = store.try_acquire_permit("pool", 2, owner, TTL).await;
    assert!(full.unwrap().is_none());
    let mismatch = store.try_acquire_permit("pool", 3, owner, TTL).await;
    assert!(matches!(mismatch, Err(Error::PermitsMismatch { .. })));
    let on_a_lock = store.try_acquire_permit("locked", 2, owner, TTL).await;
    assert!(matches!(on_a_lock, Err(Error::HeldAsOtherKind { .. })));
    let as_a_lock = store.try_lock("pool", owner, TTL).await;
    assert!(matches!(as_a_lock, Err(Error::HeldAsOtherKind { .. })));
    let beside_a_reader = store.try_write_lock("read", owner, TTL).await;
    assert!(beside_a_reader.unwrap().is_none());
    let beside_a_writer = store.try_read_lock("written", owner, TTL).await;
    assert!(beside_a_writer.unwrap().is_none());
    let rw_of_a_lock = store.try_read_lock("locked", owner, TTL).await;
    assert!(matches!(rw_of_a_lock, Err(Error::HeldAsOtherKind { .. })));
}

/// Both permits of "pool" (of 2), held.
async fn both_permits_held(store: &PgStore) -> Vec<Box<dyn alkstore_core::Lock>> {
    let mut held = Vec::new();
    for owner in ["a", "b"] {
        let permit = store.try_acquire_permit("pool", 2, owner, TTL).await;
        held.push(permit.unwrap().expect("a free permit"));
    }
    held
}

/// Acquire, renew, release, a refusal and holder are one round trip each,
/// a permit's acquire, refusal, renew and release too,
/// counted on the wire through a proxy (after a warm-up, so that statement
/// preparation is cached as in steady state).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_round_trip_per_operation() {
    let Some(server) = alkstore_testkit::pg::server() else {
        return;
    };
    let (url, flights) = alkstore_testkit::wire::through_proxy(&server.url).await;
    let schema = alkstore_testkit::pg::unique_schema("trips");
    let store = PgStore::connect(&url, &schema).await.unwrap();
    let measure = |f: &alkstore_testkit::wire::Flights| f.count();
    // Warm-up: every statement prepared once on the pool's connection.
    for _ in 0..3 {
        let lock = store.try_lock("warm", "a", TTL).await.unwrap().unwrap();
        assert!(store.try_lock("warm", "b", TTL).await.unwrap().is_none());
        assert!(lock.renew(TTL).await.unwrap());
        store.holder("warm").await.unwrap();
        assert!(lock.release().await.unwrap());
    }
    let mut trips = Vec::new();
    for _ in 0..20 {
        let t0 = measure(&flights);
        let lock = store.try_lock("job", "a", TTL).await.unwrap().unwrap();
        let t1 = measure(&flights);
        assert!(store.try_lock("job", "b", TTL).await.unwrap().is_none());
        let t2 = measure(&flights);
        assert!(lock.renew(TTL).await.unwrap());
        let t3 = measure(&flights);
        store.holder("job").await.unwrap().unwrap();
        let t4 = measure(&flights);
        assert!(lock.release().await.unwrap());
        let t5 = measure(&flights);
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
    store.drop_schema().await.unwrap();
    store.close().await.unwrap();
}

/// Fences keep rising across stores and reconnects (a new pool each time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_rise_across_reconnects() {
    let Some((store, schema)) = common::store("reconnect").await else {
        return;
    };
    store.close().await.unwrap();
    opening::fences_rise_across_reconnects(|| async {
        Ok(Arc::new(PgStore::connect(&schema.url, &schema.name).await?) as Arc<dyn Store>)
    })
    .await;
    schema.drop().await;
}

/// Random schema names (quotes, NUL, control characters, 10 KB strings, SQL
/// fragments): never a panic; an invalid name is refused before connecting
/// (`InvalidName`/`ReservedName`); a valid one opens a schema of exactly that
/// name and nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_schema_names_are_refused_or_used_verbatim() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let Some(server) = alkstore_testkit::pg::server() else {
        return;
    };
    let runtime = tokio::runtime::Handle::current();
    let names = prop_oneof![
        "[a-z\"'; \\-\\\\]{1,20}",
        "[\\x00-\\x1f]{1,3}[a-z]{0,5}",
        Just("a\"; DROP TABLE x; --".to_owned()),
        Just("pg_temp_evil".to_owned()),
        (0usize..3).prop_map(|n| "s".repeat([63, 64, 10 * 1024][n])),
        "\\PC{1,30}",
    ];
    let mut runner = TestRunner::new(Config {
        cases: 40,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&names, |raw| {
        tokio::task::block_in_place(|| {
            runtime.block_on(async {
                // A numeric suffix keeps a valid name off existing schemas
                // (a generated "public" must not be dropped).
                let name = if raw.len() < 50 {
                    format!("{raw}{}", std::process::id())
                } else {
                    raw.clone()
                };
                let valid = !name.is_empty()
                    && name.len() <= 63
                    && !name.chars().any(char::is_control)
                    && name.chars().any(|c| !c.is_whitespace())
                    && !name.starts_with("pg_");
                match PgStore::connect(&server.url, &name).await {
                    Ok(store) => {
                        prop_assert!(valid, "accepted {:?}", name);
                        let (count,): (i64,) =
                            sqlx::query_as("SELECT count(*) FROM pg_namespace WHERE nspname = $1")
                                .bind(&name)
                                .fetch_one(store.pool())
                                .await
                                .unwrap();
                        prop_assert_eq!(count, 1);
                        store.drop_schema().await.unwrap();
                        store.close().await.unwrap();
                    }
                    Err(Error::InvalidName { field, .. }) => {
                        prop_assert!(!valid, "refused {:?}", name);
                        prop_assert_eq!(field, Field::Schema);
                    }
                    Err(Error::ReservedName { .. }) => prop_assert!(name.starts_with("pg_")),
                    Err(other) => prop_assert!(false, "{:?}: {:?}", name, other),
                }
                Ok(())
            })
        })
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
}

/// A waiting acquire behind a table lock (`ACCESS EXCLUSIVE`, as DDL or a
/// `LOCK TABLE` takes) keeps to its wait: the statement takes no lock on
/// the table before the acquire function has bounded its lock waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_acquire_behind_a_table_lock_keeps_to_its_wait() {
    use sqlx::Connection;
    let Some((store, schema)) = common::store("tablelock").await else {
        return;
    };
    let mut admin = sqlx::PgConnection::connect(&schema.url).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "BEGIN; LOCK TABLE {}.locks IN ACCESS EXCLUSIVE MODE",
        common::quoted_schema(&store)
    )))
    .execute(&mut admin)
    .await
    .unwrap();
    assert_waits_out_a_table_lock(
        &store,
        "the waiting acquire overran its wait behind the table lock",
        async {
            sqlx::raw_sql("ROLLBACK").execute(&mut admin).await.unwrap();
        },
    )
    .await;
    let _ = admin.close().await;
    store.drop_schema().await.unwrap();
    store.close().await.unwrap();
}

/// A server that refuses the connection is answered at once (not after the
/// pool's 10 s timeout), with its cause and where the connection went, and
/// no password; so are a wrong password and a missing database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_connect_answers_at_once_with_its_cause() {
    let connect = |url: String| async move {
        Ok(Arc::new(PgStore::connect(&url, "s").await?) as Arc<dyn Store>)
    };
    let refused = "postgres://u:pw-secret@127.0.0.1:1/x";
    let Some(server) = alkstore_testkit::pg::server() else {
        opening::a_failed_connect_answers_at_once_with_its_cause(connect, refused, None).await;
        return;
    };
    let mut url = url::Url::parse(&server.url).unwrap();
    url.set_password(Some("not-the-password")).unwrap();
    let wrong = (url.to_string(), "password authentication failed");
    opening::a_failed_connect_answers_at_once_with_its_cause(connect, refused, Some(wrong)).await;
    let mut url = url::Url::parse(&server.url).unwrap();
    url.set_path("no_such_database");
    let text = error_chain(&PgStore::connect(url.as_str(), "s").await.unwrap_err());
    assert!(text.contains("no_such_database\" does not exist"), "{text}");
}

/// A store of layout 3 (whose acquire function keyed its per-name lock on
/// the name alone) is upgraded in place when opened: the function replaced,
/// the version recorded, the fences kept rising.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layout_3_is_upgraded_in_place() {
    let Some((store, schema)) = common::store("upgrade3").await else {
        return;
    };
    let s = common::quoted_schema(&store);
    let lock = store.try_lock("job", "a", TTL).await.unwrap().unwrap();
    let before = lock.fence();
    assert!(lock.release().await.unwrap());
    // Back to layout 3: its function's lock class, its version.
    let (definition,): (String,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT pg_get_functiondef('{}.acquire'::regproc)",
        s.replace('\'', "''")
    )))
    .fetch_one(store.pool())
    .await
    .unwrap();
    let old = with_layout_3_lock_class(&definition);
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "{old}; UPDATE {s}.meta SET value = 3 WHERE key = 'schema_version'"
    )))
    .execute(store.pool())
    .await
    .unwrap();
    store.close().await.unwrap();

    let reopened = schema.reopened().await;
    let (upgraded,): (String,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT pg_get_functiondef('{}.acquire'::regproc)",
        s.replace('\'', "''")
    )))
    .fetch_one(reopened.pool())
    .await
    .unwrap();
    assert!(
        !upgraded.contains("1634495334"),
        "the old function is still there"
    );
    let after = reopened.try_lock("job", "a", TTL).await.unwrap().unwrap();
    assert!(after.fence() > before);
    assert!(after.release().await.unwrap());
    reopened.drop_schema().await.unwrap();
    reopened.close().await.unwrap();
}

/// A store of layout 6 (no semaphores: no `permits` table, no
/// `acquire_permit`, and an acquire function answering three columns) is
/// upgraded in place when opened: the table and both functions made, the
/// version recorded, a live lock and the fences kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layout_6_is_upgraded_in_place_with_semaphores() {
    let Some((store, schema)) = common::store("upgrade6").await else {
        return;
    };
    let s = common::quoted_schema(&store);
    let held = store.try_lock("held", "a", TTL).await.unwrap().unwrap();
    // Back to layout 6's objects: an acquire function of its shape (three
    // columns; its body does not matter here), no semaphore objects.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP FUNCTION {s}.acquire_permit;
         DROP TABLE {s}.permits;
         DROP FUNCTION {s}.acquire;
         CREATE FUNCTION {s}.acquire(p_name text, p_owner text, p_ttl bigint, p_wait_ms integer)
         RETURNS TABLE (granted boolean, fence bigint, expires_in_ms bigint)
         LANGUAGE sql AS 'SELECT false, 0::bigint, 0::bigint';
         UPDATE {s}.meta SET value = 6 WHERE key = 'schema_version'"
    )))
    .execute(store.pool())
    .await
    .unwrap();
    held.let_lapse();
    store.close().await.unwrap();

    let reopened = schema.reopened().await;
    let holder = reopened.holder("held").await.unwrap().expect("still held");
    assert_eq!(holder.owner, "a");
    let permit = reopened
        .try_acquire_permit("pool", 2, "b", TTL)
        .await
        .unwrap()
        .expect("a permit after the upgrade");
    assert!(permit.fence() > holder.fence);
    // The lock function is this layout's: it refuses a semaphore's name.
    let clash = reopened.try_lock("pool", "c", TTL).await;
    assert!(
        matches!(clash, Err(alkstore_core::Error::HeldAsOtherKind { .. })),
        "{clash:?}"
    );
    assert!(permit.release().await.unwrap());
    reopened.drop_schema().await.unwrap();
    reopened.close().await.unwrap();
}

/// A store of layout 9 (no queues: no `tickets` table or `ticket_numbers`
/// sequence, and acquire functions of other arguments) is upgraded in
/// place when opened: the old functions dropped, not left beside the new
/// ones as overloads, the queue's objects made, and a waiting call queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layout_9_is_upgraded_in_place_with_queues() {
    let Some((store, schema)) = common::store("upgrade9").await else {
        return;
    };
    let s = common::quoted_schema(&store);
    let held = store.try_lock("held", "a", TTL).await.unwrap().unwrap();
    // Back to layout 9's objects: functions of its arguments (their
    // bodies do not matter here), no queue.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP FUNCTION {s}.acquire; DROP FUNCTION {s}.acquire_permit; DROP FUNCTION {s}.acquire_rw;
         DROP TABLE {s}.tickets; DROP SEQUENCE {s}.ticket_numbers;
         CREATE FUNCTION {s}.acquire(p_name text, p_owner text, p_ttl bigint, p_wait_ms integer)
         RETURNS TABLE (granted boolean, fence bigint, expires_in_ms bigint,
                        held_as_semaphore integer)
         LANGUAGE sql AS 'SELECT false, 0::bigint, 0::bigint, NULL::integer';
         CREATE FUNCTION {s}.acquire_permit(p_name text, p_permits integer, p_owner text,
             p_ttl bigint, p_wait_ms integer)
         RETURNS TABLE (outcome text, fence bigint, slot integer, expires_in_ms bigint,
                        live_permits integer)
         LANGUAGE sql AS 'SELECT ''held'', 0::bigint, 0, 0::bigint, 0';
         CREATE FUNCTION {s}.acquire_rw(p_name text, p_write boolean, p_owner text,
             p_ttl bigint, p_intent_ms bigint, p_wait_ms integer)
         RETURNS TABLE (outcome text, fence bigint, slot integer, expires_in_ms bigint,
                        semaphore_permits integer)
         LANGUAGE sql AS 'SELECT ''held'', 0::bigint, 0, 0::bigint, 0';
         UPDATE {s}.meta SET value = 9 WHERE key = 'schema_version'"
    )))
    .execute(store.pool())
    .await
    .unwrap();

    let reopened = Arc::new(schema.reopened().await);
    let (functions,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM pg_proc
         WHERE pronamespace = '{}'::regnamespace
           AND proname IN ('acquire', 'acquire_permit', 'acquire_rw')",
        s.replace('\'', "''")
    )))
    .fetch_one(reopened.pool())
    .await
    .unwrap();
    assert_eq!(functions, 3, "one function of each, no overloads left");
    support::queues_and_grants_in_turn(reopened.clone(), "held", held).await;
    store.close().await.unwrap();
    reopened.drop_schema().await.unwrap();
    reopened.close().await.unwrap();
}

/// The function definition with layout 3's lock class (0x616c6b66, "alkf")
/// in place of this layout's per-schema class.
fn with_layout_3_lock_class(definition: &str) -> String {
    let marker = "pg_advisory_xact_lock(";
    let start = definition.find(marker).expect("the advisory lock") + marker.len();
    let end = start + definition[start..].find(',').expect("two arguments");
    format!("{}1634495334{}", &definition[..start], &definition[end..])
}

/// A late renewal on PostgreSQL: a transaction begun before the expiry,
/// whose `now()` stays put, renews after it.
struct LateRenewal {
    conn: sqlx::PgConnection,
    schema: String,
}

#[async_trait::async_trait]
impl faults::LateRenewal for LateRenewal {
    async fn before_expiry(&mut self, _: &str, _: bool) {
        sqlx::raw_sql("BEGIN; SELECT now()")
            .execute(&mut self.conn)
            .await
            .unwrap();
    }

    async fn renew(&mut self, name: &str, permit: bool, fence: u64) -> u64 {
        const NOW: &str = "floor(extract(epoch FROM now()) * 1000)::bigint";
        let table = if permit { "permits" } else { "locks" };
        let s = &self.schema;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {s}.{table} SET expires_at = {NOW} + 60000
             WHERE name = $1 AND owner = 'a' AND fence = $2 AND expires_at > {NOW}"
        )))
        .bind(name)
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
    let Some((store, schema)) = common::store("laterenew").await else {
        return;
    };
    let quoted = common::quoted_schema(&store);
    let store: Arc<dyn Store> = Arc::new(store);
    let url = schema.url.clone();
    faults::a_late_renewal_never_brings_the_other_kind_back(store.clone(), || async {
        LateRenewal {
            conn: sqlx::PgConnection::connect(&url).await.unwrap(),
            schema: quoted.clone(),
        }
    })
    .await;
    store.close().await.unwrap();
    schema.drop().await;
}

/// A store of layout 8 (rows that do not say which timeline granted them,
/// no fence-drawing function) is upgraded in place when opened by another
/// store while the first holds grants: the rows already there are taken as
/// this timeline's (what layout 8 did), so that the grants stay renewable
/// and are given back to their owners with their fences — a layout 4 row
/// (a fence below 2^44) too: an upgrade ends no lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layout_8_is_upgraded_in_place_with_epochs() {
    let Some((store, schema)) = common::store("upgrade8").await else {
        return;
    };
    let s = common::quoted_schema(&store);
    let held = store.try_lock("held", "a", TTL).await.unwrap().unwrap();
    let permit = store
        .try_acquire_permit("pool", 2, "b", TTL)
        .await
        .unwrap()
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "ALTER TABLE {s}.locks DROP COLUMN epoch;
         ALTER TABLE {s}.permits DROP COLUMN epoch;
         DROP FUNCTION {s}.draw_fence;
         INSERT INTO {s}.locks VALUES ('layout4', 'old', 5, 9999999999999);
         UPDATE {s}.meta SET value = 8 WHERE key = 'schema_version'"
    )))
    .execute(store.pool())
    .await
    .unwrap();

    let reopened = schema.reopened().await;
    assert!(held.renew(TTL).await.unwrap(), "a grant of this timeline");
    assert!(
        permit.renew(TTL).await.unwrap(),
        "a permit of this timeline"
    );
    let again = reopened.try_lock("held", "a", TTL).await.unwrap().unwrap();
    assert_eq!(again.fence(), held.fence(), "given back, not fenced anew");
    let again_permit = reopened
        .try_acquire_permit("pool", 2, "b", TTL)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(again_permit.fence(), permit.fence());
    let old = reopened
        .try_lock("layout4", "old", TTL)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(old.fence(), 5, "a layout 4 row is given back too");
    for lock in [again, again_permit, old] {
        assert!(lock.release().await.unwrap());
    }
    assert!(!held.release().await.unwrap(), "its twin released it");
    assert!(!permit.release().await.unwrap(), "its twin released it");
    store.close().await.unwrap();
    reopened.drop_schema().await.unwrap();
    reopened.close().await.unwrap();
}

/// Renewals asked for at once go to PostgreSQL in one statement per batch
/// (`alkstore.renew_batch` spans, each one statement as
/// `pg_stat_statements` counts them), locks', permits', readers' and
/// writers' alike, two handles of one grant included, names with quotes,
/// backslashes and accents too, and each handle gets its own answer: the
/// grants another store force-released answer `false`, the others `true`,
/// and a renewed lease is extended on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_asked_at_once_go_in_one_statement_and_each_is_answered_alone() {
    use alkstore_contract_suite::spans::{collected, collecting, renewal_batches};
    let Some(server) = alkstore_testkit::pg::server() else {
        return;
    };
    let schema = alkstore_testkit::pg::unique_schema("batch");
    let store = PgStore::connect(&server.url, &schema).await.unwrap();
    let other = PgStore::connect(&server.url, &schema).await.unwrap();
    let owner = alkstore_core::unique_owner("renewer").unwrap();
    let short = Duration::from_secs(15);
    let name = |i: usize| format!("n{i}'\\\"é");
    let locks =
        alkstore_contract_suite::support::renewal_batch_handles(&store, 40, name, &owner, short)
            .await;
    let released: Vec<String> = [0, 10, 20, 30].map(name).to_vec();
    for name in &released {
        other.force_release(name).await.unwrap().unwrap();
    }
    let statements = || async {
        let (calls,): (i64,) = sqlx::query_as(
            "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements
             WHERE query LIKE '%jsonb_to_recordset%' AND query LIKE '%' || $1 || '%'",
        )
        .bind(&schema)
        .fetch_one(store.pool())
        .await
        .unwrap();
        calls
    };
    sqlx::raw_sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(store.pool())
        .await
        .unwrap();
    let before = statements().await;
    let (subscriber, spans, _) = collecting();
    let renewals = futures::future::join_all(locks.iter().map(|lock| lock.renew(TTL)));
    let answers = collected(renewals, &subscriber).await;
    for (lock, answer) in locks.iter().zip(answers) {
        let expected = !released.iter().any(|r| r == lock.name());
        assert_eq!(answer.unwrap(), expected, "{}", lock.name());
    }
    let batches = renewal_batches(&spans.take());
    assert_eq!(batches.iter().sum::<usize>(), locks.len(), "{batches:?}");
    // The first renewal may go alone, at once; the rest wait for a beat.
    assert!(batches.len() <= 3, "{batches:?}");
    assert_eq!(
        statements().await - before,
        batches.len() as i64,
        "{batches:?}"
    );
    // Extended on the server: live well past the lease they had.
    let (live,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT (SELECT count(*) FROM \"{schema}\".locks
                 WHERE expires_at > floor(extract(epoch FROM now()) * 1000) + 20000)
              + (SELECT count(*) FROM \"{schema}\".permits
                 WHERE expires_at > floor(extract(epoch FROM now()) * 1000) + 20000)"
    )))
    .fetch_one(store.pool())
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
    store.drop_schema().await.unwrap();
}

/// A batch never waits for a row another transaction holds: that grant is
/// renewed alone (waiting, as a renewal always did), and the rest of its
/// batch is answered while the row is still held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_row_holds_up_no_other_renewal_of_its_batch() {
    use sqlx::Connection;
    let Some(server) = alkstore_testkit::pg::server() else {
        return;
    };
    let schema = alkstore_testkit::pg::unique_schema("busy");
    let store = PgStore::connect(&server.url, &schema).await.unwrap();
    let owner = alkstore_core::unique_owner("renewer").unwrap();
    let mut locks = Vec::new();
    for i in 0..10 {
        let lock = store.try_lock(&format!("b{i}"), &owner, TTL).await;
        locks.push(lock.unwrap().expect("a free name"));
    }
    let mut admin = sqlx::PgConnection::connect(&server.url).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "BEGIN; SELECT 1 FROM \"{schema}\".locks WHERE name = 'b1' FOR UPDATE"
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
    store.drop_schema().await.unwrap();
}
