//! Fair waiting: first come, first served across stores, reader-writer
//! locks where neither side starves, and a queue that no dead, dropped or
//! `try_` caller blocks (`alkstore_core::queue`).
//!
//! The cases make the order they check: each waiter asks only once the
//! one before it shows in the queue ([`Store::waiters`]), so "earlier" is
//! the engine's order, not a hope about timing. An engine that does not
//! queue opts out of them by name.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use alkstore_core::{Lock, Store};

use crate::Stores;
use crate::clock::{clock, ms};
use crate::support::{LANDING, granted, refused};

const LONG: Duration = Duration::from_secs(30);

/// The grants a case saw: who, with which fence, in the order they came.
type Seen = Arc<Mutex<Vec<(String, u64)>>>;

/// Waits until `name`'s queue, as `store` shows it, holds `n` waiters
/// (10 s at most).
async fn until_queued(store: &dyn Store, name: &str, n: usize) {
    let asked = Instant::now();
    loop {
        let waiters = store.waiters(name).await.unwrap();
        if waiters.len() == n {
            return;
        }
        assert!(
            asked.elapsed() < Duration::from_secs(10),
            "the queue of {name} never held {n} waiters: it shows {waiters:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// How a waiter of [`queue_up`] asks.
#[derive(Debug, Clone, Copy)]
enum Ask {
    Lock,
    Permit(u32),
    Read,
    Write,
}

/// Starts `owner` waiting on `store` for `name` (as `ask` says), and
/// returns once its ticket shows as the queue's `position + 1`-th. Once
/// granted, the waiter notes its grant in `seen` and releases at once.
async fn queue_up(
    store: &Arc<dyn Store>,
    viewer: &dyn Store,
    name: &str,
    owner: &str,
    ask: Ask,
    position: usize,
    seen: &Seen,
) -> tokio::task::JoinHandle<()> {
    let (store, name_owned, owner_owned, seen) = (
        store.clone(),
        name.to_owned(),
        owner.to_owned(),
        seen.clone(),
    );
    let waiter = tokio::spawn(async move {
        let (name, owner) = (name_owned.as_str(), owner_owned.as_str());
        let granted = match ask {
            Ask::Lock => store.lock(name, owner, LONG, LONG).await,
            Ask::Permit(permits) => store.acquire_permit(name, permits, owner, LONG, LONG).await,
            Ask::Read => store.read_lock(name, owner, LONG, LONG).await,
            Ask::Write => store.write_lock(name, owner, LONG, LONG).await,
        };
        let lock = granted
            .unwrap()
            .expect("a waiter of a LONG wait is granted");
        seen.lock().unwrap().push((owner.to_owned(), lock.fence()));
        assert!(lock.release().await.unwrap());
    });
    until_queued(viewer, name, position + 1).await;
    waiter
}

/// The owners in `seen`, in the order of their fences (the engine's commit
/// order: the order they were granted in).
fn by_fence(seen: &Seen) -> Vec<String> {
    let mut seen = seen.lock().unwrap().clone();
    seen.sort_by_key(|(_, fence)| *fence);
    seen.into_iter().map(|(owner, _)| owner).collect()
}

/// With `dead`'s place in `name`'s queue live (its store closed), lets the
/// name go (`release`, the holder's release) and awaits `behind`, a
/// waiter queued behind it: granted within the ticket lease of the
/// release (and a margin for a loaded machine), and no sooner than
/// `dead`'s place lapsed (first come, first served; a reader owed its
/// turn keeps it). How long after the release it was granted.
async fn behind_a_dead_waiter(
    store: &dyn Store,
    name: &str,
    dead: &str,
    release: impl std::future::Future<Output = alkstore_core::Result<bool>>,
    behind: tokio::task::JoinHandle<()>,
) -> Duration {
    // The dead waiter's place lasts at least this long from `looked`.
    let looked = Instant::now();
    let lasts = store
        .waiters(name)
        .await
        .unwrap()
        .iter()
        .find(|w| w.owner == dead)
        .map(|w| w.expires_in)
        .unwrap_or_default();
    let released = Instant::now();
    assert!(release.await.unwrap());
    let ticket_lease = clock().ticket_lease;
    let bound = ticket_lease + clock().end_slack() + LANDING;
    tokio::time::timeout(bound, behind)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "rule: a dead waiter's place is freed within the ticket lease ({ticket_lease:?}); \
                 the waiter behind {dead} was not granted {bound:?} after the release"
            )
        })
        .unwrap();
    let granted_after = looked.elapsed();
    assert!(
        granted_after >= lasts,
        "rule: the waiter behind {dead} is granted only once its place lapsed (first come, first \
         served; a reader owed its turn keeps it); granted {granted_after:?} after that place \
         was seen to last {lasts:?} more"
    );
    released.elapsed()
}

