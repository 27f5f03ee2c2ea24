//! The shared contract suite on the etcd engine, against a real cluster
//! (`ALKSTORE_ETCD_URL`, or three members the test harness starts).

mod common;

use alkstore_contract_suite::{Fresh, contract_tests};

async fn fresh() -> Option<Fresh> {
    let server = alkstore_testkit::etcd::server()?;
    let url = format!(
        "{}/{}",
        server.url,
        alkstore_testkit::unique_name("contract")
    );
    Some(common::fresh_at(url).await)
}

contract_tests!(fresh);
