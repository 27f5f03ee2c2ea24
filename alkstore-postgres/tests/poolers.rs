//! PostgreSQL behind PgBouncer, started by the test harness in front of the
//! test server (PgBouncer's defaults unless a test says otherwise): what
//! the contract columns `postgres+pgbouncer-*` do not show — session state
//! a pooler drops, a pool smaller than the store, a pooler the store was not
//! told of, where waiters listen, and a standby answering.

mod common;

use std::time::Duration;

use alkstore_contract_suite::support::error_chain;
use alkstore_core::{Error, Store};
use alkstore_postgres::{DeploymentError, PgStore};
use alkstore_testkit::pg::{self, Pair};
use alkstore_testkit::pgbouncer::{self, Bouncer, Mode};
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection};

const TTL: Duration = Duration::from_secs(30);

/// The deployment error at the bottom of `error`, if any.
fn deployment_error(error: &Error) -> Option<&DeploymentError> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = source {
        if let Some(found) = e.downcast_ref::<DeploymentError>() {
            return Some(found);
        }
        source = e.source();
    }
    None
}

/// A plain connection, without the startup parameter PgBouncer refuses.
async fn connect(url: &str) -> PgConnection {
    let options: PgConnectOptions = url.parse().unwrap();
    PgConnection::connect_with(&options.extra_float_digits(None))
        .await
        .unwrap()
}

async fn exec(url: &str, sql: &str) {
    let mut conn = connect(url).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
}

/// A database whose default isolation is SERIALIZABLE: through PgBouncer in
/// either mode, and straight, grants and renewals work (the acquire
/// functions refuse any other level than READ COMMITTED, so a grant proves
/// the pin held), and behind the transaction pooler the store leaves no
/// session setting on the server connections it shared with other clients.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serializable_default_works_through_every_pool_mode() {
    let Some(server) = pg::server() else { return };
    let (Some(session), Some(transaction)) = (
        pgbouncer::shared(Mode::Session),
        pgbouncer::shared(Mode::Transaction),
    ) else {
        return;
    };
    let database = pg::unique_schema("serialdb");
    exec(&server.url, &format!("CREATE DATABASE \"{database}\"")).await;
    exec(
        &server.url,
        &format!(
            "ALTER DATABASE \"{database}\" SET default_transaction_isolation = 'serializable'"
        ),
    )
    .await;
    let direct = {
        let base = server.url.rsplit_once('/').unwrap().0;
        format!("{base}/{database}")
    };
    for url in [
        direct.clone(),
        session.url_for(&database, "pooler=session"),
        transaction.url_for(&database, "pooler=transaction"),
    ] {
        let store = PgStore::connect(&url, "alkstore").await.unwrap();
        let me = alkstore_core::unique_owner("serial").unwrap();
        let lock = store
            .try_lock("serial", &me, TTL)
            .await
            .unwrap_or_else(|e| panic!("{}: {e:?}", url.split('@').nth(1).unwrap_or("")))
            .expect("free");
        assert!(lock.renew(TTL).await.unwrap());
        assert!(lock.release().await.unwrap());
        store.close().await.unwrap();
    }
    // Every server connection PgBouncer holds for the database still has
    // the database's default: the store set nothing for the session.
    let mut through = connect(&transaction.url_for(&database, "")).await;
    let (level,): (String,) = sqlx::query_as("SHOW default_transaction_isolation")
        .persistent(false)
        .fetch_one(&mut through)
        .await
        .unwrap();
    assert_eq!(level, "serializable");
    through.close().await.unwrap();
    let store = PgStore::connect(&direct, "alkstore").await.unwrap();
    store.drop_schema().await.unwrap();
    store.close().await.unwrap();
}

/// A pooler in session mode with one server connection, which each client
/// connection keeps for its life: the store's open (its pool's second
/// connection) or its first operation (the store's own first connection)
/// finds none. Either fails within the connect timeout with an error that
/// names the pool and the fix, rather than waiting as long as PgBouncer
/// would (`query_wait_timeout`, 120 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_smaller_than_the_store_is_a_clear_error_not_a_hang() {
    let Some(bouncer) = Bouncer::start(Mode::Session, &["default_pool_size = 1"]) else {
        return;
    };
    let schema = pg::unique_schema("small");
    let me = alkstore_core::unique_owner("small").unwrap();
    let url = bouncer.url_for("postgres", "pooler=session");
    let outcome = tokio::time::timeout(Duration::from_secs(60), async {
        let store = PgStore::connect(&url, &schema).await?;
        let granted = store.try_lock("n", &me, TTL).await.map(drop);
        store.close().await?;
        granted
    })
    .await
    .expect("an answer, not a hang");
    let error = outcome.expect_err("no server connection for the store");
    assert!(
        error_chain(&error).contains("default_pool_size"),
        "{error:?}"
    );
    let server = pg::server().unwrap();
    let sweeper = PgStore::connect(&server.url, &schema).await.unwrap();
    sweeper.drop_schema().await.unwrap();
}

