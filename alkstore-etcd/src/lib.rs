//! The etcd engine of alkstore: named locks, semaphores and reader-writer
//! locks on an etcd v3 cluster. Each grant is a key on a lease of its own
//! (the lease's end is the grant's), its fence the revision that granted
//! it. Waiting acquires queue in turn (a ticket per waiter, on a lease of
//! its own) and are woken by a watch: by releases, expiries and the
//! leaving of the waiter ahead alike. Nothing a majority of members acknowledged is lost
//! when a member or the leader dies (docs/engine-etcd.md).
//!
//! ```no_run
//! use std::time::Duration;
//! use alkstore_core::Store;
//! use alkstore_etcd::EtcdStore;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> alkstore_core::Result<()> {
//! let store = EtcdStore::connect("etcd://127.0.0.1:2379/locks").await?;
//! let ttl = Duration::from_secs(30);
//! let lock = store.try_lock("nightly-report", "worker-1", ttl).await?;
//! let lock = lock.expect("the name was free");
//! assert!(store.try_lock("nightly-report", "worker-2", ttl).await?.is_none());
//! assert!(lock.release().await?);
//! # Ok(())
//! # }
//! ```
//!
//! etcd's leases are whole seconds: a lease is the ttl asked rounded up to
//! a second, at least the cluster's minimum (1.5 election timeouts, 2 s
//! with etcd's defaults). A holder's `valid_until` still counts from the
//! request's send time plus the ttl asked, so it never believes in more
//! than it has; others see the name held up to the rounded lease.

mod client;
mod doctor;
mod engine;
mod fence;
mod keys;
mod proto;
mod url;
mod watcher;

use alkstore_core::{EngineStore, Error, Result};

use crate::client::{Client, Is, Target, Txn};
use crate::engine::EtcdEngine;
use crate::keys::Layout;

pub use engine::LeaseTooLong;
pub use url::{DEFAULT_PREFIX, ENGINE};

/// Raw calls on a store's cluster, beside the store's own: for the
/// benchmark's floors (what etcd itself costs) and tests that look inside
/// the client. Not part of the public API.
#[doc(hidden)]
pub mod raw {
    use crate::client::{Client, Is, Target, Txn};

    /// The raw calls, over the store's own channel.
    #[derive(Debug, Clone)]
    pub struct Raw(Client);

    impl Raw {
        /// Over `store`'s channel.
        pub fn of(store: &crate::EtcdStore) -> Raw {
            Raw(store.inner.engine().client.clone())
        }

        /// Puts `key` if it is absent (one transaction); whether it did.
        pub async fn put_if_absent(&self, key: &[u8]) -> bool {
            let txn = Txn::new()
                .when(key.to_vec(), Vec::new(), Target::Create, Is::Equal, 0)
                .put(key.to_vec(), b"raw".to_vec(), 0);
            self.0.txn(txn).await.unwrap().succeeded
        }

        /// Deletes `key`.
        pub async fn delete(&self, key: &[u8]) {
            self.0.txn(Txn::new().delete(key.to_vec())).await.unwrap();
        }

        /// How many times the store authenticated (0 without a user in
        /// its URL): for the tests of tokens the cluster forgot.
        pub fn authentications(&self) -> u64 {
            self.0.authentications()
        }

        /// How many calls the store sent to the cluster (a stream's
        /// opening is one): for the tests that count round trips.
        pub fn calls_sent(&self) -> u64 {
            self.0.calls_sent()
        }

        /// Reads `key` (a linearizable range read).
        pub async fn get(&self, key: &[u8]) -> bool {
            !self
                .0
                .range(key.to_vec(), Vec::new(), 1)
                .await
                .unwrap()
                .kvs
                .is_empty()
        }
    }
}

/// The granularity of etcd's leases: whole seconds. A ttl is rounded up
/// to it (and to the cluster's minimum, [`EtcdStore::shortest_lease`]).
pub const LEASE_GRANULARITY: std::time::Duration = std::time::Duration::from_secs(1);

/// The shortest a waiter's ticket lasts from its last attempt (longer on a
/// cluster whose shortest lease is longer): how long a waiter that died
/// keeps its place in a queue (docs/engine-etcd.md, "Fair waiting"). Not
/// the core's 1 s [`TICKET_LEASE`](alkstore_core::TICKET_LEASE): etcd tells
/// what is left of a lease in whole seconds, rounded down, so a 1 s lease
/// would show 0 s left from the moment it is granted, to an operator and
/// to the contract's checks alike. 2 s is also the shortest lease a
/// cluster with etcd's default election timeout grants.
pub const SHORTEST_TICKET_LEASE: std::time::Duration = std::time::Duration::from_secs(2);

