//! A load for failover tests, whatever the engine: a writer granting,
//! releasing and force-releasing locks, permits, readers and writers,
//! recording what it was answered; grants kept from before the cut; and
//! the checks after a promotion (fences above every fence handed out
//! before — the same owner's answer included —, no lease of an older
//! server renewed, acknowledged grants still there).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use alkstore_core::{Lock, Store};

use crate::support::Patience;

/// How many lock names the writer works on.
pub const NAMES: usize = 64;

/// How many names of each other kind (semaphore, readers, writers) the
/// writer works on.
pub const OTHER_NAMES: usize = 16;

/// A semaphore's permits in the load.
const PERMITS: u32 = 2;

/// How many names of each kind [`keep`] holds.
const KEPT: usize = 4;

const TTL: Duration = Duration::from_secs(60);

/// What a grant of the load is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A lock (`try_lock`).
    Lock,
    /// A permit of a semaphore of `PERMITS` (`try_acquire_permit`).
    Permit,
    /// A reader (`try_read_lock`).
    Read,
    /// A writer (`try_write_lock`).
    Write,
}

impl Kind {
    const ALL: [Kind; 4] = [Kind::Lock, Kind::Permit, Kind::Read, Kind::Write];

    /// The load's names of this kind begin with it.
    fn prefix(self) -> &'static str {
        match self {
            Kind::Lock => "n",
            Kind::Permit => "p",
            Kind::Read => "r",
            Kind::Write => "x",
        }
    }

    /// How many names of this kind the writer works on.
    fn names(self) -> usize {
        match self {
            Kind::Lock => NAMES,
            _ => OTHER_NAMES,
        }
    }

    /// Asks once for a grant of this kind.
    async fn ask(
        self,
        store: &dyn Store,
        name: &str,
        owner: &str,
    ) -> alkstore_core::Result<Option<Box<dyn Lock>>> {
        match self {
            Kind::Lock => store.try_lock(name, owner, TTL).await,
            Kind::Permit => store.try_acquire_permit(name, PERMITS, owner, TTL).await,
            Kind::Read => store.try_read_lock(name, owner, TTL).await,
            Kind::Write => store.try_write_lock(name, owner, TTL).await,
        }
    }

    /// The kind of the load's name.
    fn of(name: &str) -> Kind {
        let name = name.strip_prefix('k').unwrap_or(name);
        Kind::ALL
            .into_iter()
            .find(|kind| name.starts_with(kind.prefix()))
            .expect("a name of the load")
    }
}

