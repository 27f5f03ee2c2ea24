//! The `metrics` feature, exposed in Prometheus' text format: a few grants,
//! refusals, a handoff to a waiter and a forced release, then what a scrape
//! of `/metrics` would read.
//!
//! Run with `cargo run --example prometheus --features metrics`.

use std::sync::Arc;
use std::time::Duration;

use alkstore::Store;
use metrics_exporter_prometheus::PrometheusBuilder;

const TTL: Duration = Duration::from_secs(30);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Serve `handle.render()` at /metrics with the web framework of your choice.
    let handle = PrometheusBuilder::new().install_recorder()?;

    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("metrics.db").display());
    let store: Arc<dyn Store> = alkstore::open(&url).await?.into();
    let first = store
        .try_lock("invoices", "worker-1", TTL)
        .await?
        .expect("free");
    assert!(store.try_lock("invoices", "worker-2", TTL).await?.is_none());
    let waiter = {
        let store = store.clone();
        tokio::spawn(async move { store.lock("invoices", "worker-3", TTL, TTL).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    first.release().await?;
    let third = waiter.await??.expect("handed over");
    third.renew(TTL).await?;
    store.force_release("invoices").await?;
    assert!(!third.release().await?);
    store.close().await?;

    print!("{}", handle.render());
    Ok(())
}
