//! PostgreSQL as deployments really are: roles whose default isolation is
//! not READ COMMITTED, roles with only DML rights on objects an
//! administrator provisioned, schemas holding other people's tables, the
//! `public` schema, and a caller's small pool.

mod common;

use std::sync::Arc;
use std::time::Duration;

use alkstore_contract_suite::safety::history::check;
use alkstore_contract_suite::safety::workload::{Race, race};
use alkstore_core::Store;
use alkstore_postgres::{
    CannotCreateError, ForeignObjectsError, LostFencesError, PgStore, SchemaVersionError,
};
use alkstore_testkit::pg;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

const TTL: Duration = Duration::from_secs(30);

/// A superuser pool on the test server.
async fn admin(url: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(2)
        .connect(url)
        .await
        .unwrap()
}

async fn exec(pool: &PgPool, sql: String) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(pool)
        .await
        .unwrap();
}

/// A new login role (a password too, for servers that ask for one); the
/// options to connect as it.
async fn new_role(
    url: &str,
    admin: &PgPool,
    prefix: &str,
    extra: &str,
) -> (String, PgConnectOptions) {
    let role = pg::unique_schema(prefix);
    let password = format!("pw-{role}");
    exec(
        admin,
        format!("CREATE ROLE \"{role}\" LOGIN PASSWORD '{password}' {extra}"),
    )
    .await;
    let options: PgConnectOptions = url.parse().unwrap();
    (role.clone(), options.username(&role).password(&password))
}

async fn drop_role(admin: &PgPool, role: &str) {
    exec(
        admin,
        format!("DROP OWNED BY \"{role}\"; DROP ROLE \"{role}\""),
    )
    .await;
}

/// A role (and a database default) of SERIALIZABLE: losing contenders still
/// get `Ok(None)` and fences stay in commit order, because the store pins
/// READ COMMITTED on its connections (before, they failed with 40001).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serializable_default_still_gives_none_to_losers() {
    let Some(server) = pg::server() else { return };
    let admin = admin(&server.url).await;
    let (role, options) = new_role(&server.url, &admin, "serial", "").await;
    exec(
        &admin,
        format!("ALTER ROLE \"{role}\" SET default_transaction_isolation = 'serializable'"),
    )
    .await;
    exec(
        &admin,
        format!("GRANT CREATE ON DATABASE postgres TO \"{role}\""),
    )
    .await;
    let schema = pg::unique_schema("serial");
    let mut stores: Vec<Arc<dyn Store>> = Vec::new();
    for _ in 0..8 {
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .connect_with(options.clone())
            .await
            .unwrap();
        stores.push(Arc::new(
            PgStore::open(pool, &schema)
                .await
                .expect("open as the role"),
        ));
    }
    let shape = Race {
        tasks_per_store: 2,
        duration: Duration::from_secs(2),
    };
    let outcome = race(&stores, "serial", shape, 11).await;
    assert!(
        outcome.history.len() > 10,
        "{} grants",
        outcome.history.len()
    );
    assert_eq!(check(&outcome.history), Ok(()));
    for store in &stores {
        store.close().await.unwrap();
    }
    let owner = PgStore::connect(&server.url, &schema).await.unwrap();
    owner.drop_schema().await.unwrap();
    owner.close().await.unwrap();
    exec(
        &admin,
        format!("REVOKE CREATE ON DATABASE postgres FROM \"{role}\""),
    )
    .await;
    drop_role(&admin, &role).await;
}

