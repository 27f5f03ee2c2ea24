//! A load for failover tests, whatever the engine: a writer granting,
//! releasing and force-releasing on [`NAMES`] names, recording what it was
//! answered; and the check after a promotion (fences above every fence
//! handed out before, acknowledged grants still there).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use alkstore_core::Store;

/// How many names the writer works on.
pub const NAMES: usize = 64;

const TTL: Duration = Duration::from_secs(60);

/// What the writer was answered.
#[derive(Debug, Default)]
pub struct Written {
    /// The highest fence any grant answered.
    pub highest: u64,
    /// Each name's grant still held when the writer stopped: owner, fence.
    pub held: HashMap<String, (String, u64)>,
    /// Grants answered.
    pub grants: u64,
    rounds: u64,
}

/// Rounds over every name for `for_how_long`, ending with a round whose
/// grants are held: each name's held grant removed by force (of the name,
/// or of the grant's fence), then a new grant, released at once every other
/// round and held otherwise.
pub async fn write(store: &dyn Store, written: &mut Written, for_how_long: Duration) {
    let until = Instant::now() + for_how_long;
    while Instant::now() < until || written.rounds % 2 == 0 {
        written.rounds += 1;
        let round = written.rounds;
        for i in 0..NAMES {
            let name = format!("n{i}");
            let owner = format!("w{round}");
            if let Some((_, fence)) = written.held.remove(&name) {
                if round % 3 == 0 {
                    store.force_release_grant(&name, fence).await.unwrap();
                } else {
                    store.force_release(&name).await.unwrap();
                }
            }
            let lock = store
                .try_lock(&name, &owner, TTL)
                .await
                .unwrap()
                .expect("the writer is the only one granting");
            written.highest = written.highest.max(lock.fence());
            written.grants += 1;
            if round % 2 == 0 {
                assert!(lock.release().await.unwrap());
            } else {
                written.held.insert(name, (owner, lock.fence()));
                lock.let_lapse();
            }
        }
    }
}

/// What the promoted server showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AfterPromotion {
    /// Names whose first grant on the promoted server had a fence not above
    /// every fence handed out before.
    pub fences_not_above: usize,
    /// Grants held at the kill that the promoted server does not have.
    pub acknowledged_lost: usize,
}

/// On the promoted server: counts the held grants it lost, then grants every
/// name (its old grant removed by force first) and counts the fences not
/// above every fence handed out before.
pub async fn after_promotion(promoted: &dyn Store, written: &Written) -> AfterPromotion {
    let mut acknowledged_lost = 0;
    for (name, (owner, fence)) in &written.held {
        let holder = promoted.holder(name).await.unwrap();
        if holder.map(|h| (h.owner, h.fence)) != Some((owner.clone(), *fence)) {
            acknowledged_lost += 1;
        }
    }
    let mut fences_not_above = 0;
    for i in 0..NAMES {
        let name = format!("n{i}");
        promoted.force_release(&name).await.unwrap();
        let lock = promoted
            .try_lock(&name, "after", TTL)
            .await
            .unwrap()
            .expect("free after the forced release");
        if lock.fence() <= written.highest {
            fences_not_above += 1;
            eprintln!(
                "{name}: fence {} after {} was handed out",
                lock.fence(),
                written.highest
            );
        }
        assert!(lock.release().await.unwrap());
    }
    AfterPromotion {
        fences_not_above,
        acknowledged_lost,
    }
}

impl AfterPromotion {
    /// Prints what a failover test saw, as docs/failover.md quotes it.
    pub fn report(self, kind: &str, written: &Written) -> Self {
        eprintln!(
            "{kind} failover: {} grants, highest fence {}; {} of {} acknowledged held grants \
             lost; {} of {NAMES} names granted a fence not above it",
            written.grants,
            written.highest,
            self.acknowledged_lost,
            written.held.len(),
            self.fences_not_above
        );
        self
    }
}

/// A grant answered while the replica was cut off: name, owner, fence.
pub type Answered = (String, String, u64);

/// Makes `how_many` idle connections in `store`: the grants asked for
/// later run on connections it reuses, as in a long-running service.
pub async fn warm(store: &dyn Store, how_many: usize) {
    let names: Vec<String> = (0..how_many).map(|i| format!("warm{i}")).collect();
    let locks = futures::future::join_all(
        names
            .iter()
            .map(|name| store.try_lock(name, "warm", Duration::from_secs(5))),
    )
    .await;
    for lock in locks {
        assert!(lock.unwrap().unwrap().release().await.unwrap());
    }
}

/// Asks for `how_many` names (`cut0`, `cut1`, …) at once on `store`, each
/// in a task of its own; a task answers its grant, or `None` for a refusal
/// or an error.
pub fn ask_for_grants<S: Store + ?Sized + 'static>(
    store: &std::sync::Arc<S>,
    how_many: usize,
) -> Vec<tokio::task::JoinHandle<Option<Answered>>> {
    (0..how_many)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let (name, owner) = (format!("cut{i}"), format!("o{i}"));
                let lock = store.try_lock(&name, &owner, TTL).await.ok()??;
                let fence = lock.fence();
                lock.let_lapse();
                Some((name, owner, fence))
            })
        })
        .collect()
}

/// The asks' answers once each has ended (within 30 s of the primary's
/// death, which ends any still waiting).
pub async fn answers(asks: Vec<tokio::task::JoinHandle<Option<Answered>>>) -> Vec<Answered> {
    let mut answered = Vec::new();
    for ask in asks {
        let outcome = tokio::time::timeout(Duration::from_secs(30), ask)
            .await
            .expect("every ask ends once the primary is gone")
            .expect("the ask did not panic");
        answered.extend(outcome);
    }
    answered
}

/// The answered grants the promoted server does not hold, by name.
pub async fn lost(promoted: &dyn Store, answered: &[Answered]) -> Vec<String> {
    let mut lost = Vec::new();
    for (name, owner, fence) in answered {
        let holder = promoted.holder(name).await.unwrap();
        if holder.map(|h| (h.owner, h.fence)) != Some((owner.clone(), *fence)) {
            lost.push(name.clone());
        }
    }
    lost
}
