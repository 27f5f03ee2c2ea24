//! In-process wake-ups for waiting acquires, keyed by lock name (and, for a
//! queued waiter's cue, by the ticket ahead of it).

use std::collections::{HashMap, VecDeque};
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
    names: Mutex<HashMap<String, Arc<Notify>>>,
    tickets: Mutex<Tickets>,
}

/// The watched tickets, and the last ones that left (a cue that came
/// before its watch, between an attempt's answer and the watch, still
/// counts).
#[derive(Debug, Default)]
struct Tickets {
    watched: HashMap<(String, u64), Arc<Notify>>,
    left: VecDeque<(String, u64)>,
}

/// How many departed tickets the bus remembers for watches that come late.
const REMEMBERED_DEPARTURES: usize = 256;

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

    /// `ticket` left `name`'s queue (granted, or gone): wake the waiter
    /// watching it, the next in line.
    pub fn dequeued(&self, name: &str, ticket: u64) {
        let mut tickets = self.tickets.lock().unwrap_or_else(|e| e.into_inner());
        let key = (name.to_owned(), ticket);
        if let Some(notify) = tickets.watched.get(&key) {
            notify.notify_one();
        }
        if tickets.left.len() >= REMEMBERED_DEPARTURES {
            tickets.left.pop_front();
        }
        tickets.left.push_back(key);
    }

    /// Watches `ticket` of `name` for its leaving ([`ReleaseBus::dequeued`]),
    /// for as long as the watch lives. A ticket that left shortly before
    /// (the bus remembers the last few hundred) is cued at once.
    pub fn watch_ticket(&self, name: &str, ticket: u64) -> TicketWatch<'_> {
        let mut tickets = self.tickets.lock().unwrap_or_else(|e| e.into_inner());
        let key = (name.to_owned(), ticket);
        let notify = tickets.watched.entry(key.clone()).or_default().clone();
        if tickets.left.contains(&key) {
            notify.notify_one();
        }
        TicketWatch {
            bus: self,
            key,
            notify: Some(notify),
        }
    }

    /// How many tickets have watches now.
    pub fn watched_tickets(&self) -> usize {
        let tickets = self.tickets.lock().unwrap_or_else(|e| e.into_inner());
        tickets.watched.len()
    }
}

/// A watch on one ticket's leaving; see [`ReleaseBus::watch_ticket`].
#[derive(Debug)]
pub struct TicketWatch<'a> {
    bus: &'a ReleaseBus,
    key: (String, u64),
    notify: Option<Arc<Notify>>,
}

impl TicketWatch<'_> {
    /// The notifier to wait on: the ticket left.
    pub fn notify(&self) -> &Notify {
        self.notify.as_deref().expect("present until drop")
    }
}

impl Drop for TicketWatch<'_> {
    fn drop(&mut self) {
        let mut tickets = self.bus.tickets.lock().unwrap_or_else(|e| e.into_inner());
        drop(self.notify.take());
        if tickets
            .watched
            .get(&self.key)
            .is_some_and(|n| Arc::strong_count(n) == 1)
        {
            tickets.watched.remove(&self.key);
        }
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
