//! Flaws a store can have above its engine — in its handles or in how it
//! waits — that the engine gallery cannot show: each wraps the reference
//! store and breaks one rule, and the contract case named for that rule
//! must fail on it while it passes on the store unwrapped. (Measured by a
//! review: before these cases, each of the four passed every case.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use alkstore_contract_suite::reference::MemoryEngine;
use alkstore_contract_suite::{Case, Fresh, list, verdict};
use alkstore_core::{
    __private::async_trait, Access, EngineStore, Holder, Listed, Lock, PermitSlot, Result, Store,
    TICKET_LEASE, Waiter,
};
use tokio::sync::Notify;

/// The one rule each wrapper breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flaw {
    /// A handle dropped without `release` releases its grant (spawned).
    ReleasesOnDrop,
    /// A waiting permit acquire tries every 100 ms, never woken.
    PollsForPermits,
    /// A reader's renewal adds the ttl to what was left.
    ReaderRenewAddsToTheOldWindow,
    /// A handle offers a deadline-lowering signal it never notifies.
    SignalNeverNotified,
    /// A handle's deadline-lowering signal is notified 2 s late.
    SignalTwoSecondsLate,
    /// A permit's, a reader's or a writer's ttl under a millisecond is
    /// rounded down (to zero, which the duration guard refuses).
    RoundsSubMillisecondDown,
    /// `waiters` answers an empty queue for a bad name, or on a closed
    /// store, instead of refusing.
    WaitersAnswerAnything,
    /// `waiters` lists the queue newest first.
    WaitersNewestFirst,
    /// `waiters` counts `waited` from a waiter's last attempt (its ticket's
    /// last renewal), not from its arrival.
    WaitedSinceTheLastAttempt,
}

/// The reference store with `flaw` on top.
struct Flawed {
    inner: Arc<dyn Store>,
    flaw: Flaw,
}

/// A handle of [`Flawed`]: the inner one, with the flaw.
#[derive(Debug)]
struct Handle {
    inner: Option<Box<dyn Lock>>,
    flaw: Flaw,
    /// The signal a `SignalNeverNotified` handle offers.
    silent: Arc<Notify>,
}

impl Flawed {
    /// The ttl the flaw asks with: under a millisecond, rounded down.
    fn ttl(&self, ttl: Duration) -> Duration {
        match self.flaw {
            Flaw::RoundsSubMillisecondDown if ttl < Duration::from_millis(1) => Duration::ZERO,
            _ => ttl,
        }
    }

    fn wrap(&self, lock: Result<Option<Box<dyn Lock>>>) -> Result<Option<Box<dyn Lock>>> {
        Ok(lock?.map(|inner| {
            Box::new(Handle {
                inner: Some(inner),
                flaw: self.flaw,
                silent: Arc::default(),
            }) as Box<dyn Lock>
        }))
    }
}

impl Handle {
    fn inner(&self) -> &dyn Lock {
        self.inner.as_deref().expect("a live handle")
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        if self.flaw == Flaw::ReleasesOnDrop
            && let Some(inner) = self.inner.take()
        {
            tokio::spawn(async move {
                let _ = inner.release().await;
            });
        }
    }
}

