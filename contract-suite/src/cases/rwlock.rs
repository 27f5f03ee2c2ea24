//! Reader-writer locks: many readers or one writer on a name, a waiting
//! writer holding new readers back, every grant with its own lease and
//! fence.

use std::sync::Arc;
use std::time::{Duration, Instant};

use alkstore_core::{Access, Error, HeldAs, Lock, Store};

use crate::clock::{clock, ms};
use crate::safety::Rng;
use crate::safety::rw::{check_rw, race_rw};
use crate::safety::workload::Race;
use crate::support::{assert_closed, assert_duration_error, granted, outlive, refused};

const LONG: Duration = Duration::from_secs(30);

/// The access of a reader-writer grant's handle, failing when it has none.
#[track_caller]
fn access(grant: &dyn Lock) -> Access {
    match grant.access() {
        Some(access) => access,
        None => {
            panic!("rule: a reader-writer grant's handle tells its access; {grant:?} tells none")
        }
    }
}

/// The live grants of `name` as listed: access, owner and fence, in slot
/// order.
async fn live_grants(store: &Arc<dyn Store>, name: &str) -> Vec<(Access, String, u64)> {
    store
        .holders(name)
        .await
        .unwrap()
        .into_iter()
        .map(|listed| match listed.access {
            Some(access) => (access, listed.holder.owner, listed.holder.fence),
            None => panic!(
                "rule: a reader-writer lock's grants are listed with their access; saw {listed:?}"
            ),
        })
        .collect()
}

