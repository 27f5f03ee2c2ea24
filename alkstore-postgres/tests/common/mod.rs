//! Per-test isolation on the test server: a schema of its own, dropped after.

#![allow(dead_code)]

use alkstore_core::Store;
use alkstore_postgres::PgStore;
use alkstore_testkit::pg;

/// A store in a new schema on the test server; `None` when PostgreSQL is
/// unavailable and not required (the harness printed why).
pub async fn store(prefix: &str) -> Option<(PgStore, Schema)> {
    let server = pg::server()?;
    let schema = pg::unique_schema(prefix);
    let store = PgStore::connect(&server.url, &schema)
        .await
        .expect("connect to the test server");
    Some((
        store,
        Schema {
            url: server.url.clone(),
            name: schema,
        },
    ))
}

/// A test's schema; [`Schema::drop`] removes it through a connection of its
/// own, so it works after the store under test was closed.
pub struct Schema {
    pub url: String,
    pub name: String,
}

impl Schema {
    pub async fn drop(self) {
        let sweeper = PgStore::connect(&self.url, &self.name)
            .await
            .expect("connect to drop the schema");
        sweeper.drop_schema().await.expect("drop the test schema");
        sweeper.close().await.unwrap();
    }
}
