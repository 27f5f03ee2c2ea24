//! A waiting acquire between its attempts: the deadline, the back-off,
//! the one-time start of the engine's wake-ups, and the wake-up or nap
//! before the next attempt. The attempts themselves are the store's
//! (`EngineStore::lock`).

use std::pin::Pin;
use std::time::{Duration, Instant};

use tokio::sync::futures::Notified;

use crate::engine::Engine;
use crate::metrics::{self, HANDOFF_SECONDS};

/// The first nap after a refused attempt.
const FIRST_NAP: Duration = Duration::from_millis(2);

/// Doubling naps, capped by the engine's poll ceiling, by the time left to
/// wait, and by the holder's remaining lease (plus a millisecond, so that the
/// attempt lands after the expiry rather than just before it).
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
    ceiling: Duration,
}

impl Backoff {
    /// A back-off that never naps longer than `ceiling`.
    pub fn new(ceiling: Duration) -> Self {
        Backoff {
            next: FIRST_NAP.min(ceiling),
            ceiling,
        }
    }

    /// How long to nap before the next attempt.
    pub fn next_nap(
        &mut self,
        holder_expires_in: Option<Duration>,
        wait_left: Option<Duration>,
    ) -> Duration {
        let mut nap = self.next;
        self.next = (self.next * 2).min(self.ceiling);
        if let Some(expires_in) = holder_expires_in {
            nap = nap.min(expires_in + Duration::from_millis(1));
        }
        if let Some(left) = wait_left {
            nap = nap.min(left);
        }
        nap
    }
}

/// The state of one waiting acquire between attempts.
pub(crate) struct Waiting<'e, E: Engine> {
    engine: &'e E,
    /// When the wait ends; `None` when the clock cannot hold it (no end).
    deadline: Option<Instant>,
    backoff: Backoff,
    /// The engine's wake-ups were started (once, after the first refusal).
    prepared: bool,
    /// When a release last woke this waiter, for the handoff time.
    woken: Option<Instant>,
}

/// What is left of a wait.
enum Left {
    Over,
    For(Duration),
    Unbounded,
}

impl<'e, E: Engine> Waiting<'e, E> {
    /// A wait of `wait` on `engine`, from now.
    pub(crate) fn new(engine: &'e E, wait: Duration) -> Self {
        Waiting {
            engine,
            // A deadline the clock cannot hold means no deadline.
            deadline: Instant::now().checked_add(wait),
            backoff: Backoff::new(engine.poll_ceiling()),
            prepared: false,
            woken: None,
        }
    }

    /// When every step of an attempt must be done by.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// The wait left (zero when it is over); `None` when it has no end.
    pub(crate) fn left_for(&self) -> Option<Duration> {
        match self.left() {
            Left::Over => Some(Duration::ZERO),
            Left::For(left) => Some(left),
            Left::Unbounded => None,
        }
    }

    fn left(&self) -> Left {
        match self.deadline {
            None => Left::Unbounded,
            Some(deadline) => match deadline.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => Left::For(left),
                _ => Left::Over,
            },
        }
    }

    /// After a grant: how long it took from the release that woke this
    /// waiter, when one did; whether one did (not its poll).
    pub(crate) fn granted(&self) -> bool {
        if let Some(woken) = self.woken {
            let engine = self.engine.name();
            metrics::observe(HANDOFF_SECONDS, &[("engine", engine)], woken.elapsed());
        }
        self.woken.is_some()
    }

    /// After a refused attempt: waits for a release (`released`, enabled
    /// before the attempt, so that one landing while it ran still counts)
    /// or for the next nap, whichever comes first. `false` when the wait is
    /// over: no attempt follows. With `attempt_by` (a waiting writer's, to
    /// renew its intent before it lapses), the next attempt starts no later
    /// than then: the nap, and the one-time start of wake-ups, end by it.
    pub(crate) async fn after_refusal(
        &mut self,
        released: Pin<&mut Notified<'_>>,
        holder_expires_in: Option<Duration>,
        attempt_by: Option<Instant>,
        next_in_line: bool,
    ) -> bool {
        let until_due = || attempt_by.map(|by| by.saturating_duration_since(Instant::now()));
        let mut left = self.left();
        if !self.prepared {
            self.prepared = true;
            if let Left::Over = left {
                return false;
            }
            self.prepare(&left, until_due()).await;
            left = self.left();
        }
        let wait_left = match left {
            Left::Over => return false,
            Left::For(left) => Some(left),
            Left::Unbounded => None,
        };
        let mut nap = self.backoff.next_nap(holder_expires_in, wait_left);
        if next_in_line {
            nap = nap.min(self.engine.turn_poll_ceiling());
        }
        if let Some(due) = until_due() {
            nap = nap.min(due);
        }
        tokio::select! {
            // Woken by a release; if another contender wins it, keep the
            // back-off growing: the next release wakes us again.
            _ = released => self.woken = Some(Instant::now()),
            _ = tokio::time::sleep(nap) => self.woken = None,
        }
        true
    }

    /// Starts the engine's wake-ups, bounded by the wait left (and by
    /// `due`, when the next attempt is due sooner): a listener that cannot
    /// connect in time must not hold the caller past either. A failure only
    /// means polling.
    async fn prepare(&self, left: &Left, due: Option<Duration>) {
        let prepare = self.engine.prepare_wait();
        let bound = match (left, due) {
            (Left::For(left), due) => Some(due.map_or(*left, |due| due.min(*left))),
            (_, due) => due,
        };
        let outcome = match bound {
            Some(bound) => tokio::time::timeout(bound, prepare).await.ok(),
            None => Some(prepare.await),
        };
        match outcome {
            Some(Ok(())) => {}
            Some(Err(error)) => {
                tracing::warn!(%error, "release notifications unavailable; polling");
            }
            None => tracing::debug!("release notifications not ready within the wait"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_ceiling_and_respects_the_bounds() {
        let mut b = Backoff::new(Duration::from_millis(10));
        let naps: Vec<_> = (0..5).map(|_| b.next_nap(None, None).as_millis()).collect();
        assert_eq!(naps, [2, 4, 8, 10, 10]);
        assert_eq!(
            b.next_nap(Some(Duration::from_millis(3)), None),
            Duration::from_millis(4)
        );
        assert_eq!(
            b.next_nap(None, Some(Duration::from_millis(1))),
            Duration::from_millis(1)
        );
    }
}
