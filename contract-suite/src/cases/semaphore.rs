//! Semaphores: at most `permits` holders of one name, each grant with its
//! own lease, fence and slot.

use std::sync::Arc;
use std::time::{Duration, Instant};

use alkstore_core::{Error, HeldAs, KeepAlive, LeaseStatus, Lock, MAX_PERMITS, PermitSlot, Store};

use crate::clock::{clock, ms};
use crate::safety::Rng;
use crate::safety::permits::{check_permits, race_permits};
use crate::safety::workload::Race;
use crate::support::{LANDING, assert_closed, granted, lapsed_after_drops, outlive, refused};
use tracing::instrument::WithSubscriber;

const LONG: Duration = Duration::from_secs(30);

/// The slot of a permit's handle, failing when the handle has none.
#[track_caller]
fn slot(permit: &dyn Lock) -> u32 {
    match permit.permit() {
        Some(PermitSlot { slot, .. }) => slot,
        None => panic!("rule: a permit's handle tells its slot; {permit:?} tells none"),
    }
}

/// The fences of the live permits of `name`, in slot order, with their slots.
async fn live_permits(store: &Arc<dyn Store>, name: &str) -> Vec<(u32, u64)> {
    store
        .holders(name)
        .await
        .unwrap()
        .iter()
        .map(|listed| match listed.permit {
            Some(permit) => (permit.slot, listed.holder.fence),
            None => panic!("rule: a semaphore's grants are listed as permits; saw {listed:?}"),
        })
        .collect()
}

/// Sixteen independent stores race for the three permits of one name for
/// three seconds: never more than three holders at once, never two on one
/// slot, and fences in commit order (a grant requested after another came
/// back, or of a slot after that slot's release returned, is above it).
pub async fn semaphore_admits_at_most_its_permits(stores: crate::Stores) {
    const PERMITS: u32 = 3;
    let peers = stores.open(16).await;
    let seed = Rng::from_clock("semaphore_admits_at_most_its_permits").next_u64();
    let race = Race {
        tasks_per_store: 2,
        duration: Duration::from_secs(3),
    };
    let history = race_permits(&peers, "permits-raced", PERMITS, race, seed).await;
    assert!(
        history.len() >= 50,
        "precondition: the race granted enough permits to mean something; saw {}, expected at \
         least 50 (seed {seed})",
        history.len()
    );
    let mut slots: Vec<u32> = history.iter().map(|p| p.slot).collect();
    slots.sort_unstable();
    slots.dedup();
    assert_eq!(
        slots,
        [0, 1, 2],
        "rule: a semaphore's grants hold slots 0..permits; saw slots {slots:?} (seed {seed})"
    );
    if let Err(violation) = check_permits(&history, PERMITS) {
        panic!(
            "rule: at most `permits` holders at once, one per slot, fences in commit order; saw \
             {violation:?} in {} grants (seed {seed})",
            history.len()
        );
    }
    let lost = history.iter().filter(|p| !p.released).count();
    assert_eq!(
        lost, 0,
        "rule: release answers true for its own live permit; {lost} releases answered false"
    );
    eprintln!(
        "semaphore race: {} grants of 3 permits by 32 tasks on 16 stores",
        history.len()
    );
}

/// A permit's lease lapses on its own: once it has, another owner gets that
/// slot with a higher fence, while the live permits stay as they were.
pub async fn permit_expiry_lets_another_owner_in(store: Arc<dyn Store>) {
    let short = ms(300);
    let a = granted(store.try_acquire_permit("pool", 2, "a", short).await);
    let b = granted(store.try_acquire_permit("pool", 2, "b", LONG).await);
    assert_eq!(
        (slot(a.as_ref()), slot(b.as_ref())),
        (0, 1),
        "rule: a free semaphore hands out its lowest free slot"
    );
    assert_eq!(
        a.permit().map(|p| p.permits),
        Some(2),
        "rule: a permit's handle tells how many permits its semaphore has"
    );
    refused(store.try_acquire_permit("pool", 2, "c", LONG).await);
    outlive(short).await;
    let c = granted(store.try_acquire_permit("pool", 2, "c", LONG).await);
    assert_eq!(
        slot(c.as_ref()),
        0,
        "rule: an expired permit's slot is free; saw c on slot {}, expected 0",
        slot(c.as_ref())
    );
    assert!(
        c.fence() > b.fence() && b.fence() > a.fence(),
        "rule: every grant's fence is above every earlier grant's; saw a {}, b {}, c {}",
        a.fence(),
        b.fence(),
        c.fence()
    );
    assert_eq!(
        live_permits(&store, "pool").await,
        [(0, c.fence()), (1, b.fence())],
        "rule: an expiry ends that permit only"
    );
    refused(store.try_acquire_permit("pool", 2, "d", LONG).await);
    drop(a);
    for permit in [b, c] {
        assert!(permit.release().await.unwrap(), "own live permit released");
    }
}

