//! The shared contract suite on the PostgreSQL engine, against a real server
//! (`ALKSTORE_PG_URL`, or a throwaway cluster the test harness starts).

mod common;

use std::sync::Arc;

use alkstore_contract_suite::{Fresh, contract_tests};

/// A store in a schema of its own, dropped after the case.
async fn fresh() -> Option<Fresh> {
    let (store, schema) = common::store("contract").await?;
    Some(Fresh::new(Arc::new(store)).with_cleanup(schema.drop()))
}

contract_tests!(fresh);
