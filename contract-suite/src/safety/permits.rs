//! Semaphores under contention: a race of independent stores for the
//! permits of one name, and the checker of its record.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use alkstore_core::Store;

use super::history::{Interval, Violation};
use super::workload::{Race, Racer, hold_then_release, racers, racing};

/// One permit's grant as its holder saw it, and its slot.
#[derive(Debug, Clone)]
pub struct PermitInterval {
    /// The grant's interval, as a lock's is recorded.
    pub interval: Interval,
    /// The permit's slot.
    pub slot: u32,
    /// What its release answered (`true`: its own live permit was there).
    pub released: bool,
}

/// Checks a semaphore's history of `permits` permits for the rules a client
/// can see from outside:
///
/// - at no instant more than `permits` non-empty intervals (two of one
///   grant, a same-owner re-acquire's handles, count once);
/// - a fence names one grant: one owner, one slot;
/// - the non-empty intervals of one slot never overlap;
/// - **commit order**: a grant requested after another came back carries a
///   higher fence; and so does a grant of a slot that came back (non-empty)
///   after the `release` of an earlier grant of that slot returned.
///
/// Unlike a lock's, grants of a semaphore that came back in some order may
/// carry fences in another: two grants in flight at once commit in either
/// order.
pub fn check_permits(history: &[PermitInterval], permits: u32) -> Result<(), Violation> {
    let live: Vec<&PermitInterval> = history
        .iter()
        .filter(|p| p.interval.start < p.interval.end)
        .collect();
    // Ends sort before starts at one instant: the intervals are half-open.
    // Two handles of one grant (a same-owner re-acquire) hold one permit.
    let mut events: Vec<(Instant, bool, &PermitInterval)> = live
        .iter()
        .flat_map(|p| [(p.interval.start, true, *p), (p.interval.end, false, *p)])
        .collect();
    events.sort_by_key(|(at, starts, _)| (*at, *starts));
    let mut holding: HashMap<(&str, u64, u32), usize> = HashMap::new();
    for (_, starts, p) in events {
        let grant = (p.interval.owner.as_str(), p.interval.fence, p.slot);
        if starts {
            *holding.entry(grant).or_default() += 1;
            if holding.len() > permits as usize {
                let first = holding.keys().map(|g| g.1).min().unwrap_or(0);
                return Err(Violation::Overlap {
                    first,
                    second: p.interval.fence,
                });
            }
        } else if let Some(handles) = holding.get_mut(&grant) {
            *handles -= 1;
            if *handles == 0 {
                holding.remove(&grant);
            }
        }
    }
    // A fence names one grant: never two owners, never two slots.
    let mut owners: HashMap<u64, (&str, u32)> = HashMap::new();
    for p in history {
        let held = (p.interval.owner.as_str(), p.slot);
        if *owners.entry(p.interval.fence).or_insert(held) != held {
            return Err(Violation::FenceOrder {
                earlier: p.interval.fence,
                later: p.interval.fence,
            });
        }
    }
    let same_grant = |a: &Interval, b: &Interval| a.fence == b.fence && a.owner == b.owner;
    for later in history {
        let l = &later.interval;
        for earlier in history {
            let e = &earlier.interval;
            if same_grant(e, l) || l.fence > e.fence {
                continue;
            }
            let same_slot = later.slot == earlier.slot;
            let overlap = same_slot
                && l.start < l.end
                && e.start < e.end
                && l.start < e.end
                && e.start < l.end;
            if overlap {
                // `later` has the lower fence: name it first.
                return Err(Violation::Overlap {
                    first: l.fence,
                    second: e.fence,
                });
            }
            let after_release =
                same_slot && l.start < l.end && e.released.is_some_and(|r| l.start > r);
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

/// Races tasks on independent stores for the `permits` permits of one
/// name, as [`race`](super::workload::race) races for a lock: each task
/// loops `try_acquire_permit` with a long lease (every third waits with
/// `acquire_permit` instead), holds its permit a moment, and releases it.
/// Answers each grant's interval, slot, and what its release answered.
pub async fn race_permits(
    stores: &[Arc<dyn Store>],
    name: &str,
    permits: u32,
    race: Race,
    seed: u64,
) -> Vec<PermitInterval> {
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
                let requested = Instant::now();
                let got = if waits {
                    let wait = Duration::from_millis(50);
                    store
                        .acquire_permit(&name, permits, &owner, ttl, wait)
                        .await
                } else {
                    store.try_acquire_permit(&name, permits, &owner, ttl).await
                };
                let Some(permit) = got.expect("acquire a permit") else {
                    tokio::time::sleep(Duration::from_micros(rng.below(500))).await;
                    continue;
                };
                let start = Instant::now();
                let slot = permit
                    .permit()
                    .expect("a permit's handle tells its slot")
                    .slot;
                // Held up to 2 ms, times the engine's lease clock's scale:
                // on a slower engine (etcd: three round trips a grant) a
                // 2 ms hold ended before the next grant landed, so the
                // permits were seldom all held at once, and a grant of one
                // permit too many went unseen.
                let hold = 2000 * u64::from(crate::clock::clock().scale());
                let (interval, released) =
                    hold_then_release(permit, requested, start, &mut rng, hold).await;
                history.lock().unwrap().push(PermitInterval {
                    interval,
                    slot,
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

    fn at(base: Instant, from: u64, to: u64, fence: u64, slot: u32) -> PermitInterval {
        let ms = |n| base + Duration::from_millis(n);
        PermitInterval {
            interval: Interval {
                owner: format!("o{fence}"),
                fence,
                requested: ms(from),
                start: ms(from),
                end: ms(to),
                released: Some(ms(to)),
            },
            slot,
            released: true,
        }
    }

    #[test]
    fn accepts_permits_holders_and_finds_one_more() {
        let t = Instant::now();
        let two = [at(t, 0, 10, 1, 0), at(t, 5, 15, 2, 1), at(t, 10, 20, 3, 0)];
        assert_eq!(check_permits(&two, 2), Ok(()));
        assert_eq!(
            check_permits(&two[..2], 1),
            Err(Violation::Overlap {
                first: 1,
                second: 2
            })
        );
        let three = [at(t, 0, 10, 1, 0), at(t, 2, 15, 2, 1), at(t, 4, 20, 3, 2)];
        assert!(check_permits(&three, 3).is_ok());
        assert!(check_permits(&three, 2).is_err());
    }

    #[test]
    fn one_fence_is_one_grant() {
        let t = Instant::now();
        // Two owners with one fence, on two slots, at once.
        let mut twice = [at(t, 0, 10, 7, 0), at(t, 2, 12, 7, 1)];
        twice[1].interval.owner = "other".into();
        assert!(check_permits(&twice, 3).is_err());
        // Two handles of one grant (same owner, fence and slot) hold one
        // permit, not two.
        let handles = [at(t, 0, 10, 7, 0), at(t, 2, 12, 7, 0), at(t, 3, 9, 8, 1)];
        assert_eq!(check_permits(&handles, 2), Ok(()));
    }

    #[test]
    fn finds_two_holders_of_one_slot() {
        let t = Instant::now();
        let one_slot = [at(t, 0, 10, 1, 0), at(t, 5, 15, 2, 0)];
        assert_eq!(
            check_permits(&one_slot, 3),
            Err(Violation::Overlap {
                first: 1,
                second: 2
            })
        );
    }

    #[test]
    fn commit_order_binds_requests_after_a_grant_and_a_slot_after_its_release() {
        let t = Instant::now();
        // Requested after fence 5 came back, granted 4: out of order.
        let after_grant = [at(t, 0, 10, 5, 0), at(t, 11, 20, 4, 1)];
        assert!(matches!(
            check_permits(&after_grant, 2),
            Err(Violation::FenceOrder {
                earlier: 5,
                later: 4
            })
        ));
        // Two grants in flight at once may come back in either order.
        let mut in_flight = [at(t, 0, 10, 5, 0), at(t, 4, 20, 4, 1)];
        in_flight[1].interval.requested = t;
        assert_eq!(check_permits(&in_flight, 2), Ok(()));
        // Slot 0 again after its release, with a lower fence: out of order.
        let mut slot_again = [at(t, 0, 10, 5, 0), at(t, 12, 20, 4, 0)];
        slot_again[1].interval.requested = t;
        assert!(check_permits(&slot_again, 2).is_err());
    }
}
