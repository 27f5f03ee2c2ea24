//! Assertions the cases share, public for engine-specific tests too.

use std::time::{Duration, Instant};

use alkstore_core::{Closed, DurationError, Error, KeepAlive, Lock, LostReason, Result, Store};

/// Asserts `result` is `Error::Database` with a [`DurationError`] in its chain.
#[track_caller]
pub fn assert_duration_error<T: std::fmt::Debug>(result: Result<T>, expected: DurationError) {
    match result {
        Err(err @ Error::Database { .. }) => {
            assert_eq!(
                err.find_source::<DurationError>(),
                Some(&expected),
                "{err:?}"
            );
        }
        other => panic!("expected Error::Database from {expected:?}, got {other:?}"),
    }
}

/// Asserts `result` is `Error::Database` with [`Closed`] in its chain.
#[track_caller]
pub fn assert_closed<T: std::fmt::Debug>(result: Result<T>) {
    match result {
        Err(err @ Error::Database { .. }) => {
            assert!(
                err.find_source::<Closed>().is_some(),
                "no Closed in {err:?}"
            );
        }
        other => panic!("expected Error::Database from Closed, got {other:?}"),
    }
}

/// Unwraps a grant, failing with what came back instead.
#[track_caller]
pub fn granted(result: Result<Option<Box<dyn Lock>>>) -> Box<dyn Lock> {
    match result {
        Ok(Some(lock)) => lock,
        other => panic!("expected a grant, got {other:?}"),
    }
}

/// Asserts the name was held elsewhere (`Ok(None)`).
#[track_caller]
pub fn refused(result: Result<Option<Box<dyn Lock>>>) {
    match result {
        Ok(None) => {}
        other => panic!("expected Ok(None) (held elsewhere), got {other:?}"),
    }
}

/// Sleeps past the end of a lease of `ttl` granted before this call: the
/// full ttl as the engine's [lease clock](crate::clock) keeps it (rounded
/// up, and the lag before a lapsed lease is gone), plus 30 ms.
pub async fn outlive(ttl: Duration) {
    tokio::time::sleep(crate::clock::clock().lease_end(ttl) + Duration::from_millis(30)).await;
}

/// How much later than its lease's end a grant touched by a dropped
/// operation may still be seen: a renewal or release runs to its answer in
/// the background after its caller stopped waiting (and a dropped acquire's
/// statement may still commit), so the last lease may start that much after
/// the caller's drop on a loaded machine. A grant kept alive for good (a
/// leaked keep-alive, a lease without an end) still outlasts it.
pub const LANDING: Duration = Duration::from_secs(2);

