//! Per-test isolation on the test server: a database of its own, dropped after.

#![allow(dead_code)]

use alkstore_core::Store;
use alkstore_mysql::MySqlStore;
use alkstore_testkit::mysql;

/// A store in a new database on the test server; `None` when MariaDB/MySQL
/// is unavailable and not required (the harness printed why).
pub async fn store(prefix: &str) -> Option<(MySqlStore, Database)> {
    let server = mysql::server()?;
    let name = alkstore_testkit::unique_name(prefix);
    let store = MySqlStore::connect(&server.url, &name)
        .await
        .expect("connect to the test server");
    Some((
        store,
        Database {
            url: server.url.clone(),
            name,
        },
    ))
}

/// A test's database; [`Database::drop`] removes it through a connection of
/// its own, so it works after the store under test was closed.
pub struct Database {
    pub url: String,
    pub name: String,
}

/// Runs test-made SQL (several statements allowed) on `pool`; fails the test
/// on an error.
pub async fn sql(pool: &sqlx::MySqlPool, statement: String) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
        .execute(pool)
        .await
        .unwrap();
}

impl Database {
    /// The database's name quoted for SQL text.
    pub fn quoted(&self) -> String {
        format!("`{}`", self.name.replace('`', "``"))
    }

    /// The store opened again (an older layout upgraded in place by the
    /// open), its `meta` saying this build's layout.
    pub async fn reopened(&self) -> MySqlStore {
        let reopened = MySqlStore::connect(&self.url, &self.name).await.unwrap();
        let (version,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT value FROM {}.meta WHERE `key` = 'schema_version'",
            self.quoted()
        )))
        .fetch_one(reopened.pool())
        .await
        .unwrap();
        assert_eq!(version, alkstore_mysql::SCHEMA_VERSION);
        reopened
    }

    pub async fn drop(self) {
        let sweeper = MySqlStore::connect(&self.url, &self.name)
            .await
            .expect("connect to drop the database");
        sweeper
            .drop_database()
            .await
            .expect("drop the test database");
        sweeper.close().await.unwrap();
    }
}