/// Renewing a permit sets a full window from now; once its lease lapsed,
/// renew answers `false`, and a taken-over slot is not touched.
pub async fn permit_renew_is_a_full_window_and_false_when_lost(store: Arc<dyn Store>) {
    // Long enough that the grant is renewed before it lapses on a loaded
    // machine (the renewal must answer true).
    let short = ms(1000);
    let a = granted(store.try_acquire_permit("renewed", 1, "a", short).await);
    assert!(
        a.renew(LONG).await.unwrap(),
        "rule: renew of a live permit answers true"
    );
    let left = store.holders("renewed").await.unwrap()[0].holder.expires_in;
    assert!(
        left > LONG - Duration::from_secs(5) && left <= LONG,
        "rule: renew sets a full window from now (not added to what was left); saw {left:?} \
         left, expected about {LONG:?} and no more"
    );
    assert!(
        a.valid_until() > Instant::now() + LONG - Duration::from_secs(5),
        "rule: a renewed permit's valid_until moves to its new window"
    );
    assert!(a.renew(short).await.unwrap(), "shortened again");
    outlive(short).await;
    assert!(
        !a.renew(LONG).await.unwrap(),
        "rule: renew answers false once the permit's lease lapsed"
    );
    let b = granted(store.try_acquire_permit("renewed", 1, "b", LONG).await);
    assert!(
        !a.renew(LONG).await.unwrap(),
        "rule: renew answers false after a takeover of the slot"
    );
    assert_eq!(
        live_permits(&store, "renewed").await,
        [(0, b.fence())],
        "rule: a lost permit's renew leaves the slot's new grant alone"
    );
    assert!(b.release().await.unwrap());
    drop(a);
}

/// Once a lease lapsed and the other kind took the name — a lock after a
/// permit, a permit after a lock — renewing the lapsed lease answers
/// `false` and leaves the name to the new holder: never both kinds at once.
pub async fn a_lapsed_lease_stays_lost_once_the_other_kind_holds_the_name(store: Arc<dyn Store>) {
    let short = ms(200);
    let permit = granted(store.try_acquire_permit("switched", 2, "a", short).await);
    outlive(short).await;
    let lock = granted(store.try_lock("switched", "b", LONG).await);
    assert!(
        !permit.renew(LONG).await.unwrap(),
        "rule: a lapsed permit stays lost once a lock holds its name; renew answered true"
    );
    let held: Vec<_> = store.holders("switched").await.unwrap();
    assert!(
        held.len() == 1 && held[0].permit.is_none(),
        "rule: a name is a lock or a semaphore, never both; saw {held:?}"
    );
    assert!(lock.renew(short).await.unwrap());
    outlive(short).await;
    let permit = granted(store.try_acquire_permit("switched", 2, "c", LONG).await);
    assert!(
        !lock.renew(LONG).await.unwrap(),
        "rule: a lapsed lock stays lost once a permit holds its name; renew answered true"
    );
    let held: Vec<_> = store.holders("switched").await.unwrap();
    assert!(
        held.len() == 1 && held[0].permit.is_some(),
        "rule: a name is a lock or a semaphore, never both; saw {held:?}"
    );
    assert!(permit.release().await.unwrap());
}