/// Waits out the lease of `ttl` of every operation dropped before this call,
/// then until `look` finds nothing held, for at most [`LANDING`] more.
/// Answers how long it waited in all, or what `look` still saw at the bound.
pub async fn lapsed_after_drops<T, F, Fut>(ttl: Duration, mut look: F) -> Result<Duration, T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let dropped = Instant::now();
    outlive(ttl).await;
    let bound = Instant::now() + LANDING;
    loop {
        match look().await {
            None => return Ok(dropped.elapsed()),
            Some(seen) if Instant::now() >= bound => return Err(seen),
            Some(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// After the holder of `name` (owner `dead_owner`, grant `fence`) died
/// without releasing: its lease is still live, nobody gets the lock before the
/// lease ends, and a waiter gets it within a second after, with a higher
/// fence. Returns the lease that was left and how long the waiter waited.
pub async fn assert_dead_holder_blocks_until_ttl(
    store: &dyn Store,
    name: &str,
    dead_owner: &str,
    fence: u64,
) -> (Duration, Duration) {
    let asked = std::time::Instant::now();
    let holder = store
        .holder(name)
        .await
        .unwrap()
        .expect("the dead holder's lease is still live");
    assert_eq!((holder.owner.as_str(), holder.fence), (dead_owner, fence));
    refused(
        store
            .try_lock(name, "survivor", Duration::from_secs(5))
            .await,
    );
    let lock = granted(
        store
            .lock(
                name,
                "survivor",
                Duration::from_secs(5),
                Duration::from_secs(10),
            )
            .await,
    );
    let waited = asked.elapsed();
    assert!(
        waited >= holder.expires_in,
        "granted before the dead holder's lease ended"
    );
    assert!(
        waited < holder.expires_in + Duration::from_secs(1),
        "took too long: {waited:?}"
    );
    assert!(lock.fence() > fence);
    assert!(lock.release().await.unwrap());
    (holder.expires_in, waited)
}

/// How long past its wait and slack a waiting acquire may go before the test
/// stops waiting for it (a hang must fail the test, not the test run).
const OVERRUN_GUARD: Duration = Duration::from_secs(20);

/// Every message of an error's source chain, joined by `": "`.
pub fn error_chain(error: &alkstore_core::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text += &format!(": {cause}");
        source = cause.source();
    }
    text
}

/// `store.lock(name, owner, ttl, wait)` on a name it cannot get in time:
/// `Ok(None)`, not before `wait` and within `wait + slack`. `overran` says
/// what an answer later than that means in the calling test.
pub async fn assert_refused_within_wait(
    store: &dyn Store,
    (name, owner, ttl): (&str, &str, Duration),
    wait: Duration,
    slack: Duration,
    overran: &str,
) {
    let asked = Instant::now();
    let got = tokio::time::timeout(
        wait + slack + OVERRUN_GUARD,
        store.lock(name, owner, ttl, wait),
    )
    .await
    .unwrap_or_else(|_| panic!("{overran}: no answer {OVERRUN_GUARD:?} past the wait"))
    .expect("running out of the wait is no error");
    let took = asked.elapsed();
    assert!(
        got.is_none(),
        "granted {name:?} although it was not to be had"
    );
    assert!(took >= wait, "gave up early: {took:?}");
    assert!(took < wait + slack, "{overran}: {took:?}");
}

/// A waiting `lock` of `job` on `store`, whose `locks` table someone else
/// holds locked: refused within its 1.5 s wait (+700 ms; `overran` says
/// what a later answer means in the calling test); once `unlock` has run,
/// the name is granted at once and released.
pub async fn assert_waits_out_a_table_lock(
    store: &dyn Store,
    overran: &str,
    unlock: impl std::future::Future<Output = ()>,
) {
    let ttl = Duration::from_secs(30);
    assert_refused_within_wait(
        store,
        ("job", "a", ttl),
        Duration::from_millis(1500),
        Duration::from_millis(700),
        overran,
    )
    .await;
    unlock.await;
    let lock = store
        .try_lock("job", "a", ttl)
        .await
        .unwrap()
        .expect("free once the table lock is gone");
    assert!(lock.release().await.unwrap());
}

/// A bound on a test's poll for something that comes by itself (a standby
/// catching up, a backend starting to wait): [`Patience::next`] sleeps
/// 20 ms before the next look, and fails the test naming `what` once the
/// patience is spent — a poll with a deadline, never a sleep that hopes.
#[derive(Debug)]
pub struct Patience {
    what: &'static str,
    until: Instant,
}

impl Patience {
    /// At most `patience` for `what`.
    pub fn new(what: &'static str, patience: Duration) -> Self {
        Patience {
            what,
            until: Instant::now() + patience,
        }
    }

    /// Before the next look: fails the test if the patience is spent.
    pub async fn next(&self) {
        assert!(
            Instant::now() < self.until,
            "waited in vain for {}",
            self.what
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (at most 10 s) for `kept` to report its lease lost because it
/// could not be renewed in time.
pub async fn assert_not_renewed_in_time(kept: &KeepAlive) {
    let reason = tokio::time::timeout(Duration::from_secs(10), kept.lost())
        .await
        .expect("lost is signalled");
    assert!(
        matches!(reason, LostReason::NotRenewedInTime { .. }),
        "{reason:?}"
    );
}

/// The round trips of a permit's acquire, refusal (every permit held),
/// renew and release, 20 times after a warm-up of 3 (statements prepared
/// and cached per connection), as `flights` counts them (a wire proxy's
/// client flights): each entry is one cycle's four counts.
pub async fn permit_round_trips(store: &dyn Store, flights: impl Fn() -> u64) -> Vec<[u64; 4]> {
    let ttl = Duration::from_secs(30);
    let mut trips = Vec::new();
    for _ in 0..23 {
        let t0 = flights();
        let permit = granted(store.try_acquire_permit("trips", 1, "a", ttl).await);
        let t1 = flights();
        refused(store.try_acquire_permit("trips", 1, "b", ttl).await);
        let t2 = flights();
        assert!(permit.renew(ttl).await.unwrap(), "own live permit renewed");
        let t3 = flights();
        assert!(permit.release().await.unwrap(), "own live permit released");
        let t4 = flights();
        trips.push([t1 - t0, t2 - t1, t3 - t2, t4 - t3]);
    }
    trips.split_off(3)
}

/// The round trips of a reader-writer lock's read acquire, write acquire
/// (a name of its own), a refused writer (beside the reader), a refused
/// reader (beside the writer), renew and release, 20 times after a warm-up
/// of 3, as `flights` counts them: each entry is one cycle's six counts.
pub async fn rw_round_trips(store: &dyn Store, flights: impl Fn() -> u64) -> Vec<[u64; 6]> {
    let ttl = Duration::from_secs(30);
    let mut trips = Vec::new();
    for _ in 0..23 {
        let t0 = flights();
        let read = granted(store.try_read_lock("rw-trips", "a", ttl).await);
        let t1 = flights();
        let write = granted(store.try_write_lock("rw-trips-w", "a", ttl).await);
        let t2 = flights();
        refused(store.try_write_lock("rw-trips", "b", ttl).await);
        let t3 = flights();
        refused(store.try_read_lock("rw-trips-w", "b", ttl).await);
        let t4 = flights();
        assert!(read.renew(ttl).await.unwrap(), "own live read renewed");
        let t5 = flights();
        assert!(read.release().await.unwrap(), "own live read released");
        let t6 = flights();
        assert!(write.release().await.unwrap(), "own live write released");
        trips.push([t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5]);
    }
    trips.split_off(3)
}

/// How long a waiting-acquire case lets its waiter wait before the holder
/// lets go, in round `round`: over 600 ms (for the waiter's back-off to
/// reach its ceiling), plus an offset that differs from round to round, so
/// that the let-go falls at a different phase of any fixed poll each time
/// (13, 50, 87, 24, 61 ms past a multiple of 100 ms): a waiter that only
/// polls every 100 ms is granted 87, 50, 13, 76 and 39 ms after the
/// let-go, a median of 50 ms, where one woken by it takes a few.
pub fn before_letting_go(round: usize) -> Duration {
    const OFFSETS_MS: [u64; 5] = [13, 50, 87, 24, 61];
    Duration::from_millis(600 + OFFSETS_MS[round % OFFSETS_MS.len()])
}

/// On `store`, where `held` holds `name`: a waiting call of owner "b" (in a
/// task of its own) shows in the queue as a lock's waiter, and is granted in
/// turn, with a higher fence, once `held` is released; the queue is empty
/// after. An upgrade test's check that the upgraded store queues.
pub async fn queues_and_grants_in_turn(
    store: std::sync::Arc<dyn Store>,
    name: &str,
    held: Box<dyn Lock>,
) {
    let ttl = Duration::from_secs(30);
    let waiting = {
        let (store, name) = (store.clone(), name.to_owned());
        tokio::spawn(async move { store.lock(&name, "b", ttl, ttl).await })
    };
    let queued = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Some(waiter) = store.waiters(name).await.unwrap().first() {
                return waiter.clone();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the waiting call shows in the queue");
    assert_eq!((queued.owner.as_str(), queued.kind), ("b", "lock"));
    let fence = held.fence();
    assert!(held.release().await.unwrap());
    let granted = waiting.await.unwrap().unwrap().expect("granted in turn");
    assert!(granted.fence() > fence);
    assert!(granted.release().await.unwrap());
    assert!(store.waiters(name).await.unwrap().is_empty());
}

/// One round's handoff: how long from the let-go to the grant, and
/// whether the attempt that won was woken by a release (its `alkstore.*`
/// span's `woken`), not by its poll.
#[derive(Debug, Clone, Copy)]
pub struct Handoff {
    /// From the let-go to the grant.
    pub took: Duration,
    /// Whether a release woke the attempt that won.
    pub woken: bool,
}

/// Asserts that most rounds (the median one) were woken by `what`, not by
/// a poll: a round passes when the span of the winning attempt says a
/// release woke it, however long a loaded machine took, or when it came
/// sooner than any poll would (30 ms: on an engine whose first waiter
/// polls that often, a poll may land before the wake-up). A waiter that
/// only polls, every 100 ms or more, takes longer in at least three of
/// the rounds ([`crate::support::before_letting_go`]'s offsets).
#[track_caller]
pub fn assert_woken(handoffs: &[Handoff], what: &str) {
    let polled: Vec<&Handoff> = handoffs
        .iter()
        .filter(|h| !h.woken && h.took >= Duration::from_millis(30))
        .collect();
    assert!(
        polled.len() * 2 < handoffs.len(),
        "rule: a waiter is woken by {what}, not by its poll; {} of {} rounds were granted by a \
         poll 30 ms or more after it: {handoffs:?}",
        polled.len(),
        handoffs.len()
    );
}

/// What the engines' batch-renewal tests renew: `count` locks named by
/// `name`, a second handle of `name(1)`'s grant, a permit of `sem`, a
/// reader of `rw` and a writer of `w`, every one `owner`'s for `ttl`.
pub async fn renewal_batch_handles(
    store: &dyn Store,
    count: usize,
    name: impl Fn(usize) -> String,
    owner: &str,
    ttl: Duration,
) -> Vec<Box<dyn Lock>> {
    let mut handles = Vec::new();
    for i in 0..count {
        handles.push(granted(store.try_lock(&name(i), owner, ttl).await));
    }
    handles.push(granted(store.try_lock(&name(1), owner, ttl).await));
    handles.push(granted(
        store.try_acquire_permit("sem", 3, owner, ttl).await,
    ));
    handles.push(granted(store.try_read_lock("rw", owner, ttl).await));
    handles.push(granted(store.try_write_lock("w", owner, ttl).await));
    handles
}

/// Renews every handle at once for `ttl`: the answers, in order, and the
/// sizes of the batches they went in (`alkstore.renew_batch` spans) — all
/// of them carried, in three batches at most (the first renewal may go
/// alone, at once; the rest wait for a beat).
pub async fn renew_at_once(
    handles: &[Box<dyn Lock>],
    ttl: Duration,
) -> (Vec<Result<bool>>, Vec<usize>) {
    use crate::spans::{collected, collecting, renewal_batches};
    let (subscriber, spans, _) = collecting();
    let renewals = futures::future::join_all(handles.iter().map(|h| h.renew(ttl)));
    let answers = collected(renewals, &subscriber).await;
    let batches = renewal_batches(&spans.take());
    assert_eq!(batches.iter().sum::<usize>(), handles.len(), "{batches:?}");
    assert!(batches.len() <= 3, "{batches:?}");
    (answers, batches)
}

/// Force-releases each of `released` from `other` (another store), then
/// renews every handle at once ([`renew_at_once`]): a force-released
/// grant's handles answer `false`, every other `true`.
pub async fn assert_only_the_force_released_are_lost(
    other: &dyn Store,
    handles: &[Box<dyn Lock>],
    released: &[String],
    ttl: Duration,
) {
    for name in released {
        let forced = other.force_release(name).await.unwrap();
        assert!(forced.is_some(), "{name} was held");
    }
    let (answers, _) = renew_at_once(handles, ttl).await;
    for (handle, answer) in handles.iter().zip(answers) {
        let expected = !released.iter().any(|r| r == handle.name());
        assert_eq!(answer.unwrap(), expected, "{}", handle.name());
    }
}
