//! The shared contract suite on the SQLite engine, wired up as a third party would.

use std::sync::Arc;

use alkstore_contract_suite::{Fresh, contract_tests};
use alkstore_sqlite::SqliteStore;

/// A store on a new file in a temp dir, removed after the case.
async fn fresh() -> Option<Fresh> {
    let dir = tempfile::tempdir().expect("a temp dir");
    let store = SqliteStore::open(dir.path().join("locks.db"))
        .await
        .expect("open");
    Some(Fresh::new(Arc::new(store)).with_cleanup(async move { drop(dir) }))
}

contract_tests!(fresh);
