//! Safety under contention, cancellation, random operation sequences and bad input.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use alkstore_core::{Error, LeaseMillis, Lock, Store, validate_name, validate_owner};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use crate::safety::Rng;
use crate::safety::history::check;
use crate::safety::workload::{Workload, contend};
use crate::support::{LANDING, granted, lapsed_after_drops};

const LONG: Duration = Duration::from_secs(30);

/// 100 tasks on one name, short TTLs, random holds, some holders pausing past
/// their TTL: no two validity intervals overlap, fences rise in grant order,
/// and the unprotected counter loses no update.
pub async fn safety_many_holders_one_name(store: Arc<dyn Store>) {
    let workload = Workload {
        tasks: 100,
        cycles: 3,
        ttl: Duration::from_millis(150),
        pause_one_in: 20,
    };
    let seed = Rng::from_clock("safety_many_holders_one_name").next_u64();
    let outcome = contend(store, "contended", workload, seed).await;
    assert_eq!(
        outcome.history.len(),
        300,
        "rule: lock waits until granted: every cycle of the 100 tasks gets its grant (seed {seed})"
    );
    assert_eq!(
        check(&outcome.history),
        Ok(()),
        "rule: no two validity intervals overlap and fences rise in grant order; seed {seed}"
    );
    assert_eq!(
        outcome.counter, outcome.increments,
        "rule: one owner holds a name at a time: the unprotected counter lost an update \
         (seed {seed})"
    );
    eprintln!(
        "safety: {} grants checked, {} paused past their TTL, {} increments, violations: 0",
        outcome.history.len(),
        outcome.pauses,
        outcome.increments
    );
}

/// Futures of every operation dropped at random points (tiny timeouts), many
/// times: nothing panics, the store stays usable, and no grant outlives its TTL.
pub async fn cancellation_leaves_no_trace(store: Arc<dyn Store>) {
    let ttl = Duration::from_millis(300);
    let mut rng = Rng::from_clock("cancellation_leaves_no_trace");
    let mut handles: Vec<Box<dyn Lock>> = Vec::new();
    let mut dropped = 0u32;
    for _ in 0..300 {
        let limit = Duration::from_micros(rng.below(3000));
        let name = format!("c{}", rng.below(4));
        let owner = format!("o{}", rng.below(3));
        let outcome = match rng.below(4) {
            0 => tokio::time::timeout(limit, store.try_lock(&name, &owner, ttl))
                .await
                .map(|r| r.unwrap().map(|l| handles.push(l))),
            1 => tokio::time::timeout(
                limit,
                store.lock(&name, &owner, ttl, Duration::from_millis(20)),
            )
            .await
            .map(|r| r.unwrap().map(|l| handles.push(l))),
            2 if !handles.is_empty() => {
                let h = &handles[rng.below(handles.len() as u64) as usize];
                tokio::time::timeout(limit, h.renew(ttl)).await.map(|r| {
                    r.unwrap();
                    Some(())
                })
            }
            _ if !handles.is_empty() => {
                let h = handles.swap_remove(rng.below(handles.len() as u64) as usize);
                tokio::time::timeout(limit, h.release()).await.map(|r| {
                    r.unwrap();
                    Some(())
                })
            }
            _ => Ok(None),
        };
        if outcome.is_err() {
            dropped += 1;
        }
    }
    assert!(
        dropped > 0,
        "no future was dropped mid-flight; the test proved nothing"
    );
    drop(handles);
    let names = ["c0", "c1", "c2", "c3"];
    let waited = lapsed_after_drops(ttl, || async {
        let mut held = Vec::new();
        for name in names {
            held.extend(store.holder(name).await.unwrap().map(|seen| (name, seen)));
        }
        (!held.is_empty()).then_some(held)
    })
    .await;
    let waited = match waited {
        Ok(waited) => waited,
        Err(held) => panic!(
            "rule: no grant outlives its lease, even with futures dropped mid-flight; saw {held:?} \
             {LANDING:?} after their TTL, expected none"
        ),
    };
    for name in names {
        // A lease long enough that its release cannot find it lapsed.
        let lock = granted(store.try_lock(name, "after", LONG).await);
        assert!(
            lock.release().await.unwrap(),
            "rule: release answers true for its own live grant; saw false for {name}, expected true"
        );
    }
    eprintln!(
        "cancellation: 300 operations, {dropped} dropped mid-flight, store usable, all lapsed \
         {waited:?} after the drops"
    );
}