/// A waiting reader "r" of `peer` queues for `name` at `position` (as
/// `viewer` sees the queue), then dies there: its store closes, so its
/// place stays until its ticket lapses and nothing renews it.
async fn reader_dies_in_the_queue(
    peer: &Arc<dyn Store>,
    viewer: &dyn Store,
    name: &str,
    position: usize,
) {
    let reading = {
        let (peer, name) = (peer.clone(), name.to_owned());
        tokio::spawn(async move { peer.read_lock(&name, "r", LONG, LONG).await })
    };
    until_queued(viewer, name, position + 1).await;
    peer.close().await.unwrap();
    assert!(
        reading.await.unwrap().is_err(),
        "a waiting call of a store closed under it fails closed"
    );
}

/// Eight independent stores queue for a held lock, each once the one
/// before shows in the queue; then for a held semaphore's one free permit
/// at a time. They are granted in the order they queued, with fences
/// rising in that order (fences still follow commit order).
pub async fn waiters_are_granted_in_arrival_order(stores: Stores) {
    let peers = stores.open(8).await;
    let store = &stores.store;
    let seen: Seen = Arc::default();
    let holder = granted(store.try_lock("fifo", "holder", LONG).await);
    let mut waiters = Vec::new();
    for (i, peer) in peers.iter().enumerate() {
        let owner = format!("w{i}");
        waiters.push(queue_up(peer, store.as_ref(), "fifo", &owner, Ask::Lock, i, &seen).await);
    }
    assert!(holder.release().await.unwrap());
    for waiter in waiters {
        waiter.await.unwrap();
    }
    let expected: Vec<String> = (0..8).map(|i| format!("w{i}")).collect();
    assert_eq!(
        by_fence(&seen),
        expected,
        "rule: waiters are granted first come, first served; the fences show this order of grants"
    );

    // A semaphore of 3: two permits stay held, one goes round the queue.
    let seen: Seen = Arc::default();
    let kept: Vec<Box<dyn Lock>> = vec![
        granted(store.try_acquire_permit("fifo/p", 3, "k1", LONG).await),
        granted(store.try_acquire_permit("fifo/p", 3, "k2", LONG).await),
    ];
    let third = granted(store.try_acquire_permit("fifo/p", 3, "k3", LONG).await);
    let mut waiters = Vec::new();
    for (i, peer) in peers.iter().enumerate() {
        let owner = format!("p{i}");
        let ask = Ask::Permit(3);
        waiters.push(queue_up(peer, store.as_ref(), "fifo/p", &owner, ask, i, &seen).await);
    }
    assert!(third.release().await.unwrap());
    for waiter in waiters {
        waiter.await.unwrap();
    }
    let expected: Vec<String> = (0..8).map(|i| format!("p{i}")).collect();
    assert_eq!(
        by_fence(&seen),
        expected,
        "rule: permits go to waiters first come, first served"
    );
    for permit in kept {
        assert!(permit.release().await.unwrap());
    }

    // One owner's two waiting calls: the second is granted the first's
    // grant back, and its ticket leaves with that answer.
    let holder = granted(store.try_lock("fifo/twice", "holder", LONG).await);
    let first = {
        let peer = peers[1].clone();
        let waiting =
            tokio::spawn(async move { peer.lock("fifo/twice", "twice", LONG, LONG).await });
        until_queued(store.as_ref(), "fifo/twice", 1).await;
        waiting
    };
    let second = {
        let peer = peers[2].clone();
        let waiting =
            tokio::spawn(async move { peer.lock("fifo/twice", "twice", LONG, LONG).await });
        until_queued(store.as_ref(), "fifo/twice", 2).await;
        waiting
    };
    assert!(holder.release().await.unwrap());
    let first = first.await.unwrap().unwrap().expect("granted");
    let second = second.await.unwrap().unwrap().expect("granted");
    assert_eq!(
        first.fence(),
        second.fence(),
        "rule: the same owner asking again gets its own grant back"
    );
    let left = store.waiters("fifo/twice").await.unwrap();
    assert!(
        left.is_empty(),
        "rule: a waiter granted leaves the queue with its grant, also when granted its owner's \
         own grant back; the queue still shows {left:?}"
    );
    assert!(first.release().await.unwrap());
    second.let_lapse();
}

