//! What a store knows of each grant it holds handles to: one
//! `valid_until` per grant, shared by every handle of it, moved only by what
//! certainly holds. docs/valid-until.md tells the whole model, from the
//! engine's answer to the holder's check, and where each part lives.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use tokio::sync::Notify;

use crate::engine::GrantKey;

/// The shared state of one grant's handles.
///
/// Renewals of one grant may be in flight at once (two handles, or one
/// handle renewed from two tasks), and a server may commit them in another
/// order than they were sent: the last to commit sets the lease, and which
/// one that is, nobody here knows. So `valid_until` only ever comes down
/// while renewals are in flight (each may land at once, with its own ttl),
/// and goes up only when none is left in flight and every one of them was
/// renewed — then to the earliest end any of them could have set.
#[derive(Debug)]
pub(crate) struct GrantState {
    /// Before this instant the lease is certainly valid.
    valid_until: Instant,
    /// Renewals sent and not answered yet.
    in_flight: u32,
    /// The earliest end a renewal sent since the last settled moment could
    /// have set (`sent + ttl`), and whether all of them answered "renewed".
    batch: Option<Batch>,
    /// Nothing moves `valid_until` past this again: a renewal answered
    /// "lost", or a release was sent.
    cap: Option<Instant>,
    /// Whether sharing this grant between handles was already warned of.
    warned: bool,
    /// Notified whenever `valid_until` comes down, for a keep-alive to act
    /// on it at once rather than look at it every so often.
    lowered: Arc<Notify>,
}

/// The renewals sent since the grant's state last settled.
#[derive(Debug, Clone, Copy)]
struct Batch {
    earliest_end: Instant,
    all_renewed: bool,
}

impl GrantState {
    fn lower(&mut self, to: Instant) {
        if to < self.valid_until {
            self.valid_until = to;
            self.lowered.notify_waiters();
        }
    }
}

/// One grant's state, as a handle holds it.
pub(crate) type SharedGrant = Arc<Mutex<GrantState>>;

fn lock(state: &SharedGrant) -> std::sync::MutexGuard<'_, GrantState> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

/// The conservative deadline of a grant.
pub(crate) fn valid_until(state: &SharedGrant) -> Instant {
    lock(state).valid_until
}

/// The signal notified whenever the grant's deadline comes down.
pub(crate) fn lowered(state: &SharedGrant) -> Arc<Notify> {
    lock(state).lowered.clone()
}

/// A renewal that would make the lease end at `until` (its sending plus its
/// ttl) is about to be sent. It may land at once, so a shorter ttl than the
/// lease has left lowers the deadline now.
pub(crate) fn renewal_sent(state: &SharedGrant, until: Instant) {
    let mut state = lock(state);
    state.in_flight += 1;
    state.lower(until);
    state.batch = Some(match state.batch {
        Some(batch) => Batch {
            earliest_end: batch.earliest_end.min(until),
            ..batch
        },
        None => Batch {
            earliest_end: until,
            all_renewed: true,
        },
    });
}

/// What a renewal answered, and what it means for `valid_until`:
/// - renewed: once no renewal is in flight and all of them were renewed,
///   the earliest end any of them could have set (whichever committed last
///   decides, and each ends no earlier than its own `sent + ttl`);
/// - lost: the lease ended no later than when the request was sent, for good;
/// - unknown (an error, or the caller gave up waiting): the renewal may or
///   may not have landed, so the deadline cannot go up on its account.
pub(crate) fn renewal_answered(state: &SharedGrant, outcome: Renewal) {
    let mut state = lock(state);
    state.in_flight = state.in_flight.saturating_sub(1);
    match outcome {
        Renewal::Renewed => {}
        Renewal::Lost { sent } => {
            state.cap = Some(state.cap.map_or(sent, |cap| cap.min(sent)));
            state.lower(sent);
            if let Some(batch) = &mut state.batch {
                batch.all_renewed = false;
            }
        }
        Renewal::Unknown => {
            if let Some(batch) = &mut state.batch {
                batch.all_renewed = false;
            }
        }
    }
    if state.in_flight == 0 {
        if let Some(batch) = state.batch.take() {
            if batch.all_renewed {
                let settled = state
                    .cap
                    .map_or(batch.earliest_end, |cap| cap.min(batch.earliest_end));
                state.valid_until = settled;
            }
        }
    }
}

