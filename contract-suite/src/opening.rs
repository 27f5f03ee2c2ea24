//! What opening a store on a server must show, whatever the database,
//! written once: each server engine's tests call these with its own way of
//! opening a store (`open`: a new store, with its own pool, on one test
//! namespace).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use alkstore_core::{Result, Store};

use crate::support::error_chain;

const TTL: Duration = Duration::from_secs(30);

/// Eight stores opening one new namespace at once all succeed, and share it:
/// a grant through the first refuses the others. Answers the stores (to
/// drop the namespace through one).
pub async fn concurrent_opens_succeed<F, Fut>(open: F) -> Vec<Arc<dyn Store>>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<Arc<dyn Store>>> + Send + 'static,
{
    let opens: Vec<_> = (0..8).map(|_| tokio::spawn(open())).collect();
    let mut stores = Vec::new();
    for open in opens {
        stores.push(open.await.unwrap().expect("every concurrent open succeeds"));
    }
    let lock = stores[0]
        .try_lock("shared", "a", TTL)
        .await
        .unwrap()
        .expect("the name is free");
    for store in &stores[1..] {
        assert!(store.try_lock("shared", "b", TTL).await.unwrap().is_none());
    }
    assert!(lock.release().await.unwrap());
    stores
}

/// Fences keep rising across stores and reconnects: five stores opened one
/// after the other (a new pool each), each granting and releasing one name.
pub async fn fences_rise_across_reconnects<F, Fut>(open: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<Arc<dyn Store>>>,
{
    let mut last = 0;
    for _ in 0..5 {
        let store = open().await.expect("open the store again");
        let lock = store.try_lock("job", "a", TTL).await.unwrap().unwrap();
        assert!(lock.fence() > last, "{} after {last}", lock.fence());
        last = lock.fence();
        assert!(lock.release().await.unwrap());
        store.close().await.unwrap();
    }
}

/// A server that refuses the connection (`refused`: a URL to port 1 of
/// 127.0.0.1, with the password `pw-secret`) is answered at once, not after
/// the pool's 10 s timeout, with its cause and where the connection went,
/// and no password; so is a wrong password (`wrong_password`, whose answer
/// must say `denied_says`), when a server is there.
pub async fn a_failed_connect_answers_at_once_with_its_cause<F, Fut>(
    connect: F,
    refused: &str,
    wrong_password: Option<(String, &str)>,
) where
    F: Fn(String) -> Fut,
    Fut: Future<Output = Result<Arc<dyn Store>>>,
{
    let asked = Instant::now();
    let text = match connect(refused.to_owned()).await {
        Err(error) => error_chain(&error),
        Ok(_) => panic!("nothing listens on port 1"),
    };
    let took = asked.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "answered after {took:?}: {text}"
    );
    assert!(text.contains("127.0.0.1:1"), "{text}");
    assert!(text.to_lowercase().contains("refused"), "{text}");
    assert!(!text.contains("pw-secret"), "{text}");
    if let Some((url, denied_says)) = wrong_password {
        let text = match connect(url).await {
            Err(error) => error_chain(&error),
            Ok(_) => panic!("a wrong password was let in"),
        };
        assert!(text.contains(denied_says), "{text}");
        assert!(!text.contains("not-the-password"), "{text}");
    }
}
