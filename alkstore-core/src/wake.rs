//! In-process wake-ups for waiting acquires, keyed by lock name (and, for a
//! queued waiter's cue, by the ticket ahead of it).

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// Tells waiting acquires that a name was released.
///
/// An engine signals it when a release lands: directly for releases made in
/// this process, and from its cross-process channel (such as PostgreSQL's
/// LISTEN) where it has one. One waiter per release is woken, in arrival
/// order, so that a release does not send every waiter to the database.
///
/// For an engine that queues, a waiter that is not first in line waits
/// instead for the ticket just ahead of it to leave the queue
/// ([`ReleaseBus::dequeued`], [`ReleaseBus::watch_ticket`]): each leaving
/// wakes one waiter, the next in line, not every waiter of the name.
#[derive(Debug, Default)]
pub struct ReleaseBus {
    names: Watched<String>,
    tickets: Watched<(String, u64)>,
    /// The last tickets that left: a cue that came before its watch
    /// (between an attempt's answer and the watch) still counts.
    left: Mutex<VecDeque<(String, u64)>>,
}

/// How many departed tickets the bus remembers for watches that come late.
const REMEMBERED_DEPARTURES: usize = 256;

/// Notifiers by key, each kept while a [`Watch`] of it lives.
#[derive(Debug)]
struct Watched<K>(Mutex<HashMap<K, Arc<Notify>>>);

impl<K> Default for Watched<K> {
    fn default() -> Self {
        Watched(Mutex::new(HashMap::new()))
    }
}

impl<K: Eq + Hash + Clone> Watched<K> {
    fn watch(&self, key: K) -> Watch<'_, K> {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let notify = map.entry(key.clone()).or_default().clone();
        Watch {
            watched: self,
            key,
            notify: Some(notify),
        }
    }

    /// Runs `f` on the notifier of `key`, if it is watched.
    fn with(&self, key: &K, f: impl FnOnce(&Notify)) {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(notify) = map.get(key) {
            f(notify);
        }
    }

    fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

impl ReleaseBus {
    /// An empty bus.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers interest in `name` for as long as the subscription lives.
    pub fn subscribe(&self, name: &str) -> Subscription<'_> {
        self.names.watch(name.to_owned())
    }

    /// `name` was released: wake one of its waiters, if any.
    pub fn released(&self, name: &str) {
        self.names.with(&name.to_owned(), Notify::notify_one);
    }

    /// Wake every waiter of every name, also those waiting for a ticket
    /// ahead of them to leave (after a close, or when the cross-process
    /// channel may have missed releases or departures).
    pub fn wake_all(&self) {
        let names = self.names.0.lock().unwrap_or_else(|e| e.into_inner());
        let tickets = self.tickets.0.lock().unwrap_or_else(|e| e.into_inner());
        for notify in names.values().chain(tickets.values()) {
            notify.notify_waiters();
            notify.notify_one();
        }
    }

    /// How many names have waiters now.
    pub fn watched_names(&self) -> usize {
        self.names.len()
    }

    /// `ticket` left `name`'s queue (granted, or gone): wake the waiter
    /// watching it, the next in line.
    pub fn dequeued(&self, name: &str, ticket: u64) {
        let key = (name.to_owned(), ticket);
        // Remembered before the watch is looked for, as a watch registers
        // before it looks here: one of the two sees the other.
        {
            let mut left = self.left.lock().unwrap_or_else(|e| e.into_inner());
            if left.len() >= REMEMBERED_DEPARTURES {
                left.pop_front();
            }
            left.push_back(key.clone());
        }
        // Every waiter watching it (readers may all watch one writer), and a
        // watch about to wait.
        self.tickets.with(&key, |notify| {
            notify.notify_waiters();
            notify.notify_one();
        });
    }

    /// Watches `ticket` of `name` for its leaving ([`ReleaseBus::dequeued`]),
    /// for as long as the watch lives. A ticket that left shortly before
    /// (the bus remembers the last few hundred) is cued at once.
    pub fn watch_ticket(&self, name: &str, ticket: u64) -> TicketWatch<'_> {
        let key = (name.to_owned(), ticket);
        let watch = self.tickets.watch(key.clone());
        let left = self.left.lock().unwrap_or_else(|e| e.into_inner());
        if left.contains(&key) {
            watch.notify().notify_one();
        }
        watch
    }

    /// How many tickets have watches now.
    pub fn watched_tickets(&self) -> usize {
        self.tickets.len()
    }
}

/// Interest in one key's notifications, for as long as it lives: a name's
/// releases ([`Subscription`]) or a ticket's leaving ([`TicketWatch`]).
#[derive(Debug)]
pub struct Watch<'a, K: Eq + Hash + Clone> {
    watched: &'a Watched<K>,
    key: K,
    notify: Option<Arc<Notify>>,
}

/// Interest in one name's releases; see [`ReleaseBus::subscribe`].
pub type Subscription<'a> = Watch<'a, String>;

/// A watch on one ticket's leaving; see [`ReleaseBus::watch_ticket`].
pub type TicketWatch<'a> = Watch<'a, (String, u64)>;

impl<K: Eq + Hash + Clone> Watch<'_, K> {
    /// The notifier to wait on. For a name's releases, enable its
    /// `notified()` future before each attempt so that a release landing
    /// during the attempt is not missed.
    pub fn notify(&self) -> &Notify {
        self.notify.as_deref().expect("present until drop")
    }
}

impl<K: Eq + Hash + Clone> Drop for Watch<'_, K> {
    fn drop(&mut self) {
        let mut map = self.watched.0.lock().unwrap_or_else(|e| e.into_inner());
        // Drop our reference under the mutex, so the count below is exact.
        drop(self.notify.take());
        if map
            .get(&self.key)
            .is_some_and(|n| Arc::strong_count(n) == 1)
        {
            map.remove(&self.key);
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

    #[tokio::test]
    async fn a_departure_wakes_the_watch_of_that_ticket_even_when_it_came_first() {
        let bus = ReleaseBus::new();
        let watch = bus.watch_ticket("n", 7);
        let other = bus.watch_ticket("n", 8);
        bus.dequeued("n", 7);
        tokio::time::timeout(std::time::Duration::from_secs(5), watch.notify().notified())
            .await
            .expect("the watch of ticket 7 is cued");
        {
            let not_cued = other.notify().notified();
            tokio::pin!(not_cued);
            assert!(
                futures_poll_once(not_cued).await.is_none(),
                "ticket 8 did not leave"
            );
        }
        // Ticket 9 left before anyone watched it: its watch is cued at once.
        bus.dequeued("n", 9);
        let late = bus.watch_ticket("n", 9);
        tokio::time::timeout(std::time::Duration::from_secs(5), late.notify().notified())
            .await
            .expect("a departure before the watch still cues it");
        drop((watch, other, late));
        assert_eq!(bus.watched_tickets(), 0);
    }

    #[tokio::test]
    async fn waking_all_wakes_the_watches_of_tickets_too() {
        let bus = ReleaseBus::new();
        let name = bus.subscribe("n");
        let ticket = bus.watch_ticket("n", 7);
        let (released, departed) = (name.notify().notified(), ticket.notify().notified());
        tokio::pin!(released, departed);
        released.as_mut().enable();
        departed.as_mut().enable();
        // A broken channel may have missed a release and a departure.
        bus.wake_all();
        let second = std::time::Duration::from_secs(5);
        tokio::time::timeout(second, released)
            .await
            .expect("a name's waiter is woken");
        tokio::time::timeout(second, departed)
            .await
            .expect("a waiter behind a ticket is woken");
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
