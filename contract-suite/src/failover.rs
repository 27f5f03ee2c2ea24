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