/// Reader-writer locks are phase-fair. A reader that asks while a writer
/// holds, with two writers queued before it, is granted right after that
/// writer, before the two; and a reader that asks while readers hold and
/// a writer is queued waits for that one writer, and goes before a writer
/// queued after it. So a reader waits for at most one writer, and a
/// writer for at most one phase of readers. A reader owed its turn keeps
/// it against the writers queued before it even when it cannot take it
/// at once (its store closed): the first of them is granted only once
/// that reader's place lapsed — also a reader that queued behind two
/// waiting writers, owed its turn by the first one's grant.
pub async fn a_reader_waits_for_at_most_one_writer(stores: Stores) {
    let peers = stores.open(6).await;
    let store = &stores.store;
    let seen: Seen = Arc::default();
    let w1 = granted(store.try_write_lock("phase", "w1", LONG).await);
    let viewer = store.as_ref();
    let w2 = queue_up(&peers[1], viewer, "phase", "w2", Ask::Write, 0, &seen).await;
    let w3 = queue_up(&peers[2], viewer, "phase", "w3", Ask::Write, 1, &seen).await;
    let r = queue_up(&peers[3], viewer, "phase", "r", Ask::Read, 2, &seen).await;
    assert!(w1.release().await.unwrap());
    for waiter in [w2, w3, r] {
        waiter.await.unwrap();
    }
    assert_eq!(
        by_fence(&seen),
        ["r", "w2", "w3"],
        "rule: a reader that asked while a writer held goes right after that writer, before the \
         writers queued before it (it waits for at most one writer)"
    );

    let seen: Seen = Arc::default();
    let r1 = granted(store.try_read_lock("phase/b", "r1", LONG).await);
    let w = queue_up(&peers[1], viewer, "phase/b", "w", Ask::Write, 0, &seen).await;
    let r2 = queue_up(&peers[2], viewer, "phase/b", "r2", Ask::Read, 1, &seen).await;
    let w_late = queue_up(&peers[3], viewer, "phase/b", "w-late", Ask::Write, 2, &seen).await;
    assert!(r1.release().await.unwrap());
    for waiter in [w, r2, w_late] {
        waiter.await.unwrap();
    }
    assert_eq!(
        by_fence(&seen),
        ["w", "r2", "w-late"],
        "rule: a reader that asked while readers held and a writer waited goes after that one \
         writer, and before a writer queued after it"
    );

    // Readers hold; two writers queue, then a reader, whose store then
    // closes (so it attempts no more, and cannot be owed by asking while a
    // writer holds): the first writer's grant owes that reader the turn
    // after it, so the second writer waits until the reader's place lapsed.
    let r1 = granted(store.try_read_lock("phase/d", "r1", LONG).await);
    let w1 = queue_up(&peers[1], viewer, "phase/d", "w1", Ask::Write, 0, &seen).await;
    let w2 = queue_up(&peers[2], viewer, "phase/d", "w2", Ask::Write, 1, &seen).await;
    reader_dies_in_the_queue(&peers[5], viewer, "phase/d", 2).await;
    behind_a_dead_waiter(store.as_ref(), "phase/d", "r", r1.release(), w2).await;
    w1.await.unwrap();

    let seen: Seen = Arc::default();
    let w1 = granted(store.try_write_lock("phase/c", "w1", LONG).await);
    let w2 = queue_up(&peers[1], viewer, "phase/c", "w2", Ask::Write, 0, &seen).await;
    reader_dies_in_the_queue(&peers[4], viewer, "phase/c", 1).await;
    let released = w1.release();
    behind_a_dead_waiter(store.as_ref(), "phase/c", "r", released, w2).await;
}

