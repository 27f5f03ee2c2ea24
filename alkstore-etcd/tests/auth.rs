//! etcd's users and roles: a store whose URL names a user
//! (`etcd://user:password@…`) authenticates, and its calls carry the token.
//! On clusters of their own, one member each, with authentication on: a
//! selection of contract cases runs through a user allowed only its prefix
//! (and to read the marker above it); a missing user, a wrong password, a
//! user without rights and one that may not read the marker above are
//! refused with a clear error (the password never shown); and, on a
//! member whose tokens are forgotten after 1 s unused
//! (`--auth-token-ttl=1`), a token the cluster forgot is replaced.

#[macro_use]
mod common;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use alkstore_contract_suite::Fresh;
use alkstore_core::Store;
use alkstore_etcd::EtcdStore;
use alkstore_testkit::etcd::{Cluster, REQUIRE_NAME, URL_VAR};

const ROOT_PASSWORD: &str = "root-secret";
const USER: &str = "alk";
/// Percent-encoded in URLs: `p%40ss%3Aword`.
const PASSWORD: &str = "p@ss:word";
const PREFIX: &str = "/locks/";

/// A cluster of this test's own with authentication on (`flags` given to
/// its member), and users: `alk`, allowed to read and write under
/// `/locks/` and to read `/meta/alkstore` (the marker of a store at `/`,
/// which would hold its keys); `nested`, allowed the same but not that
/// marker; `nobody`, allowed nothing. `None` when it cannot be had (etcd
/// not installed, or `ALKSTORE_ETCD_URL` names a cluster whose users this
/// test cannot change) and etcd is not required.
fn start(flags: &[&str]) -> Option<Cluster> {
    if std::env::var(URL_VAR).is_ok_and(|url| !url.is_empty()) {
        eprintln!("auth: {URL_VAR} names a cluster whose users this test cannot change; skipped");
        return None;
    }
    let started = Cluster::start_with(1, flags).and_then(|cluster| {
        cluster.enable_auth(ROOT_PASSWORD)?;
        cluster.add_user(USER, PASSWORD, Some(PREFIX))?;
        cluster.grant_read(USER, "/meta/alkstore")?;
        cluster.add_user("nested", "nested-secret", Some(PREFIX))?;
        cluster.add_user("nobody", "nothing", None)?;
        Ok(cluster)
    });
    match started {
        Ok(cluster) => Some(cluster),
        Err(why) => {
            alkstore_testkit::process::skip_or_fail(REQUIRE_NAME, &why, "install etcd-server");
            None
        }
    }
}

/// The cluster the tests share ([`start`], etcd's default token TTL);
/// none of them stops it.
fn cluster() -> Option<&'static Cluster> {
    static CLUSTER: OnceLock<Option<Cluster>> = OnceLock::new();
    CLUSTER.get_or_init(|| start(&[])).as_ref()
}

/// `etcd://user_info@endpoints/locks/<unique>`.
fn url_as(cluster: &Cluster, user_info: &str, name: &str) -> String {
    let endpoints = cluster.url();
    let endpoints = endpoints.trim_start_matches("etcd://");
    let prefix = alkstore_testkit::unique_name(name);
    format!("etcd://{user_info}{endpoints}{PREFIX}{prefix}")
}

/// As `alk`.
fn user_url(cluster: &Cluster, name: &str) -> String {
    url_as(cluster, "alk:p%40ss%3Aword@", name)
}

async fn fresh() -> Option<Fresh> {
    Some(common::fresh_at(user_url(cluster()?, "case")).await)
}

contract_tests_of_a_way_in!(fresh);

/// [`common::refusal`], which shows none of the passwords.
async fn refusal(url: &str) -> String {
    let chain = common::refusal(url).await;
    for password in [PASSWORD, "not-the-password", "nothing", "nested-secret"] {
        assert!(!chain.contains(password), "a password shown: {chain}");
    }
    chain
}

