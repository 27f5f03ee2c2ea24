//! The shared contract suite on the MariaDB/MySQL engine, against a real
//! server (`ALKSTORE_MYSQL_URL`, or a throwaway MariaDB the test harness starts).

mod common;

use std::sync::Arc;

use alkstore_contract_suite::{Fresh, contract_tests};
use alkstore_core::Store;
use alkstore_mysql::MySqlStore;

/// A store in a database of its own, dropped after the case; peers are
/// further stores on the same database, each with its own pool and connections.
async fn fresh() -> Option<Fresh> {
    let (store, database) = common::store("contract").await?;
    let (url, name) = (database.url.clone(), database.name.clone());
    Some(
        Fresh::new(Arc::new(store))
            .with_peers(move || {
                let (url, name) = (url.clone(), name.clone());
                async move {
                    Arc::new(MySqlStore::connect(&url, &name).await.expect("open a peer"))
                        as Arc<dyn Store>
                }
            })
            .with_cleanup(database.drop()),
    )
}

contract_tests!(fresh);
