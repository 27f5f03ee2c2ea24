//! The MariaDB/MySQL figures and their floors, measured in alternation.

use std::sync::Arc;
use std::time::Duration;

use alkstore_core::Store;
use alkstore_mysql::{DEFAULT_MAX_CONNECTIONS, MySqlStore};
use sqlx::Connection;
use sqlx::mysql::MySqlConnection;
use sqlx::mysql::MySqlPoolOptions;

use crate::Collected;
use crate::contention;
use crate::measure::{RUNS, Rounds, in_turn, percentile};
use crate::report::Row;
use crate::{held, many, ops, permits, rwlock};

const ENGINE: &str = "mysql";
const ITERATIONS: u32 = 500;
/// A store in `database` whose acquire procedure never checks which server
/// drew the last fence (as layout 2 did): its `SELECT … INTO drawn_by`
/// line made `SET drawn_by = @@server_id;`. Only for measuring what the
/// check costs; the bench drops it after.
async fn without_the_server_check(
    url: &str,
    database: &str,
    bare: &mut MySqlConnection,
) -> MySqlStore {
    let store = MySqlStore::connect(url, database).await.unwrap();
    let quoted = format!("`{}`", database.replace('`', "``"));
    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SHOW CREATE PROCEDURE {quoted}.acquire"
    )))
    .fetch_one(&mut *bare)
    .await
    .unwrap();
    let definition: String = sqlx::Row::get(&row, "Create Procedure");
    let mut replaced = 0;
    let flat: Vec<String> = definition
        .lines()
        .map(|line| {
            match line
                .trim_start()
                .starts_with("SELECT MAX(value) INTO drawn_by")
            {
                true => {
                    replaced += 1;
                    "            SET drawn_by = @@server_id;".to_owned()
                }
                false => line.to_owned(),
            }
        })
        .collect();
    assert_eq!(replaced, 1, "the acquire procedure checks its server once");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "USE {quoted}; DROP PROCEDURE {quoted}.acquire"
    )))
    .execute(&mut *bare)
    .await
    .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(flat.join("\n")))
        .execute(&mut *bare)
        .await
        .unwrap();
    store
}