/// The grant ends for this store at `at` (a release was sent): no
/// handle of it may count on it after that.
pub(crate) fn ended(state: &SharedGrant, at: Instant) {
    let mut state = lock(state);
    state.cap = Some(state.cap.map_or(at, |cap| cap.min(at)));
    state.lower(at);
}

/// How one renewal ended.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Renewal {
    /// Renewed: the lease now ends no earlier than the `until` it was sent with.
    Renewed,
    /// Not renewed: the lease is gone.
    Lost { sent: Instant },
    /// No answer: it may or may not have landed.
    Unknown,
}

/// The grants a store holds live handles to, by grant (one map per store:
/// stores, even in one process, learn of each other only through storage).
#[derive(Debug, Default)]
pub(crate) struct Grants {
    live: Mutex<HashMap<GrantKey, Weak<Mutex<GrantState>>>>,
    /// The size of `live` at which dead entries are swept next.
    sweep_at: std::sync::atomic::AtomicUsize,
    released: Mutex<Released>,
}

/// Grants this store released, remembered for as long as an acquire that
/// may have read their row before the release committed is in flight: the
/// same owner's acquire can come back with a grant that its twin's release
/// deleted meanwhile, after every handle of it is gone.
#[derive(Debug, Default)]
struct Released {
    /// Acquires in flight, by ticket (tickets rise with time): when sent.
    acquires: BTreeMap<u64, Instant>,
    next_ticket: u64,
    /// Per released grant: when the release was sent, and when it answered.
    ended: HashMap<GrantKey, (Instant, Option<Instant>)>,
}

impl Released {
    /// Forgets releases that answered before every acquire in flight was
    /// sent: those acquires read after the release committed.
    fn prune(&mut self) {
        let earliest = self.acquires.values().next().copied();
        self.ended
            .retain(|_, (_, answered)| match (answered, earliest) {
                (None, _) => true,
                (Some(_), None) => false,
                (Some(answered), Some(earliest)) => *answered >= earliest,
            });
    }
}

impl Grants {
    /// The state for a grant just handed out, observed valid until `until`.
    /// When another handle to the same grant is live in this store, both
    /// share one state, at the earlier deadline; the second value is true
    /// the first time that happens for this grant (to warn once).
    /// A grant this store released while the acquire was in flight is
    /// handed out already ended.
    pub(crate) fn handed_out(&self, key: &GrantKey, until: Instant) -> (SharedGrant, bool) {
        // Joined first, then checked: a twin's release that comes and goes
        // in between is either seen here or found this state live.
        let (state, first_time) = self.share(key, until);
        let ended_at = self
            .released
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .ended
            .get(key)
            .map(|(sent, _)| *sent);
        if let Some(at) = ended_at {
            ended(&state, at);
        }
        (state, first_time)
    }

    fn share(&self, key: &GrantKey, until: Instant) -> (SharedGrant, bool) {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(state) = live.get(key).and_then(Weak::upgrade) {
            let first_time = {
                let mut shared = lock(&state);
                shared.lower(until);
                !std::mem::replace(&mut shared.warned, true)
            };
            return (state, first_time);
        }
        let state = Arc::new(Mutex::new(GrantState {
            valid_until: until,
            in_flight: 0,
            batch: None,
            cap: None,
            warned: false,
            lowered: Arc::new(Notify::new()),
        }));
        // Entries whose last handle went while a renewal task still held
        // the state are swept now and then (amortised: when the map has
        // doubled since the last sweep).
        if live.len() >= self.sweep_at.load(std::sync::atomic::Ordering::Relaxed) {
            live.retain(|_, weak| weak.strong_count() > 0);
            self.sweep_at.store(
                (live.len() * 2).max(64),
                std::sync::atomic::Ordering::Relaxed,
            );
        }
        live.insert(key.clone(), Arc::downgrade(&state));
        (state, false)
    }