#[tokio::test]
async fn no_user_a_wrong_password_or_no_rights_are_refused_clearly() {
    let Some(cluster) = cluster() else { return };
    let none = refusal(&url_as(cluster, "", "anon")).await;
    assert!(
        none.contains("authentication on") && none.contains("user:password@"),
        "{none}"
    );
    let wrong = refusal(&url_as(cluster, "alk:not-the-password@", "wrong")).await;
    assert!(
        wrong.contains("refused the user alk") && wrong.contains("invalid user ID or password"),
        "{wrong}"
    );
    let denied = refusal(&url_as(cluster, "nobody:nothing@", "denied")).await;
    assert!(denied.contains("permission denied"), "{denied}");
    // Allowed its prefix, but not to read the marker of a store at `/`:
    // such a store's user could write this one's keys unseen.
    let nested = refusal(&url_as(cluster, "nested:nested-secret@", "nested")).await;
    assert!(
        nested.contains("may not read \"/meta/alkstore\"")
            && nested.contains("etcdctl role grant-permission ROLE read /meta/alkstore"),
        "{nested}"
    );
}

/// A token the cluster forgot is replaced, and the call it failed is
/// answered: after the token's 1 s TTL unused, the store authenticates
/// again (counted). Then the member restarts and the store's grant renews:
/// the member replays the authentications in its log, so the token
/// survives the restart (the test first expected it lost, and found it
/// kept). On a cluster of its own: the others' calls fail while it
/// restarts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_the_cluster_forgot_is_replaced() {
    let Some(cluster) = start(&["--auth-token-ttl=1"]) else {
        return;
    };
    let store = EtcdStore::connect(&user_url(&cluster, "token"))
        .await
        .unwrap();
    let ttl = Duration::from_secs(60);
    let lock = store
        .try_lock("job", "a", ttl)
        .await
        .unwrap()
        .expect("free");
    let raw = alkstore_etcd::raw::Raw::of(&store);
    let first = raw.authentications();
    assert_eq!(first, 1, "the store authenticated once to open");
    // Unused past the token's TTL (etcd looks every second), then renewed:
    // until a renewal had to authenticate again, which it must within 15 s.
    let idle = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(
            lock.renew(ttl).await.unwrap(),
            "renewed after the token expired"
        );
        if raw.authentications() > first {
            break;
        }
        assert!(
            idle.elapsed() < Duration::from_secs(15),
            "no token forgotten after 15 s of 1.5 s idle spells (--auth-token-ttl=1)"
        );
    }
    assert_eq!(
        store.holder("job").await.unwrap().map(|h| h.fence),
        Some(lock.fence())
    );
    cluster.kill(0).unwrap();
    cluster.restart(0).unwrap();
    let back = Instant::now();
    loop {
        match lock.renew(ttl).await {
            Ok(renewed) => break assert!(renewed, "the grant was lost with the restart"),
            Err(error) => assert!(
                back.elapsed() < Duration::from_secs(30),
                "no renewal 30 s after the restart: {error:?}; the member's log: {}",
                cluster.log_tail(&cluster.members[0])
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(store.try_lock("job", "b", ttl).await.unwrap().is_none());
    assert!(lock.release().await.unwrap());
    store.remove_store().await.unwrap();
}

/// doctor through the user: members, leader and every member's version
/// read with its token, nothing unknown.
#[tokio::test]
async fn doctor_reads_the_cluster_as_a_user() {
    let Some(cluster) = cluster() else { return };
    let report = (alkstore_etcd::ENGINE.inspect)(&user_url(cluster, "doctor"))
        .await
        .unwrap();
    let setting = |name: &str| report.setting(name).unwrap_or_default().to_owned();
    assert!(setting("version").starts_with('3'), "{report:?}");
    assert_eq!(
        setting("member versions"),
        format!("e0 {}", setting("version"))
    );
    assert!(report.warnings.is_empty(), "{report:?}");
    assert!(!format!("{report:?}").contains(PASSWORD));
}
