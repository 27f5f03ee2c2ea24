//! The shared contract suite on the PostgreSQL engine, against a real server
//! (`ALKSTORE_PG_URL`, or a throwaway cluster the test harness starts).

mod common;

use std::sync::Arc;

use alkstore_contract_suite::{Fresh, contract_tests};
use alkstore_core::Store;
use alkstore_postgres::PgStore;

/// A store in a schema of its own, dropped after the case; peers are further
/// stores on the same schema, each with its own pool and connections.
async fn fresh() -> Option<Fresh> {
    let (store, schema) = common::store("contract").await?;
    let (url, name) = (schema.url.clone(), schema.name.clone());
    Some(
        Fresh::new(Arc::new(store))
            .with_peers(move || {
                let (url, name) = (url.clone(), name.clone());
                async move {
                    Arc::new(PgStore::connect(&url, &name).await.expect("open a peer"))
                        as Arc<dyn Store>
                }
            })
            .with_cleanup(schema.drop()),
    )
}

contract_tests!(fresh);
