//! PostgreSQL through PgBouncer, next to PostgreSQL straight: each
//! operation and a `SELECT 1` floor on a bare connection through the same
//! route, measured in alternation; then release → grant across two stores,
//! where a transaction pooler's stores poll unless they listen straight at
//! the server.

use std::sync::Arc;

use alkstore_core::Store;
use alkstore_postgres::PgStore;
use alkstore_testkit::pgbouncer::{self, Mode};
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection};

use crate::measure::{RUNS, Rounds, in_turn, percentile};
use crate::ops;
use crate::report::Row;

const ENGINE: &str = "postgres";
const ITERATIONS: u32 = 500;

/// A route to the server: its name, the store's URL, a bare connection.
struct Route {
    name: &'static str,
    store: Arc<dyn Store>,
    bare: PgConnection,
}

async fn route(name: &'static str, url: &str, schema: &str) -> Route {
    let store: Arc<dyn Store> = Arc::new(PgStore::connect(url, schema).await.unwrap());
    let options: PgConnectOptions = url.parse().unwrap();
    let bare = PgConnection::connect_with(&options.extra_float_digits(None))
        .await
        .unwrap();
    Route { name, store, bare }
}

/// `SELECT 1` as one simple-protocol message: the same through any pooler.
async fn select_one(bare: &mut PgConnection) {
    sqlx::raw_sql("SELECT 1").execute(bare).await.unwrap();
}

/// The figures, or none (said on stderr) when PgBouncer cannot be started.
pub async fn run(server_url: &str, rows: &mut Vec<Row>) {
    let (Some(session), Some(transaction)) = (
        pgbouncer::shared(Mode::Session),
        pgbouncer::shared(Mode::Transaction),
    ) else {
        eprintln!("bench: PgBouncer figures skipped (no pgbouncer)");
        return;
    };
    eprintln!("bench: postgres through PgBouncer, alternating with direct");
    let schema = format!("bench_pool_{}", std::process::id());
    let tx_url = transaction.url_for("postgres", "pooler=transaction");
    let mut routes = [
        route("direct", server_url, &schema).await,
        route(
            "PgBouncer session",
            &session.url_for("postgres", "pooler=session"),
            &schema,
        )
        .await,
        route("PgBouncer transaction", &tx_url, &schema).await,
    ];
    let helds: Vec<_> = {
        let mut helds = Vec::new();
        for (i, r) in routes.iter().enumerate() {
            let name = format!("{}-{i}", ops::HELD);
            helds.push(
                r.store
                    .try_lock(&name, "holder", ops::HELD_TTL)
                    .await
                    .unwrap()
                    .unwrap(),
            );
        }
        helds
    };
    // Another process's held name, for refusals: the direct store holds it.
    let refused_on = routes[0]
        .store
        .try_lock(ops::HELD, "holder", ops::HELD_TTL)
        .await
        .unwrap()
        .unwrap();
    let mut rounds = Rounds::<12>::default();
    for round in 0..=RUNS {
        let [a, b, c] = &mut routes;
        let (sa, sb, sc) = (a.store.as_ref(), b.store.as_ref(), c.store.as_ref());
        let times = in_turn!(
            round,
            ITERATIONS,
            [
                { select_one(&mut a.bare).await },
                { select_one(&mut b.bare).await },
                { select_one(&mut c.bare).await },
                { ops::one_renewal(helds[0].as_ref()).await },
                { ops::one_renewal(helds[1].as_ref()).await },
                { ops::one_renewal(helds[2].as_ref()).await },
                { ops::one_cycle(sa).await },
                { ops::one_cycle(sb).await },
                { ops::one_cycle(sc).await },
                { ops::one_refusal(sa).await },
                { ops::one_refusal(sb).await },
                { ops::one_refusal(sc).await },
            ]
        );
        rounds.record(round, times);
    }
    let medians = rounds.medians();
    for (i, r) in routes.iter().enumerate() {
        let floor = Row::time(ENGINE, format!("SELECT 1, {} (bare)", r.name), medians[i]);
        rows.push(floor.clone());
        for (k, what) in ["renewal", "try_lock+release cycle", "refused try_lock"]
            .iter()
            .enumerate()
        {
            rows.push(
                Row::time(
                    ENGINE,
                    format!("{what}, {}", r.name),
                    medians[3 * (k + 1) + i],
                )
                .against(&floor, None),
            );
        }
    }
    // Release → grant across two stores: direct (LISTEN), transaction
    // pooler polling, transaction pooler listening straight at the server.
    let (host, port) = &transaction.server;
    let listen_url = format!("{tx_url}&listen={host}:{port}");
    for (label, url) in [
        ("direct, LISTEN", server_url.to_owned()),
        ("PgBouncer transaction, polling", tx_url.clone()),
        ("PgBouncer transaction, listen=", listen_url),
    ] {
        let holder: Arc<dyn Store> = Arc::new(PgStore::connect(&url, &schema).await.unwrap());
        let waiter: Arc<dyn Store> = Arc::new(PgStore::connect(&url, &schema).await.unwrap());
        let mut samples = ops::handoffs(&holder, &waiter, label).await;
        rows.push(Row::time(
            ENGINE,
            format!("handoff to another store p50, {label}"),
            percentile(&mut samples, 50.0),
        ));
        rows.push(Row::time(
            ENGINE,
            format!("handoff to another store p99, {label}"),
            percentile(&mut samples, 99.0),
        ));
        holder.close().await.unwrap();
        waiter.close().await.unwrap();
    }
    drop(helds);
    drop(refused_on);
    let sweeper = PgStore::connect(server_url, &schema).await.unwrap();
    sweeper.drop_schema().await.unwrap();
}
