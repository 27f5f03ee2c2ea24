//! The shared contract suite on the PostgreSQL engine, against a real server
//! (`ALKSTORE_PG_URL`, or a throwaway cluster the test harness starts).

mod common;

use alkstore_contract_suite::{Fresh, contract_tests};

async fn fresh() -> Option<Fresh> {
    let server = alkstore_testkit::pg::server()?;
    Some(common::fresh_at(&server.url).await)
}

contract_tests!(fresh);
