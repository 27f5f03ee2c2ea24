//! `alkstore::open` picks the engine from the URL.

use std::time::Duration;

use alkstore::{Error, UrlError};

const TTL: Duration = Duration::from_secs(30);

#[tokio::test]
async fn sqlite_urls_open_working_stores() {
    let memory = alkstore::open("sqlite::memory:").await.unwrap();
    let lock = memory.try_lock("job", "a", TTL).await.unwrap().unwrap();
    assert!(lock.release().await.unwrap());

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let url = format!("sqlite://{}", path.display());
    assert!(url.starts_with("sqlite:///"), "an absolute path: {url}");
    let first = alkstore::open(&url).await.unwrap();
    let second = alkstore::open(&url).await.unwrap();
    let lock = first.try_lock("job", "a", TTL).await.unwrap().unwrap();
    // Both URLs name the same file.
    assert_eq!(
        second.holder("job").await.unwrap().unwrap().fence,
        lock.fence()
    );
    assert!(path.exists());
    assert!(lock.release().await.unwrap());
}

#[tokio::test]
async fn bad_urls_are_refused_with_a_url_error() {
    for url in [
        "",
        "locks.db",
        "redis://db/0",
        "sqlite://",
        "postgres://",
        "mysql://",
    ] {
        match alkstore::open(url).await {
            Err(err @ Error::Database { .. }) => {
                assert!(err.find_source::<UrlError>().is_some(), "{url:?}: {err:?}");
            }
            Err(other) => panic!("{url:?}: expected Error::Database(UrlError), got {other:?}"),
            Ok(_) => panic!("{url:?}: opened"),
        }
    }
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_url_with_schema_opens_that_schema() {
    use alkstore::Store;
    let Some(server) = alkstore_testkit::pg::server() else {
        return;
    };
    let schema = alkstore_testkit::pg::unique_schema("facade");
    let sep = if server.url.contains('?') { '&' } else { '?' };
    let url =
        format!("{}{sep}schema={schema}", server.url).replacen("postgres://", "postgresql://", 1);
    let store = alkstore::open(&url).await.unwrap();
    let lock = store.try_lock("job", "a", TTL).await.unwrap().unwrap();
    let direct = alkstore::postgres::PgStore::connect(&server.url, &schema)
        .await
        .unwrap();
    assert_eq!(
        direct.holder("job").await.unwrap().unwrap().fence,
        lock.fence()
    );
    assert!(lock.release().await.unwrap());
    direct.drop_schema().await.unwrap();
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_url_path_opens_that_database() {
    use alkstore::Store;
    let Some(server) = alkstore_testkit::mysql::server() else {
        return;
    };
    let database = alkstore_testkit::unique_name("facade");
    let url = format!("{}/{database}", server.url).replacen("mysql://", "mariadb://", 1);
    let store = alkstore::open(&url).await.unwrap();
    let lock = store.try_lock("job", "a", TTL).await.unwrap().unwrap();
    let direct = alkstore::mysql::MySqlStore::connect(&server.url, &database)
        .await
        .unwrap();
    assert_eq!(
        direct.holder("job").await.unwrap().unwrap().fence,
        lock.fence()
    );
    assert!(lock.release().await.unwrap());
    direct.drop_database().await.unwrap();
}

/// `alkstore::open("etcd://…")` opens the store under the URL's prefix: a
/// grant made through it is the one the engine's own store sees.
#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_url_opens_that_prefix() {
    use alkstore::Store;
    let Some(server) = alkstore_testkit::etcd::server() else {
        return;
    };
    let url = format!("{}/{}", server.url, alkstore_testkit::unique_name("facade"));
    let store = alkstore::open(&url).await.unwrap();
    let lock = store.try_lock("job", "a", TTL).await.unwrap().unwrap();
    let direct = alkstore::etcd::EtcdStore::connect(&url).await.unwrap();
    assert_eq!(
        direct.holder("job").await.unwrap().unwrap().fence,
        lock.fence()
    );
    assert!(store.try_lock("job", "b", TTL).await.unwrap().is_none());
    assert!(lock.release().await.unwrap());
    direct.remove_store().await.unwrap();
}

/// A URL of an engine this build leaves out names the forms it does open.
#[tokio::test]
async fn unknown_schemes_name_what_this_build_opens() {
    let err = match alkstore::open("redis://db/0").await {
        Err(err) => err,
        Ok(_) => panic!("opened"),
    };
    let url_error = err.find_source::<UrlError>().expect("a UrlError");
    let text = url_error.to_string();
    for engine in alkstore::ENGINES {
        for scheme in engine.schemes {
            assert!(text.contains(scheme), "{scheme} missing from {text}");
        }
    }
}

/// No error of `open`, in its message chain or its `Debug`, holds the
/// password of the URL it was given: unparsable URLs, unknown schemes, a
/// password as a query parameter (for every engine's parser: the value of
/// a parameter it does not know, or one given twice), and a server that
/// cannot be reached.
#[tokio::test]
async fn no_error_of_open_holds_the_password() {
    let mut urls = vec![
        "postgres://app:s3cret@db:notaport/app",
        "postgres://app:s3cret@[::1/app",
        "mysqlx://app:s3cret@db/app",
        "postgres://db/app?password=s3cret&schema=a&schema=b",
        "sqlite://locks.db?password=s3cret",
        "sqlite://locks.db?s3cret",
    ];
    // Nothing listens on port 1: the driver's own error.
    if cfg!(feature = "postgres") {
        urls.push("postgres://app:s3cret@127.0.0.1:1/app");
    }
    if cfg!(feature = "mysql") {
        urls.push("mysql://app:s3cret@127.0.0.1:1/app");
        urls.push("mysql://app:s3cret@db:x/app");
        urls.push("mysql://app@127.0.0.1:1/app?password=s3cret");
        urls.push("mysql://app@127.0.0.1:1/app?token=s3cret&token=s3cret");
    }
    if cfg!(feature = "postgres") {
        urls.push("postgres://app@127.0.0.1:1/app?token=s3cret");
        // TLS parameters: a bad mode, given twice, a certificate without
        // its key, an unreadable file.
        urls.push("postgres://app:s3cret@127.0.0.1:1/app?sslmode=bogus");
        urls.push("postgres://app:s3cret@127.0.0.1:1/app?sslmode=require&ssl-mode=require");
        urls.push("postgres://app:s3cret@127.0.0.1:1/app?sslcert=/c.pem");
        urls.push("postgres://app:s3cret@127.0.0.1:1/app?sslrootcert=/no/such/ca.pem");
    }
    if cfg!(feature = "mysql") {
        urls.push("mysql://app:s3cret@127.0.0.1:1/app?ssl-mode=bogus");
        urls.push("mysql://app:s3cret@127.0.0.1:1/app?ssl-mode=REQUIRED&sslmode=REQUIRED");
        urls.push("mysql://app:s3cret@127.0.0.1:1/app?ssl-key=/k.pem");
        urls.push("mysql://app:s3cret@127.0.0.1:1/app?ssl-ca=/no/such/ca.pem");
    }
    if cfg!(feature = "etcd") {
        urls.push("etcd://app:s3cret@127.0.0.1:1/x?timeout=1s");
        urls.push("etcd://app:s3?cret@127.0.0.1:1/x");
        urls.push("etcd://app:s3#cret@127.0.0.1:1/x");
        urls.push("etcd://app:s3cret@db:x/x");
        urls.push("etcd://127.0.0.1:1/x?password=s3cret");
        urls.push("etcd://127.0.0.1:1/x?token=s3cret");
        urls.push("etcd://127.0.0.1:1/x?s3cret");
        urls.push("etcd://127.0.0.1:1/x?timeout=1s&timeout=1s&token=s3cret");
    }
    let mut opens = Vec::new();
    for url in urls {
        opens.push((url, tokio::spawn(alkstore::open(url))));
    }
    // At once: a server that refuses connections is retried until the
    // connect timeout.
    for (url, open) in opens {
        let err = match open.await.unwrap() {
            Err(err) => err,
            Ok(_) => panic!("{url}: opened"),
        };
        let mut text = format!("{err:?}");
        let mut source: Option<&dyn std::error::Error> = Some(&err);
        while let Some(cause) = source {
            text.push_str(&cause.to_string());
            source = cause.source();
        }
        assert!(!text.contains("s3cret"), "{url}: {text}");
    }
}
