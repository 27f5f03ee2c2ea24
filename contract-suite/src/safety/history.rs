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
    /// When the grant came back to the holder.
    pub start: Instant,
    /// When the holder stopped counting on it.
    pub end: Instant,
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

/// Checks a history: no two non-empty intervals overlap, and fences strictly
/// increase in grant order — except that one owner may hold the same grant
/// (same fence) again: a same-owner re-acquire of a row its failed release
/// left live. Empty intervals (a grant whose answer came back after its lease
/// ended) are ignored: their holder never counted on them.
pub fn check(history: &[Interval]) -> Result<(), Violation> {
    let mut intervals: Vec<&Interval> = history.iter().filter(|i| i.start < i.end).collect();
    intervals.sort_by_key(|i| i.start);
    let mut latest_end: Option<&Interval> = None;
    for pair in intervals.windows(2) {
        let same_grant = pair[1].fence == pair[0].fence && pair[1].owner == pair[0].owner;
        if pair[1].fence < pair[0].fence || (pair[1].fence == pair[0].fence && !same_grant) {
            return Err(Violation::FenceOrder {
                earlier: pair[0].fence,
                later: pair[1].fence,
            });
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(base: Instant, from: u64, to: u64, fence: u64) -> Interval {
        Interval {
            owner: format!("o{fence}"),
            fence,
            start: base + Duration::from_millis(from),
            end: base + Duration::from_millis(to),
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
}