    /// An acquire is about to be sent: its ticket, to give back with
    /// [`Grants::acquire_done`] once its answer was handed out (or dropped).
    pub(crate) fn acquire_sent(&self) -> u64 {
        let mut released = self.released.lock().unwrap_or_else(|e| e.into_inner());
        let ticket = released.next_ticket;
        released.next_ticket += 1;
        released.acquires.insert(ticket, Instant::now());
        ticket
    }

    /// The acquire with this ticket is over.
    pub(crate) fn acquire_done(&self, ticket: u64) {
        let mut released = self.released.lock().unwrap_or_else(|e| e.into_inner());
        released.acquires.remove(&ticket);
        released.prune();
    }

    /// A release of `key` is being sent at `at`.
    pub(crate) fn release_sent(&self, key: &GrantKey, at: Instant) {
        let mut released = self.released.lock().unwrap_or_else(|e| e.into_inner());
        // A second release of one grant keeps the first one's time: that
        // one may be the DELETE that committed.
        let entry = released.ended.entry(key.clone()).or_insert((at, None));
        *entry = (entry.0.min(at), None);
    }

    /// The release of `key` answered (or its caller stopped waiting).
    pub(crate) fn release_answered(&self, key: &GrantKey) {
        let mut released = self.released.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, answered)) = released.ended.get_mut(key) {
            *answered = Some(Instant::now());
        }
        released.prune();
    }

    /// A handle of `key` is going away: forget the grant once no handle
    /// of it is left. The handle's reference is dropped under the map's
    /// mutex, so two handles dropping at once cannot both miss the last one.
    pub(crate) fn dropped(&self, key: &GrantKey, state: SharedGrant) {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        drop(state);
        if live.get(key).is_some_and(|weak| weak.strong_count() == 0) {
            live.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn key(fence: u64) -> GrantKey {
        GrantKey {
            name: "n".into(),
            owner: "o".into(),
            fence,
            permit: None,
            access: None,
        }
    }

    #[test]
    fn a_shared_grant_is_flagged_once_and_kept_at_the_earlier_deadline() {
        let grants = Grants::default();
        let t = Instant::now();
        let (first, shared) = grants.handed_out(&key(1), t + Duration::from_secs(10));
        assert!(!shared, "one handle is not shared");
        let (second, shared) = grants.handed_out(&key(1), t + Duration::from_secs(5));
        assert!(shared, "the second live handle of one grant is flagged");
        assert!(Arc::ptr_eq(&first, &second));
        assert_eq!(valid_until(&first), t + Duration::from_secs(5));
        let (third, shared) = grants.handed_out(&key(1), t + Duration::from_secs(20));
        assert!(!shared, "flagged once per grant");
        assert_eq!(valid_until(&third), t + Duration::from_secs(5));
        // Another grant (a new fence) is not shared with this one.
        let (other, shared) = grants.handed_out(&key(2), t);
        assert!(!shared && !Arc::ptr_eq(&other, &first));
        // Once every handle is gone, the grant is forgotten.
        for state in [first, second, third] {
            grants.dropped(&key(1), state);
        }
        let (fresh, shared) = grants.handed_out(&key(1), t + Duration::from_secs(1));
        assert!(!shared);
        assert_eq!(valid_until(&fresh), t + Duration::from_secs(1));
    }

    /// Whether a listener set up before `lowering` is woken by it.
    fn wakes(state: &SharedGrant, lowering: impl FnOnce()) -> bool {
        use std::future::Future;
        let signal = lowered(state);
        let mut listening = std::pin::pin!(signal.notified());
        listening.as_mut().enable();
        lowering();
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        listening.as_mut().poll(&mut cx).is_ready()
    }

    /// Every way the deadline comes down signals it (a keep-alive waits on
    /// nothing else between renewals); a move up, or a "lowering" to a
    /// later instant, does not.
    #[test]
    fn every_lowering_of_the_deadline_is_signalled() {
        let grants = Grants::default();
        let t = Instant::now();
        let secs = Duration::from_secs;
        let (state, _) = grants.handed_out(&key(1), t + secs(30));
        // A renewal sent with a shorter ttl.
        assert!(wakes(&state, || renewal_sent(&state, t + secs(20))));
        // Answered: the deadline settles up, which wakes nobody.
        assert!(!wakes(&state, || renewal_answered(
            &state,
            Renewal::Renewed
        )));
        assert_eq!(valid_until(&state), t + secs(20));
        // A renewal sent with a longer ttl lowers nothing.
        assert!(!wakes(&state, || renewal_sent(&state, t + secs(40))));
        renewal_answered(&state, Renewal::Renewed);
        // A twin handle handed out with an earlier deadline.
        assert!(wakes(&state, || {
            let _ = grants.handed_out(&key(1), t + secs(25));
        }));
        // A renewal answered lost.
        renewal_sent(&state, t + secs(60));
        assert!(wakes(&state, || renewal_answered(
            &state,
            Renewal::Lost { sent: t + secs(5) }
        )));
        // A release sent.
        assert!(wakes(&state, || ended(&state, t + secs(1))));
        assert_eq!(valid_until(&state), t + secs(1));
    }

    #[test]
    fn renewals_in_flight_together_settle_at_the_earliest_end_any_could_set() {
        let grants = Grants::default();
        let t = Instant::now();
        let secs = Duration::from_secs;
        let (state, _) = grants.handed_out(&key(1), t + secs(10));
        // A short renewal is sent: it may land at once, so the deadline
        // comes down now, before any answer.
        renewal_sent(&state, t + secs(2));
        assert_eq!(valid_until(&state), t + secs(2));
        // A long one is sent after it and answers first: the short one may
        // still commit last, so nothing goes up yet.
        renewal_sent(&state, t + secs(30));
        renewal_answered(&state, Renewal::Renewed);
        assert_eq!(valid_until(&state), t + secs(2));
        // Both answered: the earliest end either could have set.
        renewal_answered(&state, Renewal::Renewed);
        assert_eq!(valid_until(&state), t + secs(2));
        // Alone, a renewal moves it up to its own end.
        renewal_sent(&state, t + secs(20));
        renewal_answered(&state, Renewal::Renewed);
        assert_eq!(valid_until(&state), t + secs(20));
    }

    #[test]
    fn a_batch_settles_only_when_its_last_renewal_answered() {
        let grants = Grants::default();
        let t = Instant::now();
        let secs = Duration::from_secs;
        let (state, _) = grants.handed_out(&key(1), t + secs(10));
        renewal_sent(&state, t + secs(30));
        renewal_sent(&state, t + secs(20));
        renewal_answered(&state, Renewal::Renewed);
        assert_eq!(valid_until(&state), t + secs(10), "one still in flight");
        renewal_answered(&state, Renewal::Renewed);
        assert_eq!(
            valid_until(&state),
            t + secs(20),
            "the earliest end of the batch, the later-sent one's"
        );
    }

    #[test]
    fn an_unanswered_renewal_never_moves_the_deadline_up() {
        let grants = Grants::default();
        let t = Instant::now();
        let secs = Duration::from_secs;
        let (state, _) = grants.handed_out(&key(1), t + secs(5));
        renewal_sent(&state, t + secs(30));
        renewal_answered(&state, Renewal::Unknown);
        assert_eq!(valid_until(&state), t + secs(5));
        // A renewed one in the same batch does not help either.
        renewal_sent(&state, t + secs(30));
        renewal_sent(&state, t + secs(30));
        renewal_answered(&state, Renewal::Unknown);
        renewal_answered(&state, Renewal::Renewed);
        assert_eq!(valid_until(&state), t + secs(5));
        // An unanswered short one still brings it down.
        renewal_sent(&state, t + secs(1));
        renewal_answered(&state, Renewal::Unknown);
        assert_eq!(valid_until(&state), t + secs(1));
    }

    #[test]
    fn a_lost_renewal_or_a_release_caps_the_deadline_for_good() {
        let grants = Grants::default();
        let t = Instant::now();
        let secs = Duration::from_secs;
        let (state, _) = grants.handed_out(&key(1), t + secs(5));
        renewal_sent(&state, t + secs(30));
        renewal_answered(&state, Renewal::Lost { sent: t });
        assert_eq!(valid_until(&state), t);
        renewal_sent(&state, t + secs(30));
        renewal_answered(&state, Renewal::Renewed);
        assert_eq!(valid_until(&state), t, "renewed after lost");
        let (other, _) = grants.handed_out(&key(2), t + secs(5));
        ended(&other, t + secs(1));
        renewal_sent(&other, t + secs(30));
        renewal_answered(&other, Renewal::Renewed);
        assert_eq!(valid_until(&other), t + secs(1), "renewed after release");
    }

    #[test]
    fn a_release_is_remembered_only_while_an_acquire_sent_before_its_answer_is_in_flight() {
        let grants = Grants::default();
        let remembered = |grants: &Grants| grants.released.lock().unwrap().ended.len();
        grants.release_sent(&key(1), Instant::now());
        assert_eq!(
            remembered(&grants),
            1,
            "kept while the release is in flight"
        );
        grants.release_answered(&key(1));
        assert_eq!(remembered(&grants), 0, "no acquire in flight: forgotten");

        let early = grants.acquire_sent();
        grants.release_sent(&key(2), Instant::now());
        grants.release_answered(&key(2));
        let late = grants.acquire_sent();
        assert_eq!(
            remembered(&grants),
            1,
            "an acquire sent before it is in flight"
        );
        grants.acquire_done(early);
        assert_eq!(
            remembered(&grants),
            0,
            "only acquires sent after it are left"
        );
        grants.acquire_done(late);

        // In the other order: the late acquire done first, the early one
        // (sent before the release answered) still holds it.
        let early = grants.acquire_sent();
        grants.release_sent(&key(3), Instant::now());
        grants.release_answered(&key(3));
        let late = grants.acquire_sent();
        grants.acquire_done(late);
        assert_eq!(remembered(&grants), 1, "the early acquire is in flight");
        grants.acquire_done(early);
        assert_eq!(remembered(&grants), 0);
    }

    #[test]
    fn a_grant_is_forgotten_when_its_last_handle_goes_and_kept_while_one_lives() {
        let grants = Grants::default();
        let t = Instant::now();
        let (first, _) = grants.handed_out(&key(1), t);
        let (second, _) = grants.handed_out(&key(1), t);
        grants.dropped(&key(1), first);
        assert_eq!(grants.live.lock().unwrap().len(), 1, "one handle left");
        grants.dropped(&key(1), second);
        assert_eq!(grants.live.lock().unwrap().len(), 0, "no handle left");
        // A live grant survives the sweeps of dead entries around it.
        let (kept, _) = grants.handed_out(&key(u64::MAX), t);
        for fence in 0..1000 {
            let (state, _) = grants.handed_out(&key(fence), t);
            let renewal = state.clone();
            grants.dropped(&key(fence), state);
            drop(renewal);
        }
        let (again, shared) = grants.handed_out(&key(u64::MAX), t);
        assert!(
            shared && Arc::ptr_eq(&kept, &again),
            "the live grant was swept"
        );
    }

    #[test]
    fn grants_whose_last_handle_left_during_a_renewal_are_swept() {
        let grants = Grants::default();
        let t = Instant::now();
        for fence in 0..1000 {
            let (state, _) = grants.handed_out(&key(fence), t);
            // A renewal task still holds the state when the handle goes.
            let renewal = state.clone();
            grants.dropped(&key(fence), state);
            drop(renewal);
        }
        let left = grants.live.lock().unwrap().len();
        assert!(left <= 128, "{left} dead entries kept");
    }
}