#[async_trait]
impl Lock for Handle {
    fn name(&self) -> &str {
        self.inner().name()
    }
    fn owner(&self) -> &str {
        self.inner().owner()
    }
    fn fence(&self) -> u64 {
        self.inner().fence()
    }
    fn permit(&self) -> Option<PermitSlot> {
        self.inner().permit()
    }
    fn access(&self) -> Option<Access> {
        self.inner().access()
    }
    fn valid_until(&self) -> Instant {
        self.inner().valid_until()
    }
    fn valid_until_lowered(&self) -> Option<Arc<Notify>> {
        match self.flaw {
            Flaw::SignalNeverNotified => Some(self.silent.clone()),
            Flaw::SignalTwoSecondsLate => {
                let inner = self.inner().valid_until_lowered()?;
                let late = self.silent.clone();
                tokio::spawn(async move {
                    inner.notified().await;
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    late.notify_waiters();
                });
                Some(self.silent.clone())
            }
            _ => self.inner().valid_until_lowered(),
        }
    }
    async fn renew(&self, ttl: Duration) -> Result<bool> {
        let inner = self.inner();
        if self.flaw == Flaw::ReaderRenewAddsToTheOldWindow
            && matches!(inner.access(), Some(Access::Read { .. }))
        {
            let left = inner
                .valid_until()
                .saturating_duration_since(Instant::now());
            return inner.renew(ttl + left).await;
        }
        inner.renew(ttl).await
    }
    async fn release(mut self: Box<Self>) -> Result<bool> {
        let inner = self.inner.take().expect("a live handle");
        inner.release().await
    }
    fn let_lapse(mut self: Box<Self>) {
        if let Some(inner) = self.inner.take() {
            inner.let_lapse();
        }
    }
    async fn release_shared(&self) -> Result<bool> {
        self.inner().release_shared().await
    }
}

