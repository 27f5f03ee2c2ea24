//! Reader-writer locks under contention: a race of independent stores for
//! one name, readers and writers mixed, and the checker of its record.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use alkstore_core::{Access, Store};

use super::history::{Interval, Violation};
use super::workload::{Race, Racer, hold_then_release, racers, racing};

/// One reader-writer grant as its holder saw it.
#[derive(Debug, Clone)]
pub struct RwInterval {
    /// The grant's interval, as a lock's is recorded.
    pub interval: Interval,
    /// The writer's grant (`false`: a reader's).
    pub write: bool,
    /// What its release answered (`true`: its own live grant was there).
    pub released: bool,
}

/// Checks a reader-writer lock's history for the rules a client can see
/// from outside:
///
/// - a writer's non-empty interval overlaps no other grant's (readers'
///   intervals may overlap each other);
/// - a fence names one grant, and each entry is a grant of its own (the
///   race releases every grant before it asks again): a fence seen twice
///   was handed out twice, or a released grant came back;
/// - **commit order**, wherever a writer is one of the two: a grant
///   requested after another came back carries a higher fence, and so does
///   a grant that came back (non-empty) after the other's `release`
///   returned. (A writer's fence is above every earlier grant's, a reader's
///   above every earlier writer's; readers among themselves are not bound.)
pub fn check_rw(history: &[RwInterval]) -> Result<(), Violation> {
    let mut fences: HashSet<u64> = HashSet::new();
    for g in history {
        if !fences.insert(g.interval.fence) {
            return Err(Violation::FenceOrder {
                earlier: g.interval.fence,
                later: g.interval.fence,
            });
        }
    }
    let non_empty = |i: &Interval| i.start < i.end;
    for (li, later) in history.iter().enumerate() {
        let l = &later.interval;
        for (ei, earlier) in history.iter().enumerate() {
            let e = &earlier.interval;
            if li == ei || !(later.write || earlier.write) {
                continue;
            }
            let overlap = non_empty(l) && non_empty(e) && l.start < e.end && e.start < l.end;
            if overlap {
                let (first, second) = (e.fence.min(l.fence), e.fence.max(l.fence));
                return Err(Violation::Overlap { first, second });
            }
            if l.fence > e.fence {
                continue;
            }
            let after_release = non_empty(l) && e.released.is_some_and(|r| l.start > r);
            if l.requested > e.start || after_release {
                return Err(Violation::FenceOrder {
                    earlier: e.fence,
                    later: l.fence,
                });
            }
        }
    }
    Ok(())
}

/// Races tasks on independent stores for the reader-writer lock `name`:
/// each task loops, asking to write one time in `one_write_in` and to read
/// otherwise, with a long lease; every third task waits up to 2 s where
/// the others try once (long enough for a writer's intent to hold the
/// readers back on an engine whose lock waits count whole seconds, as
/// MariaDB's do). A grant is held a moment and released.
/// Answers each grant's interval, mode, and what its release answered.
pub async fn race_rw(
    stores: &[Arc<dyn Store>],
    name: &str,
    one_write_in: u64,
    race: Race,
    seed: u64,
) -> Vec<RwInterval> {
    let ttl = Duration::from_secs(30);
    let history = Arc::new(Mutex::new(Vec::new()));
    let ends = race.ends();
    let mut tasks = Vec::new();
    for racer in racers(stores, race, seed) {
        let (name, history) = (name.to_owned(), history.clone());
        let Racer {
            store,
            owner,
            waits,
            mut rng,
        } = racer;
        tasks.push(tokio::spawn(async move {
            let grants = || history.lock().unwrap().len();
            while racing(ends, grants()) {
                let write = rng.below(one_write_in) == 0;
                let requested = Instant::now();
                let wait = Duration::from_secs(2);
                let got = match (write, waits) {
                    (true, true) => store.write_lock(&name, &owner, ttl, wait).await,
                    (true, false) => store.try_write_lock(&name, &owner, ttl).await,
                    (false, true) => store.read_lock(&name, &owner, ttl, wait).await,
                    (false, false) => store.try_read_lock(&name, &owner, ttl).await,
                };
                let Some(grant) = got.expect("acquire a reader-writer lock") else {
                    tokio::time::sleep(Duration::from_micros(rng.below(500))).await;
                    continue;
                };
                let start = Instant::now();
                let access = grant
                    .access()
                    .expect("a reader-writer grant tells its access");
                assert_eq!(
                    matches!(access, Access::Write),
                    write,
                    "rule: a grant holds the access it was asked for; asked write={write}, \
                     got {access}"
                );
                let hold = if write { 1000 } else { 3000 };
                let (interval, released) =
                    hold_then_release(grant, requested, start, &mut rng, hold).await;
                history.lock().unwrap().push(RwInterval {
                    interval,
                    write,
                    released,
                });
            }
        }));
    }
    for task in tasks {
        task.await.expect("a racing task panicked");
    }
    std::mem::take(&mut *history.lock().unwrap())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, from: u64, to: u64, fence: u64, write: bool) -> RwInterval {
        let ms = |n| base + Duration::from_millis(n);
        RwInterval {
            interval: Interval {
                owner: format!("o{fence}"),
                fence,
                requested: ms(from),
                start: ms(from),
                end: ms(to),
                released: Some(ms(to)),
            },
            write,
            released: true,
        }
    }

    #[test]
    fn readers_share_and_a_writer_is_alone() {
        let t = Instant::now();
        let readers = [at(t, 0, 10, 1, false), at(t, 5, 15, 2, false)];
        assert_eq!(check_rw(&readers), Ok(()));
        let then_a_writer = [
            readers[0].clone(),
            readers[1].clone(),
            at(t, 16, 20, 3, true),
        ];
        assert_eq!(check_rw(&then_a_writer), Ok(()));
        let beside = [at(t, 0, 10, 1, false), at(t, 5, 15, 2, true)];
        assert_eq!(
            check_rw(&beside),
            Err(Violation::Overlap {
                first: 1,
                second: 2
            })
        );
        let two_writers = [at(t, 0, 10, 1, true), at(t, 5, 15, 2, true)];
        assert!(check_rw(&two_writers).is_err());
    }

    #[test]
    fn fences_rise_past_every_writer() {
        let t = Instant::now();
        // A reader after a writer's release, with the writer's fence.
        let mut reader_at_writers = [at(t, 0, 10, 4, true), at(t, 12, 20, 4, false)];
        reader_at_writers[1].interval.owner = "r".into();
        assert!(check_rw(&reader_at_writers).is_err());
        // One owner's grant handed out again after its release.
        let again = [at(t, 0, 10, 4, false), at(t, 12, 20, 4, false)];
        assert!(check_rw(&again).is_err());
        let reader_below = [at(t, 0, 10, 4, true), at(t, 12, 20, 3, false)];
        assert_eq!(
            check_rw(&reader_below),
            Err(Violation::FenceOrder {
                earlier: 4,
                later: 3
            })
        );
        // Readers among themselves are not bound to commit order.
        let readers = [at(t, 0, 10, 4, false), at(t, 12, 20, 3, false)];
        assert_eq!(check_rw(&readers), Ok(()));
    }
}
