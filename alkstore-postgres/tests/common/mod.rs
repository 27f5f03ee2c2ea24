//! Per-test isolation on the test server: a schema of its own, dropped after.

#![allow(dead_code)]

use std::time::{Duration, Instant};

use alkstore_core::Store;
use alkstore_postgres::PgStore;
use alkstore_testkit::pg;

/// A store in a new schema on the test server; `None` when PostgreSQL is
/// unavailable and not required (the harness printed why).
pub async fn store(prefix: &str) -> Option<(PgStore, Schema)> {
    let server = pg::server()?;
    Some(store_at(&server.url, prefix).await)
}

/// A store in a new schema through `url` (a pooler's, say).
pub async fn store_at(url: &str, prefix: &str) -> (PgStore, Schema) {
    let schema = pg::unique_schema(prefix);
    let store = PgStore::connect(url, &schema)
        .await
        .expect("connect to the test server");
    (
        store,
        Schema {
            url: url.to_owned(),
            name: schema,
        },
    )
}

/// A contract case's store through `url`, in a schema of its own dropped
/// after the case; peers are further stores on the same schema, each with
/// its own pool and connections.
pub async fn fresh_at(url: &str) -> alkstore_contract_suite::Fresh {
    let (store, schema) = store_at(url, "contract").await;
    let (url, name) = (schema.url.clone(), schema.name.clone());
    alkstore_contract_suite::Fresh::new(std::sync::Arc::new(store))
        .with_peers(move || {
            let (url, name) = (url.clone(), name.clone());
            async move {
                std::sync::Arc::new(PgStore::connect(&url, &name).await.expect("open a peer"))
                    as std::sync::Arc<dyn Store>
            }
        })
        .with_cleanup(schema.drop())
}

/// A test's schema; [`Schema::drop`] removes it through a connection of its
/// own, so it works after the store under test was closed.
pub struct Schema {
    pub url: String,
    pub name: String,
}

impl Schema {
    /// The store opened again (an older layout upgraded in place by the
    /// open), its `meta` saying this build's layout.
    pub async fn reopened(&self) -> PgStore {
        let reopened = PgStore::connect(&self.url, &self.name).await.unwrap();
        let (version,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT value FROM {}.meta WHERE key = 'schema_version'",
            quoted_schema(&reopened)
        )))
        .fetch_one(reopened.pool())
        .await
        .unwrap();
        assert_eq!(version, alkstore_postgres::SCHEMA_VERSION);
        reopened
    }

    pub async fn drop(self) {
        let sweeper = PgStore::connect(&self.url, &self.name)
            .await
            .expect("connect to drop the schema");
        sweeper.drop_schema().await.expect("drop the test schema");
        sweeper.close().await.unwrap();
    }
}

/// The store's schema as an SQL identifier, as it appears in its statements.
pub fn quoted_schema(store: &PgStore) -> String {
    format!("\"{}\"", store.schema().replace('"', "\"\""))
}

/// Waits until a backend running this schema's statements sleeps in
/// `pg_sleep` (a test's trigger holds it there); tests running at once in
/// other schemas do not count.
pub async fn until_someone_sleeps(store: &PgStore) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (sleeping,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM pg_stat_activity
             WHERE wait_event = 'PgSleep' AND datname = current_database()
               AND strpos(query, $1) > 0",
        )
        .bind(quoted_schema(store))
        .fetch_one(store.pool())
        .await
        .unwrap();
        if sleeping > 0 {
            return;
        }
        assert!(Instant::now() < deadline, "nobody slept in this schema");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