#[async_trait]
impl Store for Flawed {
    async fn try_lock(
        &self,
        name: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<Box<dyn Lock>>> {
        self.wrap(self.inner.try_lock(name, owner, ttl).await)
    }
    async fn lock(
        &self,
        name: &str,
        owner: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<Box<dyn Lock>>> {
        self.wrap(self.inner.lock(name, owner, ttl, wait).await)
    }
    async fn try_acquire_permit(
        &self,
        name: &str,
        permits: u32,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<Box<dyn Lock>>> {
        self.wrap(
            self.inner
                .try_acquire_permit(name, permits, owner, self.ttl(ttl))
                .await,
        )
    }
    async fn acquire_permit(
        &self,
        name: &str,
        permits: u32,
        owner: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<Box<dyn Lock>>> {
        if self.flaw != Flaw::PollsForPermits {
            return self.wrap(
                self.inner
                    .acquire_permit(name, permits, owner, ttl, wait)
                    .await,
            );
        }
        let until = Instant::now() + wait;
        loop {
            if let Some(permit) = self.try_acquire_permit(name, permits, owner, ttl).await? {
                return Ok(Some(permit));
            }
            if Instant::now() >= until {
                return Ok(None);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    async fn try_read_lock(
        &self,
        name: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<Box<dyn Lock>>> {
        self.wrap(self.inner.try_read_lock(name, owner, self.ttl(ttl)).await)
    }
    async fn read_lock(
        &self,
        name: &str,
        owner: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<Box<dyn Lock>>> {
        self.wrap(self.inner.read_lock(name, owner, ttl, wait).await)
    }
    async fn try_write_lock(
        &self,
        name: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<Box<dyn Lock>>> {
        self.wrap(self.inner.try_write_lock(name, owner, self.ttl(ttl)).await)
    }
    async fn write_lock(
        &self,
        name: &str,
        owner: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<Box<dyn Lock>>> {
        self.wrap(self.inner.write_lock(name, owner, ttl, wait).await)
    }
    async fn holder(&self, name: &str) -> Result<Option<Holder>> {
        self.inner.holder(name).await
    }
    async fn waiters(&self, name: &str) -> Result<Vec<Waiter>> {
        let waiters = self.inner.waiters(name).await;
        match self.flaw {
            Flaw::WaitersAnswerAnything => Ok(waiters.unwrap_or_default()),
            Flaw::WaitersNewestFirst => waiters.map(|w| w.into_iter().rev().collect()),
            Flaw::WaitedSinceTheLastAttempt => waiters.map(|w| {
                w.into_iter()
                    .map(|w| Waiter {
                        waited: TICKET_LEASE.saturating_sub(w.expires_in),
                        ..w
                    })
                    .collect()
            }),
            _ => waiters,
        }
    }
    async fn purge_expired(&self) -> Result<u64> {
        self.inner.purge_expired().await
    }
    async fn list(&self, prefix: &str, after: Option<&str>, limit: usize) -> Result<Vec<Listed>> {
        self.inner.list(prefix, after, limit).await
    }
    async fn force_release(&self, name: &str) -> Result<Option<Holder>> {
        self.inner.force_release(name).await
    }
    async fn force_release_grant(&self, name: &str, fence: u64) -> Result<Option<Holder>> {
        self.inner.force_release_grant(name, fence).await
    }
    async fn raise_fences(&self, by: u64) -> Result<u64> {
        self.inner.raise_fences(by).await
    }
    async fn close(&self) -> Result<()> {
        self.inner.close().await
    }
}

/// A fresh reference store, with `flaw` on top when given.
async fn fresh(flaw: Option<Flaw>) -> Option<Fresh> {
    let inner: Arc<dyn Store> = Arc::new(EngineStore::new(MemoryEngine::default()));
    Some(Fresh::new(match flaw {
        Some(flaw) => Arc::new(Flawed { inner, flaw }) as Arc<dyn Store>,
        None => inner,
    }))
}

/// The case named `name`.
fn case(name: &str) -> Case {
    list::all()
        .into_iter()
        .find(|case| case.name == name)
        .expect("a contract case")
}

/// `name` passes on the reference store and fails with `flaw` on top.
fn rejects(flaw: Flaw, name: &str) {
    let case = case(name);
    if let Err(why) = verdict(|| fresh(None), case) {
        panic!("{name} fails on the reference store itself: {why}");
    }
    let caught = verdict(|| fresh(Some(flaw)), case);
    eprintln!("{flaw:?}: {name} {caught:?}");
    assert!(caught.is_err(), "{name} passed on a store with {flaw:?}");
}

#[test]
fn a_handle_that_releases_on_drop_is_caught() {
    rejects(
        Flaw::ReleasesOnDrop,
        alkstore_contract_suite::case!(dropping_a_handle_leaves_its_grant),
    );
}

#[test]
fn a_permit_waiter_that_only_polls_is_caught() {
    rejects(
        Flaw::PollsForPermits,
        alkstore_contract_suite::case!(acquire_permit_woken_by_release),
    );
}

#[test]
fn a_reader_renewal_added_to_what_was_left_is_caught() {
    rejects(
        Flaw::ReaderRenewAddsToTheOldWindow,
        alkstore_contract_suite::case!(rw_leases_renew_release_and_lapse),
    );
}

#[test]
fn a_deadline_signal_never_notified_is_caught() {
    rejects(
        Flaw::SignalNeverNotified,
        alkstore_contract_suite::case!(a_lowered_deadline_is_signalled),
    );
}

#[test]
fn a_deadline_signal_two_seconds_late_is_caught() {
    rejects(
        Flaw::SignalTwoSecondsLate,
        alkstore_contract_suite::case!(a_lowered_deadline_is_signalled),
    );
}

#[test]
fn a_sub_millisecond_ttl_rounded_down_is_caught() {
    rejects(
        Flaw::RoundsSubMillisecondDown,
        alkstore_contract_suite::case!(sub_millisecond_ttl_rounds_up_for_every_kind),
    );
}

#[test]
fn waiters_that_answer_anything_are_caught() {
    rejects(
        Flaw::WaitersAnswerAnything,
        alkstore_contract_suite::case!(waiters_validates_and_fails_closed),
    );
}

#[test]
fn waiters_listed_newest_first_are_caught() {
    rejects(
        Flaw::WaitersNewestFirst,
        alkstore_contract_suite::case!(waiters_are_listed_oldest_first_with_their_whole_wait),
    );
}

#[test]
fn a_wait_counted_from_the_last_attempt_is_caught() {
    rejects(
        Flaw::WaitedSinceTheLastAttempt,
        alkstore_contract_suite::case!(waiters_are_listed_oldest_first_with_their_whole_wait),
    );
}