/// A permit is a `Lock` like any other: a [`KeepAlive`] holds it past its
/// ttl (same slot, same fence), and its release frees the slot.
pub async fn keepalive_holds_a_permit_past_its_ttl(store: Arc<dyn Store>) {
    let ttl = super::keepalive::KEPT_TTL;
    let permit = granted(store.try_acquire_permit("kept-pool", 1, "a", ttl).await);
    let fence = permit.fence();
    let kept = KeepAlive::start(permit, ttl).unwrap();
    tokio::time::sleep(ttl * 2).await;
    assert!(
        matches!(kept.status(), LeaseStatus::Held { .. }),
        "rule: a keep-alive holds a permit past its ttl; saw {:?} after two ttls",
        kept.status()
    );
    assert_eq!(
        live_permits(&store, "kept-pool").await,
        [(0, fence)],
        "rule: a keep-alive renews the same permit, same fence"
    );
    refused(store.try_acquire_permit("kept-pool", 1, "b", ttl).await);
    assert!(
        kept.release().await.unwrap(),
        "rule: a keep-alive's release releases its live permit"
    );
    let next = granted(store.try_acquire_permit("kept-pool", 1, "b", LONG).await);
    assert!(next.release().await.unwrap());
}

/// Release of a permit: `true` for its own grant, live or lapsed; `false`
/// the second time; the other permits stay held.
pub async fn permit_release_ends_its_grant_only(store: Arc<dyn Store>) {
    let short = ms(200);
    let a = granted(store.try_acquire_permit("released", 3, "a", LONG).await);
    let b = granted(store.try_acquire_permit("released", 3, "b", short).await);
    let c = granted(store.try_acquire_permit("released", 3, "c", LONG).await);
    assert!(
        a.release().await.unwrap(),
        "rule: release answers true for its own live permit"
    );
    assert_eq!(
        live_permits(&store, "released").await,
        [(1, b.fence()), (2, c.fence())],
        "rule: a release ends that permit only"
    );
    outlive(short).await;
    assert_eq!(
        b.release_shared().await.unwrap(),
        !clock().removes_lapsed,
        "rule: release deletes the holder's own lapsed permit and answers true (false where \
         the engine removed the lapsed grant itself)"
    );
    assert!(
        !b.release().await.unwrap(),
        "rule: release answers false the second time"
    );
    let d = granted(store.try_acquire_permit("released", 3, "d", LONG).await);
    assert_eq!(slot(d.as_ref()), 0, "the lowest free slot again");
    assert!(c.release().await.unwrap());
    assert!(d.release().await.unwrap());
    assert!(store.holders("released").await.unwrap().is_empty());
}

/// An old permit handle never touches a newer grant of its slot, even one
/// made to the same owner: its renew and release answer `false`, and the
/// new grant stays.
pub async fn permit_handle_never_touches_a_later_grant_of_its_slot(store: Arc<dyn Store>) {
    let short = ms(200);
    let old = granted(store.try_acquire_permit("identity", 1, "a", short).await);
    outlive(short).await;
    let new = granted(store.try_acquire_permit("identity", 1, "a", LONG).await);
    assert_eq!(slot(new.as_ref()), slot(old.as_ref()), "one slot");
    assert!(
        new.fence() > old.fence(),
        "rule: a new grant of a slot has a higher fence; saw {} after {}",
        new.fence(),
        old.fence()
    );
    assert!(
        !old.renew(LONG).await.unwrap(),
        "rule: an old permit's renew never touches a later grant of its slot"
    );
    assert!(
        !old.release().await.unwrap(),
        "rule: an old permit's release never touches a later grant of its slot"
    );
    assert_eq!(
        live_permits(&store, "identity").await,
        [(0, new.fence())],
        "rule: the later grant stays held"
    );
    assert!(new.release().await.unwrap());
}

