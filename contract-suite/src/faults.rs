//! The fault tests every server engine runs against its own throwaway
//! server, written once. An engine's `tests/faults.rs` implements
//! [`Admin`] (how its database ends sessions and locks a table) and calls
//! each function here from a `#[tokio::test]` of the same name; what only
//! one database has (PostgreSQL's LISTEN connection coming back after a
//! restart) stays in that engine's file.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use alkstore_core::Store;
use async_trait::async_trait;

use crate::load::{
    Outage, through_an_idle_session_killer, through_an_outage, through_killed_sessions,
};
use crate::safety::history::check;
use crate::support::assert_waits_out_a_table_lock;

/// What the fault tests do to a test's database from the outside, on
/// connections of their own (never the store's).
#[async_trait]
pub trait Admin: Send + Sync {
    /// Ends every client session of the test database but the asker's;
    /// answers how many.
    async fn end_sessions(&self) -> u64;

    /// Ends every session idle for at least `idle_for` but the asker's and
    /// `spare`'s (a session id from [`TableLock::session`]), and waits until
    /// they are gone; answers how many.
    async fn end_idle_sessions(&self, idle_for: Duration, spare: Option<i64>) -> u64;

    /// Client sessions connected to the test database, the asker's not
    /// counted.
    async fn sessions(&self) -> i64;

    /// Locks the store's `locks` table against every other session (as DDL
    /// or a `LOCK TABLE` does), on a session of its own.
    async fn lock_table(&self) -> Box<dyn TableLock>;
}

/// A `locks` table held locked by [`Admin::lock_table`].
#[async_trait]
pub trait TableLock: Send {
    /// The session holding the lock, for [`Admin::end_idle_sessions`] to
    /// spare.
    fn session(&self) -> i64;

    /// Lets go of the table.
    async fn unlock(self: Box<Self>);
}

/// The store's sessions ended mid-run (by [`Admin::end_sessions`], five
/// times): the store recovers, a kept lease survives (the failed renewal is
/// retried), and nothing overlaps.
pub async fn connections_killed_mid_run(store: Arc<dyn Store>, admin: &dyn Admin) {
    let (killed, grants, errors) = through_killed_sessions(store, 6, || admin.end_sessions()).await;
    eprintln!(
        "kill: {killed} sessions ended, {grants} grants checked, {errors} errors, \
         kept lease held throughout, violations: 0"
    );
}

/// A waiting acquire whose idle connection the server ended meanwhile keeps
/// to its wait behind a table lock: the try on a new connection is bounded
/// like the first, and it answers `None` at its deadline, not when the
/// table lock ends.
pub async fn a_waiting_acquire_after_a_lost_connection_keeps_to_its_wait(
    store: &dyn Store,
    admin: &dyn Admin,
) {
    // One connection of the store's own sits idle.
    assert!(store.holder("job").await.unwrap().is_none());
    let table = admin.lock_table().await;
    let ended = admin
        .end_idle_sessions(Duration::ZERO, Some(table.session()))
        .await;
    assert!(ended >= 1, "the store's idle session was not ended");
    assert_waits_out_a_table_lock(
        store,
        "the waiting acquire outlived its wait behind the table lock",
        table.unlock(),
    )
    .await;
}

/// An idle-session killer ends the store's sessions while a keep-alive
/// holds a lease: the lease survives, and the release afterwards, on a
/// connection that died while idle, answers `true` instead of an error.
pub async fn an_idle_session_killer_is_invisible_to_the_holder(
    store: &dyn Store,
    admin: &dyn Admin,
) {
    let killed =
        through_an_idle_session_killer(store, |idle_for| admin.end_idle_sessions(idle_for, None))
            .await;
    eprintln!("idle-session killer: {killed} sessions ended, lease kept, release answered true");
}

/// The server stopped (`stop`) and started again (`start`) under load:
/// operations fail with `Error::Database` (no panic, no hang), the same
/// store works again afterwards without reopening, and no two holders
/// overlap across the outage. `label` names the outage in the report.
pub async fn server_restart_under_load(
    store: Arc<dyn Store>,
    label: &str,
    stop: impl Future<Output = ()>,
    start: impl Future<Output = ()>,
) -> Outage {
    let outage = through_an_outage(store, 8, stop, start).await;
    assert_eq!(check(&outage.history), Ok(()));
    assert!(
        outage.grants_before > 0 && outage.errors_during > 0,
        "no load, or no outage seen"
    );
    eprintln!(
        "restart ({label}): {} grants checked, {} errors (all Error::Database), slowest op {} ms, \
         recovered {:?} after start, violations: 0",
        outage.history.len(),
        outage.errors,
        outage.slowest_ms,
        outage.recovered_after
    );
    outage
}

