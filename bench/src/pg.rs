//! The PostgreSQL figures and their floors.

use std::sync::Arc;
use std::time::Duration;

use alkstore_core::Store;
use alkstore_postgres::{DEFAULT_MAX_CONNECTIONS, PgStore};
use sqlx::postgres::PgAdvisoryLock;
use sqlx::postgres::{PgConnection, PgPoolOptions};
use sqlx::{Connection, Either, PgPool};

use crate::Collected;
use crate::contention;
use crate::measure::{RUNS, Rounds, in_turn};
use crate::ops;
use crate::report::Row;
use crate::{held, many, permits, rwlock};

const ENGINE: &str = "postgres";
const TTL: Duration = Duration::from_secs(60);
const ITERATIONS: u32 = 1000;

async fn calls_of_acquire(pool: &PgPool, schema: &str) -> i64 {
    sqlx::query_as::<_, (Option<i64>,)>(
        "SELECT sum(calls)::bigint FROM pg_stat_statements WHERE query LIKE '%INSERT INTO%' AND query LIKE '%' || $1 || '%'",
    )
    .bind(format!("\"{schema}\""))
    .fetch_one(pool)
    .await
    .map(|(n,)| n.unwrap_or(0))
    .unwrap_or(-1)
}

async fn wal_lsn(conn: &mut PgConnection) -> String {
    let (lsn,): (String,) = sqlx::query_as("SELECT pg_current_wal_insert_lsn()::text")
        .fetch_one(conn)
        .await
        .unwrap();
    lsn
}

async fn wal_since(conn: &mut PgConnection, lsn: &str) -> i64 {
    let (bytes,): (i64,) =
        sqlx::query_as("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1::pg_lsn)::bigint")
            .bind(lsn)
            .fetch_one(conn)
            .await
            .unwrap();
    bytes
}

/// WAL flushes so far (`pg_stat_wal.wal_sync`, whole cluster), after making
/// this connection report its own pending counts.
async fn wal_syncs(bare: &mut PgConnection) -> i64 {
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(&mut *bare)
        .await
        .unwrap();
    let (syncs,): (i64,) = sqlx::query_as("SELECT wal_sync FROM pg_stat_wal")
        .fetch_one(bare)
        .await
        .unwrap();
    syncs
}

async fn client_backends(bare: &mut PgConnection) -> i64 {
    let (n,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM pg_stat_activity
         WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
    )
    .fetch_one(bare)
    .await
    .unwrap();
    n
}

