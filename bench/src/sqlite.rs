//! The SQLite figures and their floors.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use alkstore_core::Store;
use alkstore_core::{Attempt, GrantKey};
use alkstore_sqlite::{SqliteStore, unbridged};
use rusqlite::Connection;

use crate::Collected;
use crate::contention;
use crate::measure::{RUNS, Rounds, in_turn, longest_poll, percentile};
use crate::ops;
use crate::report::Row;
use crate::{held, many, permits, rwlock};

const ENGINE: &str = "sqlite";
const TTL: Duration = Duration::from_secs(30);
const ITERATIONS: u32 = 5000;

fn raw_connection(path: &Path) -> Connection {
    let conn = Connection::open(path).unwrap();
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;
         CREATE TABLE IF NOT EXISTS raw (name TEXT PRIMARY KEY) WITHOUT ROWID;",
    )
    .unwrap();
    conn
}

/// The raw pair on `name`, a synced insert and an unsynced delete: true
/// when the insert took the name (another task may hold it).
fn raw_pair(conn: &Connection, name: &str) -> bool {
    conn.prepare_cached("PRAGMA synchronous = FULL")
        .unwrap()
        .execute([])
        .unwrap();
    let took = conn
        .prepare_cached("INSERT OR IGNORE INTO raw (name) VALUES (?1)")
        .unwrap()
        .execute([name])
        .unwrap()
        == 1;
    conn.prepare_cached("PRAGMA synchronous = NORMAL")
        .unwrap()
        .execute([])
        .unwrap();
    if took {
        conn.prepare_cached("DELETE FROM raw WHERE name = ?1")
            .unwrap()
            .execute([name])
            .unwrap();
    }
    took
}

/// Adds `n` live rows of other names to the store's table.
fn fill(path: &Path, from: u64, n: u64) {
    let conn = Connection::open(path).unwrap();
    conn.busy_timeout(Duration::from_secs(30)).unwrap();
    conn.execute(
        "WITH RECURSIVE c(x) AS (SELECT ?1 UNION ALL SELECT x + 1 FROM c WHERE x < ?2)
         INSERT INTO alkstore_locks (name, owner, fence, expires_at)
         SELECT 'fill-' || x, 'filler', 0, 9000000000000000 FROM c",
        rusqlite::params![from as i64, (from + n - 1) as i64],
    )
    .unwrap();
}

/// One alkstore cycle (acquire, then release) with the engine's own row
/// code run directly on a rusqlite connection on this thread, no bridge: what
/// the engine's SQL costs by itself.
fn engine_cycle(conn: &mut Connection) {
    let fence = match unbridged::acquire(conn, "cycle", "me", 60_000).unwrap() {
        Attempt::Granted { fence, .. } => fence,
        other => panic!("the cycle name is free; saw {other:?}"),
    };
    let grant = GrantKey {
        name: "cycle".into(),
        owner: "me".into(),
        fence,
        permit: None,
        access: None,
    };
    assert!(unbridged::release(conn, &grant).unwrap());
}