/// One step of a random sequence.
#[derive(Debug, Clone)]
enum Op {
    TryLock { owner: usize, name: usize },
    Renew { handle: usize },
    Release { handle: usize },
    Holder { name: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..3usize, 0..2usize).prop_map(|(owner, name)| Op::TryLock { owner, name }),
        (0..8usize).prop_map(|handle| Op::Renew { handle }),
        (0..8usize).prop_map(|handle| Op::Release { handle }),
        (0..2usize).prop_map(|name| Op::Holder { name }),
    ]
}

/// The reference model: for each name, the current grant (owner, fence).
#[derive(Default)]
struct Model {
    current: HashMap<usize, (usize, u64)>,
    last_fence: HashMap<usize, u64>,
}

/// Random sequences of operations by a few owners, checked step by step
/// against a small model of the contract (long leases, so no expiry).
pub async fn model_based_sequences(store: Arc<dyn Store>) {
    let runtime = tokio::runtime::Handle::current();
    let case = std::sync::atomic::AtomicU64::new(0);
    let mut runner = TestRunner::new(Config {
        cases: 40,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&proptest::collection::vec(op(), 1..30), |ops| {
        let prefix = format!(
            "m{}",
            case.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        );
        tokio::task::block_in_place(|| runtime.block_on(run_sequence(store.as_ref(), &prefix, ops)))
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
}

async fn run_sequence(store: &dyn Store, prefix: &str, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let ttl = Duration::from_secs(60);
    let mut model = Model::default();
    // Live handles: (name, owner, handle).
    let mut handles: Vec<(usize, usize, Box<dyn Lock>)> = Vec::new();
    for op in ops {
        match op {
            Op::TryLock { owner, name } => {
                let got = store
                    .try_lock(&format!("{prefix}-{name}"), &format!("owner-{owner}"), ttl)
                    .await
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                match (model.current.get(&name).copied(), got) {
                    (None, Some(lock)) => {
                        let last = model.last_fence.get(&name).copied().unwrap_or(0);
                        prop_assert!(
                            lock.fence() > last,
                            "rule: fences strictly increase across grants of a name; saw fence {} \
                             after {}, expected it higher",
                            lock.fence(),
                            last
                        );
                        model.current.insert(name, (owner, lock.fence()));
                        model.last_fence.insert(name, lock.fence());
                        handles.push((name, owner, lock));
                    }
                    (Some((holder, fence)), Some(lock)) => {
                        prop_assert_eq!(
                            holder,
                            owner,
                            "rule: one owner holds a name at a time; granted to another owner \
                             while held"
                        );
                        prop_assert_eq!(
                            lock.fence(),
                            fence,
                            "rule: the same owner again gets the same grant, same fence; \
                             re-acquire changed the fence"
                        );
                        handles.push((name, owner, lock));
                    }
                    (Some((holder, _)), None) => {
                        prop_assert_ne!(
                            holder,
                            owner,
                            "rule: the same owner again gets the same grant; refused its own holder"
                        )
                    }
                    (None, None) => prop_assert!(
                        false,
                        "rule: a name with no unexpired row is granted; saw owner-{} refused \
                         {}-{}, expected a grant",
                        owner,
                        prefix,
                        name
                    ),
                }
            }
            Op::Renew { handle } if handle < handles.len() => {
                let (name, _, lock) = &handles[handle];
                let live = model
                    .current
                    .get(name)
                    .is_some_and(|(_, f)| *f == lock.fence());
                let renewed = lock
                    .renew(ttl)
                    .await
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(
                    renewed,
                    live,
                    "rule: renew answers true only for its own live grant; fence {} on {}-{}",
                    lock.fence(),
                    prefix,
                    name
                );
            }
            Op::Release { handle } if handle < handles.len() => {
                let (name, _, lock) = handles.swap_remove(handle);
                let live = model
                    .current
                    .get(&name)
                    .is_some_and(|(_, f)| *f == lock.fence());
                let released = lock
                    .release()
                    .await
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(
                    released,
                    live,
                    "rule: release answers true only when it deleted its own live grant's row; {}-{}",
                    prefix,
                    name
                );
                if live {
                    model.current.remove(&name);
                }
            }
            Op::Holder { name } => {
                let holder = store
                    .holder(&format!("{prefix}-{name}"))
                    .await
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let expected = model
                    .current
                    .get(&name)
                    .map(|(o, f)| (format!("owner-{o}"), *f));
                prop_assert_eq!(
                    holder.map(|h| (h.owner, h.fence)),
                    expected,
                    "rule: holder reports the live holder's owner and fence; {}-{}",
                    prefix,
                    name
                );
            }
            Op::Renew { .. } | Op::Release { .. } => {}
        }
    }
    for (_, _, lock) in handles {
        let _ = lock.release().await;
    }
    Ok(())
}

fn hostile_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "\\PC{0,40}",
        "[\\x00-\\x1f\\x7f ]{0,8}",
        "(alkstore\\.)?[a-z'\";\\-\\\\ ]{0,20}",
        Just("'; DROP TABLE alkstore_locks; --".to_owned()),
        Just("\"; DROP SCHEMA public CASCADE; --".to_owned()),
        (0usize..3).prop_map(|n| "x".repeat([255, 256, 10 * 1024][n])),
        any::<String>(),
    ]
}

fn any_ttl() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::MAX),
        (0u64..u64::MAX, 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        (1u64..120_000).prop_map(Duration::from_millis),
    ]
}

