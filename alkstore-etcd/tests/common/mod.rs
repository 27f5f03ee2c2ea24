//! The contract suite's fixture on the etcd engine, for every test file
//! that runs contract cases, and what more than one of them asks.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use alkstore_contract_suite::{Fresh, LeaseClock, case};
use alkstore_core::Store;
use alkstore_etcd::{EtcdStore, LEASE_GRANULARITY, SHORTEST_TICKET_LEASE};

/// A store at `url` (a prefix of its own), removed after the case; peers
/// are further stores at the same URL, each with its own channel. Leases
/// are whole seconds, at least the cluster's shortest, and a lapsed one is
/// gone within a second (etcd looks for them every 500 ms).
pub async fn fresh_at(url: String) -> Fresh {
    let store = Arc::new(EtcdStore::connect(&url).await.expect("open the store"));
    let minimum = store.shortest_lease().await.expect("the shortest lease");
    let clock = LeaseClock {
        granularity: LEASE_GRANULARITY,
        minimum,
        expiry_lag: Duration::from_secs(1),
        removes_lapsed: true,
        ticket_lease: SHORTEST_TICKET_LEASE.max(minimum),
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

/// The error `connect` answers for `url` within 10 s (the timeouts of the
/// URLs refused are 2 to 5 s; the margin is a loaded machine's), as its
/// whole source chain.
pub async fn refusal(url: &str) -> String {
    let asked = Instant::now();
    let error = EtcdStore::connect(url)
        .await
        .expect_err("opened what should be refused");
    assert!(
        asked.elapsed() < Duration::from_secs(10),
        "answered after {:?}",
        asked.elapsed()
    );
    let mut chain = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        chain += &format!(": {cause}");
        source = cause.source();
    }
    chain
}

/// The contract cases that show a way of reaching the cluster (a user,
/// TLS) works, on the store `$fresh` makes: every primitive, the watch's
/// wake-ups, the operator's calls, a keep-alive, a fence raise, and
/// independent stores (each authenticating, or shaking hands). The races
/// stay in the main suite: run here too, two runs at once on 2 cores
/// overloaded a one-member cluster past etcd's own 6 s request timeout.
#[allow(unused_macros)]
macro_rules! contract_tests_of_a_way_in {
    ($fresh:path) => {
        alkstore_contract_suite::contract_tests!(
            $fresh;
            lock_woken_by_release,
            renew_is_a_full_window_from_now,
            force_release_ends_the_grant,
            list_pages_live_holders_by_prefix,
            permit_release_ends_its_grant_only,
            readers_share_a_name_and_a_writer_holds_it_alone,
            keepalive_signals_revoked,
            raise_fences_lifts_every_later_fence;
            peers: renew_false_ends_valid_until,
        );
    };
}