/// The same with a pool of one connection given to the store (the open
/// runs on it and keeps PgBouncer's one server connection): the store's own
/// first connection is let in, and its first statement, which PgBouncer
/// queues, is cut at the connect timeout with the error naming the pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_connection_without_a_server_connection_is_a_clear_error() {
    let Some(bouncer) = Bouncer::start(Mode::Session, &["default_pool_size = 1"]) else {
        return;
    };
    let schema = pg::unique_schema("small");
    let me = alkstore_core::unique_owner("small").unwrap();
    let options: PgConnectOptions = bouncer.url_for("postgres", "").parse().unwrap();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options.extra_float_digits(None))
        .await
        .unwrap();
    let store = PgStore::open(pool, &schema).await.unwrap();
    let error = tokio::time::timeout(Duration::from_secs(60), store.try_lock("n", &me, TTL))
        .await
        .expect("an answer, not a hang")
        .expect_err("no server connection for the store's own");
    assert!(
        matches!(
            std::error::Error::source(&error).and_then(|e| e.downcast_ref()),
            Some(alkstore_postgres::NoServerConnection { .. })
        ),
        "{error:?}"
    );
    assert!(
        error_chain(&error).contains("default_pool_size"),
        "{error:?}"
    );
    store.drop_schema().await.unwrap();
    store.close().await.unwrap();
}

/// A store not told of a pooler in transaction mode: its prepared
/// statements meet another client's on the one server connection, and the
/// error names the pooler and `pooler=transaction`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untold_transaction_pooler_is_named_with_the_fix() {
    let Some(bouncer) = Bouncer::start(Mode::Transaction, &["default_pool_size = 1"]) else {
        return;
    };
    let schema = pg::unique_schema("untold");
    let me = alkstore_core::unique_owner("untold").unwrap();
    let outcome = async {
        let store = PgStore::connect(&bouncer.url_for("postgres", ""), &schema).await?;
        store.try_lock("n", &me, TTL).await.map(drop)
    }
    .await;
    let error = outcome.expect_err("prepared statements cannot work there");
    assert!(
        matches!(
            deployment_error(&error),
            Some(DeploymentError::TransactionPooler { .. })
        ),
        "{error:?}"
    );
    assert!(
        error_chain(&error).contains("pooler=transaction"),
        "{error:?}"
    );
    let server = pg::server().unwrap();
    let sweeper = PgStore::connect(&server.url, &schema).await.unwrap();
    sweeper.drop_schema().await.unwrap();
}

