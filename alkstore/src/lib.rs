//! Named locks with TTL leases over pluggable storage engines.
//!
//! A lock is a name that one owner holds at a time, for a lease (`ttl`) the
//! holder renews or lets lapse. Each grant carries a fencing token that is
//! strictly greater than every earlier grant's for the same name.
//!
//! ```
//! use std::time::Duration;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> alkstore::Result<()> {
//! let store = alkstore::open("sqlite::memory:").await?;
//! // An owner names one holder (this run), never a whole host or process.
//! let me = alkstore::unique_owner("report-run")?;
//! if let Some(lock) = store.try_lock("nightly-report", &me, Duration::from_secs(30)).await? {
//!     // ... the job runs in this holder only; pass lock.fence() to what it writes ...
//!     assert!(lock.renew(Duration::from_secs(30)).await?);
//!     lock.release().await?;
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Engines, chosen by feature flag: `sqlite` (default, embedded, bundled
//! SQLite), `postgres` and `mysql` (MariaDB/MySQL), the two servers a fleet
//! of hosts can share, and `etcd`, a consensus store that loses nothing it
//! acknowledged while a majority of its members lives. The engine crates
//! can also be used directly: `alkstore_sqlite::SqliteStore`,
//! `alkstore_postgres::PgStore`, `alkstore_mysql::MySqlStore`,
//! `alkstore_etcd::EtcdStore`.
//!
//! # Features
#![doc = document_features::document_features!()]
#![cfg_attr(docsrs, feature(doc_cfg))]

// What a lock user needs, at the root.
pub use alkstore_core::{
    Access, BoxError, Closed, DEFAULT_FENCE_RAISE, DurationError, Error, Field, HeldAs, Holder,
    KeepAlive, KeepAliveOptions, KeepAliveOptionsError, LeaseStatus, Listed, Lock, LostReason,
    MAX_FENCE, MAX_FENCE_RAISE, MAX_LEASE_MILLIS, MAX_LIST_LIMIT, MAX_NAME_BYTES, MAX_PERMITS,
    MAX_READERS, MIN_FENCE_RAISE, NameProblem, PermitSlot, PermitsUnsupported, RESERVED_PREFIX,
    Result, RwUnsupported, Store, UrlError, Waiter, doctor, schedule, unique_owner,
    validate_listing, validate_name, validate_owner, validate_permits,
};

/// For engine authors: what an engine implements and what the core gives
/// it. A lock user needs none of this (see `docs/writing-an-engine.md`).
pub mod engine {
    pub use alkstore_core::{
        Attempt, Engine, EngineDescriptor, EngineStore, GrantKey, INTENT_SLOT, LeaseMillis,
        NoFenceLeft, PermitAttempt, READ_WRITE_PERMITS, ReleaseBus, RwAttempt, RwMode,
        SchemaVersionError, Subscription, WRITER_SLOT, check_text, clock, delegate_store,
        fence_from_sql, fence_to_sql, holder_from_sql, lease_left, permits_row_kind, url, wait,
    };
}

/// Each engine once: its feature, the module it is re-exported as, its
/// crate. The list `open` walks comes from here.
macro_rules! engines {
    ($($feature:literal => $module:ident = $krate:ident),* $(,)?) => {
        $(
            #[cfg(feature = $feature)]
            #[cfg_attr(docsrs, doc(cfg(feature = $feature)))]
            pub use $krate as $module;
        )*

        /// The engines this build opens, each by its URL schemes (each
        /// engine behind its feature).
        pub const ENGINES: &[&engine::EngineDescriptor] = &[
            $(
                #[cfg(feature = $feature)]
                &$krate::ENGINE,
            )*
        ];
    };
}

engines! {
    "sqlite" => sqlite = alkstore_sqlite,
    "postgres" => postgres = alkstore_postgres,
    "mysql" => mysql = alkstore_mysql,
    "etcd" => etcd = alkstore_etcd,
}

/// Opens the store a URL names, with the engine whose scheme it has:
///
/// - `sqlite::memory:` — a private in-memory database;
/// - `sqlite://locks.db` (relative path), `sqlite:///var/lib/app/locks.db` (absolute);
/// - `postgres://user@host/db?schema=name` (or `postgresql://`); `schema` is
///   alkstore's own parameter (default `alkstore`) and is not passed to the
///   driver;
/// - `mysql://user:password@host:port/database` (or `mariadb://`); the path
///   names the store's database (default `alkstore`), created if missing;
/// - `etcd://host:port[,host:port…][/prefix]`; the path is the key prefix
///   the store lives under (default `/alkstore`).
///
/// An unknown or malformed URL, or one of an engine this build leaves out,
/// is an [`Error::Database`] whose source is a [`UrlError`]; nothing is opened.
pub async fn open(url: &str) -> Result<Box<dyn Store>> {
    alkstore_core::url::open_with(ENGINES, url).await
}

/// Inspects the deployment a URL names (same forms as [`open`]) without
/// opening a store — nothing is created: its durability and replication
/// settings, and for each promise of the contract whether it keeps it
/// ([`doctor::Report`]). What `alkstore doctor` prints.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> alkstore::Result<()> {
/// use alkstore::doctor::{Promise, Verdict};
///
/// let report = alkstore::inspect("sqlite::memory:").await?;
/// let crash = report.finding(Promise::NoGrantLostInACrash).unwrap();
/// assert_eq!(crash.verdict, Verdict::NotApplicable); // nothing outlives memory
/// # Ok(())
/// # }
/// ```
///
/// An unreachable server is an [`Error::Database`] whose source says where
/// and why; a malformed URL one with a [`UrlError`].
pub async fn inspect(url: &str) -> Result<doctor::Report> {
    alkstore_core::url::inspect_with(ENGINES, url).await
}

/// Whether the server `url` names is a standby (read-only, in recovery),
/// by one short read; `false` for an engine without standbys. What
/// `alkstore list`, `show` and `watch` warn of.
pub async fn is_standby(url: &str) -> Result<bool> {
    alkstore_core::url::standby_with(ENGINES, url).await
}

/// The Rust examples of the README and the docs, compiled (and run, unless
/// marked `no_run`) as doctests, so that they cannot drift from the API;
/// `cargo xtask tidy` checks that every page showing Rust is listed here.
#[cfg(doctest)]
mod documented_examples {
    #[doc = include_str!("../../README.md")]
    struct Readme;
    #[doc = include_str!("../../docs/schedule.md")]
    struct Schedule;
    #[doc = include_str!("../../docs/writing-an-engine.md")]
    struct WritingAnEngine;
    #[cfg(feature = "mysql")]
    #[doc = include_str!("../../docs/engine-mysql.md")]
    struct EngineMysql;
}