pub async fn run(url: &str, collected: &mut Collected) -> Vec<(usize, f64)> {
    let (rows, contended, semaphores, renewals) = collected.parts();
    let database = format!("bench_{}", std::process::id());
    let store = Arc::new(MySqlStore::connect(url, &database).await.unwrap());
    let mut bare = MySqlConnection::connect(url).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE `{database}`.bench_raw (name VARBINARY(255) PRIMARY KEY) ENGINE = InnoDB"
    )))
    .execute(&mut bare)
    .await
    .unwrap();
    let insert = format!("INSERT IGNORE INTO `{database}`.bench_raw (name) VALUES (?)");
    let delete = format!("DELETE FROM `{database}`.bench_raw WHERE name = ?");
    let dyn_store: Arc<dyn Store> = store.clone();
    let flat_database = format!("{database}_flat");
    let flat = without_the_server_check(url, &flat_database, &mut bare).await;
    let held = dyn_store
        .try_lock(ops::HELD, "holder", ops::HELD_TTL)
        .await
        .unwrap()
        .unwrap();

    eprintln!("bench: mysql floors and operations, alternating");
    // What a user would write instead of a refused try_lock: one prepared
    // point read of the same row, on a bare connection.
    let point_read =
        format!("SELECT owner, fence, expires_at FROM `{database}`.locks WHERE name = ?");
    let mut rounds = Rounds::<8>::default();
    // The first round warms every statement up and is not counted.
    for round in 0..=RUNS {
        let times = in_turn!(
            round,
            ITERATIONS,
            [
                {
                    sqlx::query("SELECT 1").execute(&mut bare).await.unwrap();
                },
                { ops::one_refusal(dyn_store.as_ref()).await },
                {
                    sqlx::query(sqlx::AssertSqlSafe(insert.clone()))
                        .bind(&b"x"[..])
                        .execute(&mut bare)
                        .await
                        .unwrap();
                    sqlx::query(sqlx::AssertSqlSafe(delete.clone()))
                        .bind(&b"x"[..])
                        .execute(&mut bare)
                        .await
                        .unwrap();
                },
                { ops::one_cycle(dyn_store.as_ref()).await },
                { ops::one_renewal(held.as_ref()).await },
                { ops::one_holder(dyn_store.as_ref()).await },
                { ops::one_cycle(&flat).await },
                {
                    let row = sqlx::query(sqlx::AssertSqlSafe(point_read.as_str()))
                        .bind(ops::HELD.as_bytes())
                        .fetch_optional(&mut bare)
                        .await
                        .unwrap();
                    assert!(row.is_some());
                },
            ]
        );
        rounds.record(round, times);
    }
    let [
        select,
        refused,
        pair,
        cycle_time,
        renew,
        holder,
        flat_cycle,
        point_read,
    ] = rounds.medians();
    let point_read = Row::time(
        ENGINE,
        "raw prepared point read of the lock row (bare connection)",
        point_read,
    );
    let cycle = cycle_time;
    let select = Row::time(ENGINE, "SELECT 1 (bare connection)", select);
    let pair = Row::time(ENGINE, "raw insert+delete (bare connection)", pair);
    let cycle = Row::time(ENGINE, "try_lock+release cycle", cycle).against(&pair, Some(1.0));
    rows.extend([
        select.clone(),
        pair.clone(),
        point_read.clone(),
        cycle.clone(),
    ]);
    // What the check of the server that drew the last fence costs a grant:
    // the same cycle on a store whose procedure skips it.
    let flat_cycle = Row::time(
        ENGINE,
        "try_lock+release cycle, without the server_id check",
        flat_cycle,
    );
    rows.push(flat_cycle.clone());
    rows.push(
        Row::time(
            ENGINE,
            "try_lock+release cycle, with the check (as above)",
            cycle_time,
        )
        .against(&flat_cycle, Some(1.03)),
    );
    rows.push(Row::time(ENGINE, "refused try_lock", refused).against(&select, None));
    rows.push(
        Row::time(ENGINE, "refused try_lock, against the point read", refused)
            .against(&point_read, Some(1.1)),
    );
    rows.push(Row::time(ENGINE, "renew", renew).against(&pair, None));
    rows.push(Row::time(ENGINE, "holder", holder).against(&point_read, None));
    held.release().await.unwrap();

    eprintln!("bench: mysql handoffs (same store, another store)");
    let other: Arc<dyn Store> = Arc::new(MySqlStore::connect(url, &database).await.unwrap());
    let mut same = ops::handoffs(&dyn_store, &dyn_store, "same").await;
    let mut across = ops::handoffs(&dyn_store, &other, "across").await;
    for (label, samples) in [
        ("same store", &mut same),
        ("another store (poll)", &mut across),
    ] {
        rows.push(
            Row::time(
                ENGINE,
                format!("handoff to a waiter on {label}: p50"),
                percentile(samples, 50.0),
            )
            .against(&pair, None),
        );
        rows.push(Row::time(
            ENGINE,
            format!("handoff to a waiter on {label}: p99"),
            percentile(samples, 99.0),
        ));
    }

    eprintln!("bench: mysql contention");
    let uncontended = Row::rate(ENGINE, "uncontended cycle rate (1 task)", 1e6 / cycle.value);
    rows.push(uncontended.clone());
    let mut curve = vec![(1, uncontended.value)];
    let run = contention::one_name(
        dyn_store.clone(),
        "contended-16",
        16,
        Duration::from_secs(3),
    )
    .await;
    rows.push(
        Row::rate(ENGINE, "16 waiters on one name: grants", run.grants_per_sec)
            .against(&uncontended, None),
    );
    let [p50, p99] = Row::handoffs(ENGINE, &run);
    rows.push(p50.against(&pair, None));
    rows.push(p99);
    curve.push((16, run.grants_per_sec));
    contended.push((ENGINE, run));
    let semaphore = permits::run(ENGINE, dyn_store.clone(), ITERATIONS, &pair, rows).await;
    rwlock::run(ENGINE, dyn_store.clone(), ITERATIONS, &pair, rows).await;
    semaphores.push((ENGINE, semaphore));
    // The raw pair at the same concurrency, on a pool as large as the store's.
    let raw_pool = MySqlPoolOptions::new()
        .max_connections(DEFAULT_MAX_CONNECTIONS)
        // No ping before each statement: the store sends none either.
        .test_before_acquire(false)
        .connect(url)
        .await
        .unwrap();
    let (raw_insert, raw_delete) = (Arc::new(insert), Arc::new(delete));
    rows.extend(
        many::run(ENGINE, dyn_store.clone(), move |_, name| {
            let (pool, insert, delete) = (raw_pool.clone(), raw_insert.clone(), raw_delete.clone());
            async move {
                let took = sqlx::query(sqlx::AssertSqlSafe(insert.as_str()))
                    .bind(name.as_bytes())
                    .execute(&pool)
                    .await
                    .unwrap()
                    .rows_affected()
                    == 1;
                if took {
                    sqlx::query(sqlx::AssertSqlSafe(delete.as_str()))
                        .bind(name.as_bytes())
                        .execute(&pool)
                        .await
                        .unwrap();
                }
                took
            }
        })
        .await,
    );
    let location = format!("{url} {database}");
    renewals.push((ENGINE, held::run(ENGINE, &location, rows).await));

    other.close().await.unwrap();
    flat.drop_database().await.unwrap();
    flat.close().await.unwrap();
    store.drop_database().await.unwrap();
    let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS `{database}`"
    )))
    .execute(&mut bare)
    .await;
    store.close().await.unwrap();
    curve
}
