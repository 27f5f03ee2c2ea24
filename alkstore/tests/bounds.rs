//! Every public type a user holds can cross threads and tasks: `Send` and
//! `Sync` (and `Unpin` where a user would pin it), checked by the compiler,
//! as tokio's `tests/async_send_sync.rs` does. A type that lost one would
//! stop this file compiling, not a user's program later.

#![allow(dead_code)]

use alkstore::schedule::{Outcome, Overlap, Schedule, ScheduleError, Slot, SlotRun};
use alkstore::*;

fn send_sync<T: Send + Sync>() {}
fn send_sync_unpin<T: Send + Sync + Unpin>() {}

/// Never called: only compiled.
fn bounds() {
    // Stores, handles and what they answer.
    send_sync::<Box<dyn Store>>();
    send_sync::<std::sync::Arc<dyn Store>>();
    send_sync::<Box<dyn Lock>>();
    send_sync_unpin::<KeepAlive>();
    send_sync_unpin::<KeepAliveOptions>();
    send_sync_unpin::<LeaseStatus>();
    send_sync_unpin::<LostReason>();
    send_sync_unpin::<Holder>();
    send_sync_unpin::<Listed>();
    send_sync_unpin::<Waiter>();
    send_sync_unpin::<PermitSlot>();
    send_sync_unpin::<Access>();
    send_sync_unpin::<HeldAs>();
    // Errors: to be carried across tasks and into `anyhow`-style chains.
    send_sync_unpin::<Error>();
    send_sync_unpin::<Field>();
    send_sync_unpin::<NameProblem>();
    send_sync_unpin::<DurationError>();
    send_sync_unpin::<KeepAliveOptionsError>();
    send_sync_unpin::<UrlError>();
    send_sync_unpin::<Closed>();
    send_sync_unpin::<PermitsUnsupported>();
    send_sync_unpin::<RwUnsupported>();
    send_sync_unpin::<ScheduleError>();
    // The schedule guard and the doctor's report.
    send_sync_unpin::<Schedule>();
    send_sync_unpin::<Slot>();
    send_sync_unpin::<SlotRun>();
    send_sync_unpin::<Overlap>();
    send_sync_unpin::<Outcome<u64>>();
    send_sync_unpin::<doctor::Report>();
    send_sync_unpin::<doctor::Finding>();
    // Each engine's store, as its feature builds it.
    #[cfg(feature = "sqlite")]
    send_sync_unpin::<sqlite::SqliteStore>();
    #[cfg(feature = "postgres")]
    send_sync_unpin::<postgres::PgStore>();
    #[cfg(feature = "mysql")]
    send_sync_unpin::<mysql::MySqlStore>();
    #[cfg(feature = "etcd")]
    send_sync_unpin::<etcd::EtcdStore>();
}

/// The futures of a store's calls are `Send`: they can be spawned on a
/// multi-threaded runtime.
fn futures_are_send(store: &'static dyn Store, lock: &'static dyn Lock) {
    fn send<F: std::future::Future + Send>(_: F) {}
    let ttl = std::time::Duration::from_secs(1);
    send(store.try_lock("n", "o", ttl));
    send(store.lock("n", "o", ttl, ttl));
    send(store.try_acquire_permit("n", 2, "o", ttl));
    send(store.try_read_lock("n", "o", ttl));
    send(store.try_write_lock("n", "o", ttl));
    send(store.holder("n"));
    send(store.force_release("n"));
    send(store.close());
    send(lock.renew(ttl));
    send(alkstore::open("sqlite::memory:"));
}

#[test]
fn public_types_are_send_and_sync() {
    // The checks are the compiler's: reaching this line means they held.
    let _ = bounds as fn();
}
