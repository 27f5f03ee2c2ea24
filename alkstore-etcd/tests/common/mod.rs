//! The contract suite's fixture on the etcd engine, for every test file
//! that runs contract cases.

use std::sync::Arc;
use std::time::Duration;

use alkstore_contract_suite::{Fresh, LeaseClock, case};
use alkstore_core::Store;
use alkstore_etcd::{EtcdStore, LEASE_GRANULARITY};

/// A store at `url` (a prefix of its own), removed after the case; peers
/// are further stores at the same URL, each with its own channel. Leases
/// are whole seconds, at least the cluster's shortest, and a lapsed one is
/// gone within a second (etcd looks for them every 500 ms).
pub async fn fresh_at(url: String) -> Fresh {
    let store = Arc::new(EtcdStore::connect(&url).await.expect("open the store"));
    let clock = LeaseClock {
        granularity: LEASE_GRANULARITY,
        minimum: store.shortest_lease().await.expect("the shortest lease"),
        expiry_lag: Duration::from_secs(1),
        removes_lapsed: true,
    };
    let cleanup = store.clone();
    Fresh::new(store)
        .with_lease_clock(clock)
        .opting_out(
            case!(expired_rows_stay_until_purged),
            "etcd removes a grant's key when its lease ends: no lapsed grant stays to be purged",
        )
        .with_peers(move || {
            let url = url.clone();
            async move {
                Arc::new(EtcdStore::connect(&url).await.expect("open a peer")) as Arc<dyn Store>
            }
        })
        .with_cleanup(async move {
            let _ = cleanup.remove_store().await;
        })
}
