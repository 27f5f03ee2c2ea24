//! Recording who held a lock when, and checking the record.

use std::time::Instant;

/// One grant as its holder saw it: valid from `start` (the grant came back)
/// to `end` (the earlier of its `valid_until` and the start of its release).
#[derive(Debug, Clone)]
pub struct Interval {
    /// Who held it.
    pub owner: String,
    /// Its fence.
    pub fence: u64,
    /// When the acquire call that granted it was made.
    pub requested: Instant,
    /// When the grant came back to the holder.
    pub start: Instant,
    /// When the holder stopped counting on it.
    pub end: Instant,
    /// When its `release` returned (whatever it answered), if it was released.
    pub released: Option<Instant>,
}

/// What the checker found wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// Two holders at once.
    Overlap {
        /// Fence of the earlier grant.
        first: u64,
        /// Fence of the grant that began before it ended.
        second: u64,
    },
    /// A later grant with a fence not above an earlier one's.
    FenceOrder {
        /// Fence of the earlier grant.
        earlier: u64,
        /// Fence of the later grant.
        later: u64,
    },
}

/// True when `a` and `b` are one grant (a same-owner re-acquire).
fn same_grant(a: &Interval, b: &Interval) -> bool {
    a.fence == b.fence && a.owner == b.owner
}

/// Checks a history for the rules a client can see from outside:
///
/// - no two non-empty intervals overlap;
/// - fences strictly increase in the order grants came back (non-empty
///   intervals only);
/// - **commit order**: a grant requested after another grant came back
///   committed after it, so carries a higher fence; and a grant that came
///   back (with a non-empty interval) after another grant's `release`
///   returned carries a higher fence than that grant.
///
/// One owner may hold the same grant (same fence) again: a same-owner
/// re-acquire. Empty intervals (a grant whose answer came back after its
/// lease ended) are ignored by the first two rules and by the release rule:
/// their holder never counted on them, and their commit may precede grants
/// that came back sooner.
pub fn check(history: &[Interval]) -> Result<(), Violation> {
    let mut intervals: Vec<&Interval> = history.iter().filter(|i| i.start < i.end).collect();
    intervals.sort_by_key(|i| i.start);
    for pair in intervals.windows(2) {
        if pair[1].fence < pair[0].fence
            || (pair[1].fence == pair[0].fence && !same_grant(pair[0], pair[1]))
        {
            return Err(Violation::FenceOrder {
                earlier: pair[0].fence,
                later: pair[1].fence,
            });
        }
    }
    check_commit_order(history, &intervals)?;
    let mut latest_end: Option<&Interval> = None;
    for interval in intervals {
        if let Some(previous) = latest_end {
            if interval.start < previous.end {
                return Err(Violation::Overlap {
                    first: previous.fence,
                    second: interval.fence,
                });
            }
        }
        if latest_end.is_none_or(|p| interval.end > p.end) {
            latest_end = Some(interval);
        }
    }
    Ok(())
}

/// The commit-order rules of [`check`]; `live` are the non-empty intervals.
fn check_commit_order(history: &[Interval], live: &[&Interval]) -> Result<(), Violation> {
    let out_of_order = |earlier: &Interval, later: &Interval| {
        !same_grant(earlier, later) && later.fence <= earlier.fence
    };
    for later in history {
        for earlier in history {
            if later.requested > earlier.start && out_of_order(earlier, later) {
                return Err(Violation::FenceOrder {
                    earlier: earlier.fence,
                    later: later.fence,
                });
            }
        }
    }
    for later in live {
        for earlier in history {
            let after_release = earlier.released.is_some_and(|r| later.start > r);
            if after_release && out_of_order(earlier, later) {
                return Err(Violation::FenceOrder {
                    earlier: earlier.fence,
                    later: later.fence,
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(base: Instant, from: u64, to: u64, fence: u64) -> Interval {
        Interval {
            owner: format!("o{fence}"),
            fence,
            requested: base + Duration::from_millis(from),
            start: base + Duration::from_millis(from),
            end: base + Duration::from_millis(to),
            released: Some(base + Duration::from_millis(to)),
        }
    }

    #[test]
    fn accepts_a_clean_history_and_finds_each_violation() {
        let t = Instant::now();
        assert_eq!(
            check(&[at(t, 0, 10, 1), at(t, 10, 20, 2), at(t, 25, 30, 5)]),
            Ok(())
        );
        assert_eq!(
            check(&[at(t, 0, 10, 1), at(t, 5, 20, 2)]),
            Err(Violation::Overlap {
                first: 1,
                second: 2
            })
        );
        // A long interval overlapping a later, non-adjacent one.
        assert_eq!(
            check(&[at(t, 0, 100, 1), at(t, 100, 101, 2), at(t, 50, 60, 3)]),
            Err(Violation::FenceOrder {
                earlier: 3,
                later: 2
            })
        );
        assert_eq!(
            check(&[at(t, 0, 100, 1), at(t, 50, 60, 2)]),
            Err(Violation::Overlap {
                first: 1,
                second: 2
            })
        );
        assert_eq!(
            check(&[at(t, 0, 10, 3), at(t, 10, 20, 2)]),
            Err(Violation::FenceOrder {
                earlier: 3,
                later: 2
            })
        );
        // Empty intervals do not count.
        assert_eq!(
            check(&[at(t, 0, 10, 1), at(t, 5, 5, 2), at(t, 10, 20, 3)]),
            Ok(())
        );
    }

    #[test]
    fn a_grant_after_a_release_with_a_lower_fence_is_found() {
        let t = Instant::now();
        // The slow contender asked first (fence 1 drawn early), the fast one
        // was granted 2 and released; the slow one's grant came back after.
        let fast = at(t, 10, 20, 2);
        let slow = Interval {
            requested: t,
            ..at(t, 30, 40, 1)
        };
        assert_eq!(
            check(&[fast.clone(), slow.clone()]),
            Err(Violation::FenceOrder {
                earlier: 2,
                later: 1
            })
        );
        // The same with the slow grant's interval empty is still found when
        // it was requested after the other came back.
        let empty_late = Interval {
            requested: t + Duration::from_millis(15),
            end: t + Duration::from_millis(30),
            ..at(t, 30, 40, 1)
        };
        assert_eq!(
            check(&[fast.clone(), empty_late]),
            Err(Violation::FenceOrder {
                earlier: 2,
                later: 1
            })
        );
        // A grant requested before another came back, empty, may carry a
        // lower fence (its commit can precede the other's).
        let empty_early = Interval {
            requested: t,
            end: t + Duration::from_millis(30),
            released: None,
            ..at(t, 30, 40, 1)
        };
        assert_eq!(check(&[fast, empty_early]), Ok(()));
    }

    #[test]
    fn a_same_owner_reacquire_is_not_a_violation() {
        let t = Instant::now();
        let first = Interval {
            released: None,
            ..at(t, 0, 10, 4)
        };
        let again = Interval {
            released: None,
            ..at(t, 12, 20, 4)
        };
        assert_eq!(check(&[first, again]), Ok(()));
    }
}