/// Random names, owners and TTLs (control characters, NUL, 10 KB strings, SQL
/// fragments, huge durations): never a panic, always the documented error,
/// and nothing written by a refused call.
pub async fn bad_input_is_refused_and_writes_nothing(store: Arc<dyn Store>) {
    let runtime = tokio::runtime::Handle::current();
    let mut runner = TestRunner::new(Config {
        cases: 300,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(
        &(hostile_text(), hostile_text(), any_ttl()),
        |(name, owner, ttl)| {
            tokio::task::block_in_place(|| {
                runtime.block_on(async {
                    let expected = validate_name(&name)
                        .and_then(|()| validate_owner(&owner))
                        .and_then(|()| {
                            LeaseMillis::new(ttl)
                                .map(drop)
                                .map_err(|e| Error::database("try_lock", e))
                        });
                    let got = store.try_lock(&name, &owner, ttl).await;
                    match (expected, got) {
                        (Ok(()), Ok(Some(lock))) => {
                            let released = lock.release().await;
                            prop_assert!(
                                released.is_ok(),
                                "rule: a grant of valid input releases without error; saw {:?}, \
                                 expected Ok",
                                released
                            );
                        }
                        (Ok(()), other) => {
                            prop_assert!(
                                false,
                                "rule: valid input on a free name is granted; saw {:?}, expected \
                                 a grant",
                                other
                            )
                        }
                        (Err(want), Ok(_)) => prop_assert!(
                            false,
                            "rule: bad input is refused before storage; saw it accepted, \
                             expected {:?}",
                            want
                        ),
                        (Err(want), Err(got)) => {
                            prop_assert_eq!(
                                want.to_string(),
                                got.to_string(),
                                "rule: bad input gets the documented error"
                            );
                            if validate_name(&name).is_ok() {
                                let holder = store.holder(&name).await;
                                prop_assert!(
                                    matches!(holder, Ok(None)),
                                    "rule: a refused call writes nothing; saw {:?}, expected \
                                     Ok(None)",
                                    holder
                                );
                            }
                        }
                    }
                    Ok(())
                })
            })
        },
    );
    if let Err(failure) = result {
        panic!("{failure}");
    }
    assert_eq!(
        store.purge_expired().await.unwrap(),
        0,
        "rule: a refused call writes nothing; a purge found a row left"
    );
}

/// ShedLock's fuzz test, as its users would port it: 8 tasks each run 25
/// increments of one plain counter (read, pause, write) under one lock,
/// every run with its own owner id from `unique_owner`. The count comes out
/// exact. (With one owner string shared by all tasks — a host name — the
/// same test loses updates: they share one grant. See the owner rule.)
pub async fn per_holder_owners_count_exactly(store: Arc<dyn Store>) {
    const TASKS: u64 = 8;
    const INCREMENTS: u64 = 25;
    let counter = Arc::new(std::sync::Mutex::new(0u64));
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let (store, counter) = (store.clone(), counter.clone());
            tokio::spawn(async move {
                for _ in 0..INCREMENTS {
                    let me = alkstore_core::unique_owner(&format!("task-{task}")).unwrap();
                    let lock = store
                        .lock(
                            "counter",
                            &me,
                            Duration::from_secs(30),
                            Duration::from_secs(60),
                        )
                        .await
                        .unwrap()
                        .expect("granted within the wait");
                    let read = *counter.lock().unwrap();
                    // Another holder inside now would read the same value.
                    tokio::task::yield_now().await;
                    tokio::time::sleep(Duration::from_micros(200)).await;
                    *counter.lock().unwrap() = read + 1;
                    assert!(
                        lock.release().await.unwrap(),
                        "rule: release answers true for its own live grant; saw false, expected \
                         true"
                    );
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(
        *counter.lock().unwrap(),
        TASKS * INCREMENTS,
        "rule: one owner holds a name at a time (one owner id per holder): lost updates, \
         two holders at once"
    );
}
