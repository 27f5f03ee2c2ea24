//! The PostgreSQL figures and their floors.

use std::sync::Arc;
use std::time::Duration;

use alkstore_core::Store;
use alkstore_postgres::PgStore;
use sqlx::postgres::{PgConnection, PgPoolOptions};
use sqlx::{Connection, PgPool};

use crate::contention::{self, Contended};
use crate::measure::timed;
use crate::ops;
use crate::report::Row;

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

pub async fn run(
    url: &str,
    rows: &mut Vec<Row>,
    contended: &mut Vec<(&'static str, Contended)>,
) -> Vec<(usize, f64)> {
    let schema = format!("bench_{}", std::process::id());
    eprintln!("bench: postgres floors");
    let mut bare = PgConnection::connect(url).await.unwrap();
    sqlx::query("CREATE TABLE IF NOT EXISTS bench_raw (name text PRIMARY KEY)")
        .execute(&mut bare)
        .await
        .unwrap();
    let _ = sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(&mut bare)
        .await;
    let select_bare = Row::time(
        ENGINE,
        "SELECT 1 (bare connection)",
        timed!(ITERATIONS, {
            sqlx::query("SELECT 1").execute(&mut bare).await.unwrap();
        }),
    );
    let pair_bare = Row::time(
        ENGINE,
        "raw insert+delete (bare connection)",
        timed!(ITERATIONS, {
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
        }),
    );
    let advisory = Row::time(
        ENGINE,
        "advisory lock+unlock (bare, no TTL, no WAL)",
        timed!(ITERATIONS, {
            sqlx::query("SELECT pg_try_advisory_lock(42)")
                .execute(&mut bare)
                .await
                .unwrap();
            sqlx::query("SELECT pg_advisory_unlock(42)")
                .execute(&mut bare)
                .await
                .unwrap();
        }),
    );
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await
        .unwrap();
    let select_pooled = Row::time(
        ENGINE,
        "SELECT 1 (sqlx pool of 1)",
        timed!(ITERATIONS, {
            sqlx::query("SELECT 1").execute(&pool).await.unwrap();
        }),
    );
    let pair_pooled = Row::time(
        ENGINE,
        "raw insert+delete (sqlx pool of 1)",
        timed!(ITERATIONS, {
            sqlx::query("INSERT INTO bench_raw (name) VALUES ($1) ON CONFLICT DO NOTHING")
                .bind("x")
                .execute(&pool)
                .await
                .unwrap();
            sqlx::query("DELETE FROM bench_raw WHERE name = $1")
                .bind("x")
                .execute(&pool)
                .await
                .unwrap();
        }),
    );
    rows.extend([
        select_bare.clone(),
        select_pooled.clone(),
        pair_bare.clone(),
        pair_pooled.clone(),
        advisory.clone(),
    ]);

    eprintln!("bench: postgres alkstore");
    let store = Arc::new(PgStore::connect(url, &schema).await.unwrap());
    let dyn_store: Arc<dyn Store> = store.clone();
    let store_ref = dyn_store.as_ref();
    let cycle = Row::time(
        ENGINE,
        "try_lock+release cycle (10 rows)",
        ops::cycle(store_ref, ITERATIONS).await,
    )
    .against(&pair_bare, Some(1.15));
    rows.push(cycle.clone());
    rows.push(
        Row::time(
            ENGINE,
            "  same cycle, against the pooled raw pair",
            cycle_time(&cycle),
        )
        .against(&pair_pooled, Some(1.15)),
    );
    let held = dyn_store
        .try_lock("held", "holder", TTL)
        .await
        .unwrap()
        .unwrap();
    let refused = Row::time(
        ENGINE,
        "refused try_lock (10 rows)",
        ops::refused(store_ref, ITERATIONS).await,
    )
    .against(&select_bare, Some(1.1));
    rows.push(refused);
    let lsn = wal_lsn(&mut bare).await;
    for _ in 0..1000 {
        assert!(
            dyn_store
                .try_lock("held", "other", TTL)
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
    let renew = ops::renew(held.as_ref(), ITERATIONS).await;
    rows.push(Row::time(ENGINE, "renew", renew).against(&pair_bare, None));
    let holder = ops::holder(store_ref, ITERATIONS).await;
    rows.push(Row::time(ENGINE, "holder", holder).against(&select_bare, None));

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
                .against(&select_bare, Some(1.1)),
        );
    }
    held.release().await.unwrap();

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
        let [p50, p99] = Row::handoffs(ENGINE, &run);
        // A handoff is two write round trips at best: the release, then the
        // waiter's grant; the raw insert+delete pair is exactly that.
        rows.push(p50.against(&pair_bare, Some(1.0)));
        rows.push(p99);
        curve.push((tasks, run.grants_per_sec));
        contended.push((ENGINE, run));
    }
    let many = contention::many_names(dyn_store.clone(), "many", 64, Duration::from_secs(3)).await;
    rows.push(Row::rate(ENGINE, "64 tasks on 64 names: cycles", many));
    store.drop_schema().await.unwrap();
    store.close().await.unwrap();
    curve
}

fn cycle_time(cycle: &Row) -> Duration {
    Duration::from_secs_f64(cycle.value / 1e6)
}