/// Every name the writer works on, with its kind.
fn written_names() -> impl Iterator<Item = (Kind, String)> {
    Kind::ALL
        .into_iter()
        .flat_map(|kind| (0..kind.names()).map(move |i| (kind, format!("{}{i}", kind.prefix()))))
}

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
/// grants are held: each name's held grant removed by force (a lock's by
/// name or by fence in turns, other grants by fence), then a new grant to
/// an owner of the round's own, released at once every other round and
/// held otherwise.
pub async fn write(store: &dyn Store, written: &mut Written, for_how_long: Duration) {
    let until = Instant::now() + for_how_long;
    while Instant::now() < until || written.rounds % 2 == 0 {
        written.rounds += 1;
        let round = written.rounds;
        for (kind, name) in written_names() {
            let owner = format!("w{round}");
            if let Some((_, fence)) = written.held.remove(&name) {
                if kind == Kind::Lock && round % 3 != 0 {
                    store.force_release(&name).await.unwrap();
                } else {
                    store.force_release_grant(&name, fence).await.unwrap();
                }
            }
            let lock = kind
                .ask(store, &name, &owner)
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

/// Grants held from before the cut, which the promoted server has: their
/// handles, to renew after the promotion.
#[derive(Debug, Default)]
pub struct Kept {
    handles: Vec<Box<dyn Lock>>,
}

/// Takes `KEPT` grants of each kind (names `kn0`, `kp0`, …, owner `k`)
/// and keeps their handles. Wait until the replica has them before the
/// cut.
pub async fn keep(store: &dyn Store) -> Kept {
    let mut handles = Vec::new();
    for kind in Kind::ALL {
        for i in 0..KEPT {
            let name = format!("k{}{i}", kind.prefix());
            let lock = kind
                .ask(store, &name, "k")
                .await
                .unwrap()
                .expect("a free name");
            handles.push(lock);
        }
    }
    Kept { handles }
}

/// What the promoted server answered the grants of an older server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Revived {
    /// Kept grants (from before the cut) live on the promoted server, of
    /// how many were kept.
    pub kept_there: (usize, usize),
    /// Kept grants (from before the cut, on the promoted server) whose
    /// handle's renewal answered `true`: a lease of an older server.
    pub renewed: usize,
    /// Grants live on the promoted server (kept, held or released on the
    /// old primary, revived) asked for again by their own owner.
    pub asked: usize,
    /// Of those, the answers whose fence was not above every fence handed
    /// out before the promotion.
    pub fences_not_above: usize,
}

impl Revived {
    /// What every promotion test asserts: some grant of the old primary
    /// was live on the promoted server; none was renewed there; each asked
    /// again by its owner was answered a fence above every fence handed
    /// out before.
    pub fn assert_refenced(self) {
        assert!(
            self.asked > 0,
            "no grant of the old primary was live on the promoted server"
        );
        assert_eq!(
            self.kept_there.0, self.kept_there.1,
            "grants kept from before the cut missing on the promoted server: their renewals \
             prove nothing"
        );
        assert_eq!(
            self.renewed, 0,
            "leases of the old primary renewed on the promoted server"
        );
        assert_eq!(
            self.fences_not_above, 0,
            "owners asking again were answered fences not above those handed out before"
        );
    }
}

/// On the promoted server, reached through the same `store` (its
/// connections moved there): renews each kept handle, then asks again, as
/// their own owners, for every grant of the load's names that is live
/// there, releasing each answer.
async fn revived(store: &dyn Store, written: &Written, kept: Kept) -> Revived {
    let mut renewed = 0;
    let patience = Patience::new("a renewal on the promoted server", Duration::from_secs(30));
    let (mut kept_there, kept_count) = (0, kept.handles.len());
    for handle in &kept.handles {
        let live = store.holders(handle.name()).await.unwrap();
        if live.iter().any(|l| l.holder.fence == handle.fence()) {
            kept_there += 1;
        }
    }
    for handle in &kept.handles {
        // The first calls may meet connections to the dead primary.
        let answer = loop {
            match handle.renew(TTL).await {
                Ok(answer) => break answer,
                Err(error) => eprintln!("renewal of {}: {error}", handle.name()),
            }
            patience.next().await;
        };
        if answer {
            renewed += 1;
            eprintln!(
                "{}: the kept grant of fence {} was renewed on the promoted server",
                handle.name(),
                handle.fence()
            );
        }
    }
    let kept_names = kept
        .handles
        .iter()
        .map(|h| (Kind::of(h.name()), h.name().to_owned()));
    let names: Vec<(Kind, String)> = written_names().chain(kept_names).collect();
    for handle in kept.handles {
        handle.let_lapse();
    }
    let (mut asked, mut fences_not_above) = (0, 0);
    for (kind, name) in names {
        for live in store.holders(&name).await.unwrap() {
            asked += 1;
            let owner = &live.holder.owner;
            let lock = kind
                .ask(store, &name, owner)
                .await
                .unwrap()
                .expect("its own owner is answered");
            if lock.fence() <= written.highest {
                fences_not_above += 1;
                eprintln!(
                    "{name}: {owner} asked again and was answered fence {} (live: {}) after {} \
                     was handed out",
                    lock.fence(),
                    live.holder.fence,
                    written.highest
                );
            }
            assert!(lock.release().await.unwrap());
        }
    }
    Revived {
        kept_there: (kept_there, kept_count),
        renewed,
        asked,
        fences_not_above,
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
    /// What it answered the grants of an older server.
    pub revived: Revived,
}

/// On the promoted server, through `promoted` (the store the load ran on,
/// its connections moved there, for `kept` to be renewed): counts the held
/// grants it lost; renews the kept grants and asks again for every live
/// grant as its owner ([`Revived`]); then grants every lock name (its old
/// grant removed by force first) to a new owner and counts the fences not
/// above every fence handed out before.
pub async fn after_promotion(
    promoted: &dyn Store,
    written: &Written,
    kept: Kept,
) -> AfterPromotion {
    let mut acknowledged_lost = 0;
    for (name, (owner, fence)) in &written.held {
        let holders = promoted.holders(name).await.unwrap();
        if !holders
            .iter()
            .any(|live| (&live.holder.owner, live.holder.fence) == (owner, *fence))
        {
            acknowledged_lost += 1;
        }
    }
    let revived = revived(promoted, written, kept).await;
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
        revived,
    }
}

impl AfterPromotion {
    /// Prints what a failover test saw, as docs/failover.md quotes it.
    pub fn report(self, kind: &str, written: &Written) -> Self {
        eprintln!(
            "{kind} failover: {} grants, highest fence {}; {} of {} acknowledged held grants \
             lost; {} of {NAMES} names granted a fence not above it; {} kept grants renewed; {} \
             live grants asked again by their owner, {} answered a fence not above it",
            written.grants,
            written.highest,
            self.acknowledged_lost,
            written.held.len(),
            self.fences_not_above,
            self.revived.renewed,
            self.revived.asked,
            self.revived.fences_not_above
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
