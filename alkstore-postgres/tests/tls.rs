//! TLS on a PostgreSQL that accepts only TLS connections (a throwaway
//! cluster of this file's own, `ssl = on`, `hostnossl … reject`, the
//! testkit's throwaway certificates): what a managed service asks of a
//! client, straight and through PgBouncer.

use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use alkstore_contract_suite::support::error_chain;
use alkstore_core::{Error, Store};
use alkstore_postgres::PgStore;
use alkstore_testkit::pg::{self, TlsOwn};
use alkstore_testkit::pgbouncer::{Bouncer, Mode};
use sqlx::Connection;

const TTL: Duration = Duration::from_secs(30);

/// The cluster, started once for this file's tests.
fn server() -> Option<&'static TlsOwn> {
    static SERVER: OnceLock<Option<TlsOwn>> = OnceLock::new();
    SERVER.get_or_init(TlsOwn::start).as_ref()
}

/// `url` with `params` added.
fn with(url: &str, params: &[(&str, &Path)]) -> String {
    let mut url = url::Url::parse(url).unwrap();
    for (key, value) in params {
        url.query_pairs_mut()
            .append_pair(key, value.to_str().unwrap());
    }
    url.into()
}

/// Opens a store at `url` in a schema of its own, takes and releases a
/// lock, and answers whether the server saw the store's session encrypted
/// (`pg_stat_ssl`).
async fn store_works_encrypted(url: &str) -> Result<bool, Error> {
    let store = PgStore::connect(url, &pg::unique_schema("tls")).await?;
    let lock = store.try_lock("n", "a", TTL).await?.expect("a free name");
    lock.release().await?;
    let (encrypted,): (bool,) =
        sqlx::query_as("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .fetch_one(store.pool())
            .await
            .unwrap();
    store.drop_schema().await?;
    store.close().await?;
    Ok(encrypted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_with_the_tests_ca_opens_a_store_over_tls() {
    let Some(server) = server() else { return };
    let certs = &server.certs;
    let url = with(&server.url, &[("sslrootcert", &certs.ca)]) + "&sslmode=verify-full";
    assert!(store_works_encrypted(&url).await.unwrap());
    // The same through `alkstore::open`'s entry for the engine.
    let store = (alkstore_postgres::ENGINE.open)(&url).await.unwrap();
    store.close().await.unwrap();
    // Doctor says what was asked and what the server saw.
    let report = (alkstore_postgres::ENGINE.inspect)(&url).await.unwrap();
    let setting = |name: &str| report.setting(name).unwrap_or_default().to_owned();
    assert!(
        setting("TLS asked (URL)")
            .contains("certificate and host name verified (sslmode=verify-full)"),
        "{:?}",
        report.settings
    );
    assert!(
        setting("TLS of this session (pg_stat_ssl)").starts_with("TLSv1.3, "),
        "{:?}",
        report.settings
    );
    let plain =
        (alkstore_postgres::ENGINE.inspect)(&format!("{}?sslmode=disable", server.url)).await;
    assert!(
        plain.is_err(),
        "a TLS-only server let doctor in without TLS"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_and_prefer_connect_encrypted() {
    let Some(server) = server() else { return };
    for mode in ["require", "prefer"] {
        let url = format!("{}?sslmode={mode}", server.url);
        assert!(store_works_encrypted(&url).await.unwrap(), "{mode}");
    }
    // And by default (libpq's `prefer`).
    assert!(store_works_encrypted(&server.url).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_refuses_a_certificate_for_another_host_name() {
    let Some(server) = server() else { return };
    // The certificate names 127.0.0.1 only; `localhost` reaches the same
    // server.
    let url = with(
        &server.url.replace("127.0.0.1", "localhost"),
        &[("sslrootcert", &server.certs.ca)],
    );
    let err = store_works_encrypted(&(url.clone() + "&sslmode=verify-full"))
        .await
        .unwrap_err();
    let text = error_chain(&err);
    assert!(text.contains("not valid for name"), "{text}");
    // verify-ca checks the CA, not the name.
    assert!(
        store_works_encrypted(&(url + "&sslmode=verify-ca"))
            .await
            .unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_and_verify_ca_refuse_a_certificate_of_another_ca() {
    let Some(server) = server() else { return };
    for mode in ["verify-full", "verify-ca"] {
        let url =
            with(&server.url, &[("sslrootcert", &server.certs.other_ca)]) + "&sslmode=" + mode;
        let err = store_works_encrypted(&url).await.unwrap_err();
        let text = error_chain(&err);
        assert!(text.contains("UnknownIssuer"), "{mode}: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_only_server_refuses_disable_saying_so() {
    let Some(server) = server() else { return };
    let err = store_works_encrypted(&format!("{}?sslmode=disable", server.url))
        .await
        .unwrap_err();
    let text = error_chain(&err);
    assert!(text.contains("no encryption"), "{text}");
    let password = server.url.split(['@', ':']).nth(2).unwrap();
    assert!(!text.contains(password), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_logs_in_where_the_server_demands_one() {
    let Some(server) = server() else { return };
    let certs = &server.certs;
    let url = with(
        &server.cert_url,
        &[
            ("sslrootcert", &certs.ca),
            ("sslcert", &certs.client_cert),
            ("sslkey", &certs.client_key),
        ],
    ) + "&sslmode=verify-full";
    assert!(store_works_encrypted(&url).await.unwrap());
    // Without it, the role cannot log in.
    let bare = with(&server.cert_url, &[("sslrootcert", &certs.ca)]) + "&sslmode=verify-full";
    let text = error_chain(&store_works_encrypted(&bare).await.unwrap_err());
    assert!(
        text.contains("requires a valid client certificate"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_tls_files_are_refused_before_connecting() {
    let Some(server) = server() else { return };
    let url = format!(
        "{}?sslmode=verify-full&sslrootcert=/no/such/ca.pem",
        server.url
    );
    let text = error_chain(&store_works_encrypted(&url).await.unwrap_err());
    assert!(
        text.contains("`sslrootcert`") && text.contains("/no/such/ca.pem"),
        "{text}"
    );
}

/// Through PgBouncer with TLS on both sides (`client_tls_sslmode =
/// require`, `server_tls_sslmode = verify-ca`), in transaction mode, with
/// the `listen=` connection straight to the TLS-only server: the store
/// works, its LISTEN session is up on the server (which took it over TLS,
/// as it takes nothing else), and PgBouncer refuses a client without TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_pgbouncer_with_tls_on_both_sides_and_a_direct_listen() {
    let Some(server) = server() else { return };
    let certs = &server.certs;
    let file = |p: &Path| p.to_str().unwrap().to_owned();
    let settings = [
        "client_tls_sslmode = require".to_owned(),
        format!("client_tls_cert_file = {}", file(&certs.server_cert)),
        format!("client_tls_key_file = {}", file(&certs.server_key)),
        "server_tls_sslmode = verify-ca".to_owned(),
        format!("server_tls_ca_file = {}", file(&certs.ca)),
    ];
    let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
    let Some(bouncer) = Bouncer::start_for(&server.url, Mode::Transaction, &settings) else {
        return;
    };
    let url = with(
        &bouncer.url_for("postgres", "pooler=transaction"),
        &[("sslrootcert", &certs.ca)],
    ) + &format!(
        "&sslmode=verify-full&listen=127.0.0.1:{}",
        server.cluster.port
    );
    let schema = pg::unique_schema("tlsbouncer");
    let store = PgStore::connect(&url, &schema).await.unwrap();
    let holder = store.try_lock("n", "a", TTL).await.unwrap().unwrap();
    // A waiter makes the store listen.
    let waiting = store.lock("n", "b", TTL, Duration::from_secs(30));
    let listening = async {
        // Over TLS with the superuser, as the server takes nothing else.
        let direct: sqlx::postgres::PgConnectOptions =
            format!("{}?sslmode=require", server.url).parse().unwrap();
        let mut admin = sqlx::PgConnection::connect_with(&direct).await.unwrap();
        let started = std::time::Instant::now();
        loop {
            let (listening,): (bool,) = sqlx::query_as(
                "SELECT EXISTS (SELECT FROM pg_stat_activity
                 WHERE query LIKE 'LISTEN \"alkstore_' || (SELECT oid FROM pg_namespace
                                                          WHERE nspname = $1) || '\"%')",
            )
            .bind(&schema)
            .fetch_one(&mut admin)
            .await
            .unwrap();
            if listening {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "no LISTEN session on the server; PgBouncer's log: {}",
                bouncer.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        admin.close().await.unwrap();
        holder.release().await.unwrap();
    };
    let (granted, ()) = tokio::join!(waiting, listening);
    granted
        .unwrap()
        .expect("granted after the release")
        .release()
        .await
        .unwrap();
    store.drop_schema().await.unwrap();
    store.close().await.unwrap();
    // PgBouncer takes no client without TLS.
    let plain = bouncer.url_for("postgres", "pooler=transaction&sslmode=disable");
    let text = error_chain(&PgStore::connect(&plain, &schema).await.unwrap_err());
    assert!(text.contains("SSL required"), "{text}");
}
