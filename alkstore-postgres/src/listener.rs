//! One LISTEN connection per store, shared by all its waiters: it turns
//! release notifications into wake-ups on the store's release bus.

use std::sync::Arc;
use std::time::Duration;

use alkstore_core::{BoxError, ReleaseBus};
use alkstore_sqlx::Wakeups;
use async_trait::async_trait;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use tokio::sync::OnceCell;
use tokio::task::JoinHandle;

/// How long a waiter polls at most when no notification comes (expiries
/// notify nobody, and a notification can be lost while the listener reconnects).
pub(crate) const POLL_CEILING: Duration = Duration::from_millis(250);

/// Releases in other processes reach a store's waiters by LISTEN/NOTIFY:
/// one listener per store, started by its first waiting acquire.
#[derive(Debug)]
pub(crate) struct Notifications {
    /// The pool of one connection the listener uses, so that it never
    /// holds a connection of the caller's pool.
    pool: PgPool,
    channel: String,
    /// This store's mark on the notifications its releases send.
    tag: String,
    listener: OnceCell<Listener>,
}

impl Notifications {
    /// Notifications on `channel`, skipping those marked `tag`, over a
    /// connection made with `options` when the first waiter comes.
    pub(crate) fn new(options: PgConnectOptions, channel: &str, tag: &str) -> Self {
        Notifications {
            pool: PgPoolOptions::new()
                .max_connections(1)
                .max_lifetime(None)
                .idle_timeout(None)
                .connect_lazy_with(options),
            channel: channel.to_owned(),
            tag: tag.to_owned(),
            listener: OnceCell::new(),
        }
    }
}

#[async_trait]
impl Wakeups for Notifications {
    fn poll_ceiling(&self) -> Duration {
        POLL_CEILING
    }

    async fn prepare(&self, bus: &Arc<ReleaseBus>) -> Result<(), BoxError> {
        self.listener
            .get_or_try_init(|| Listener::start(&self.pool, &self.channel, &self.tag, bus.clone()))
            .await?;
        Ok(())
    }

    async fn close(&self) {
        if let Some(listener) = self.listener.get() {
            listener.stop();
        }
        self.pool.close().await;
    }
}

/// The background task that owns the LISTEN connection.
#[derive(Debug)]
struct Listener {
    task: JoinHandle<()>,
}

impl Listener {
    /// Connects, listens on `channel`, and forwards each notification
    /// ("<store tag>:<released name>") to `bus`, except those tagged `tag`
    /// (this store's own releases, which woke its waiters directly). Returns
    /// once LISTEN is in place, so that a waiter that subscribed before cannot
    /// miss a later release.
    async fn start(
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
    fn stop(&self) {
        self.task.abort();
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop();
    }
}