/// What marks a prefix as an alkstore store's, in its `meta/alkstore` key.
const MARKER: &str = "alkstore etcd store, layout 1";

/// The prefix holds keys of something else (no alkstore marker), or a
/// marker of another layout; found in the source chain of the
/// `Error::Database` that [`EtcdStore::connect`] returns.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the prefix {prefix:?} {found}: it is not an alkstore store's; give the URL a prefix of its own \
     (etcd://host:2379/a-prefix)"
)]
pub struct ForeignPrefix {
    /// The prefix.
    pub prefix: String,
    /// What was found there.
    pub found: String,
}

/// A lock store under one key prefix of one etcd cluster.
///
/// Cheap to share behind an `Arc`: every call goes to one member the URL
/// names, and moves to the next when that member fails it.
#[derive(Debug)]
pub struct EtcdStore {
    inner: EngineStore<EtcdEngine>,
}

impl EtcdStore {
    /// Opens the store `url` names (`etcd://host:port[,host:port…][/prefix]`,
    /// see [`ENGINE`]): checks that a member answers within the URL's
    /// timeout, and marks the prefix as an alkstore store's when it holds
    /// nothing yet. A prefix that holds other keys is refused
    /// ([`ForeignPrefix`]).
    pub async fn connect(url: &str) -> Result<Self> {
        let parsed = url::parse(url).map_err(url::open_error)?;
        let client = Client::connect(&parsed.endpoints, &parsed.options)
            .map_err(|e| Error::database("open", e))?;
        let layout = Layout::new(parsed.prefix);
        claim(&client, &layout)
            .await
            .map_err(|e| Error::database("open", e))?;
        Ok(EtcdStore {
            inner: EngineStore::new(EtcdEngine::new(client, layout)),
        })
    }

    /// Whether this store's waiting calls wait in turn: `true` by default
    /// (first come, first served, tickets on leases of their own;
    /// docs/fair-waiting.md). With `false` they take no place in the queue
    /// and win the name when their attempt lands first, never ahead of a
    /// fair store's queued waiters
    /// ([`EngineStore::fair_waiting`](alkstore_core::EngineStore::fair_waiting)).
    pub fn fair_waiting(self, fair: bool) -> Self {
        EtcdStore {
            inner: self.inner.fair_waiting(fair),
        }
    }

    /// Whether renewals go to the server in batches (the default: `true`;
    /// [`EngineStore::renewals_in_batches`](alkstore_core::EngineStore::renewals_in_batches)):
    /// for the benchmark's A/B of the two paths.
    #[doc(hidden)]
    pub fn renewals_in_batches(self, batched: bool) -> Self {
        EtcdStore {
            inner: self.inner.renewals_in_batches(batched),
        }
    }

    /// The shortest lease the cluster grants: a lease of one second asked
    /// for and ended at once (etcd raises a shorter TTL to 1.5 election
    /// timeouts, rounded up to a second: 2 s with its defaults).
    /// Fails closed after [`Store::close`](alkstore_core::Store::close).
    pub async fn shortest_lease(&self) -> Result<std::time::Duration> {
        if self.inner.is_closed() {
            return Err(Error::closed("shortest_lease"));
        }
        let client = &self.inner.engine().client;
        let (lease, ttl) = client
            .lease_grant(1)
            .await
            .map_err(|e| Error::database("shortest_lease", e))?;
        client.lease_revoke_later(lease);
        Ok(std::time::Duration::from_secs(
            u64::try_from(ttl).unwrap_or(1),
        ))
    }

    /// Deletes every key of this store (grants, fence base, marker), for
    /// tests and teardown. Fences start again at the cluster's revisions
    /// without the base: do it only where no fence handed out still
    /// matters. Fails closed after [`Store::close`](alkstore_core::Store::close).
    pub async fn remove_store(&self) -> Result<()> {
        if self.inner.is_closed() {
            return Err(Error::closed("remove_store"));
        }
        let engine = self.inner.engine();
        let prefix = engine.layout.prefix().as_bytes().to_vec();
        let txn = Txn::new().delete_range(prefix.clone(), keys::prefix_end(&prefix));
        engine
            .client
            .txn(txn)
            .await
            .map(drop)
            .map_err(|e| Error::database("remove_store", e))
    }
}

