//! The back-off of a waiting acquire between attempts.

use std::time::Duration;

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