/// An administrator opens the store once (creating its objects) and grants
/// a role only USAGE and DML on them: that role opens the store and runs
/// every operation, without CREATE rights. A schema missing one of
/// alkstore's objects is refused to such a role with a clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_with_only_dml_rights_uses_a_provisioned_schema() {
    let Some(server) = pg::server() else { return };
    let admin = admin(&server.url).await;
    let schema = pg::unique_schema("provisioned");
    let provisioner = PgStore::connect(&server.url, &schema).await.unwrap();
    let (role, options) = new_role(&server.url, &admin, "dml", "").await;
    let s = format!("\"{schema}\"");
    exec(
        &admin,
        format!(
            "GRANT USAGE ON SCHEMA {s} TO \"{role}\";
         GRANT SELECT, INSERT, UPDATE, DELETE ON {s}.locks TO \"{role}\";
         GRANT SELECT, INSERT, UPDATE, DELETE ON {s}.permits TO \"{role}\";
         GRANT SELECT, INSERT, UPDATE, DELETE ON {s}.tickets TO \"{role}\";
         GRANT SELECT ON {s}.meta TO \"{role}\";
         GRANT USAGE ON SEQUENCE {s}.fences, {s}.ticket_numbers TO \"{role}\";"
        ),
    )
    .await;
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options.clone())
        .await
        .unwrap();
    let store = PgStore::open(pool, &schema)
        .await
        .expect("a DML-only role opens a provisioned schema");
    let lock = store
        .try_lock("job", "worker-1", TTL)
        .await
        .unwrap()
        .expect("granted");
    assert!(
        store
            .try_lock("job", "worker-2", TTL)
            .await
            .unwrap()
            .is_none()
    );
    assert!(lock.renew(TTL).await.unwrap());
    assert_eq!(
        store.holder("job").await.unwrap().unwrap().owner,
        "worker-1"
    );
    // A waiting call queues (its ticket written, read, and left).
    let waited = store
        .lock("job", "worker-2", TTL, Duration::from_millis(300))
        .await
        .unwrap();
    assert!(waited.is_none(), "held by worker-1 for its whole wait");
    assert!(lock.release().await.unwrap());
    let permit = store
        .try_acquire_permit("pool", 2, "worker-1", TTL)
        .await
        .unwrap()
        .expect("a permit");
    assert!(permit.renew(TTL).await.unwrap());
    assert_eq!(store.holders("pool").await.unwrap().len(), 1);
    assert!(permit.release().await.unwrap());
    assert_eq!(store.purge_expired().await.unwrap(), 0);
    assert!(store.waiters("job").await.unwrap().is_empty());
    store.close().await.unwrap();

    // The function gone: the role may not create it, and says so.
    exec(
        &admin,
        format!(
            "DROP FUNCTION {s}.acquire(text, text, bigint, integer, bigint, bigint, text, text)"
        ),
    )
    .await;
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .unwrap();
    match PgStore::open(pool, &schema).await {
        Err(error) => assert!(
            error.find_source::<CannotCreateError>().is_some(),
            "{error:?}"
        ),
        Ok(_) => panic!("opened a schema missing its acquire function"),
    }
    provisioner.drop_schema().await.unwrap();
    provisioner.close().await.unwrap();
    drop_role(&admin, &role).await;
}

/// A schema holding a user's own `locks` or `meta` table is refused, and
/// the table is left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_alkstore_did_not_create_are_never_adopted() {
    let Some(server) = pg::server() else { return };
    let admin = admin(&server.url).await;
    for table in [
        "locks (name text PRIMARY KEY, owner text, fence bigint, expires_at bigint)",
        "meta (key text PRIMARY KEY, value bigint NOT NULL)",
    ] {
        let schema = pg::unique_schema("foreign");
        let s = format!("\"{schema}\"");
        let table_name = table.split(' ').next().unwrap();
        exec(
            &admin,
            format!("CREATE SCHEMA {s}; CREATE TABLE {s}.{table}"),
        )
        .await;
        match PgStore::connect(&server.url, &schema).await {
            Err(error) => assert!(
                error.find_source::<ForeignObjectsError>().is_some(),
                "{error:?}"
            ),
            Ok(_) => panic!("adopted a user's {table_name} table"),
        }
        let (still,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = $1",
        )
        .bind(&schema)
        .fetch_one(&admin)
        .await
        .unwrap();
        assert_eq!(
            still, 2,
            "the user's table (and its index) stay, nothing added"
        );
        exec(&admin, format!("DROP SCHEMA {s} CASCADE")).await;
    }
}

