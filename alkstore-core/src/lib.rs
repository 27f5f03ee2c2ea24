//! Core of [alkstore](https://docs.rs/alkstore): named locks with TTL leases.
//!
//! This crate holds what every storage engine shares:
//!
//! - the [`Store`] and [`Lock`] traits users program against;
//! - the validation of names and owners ([`validate_name`], [`validate_owner`])
//!   and the duration guard ([`LeaseMillis`]), run before any round trip;
//! - [`Error`] and the public sources it carries ([`DurationError`], [`Closed`]);
//! - [`EngineStore`], which turns the row operations of an [`Engine`] into the
//!   whole contract (closed posture, tracing spans, grant handles, waiting acquire);
//! - the [`KeepAlive`] helper that renews a held lock in the background.
//!
//! An engine author implements [`Engine`] and wraps it in [`EngineStore`], or
//! implements [`Store`] and [`Lock`] directly; either way the
//! `alkstore-contract-suite` crate proves the result.

pub mod clock;
pub mod doctor;
mod duration;
mod engine;
mod engine_store;
mod error;
mod finish;
mod grant;
mod handle;
mod keepalive;
mod metrics;
mod name;
mod owner;
mod permit;
pub mod queue;
mod renewals;
mod rw;
pub mod schedule;
mod store;
pub mod url;
pub mod wait;
mod wake;

pub use duration::{LeaseMillis, MAX_LEASE_MILLIS};
pub use engine::{
    Attempt, Engine, GrantKey, PermitAttempt, RwAttempt, SchemaVersionError, fence_from_sql,
    fence_to_sql, holder_from_sql, lease_left,
};
pub use engine_store::EngineStore;
pub use error::{
    BoxError, Closed, DurationError, Error, Field, NameProblem, NoFenceLeft, OutcomeUnknown,
    RaiseUnsupported, Result,
};
pub use keepalive::{KeepAlive, KeepAliveOptions, KeepAliveOptionsError, LeaseStatus, LostReason};
pub use name::{
    MAX_NAME_BYTES, RESERVED_PREFIX, check_text, validate_listing, validate_name, validate_owner,
};
pub use owner::unique_owner;
pub use permit::{HeldAs, MAX_PERMITS, PermitSlot, PermitsUnsupported, validate_permits};
pub use queue::{Line, Queue, Queued, TICKET_LEASE, Ticket, TicketKind, Waiter};
pub use renewals::RENEWAL_BEAT;
pub use rw::{
    Access, INTENT_SLOT, MAX_INTENT, MAX_READERS, READ_WRITE_PERMITS, RwMode, RwUnsupported,
    WRITER_SLOT, permits_row_kind,
};
pub use store::{
    DEFAULT_FENCE_RAISE, Holder, Listed, Lock, MAX_FENCE, MAX_FENCE_RAISE, MAX_LIST_LIMIT,
    MIN_FENCE_RAISE, Store,
};
pub use url::{EngineDescriptor, UrlError};
pub use wake::{ReleaseBus, Subscription, TicketWatch, Watch};

/// Re-exports for this crate's macros; not part of the public API.
#[doc(hidden)]
pub mod __private {
    pub use async_trait::async_trait;
}
