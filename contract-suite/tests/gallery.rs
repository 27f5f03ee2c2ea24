//! The gallery of broken engines (`alkstore_contract_suite::gallery`): every
//! contract case on every flaw. Exactly the cases a flaw names must fail —
//! so each names a case that catches its rule, and breaks no other rule.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use alkstore_contract_suite::gallery::{Broken, Flaw};
use alkstore_contract_suite::{Case, Fresh, list, verdict};
use alkstore_core::{EngineStore, Store};

/// Cases run at once (each on its own runtime): most of a case's time is
/// spent waiting out leases; more at once would starve the cases that time
/// things on a small machine.
const AT_ONCE: usize = 12;

/// A fresh store of a new engine with `flaw`, its peers on the same rows.
async fn fresh(flaw: Flaw) -> Option<Fresh> {
    let engine = Broken::new(flaw);
    let store = Arc::new(EngineStore::new(engine.clone()));
    Some(Fresh::new(store).with_peers(move || {
        let peer = EngineStore::new(engine.clone());
        std::future::ready(Arc::new(peer) as Arc<dyn Store>)
    }))
}

/// The names of the cases that fail on each flaw: every (flaw, case) pair
/// from one queue, `AT_ONCE` at a time.
fn failing(cases: &[Case]) -> HashMap<Flaw, BTreeSet<&'static str>> {
    let pairs: Vec<(Flaw, Case)> = Flaw::ALL
        .iter()
        .flat_map(|flaw| cases.iter().map(move |case| (*flaw, *case)))
        .collect();
    let queue = Arc::new(Mutex::new(pairs));
    let failed: Arc<Mutex<HashMap<Flaw, BTreeSet<&'static str>>>> = Arc::default();
    let workers: Vec<_> = (0..AT_ONCE)
        .map(|_| {
            let (queue, failed) = (queue.clone(), failed.clone());
            std::thread::spawn(move || {
                loop {
                    let Some((flaw, case)) = queue.lock().unwrap().pop() else {
                        break;
                    };
                    if verdict(|| fresh(flaw), case).is_err() {
                        failed
                            .lock()
                            .unwrap()
                            .entry(flaw)
                            .or_default()
                            .insert(case.name);
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    std::mem::take(&mut *failed.lock().unwrap())
}

#[test]
fn every_flaw_is_rejected_by_exactly_its_cases() {
    let cases = list::all();
    let mut failing = failing(&cases);
    let mut problems = Vec::new();
    for flaw in Flaw::ALL {
        let failed = failing.remove(&flaw).unwrap_or_default();
        let expected: BTreeSet<&str> = flaw.rejected_by().iter().copied().collect();
        let probed = flaw.also_probed_by();
        let allowed: BTreeSet<&str> = expected.iter().chain(&probed).copied().collect();
        let missed: Vec<_> = expected.difference(&failed).collect();
        let extra: Vec<_> = failed.difference(&allowed).collect();
        eprintln!(
            "gallery: {flaw:?} ({}): {} case(s) reject it{}{}",
            flaw.rule(),
            failed.len(),
            if missed.is_empty() {
                String::new()
            } else {
                format!("; NOT rejected by {missed:?}")
            },
            if extra.is_empty() {
                String::new()
            } else {
                format!("; also failed {extra:?}")
            },
        );
        if failed.is_empty() {
            problems.push(format!("{flaw:?}: no case rejects it"));
        }
        if !missed.is_empty() || !extra.is_empty() {
            problems.push(format!(
                "{flaw:?}: missed {missed:?}, also failed {extra:?}"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
