//! What this process knows of each grant it holds handles to: one
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

/// The grants this process holds handles to, by grant.
#[derive(Debug, Default)]
pub(crate) struct Grants {
    live: Mutex<HashMap<GrantKey, Weak<Mutex<GrantState>>>>,
}

impl Grants {
    /// The state for a grant just handed out, observed valid until `until`.
    /// When another handle to the same grant is live in this process, both
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
