//! The SQLite figures and their floors.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use alkstore_core::Store;
use alkstore_core::{Attempt, GrantKey};
use alkstore_sqlite::{SqliteStore, unbridged};
use rusqlite::Connection;

use crate::contention::{self, Contended};
use crate::measure::timed;
use crate::ops;
use crate::report::Row;

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
async fn engine_statements_on_one_thread(dir: &Path) -> Row {
    let mut conn = Connection::open(dir.join("engine-sql.db")).unwrap();
    unbridged::prepare(&mut conn).unwrap();
    let took = timed!(ITERATIONS, {
        let fence = match unbridged::acquire(&mut conn, "cycle", "me", 60_000).unwrap() {
            Attempt::Granted { fence, .. } => fence,
            Attempt::Held { .. } => panic!("the cycle name is free"),
        };
        let grant = GrantKey {
            name: "cycle".into(),
            owner: "me".into(),
            fence,
        };
        assert!(unbridged::release(&conn, &grant).unwrap());
    });
    Row::time(
        ENGINE,
        "engine's cycle SQL (rusqlite, same thread, no bridge)",
        took,
    )
}

pub async fn run(
    dir: &Path,
    rows: &mut Vec<Row>,
    contended: &mut Vec<(&'static str, Contended)>,
) -> Vec<(usize, f64)> {
    eprintln!("bench: sqlite floors");
    let raw = raw_connection(&dir.join("raw.db"));
    let mut insert = raw
        .prepare_cached("INSERT OR IGNORE INTO raw (name) VALUES (?1)")
        .unwrap();
    let mut delete = raw
        .prepare_cached("DELETE FROM raw WHERE name = ?1")
        .unwrap();
    let pair = Row::time(
        ENGINE,
        "raw insert+delete (rusqlite, same thread)",
        timed!(ITERATIONS, {
            insert.execute(["x"]).unwrap();
            delete.execute(["x"]).unwrap();
        }),
    );
    insert.execute(["held"]).unwrap();
    let mut select = raw
        .prepare_cached("SELECT name FROM raw WHERE name = ?1")
        .unwrap();
    let read = Row::time(
        ENGINE,
        "raw point SELECT (rusqlite, same thread)",
        timed!(ITERATIONS, {
            let _: Option<String> = select.query_row(["held"], |r| r.get(0)).ok();
        }),
    );
    drop((insert, delete, select));
    rows.push(pair.clone());
    rows.push(read.clone());
    let engine_sql = engine_statements_on_one_thread(dir).await;
    rows.push(engine_sql.clone().against(&pair, None));

    eprintln!("bench: sqlite alkstore");
    let db = dir.join("locks.db");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&db).await.unwrap());
    let cycle = ops::cycle(store.as_ref(), ITERATIONS).await;
    let cycle =
        Row::time(ENGINE, "try_lock+release cycle (10 rows)", cycle).against(&pair, Some(1.5));
    rows.push(cycle.clone());
    let held = store
        .try_lock("held", "holder", TTL)
        .await
        .unwrap()
        .unwrap();
    let refused = ops::refused(store.as_ref(), ITERATIONS).await;
    rows.push(Row::time(ENGINE, "refused try_lock (10 rows)", refused).against(&read, None));
    let renew = ops::renew(held.as_ref(), ITERATIONS).await;
    rows.push(Row::time(ENGINE, "renew", renew).against(&pair, None));
    let holder = ops::holder(store.as_ref(), ITERATIONS).await;
    rows.push(Row::time(ENGINE, "holder", holder).against(&read, None));

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
    let many = contention::many_names(store.clone(), "many", 64, Duration::from_secs(3)).await;
    rows.push(Row::rate(ENGINE, "64 tasks on 64 names: cycles", many));

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
