//! One LISTEN connection per store, shared by all its waiters: it turns
//! release notifications into wake-ups on the store's release bus.

use std::sync::Arc;
use std::time::Duration;

use alkstore_core::ReleaseBus;
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::task::JoinHandle;

/// The background task that owns the LISTEN connection.
#[derive(Debug)]
pub(crate) struct Listener {
    task: JoinHandle<()>,
}

impl Listener {
    /// Connects, listens on `channel`, and forwards each notification
    /// ("<store tag>:<released name>") to `bus`, except those tagged `tag`
    /// (this store's own releases, which woke its waiters directly). Returns
    /// once LISTEN is in place, so that a waiter that subscribed before cannot
    /// miss a later release.
    pub(crate) async fn start(
        pool: &PgPool,
        channel: &str,
        tag: &str,
        bus: Arc<ReleaseBus>,
    ) -> Result<Self, sqlx::Error> {
        let own = format!("{tag}:");
        let mut listener = PgListener::connect_with(pool).await?;
        listener.listen(channel).await?;
        let task = tokio::spawn(async move {
            let mut pause = Duration::from_millis(10);
            loop {
                match listener.try_recv().await {
                    Ok(Some(notification)) => {
                        pause = Duration::from_millis(10);
                        // "<tag>:<name>"; our own releases woke our waiters already.
                        let payload = notification.payload();
                        if !payload.starts_with(&own) {
                            if let Some((_, name)) = payload.split_once(':') {
                                bus.released(name);
                            }
                        }
                    }
                    // The connection dropped; the next call reconnects and
                    // listens again. Releases in between were missed, so every
                    // waiter tries again now.
                    Ok(None) => {
                        tracing::warn!("release listener lost its connection; reconnecting");
                        bus.wake_all();
                    }
                    // The store closed its pool: the connection must go back.
                    Err(sqlx::Error::PoolClosed) => return,
                    Err(error) => {
                        tracing::warn!(%error, "release listener failed; retrying");
                        bus.wake_all();
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_secs(2));
                    }
                }
            }
        });
        Ok(Listener { task })
    }
}

impl Listener {
    /// Stops listening; the connection goes back to the pool.
    pub(crate) fn stop(&self) {
        self.task.abort();
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop();
    }
}