/// More waiters than connections (`store` is bounded to 2): waiting
/// acquires hold no connection while they wait, so every holder can release
/// and every one of 40 waiters gets its turn.
pub async fn more_waiters_than_connections(store: Arc<dyn Store>) {
    let slowest_release = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let (store, slowest_release) = (store.clone(), slowest_release.clone());
            tokio::spawn(async move {
                let lock = store
                    .lock(
                        "narrow",
                        &format!("w{i}"),
                        Duration::from_secs(10),
                        Duration::from_secs(60),
                    )
                    .await
                    .unwrap()
                    .expect("every waiter gets its turn");
                tokio::time::sleep(Duration::from_millis(5)).await;
                let began = Instant::now();
                assert!(lock.release().await.unwrap());
                slowest_release.fetch_max(began.elapsed().as_millis() as u64, Ordering::SeqCst);
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let took = started.elapsed();
    let slowest = slowest_release.load(Ordering::SeqCst);
    assert!(
        slowest < 1000,
        "a release waited {slowest} ms for a connection"
    );
    assert!(took < Duration::from_secs(30));
    eprintln!(
        "starvation: 40 waiters over 2 connections served in {took:?}, slowest release {slowest} ms"
    );
}

/// Futures dropped at random points leak no connection: afterwards the
/// store (bounded to 3 connections for its operations) holds at most
/// `most` sessions (`before` were there without it), and every permit came
/// back: 30 concurrent operations finish.
pub async fn cancelled_futures_leak_no_connection(
    store: Arc<dyn Store>,
    admin: &dyn Admin,
    before: i64,
    most: i64,
) {
    crate::cases::cancellation_leaves_no_trace(store.clone()).await;
    let during = admin.sessions().await - before;
    assert!(
        during <= most,
        "{during} sessions for a store bounded to 3 connections (at most {most} expected)"
    );
    let all = futures::future::join_all((0..30).map(|i| {
        let store = store.clone();
        async move { store.holder(&format!("n{i}")).await }
    }));
    let results = tokio::time::timeout(Duration::from_secs(10), all)
        .await
        .expect("a checkout leaked");
    assert!(results.iter().all(Result::is_ok));
    eprintln!(
        "cancellation: {during} sessions held after 300 dropped-or-finished operations (at most {most})"
    );
}

/// A renewal made by hand, on a connection of the test's own, that read
/// the server's clock before its lease ran out and commits after it (what a
/// renewal delayed between its clock and its commit does).
#[async_trait]
pub trait LateRenewal: Send {
    /// While the lease of `name` (a permit's when `permit`, else a lock's)
    /// is still live: fix the renewal's clock (PostgreSQL: begin the
    /// transaction, whose `now()` stays put).
    async fn before_expiry(&mut self, name: &str, permit: bool);

    /// After the lease ran out: renew owner `a`'s grant of `name` with
    /// `fence` on the clock fixed before, in a transaction left open;
    /// answers the rows it matched.
    async fn renew(&mut self, name: &str, permit: bool, fence: u64) -> u64;

    /// Commits the renewal.
    async fn commit(&mut self);
}

/// A late renewal ([`LateRenewal`], made by `open`) never brings a lease
/// back beside a grant that saw it expired: a lock asked after a permit's
/// lease ran out, with the permit's renewal in flight (and a permit after
/// a lock's), waits for the renewal, sees the lease live, and is refused;
/// so is a writer asked after a reader's lease ran out (a reader's row is
/// in the permits table, renewed as a permit's is).
pub async fn a_late_renewal_never_brings_the_other_kind_back<R, F, Fut>(
    store: Arc<dyn Store>,
    open: F,
) where
    R: LateRenewal,
    F: Fn() -> Fut,
    Fut: Future<Output = R>,
{
    #[derive(Clone, Copy, Debug)]
    enum Lapsed {
        Permit,
        Lock,
        Reader,
    }
    let short = Duration::from_millis(300);
    let long = Duration::from_secs(30);
    for lapsed in [Lapsed::Permit, Lapsed::Lock, Lapsed::Reader] {
        let (name, permits_table) = match lapsed {
            Lapsed::Permit => ("renewed-permit", true),
            Lapsed::Lock => ("renewed-lock", false),
            Lapsed::Reader => ("renewed-reader", true),
        };
        let held = match lapsed {
            Lapsed::Permit => store.try_acquire_permit(name, 1, "a", short).await,
            Lapsed::Lock => store.try_lock(name, "a", short).await,
            Lapsed::Reader => store.try_read_lock(name, "a", short).await,
        };
        let held = held.unwrap().expect("a free name");
        let mut late = open().await;
        late.before_expiry(name, permits_table).await;
        tokio::time::sleep(short + Duration::from_millis(100)).await;
        assert_eq!(
            late.renew(name, permits_table, held.fence()).await,
            1,
            "precondition: the renewal matched, its clock from before the expiry"
        );
        let other = {
            let store = store.clone();
            tokio::spawn(async move {
                match lapsed {
                    Lapsed::Permit => store.try_lock(name, "b", long).await,
                    Lapsed::Lock => store.try_acquire_permit(name, 2, "b", long).await,
                    Lapsed::Reader => store.try_write_lock(name, "b", long).await,
                }
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !other.is_finished(),
            "rule: a grant that saw a lease expired waits for its renewal in flight ({lapsed:?}); \
             it answered {:?}",
            other.await
        );
        late.commit().await;
        let other = other.await.unwrap();
        let refused = match lapsed {
            Lapsed::Reader => matches!(other, Ok(None)),
            _ => matches!(other, Err(alkstore_core::Error::HeldAsOtherKind { .. })),
        };
        assert!(
            refused,
            "rule: a lease renewed in time is live, and what it excludes is refused \
             ({lapsed:?}); saw {other:?}"
        );
        assert_eq!(
            store.holders(name).await.unwrap().len(),
            1,
            "rule: the renewed grant holds the name alone"
        );
        held.let_lapse();
    }
}