/// Closes `store` and waits until its backends are gone: a backend reports
/// its WAL counts when it exits (or when idle, at most once a second).
async fn close_and_settle(store: PgStore, bare: &mut PgConnection, others: i64) {
    store.close().await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while client_backends(bare).await > others {
        assert!(
            std::time::Instant::now() < deadline,
            "the store's backends did not exit"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// WAL flushes for 1000 grants (each on a name of its own), then for 1000
/// grants with their releases, each on a store of its own that is closed
/// before counting; run before anything else touches the cluster, so that
/// no other backend holds unreported counts. The difference is the releases'.
async fn wal_flushes(url: &str, schema: &str, bare: &mut PgConnection) -> Vec<(String, i64)> {
    let others = client_backends(bare).await;
    // The schema is created first, outside the counts.
    close_and_settle(PgStore::connect(url, schema).await.unwrap(), bare, others).await;
    let mut counted = Vec::new();
    for release in [false, true] {
        let before = wal_syncs(bare).await;
        let store = PgStore::connect(url, schema).await.unwrap();
        for i in 0..1000 {
            let lock = store
                .try_lock(&format!("flush-{release}-{i}"), "me", TTL)
                .await
                .unwrap()
                .unwrap();
            if release {
                assert!(lock.release().await.unwrap());
            }
        }
        close_and_settle(store, bare, others).await;
        counted.push(wal_syncs(bare).await - before);
    }
    vec![
        (
            "WAL flushes: 1000 grants (whole cluster)".into(),
            counted[0],
        ),
        (
            "WAL flushes: 1000 grants + their releases".into(),
            counted[1],
        ),
        (
            "WAL flushes: 1000 releases (the difference)".into(),
            counted[1] - counted[0],
        ),
    ]
}

/// A store in `schema` whose acquire function draws fences from the
/// sequence alone, without the WAL's timeline (as layout 4 did): the
/// function's `timeline := …;` lines (the grant's and the same owner's
/// take-over's) made `timeline := 0;`. Only for
/// measuring what the timeline read costs; the bench drops it after.
async fn without_the_timeline(url: &str, schema: &str, bare: &mut PgConnection) -> PgStore {
    let store = PgStore::connect(url, schema).await.unwrap();
    let (definition,): (String,) = sqlx::query_as(
        "SELECT pg_get_functiondef(p.oid) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = $1 AND p.proname = 'acquire'",
    )
    .bind(schema)
    .fetch_one(&mut *bare)
    .await
    .unwrap();
    let mut replaced = 0;
    let flat: Vec<String> = definition
        .lines()
        .map(|line| match line.trim_start().starts_with("timeline := ") {
            true => {
                replaced += 1;
                "            timeline := 0;".to_owned()
            }
            false => line.to_owned(),
        })
        .collect();
    assert_eq!(
        replaced, 2,
        "the acquire function reads its timeline in two places"
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(flat.join("\n")))
        .execute(&mut *bare)
        .await
        .unwrap();
    store
}

pub async fn run(url: &str, collected: &mut Collected) -> Vec<(usize, f64)> {
    let (rows, contended, semaphores, renewals) = collected.parts();
    let schema = format!("bench_{}", std::process::id());
    eprintln!("bench: postgres floors and operations, alternating");
    let mut bare = PgConnection::connect(url).await.unwrap();
    sqlx::query("CREATE TABLE IF NOT EXISTS bench_raw (name text PRIMARY KEY)")
        .execute(&mut bare)
        .await
        .unwrap();
    let _ = sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(&mut bare)
        .await;
    let flushes = wal_flushes(url, &schema, &mut bare).await;
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await
        .unwrap();
    let store = Arc::new(PgStore::connect(url, &schema).await.unwrap());
    let dyn_store: Arc<dyn Store> = store.clone();
    let store_ref = dyn_store.as_ref();
    let flat = without_the_timeline(url, &format!("{schema}_flat"), &mut bare).await;
    let held = dyn_store
        .try_lock(ops::HELD, "holder", ops::HELD_TTL)
        .await
        .unwrap()
        .unwrap();
    // The peer: sqlx's own advisory lock, what a Rust user of PostgreSQL
    // reaches for first — no lease, no fence, held by a session.
    let mut peer = PgConnection::connect(url).await.unwrap();
    let mut peer_holder = PgConnection::connect(url).await.unwrap();
    let peer_cycle_lock = PgAdvisoryLock::new("bench-cycle");
    let peer_held_lock = PgAdvisoryLock::new("bench-held");
    let Either::Left(peer_held) = peer_held_lock.try_acquire(&mut peer_holder).await.unwrap()
    else {
        panic!("the peer's held lock is free")
    };
    // The same store, its sessions tracking only top-level statements
    // (pg_stat_statements' default), not every statement inside the
    // acquire function as the harness's cluster does.
    let top_url = format!(
        "{url}{}options[pg_stat_statements.track]=top",
        if url.contains('?') { '&' } else { '?' }
    );
    let top: Arc<dyn Store> = Arc::new(PgStore::connect(&top_url, &schema).await.unwrap());
    let top_held = top
        .try_lock("held-top", "holder", ops::HELD_TTL)
        .await
        .unwrap()
        .unwrap();
    // What a user would write instead of a refused try_lock: one prepared
    // point read of the same row, on a bare connection.
    let point_read =
        format!("SELECT owner, fence, expires_at FROM \"{schema}\".locks WHERE name = $1");
    let mut rounds = Rounds::<14>::default();
    // A B A B …: every figure and its floor share each stretch of the
    // machine's weather; the first round warms every statement up and is
    // not counted.
    for round in 0..=RUNS {
        let round_times = in_turn!(
            round,
            ITERATIONS,
            [
                {
                    sqlx::query("SELECT 1").execute(&mut bare).await.unwrap();
                },
                { ops::one_refusal(store_ref).await },
                {
                    sqlx::query("INSERT INTO bench_raw (name) VALUES ($1) ON CONFLICT DO NOTHING")
                        .bind("x")
                        .execute(&mut bare)
                        .await
                        .unwrap();
                    sqlx::query("DELETE FROM bench_raw WHERE name = $1")
                        .bind("x")
                        .execute(&mut bare)
                        .await
                        .unwrap();
                },
                { ops::one_cycle(store_ref).await },
                {
                    sqlx::query("SELECT pg_try_advisory_lock(42)")
                        .execute(&mut bare)
                        .await
                        .unwrap();
                    sqlx::query("SELECT pg_advisory_unlock(42)")
                        .execute(&mut bare)
                        .await
                        .unwrap();
                },
                { ops::one_renewal(held.as_ref()).await },
                { ops::one_holder(store_ref).await },
                {
                    let Either::Left(guard) = peer_cycle_lock.try_acquire(&mut peer).await.unwrap()
                    else {
                        panic!("the peer's cycle lock is taken")
                    };
                    guard.release_now().await.unwrap();
                },
                {
                    let refused = peer_held_lock.try_acquire(&mut peer).await.unwrap();
                    assert!(matches!(refused, Either::Right(_)));
                },
                { ops::one_cycle(&flat).await },
                {
                    let row = sqlx::query(sqlx::AssertSqlSafe(point_read.as_str()))
                        .bind(ops::HELD)
                        .fetch_optional(&mut bare)
                        .await
                        .unwrap();
                    assert!(row.is_some());
                },
                { ops::one_cycle(top.as_ref()).await },
                { ops::one_refusal(top.as_ref()).await },
                { ops::one_renewal(top_held.as_ref()).await },
            ]
        );
        rounds.record(round, round_times);
    }
    drop(peer_held);
    let [
        select,
        refused,
        pair,
        cycle,
        advisory,
        renew,
        holder,
        peer_cycle,
        peer_refused,
        flat_cycle,
        point_read,
        top_cycle,
        top_refused,
        top_renew,
    ] = rounds.medians();
    let select_bare = Row::time(ENGINE, "SELECT 1 (bare connection)", select);
    let point_read = Row::time(
        ENGINE,
        "raw prepared point read of the lock row (bare connection)",
        point_read,
    );
    let peer_refused_row = Row::time(ENGINE, "peer: sqlx PgAdvisoryLock refused", peer_refused);
    let pair_bare = Row::time(ENGINE, "raw insert+delete (bare connection)", pair);
    let cycle_time = cycle;
    let cycle = Row::time(ENGINE, "try_lock+release cycle (10 rows)", cycle)
        .against(&pair_bare, Some(0.85));
    // What reading the WAL's timeline for each fence costs a grant: the
    // same cycle on a store whose function draws fences without it.
    let flat_cycle = Row::time(
        ENGINE,
        "try_lock+release cycle, fences without the timeline",
        flat_cycle,
    );
    let timeline_cost = Row::time(
        ENGINE,
        "try_lock+release cycle, with the timeline (as above)",
        cycle_time,
    )
    .against(&flat_cycle, Some(1.03));
    rows.extend([
        select_bare.clone(),
        pair_bare.clone(),
        Row::time(
            ENGINE,
            "advisory lock+unlock (bare, no TTL, no WAL)",
            advisory,
        ),
        cycle.clone(),
        flat_cycle,
        timeline_cost,
        point_read.clone(),
        Row::time(ENGINE, "refused try_lock (10 rows)", refused).against(&select_bare, None),
        Row::time(
            ENGINE,
            "refused try_lock (10 rows), against the point read",
            refused,
        )
        .against(&point_read, Some(1.1)),
        Row::time(
            ENGINE,
            "refused try_lock (10 rows), against the peer's",
            refused,
        )
        .against(&peer_refused_row, Some(1.0)),
        Row::time(ENGINE, "renew", renew).against(&pair_bare, None),
        Row::time(ENGINE, "holder", holder).against(&point_read, None),
        Row::time(
            ENGINE,
            "peer: sqlx PgAdvisoryLock try_acquire+release_now",
            peer_cycle,
        )
        .against(&pair_bare, None),
        peer_refused_row.against(&select_bare, None),
        Row::time(ENGINE, "track=top: try_lock+release cycle", top_cycle)
            .against(&pair_bare, Some(0.85)),
        Row::time(ENGINE, "track=top: refused try_lock", top_refused)
            .against(&point_read, Some(1.1)),
        Row::time(ENGINE, "track=top: renew", top_renew).against(&pair_bare, None),
    ]);
    let lsn = wal_lsn(&mut bare).await;
    for _ in 0..1000 {
        assert!(
            dyn_store
                .try_lock(ops::HELD, "other", TTL)
                .await
                .unwrap()
                .is_none()
        );
    }
    let wal = wal_since(&mut bare, &lsn).await;
    rows.push(Row {
        value: wal as f64,
        unit: "B",
        ..Row::rate(
            ENGINE,
            "WAL written by 1000 refused try_locks (whole cluster)",
            0.0,
        )
    });

    for (figure, syncs) in flushes {
        rows.push(Row {
            value: syncs as f64,
            unit: "",
            ..Row::rate(ENGINE, figure, 0.0)
        });
    }

    let mut filled = 10i64;
    for size in [100_000i64, 1_000_000] {
        eprintln!("bench: postgres table of {size} rows");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO \"{schema}\".locks (name, owner, fence, expires_at) \
             SELECT 'fill-' || g, 'filler', nextval('\"{schema}\".fences'), 9000000000000000 \
             FROM generate_series($1::bigint, $2::bigint) g"
        )))
        .bind(filled)
        .bind(size - 1)
        .execute(&mut bare)
        .await
        .unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!("ANALYZE \"{schema}\".locks")))
            .execute(&mut bare)
            .await
            .unwrap();
        filled = size;
        let cycle_n = ops::cycle(store_ref, ITERATIONS).await;
        rows.push(
            Row::time(
                ENGINE,
                format!("try_lock+release cycle ({size} rows)"),
                cycle_n,
            )
            .against(&cycle, Some(1.1)),
        );
        let refused_n = ops::refused(store_ref, ITERATIONS).await;
        rows.push(
            Row::time(ENGINE, format!("refused try_lock ({size} rows)"), refused_n)
                .against(&point_read, Some(1.1)),
        );
    }
    held.release().await.unwrap();
    top_held.release().await.unwrap();
    top.close().await.unwrap();

    eprintln!("bench: postgres contention");
    let uncontended = Row::rate(ENGINE, "uncontended cycle rate (1 task)", 1e6 / cycle.value);
    rows.push(uncontended.clone());
    let mut curve = vec![(1, uncontended.value)];
    for tasks in [16, 64] {
        let before = calls_of_acquire(&pool, &schema).await;
        let run = contention::one_name(
            dyn_store.clone(),
            &format!("contended-{tasks}"),
            tasks,
            Duration::from_secs(3),
        )
        .await;
        let attempts = calls_of_acquire(&pool, &schema).await - before;
        let grants = Row::rate(
            ENGINE,
            format!("{tasks} waiters on one name: grants"),
            run.grants_per_sec,
        );
        rows.push(
            grants
                .clone()
                .against(&uncontended, if tasks == 16 { Some(1.25) } else { None }),
        );
        rows.push(Row::rate(
            ENGINE,
            format!("{tasks} waiters on one name: acquire attempts"),
            attempts as f64 / 3.0,
        ));
        rows.push(Row {
            value: attempts as f64 / (run.grants_per_sec * 3.0),
            unit: "",
            ..Row::rate(ENGINE, format!("{tasks} waiters: attempts per grant"), 0.0)
        });
        let [p50, p99] = Row::handoffs(ENGINE, &run);
        // A handoff is two write round trips at best: the release, then the
        // waiter's grant; the raw insert+delete pair is exactly that.
        rows.push(p50.against(&pair_bare, Some(1.0)));
        rows.push(p99);
        curve.push((tasks, run.grants_per_sec));
        contended.push((ENGINE, run));
    }
    let semaphore = permits::run(ENGINE, dyn_store.clone(), ITERATIONS, &pair_bare, rows).await;
    rwlock::run(ENGINE, dyn_store.clone(), ITERATIONS, &pair_bare, rows).await;
    semaphores.push((ENGINE, semaphore));
    // The raw pair at the same concurrency, on a pool as large as the store's.
    let raw_pool = PgPoolOptions::new()
        .max_connections(DEFAULT_MAX_CONNECTIONS)
        // No ping before each statement: the store sends none either.
        .test_before_acquire(false)
        .connect(url)
        .await
        .unwrap();
    rows.extend(
        many::run(ENGINE, dyn_store.clone(), move |_, name| {
            let pool = raw_pool.clone();
            async move {
                let took =
                    sqlx::query("INSERT INTO bench_raw (name) VALUES ($1) ON CONFLICT DO NOTHING")
                        .bind(&name)
                        .execute(&pool)
                        .await
                        .unwrap()
                        .rows_affected()
                        == 1;
                if took {
                    sqlx::query("DELETE FROM bench_raw WHERE name = $1")
                        .bind(&name)
                        .execute(&pool)
                        .await
                        .unwrap();
                }
                took
            }
        })
        .await,
    );
    let location = format!("{url} {schema}");
    renewals.push((ENGINE, held::run(ENGINE, &location, rows).await));
    store.drop_schema().await.unwrap();
    flat.drop_schema().await.unwrap();
    flat.close().await.unwrap();
    store.close().await.unwrap();
    curve
}
