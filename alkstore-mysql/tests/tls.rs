//! TLS on a MariaDB that accepts only TLS over TCP (a throwaway server of
//! this file's own, `require_secure_transport`, the testkit's throwaway
//! certificates): what a managed service asks of a client.

use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use alkstore_contract_suite::support::error_chain;
use alkstore_core::{Error, Store};
use alkstore_mysql::MySqlStore;
use alkstore_testkit::mysql::TlsServer;

const TTL: Duration = Duration::from_secs(30);

/// The server, started once for this file's tests.
fn server() -> Option<&'static TlsServer> {
    static SERVER: OnceLock<Option<TlsServer>> = OnceLock::new();
    SERVER.get_or_init(TlsServer::start).as_ref()
}

/// `url`, naming `database`, with `params` added.
fn with(url: &str, database: &str, params: &[(&str, &str)]) -> String {
    let mut url = url::Url::parse(url).unwrap();
    url.set_path(database);
    for (key, value) in params {
        url.query_pairs_mut().append_pair(key, value);
    }
    url.into()
}

fn file(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// Opens a store at `url` (its path names the database) as
/// `alkstore::open` does, takes and releases a lock, and answers the
/// session's cipher as the server saw it (empty: not encrypted).
async fn store_works_encrypted(url: &str) -> Result<String, Error> {
    let store = (alkstore_mysql::ENGINE.open)(url).await?;
    let lock = store.try_lock("n", "a", TTL).await?.expect("a free name");
    lock.release().await?;
    store.close().await?;
    // The cipher, on a store's own pool.
    let database = url::Url::parse(url)
        .unwrap()
        .path()
        .trim_start_matches('/')
        .to_owned();
    let bare = url.replacen(&format!("/{database}"), "", 1);
    let store = MySqlStore::connect(&bare, &database).await?;
    let (_, cipher): (String, String) = sqlx::query_as("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        .fetch_one(store.pool())
        .await
        .unwrap();
    store.drop_database().await?;
    store.close().await?;
    Ok(cipher)
}

/// A database name of its own.
fn database(prefix: &str) -> String {
    alkstore_testkit::unique_name(prefix)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_identity_with_the_tests_ca_opens_a_store_over_tls() {
    let Some(server) = server() else { return };
    let url = with(
        &server.url,
        &database("tls"),
        &[
            ("ssl-mode", "VERIFY_IDENTITY"),
            ("ssl-ca", file(&server.certs.ca)),
        ],
    );
    let cipher = store_works_encrypted(&url).await.unwrap();
    assert!(!cipher.is_empty(), "not encrypted");
    // Doctor says what was asked and what the server saw.
    let report = (alkstore_mysql::ENGINE.inspect)(&url).await.unwrap();
    let setting = |name: &str| report.setting(name).unwrap_or_default().to_owned();
    assert!(
        setting("TLS asked (URL)")
            .contains("certificate and host name verified (ssl-mode=VERIFY_IDENTITY)"),
        "{:?}",
        report.settings
    );
    assert!(
        setting("TLS of this session (Ssl_version, Ssl_cipher)").starts_with("TLSv1."),
        "{:?}",
        report.settings
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_and_preferred_connect_encrypted() {
    let Some(server) = server() else { return };
    for mode in [Some("REQUIRED"), Some("preferred"), None] {
        let params: Vec<(&str, &str)> = mode.iter().map(|m| ("ssl-mode", *m)).collect();
        let url = with(&server.url, &database("tls"), &params);
        let cipher = store_works_encrypted(&url).await.unwrap();
        assert!(!cipher.is_empty(), "{mode:?}: not encrypted");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_identity_refuses_a_certificate_for_another_host_name() {
    let Some(server) = server() else { return };
    // The certificate names 127.0.0.1 only; `localhost` reaches the same
    // server.
    let local = server.url.replace("127.0.0.1", "localhost");
    let ca = file(&server.certs.ca);
    let url = with(
        &local,
        &database("tls"),
        &[("ssl-mode", "VERIFY_IDENTITY"), ("ssl-ca", ca)],
    );
    let text = error_chain(&store_works_encrypted(&url).await.unwrap_err());
    assert!(text.contains("not valid for name"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_identity_and_verify_ca_refuse_a_certificate_of_another_ca() {
    let Some(server) = server() else { return };
    for mode in ["VERIFY_IDENTITY", "VERIFY_CA"] {
        let url = with(
            &server.url,
            &database("tls"),
            &[("ssl-mode", mode), ("ssl-ca", file(&server.certs.other_ca))],
        );
        let text = error_chain(&store_works_encrypted(&url).await.unwrap_err());
        assert!(text.contains("UnknownIssuer"), "{mode}: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_only_server_refuses_disabled_saying_so() {
    let Some(server) = server() else { return };
    let url = with(&server.url, &database("tls"), &[("ssl-mode", "DISABLED")]);
    let text = error_chain(&store_works_encrypted(&url).await.unwrap_err());
    assert!(text.contains("accepts only TLS"), "{text}");
    let password = server.url.split(['@', ':']).nth(2).unwrap();
    assert!(!text.contains(password), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_logs_in_where_the_server_demands_one() {
    let Some(server) = server() else { return };
    let certs = &server.certs;
    let url = with(
        &server.cert_url,
        &database("tls"),
        &[
            ("ssl-mode", "VERIFY_IDENTITY"),
            ("ssl-ca", file(&certs.ca)),
            ("ssl-cert", file(&certs.client_cert)),
            ("ssl-key", file(&certs.client_key)),
        ],
    );
    let cipher = store_works_encrypted(&url).await.unwrap();
    assert!(!cipher.is_empty(), "not encrypted");
    // Without it, the user cannot log in.
    let bare = with(
        &server.cert_url,
        &database("tls"),
        &[("ssl-mode", "VERIFY_IDENTITY"), ("ssl-ca", file(&certs.ca))],
    );
    let text = error_chain(&store_works_encrypted(&bare).await.unwrap_err());
    assert!(text.contains("Access denied for user 'alk'"), "{text}");
}
