//! The shared contract suite on the SQLite engine, wired up as a third party would.

use std::sync::Arc;

use alkstore_contract_suite::{Fresh, contract_tests};
use alkstore_core::Store;
use alkstore_sqlite::SqliteStore;

/// A store on a new file in a temp dir, removed after the case; peers are
/// further stores on the same file, each with its own connection and thread.
async fn fresh() -> Option<Fresh> {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("locks.db");
    let store = SqliteStore::open(&path).await.expect("open");
    Some(
        Fresh::new(Arc::new(store))
            .with_peers(move || {
                let path = path.clone();
                async move {
                    Arc::new(SqliteStore::open(&path).await.expect("open a peer")) as Arc<dyn Store>
                }
            })
            .with_cleanup(async move { drop(dir) }),
    )
}

contract_tests!(fresh);