/// Checks the prefix's marker, or writes it where the prefix is empty.
async fn claim(
    client: &Client,
    layout: &Layout,
) -> std::result::Result<(), alkstore_core::BoxError> {
    let marker = format!("{}meta/alkstore", layout.prefix()).into_bytes();
    let prefix = layout.prefix().as_bytes().to_vec();
    let end = keys::prefix_end(&prefix);
    let above: Vec<(&str, Vec<u8>)> = ancestors(layout.prefix())
        .into_iter()
        .map(|above| (above, format!("{above}meta/alkstore").into_bytes()))
        .collect();
    for _ in 0..3 {
        // A prefix inside another store's (`/a/g/x` in the store `/a`)
        // would share its keys: refused by the marker of any prefix above
        // it (and the marking below compares them, for a store opened
        // above at the same time). A user allowed only its own prefix
        // must also be allowed to read those markers: a store above, whose
        // user may write here, would share this store's keys unseen.
        for (above_prefix, theirs) in &above {
            let read = match client.range(theirs.clone(), Vec::new(), 1).await {
                Err(status) if status.code() == tonic::Code::PermissionDenied => {
                    let key = String::from_utf8_lossy(theirs);
                    return Err(format!(
                        "{}: the URL's user may not read {key:?}, where a store at \
                         {above_prefix:?} (which would hold this one's keys) keeps its marker; \
                         grant its role read on it (etcdctl role grant-permission ROLE read {key})",
                        status.message()
                    )
                    .into());
                }
                read => read?,
            };
            if !read.kvs.is_empty() {
                return Err(ForeignPrefix {
                    prefix: layout.prefix().to_owned(),
                    found: format!("is inside the store at {above_prefix:?}"),
                }
                .into());
            }
        }
        let read = client.range(marker.clone(), Vec::new(), 1).await?;
        if let Some(kv) = read.kvs.first() {
            return match kv.value == MARKER.as_bytes() {
                true => Ok(()),
                false => Err(ForeignPrefix {
                    prefix: layout.prefix().to_owned(),
                    found: format!("is marked {:?}", String::from_utf8_lossy(&kv.value)),
                }
                .into()),
            };
        }
        let txn = above.iter().fold(
            Txn::new().when(prefix.clone(), end.clone(), Target::Create, Is::Equal, 0),
            |txn, (_, theirs)| txn.when(theirs.clone(), Vec::new(), Target::Create, Is::Equal, 0),
        );
        let txn = txn
            .put(marker.clone(), MARKER.as_bytes().to_vec(), 0)
            .or_read(prefix.clone(), end.clone());
        let answer = client.txn(txn).await?;
        if answer.succeeded {
            return Ok(());
        }
        let held = client::reads(answer);
        let is_marker_only = held
            .first()
            .is_some_and(|r| r.kvs.iter().any(|kv| kv.key == marker));
        let empty = held.first().is_some_and(|r| r.kvs.is_empty());
        if !is_marker_only && !empty {
            let first = held
                .first()
                .and_then(|r| r.kvs.first())
                .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
                .unwrap_or_default();
            return Err(ForeignPrefix {
                prefix: layout.prefix().to_owned(),
                found: format!("holds other keys, such as {first:?}"),
            }
            .into());
        }
        // Another store marked it (or one above) meanwhile: look again.
    }
    Err("the prefix's marker could not be read".into())
}

/// Every proper prefix of `prefix` that ends in `/` (`/a/b/` → `/`, `/a/`).
fn ancestors(prefix: &str) -> Vec<&str> {
    prefix
        .char_indices()
        .filter(|&(at, c)| c == '/' && at + 1 < prefix.len())
        .map(|(at, _)| &prefix[..=at])
        .collect()
}

alkstore_core::delegate_store!(EtcdStore, inner);

#[cfg(test)]
mod tests {
    #[test]
    fn ancestors_are_the_proper_prefixes_ending_in_a_slash() {
        assert_eq!(super::ancestors("/a/b/"), ["/", "/a/"]);
        assert_eq!(super::ancestors("/alkstore/"), ["/"]);
        assert_eq!(super::ancestors("x/"), Vec::<&str>::new());
    }
}
