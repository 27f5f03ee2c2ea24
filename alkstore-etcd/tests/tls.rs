//! TLS to the members (`?cacert=…&cert=…&key=…`, as etcdctl's flags): on
//! a cluster of its own, one member serving clients TLS only, and only to
//! clients with a certificate of its CA (`--client-cert-auth`), made by
//! testkit with `openssl`. A selection of contract cases runs through it;
//! a plain connection, the wrong CA, no client certificate and a missing
//! file are refused with a clear error in bounded time.

#[macro_use]
mod common;

use std::sync::OnceLock;

use alkstore_contract_suite::Fresh;
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

contract_tests_of_a_way_in!(fresh);

#[tokio::test]
async fn plain_the_wrong_ca_or_no_certificate_are_refused_clearly() {
    let Some(cluster) = cluster() else { return };
    let certs = cluster.tls.as_ref().expect("a TLS cluster");
    // Plain gRPC to a TLS listener: the connection fails (no hang).
    let plain = common::refusal(&url_with(cluster, "plain", "timeout=2s")).await;
    assert!(plain.contains("transport error"), "{plain}");
    let wrong_ca = common::refusal(&url_with(
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
    let no_cert = common::refusal(&url_with(
        cluster,
        "no-cert",
        &format!("timeout=2s&cacert={}", certs.ca.display()),
    ))
    .await;
    // The member's alert or, as often (TLS 1.3 ends the client's handshake
    // before the member judges its certificate), the connection it then
    // closed: a transport error either way, never an answer.
    assert!(no_cert.contains("transport error"), "{no_cert}");
    let missing =
        common::refusal(&url_with(cluster, "missing", "cacert=/nonexistent/ca.pem")).await;
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
    let versions = report.setting("member versions").unwrap_or_default();
    assert!(versions.starts_with("e0 3."), "{report:?}");
    assert!(report.warnings.is_empty(), "{report:?}");
}