/// The same owner asking again while its permit is live gets that permit:
/// same slot, same fence, its expiry not refreshed.
pub async fn permit_same_owner_gets_its_permit_back(store: Arc<dyn Store>) {
    let first = granted(
        store
            .try_acquire_permit("again", 2, "a", Duration::from_secs(10))
            .await,
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    let again = granted(store.try_acquire_permit("again", 2, "a", LONG).await);
    assert_eq!(
        (slot(again.as_ref()), again.fence()),
        (slot(first.as_ref()), first.fence()),
        "rule: the same owner again gets the same permit"
    );
    let left = store.holders("again").await.unwrap()[0].holder.expires_in;
    assert!(
        left <= Duration::from_secs(10),
        "rule: the same owner again does not refresh the expiry; saw {left:?} left"
    );
    assert!(
        again.valid_until() <= first.valid_until() + Duration::from_millis(5),
        "rule: the re-acquired handle promises no more than the lease left"
    );
    assert_eq!(
        store.holders("again").await.unwrap().len(),
        1,
        "one permit held, not two"
    );
    let other = granted(store.try_acquire_permit("again", 2, "b", LONG).await);
    assert!(first.release().await.unwrap());
    drop(again);
    assert!(other.release().await.unwrap());
}

/// A permit asked with another number of permits than the live grants'
/// is refused with an error naming both, writing nothing; once the name is
/// free, any number is accepted.
pub async fn permit_count_mismatch_is_refused(store: Arc<dyn Store>) {
    let a = granted(store.try_acquire_permit("counted", 3, "a", LONG).await);
    for (asked, wait) in [(2, None), (4, Some(Duration::from_millis(300)))] {
        let result = match wait {
            None => store.try_acquire_permit("counted", asked, "b", LONG).await,
            Some(wait) => {
                store
                    .acquire_permit("counted", asked, "b", LONG, wait)
                    .await
            }
        };
        match result {
            Err(Error::PermitsMismatch {
                name,
                asked: a,
                live: 3,
            }) if name == "counted" && a == asked => {}
            other => panic!(
                "rule: a permit asked with another count than the live grants' is refused with \
                 PermitsMismatch naming both; asked {asked}, saw {other:?}"
            ),
        }
    }
    assert_eq!(
        live_permits(&store, "counted").await,
        [(0, a.fence())],
        "rule: a refused permit writes nothing"
    );
    assert!(a.release().await.unwrap());
    let b = granted(store.try_acquire_permit("counted", 2, "b", LONG).await);
    assert!(b.release().await.unwrap());
}

/// A name is a lock or a semaphore, never both at once: a permit of a
/// locked name and a lock of a semaphore's name are refused with an error
/// saying what holds it, writing nothing — also while waiters queue for
/// the semaphore.
pub async fn lock_and_semaphore_names_never_mix(store: Arc<dyn Store>) {
    let lock = granted(store.try_lock("kind", "a", LONG).await);
    for result in [
        store.try_acquire_permit("kind", 2, "b", LONG).await,
        store
            .acquire_permit("kind", 2, "b", LONG, Duration::from_millis(300))
            .await,
    ] {
        match result {
            Err(Error::HeldAsOtherKind {
                name,
                held_as: HeldAs::Lock,
            }) if name == "kind" => {}
            other => panic!(
                "rule: a permit of a locked name is refused with HeldAsOtherKind(Lock); saw \
                 {other:?}"
            ),
        }
    }
    assert_eq!(
        store.holder("kind").await.unwrap().map(|h| h.fence),
        Some(lock.fence()),
        "rule: a refused permit writes nothing"
    );
    assert!(lock.release().await.unwrap());

    let permit = granted(store.try_acquire_permit("kind", 2, "b", LONG).await);
    for result in [
        store.try_lock("kind", "c", LONG).await,
        store
            .lock("kind", "c", LONG, Duration::from_millis(300))
            .await,
    ] {
        match result {
            Err(Error::HeldAsOtherKind {
                name,
                held_as: HeldAs::Semaphore { permits: 2 },
            }) if name == "kind" => {}
            other => panic!(
                "rule: a lock of a semaphore's name is refused with HeldAsOtherKind(Semaphore \
                 of 2); saw {other:?}"
            ),
        }
    }
    assert_eq!(
        live_permits(&store, "kind").await,
        [(0, permit.fence())],
        "rule: a refused lock writes nothing"
    );
    assert!(permit.release().await.unwrap());
    let lock = granted(store.try_lock("kind", "c", LONG).await);
    assert!(lock.release().await.unwrap());

    // With a permit waiter queued (where the engine queues), a lock of the
    // semaphore's name is still the other kind's error, not a turn to wait.
    let permit = granted(store.try_acquire_permit("kind/q", 1, "b", LONG).await);
    let waiting = {
        let store = store.clone();
        tokio::spawn(async move { store.acquire_permit("kind/q", 1, "w", LONG, LONG).await })
    };
    let looked = std::time::Instant::now();
    while store.waiters("kind/q").await.unwrap().is_empty()
        && looked.elapsed() < Duration::from_secs(1)
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for result in [
        store.try_lock("kind/q", "c", LONG).await,
        store
            .lock("kind/q", "c", LONG, Duration::from_millis(300))
            .await,
    ] {
        match result {
            Err(Error::HeldAsOtherKind {
                held_as: HeldAs::Semaphore { permits: 1 },
                ..
            }) => {}
            other => panic!(
                "rule: a lock of a semaphore's name is refused with HeldAsOtherKind(Semaphore \
                 of 1), also while permit waiters queue; saw {other:?}"
            ),
        }
    }
    assert!(permit.release().await.unwrap());
    let next = waiting.await.unwrap().unwrap().expect("the waiter's turn");
    assert!(next.release().await.unwrap());
}

/// Bad input to the permit calls is refused before storage, writing
/// nothing: 0 permits, more than `MAX_PERMITS`, a bad name, owner or ttl.
pub async fn permit_bad_input_is_refused_and_writes_nothing(store: Arc<dyn Store>) {
    for permits in [0, MAX_PERMITS + 1, u32::MAX] {
        for result in [
            store.try_acquire_permit("bad", permits, "a", LONG).await,
            store
                .acquire_permit("bad", permits, "a", LONG, Duration::from_millis(100))
                .await,
        ] {
            assert!(
                matches!(result, Err(Error::InvalidPermits { permits: p, max: MAX_PERMITS }) if p == permits),
                "rule: permits outside 1..=MAX_PERMITS are refused; {permits}: saw {result:?}"
            );
        }
    }
    let name_error = store.try_acquire_permit("", 2, "a", LONG).await;
    assert!(
        matches!(name_error, Err(Error::InvalidName { .. })),
        "rule: a bad name is refused; saw {name_error:?}"
    );
    let owner_error = store.try_acquire_permit("bad", 2, " ", LONG).await;
    assert!(
        matches!(owner_error, Err(Error::InvalidName { .. })),
        "rule: a bad owner is refused; saw {owner_error:?}"
    );
    let ttl_error = store
        .try_acquire_permit("bad", 2, "a", Duration::ZERO)
        .await;
    assert!(
        matches!(ttl_error, Err(Error::Database { .. })),
        "rule: a zero ttl is refused; saw {ttl_error:?}"
    );
    assert!(
        store.list("", None, 10).await.unwrap().is_empty(),
        "rule: refused input writes nothing"
    );
    // The bound itself is accepted.
    let big = granted(
        store
            .try_acquire_permit("big", MAX_PERMITS, "a", LONG)
            .await,
    );
    assert!(big.release().await.unwrap());
}

/// A closed store fails the permit calls closed.
pub async fn permit_calls_on_a_closed_store_fail_closed(store: Arc<dyn Store>) {
    let permit = granted(store.try_acquire_permit("closing", 2, "a", LONG).await);
    store.close().await.unwrap();
    assert_closed(store.try_acquire_permit("closing", 2, "b", LONG).await);
    assert_closed(
        store
            .acquire_permit("closing", 2, "b", LONG, Duration::from_secs(1))
            .await,
    );
    assert_closed(permit.renew(LONG).await);
    assert_closed(permit.release().await);
}

/// A waiting `acquire_permit` is woken by the release of any permit of
/// the name, not by its poll.
pub async fn acquire_permit_woken_by_release(store: Arc<dyn Store>) {
    let mut handoffs = Vec::new();
    let (subscriber, spans, _second) = crate::spans::collecting();
    for round in 0..5 {
        let name = format!("permit-handoff-{round}");
        let a = granted(store.try_acquire_permit(&name, 2, "a", LONG).await);
        let b = granted(store.try_acquire_permit(&name, 2, "b", LONG).await);
        let waiter = {
            let (store, name) = (store.clone(), name.clone());
            let waiting = async move {
                let (wait, asked_at) = (Duration::from_secs(20), Instant::now());
                let permit = granted(store.acquire_permit(&name, 2, "w", LONG, wait).await);
                (asked_at, Instant::now(), permit)
            };
            tokio::spawn(waiting.with_subscriber(subscriber.clone()))
        };
        // Long enough for the waiter's back-off to reach its ceiling
        // (checked below, not hoped).
        tokio::time::sleep(crate::support::before_letting_go(round)).await;
        assert!(
            !waiter.is_finished(),
            "rule: at most `permits` holders; round {round}: the waiter finished while both \
             permits were held"
        );
        let let_go = if round % 2 == 0 { a } else { b };
        let let_go_slot = slot(let_go.as_ref());
        let released_at = Instant::now();
        assert!(let_go.release().await.unwrap());
        let (asked_at, granted_at, permit) = waiter.await.unwrap();
        assert!(
            released_at >= asked_at + Duration::from_millis(400),
            "precondition: the waiter was waiting before the release; round {round}: saw {:?} \
             from its ask to it, expected at least 400 ms (the waiter started late)",
            released_at.saturating_duration_since(asked_at)
        );
        assert_eq!(slot(permit.as_ref()), let_go_slot, "the slot let go");
        handoffs.push(crate::support::Handoff {
            took: granted_at - released_at,
            woken: crate::spans::woken_in(&spans.take(), "alkstore.acquire_permit"),
        });
        assert!(permit.release().await.unwrap());
    }
    crate::support::assert_woken(&handoffs, "the release of a permit");
}

/// The operator's view: `list` and `holders` show each live permit in slot
/// order and a page never splits a semaphore; `force_release` of the name
/// is refused (permits go one at a time), `force_release_grant` removes one
/// permit, whose handle then answers `false`, and the next grant of its
/// slot has a higher fence.
pub async fn permits_are_listed_and_released_by_force_one_at_a_time(store: Arc<dyn Store>) {
    let a = granted(store.try_acquire_permit("op/pool", 3, "a", LONG).await);
    let b = granted(store.try_acquire_permit("op/pool", 3, "b", LONG).await);
    let c = granted(store.try_acquire_permit("op/pool", 3, "c", LONG).await);
    let lock = granted(store.try_lock("op/zlock", "z", LONG).await);
    let page = store.list("op/", None, 1).await.unwrap();
    let seen: Vec<(&str, Option<PermitSlot>, &str)> = page
        .iter()
        .map(|l| (l.name.as_str(), l.permit, l.holder.owner.as_str()))
        .collect();
    let permit = |slot| Some(PermitSlot { slot, permits: 3 });
    assert_eq!(
        seen,
        [
            ("op/pool", permit(0), "a"),
            ("op/pool", permit(1), "b"),
            ("op/pool", permit(2), "c")
        ],
        "rule: list shows each permit in slot order, and a page holds whole names"
    );
    let next = store.list("op/", Some("op/pool"), 10).await.unwrap();
    assert_eq!(
        next.iter()
            .map(|l| (l.name.as_str(), l.permit))
            .collect::<Vec<_>>(),
        [("op/zlock", None)],
        "rule: the next page starts after the last name"
    );
    let holders = store.holders("op/pool").await.unwrap();
    let grants = |listed: &[alkstore_core::Listed]| -> Vec<(u64, Option<PermitSlot>)> {
        listed.iter().map(|l| (l.holder.fence, l.permit)).collect()
    };
    assert_eq!(
        grants(&holders),
        grants(&page),
        "rule: holders shows the name's live permits, as list does"
    );
    match store.force_release("op/pool").await {
        Err(Error::HeldAsOtherKind {
            held_as: HeldAs::Semaphore { permits: 3 },
            ..
        }) => {}
        other => panic!(
            "rule: a semaphore's permits are released by force one at a time; force_release of \
             its name saw {other:?}"
        ),
    }
    assert_eq!(
        store.holders("op/pool").await.unwrap().len(),
        3,
        "nothing removed"
    );
    let removed = store
        .force_release_grant("op/pool", b.fence())
        .await
        .unwrap();
    assert_eq!(
        removed.map(|h| (h.owner, h.fence)),
        Some(("b".to_owned(), b.fence())),
        "rule: a forced release of one grant removes that permit and answers it"
    );
    assert_eq!(
        live_permits(&store, "op/pool").await,
        [(0, a.fence()), (2, c.fence())],
        "the other permits stay"
    );
    assert!(
        !b.renew(LONG).await.unwrap(),
        "rule: a permit removed by force answers false to renew"
    );
    let d = granted(store.try_acquire_permit("op/pool", 3, "d", LONG).await);
    assert_eq!(slot(d.as_ref()), 1, "the slot removed by force is free");
    assert!(
        d.fence() > c.fence(),
        "rule: the grant after a forced release has a higher fence"
    );
    drop(b);
    for held in [a, c, d, lock] {
        assert!(held.release().await.unwrap());
    }
}

/// Permit calls dropped mid-flight leave no permit held beyond its TTL:
/// after it, every permit is free again.
pub async fn permit_cancellation_leaves_nothing_beyond_its_ttl(store: Arc<dyn Store>) {
    let ttl = Duration::from_millis(300);
    let mut rng = Rng::from_clock("permit_cancellation_leaves_nothing_beyond_its_ttl");
    let mut handles: Vec<Box<dyn Lock>> = Vec::new();
    let mut dropped = 0u32;
    for _ in 0..200 {
        let limit = Duration::from_micros(rng.below(3000));
        let owner = format!("o{}", rng.below(5));
        let outcome = match rng.below(4) {
            0 => tokio::time::timeout(limit, store.try_acquire_permit("cancel", 2, &owner, ttl))
                .await
                .map(|r| r.unwrap().map(|l| handles.push(l))),
            1 => tokio::time::timeout(
                limit,
                store.acquire_permit("cancel", 2, &owner, ttl, Duration::from_millis(20)),
            )
            .await
            .map(|r| r.unwrap().map(|l| handles.push(l))),
            2 if !handles.is_empty() => {
                let h = &handles[rng.below(handles.len() as u64) as usize];
                tokio::time::timeout(limit, h.renew(ttl))
                    .await
                    .map(|r| r.map(|_| ()).ok())
            }
            _ if !handles.is_empty() => {
                let h = handles.swap_remove(rng.below(handles.len() as u64) as usize);
                tokio::time::timeout(limit, h.release())
                    .await
                    .map(|r| r.map(|_| ()).ok())
            }
            _ => Ok(None),
        };
        if outcome.is_err() {
            dropped += 1;
        }
    }
    assert!(
        dropped > 0,
        "no future was dropped mid-flight; the test proved nothing"
    );
    drop(handles);
    let waited = lapsed_after_drops(ttl, || async {
        let left = store.holders("cancel").await.unwrap();
        (!left.is_empty()).then_some(left)
    })
    .await;
    let waited = match waited {
        Ok(waited) => waited,
        Err(left) => panic!(
            "rule: no permit outlives its lease, even with futures dropped mid-flight; saw {left:?} \
             {LANDING:?} after its TTL"
        ),
    };
    // Leases long enough that their releases cannot find them lapsed.
    let x = granted(store.try_acquire_permit("cancel", 2, "x", LONG).await);
    let y = granted(store.try_acquire_permit("cancel", 2, "y", LONG).await);
    assert!(
        x.release().await.unwrap() && y.release().await.unwrap(),
        "rule: release answers true for its own live permit"
    );
    eprintln!(
        "permit cancellation: 200 operations, {dropped} dropped mid-flight, all lapsed {waited:?} \
         after the drops"
    );
}
