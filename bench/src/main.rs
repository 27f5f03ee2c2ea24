//! `cargo xtask bench`: alkstore's figures next to floors measured in the
//! same run, as a table, JSON and plots under `target/bench/`.

mod contention;
mod etcd;
mod fairness;
mod held;
mod many;
mod measure;
mod mysql;
mod ops;
mod permits;
mod pg;
mod poolers;
mod report;
mod rwlock;
mod sqlite;

use std::path::PathBuf;

use contention::Contended;
use report::Row;

/// What every engine's run adds to: the table's rows and the plots' data.
#[derive(Debug, Default)]
pub struct Collected {
    /// The table, in order.
    pub rows: Vec<Row>,
    /// Contended runs on one name, for the handoff plot.
    pub contended: Vec<(&'static str, Contended)>,
    /// Grants per second of a semaphore, by contending tasks.
    pub semaphores: Vec<(&'static str, Vec<(usize, f64)>)>,
    /// Renewals of the kept locks per `held::BUCKET`.
    pub renewals: Vec<(&'static str, Vec<u64>)>,
}

/// [`Collected`]'s parts, each to add to on its own.
type Parts<'a> = (
    &'a mut Vec<Row>,
    &'a mut Vec<(&'static str, Contended)>,
    &'a mut Vec<(&'static str, Vec<(usize, f64)>)>,
    &'a mut Vec<(&'static str, Vec<u64>)>,
);

impl Collected {
    /// Its parts, each to add to on its own.
    pub fn parts(&mut self) -> Parts<'_> {
        (
            &mut self.rows,
            &mut self.contended,
            &mut self.semaphores,
            &mut self.renewals,
        )
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("held-child") {
        held::child(&args[1], &args[2], &args[3]).await;
        return;
    }
    if args.first().map(String::as_str) == Some("sqlite-child") {
        sqlite::child(&args[1], args[2].parse().unwrap()).await;
        return;
    }
    let out = PathBuf::from(
        args.first()
            .cloned()
            .unwrap_or_else(|| "target/bench".into()),
    );
    std::fs::create_dir_all(&out).unwrap();
    // Engines to measure: those named after the output directory, or all;
    // `fairness` among them measures fair waiting alone, `kept` the kept
    // leases alone.
    const ENGINES: [&str; 4] = ["sqlite", "postgres", "mysql", "etcd"];
    const FAIRNESS: &str = "fairness";
    const KEPT: &str = "kept";
    let named: Vec<&String> = args
        .iter()
        .skip(1)
        .filter(|a| *a != FAIRNESS && *a != KEPT)
        .collect();
    if let Some(unknown) = named.iter().find(|a| !ENGINES.contains(&a.as_str())) {
        eprintln!("bench: no engine named {unknown:?}; the engines are {ENGINES:?}");
        std::process::exit(2);
    }
    let fairness_only = args.iter().skip(1).any(|a| a == FAIRNESS);
    let wanted = |engine: &str| named.is_empty() || named.iter().any(|a| a.as_str() == engine);
    let mut collected = Collected::default();
    let dir = tempfile::tempdir().unwrap();
    let mut curves = Vec::new();
    if args.iter().skip(1).any(|a| a == KEPT) {
        kept(&wanted, dir.path(), &mut collected).await;
        report::print_table(&collected.rows);
        report::write_json(&out.join("kept.json"), &collected.rows, &[]).unwrap();
        report::plot_renewals(&out.join("renewals.svg"), held::BUCKET, &collected.renewals)
            .unwrap();
        println!("\nwrote {0}/kept.json, {0}/renewals.svg", out.display());
        return;
    }
    if fairness_only {
        fair(&wanted, dir.path(), &mut collected.rows).await;
        report::print_table(&collected.rows);
        report::write_json(&out.join("fairness.json"), &collected.rows, &[]).unwrap();
        println!("\nwrote {}/fairness.json", out.display());
        return;
    }
    if wanted("sqlite") {
        let sqlite_curve = sqlite::run(dir.path(), &mut collected).await;
        curves.push(("sqlite", sqlite_curve));
    }
    match wanted("postgres")
        .then(alkstore_testkit::pg::server)
        .flatten()
    {
        Some(server) => {
            curves.push(("postgres", pg::run(&server.url, &mut collected).await));
            poolers::run(&server.url, &mut collected.rows).await;
        }
        None => eprintln!("bench: PostgreSQL figures skipped (no server)"),
    }
    match wanted("mysql")
        .then(alkstore_testkit::mysql::server)
        .flatten()
    {
        Some(server) => curves.push(("mysql", mysql::run(&server.url, &mut collected).await)),
        None => eprintln!("bench: MariaDB/MySQL figures skipped (no server)"),
    }
    match wanted("etcd")
        .then(alkstore_testkit::etcd::server)
        .flatten()
    {
        Some(server) => etcd::run(&server.url, &mut collected).await,
        None => eprintln!("bench: etcd figures skipped (no cluster)"),
    }
    fair(&wanted, dir.path(), &mut collected.rows).await;
    let Collected {
        rows,
        contended,
        semaphores,
        renewals,
    } = collected;
    report::print_table(&rows);
    report::write_json(&out.join("results.json"), &rows, &contended).unwrap();
    report::plot_handoffs(&out.join("handoff-latency.svg"), &contended).unwrap();
    report::plot_contention(
        &out.join("contention.svg"),
        "grants per second on one name, by contending tasks",
        &curves,
    )
    .unwrap();
    report::plot_contention(
        &out.join("semaphore.svg"),
        &format!(
            "grants per second of a semaphore of {} permits, by contending tasks",
            permits::PERMITS
        ),
        &semaphores,
    )
    .unwrap();
    report::plot_renewals(&out.join("renewals.svg"), held::BUCKET, &renewals).unwrap();
    println!(
        "\nwrote {0}/results.json, {0}/handoff-latency.svg, {0}/contention.svg, \
         {0}/semaphore.svg, {0}/renewals.svg",
        out.display()
    );
}