/// Polls `try_read_lock` by fresh owners until one is refused (each one
/// granted meanwhile is released at once): the moment a waiting writer's
/// intent holds readers back. Fails after `patience`.
async fn until_readers_are_held_back(store: &Arc<dyn Store>, name: &str, patience: Duration) {
    let give_up = Instant::now() + patience;
    let mut probe = 0;
    loop {
        probe += 1;
        let owner = format!("probe-{probe}");
        match store.try_read_lock(name, &owner, LONG).await.unwrap() {
            None => return,
            Some(reader) => {
                assert!(reader.release().await.unwrap(), "own live read grant");
            }
        }
        assert!(
            Instant::now() < give_up,
            "rule: once a writer waits, new readers wait behind it; {probe} new readers were \
             granted over {patience:?} while a writer waited"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Readers share a name, a writer holds it alone: two readers on slots 0
/// and 1, a writer refused beside them (a `try_write_lock` leaving nothing
/// behind: a reader still gets in), then granted once they are gone; beside
/// the writer every reader and writer is refused, the writer itself asking
/// to read too; the same owner asking to write again gets its grant back.
pub async fn readers_share_a_name_and_a_writer_holds_it_alone(store: Arc<dyn Store>) {
    let a = granted(store.try_read_lock("rw", "a", LONG).await);
    let b = granted(store.try_read_lock("rw", "b", LONG).await);
    assert_eq!(
        (access(a.as_ref()), access(b.as_ref())),
        (Access::Read { slot: 0 }, Access::Read { slot: 1 }),
        "rule: readers share a name, each on the lowest free slot"
    );
    assert!(a.fence() != b.fence(), "rule: each grant has its own fence");
    refused(store.try_write_lock("rw", "w", LONG).await);
    let c = granted(store.try_read_lock("rw", "c", LONG).await);
    assert_eq!(
        live_grants(&store, "rw").await,
        [
            (Access::Read { slot: 0 }, "a".to_owned(), a.fence()),
            (Access::Read { slot: 1 }, "b".to_owned(), b.fence()),
            (Access::Read { slot: 2 }, "c".to_owned(), c.fence()),
        ],
        "rule: a refused try_write_lock writes nothing (no intent: readers go on)"
    );
    let again = granted(store.try_read_lock("rw", "a", LONG).await);
    assert_eq!(
        (access(again.as_ref()), again.fence()),
        (Access::Read { slot: 0 }, a.fence()),
        "rule: the same owner reading again gets its grant back"
    );
    for reader in [a, b, c] {
        assert!(reader.release().await.unwrap(), "own live read grant");
    }
    let w = granted(store.try_write_lock("rw", "w", LONG).await);
    assert_eq!(
        access(w.as_ref()),
        Access::Write,
        "a writer's handle says so"
    );
    refused(store.try_read_lock("rw", "d", LONG).await);
    refused(store.try_write_lock("rw", "e", LONG).await);
    refused(store.try_read_lock("rw", "w", LONG).await);
    let again = granted(store.try_write_lock("rw", "w", LONG).await);
    assert_eq!(
        again.fence(),
        w.fence(),
        "rule: the same owner writing again gets its grant back"
    );
    assert_eq!(
        live_grants(&store, "rw").await,
        [(Access::Write, "w".to_owned(), w.fence())],
        "rule: a writer holds the name alone"
    );
    assert!(w.release().await.unwrap());
    let d = granted(store.try_read_lock("rw", "d", LONG).await);
    assert!(d.release().await.unwrap());
}

/// Sixteen independent stores race readers and writers (one ask in eight a
/// write) for one name for three seconds: a writer never overlaps another
/// grant, and fences follow commit order wherever a writer is involved. On
/// a slow engine or a loaded machine, rounds of three seconds on new names
/// follow (four at most) until the race has granted enough of both to mean
/// something; each round's history is checked on its own.
pub async fn readers_and_writers_never_overlap(stores: crate::Stores) {
    let peers = stores.open(16).await;
    let seed = Rng::from_clock("readers_and_writers_never_overlap").next_u64();
    let race = Race {
        tasks_per_store: 2,
        duration: Duration::from_secs(3),
    };
    let (mut writes, mut reads) = (0, 0);
    for round in 0..4 {
        let name = format!("rw-raced-{round}");
        let history = race_rw(&peers, &name, 8, race, seed.wrapping_add(round)).await;
        if let Err(violation) = check_rw(&history) {
            panic!(
                "rule: a writer excludes every other grant, fences in commit order past writers; \
                 saw {violation:?} in {} grants (seed {seed}, round {round})",
                history.len()
            );
        }
        let lost = history.iter().filter(|g| !g.released).count();
        assert_eq!(
            lost, 0,
            "rule: release answers true for its own live grant; {lost} releases answered false"
        );
        let written = history.iter().filter(|g| g.write).count();
        writes += written;
        reads += history.len() - written;
        if writes >= 10 && reads >= 30 {
            break;
        }
    }
    assert!(
        writes >= 10 && reads >= 30,
        "precondition: the race granted enough of both to mean something; saw {writes} writes \
         and {reads} reads in four rounds, expected at least 10 and 30 (seed {seed})"
    );
    eprintln!("reader-writer race: {reads} reads and {writes} writes by 32 tasks on 16 stores");
}

/// Fences rise past writers: a reader's fence is above the writer's before
/// it, a writer's above every reader's before it.
pub async fn rw_fences_rise_past_every_writer(store: Arc<dyn Store>) {
    let w1 = granted(store.try_write_lock("fenced", "w1", LONG).await);
    let w1_fence = w1.fence();
    assert!(w1.release().await.unwrap());
    let r1 = granted(store.try_read_lock("fenced", "r1", LONG).await);
    let r2 = granted(store.try_read_lock("fenced", "r2", LONG).await);
    assert!(
        r1.fence() > w1_fence && r2.fence() > w1_fence,
        "rule: a reader's fence is above every earlier writer's; saw writer {}, readers {} and {}",
        w1_fence,
        r1.fence(),
        r2.fence()
    );
    for reader in [r1.fence(), r2.fence()] {
        assert_ne!(reader, w1_fence, "a fence names one grant");
    }
    let (f1, f2) = (r1.fence(), r2.fence());
    for reader in [r1, r2] {
        assert!(reader.release().await.unwrap());
    }
    let w2 = granted(store.try_write_lock("fenced", "w2", LONG).await);
    assert!(
        w2.fence() > f1 && w2.fence() > f2,
        "rule: a writer's fence is above every earlier grant's; saw readers {f1} and {f2}, \
         writer {}",
        w2.fence()
    );
    let w2_fence = w2.fence();
    assert!(w2.release().await.unwrap());
    let r3 = granted(store.try_read_lock("fenced", "r3", LONG).await);
    assert!(
        r3.fence() > w2_fence,
        "rule: a reader's fence is above every earlier writer's; saw writer {}, reader {}",
        w2_fence,
        r3.fence()
    );
    assert!(r3.release().await.unwrap());
}

/// Writer preference: once a writer waits, new readers are refused; the
/// readers there finish, and the writer is granted when the last one
/// releases (with a fence above theirs), long before their leases end.
pub async fn a_waiting_writer_holds_new_readers_back(store: Arc<dyn Store>) {
    let r1 = granted(store.try_read_lock("pref", "r1", LONG).await);
    let r2 = granted(store.try_read_lock("pref", "r2", LONG).await);
    let writer = {
        let store = store.clone();
        tokio::spawn(async move {
            let w = granted(store.write_lock("pref", "w", LONG, LONG).await);
            (Instant::now(), w)
        })
    };
    until_readers_are_held_back(&store, "pref", Duration::from_secs(5)).await;
    // Held back, and still so while the writer waits.
    tokio::time::sleep(Duration::from_millis(300)).await;
    refused(store.try_read_lock("pref", "late", LONG).await);
    assert!(
        !writer.is_finished(),
        "rule: a writer waits for the readers there; it was granted beside two live readers"
    );
    let (f1, f2) = (r1.fence(), r2.fence());
    assert!(r1.release().await.unwrap());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !writer.is_finished(),
        "rule: a writer waits for the last reader; it was granted beside one"
    );
    let released_at = Instant::now();
    assert!(r2.release().await.unwrap());
    let (granted_at, w) = writer.await.unwrap();
    assert!(
        granted_at - released_at < Duration::from_secs(2),
        "rule: the writer is granted once the last reader releases; saw {:?} after the release",
        granted_at - released_at
    );
    assert!(
        w.fence() > f1 && w.fence() > f2,
        "rule: a writer's fence is above every earlier grant's"
    );
    refused(store.try_read_lock("pref", "late", LONG).await);
    assert!(w.release().await.unwrap());
    let late = granted(store.try_read_lock("pref", "late", LONG).await);
    assert!(late.release().await.unwrap());
}

/// A waiting writer holds readers back no longer than its own wait: once
/// `write_lock` gives up, readers go on at once (not after its lease);
/// and a waiting `write_lock` whose future is dropped holds them back no
/// longer than its ttl.
pub async fn a_writers_intent_ends_with_its_wait(store: Arc<dyn Store>) {
    let r1 = granted(store.try_read_lock("intent", "r1", LONG).await);
    let asked = Instant::now();
    refused(
        store
            .write_lock("intent", "w", LONG, Duration::from_millis(400))
            .await,
    );
    assert!(
        asked.elapsed() >= Duration::from_millis(400),
        "rule: write_lock waits out its wait before it answers None"
    );
    // Readers go on as the wait ends (the intent's end is the server's
    // clock: a little slack for the round trip, and a granule and the lag
    // where leases are coarser than milliseconds).
    let gave_up = Instant::now();
    let r2 = loop {
        if let Some(reader) = store.try_read_lock("intent", "r2", LONG).await.unwrap() {
            break reader;
        }
        assert!(
            gave_up.elapsed() < Duration::from_millis(500) + clock().end_slack(),
            "rule: a writer's intent ends with its wait; new readers were still refused {:?} \
             after write_lock gave up (its ttl is {LONG:?})",
            gave_up.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert!(r2.release().await.unwrap());

    // A waiting writer dropped: its intent lapses within its ttl.
    let ttl = Duration::from_secs(2);
    let waiting = {
        let store = store.clone();
        tokio::spawn(async move { store.write_lock("intent", "w2", ttl, LONG).await })
    };
    until_readers_are_held_back(&store, "intent", Duration::from_secs(5)).await;
    waiting.abort();
    let dropped = Instant::now();
    assert!(waiting.await.unwrap_err().is_cancelled());
    let r3 = loop {
        if let Some(reader) = store.try_read_lock("intent", "r3", LONG).await.unwrap() {
            break reader;
        }
        assert!(
            dropped.elapsed() < ttl + Duration::from_secs(1) + clock().end_slack(),
            "rule: a dropped writer's intent holds readers back no longer than its ttl ({ttl:?}); \
             still refused after {:?}",
            dropped.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    for reader in [r1, r3] {
        assert!(reader.release().await.unwrap());
    }
}

/// A stream of overlapping readers from another store cannot starve a
/// writer: each reader holds for a lease of 500 ms and a new one comes
/// every 150 ms, so the name is never free of readers; a writer asking in
/// the middle of it is granted within two reader leases.
pub async fn a_stream_of_readers_cannot_starve_a_writer(stores: crate::Stores) {
    const LEASE: Duration = Duration::from_millis(500);
    let peers = stores.open(2).await;
    let (writers, readers) = (peers[0].clone(), peers[1].clone());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stream = {
        let (stop, readers) = (stop.clone(), readers.clone());
        tokio::spawn(async move {
            let mut held: Vec<(Instant, Box<dyn Lock>)> = Vec::new();
            let mut n = 0;
            let mut granted_count = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                n += 1;
                let owner = format!("reader-{n}");
                // Each reader waits up to a lease for its turn.
                if let Some(r) = readers
                    .read_lock("starve", &owner, LEASE, LEASE)
                    .await
                    .unwrap()
                {
                    granted_count += 1;
                    held.push((Instant::now() + LEASE, r));
                }
                let now = Instant::now();
                let (done, still): (Vec<_>, Vec<_>) =
                    held.into_iter().partition(|(until, _)| *until <= now);
                held = still;
                for (_, r) in done {
                    r.release().await.unwrap();
                }
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
            for (_, r) in held {
                r.release().await.unwrap();
            }
            granted_count
        })
    };
    // Let the stream reach its steady overlap.
    tokio::time::sleep(2 * LEASE).await;
    assert!(
        !readers.holders("starve").await.unwrap().is_empty(),
        "precondition: the readers' stream holds the name"
    );
    let asked = Instant::now();
    let w = writers
        .write_lock("starve", "writer", LONG, 4 * LEASE)
        .await
        .unwrap();
    let waited = asked.elapsed();
    let granted_while = w.is_some();
    if let Some(w) = w {
        assert!(w.release().await.unwrap());
    }
    stop.store(true, std::sync::atomic::Ordering::Release);
    let readers_granted = stream.await.unwrap();
    assert!(
        granted_while && waited <= 2 * LEASE,
        "rule: writers are not starved; the writer waited {waited:?} (granted: {granted_while}), \
         expected a grant within two reader leases ({:?})",
        2 * LEASE
    );
    assert!(
        readers_granted >= 5,
        "precondition: the stream granted readers before and after the writer; saw \
         {readers_granted}"
    );
}

/// A name is a lock, a semaphore or a reader-writer lock, never two at
/// once: each asked of a name another kind holds is refused with an error
/// saying what holds it, writing nothing.
pub async fn rw_and_other_kinds_never_mix(store: Arc<dyn Store>) {
    let wait = Duration::from_millis(200);
    let lock = granted(store.try_lock("kinds", "l", LONG).await);
    let permit = granted(store.try_acquire_permit("kinds-s", 2, "p", LONG).await);
    for (name, held_as) in [
        ("kinds", HeldAs::Lock),
        ("kinds-s", HeldAs::Semaphore { permits: 2 }),
    ] {
        for result in [
            store.try_read_lock(name, "r", LONG).await,
            store.read_lock(name, "r", LONG, wait).await,
            store.try_write_lock(name, "w", LONG).await,
            store.write_lock(name, "w", LONG, wait).await,
        ] {
            match result {
                Err(Error::HeldAsOtherKind {
                    name: n,
                    held_as: h,
                }) if n == name && h == held_as => {}
                other => panic!(
                    "rule: a reader-writer lock of a name {held_as} holds is refused with \
                     HeldAsOtherKind; saw {other:?}"
                ),
            }
        }
    }
    assert_eq!(
        store.holder("kinds").await.unwrap().map(|h| h.fence),
        Some(lock.fence())
    );
    assert_eq!(
        store.holders("kinds-s").await.unwrap().len(),
        1,
        "rule: a refusal writes nothing"
    );
    assert!(lock.release().await.unwrap() && permit.release().await.unwrap());

    let reader = granted(store.try_read_lock("kinds-r", "r", LONG).await);
    let writer = granted(store.try_write_lock("kinds-w", "w", LONG).await);
    for name in ["kinds-r", "kinds-w"] {
        for result in [
            store.try_lock(name, "l", LONG).await,
            store.lock(name, "l", LONG, wait).await,
            store.try_acquire_permit(name, 2, "p", LONG).await,
            store.acquire_permit(name, 2, "p", LONG, wait).await,
        ] {
            match result {
                Err(Error::HeldAsOtherKind {
                    name: n,
                    held_as: HeldAs::ReadWrite,
                }) if n == name => {}
                other => panic!(
                    "rule: a lock or a permit of a name a reader-writer lock holds is refused \
                     with HeldAsOtherKind(ReadWrite); saw {other:?}"
                ),
            }
        }
    }
    assert_eq!(
        store.holder("kinds-r").await.unwrap(),
        None,
        "rule: a refusal writes nothing"
    );
    assert_eq!(live_grants(&store, "kinds-r").await.len(), 1);
    assert!(reader.release().await.unwrap() && writer.release().await.unwrap());
    let lock = granted(store.try_lock("kinds-r", "l", LONG).await);
    assert!(lock.release().await.unwrap());
}

/// Each reader-writer grant has its own lease: a lapsed reader lets a
/// writer in (its renew then answers false and its release too, the
/// writer's row untouched), a renewal sets a full window from now, and a
/// release ends the grant once.
pub async fn rw_leases_renew_release_and_lapse(store: Arc<dyn Store>) {
    // Long enough that the grant is renewed before it lapses on a loaded
    // machine (the renewal must answer true).
    let short = ms(1000);
    let r1 = granted(store.try_read_lock("leased", "r1", short).await);
    let r2 = granted(store.try_read_lock("leased", "r2", short).await);
    assert!(
        r2.renew(LONG).await.unwrap(),
        "rule: renew of a live grant answers true"
    );
    // Found by owner: on a loaded machine r1's short lease may be over
    // already, and r1 no longer listed.
    let left = store
        .holders("leased")
        .await
        .unwrap()
        .into_iter()
        .find(|listed| listed.holder.owner == "r2")
        .expect("r2's renewed grant is listed")
        .holder
        .expires_in;
    assert!(
        left > LONG - Duration::from_secs(5) && left <= LONG,
        "rule: renew sets a full window from now (not added to what was left); saw {left:?} \
         left after a renewal of {LONG:?}"
    );
    outlive(short).await;
    refused(store.try_write_lock("leased", "w", LONG).await);
    assert!(
        r2.release().await.unwrap(),
        "rule: release of a live grant answers true"
    );
    let w = granted(store.try_write_lock("leased", "w", LONG).await);
    assert!(
        !r1.renew(LONG).await.unwrap(),
        "rule: renew answers false once the lease lapsed"
    );
    assert_eq!(
        r1.release().await.unwrap(),
        !clock().removes_lapsed,
        "rule: release deletes the holder's own expired row (the writer holds another; false \
         where the engine removed the lapsed grant itself)"
    );
    assert_eq!(
        live_grants(&store, "leased").await,
        [(Access::Write, "w".to_owned(), w.fence())],
        "rule: a handle never touches a later grant"
    );
    let w_again: Box<dyn Lock> = granted(store.try_write_lock("leased", "w", LONG).await);
    assert!(w.release().await.unwrap());
    assert!(
        !w_again.release().await.unwrap(),
        "rule: a second release of one grant answers false"
    );
}

/// Bad input to the reader-writer calls is refused before storage,
/// writing nothing; on a closed store every call fails closed.
pub async fn rw_bad_input_is_refused_and_closed_stores_fail_closed(store: Arc<dyn Store>) {
    let wait = Duration::from_millis(100);
    for (name, owner) in [("", "o"), ("alkstore.x", "o"), ("bad\n", "o"), ("ok", "")] {
        for result in [
            store.try_read_lock(name, owner, LONG).await,
            store.read_lock(name, owner, LONG, wait).await,
            store.try_write_lock(name, owner, LONG).await,
            store.write_lock(name, owner, LONG, wait).await,
        ] {
            assert!(
                matches!(
                    result,
                    Err(Error::InvalidName { .. } | Error::ReservedName { .. })
                ),
                "rule: a bad name or owner is refused; {name:?}/{owner:?} gave {result:?}"
            );
        }
    }
    for ttl in [Duration::ZERO, Duration::MAX] {
        let expected = if ttl.is_zero() {
            alkstore_core::DurationError::Zero
        } else {
            alkstore_core::DurationError::TooLarge
        };
        assert_duration_error(store.try_read_lock("ok", "o", ttl).await, expected);
        assert_duration_error(store.read_lock("ok", "o", ttl, wait).await, expected);
        assert_duration_error(store.try_write_lock("ok", "o", ttl).await, expected);
        assert_duration_error(store.write_lock("ok", "o", ttl, wait).await, expected);
    }
    assert!(
        store.list("", None, 10).await.unwrap().is_empty(),
        "rule: refused input writes nothing"
    );
    let w = granted(store.try_write_lock("ok", "o", LONG).await);
    store.close().await.unwrap();
    assert_closed(store.try_read_lock("ok", "o", LONG).await);
    assert_closed(store.read_lock("ok", "o", LONG, wait).await);
    assert_closed(store.try_write_lock("ok", "o", LONG).await);
    assert_closed(store.write_lock("ok", "o", LONG, wait).await);
    assert_closed(w.renew(LONG).await);
}

/// The operator's view: `list` shows a reader-writer lock's readers in
/// slot order, or its writer, with their access (a waiting writer's intent
/// is no grant and is not listed); `force_release` of the name is refused
/// (grants go one at a time); `force_release_grant` removes one reader,
/// whose handle then answers `false`.
pub async fn rw_grants_are_listed_and_released_by_force_one_at_a_time(store: Arc<dyn Store>) {
    let a = granted(store.try_read_lock("op/rw", "a", LONG).await);
    let b = granted(store.try_read_lock("op/rw", "b", LONG).await);
    let w = granted(store.try_write_lock("op/rw-w", "w", LONG).await);
    // A writer waiting on op/rw: its intent stands, unlisted.
    let waiting = {
        let store = store.clone();
        tokio::spawn(async move { store.write_lock("op/rw", "waiting", LONG, LONG).await })
    };
    until_readers_are_held_back(&store, "op/rw", Duration::from_secs(5)).await;
    let page: Vec<(String, Option<Access>, String)> = store
        .list("op/", None, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|l| (l.name, l.access, l.holder.owner))
        .collect();
    assert_eq!(
        page,
        [
            (
                "op/rw".to_owned(),
                Some(Access::Read { slot: 0 }),
                "a".to_owned()
            ),
            (
                "op/rw".to_owned(),
                Some(Access::Read { slot: 1 }),
                "b".to_owned()
            ),
            ("op/rw-w".to_owned(), Some(Access::Write), "w".to_owned()),
        ],
        "rule: list shows each reader in slot order and the writer, with their access; a \
         waiting writer is not a holder"
    );
    match store.force_release("op/rw").await {
        Err(Error::HeldAsOtherKind {
            held_as: HeldAs::ReadWrite,
            ..
        }) => {}
        other => panic!(
            "rule: force_release of a reader-writer lock's name is refused (grants go one at a \
             time); saw {other:?}"
        ),
    }
    assert_eq!(
        store.force_release_grant("op/rw", 0).await.unwrap(),
        None,
        "fence 0 is no grant"
    );
    let removed = store.force_release_grant("op/rw", a.fence()).await.unwrap();
    assert_eq!(removed.map(|h| h.owner), Some("a".to_owned()));
    assert!(
        !a.renew(LONG).await.unwrap(),
        "rule: a removed grant's renew answers false"
    );
    let removed = store.force_release_grant("op/rw", b.fence()).await.unwrap();
    assert_eq!(removed.map(|h| h.owner), Some("b".to_owned()));
    let waiter = waiting.await.unwrap().unwrap();
    let waiter = waiter.expect("the waiting writer is granted once the readers are removed");
    assert!(
        waiter.fence() > b.fence(),
        "rule: the next grant's fence is higher"
    );
    assert!(!b.release().await.unwrap());
    for grant in [waiter, w] {
        assert!(grant.release().await.unwrap());
    }
}
