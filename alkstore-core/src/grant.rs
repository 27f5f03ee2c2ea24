//! What a store knows of each grant it holds handles to: one
//! `valid_until` per grant, shared by every handle of it, moved only by what
//! certainly holds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use crate::engine::GrantKey;

/// The shared state of one grant's handles.
#[derive(Debug)]
pub(crate) struct GrantState {
    /// Before this instant the lease is certainly valid.
    valid_until: Instant,
    /// Renewals sent so far; the latest one alone may move `valid_until` up.
    sent: u64,
    /// Whether sharing this grant between handles was already warned of.
    warned: bool,
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

/// A renewal is about to be sent: its ticket.
pub(crate) fn renewal_sent(state: &SharedGrant) -> u64 {
    let mut state = lock(state);
    state.sent += 1;
    state.sent
}

/// What a renewal answered, and what it means for `valid_until`:
/// - renewed, and no later renewal was sent meanwhile: the new window;
/// - renewed, but a later renewal is in flight: nothing (that one may
///   shorten the lease, and its answer decides);
/// - lost: the lease ended no later than when the request was sent;
/// - unknown (an error): the renewal may have landed with its `ttl`, so the
///   deadline can only come down to what that renewal would give.
pub(crate) fn renewal_answered(state: &SharedGrant, ticket: u64, outcome: Renewal) {
    let mut state = lock(state);
    match outcome {
        Renewal::Renewed { until } if ticket == state.sent => state.valid_until = until,
        Renewal::Renewed { .. } => {}
        Renewal::Lost { sent } => state.valid_until = state.valid_until.min(sent),
        Renewal::Unknown { until } => state.valid_until = state.valid_until.min(until),
    }
}

/// The grant ends for this store at `at` (a release was sent): no
/// handle of it may count on it after that.
pub(crate) fn ended(state: &SharedGrant, at: Instant) {
    let mut state = lock(state);
    state.valid_until = state.valid_until.min(at);
}

/// How one renewal ended.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Renewal {
    /// Renewed; the lease is certainly valid until `until`.
    Renewed { until: Instant },
    /// Not renewed: the lease is gone.
    Lost { sent: Instant },
    /// No answer; had it landed, the lease would be valid until `until`.
    Unknown { until: Instant },
}

/// The grants a store holds live handles to, by grant (one map per store:
/// stores, even in one process, learn of each other only through storage).
#[derive(Debug, Default)]
pub(crate) struct Grants {
    live: Mutex<HashMap<GrantKey, Weak<Mutex<GrantState>>>>,
}

impl Grants {
    /// The state for a grant just handed out, observed valid until `until`.
    /// When another handle to the same grant is live in this store, both
    /// share one state, at the earlier deadline; the second value is true
    /// the first time that happens for this grant (to warn once).
    pub(crate) fn handed_out(&self, key: &GrantKey, until: Instant) -> (SharedGrant, bool) {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(state) = live.get(key).and_then(Weak::upgrade) {
            let first_time = {
                let mut shared = lock(&state);
                shared.valid_until = shared.valid_until.min(until);
                !std::mem::replace(&mut shared.warned, true)
            };
            return (state, first_time);
        }
        let state = Arc::new(Mutex::new(GrantState {
            valid_until: until,
            sent: 0,
            warned: false,
        }));
        live.insert(key.clone(), Arc::downgrade(&state));
        (state, false)
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

    #[test]
    fn only_the_latest_sent_renewal_moves_the_deadline_up() {
        let grants = Grants::default();
        let t = Instant::now();
        let (state, _) = grants.handed_out(&key(1), t + Duration::from_secs(1));
        let long = renewal_sent(&state);
        let short = renewal_sent(&state);
        // The later-sent, shorter renewal answers first; the earlier, longer
        // one answers last and must not move the deadline past it.
        renewal_answered(
            &state,
            short,
            Renewal::Renewed {
                until: t + Duration::from_secs(2),
            },
        );
        renewal_answered(
            &state,
            long,
            Renewal::Renewed {
                until: t + Duration::from_secs(30),
            },
        );
        assert_eq!(valid_until(&state), t + Duration::from_secs(2));
        // An unanswered renewal brings it down to what it would give.
        let unknown = renewal_sent(&state);
        renewal_answered(
            &state,
            unknown,
            Renewal::Unknown {
                until: t + Duration::from_millis(1500),
            },
        );
        assert_eq!(valid_until(&state), t + Duration::from_millis(1500));
        // A lost one ends it at its sending.
        let lost = renewal_sent(&state);
        renewal_answered(&state, lost, Renewal::Lost { sent: t });
        assert_eq!(valid_until(&state), t);
    }
}
