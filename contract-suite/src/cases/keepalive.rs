//! The keep-alive helper over a real engine.

use std::sync::Arc;
use std::time::{Duration, Instant};

use alkstore_core::{KeepAlive, LeaseStatus, LostReason, Store};

use crate::support::granted;

/// The lease the keep-alive cases hold past its end: long enough that a
/// renewal may stall for more than a second and a half (a loaded machine's
/// fsync, a pooler's queue) before the lease is truly at risk.
pub(crate) const KEPT_TTL: Duration = Duration::from_secs(3);

/// A kept lease outlives several TTLs, same grant, and releases cleanly.
/// (A 3 s lease, kept for two: shorter ones can really be lost on a loaded
/// machine, where one renewal may stall longer than the keep-alive allows
/// it; a CI run saw a 1 s lease's renewal miss its 0.6 s.)
pub async fn keepalive_holds_past_ttl(store: Arc<dyn Store>) {
    let ttl = KEPT_TTL;
    let lock = granted(store.try_lock("kept", "a", ttl).await);
    let fence = lock.fence();
    let kept = KeepAlive::start(lock, ttl).unwrap();
    tokio::time::sleep(ttl * 2).await;
    assert!(
        matches!(kept.status(), LeaseStatus::Held { .. }),
        "rule: a keep-alive holds the lease past its ttl; saw {:?} after two ttls, expected \
         Held",
        kept.status()
    );
    let holder = store.holder("kept").await.unwrap().expect(
        "rule: a keep-alive holds the lease past its ttl; holder saw None after two ttls, \
         expected a's grant",
    );
    assert_eq!(
        (holder.owner.as_str(), holder.fence),
        ("a", fence),
        "rule: a keep-alive renews the same grant, same fence"
    );
    assert!(
        store.try_lock("kept", "b", ttl).await.unwrap().is_none(),
        "rule: one owner holds a name at a time; saw b granted the kept name, expected it \
         refused"
    );
    assert!(
        kept.release().await.unwrap(),
        "rule: a keep-alive's release releases its live grant; saw false, expected true"
    );
    let seen = store.holder("kept").await.unwrap();
    assert!(
        seen.is_none(),
        "rule: holder reports None once the lease was released; saw {seen:?}, expected None"
    );
}

/// When the grant is taken away (released through another handle of the same
/// grant), the next renewal reports `Revoked` while the old deadline is still ahead.
pub async fn keepalive_signals_revoked(store: Arc<dyn Store>) {
    let ttl = Duration::from_secs(3);
    let lock = granted(store.try_lock("kept", "a", ttl).await);
    let twin = granted(store.try_lock("kept", "a", ttl).await);
    let deadline = lock.valid_until();
    let kept = KeepAlive::start(lock, ttl).unwrap();
    assert!(twin.release().await.unwrap());
    assert_eq!(
        kept.lost().await,
        LostReason::Revoked,
        "rule: lost() fires with Revoked when a renewal answers false"
    );
    assert!(
        Instant::now() < deadline,
        "rule: lost() fires before valid_until passes; saw it told {:?} after the lease ended, \
         expected before",
        Instant::now().saturating_duration_since(deadline)
    );
}

/// When renewals keep failing (the store closed under it), the holder is
/// told before `valid_until` passes. A 3 s lease: the keep-alive's margin
/// (a tenth of it) outlasts a loaded machine's late timer (a 600 ms lease's
/// 60 ms did not, once: told 11 ms late with a second test run beside).
pub async fn keepalive_signals_lost_before_valid_until(store: Arc<dyn Store>) {
    let ttl = Duration::from_secs(3);
    let lock = granted(store.try_lock("kept", "a", ttl).await);
    let deadline = lock.valid_until();
    let kept = KeepAlive::start(lock, ttl).unwrap();
    store.close().await.unwrap();
    let reason = kept.lost().await;
    assert!(
        Instant::now() < deadline,
        "rule: lost() fires before valid_until passes; saw {reason:?} told {:?} after the lease \
         ended, expected before",
        Instant::now().saturating_duration_since(deadline)
    );
    match reason {
        LostReason::NotRenewedInTime {
            last_error: Some(error),
        } => {
            assert!(
                error.contains("closed"),
                "rule: after close every renewal fails with Closed; saw last error {error:?}, \
                 expected it to say closed"
            )
        }
        other => panic!(
            "rule: lost() fires with NotRenewedInTime (and the last error) when no renewal \
             succeeded in time; saw {other:?}, expected NotRenewedInTime with an error"
        ),
    }
}

/// A handle that offers a deadline-lowering signal
/// ([`Lock::valid_until_lowered`](alkstore_core::Lock::valid_until_lowered))
/// notifies it when its deadline comes down: here, when a twin handle of
/// the same grant (the same owner asking again) releases it, so that a
/// keep-alive sleeping until its next renewal hears of it at once. A
/// handle that offers no signal passes (keep-alives look at it on their
/// own).
pub async fn a_lowered_deadline_is_signalled(store: Arc<dyn Store>) {
    let ttl = Duration::from_secs(120);
    for (i, kind) in ["lock", "permit", "reader"].into_iter().enumerate() {
        let name = format!("lowered-{kind}");
        let ask = || async {
            match i {
                0 => store.try_lock(&name, "a", ttl).await,
                1 => store.try_acquire_permit(&name, 2, "a", ttl).await,
                _ => store.try_read_lock(&name, "a", ttl).await,
            }
        };
        let kept = granted(ask().await);
        let twin = granted(ask().await);
        assert_eq!(twin.fence(), kept.fence(), "the same grant");
        let Some(signal) = kept.valid_until_lowered() else {
            assert!(twin.release().await.unwrap());
            continue;
        };
        let lowered = signal.notified();
        tokio::pin!(lowered);
        lowered.as_mut().enable();
        let before = kept.valid_until();
        assert!(twin.release().await.unwrap());
        // Notified as the release is answered (in this process); 500 ms
        // for a loaded machine's scheduler, far below a signal that only
        // comes with some later look (a keep-alive's next renewal).
        assert!(
            tokio::time::timeout(Duration::from_millis(500), lowered)
                .await
                .is_ok(),
            "rule: a handle's deadline-lowering signal is notified when its deadline comes down; \
             the {kind}'s twin released the grant and no signal came within 500 ms"
        );
        assert!(
            kept.valid_until() < before && kept.valid_until() <= Instant::now(),
            "rule: a grant released through a twin handle leaves the other with no lease"
        );
        assert!(!kept.release().await.unwrap());
    }
}
