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
    /// ([`Notice`]) to `bus`, except those tagged `tag`
    /// (this store's own releases, which woke its waiters directly). Returns
    /// once LISTEN is in place, so that a waiter that subscribed before cannot
    /// miss a later release.
    async fn start(
        pool: &PgPool,
        channel: &str,
        tag: &str,
        bus: Arc<ReleaseBus>,
    ) -> Result<Self, sqlx::Error> {
        let tag = tag.to_owned();
        let mut listener = PgListener::connect_with(pool).await?;
        listener.listen(channel).await?;
        let task = tokio::spawn(async move {
            let mut pause = Duration::from_millis(10);
            loop {
                match listener.try_recv().await {
                    Ok(Some(notification)) => {
                        pause = Duration::from_millis(10);
                        // Our own releases and departures woke our waiters already.
                        match Notice::read(notification.payload()) {
                            Some((from, _)) if from == tag => {}
                            Some((_, Notice::Released(name))) => bus.released(name),
                            Some((_, Notice::Left(name, ticket))) => bus.dequeued(name, ticket),
                            None => {}
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

/// What a notification on a store's channel tells, as its payload reads.
#[derive(Debug, PartialEq, Eq)]
enum Notice<'a> {
    /// "<store tag>:<name>": a grant of the name was released.
    Released(&'a str),
    /// "<store tag>#<ticket>:<name>": a waiter's ticket left the name's
    /// queue (granted, or gone).
    Left(&'a str, u64),
}

impl<'a> Notice<'a> {
    /// The store tag and the notice of `payload`; `None` for a payload of
    /// another shape (store tags hold neither ':' nor '#'; names may).
    fn read(payload: &'a str) -> Option<(&'a str, Notice<'a>)> {
        let (head, name) = payload.split_once(':')?;
        Some(match head.split_once('#') {
            None => (head, Notice::Released(name)),
            Some((tag, ticket)) => (tag, Notice::Left(name, ticket.parse().ok()?)),
        })
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

#[cfg(test)]
mod tests {
    use super::Notice;

    #[test]
    fn payloads_read_as_releases_and_departures() {
        assert_eq!(
            Notice::read("12.0.5:jobs:nightly"),
            Some(("12.0.5", Notice::Released("jobs:nightly")))
        );
        assert_eq!(
            Notice::read("12.0.5#42:a#b"),
            Some(("12.0.5", Notice::Left("a#b", 42)))
        );
        assert_eq!(Notice::read("12.0.5#x:a"), None);
        assert_eq!(Notice::read("no colon"), None);
    }
}