/// `public` and any schema alkstore found: `drop_schema` drops alkstore's
/// objects only, and the schema with everything else in it stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_schema_never_drops_what_alkstore_did_not_create() {
    let Some(server) = pg::server() else { return };
    let admin = admin(&server.url).await;
    exec(&admin, "CREATE TABLE public.users_own (id int)".to_owned()).await;
    let store = PgStore::connect(&server.url, "public").await.unwrap();
    let lock = store.try_lock("x", "a", TTL).await.unwrap().unwrap();
    assert!(lock.release().await.unwrap());
    store.drop_schema().await.unwrap();
    let (public, users_own, ours): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM pg_namespace WHERE nspname = 'public'),
                (SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename = 'users_own'),
                (SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename IN ('locks', 'meta'))",
    )
    .fetch_one(&admin)
    .await
    .unwrap();
    assert_eq!((public, users_own, ours), (1, 1, 0));
    store.close().await.unwrap();
    exec(&admin, "DROP TABLE public.users_own".to_owned()).await;

    // A schema alkstore created but someone added to: its objects go, the schema stays.
    let schema = pg::unique_schema("shared");
    let store = PgStore::connect(&server.url, &schema).await.unwrap();
    exec(&admin, format!("CREATE TABLE \"{schema}\".theirs (id int)")).await;
    store.drop_schema().await.unwrap();
    let (tables,): (i64,) = sqlx::query_as("SELECT count(*) FROM pg_tables WHERE schemaname = $1")
        .bind(&schema)
        .fetch_one(&admin)
        .await
        .unwrap();
    assert_eq!(tables, 1, "only the user's table is left");
    store.close().await.unwrap();
    exec(&admin, format!("DROP SCHEMA \"{schema}\" CASCADE")).await;

    // And one alkstore created and nobody touched goes entirely.
    let schema = pg::unique_schema("own");
    let store = PgStore::connect(&server.url, &schema).await.unwrap();
    store.drop_schema().await.unwrap();
    let (left,): (i64,) = sqlx::query_as("SELECT count(*) FROM pg_namespace WHERE nspname = $1")
        .bind(&schema)
        .fetch_one(&admin)
        .await
        .unwrap();
    assert_eq!(left, 0);
    store.close().await.unwrap();
}

/// A waiting acquire's listener uses a connection of its own, never one of
/// the caller's pool: with a pool of one, the caller can still use it while
/// a waiter waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_never_holds_a_connection_of_the_callers_pool() {
    let Some((holder, schema)) = common::store("ownlisten").await else {
        return;
    };
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&schema.url)
        .await
        .unwrap();
    let store = Arc::new(PgStore::open(pool.clone(), &schema.name).await.unwrap());
    let held = holder
        .try_lock("busy", "holder", TTL)
        .await
        .unwrap()
        .unwrap();
    let waiter = tokio::spawn({
        let store = store.clone();
        async move {
            store
                .lock("busy", "waiter", TTL, Duration::from_secs(20))
                .await
        }
    });
    // Until the waiter's listener is in place (its connection has run LISTEN).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (listening,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM pg_stat_activity a, pg_namespace n
             WHERE n.nspname = $1 AND a.query LIKE 'LISTEN %'
               AND strpos(a.query, 'alkstore_' || n.oid::text) > 0",
        )
        .bind(&schema.name)
        .fetch_one(holder.pool())
        .await
        .unwrap();
        if listening > 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the waiter never listened"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let conn = tokio::time::timeout(Duration::from_secs(1), pool.acquire()).await;
    assert!(
        matches!(conn, Ok(Ok(_))),
        "the caller's only connection was taken: {conn:?}"
    );
    drop(conn);
    assert!(held.release().await.unwrap());
    let lock = waiter
        .await
        .unwrap()
        .unwrap()
        .expect("woken by the release");
    assert!(lock.release().await.unwrap());
    store.close().await.unwrap();
    holder.close().await.unwrap();
    schema.drop().await;
}

/// A schema whose `fences` sequence was dropped is refused: a new sequence
/// would hand out fences from 1 again, below fences already handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_that_lost_its_fences_is_refused() {
    let Some((store, schema)) = common::store("lostfences").await else {
        return;
    };
    let lock = store.try_lock("job", "a", TTL).await.unwrap().unwrap();
    assert!(lock.release().await.unwrap());
    let s = common::quoted_schema(&store);
    exec(store.pool(), format!("DROP SEQUENCE {s}.fences")).await;
    match PgStore::connect(&schema.url, &schema.name).await {
        Err(error) => assert!(
            error.find_source::<LostFencesError>().is_some(),
            "{error:?}"
        ),
        Ok(_) => panic!("opened a schema that lost its fences"),
    }
    let (exists,): (bool,) = sqlx::query_as(
        "SELECT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                        WHERE n.nspname = $1 AND c.relname = 'fences')",
    )
    .bind(&schema.name)
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert!(!exists, "a new fences sequence was made");
    // What is left can still be dropped (by the store opened before).
    store.drop_schema().await.unwrap();
    store.close().await.unwrap();
}