/// A waiter that dies in the queue (its store closed: no attempt renews its
/// ticket, and nobody removes it) keeps its place until its ticket's lease
/// ends, and no longer: the waiter behind it is granted after the dead
/// waiter's ticket lapsed (first come, first served), and within the
/// ticket lease of the name's release (and a margin for a loaded machine).
pub async fn a_dead_waiters_place_is_freed_within_the_ticket_lease(stores: Stores) {
    let peers = stores.open(3).await;
    let store = &stores.store;
    let seen: Seen = Arc::default();
    let holder = granted(store.try_lock("dead", "holder", LONG).await);
    let dying = {
        let peer = peers[1].clone();
        let waiting = tokio::spawn(async move { peer.lock("dead", "dies", LONG, LONG).await });
        until_queued(store.as_ref(), "dead", 1).await;
        waiting
    };
    let behind = queue_up(
        &peers[2],
        store.as_ref(),
        "dead",
        "behind",
        Ask::Lock,
        1,
        &seen,
    )
    .await;
    peers[1].close().await.unwrap();
    assert!(
        dying.await.unwrap().is_err(),
        "a waiting call of a store closed under it fails closed"
    );
    // The dead waiter's place lasts at least this long from here.
    let waited =
        behind_a_dead_waiter(store.as_ref(), "dead", "dies", holder.release(), behind).await;
    eprintln!("dead waiter: the waiter behind it granted {waited:?} after the release");
}

