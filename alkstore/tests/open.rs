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
    for url in ["", "locks.db", "mysql://db/app", "sqlite://", "postgres://"] {
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