/// How many backends LISTEN on the store's channel, as the server sees.
async fn listeners(server_url: &str, store: &PgStore) -> i64 {
    let mut conn = PgConnection::connect(server_url).await.unwrap();
    let (count,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM pg_stat_activity
         WHERE query LIKE 'LISTEN %' AND query LIKE '%' || (
             SELECT 'alkstore_' || oid FROM pg_namespace WHERE nspname = $1) || '%'",
    )
    .bind(store.schema())
    .fetch_one(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();
    count
}

/// How many times the server ran a statement whose text holds `text`
/// (`pg_stat_statements`, which the test cluster loads; utility statements
/// such as LISTEN included, and a count only grows).
async fn calls(server_url: &str, text: &str) -> i64 {
    let mut conn = connect(server_url).await;
    sqlx::raw_sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(&mut conn)
        .await
        .unwrap();
    let (calls,): (i64,) = sqlx::query_as(
        "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements
         WHERE strpos(query, $1) > 0",
    )
    .bind(text)
    .fetch_one(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();
    calls
}

/// The LISTEN statement's text on `store`'s channel, as the server shows it.
async fn listen_text(server_url: &str, store: &PgStore) -> String {
    let mut conn = connect(server_url).await;
    let (oid,): (i64,) = sqlx::query_as("SELECT oid::bigint FROM pg_namespace WHERE nspname = $1")
        .bind(store.schema())
        .fetch_one(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    format!("LISTEN \"alkstore_{oid}\"")
}

/// Behind a pooler in transaction mode, a store listens only over the
/// direct connection `listen=` names (a LISTEN through the pooler would be
/// lost with its server connection); with none, it does not listen at all
/// and its waiters poll. A waiter is refused at least once (the server
/// counts its acquire calls) before the name is released, so it has started
/// its wake-ups; once it is granted, the server says whether a LISTEN on the
/// store's channel ever ran (counted by `pg_stat_statements`), and, with
/// `listen=`, that the listener is there now on a connection of its own
/// (a backend whose last statement is that LISTEN: a pooled one would have
/// run other clients' statements since).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_transaction_pooler_only_a_direct_connection_listens() {
    let Some(server) = pg::server() else { return };
    let Some(bouncer) = pgbouncer::shared(Mode::Transaction) else {
        return;
    };
    let (host, port) = &bouncer.server;
    for (params, expected) in [
        ("pooler=transaction".to_owned(), 0),
        (format!("pooler=transaction&listen={host}:{port}"), 1),
    ] {
        let (store, schema) =
            common::store_at(&bouncer.url_for("postgres", &params), "listen").await;
        let store = std::sync::Arc::new(store);
        let me = alkstore_core::unique_owner("listen").unwrap();
        let held = store.try_lock("n", &me, TTL).await.unwrap().unwrap();
        let acquire = format!("{}.acquire(", common::quoted_schema(&store));
        let before = calls(&server.url, &acquire).await;
        let waiter = {
            let store = store.clone();
            tokio::spawn(async move {
                let other = alkstore_core::unique_owner("other").unwrap();
                store
                    .lock("n", &other, TTL, Duration::from_secs(60))
                    .await
                    .unwrap()
                    .expect("granted after the release")
            })
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while calls(&server.url, &acquire).await == before {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the waiter never tried"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        held.release().await.unwrap();
        let granted = waiter.await.unwrap();
        let listen = listen_text(&server.url, &store).await;
        assert_eq!(calls(&server.url, &listen).await, expected, "{params}");
        assert_eq!(listeners(&server.url, &store).await, expected, "{params}");
        granted.release().await.unwrap();
        store.close().await.unwrap();
        schema.drop().await;
    }
}

/// A store whose URL leads to a standby (a switchover's old primary still
/// routed to, a replica named by mistake): a grant is refused with an error
/// that says the server is a standby, not a raw SQL message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_behind_the_url_is_named_as_such() {
    let Some(pair) = Pair::start(false) else {
        return;
    };
    let schema = pg::unique_schema("standby");
    let primary = PgStore::connect(&pair.primary_url, &schema).await.unwrap();
    let me = alkstore_core::unique_owner("standby").unwrap();
    let held = primary.try_lock("held", &me, TTL).await.unwrap().unwrap();
    // Until the standby has the schema and the grant.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let standby = loop {
        if let Ok(store) = PgStore::connect(&pair.standby_url, &schema).await {
            if store.holder("held").await.is_ok_and(|h| h.is_some()) {
                break store;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the standby never caught up"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    for attempt in [
        standby.try_lock("free", &me, TTL).await.map(drop),
        standby.force_release("held").await.map(drop),
    ] {
        let error = attempt.expect_err("a standby grants nothing");
        assert!(
            matches!(
                deployment_error(&error),
                Some(DeploymentError::Standby { .. })
            ),
            "{error:?}"
        );
        assert!(error_chain(&error).contains("is a standby"), "{error:?}");
    }
    held.release().await.unwrap();
}

/// With the server stopped behind PgBouncer (its defaults: a query waits
/// `query_wait_timeout`, 120 s, for a server connection), every call of a
/// store opened with `timeout=2s` fails within that bound (and the
/// margin of a loaded machine), in both pool modes, with an error naming
/// the pooler and where the store connects — where it would hang for two
/// minutes. The same call straight to the stopped server fails at once.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_gone_behind_the_pooler_fails_calls_within_the_bound() {
    let Some(own) = pg::Own::start() else {
        return;
    };
    let mut stores = Vec::new();
    for (mode, param) in [
        (Mode::Session, "session"),
        (Mode::Transaction, "transaction"),
    ] {
        let bouncer = Bouncer::start_for(&own.url, mode, &[]).expect("a PgBouncer");
        let url = bouncer.url_for("postgres", &format!("pooler={param}&timeout=2s"));
        let schema = pg::unique_schema("gone");
        let store = PgStore::connect(&url, &schema).await.unwrap();
        let held = store.try_lock("before", "me", TTL).await.unwrap();
        assert!(held.is_some(), "{param}: granted while the server runs");
        stores.push((param, bouncer, store));
    }
    assert!(
        own.cluster.pg_ctl(&["stop", "-m", "fast"]),
        "the server stops"
    );
    for (param, bouncer, store) in &stores {
        let asked = std::time::Instant::now();
        let calls = [
            store.try_lock("after", "me", TTL).await.map(drop),
            store.holder("before").await.map(drop),
        ];
        let took = asked.elapsed();
        for call in calls {
            let error = call.expect_err("no server: no answer");
            let text = error_chain(&error);
            // Ours, once the bound passed; or PgBouncer's own, when it
            // already knows its logins to the server fail.
            let ours = text.contains(param) && text.contains(&bouncer.port.to_string());
            assert!(
                ours || text.contains("server_login_retry"),
                "{param}: the error names the pooler and where the store connects: {text}"
            );
        }
        assert!(
            took < Duration::from_secs(2 * 2 + 6),
            "{param}: two calls answered within the bound of 2 s each (and a margin), not \
             after {took:?}"
        );
    }
}