/// A waiting call whose future is dropped leaves the queue at once (well
/// before its ticket would lapse), and the waiter behind it is granted as
/// the name frees.
pub async fn a_dropped_waiter_leaves_the_queue_at_once(stores: Stores) {
    let peers = stores.open(3).await;
    let store = &stores.store;
    let seen: Seen = Arc::default();
    let holder = granted(store.try_lock("gone", "holder", LONG).await);
    let dropped = queue_up(
        &peers[1],
        store.as_ref(),
        "gone",
        "dropped",
        Ask::Lock,
        0,
        &seen,
    )
    .await;
    let behind = queue_up(
        &peers[2],
        store.as_ref(),
        "gone",
        "behind",
        Ask::Lock,
        1,
        &seen,
    )
    .await;
    dropped.abort();
    assert!(dropped.await.unwrap_err().is_cancelled());
    let left = Instant::now();
    // Its place would lapse no sooner than this (its ticket's lease as seen
    // now, counted from before the read): gone well before then, it left.
    let looked = Instant::now();
    let lapses = store
        .waiters("gone")
        .await
        .unwrap()
        .iter()
        .find(|w| w.owner == "dropped")
        .map_or(Duration::ZERO, |w| w.expires_in);
    let bound = (looked + lapses).saturating_duration_since(left);
    let bound = bound.saturating_sub(ms(50)).min(ms(900));
    loop {
        let waiters = store.waiters("gone").await.unwrap();
        if waiters.iter().all(|w| w.owner != "dropped") {
            break;
        }
        assert!(
            left.elapsed() < bound,
            "rule: a waiter whose future is dropped leaves the queue at once, before its \
             place would lapse; still queued {:?} after the drop: {waiters:?}",
            left.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(holder.release().await.unwrap());
    behind.await.unwrap();
    assert_eq!(by_fence(&seen), ["behind"]);
}

/// A `try_` call never queues (the queue shows no ticket of it) and never
/// jumps the queue: with the name free but a waiter's ticket live (its
/// store closed, so it cannot take its turn), `try_lock` is refused until
/// that ticket lapses, and granted after.
pub async fn try_never_queues_nor_jumps_the_queue(stores: Stores) {
    let peers = stores.open(5).await;
    let store = &stores.store;
    let trier = &peers[1];
    // Set up until the refusal was seen with the waiter's ticket live after
    // it (a stalled machine may let the ticket lapse first: then there was
    // nothing to jump, and the round proves nothing).
    for round in 0..3 {
        let name = format!("turn/{round}");
        let holder = granted(store.try_lock(&name, "holder", LONG).await);
        // A store of its own each round: closed below.
        let peer = peers[2 + round].clone();
        let waiting = {
            let name = name.clone();
            tokio::spawn(async move { peer.lock(&name, "waiter", LONG, LONG).await })
        };
        until_queued(store.as_ref(), &name, 1).await;
        refused(trier.try_lock(&name, "trier", LONG).await);
        let queued = store.waiters(&name).await.unwrap();
        assert!(
            queued.iter().all(|w| w.owner != "trier"),
            "rule: a try_ call never queues; the queue shows {queued:?}"
        );
        // The waiter can no longer take its turn; its ticket stays until
        // it lapses.
        peers[2 + round].close().await.unwrap();
        assert!(waiting.await.unwrap().is_err());
        assert!(holder.release().await.unwrap());
        let tried = trier.try_lock(&name, "trier", LONG).await.unwrap();
        let still_queued = store.waiters(&name).await.unwrap();
        if still_queued.is_empty() {
            if let Some(lock) = tried {
                assert!(lock.release().await.unwrap());
            }
            eprintln!("round {round}: the waiter's ticket lapsed before it was looked at again");
            continue;
        }
        assert!(
            tried.is_none(),
            "rule: a try_ call never jumps the queue; it was granted while {still_queued:?} waited"
        );
        let asked = Instant::now();
        let bound = clock().ticket_lease + clock().end_slack() + LANDING;
        let lock = loop {
            if let Some(lock) = trier.try_lock(&name, "trier", LONG).await.unwrap() {
                break lock;
            }
            assert!(
                asked.elapsed() < bound,
                "rule: a waiter's ticket that nothing renews lapses within the ticket lease; \
                 try_lock still refused {:?} later",
                asked.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(lock.release().await.unwrap());
        return;
    }
    panic!("in three rounds, the waiter's ticket never outlived the try_lock after the release");
}

impl Ask {
    /// One `try_` call of this kind.
    async fn attempt(
        self,
        store: &dyn Store,
        name: &str,
        owner: &str,
    ) -> alkstore_core::Result<Option<Box<dyn Lock>>> {
        match self {
            Ask::Lock => store.try_lock(name, owner, LONG).await,
            Ask::Permit(permits) => store.try_acquire_permit(name, permits, owner, LONG).await,
            Ask::Read => store.try_read_lock(name, owner, LONG).await,
            Ask::Write => store.try_write_lock(name, owner, LONG).await,
        }
    }

    /// One waiting call of this kind.
    async fn wait(
        self,
        store: &dyn Store,
        name: &str,
        owner: &str,
        wait: Duration,
    ) -> alkstore_core::Result<Option<Box<dyn Lock>>> {
        match self {
            Ask::Lock => store.lock(name, owner, LONG, wait).await,
            Ask::Permit(permits) => store.acquire_permit(name, permits, owner, LONG, wait).await,
            Ask::Read => store.read_lock(name, owner, LONG, wait).await,
            Ask::Write => store.write_lock(name, owner, LONG, wait).await,
        }
    }

    /// What holds a name so that a waiter of this kind queues: the same
    /// kind (a semaphore of one permit), or a writer before a reader.
    fn holder(self) -> Ask {
        match self {
            Ask::Read => Ask::Write,
            other => other,
        }
    }
}

/// One round of [`no_kind_passes_a_waiter_of_another`] for a waiter of
/// `first` and a caller of `then`, on names of its own: `Ok(true)` when
/// it proved the rule, `Ok(false)` when the dead waiter's place lapsed
/// before the `try_` call was looked at (a stalled machine: nothing to
/// pass, the round proves nothing).
async fn kinds_in_one_queue(
    viewer: &dyn Store,
    dying: Arc<dyn Store>,
    caller: &dyn Store,
    name: &str,
    first: Ask,
    then: Ask,
) -> bool {
    let holder = granted(first.holder().attempt(viewer, name, "holder").await);
    let waiting = {
        let (dying, name) = (dying.clone(), name.to_owned());
        tokio::spawn(async move { first.wait(dying.as_ref(), &name, "first", LONG).await })
    };
    until_queued(viewer, name, 1).await;
    // It can no longer take its turn; its place stays until it lapses.
    dying.close().await.unwrap();
    assert!(
        waiting.await.unwrap().is_err(),
        "a waiting call of a store closed under it fails closed"
    );
    assert!(holder.release().await.unwrap());
    let tried = then.attempt(caller, name, "then").await;
    let looked = Instant::now();
    let still = place_lasts(viewer, name, "first").await;
    let Some(lasts) = still else {
        if let Ok(Some(lock)) = tried {
            assert!(lock.release().await.unwrap());
        }
        return false;
    };
    assert!(
        matches!(tried, Ok(None)),
        "rule: one queue across kinds: a try_ call ({then:?}) never takes a name that a waiter of \
         another kind ({first:?}) is first in line for; it answered {tried:?}"
    );
    // A waiting call of the other kind waits behind it too.
    let waited = then.wait(caller, name, "then", LONG).await;
    let granted_after = looked.elapsed();
    let lock = waited
        .unwrap()
        .expect("granted once the dead waiter's place lapsed");
    assert!(
        granted_after >= lasts,
        "rule: one queue across kinds: a waiting call ({then:?}) does not pass a waiter of another \
         kind ({first:?}) queued before it; granted {granted_after:?} after that place was seen \
         to last {lasts:?} more"
    );
    assert!(lock.release().await.unwrap());
    true
}

/// How long `owner`'s place in `name`'s queue lasts, as `viewer` sees it
/// (`None`: not queued).
async fn place_lasts(viewer: &dyn Store, name: &str, owner: &str) -> Option<Duration> {
    viewer
        .waiters(name)
        .await
        .unwrap()
        .iter()
        .find(|w| w.owner == owner)
        .map(|w| w.expires_in)
}

/// One queue across kinds. For each pair of kinds that may not share a
/// name at once (a lock, a semaphore's permit, a reader-writer lock's
/// reader or writer): a waiter of the first kind that is first in line
/// (kept there dead: its store closed, so it cannot take its turn) is
/// passed neither by a `try_` call of the other kind nor by a waiting call
/// of it, which is granted only once that place lapsed — where a caller
/// of another kind granted first would turn the waiter's next attempt into
/// an "held as another kind" error.
pub async fn no_kind_passes_a_waiter_of_another(stores: Stores) {
    let pairs = [
        (Ask::Lock, Ask::Permit(3)),
        (Ask::Lock, Ask::Read),
        (Ask::Lock, Ask::Write),
        (Ask::Permit(1), Ask::Lock),
        (Ask::Permit(1), Ask::Read),
        (Ask::Permit(1), Ask::Write),
        (Ask::Read, Ask::Lock),
        (Ask::Read, Ask::Permit(3)),
        (Ask::Write, Ask::Lock),
        (Ask::Write, Ask::Permit(3)),
    ];
    const ROUNDS: usize = 3;
    let callers = stores.open(2).await;
    let (viewer, caller) = (stores.store.as_ref(), callers[1].as_ref());
    let stores = &stores;
    let runs = pairs.iter().enumerate().map(|(i, &(first, then))| {
        async move {
            for round in 0..ROUNDS {
                let name = format!("kinds/{i}/{round}");
                // A store of its own, to close with its waiter in line.
                let dying = stores.open(2).await.remove(1);
                if kinds_in_one_queue(viewer, dying, caller, &name, first, then).await {
                    return;
                }
                eprintln!("{first:?} then {then:?}, round {round}: the dead place lapsed first");
            }
            panic!(
                "{first:?} then {then:?}: in {ROUNDS} rounds the dead waiter's place never \
                 outlived the try_ call after the release"
            );
        }
    });
    futures::future::join_all(runs).await;
}

/// A waiting writer first in line is granted a free name however many
/// waiting readers arrive behind it. A reader holds; a writer queues;
/// eight stores loop short waiting `read_lock` calls (30 ms each) on the
/// name, so that tickets are drawn and left behind the writer all the
/// time; the reader releases. The writer is granted within the ticket
/// lease (and a margin for a loaded machine) of the release, and no
/// reader of the stream before it (they queued behind it: their fences
/// are above its).
pub async fn a_waiting_writer_is_granted_among_arriving_readers(stores: Stores) {
    const STREAMS: usize = 8;
    const TASKS: usize = 4;
    let peers = stores.open(STREAMS + 2).await;
    let store = &stores.store;
    let name = "arrivals";
    let reader = granted(store.try_read_lock(name, "reader", LONG).await);
    let writing = {
        let peer = peers[1].clone();
        tokio::spawn(async move {
            let asked = peer.write_lock(name, "writer", LONG, Duration::from_secs(20));
            let lock = asked.await.unwrap();
            (Instant::now(), lock)
        })
    };
    until_queued(store.as_ref(), name, 1).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let done = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let seen: Seen = Arc::default();
    let streams: Vec<_> = peers[2..]
        .iter()
        .cycle()
        .take(STREAMS * TASKS)
        .enumerate()
        .map(|(i, peer)| {
            let (peer, stop, seen) = (peer.clone(), stop.clone(), seen.clone());
            let done = done.clone();
            tokio::spawn(async move {
                let mut asked = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Acquire) {
                    asked += 1;
                    let owner = format!("r{i}-{asked}");
                    let read = peer.read_lock(name, &owner, LONG, ms(30)).await.unwrap();
                    if let Some(read) = read {
                        seen.lock().unwrap().push((owner, read.fence()));
                        assert!(read.release().await.unwrap());
                    }
                    done.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                }
                asked
            })
        })
        .collect();
    // The stream at its steady pace: every store asked a few times, each
    // reader drawing a ticket behind the writer and leaving it.
    let asked = Instant::now();
    let steady = (4 * STREAMS * TASKS) as u32;
    while done.load(std::sync::atomic::Ordering::Acquire) < steady {
        assert!(
            asked.elapsed() < Duration::from_secs(20),
            "precondition: the stream of readers asks {steady} times in 20 s"
        );
        tokio::time::sleep(ms(5)).await;
    }
    let queued = store.waiters(name).await.unwrap();
    assert!(
        queued.first().is_some_and(|w| w.owner == "writer"),
        "precondition: the writer is first in line; the queue shows {queued:?}"
    );
    let released = Instant::now();
    assert!(reader.release().await.unwrap());
    let bound = clock().ticket_lease + clock().end_slack() + LANDING;
    let granted_in = tokio::time::timeout(bound, writing).await;
    stop.store(true, std::sync::atomic::Ordering::Release);
    let mut calls = 0;
    for stream in streams {
        calls += stream.await.unwrap();
    }
    let (at, writer) = granted_in
        .unwrap_or_else(|_| {
            panic!(
                "rule: a waiting writer is granted a free name however many waiting readers \
                 arrive behind it; not granted {bound:?} after the release, with {STREAMS} \
                 stores asking to read ({calls} calls, {} granted)",
                seen.lock().unwrap().len()
            )
        })
        .unwrap();
    let writer = writer.expect("a writer of a 20 s wait is granted");
    eprintln!(
        "the writer was granted {:?} after the release, among {calls} waiting reads",
        at - released
    );
    let before: Vec<_> = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, fence)| *fence < writer.fence())
        .cloned()
        .collect();
    assert!(
        before.is_empty(),
        "rule: readers that queued behind a waiting writer go after it; granted before it: \
         {before:?}"
    );
    assert!(writer.release().await.unwrap());
}

/// A waiter keeps its place for as long as it waits: its attempts renew
/// its ticket (the same number all along), so that a waiter queued after
/// it, more than two ticket leases later, is still behind it.
pub async fn a_waiters_place_is_kept_while_it_waits(stores: Stores) {
    let peers = stores.open(3).await;
    let store = &stores.store;
    let seen: Seen = Arc::default();
    let holder = granted(store.try_lock("kept", "holder", LONG).await);
    let viewer = store.as_ref();
    let first = queue_up(&peers[1], viewer, "kept", "first", Ask::Lock, 0, &seen).await;
    let ticket = |waiters: &[alkstore_core::Waiter]| {
        waiters
            .iter()
            .find(|w| w.owner == "first")
            .map(|w| w.ticket)
    };
    let drawn = ticket(&store.waiters("kept").await.unwrap());
    tokio::time::sleep(2 * clock().ticket_lease + ms(500)).await;
    let later = store.waiters("kept").await.unwrap();
    assert_eq!(
        ticket(&later),
        drawn,
        "rule: a waiter's attempts renew its place; after two ticket leases the queue shows \
         {later:?}, expected the first waiter's ticket {drawn:?} still there"
    );
    let second = queue_up(&peers[2], viewer, "kept", "second", Ask::Lock, 1, &seen).await;
    assert!(holder.release().await.unwrap());
    for waiter in [first, second] {
        waiter.await.unwrap();
    }
    assert_eq!(
        by_fence(&seen),
        ["first", "second"],
        "rule: a waiter keeps its place for as long as it waits"
    );
}

/// The same owner asking again while others queue is answered at once
/// with its own grant (the same fence): an owner names one holder, and
/// its own live grant is no turn to wait for. For a lock, a permit and a
/// reader, by `try_` and by a waiting call.
pub async fn an_owner_asking_again_is_answered_at_once_while_others_queue(stores: Stores) {
    let peers = stores.open(2).await;
    let store = &stores.store;
    let seen: Seen = Arc::default();
    // What holds, and what queues behind it: a writer behind a reader.
    for (hold, queued) in [
        (Ask::Lock, Ask::Lock),
        (Ask::Permit(1), Ask::Permit(1)),
        (Ask::Read, Ask::Write),
    ] {
        let name = format!("again/{hold:?}");
        let held = granted(hold.attempt(store.as_ref(), &name, "owner").await);
        let waiter = queue_up(&peers[1], store.as_ref(), &name, "waiter", queued, 0, &seen).await;
        let tried = granted(hold.attempt(store.as_ref(), &name, "owner").await);
        let asked = Instant::now();
        let waited = hold
            .wait(store.as_ref(), &name, "owner", Duration::from_secs(2))
            .await;
        let took = asked.elapsed();
        let waited = granted(waited);
        assert!(
            tried.fence() == held.fence() && waited.fence() == held.fence(),
            "rule: the same owner asking again gets its own grant back while others queue; \
             {hold:?}: fences {} and {}, expected {}",
            tried.fence(),
            waited.fence(),
            held.fence()
        );
        assert!(
            took < Duration::from_secs(1),
            "rule: the same owner asking again is answered at once, not kept waiting behind \
             the queue; {hold:?}: {took:?}"
        );
        assert!(held.release().await.unwrap());
        tried.let_lapse();
        waited.let_lapse();
        waiter.await.unwrap();
    }
}

/// `waiters` lists a name's queue oldest first (owners in the order they
/// queued, tickets rising), and each waiter's `waited` counts from its
/// arrival, not from its last attempt (a waiter attempts again at least
/// every half ticket lease).
pub async fn waiters_are_listed_oldest_first_with_their_whole_wait(stores: Stores) {
    let peers = stores.open(4).await;
    let store = &stores.store;
    let seen: Seen = Arc::default();
    let holder = granted(store.try_lock("listed", "holder", LONG).await);
    let viewer = store.as_ref();
    let mut waiters = Vec::new();
    for (i, owner) in ["w0", "w1", "w2"].into_iter().enumerate() {
        let peer = &peers[1 + i];
        waiters.push(queue_up(peer, viewer, "listed", owner, Ask::Lock, i, &seen).await);
    }
    let queued = Instant::now();
    let whole = clock().ticket_lease + ms(500);
    tokio::time::sleep(whole).await;
    let listed = store.waiters("listed").await.unwrap();
    let owners: Vec<&str> = listed.iter().map(|w| w.owner.as_str()).collect();
    assert_eq!(
        owners,
        ["w0", "w1", "w2"],
        "rule: waiters lists the queue oldest first; saw {listed:?}"
    );
    assert!(
        listed.windows(2).all(|w| w[0].ticket < w[1].ticket),
        "rule: waiters lists tickets rising; saw {listed:?}"
    );
    // The last of them queued before `queued`: each has waited at least
    // this long (less a millisecond of the engine's clock rounding).
    let at_least = queued.elapsed().saturating_sub(ms(50));
    for waiter in &listed {
        assert!(
            waiter.waited >= at_least,
            "rule: a waiter's `waited` counts from its arrival; {} shows {:?}, expected at \
             least {at_least:?}",
            waiter.owner,
            waiter.waited
        );
    }
    assert!(holder.release().await.unwrap());
    for waiter in waiters {
        waiter.await.unwrap();
    }
}