/// Issue 47: the kept leases alone, on each engine wanted (each engine's
/// full run measures them too).
async fn kept(wanted: &dyn Fn(&str) -> bool, dir: &std::path::Path, collected: &mut Collected) {
    let tag = format!("kept_{}", std::process::id());
    let (rows, _, _, renewals) = collected.parts();
    if wanted("sqlite") {
        let path = dir.join("kept.db");
        let location = path.to_str().unwrap();
        renewals.push(("sqlite", held::run("sqlite", location, rows).await));
    }
    if let Some(server) = wanted("postgres")
        .then(alkstore_testkit::pg::server)
        .flatten()
    {
        let location = format!("{} {tag}", server.url);
        renewals.push(("postgres", held::run("postgres", &location, rows).await));
        let store = alkstore_postgres::PgStore::connect(&server.url, &tag).await;
        store.unwrap().drop_schema().await.unwrap();
    }
    if let Some(server) = wanted("mysql")
        .then(alkstore_testkit::mysql::server)
        .flatten()
    {
        let location = format!("{} {tag}", server.url);
        renewals.push(("mysql", held::run("mysql", &location, rows).await));
        let store = alkstore_mysql::MySqlStore::connect(&server.url, &tag).await;
        store.unwrap().drop_database().await.unwrap();
    }
    if let Some(server) = wanted("etcd")
        .then(alkstore_testkit::etcd::server)
        .flatten()
    {
        let location = format!("{}/{tag}", server.url);
        renewals.push(("etcd", held::run("etcd", &location, rows).await));
        let store = alkstore_etcd::EtcdStore::connect(&location).await;
        store.unwrap().remove_store().await.unwrap();
    }
}

/// Issue 38: how fair waiting is on each engine wanted, and its cost next
/// to unfair waiting.
async fn fair(wanted: &dyn Fn(&str) -> bool, dir: &std::path::Path, rows: &mut Vec<report::Row>) {
    use alkstore_core::Store;
    use std::sync::Arc;
    let tag = format!("fair_{}", std::process::id());
    if wanted("sqlite") {
        let path = dir.join("fair.db");
        let path = &path;
        let open = |fair| async move {
            let store = alkstore_sqlite::SqliteStore::open(path).await.unwrap();
            Arc::new(store.fair_waiting(fair)) as Arc<dyn Store>
        };
        rows.extend(fairness::run("sqlite", open).await);
    }
    if let Some(server) = wanted("postgres")
        .then(alkstore_testkit::pg::server)
        .flatten()
    {
        let (url, tag) = (&server.url, &tag);
        let open = |fair| async move {
            let store = alkstore_postgres::PgStore::connect(url, tag).await.unwrap();
            Arc::new(store.fair_waiting(fair)) as Arc<dyn Store>
        };
        rows.extend(fairness::run("postgres", open).await);
    }
    if let Some(server) = wanted("mysql")
        .then(alkstore_testkit::mysql::server)
        .flatten()
    {
        let (url, tag) = (&server.url, &tag);
        let open = |fair| async move {
            let store = alkstore_mysql::MySqlStore::connect(url, tag).await.unwrap();
            Arc::new(store.fair_waiting(fair)) as Arc<dyn Store>
        };
        rows.extend(fairness::run("mysql", open).await);
    }
    if let Some(server) = wanted("etcd")
        .then(alkstore_testkit::etcd::server)
        .flatten()
    {
        let url = &format!("{}/{tag}", server.url);
        let open = |fair| async move {
            let store = alkstore_etcd::EtcdStore::connect(url).await.unwrap();
            Arc::new(store.fair_waiting(fair)) as Arc<dyn Store>
        };
        rows.extend(fairness::run("etcd", open).await);
    }
}