pub async fn run(dir: &Path, collected: &mut Collected) -> Vec<(usize, f64)> {
    let (rows, contended, semaphores, renewals) = collected.parts();
    eprintln!("bench: sqlite floors and operations, alternating");
    let raw = raw_connection(&dir.join("raw.db"));
    let mut insert = raw
        .prepare_cached("INSERT OR IGNORE INTO raw (name) VALUES (?1)")
        .unwrap();
    let mut delete = raw
        .prepare_cached("DELETE FROM raw WHERE name = ?1")
        .unwrap();
    let mut select = raw
        .prepare_cached("SELECT name FROM raw WHERE name = ?1")
        .unwrap();
    // The engine's sync settings: a synced grant, an unsynced release.
    let mut synced = raw.prepare_cached("PRAGMA synchronous = FULL").unwrap();
    let mut unsynced = raw.prepare_cached("PRAGMA synchronous = NORMAL").unwrap();
    insert.execute(["held"]).unwrap();
    let mut engine_conn = Connection::open(dir.join("engine-sql.db")).unwrap();
    unbridged::prepare(&mut engine_conn).unwrap();
    let db = dir.join("locks.db");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&db).await.unwrap());
    let held = store
        .try_lock(ops::HELD, "holder", ops::HELD_TTL)
        .await
        .unwrap()
        .unwrap();
    let mut rounds = Rounds::<7>::default();
    // A B A B …; the first round warms up and is not counted.
    for round in 0..=RUNS {
        let round_times = in_turn!(
            round,
            ITERATIONS,
            [
                {
                    synced.execute([]).unwrap();
                    insert.execute(["x"]).unwrap();
                    unsynced.execute([]).unwrap();
                    delete.execute(["x"]).unwrap();
                },
                {
                    let _: Option<String> = select.query_row(["held"], |r| r.get(0)).ok();
                },
                {
                    engine_cycle(&mut engine_conn);
                },
                { ops::one_cycle(store.as_ref()).await },
                { ops::one_refusal(store.as_ref()).await },
                { ops::one_renewal(held.as_ref()).await },
                { ops::one_holder(store.as_ref()).await },
            ]
        );
        rounds.record(round, round_times);
    }
    drop((insert, delete, select, synced, unsynced));
    let [pair, read, engine_sql, cycle, refused, renew, holder] = rounds.medians();
    let pair = Row::time(
        ENGINE,
        "raw synced insert + unsynced delete (rusqlite, same thread)",
        pair,
    );
    let read = Row::time(ENGINE, "raw point SELECT (rusqlite, same thread)", read);
    let cycle =
        Row::time(ENGINE, "try_lock+release cycle (10 rows)", cycle).against(&pair, Some(1.5));
    rows.extend([
        pair.clone(),
        read.clone(),
        Row::time(
            ENGINE,
            "engine's cycle SQL (rusqlite, same thread, no bridge)",
            engine_sql,
        )
        .against(&pair, None),
        cycle.clone(),
        Row::time(ENGINE, "refused try_lock (10 rows)", refused).against(&read, None),
        Row::time(ENGINE, "renew", renew).against(&pair, None),
        Row::time(ENGINE, "holder", holder).against(&read, None),
    ]);
    let semaphore = permits::run(ENGINE, store.clone(), ITERATIONS, &pair, rows).await;
    rwlock::run(ENGINE, store.clone(), ITERATIONS, &pair, rows).await;
    semaphores.push((ENGINE, semaphore));
    let mut holds = Vec::with_capacity(3 * ITERATIONS as usize);
    for _ in 0..ITERATIONS {
        let (lock, took) = longest_poll(store.try_lock("cycle", "me", TTL)).await;
        holds.push(took);
        let (_, took) = longest_poll(lock.unwrap().unwrap().release()).await;
        holds.push(took);
        let (_, took) = longest_poll(store.try_lock(ops::HELD, "other", TTL)).await;
        holds.push(took);
    }
    for p in [99.0, 100.0] {
        rows.push(Row::time(
            ENGINE,
            format!(
                "longest stretch a call holds a tokio worker, {} (cycles, refusals)",
                if p == 100.0 {
                    "max".to_owned()
                } else {
                    format!("p{p}")
                }
            ),
            percentile(&mut holds, p),
        ));
    }

    // Cost against table size.
    let mut filled = 10;
    for size in [100_000u64, 1_000_000] {
        fill(&db, filled, size - filled);
        filled = size;
        let cycle_n = ops::cycle(store.as_ref(), ITERATIONS).await;
        rows.push(
            Row::time(
                ENGINE,
                format!("try_lock+release cycle ({size} rows)"),
                cycle_n,
            )
            .against(&cycle, Some(1.1)),
        );
        let refused_n = ops::refused(store.as_ref(), ITERATIONS).await;
        rows.push(
            Row::time(ENGINE, format!("refused try_lock ({size} rows)"), refused_n)
                .against(&read, None),
        );
    }
    held.release().await.unwrap();

    eprintln!("bench: sqlite contention");
    let uncontended = Row::rate(ENGINE, "uncontended cycle rate (1 task)", 1e6 / cycle.value);
    rows.push(uncontended.clone());
    let mut curve = vec![(1, uncontended.value)];
    for tasks in [16, 64] {
        let run = contention::one_name(
            store.clone(),
            &format!("contended-{tasks}"),
            tasks,
            Duration::from_secs(3),
        )
        .await;
        rows.push(
            Row::rate(
                ENGINE,
                format!("{tasks} waiters on one name: grants"),
                run.grants_per_sec,
            )
            .against(&uncontended, if tasks == 16 { Some(1.25) } else { None }),
        );
        rows.extend(Row::handoffs(ENGINE, &run));
        curve.push((tasks, run.grants_per_sec));
        contended.push((ENGINE, run));
    }
    // The raw pair at the same concurrency: one connection (SQLite has one
    // writer), the engine's sync settings, on the calling worker.
    let raw = Arc::new(Mutex::new(raw_connection(&dir.join("many-raw.db"))));
    rows.extend(
        many::run(ENGINE, store.clone(), move |_, name| {
            let raw = raw.clone();
            async move {
                // A pair never waits, so its task would never yield (and
                // the run's timer never fire): spend tokio's budget, as the
                // store's calls do.
                tokio::task::consume_budget().await;
                raw_pair(&raw.lock().unwrap(), &name)
            }
        })
        .await,
    );
    renewals.push((ENGINE, held::run(ENGINE, db.to_str().unwrap(), rows).await));

    eprintln!("bench: sqlite two processes on one file");
    let child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args(["sqlite-child", db.to_str().unwrap(), "3"])
        .output();
    let here = contention::one_name(store.clone(), "two-processes", 8, Duration::from_secs(3));
    let (child, here) = tokio::join!(child, here);
    let child: f64 = String::from_utf8_lossy(&child.unwrap().stdout)
        .trim()
        .parse()
        .unwrap_or(0.0);
    rows.push(Row::rate(
        ENGINE,
        "2 processes x 8 waiters on one name: grants",
        here.grants_per_sec + child,
    ));
    store.close().await.unwrap();
    curve
}

/// The second process of the two-process run: 8 waiters for `secs`, prints grants/s.
pub async fn child(db: &str, secs: u64) {
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(db).await.unwrap());
    let run =
        contention::one_name(store.clone(), "two-processes", 8, Duration::from_secs(secs)).await;
    println!("{}", run.grants_per_sec);
    store.close().await.unwrap();
}
