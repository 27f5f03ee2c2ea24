//! The shared contract suite on the etcd engine, against a real cluster
//! (`ALKSTORE_ETCD_URL`, or three members the test harness starts).

use std::sync::Arc;

use alkstore_contract_suite::{Fresh, contract_tests};
use alkstore_core::Store;
use alkstore_etcd::EtcdStore;

/// A store under a prefix of its own, removed after the case; peers are
/// further stores on the same prefix, each with its own channel.
async fn fresh() -> Option<Fresh> {
    let server = alkstore_testkit::etcd::server()?;
    let url = format!(
        "{}/{}",
        server.url,
        alkstore_testkit::unique_name("contract")
    );
    let store = Arc::new(EtcdStore::connect(&url).await.expect("open the store"));
    let cleanup = store.clone();
    Some(
        Fresh::new(store)
            .with_peers(move || {
                let url = url.clone();
                async move {
                    Arc::new(EtcdStore::connect(&url).await.expect("open a peer")) as Arc<dyn Store>
                }
            })
            .with_cleanup(async move {
                let _ = cleanup.remove_store().await;
            }),
    )
}

contract_tests!(fresh);