/// A connection whose `synchronous_commit` is `off` (here set by the URL's
/// `options`, as a role or database default would) still commits grants and
/// renewals durably: each raises it to `on` for its own transaction (a grant
/// lost in a crash after being answered would let its fence be handed out
/// again). Releases and purges, and only they, commit with it `off`
/// (a lost one is harmless; see `ASYNC_COMMIT_CTE`). A trigger in the test's
/// schema records the setting every write of the lock table runs under.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_and_renewals_are_durable_releases_and_purges_commit_async() {
    let Some((store, schema)) = common::store("synccommit").await else {
        return;
    };
    let s = common::quoted_schema(&store);
    exec(
        store.pool(),
        format!(
            "CREATE TABLE {s}.seen (at serial, setting text);
             CREATE FUNCTION {s}.note_setting() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 INSERT INTO {s}.seen (setting) VALUES (current_setting('synchronous_commit'));
                 RETURN NULL;
             END $$;
             CREATE TRIGGER note_setting AFTER INSERT OR UPDATE OR DELETE ON {s}.locks
                 FOR EACH ROW EXECUTE FUNCTION {s}.note_setting();"
        ),
    )
    .await;
    let sep = if schema.url.contains('?') { '&' } else { '?' };
    let url = format!("{}{sep}options=-c%20synchronous_commit%3Doff", schema.url);
    let lax = PgStore::connect(&url, &schema.name).await.unwrap();
    let lock = lax.try_lock("job", "a", TTL).await.unwrap().unwrap();
    assert!(lock.renew(TTL).await.unwrap());
    assert!(lock.release().await.unwrap());
    let short = lax
        .try_lock("brief", "a", Duration::from_millis(1))
        .await
        .unwrap();
    assert!(short.is_some());
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(lax.purge_expired().await.unwrap(), 1);
    lax.close().await.unwrap();
    let seen: Vec<(String,)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT setting FROM {s}.seen ORDER BY at"
    )))
    .fetch_all(store.pool())
    .await
    .unwrap();
    let seen: Vec<String> = seen.into_iter().map(|(v,)| v).collect();
    assert_eq!(
        seen,
        ["on", "on", "off", "on", "off"],
        "grant, renewal, release, grant, purge"
    );
    exec(
        store.pool(),
        format!("DROP FUNCTION {s}.note_setting() CASCADE; DROP TABLE {s}.seen;"),
    )
    .await;
    store.close().await.unwrap();
    schema.drop().await;
}

/// A schema of another layout version is refused with `SchemaVersionError`,
/// whose message appears once in the error's chain (not again inside a
/// driver error that wraps it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_schema_version_is_refused_and_said_once() {
    let Some((store, schema)) = common::store("oldversion").await else {
        return;
    };
    let s = common::quoted_schema(&store);
    exec(
        store.pool(),
        format!("UPDATE {s}.meta SET value = 2 WHERE key = 'schema_version'"),
    )
    .await;
    let error = match PgStore::connect(&schema.url, &schema.name).await {
        Err(error) => error,
        Ok(_) => panic!("opened a version 2 schema"),
    };
    let found = error
        .find_source::<SchemaVersionError>()
        .unwrap_or_else(|| panic!("{error:?}"));
    assert_eq!(
        (found.found, found.known),
        (2, alkstore_postgres::SCHEMA_VERSION)
    );
    let mut chain = vec![error.to_string()];
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        chain.push(cause.to_string());
        source = cause.source();
    }
    let said = chain
        .iter()
        .filter(|m| m.contains("schema version 2"))
        .count();
    assert_eq!(said, 1, "{chain:#?}");
    store.drop_schema().await.unwrap();
    store.close().await.unwrap();
}
