//! TLS to the members (`?cacert=…&cert=…&key=…`, as etcdctl's flags): on
//! a cluster of its own, one member serving clients TLS only, and only to
//! clients with a certificate of its CA (`--client-cert-auth`), made by
//! testkit with `openssl`. A selection of contract cases runs through it;
//! a plain connection, the wrong CA, no client certificate and a missing
//! file are refused with a clear error in bounded time.

mod common;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use alkstore_contract_suite::{Fresh, contract_tests};
use alkstore_etcd::EtcdStore;
use alkstore_testkit::etcd::{Cluster, REQUIRE_NAME, URL_VAR};

/// The TLS cluster the tests share; `None` when it cannot be had (etcd or
/// openssl not installed, or `ALKSTORE_ETCD_URL` names another cluster)
/// and etcd is not required.
fn cluster() -> Option<&'static Cluster> {
    static CLUSTER: OnceLock<Option<Cluster>> = OnceLock::new();
    CLUSTER
        .get_or_init(|| {
            if std::env::var(URL_VAR).is_ok_and(|url| !url.is_empty()) {
                eprintln!(
                    "tls: {URL_VAR} names a cluster without this test's certificates; skipped"
                );
                return None;
            }
            match Cluster::start_tls(1) {
                Ok(cluster) => Some(cluster),
                Err(why) => {
                    alkstore_testkit::process::skip_or_fail(
                        REQUIRE_NAME,
                        &why,
                        "install etcd-server and openssl",
                    );
                    None
                }
            }
        })
        .as_ref()
}

/// The cluster's URL under a prefix of its own, with `query`.
fn url_with(cluster: &Cluster, name: &str, query: &str) -> String {
    format!(
        "{}/{}?{query}",
        cluster.url(),
        alkstore_testkit::unique_name(name)
    )
}

/// `cacert`, `cert` and `key`: the CA and the client certificate.
fn trusted(cluster: &Cluster) -> String {
    let certs = cluster.tls.as_ref().expect("a TLS cluster");
    format!(
        "cacert={}&cert={}&key={}",
        certs.ca.display(),
        certs.client_cert.display(),
        certs.client_key.display()
    )
}

async fn fresh() -> Option<Fresh> {
    let cluster = cluster()?;
    Some(common::fresh_at(url_with(cluster, "case", &trusted(cluster))).await)
}

// Contract cases over TLS: every primitive, the watch's wake-ups, the
// operator's calls, a fence raise, and independent stores (each with its
// handshakes). The races stay in the main suite: run here, two runs at
// once on 2 cores overloaded the one member past etcd's own 6 s request
// timeout.
contract_tests!(
    fresh;
    lock_woken_by_release,
    renew_is_a_full_window_from_now,
    force_release_ends_the_grant,
    list_pages_live_holders_by_prefix,
    permit_release_ends_its_grant_only,
    readers_share_a_name_and_a_writer_holds_it_alone,
    raise_fences_lifts_every_later_fence;
    peers: renew_false_ends_valid_until,
);

/// The error `connect` answers for `url` within 10 s (the URLs below
/// bound each call by 2 s; the margin is a loaded machine's), with its
/// whole source chain.
async fn refusal(url: &str) -> String {
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

#[tokio::test]
async fn plain_the_wrong_ca_or_no_certificate_are_refused_clearly() {
    let Some(cluster) = cluster() else { return };
    let certs = cluster.tls.as_ref().expect("a TLS cluster");
    // Plain gRPC to a TLS listener: the connection fails (no hang).
    let plain = refusal(&url_with(cluster, "plain", "timeout=2s")).await;
    assert!(plain.contains("transport error"), "{plain}");
    let wrong_ca = refusal(&url_with(
        cluster,
        "wrong-ca",
        &format!(
            "timeout=2s&cacert={}&cert={}&key={}",
            certs.other_ca.display(),
            certs.client_cert.display(),
            certs.client_key.display()
        ),
    ))
    .await;
    assert!(
        wrong_ca.to_lowercase().contains("certificate"),
        "{wrong_ca}"
    );
    // Without a client certificate, the member ends the handshake.
    let no_cert = refusal(&url_with(
        cluster,
        "no-cert",
        &format!("timeout=2s&cacert={}", certs.ca.display()),
    ))
    .await;
    // The member's alert or, as often (TLS 1.3 ends the client's handshake
    // before the member judges its certificate), the connection it then
    // closed: a transport error either way, never an answer.
    assert!(no_cert.contains("transport error"), "{no_cert}");
    let missing = refusal(&url_with(cluster, "missing", "cacert=/nonexistent/ca.pem")).await;
    assert!(
        missing.contains("cannot read the CA certificate (cacert=) /nonexistent/ca.pem"),
        "{missing}"
    );
}

/// doctor over TLS, each member's version asked at its advertised
/// `https://` URL.
#[tokio::test]
async fn doctor_reads_the_cluster_over_tls() {
    let Some(cluster) = cluster() else { return };
    let url = url_with(cluster, "doctor", &trusted(cluster));
    let report = (alkstore_etcd::ENGINE.inspect)(&url).await.unwrap();
    let versions = report
        .settings
        .iter()
        .find(|(k, _)| k == "member versions")
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    assert!(versions.starts_with("e0 3."), "{report:?}");
    assert!(report.warnings.is_empty(), "{report:?}");
}
