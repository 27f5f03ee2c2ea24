//! In-process wake-ups for waiting acquires, keyed by lock name.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// Tells waiting acquires that a name was released.
///
/// An engine signals it when a release lands: directly for releases made in
/// this process, and from its cross-process channel (such as PostgreSQL's
/// LISTEN) where it has one. One waiter per release is woken, in arrival
/// order, so that a release does not send every waiter to the database.
#[derive(Debug, Default)]
pub struct ReleaseBus {
    names: Mutex<HashMap<String, Arc<Notify>>>,
}

impl ReleaseBus {
    /// An empty bus.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers interest in `name` for as long as the subscription lives.
    pub fn subscribe(&self, name: &str) -> Subscription<'_> {
        let mut names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        let notify = names.entry(name.to_owned()).or_default().clone();
        Subscription {
            bus: self,
            name: name.to_owned(),
            notify: Some(notify),
        }
    }

    /// `name` was released: wake one of its waiters, if any.
    pub fn released(&self, name: &str) {
        let names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(notify) = names.get(name) {
            notify.notify_one();
        }
    }

    /// Wake every waiter of every name (after a close, or when the
    /// cross-process channel may have missed releases).
    pub fn wake_all(&self) {
        let names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        for notify in names.values() {
            notify.notify_waiters();
            notify.notify_one();
        }
    }

    /// How many names have waiters now.
    pub fn watched_names(&self) -> usize {
        self.names.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// Interest in one name's releases; see [`ReleaseBus::subscribe`].
#[derive(Debug)]
pub struct Subscription<'a> {
    bus: &'a ReleaseBus,
    name: String,
    notify: Option<Arc<Notify>>,
}

impl Subscription<'_> {
    /// The notifier to wait on; enable its `notified()` future before each
    /// attempt so that a release landing during the attempt is not missed.
    pub fn notify(&self) -> &Notify {
        self.notify.as_deref().expect("present until drop")
    }
}

impl Drop for Subscription<'_> {
    fn drop(&mut self) {
        let mut names = self.bus.names.lock().unwrap_or_else(|e| e.into_inner());
        // Drop our reference under the mutex, so the count below is exact.
        drop(self.notify.take());
        if names
            .get(&self.name)
            .is_some_and(|n| Arc::strong_count(n) == 1)
        {
            names.remove(&self.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_release_wakes_a_waiter_of_that_name_only() {
        let bus = ReleaseBus::new();
        let a = bus.subscribe("a");
        let b = bus.subscribe("b");
        let wait_a = a.notify().notified();
        let wait_b = b.notify().notified();
        tokio::pin!(wait_a, wait_b);
        wait_a.as_mut().enable();
        wait_b.as_mut().enable();
        bus.released("a");
        tokio::time::timeout(std::time::Duration::from_secs(5), wait_a)
            .await
            .expect("waiter of `a` woken");
        assert!(
            futures_poll_once(wait_b).await.is_none(),
            "waiter of `b` not woken"
        );
    }

    #[test]
    fn entries_go_when_the_last_subscriber_goes() {
        let bus = ReleaseBus::new();
        let one = bus.subscribe("n");
        let two = bus.subscribe("n");
        assert_eq!(bus.watched_names(), 1);
        drop(one);
        assert_eq!(bus.watched_names(), 1);
        drop(two);
        assert_eq!(bus.watched_names(), 0);
    }

    async fn futures_poll_once<F: std::future::Future + Unpin>(f: F) -> Option<F::Output> {
        tokio::time::timeout(std::time::Duration::from_millis(0), f)
            .await
            .ok()
    }
}
