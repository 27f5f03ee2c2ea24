//! The gRPC calls the engine makes, to one member of the cluster at a
//! time (pinned): a call that fails for the member's sake (unreachable,
//! timed out, no leader) moves the calls after it to the next member, as
//! etcd's own client did with its pinned endpoint. A balancer over all
//! members kept sending a share of calls to a stopped member (its
//! connection stays open), each waiting out the timeout. Every call is
//! bounded ([`Client::connect`]'s request timeout): a call that a member
//! cannot answer (no leader, no quorum, a stopped process) fails with
//! `DeadlineExceeded` or `Unavailable` in bounded time, never hangs.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use tonic::transport::{Channel, Endpoint};

use crate::proto::etcdserverpb::cluster_client::ClusterClient;
use crate::proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use crate::proto::etcdserverpb::kv_client::KvClient;
use crate::proto::etcdserverpb::lease_client::LeaseClient;
use crate::proto::etcdserverpb::maintenance_client::MaintenanceClient;
use crate::proto::etcdserverpb::request_op::Request as Op;
use crate::proto::etcdserverpb::response_op::Response as OpResponse;
use crate::proto::etcdserverpb::watch_client::WatchClient;
use crate::proto::etcdserverpb::{
    Compare, DeleteRangeRequest, LeaseGrantRequest, LeaseKeepAliveRequest, LeaseRevokeRequest,
    LeaseTimeToLiveRequest, PutRequest, RangeRequest, RangeResponse, RequestOp, TxnRequest,
    TxnResponse,
};

/// How long one call may take, unless the URL says otherwise.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How long opening a connection to one member may take.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// The gRPC clients of one member, sharing its channel.
#[derive(Debug, Clone)]
pub(crate) struct Member {
    pub(crate) kv: KvClient<Channel>,
    pub(crate) lease: LeaseClient<Channel>,
    pub(crate) watch: WatchClient<Channel>,
    pub(crate) cluster: ClusterClient<Channel>,
    pub(crate) maintenance: MaintenanceClient<Channel>,
}

/// The members of one cluster, and which one calls go to.
#[derive(Debug, Clone)]
pub(crate) struct Client {
    members: Arc<[Member]>,
    pinned: Arc<AtomicUsize>,
    timeout: Duration,
}

impl Client {
    /// A client of the members at `endpoints` (`host:port`), each call
    /// bounded by `timeout`. Connects lazily: the first call finds out
    /// whether a member answers.
    pub(crate) fn connect(
        endpoints: &[String],
        timeout: Duration,
    ) -> Result<Client, tonic::transport::Error> {
        let members = endpoints
            .iter()
            .map(|endpoint| {
                let channel = Endpoint::from_shared(format!("http://{endpoint}"))?
                    .connect_timeout(CONNECT_TIMEOUT)
                    .timeout(timeout)
                    .tcp_nodelay(true)
                    // A member that stops answering (a stopped process, a
                    // cut network) is found within 15 s even with no call
                    // in flight (a call in flight is bounded by `timeout`).
                    // Not more often than every 10 s: etcd closes the
                    // connection of a client that pings more often than
                    // every 5 s (`--grpc-keepalive-min-time`).
                    .http2_keep_alive_interval(Duration::from_secs(10))
                    .keep_alive_timeout(Duration::from_secs(5))
                    .keep_alive_while_idle(true)
                    .connect_lazy();
                Ok(Member {
                    kv: KvClient::new(channel.clone()),
                    lease: LeaseClient::new(channel.clone()),
                    watch: WatchClient::new(channel.clone()),
                    cluster: ClusterClient::new(channel.clone()),
                    maintenance: MaintenanceClient::new(channel),
                })
            })
            .collect::<Result<Vec<_>, tonic::transport::Error>>()?;
        // Stores start on different members, spreading the load.
        let start = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos() as usize)
            % members.len().max(1);
        Ok(Client {
            members: members.into(),
            pinned: Arc::new(AtomicUsize::new(start)),
            timeout,
        })
    }

    /// The bound on every call.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Runs `call` on the pinned member; if it fails for the member's sake,
    /// the calls after it go to the next member.
    pub(crate) async fn call<T, F, Fut>(&self, call: F) -> Result<T, tonic::Status>
    where
        F: FnOnce(Member) -> Fut,
        Fut: Future<Output = Result<T, tonic::Status>>,
    {
        self.call_within(None, call).await
    }

    /// [`Client::call`] for a call bounded by `within` (a waiting acquire's
    /// deadline): its running out is the caller's, not the member's fault,
    /// when shorter than the store's timeout.
    pub(crate) async fn call_within<T, F, Fut>(
        &self,
        within: Option<Duration>,
        call: F,
    ) -> Result<T, tonic::Status>
    where
        F: FnOnce(Member) -> Fut,
        Fut: Future<Output = Result<T, tonic::Status>>,
    {
        let index = self.pinned.load(Ordering::Relaxed) % self.members.len();
        let answer = call(self.members[index].clone()).await;
        if let Err(status) = &answer {
            let ours = within.is_some_and(|w| w < self.timeout) && ran_out(status);
            if member_at_fault(status) && !ours {
                // Once for all the calls that failed on it at once.
                let next = (index + 1) % self.members.len();
                let _ =
                    self.pinned
                        .compare_exchange(index, next, Ordering::Relaxed, Ordering::Relaxed);
            }
        }
        answer
    }

    /// The keys in `[key, end)` (`end` empty: `key` alone), at most `limit`
    /// of them (0: all).
    pub(crate) async fn range(
        &self,
        key: Vec<u8>,
        end: Vec<u8>,
        limit: i64,
    ) -> Result<RangeResponse, tonic::Status> {
        let request = RangeRequest {
            key,
            range_end: end,
            limit,
            ..Default::default()
        };
        self.call(|mut m| async move { Ok(m.kv.range(request).await?.into_inner()) })
            .await
    }

    /// One transaction.
    ///
    /// A transaction of compares alone gets a read of its first compared
    /// key: etcd serves a transaction whose every operation is a
    /// serializable read — none at all included — from the member's own
    /// state, which may be behind the leader's, and without a quorum. A
    /// linearizable read makes it wait for the leader's state.
    pub(crate) async fn txn(&self, mut txn: Txn) -> Result<TxnResponse, tonic::Status> {
        if txn.success.is_empty() && txn.failure.is_empty() {
            if let Some(first) = txn.compare.first() {
                txn.success.push(read(first.key.clone(), Vec::new()));
            }
        }
        let mut request = tonic::Request::new(TxnRequest {
            compare: txn.compare,
            success: txn.success,
            failure: txn.failure,
        });
        if let Some(within) = txn.within {
            request.set_timeout(within);
        }
        self.call_within(txn.within, |mut m| async move {
            Ok(m.kv.txn(request).await?.into_inner())
        })
        .await
    }

    /// A new lease of `ttl` seconds: its id and the TTL the cluster gave
    /// (never below `ttl`; raised to the cluster's minimum).
    pub(crate) async fn lease_grant(&self, ttl: i64) -> Result<(i64, i64), tonic::Status> {
        self.lease_grant_within(ttl, None).await
    }

    /// [`Client::lease_grant`], bounded by `within` when given (else by the
    /// store's timeout).
    pub(crate) async fn lease_grant_within(
        &self,
        ttl: i64,
        within: Option<Duration>,
    ) -> Result<(i64, i64), tonic::Status> {
        let mut request = tonic::Request::new(LeaseGrantRequest { ttl, id: 0 });
        if let Some(within) = within {
            request.set_timeout(within);
        }
        let granted = self
            .call_within(within, |mut m| async move {
                Ok(m.lease.lease_grant(request).await?.into_inner())
            })
            .await?;
        if !granted.error.is_empty() {
            return Err(tonic::Status::unknown(granted.error));
        }
        Ok((granted.id, granted.ttl))
    }

    /// Ends lease `id` and removes its keys; false when it was not there
    /// (expired, or ended before).
    pub(crate) async fn lease_revoke(&self, id: i64) -> Result<bool, tonic::Status> {
        let revoked = self
            .call(|mut m| async move { m.lease.lease_revoke(LeaseRevokeRequest { id }).await })
            .await;
        match revoked {
            Ok(_) => Ok(true),
            Err(status) if is_lease_not_found(&status) => Ok(false),
            Err(status) => Err(status),
        }
    }

    /// Ends lease `id` in the background: a grant's lease once its key is
    /// gone, or one a refusal did not use. Only tidiness: a lease with no
    /// key holds nothing, and ends at its TTL anyway.
    pub(crate) fn lease_revoke_later(&self, id: i64) {
        let client = self.clone();
        tokio::spawn(async move {
            let _ = client.lease_revoke(id).await;
        });
    }

    /// Refreshes lease `id` to its full TTL, once; the TTL it now has (0:
    /// the lease is gone).
    pub(crate) async fn lease_keep_alive_once(&self, id: i64) -> Result<i64, tonic::Status> {
        self.call(|mut m| async move {
            let request = futures::stream::iter([LeaseKeepAliveRequest { id }]);
            let mut answers = m.lease.lease_keep_alive(request).await?.into_inner();
            match answers.next().await {
                Some(answer) => Ok(answer?.ttl.max(0)),
                None => Err(tonic::Status::unavailable(
                    "the keep-alive stream ended unanswered",
                )),
            }
        })
        .await
    }

    /// What is left of lease `id`, in whole seconds as etcd counts them
    /// (rounded down), and the TTL it was granted; `None` when it is gone.
    pub(crate) async fn lease_time_left(
        &self,
        id: i64,
    ) -> Result<Option<(i64, i64)>, tonic::Status> {
        let request = LeaseTimeToLiveRequest { id, keys: false };
        let answer = self
            .call(
                |mut m| async move { Ok(m.lease.lease_time_to_live(request).await?.into_inner()) },
            )
            .await?;
        Ok((answer.ttl >= 0).then_some((answer.ttl, answer.granted_ttl)))
    }
}

/// Whether `status` says the member failed the call (unreachable, timed
/// out, no leader, shutting down), not that the call was wrong.
fn member_at_fault(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::Unavailable
            | tonic::Code::DeadlineExceeded
            | tonic::Code::Cancelled
            | tonic::Code::Unknown
            | tonic::Code::Internal
            // "too many requests": the member's applied index lags.
            | tonic::Code::ResourceExhausted
    )
}

/// Whether `status` says a call ran out of its time (the client's bound or
/// the server's).
pub(crate) fn ran_out(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
    )
}

/// Whether `status` says the lease is not there.
fn is_lease_not_found(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::NotFound || status.message().contains("lease not found")
}

/// A transaction being built: compares, and the operations when they all
/// hold and when one does not.
#[derive(Debug, Default)]
pub(crate) struct Txn {
    compare: Vec<Compare>,
    success: Vec<RequestOp>,
    failure: Vec<RequestOp>,
    within: Option<Duration>,
}

/// What a compare looks at.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Target {
    /// The create revision (0: no key).
    Create,
    /// The mod revision (0: no key).
    Mod,
    /// The lease the key is attached to.
    Lease,
}

/// How a compare compares.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Is {
    Equal,
    Less,
}

impl Txn {
    /// A new transaction.
    pub(crate) fn new() -> Txn {
        Txn::default()
    }

    /// Compares `target` of the key `key` (with `end` non-empty: of every
    /// key in `[key, end)`) to `value`.
    pub(crate) fn when(
        mut self,
        key: Vec<u8>,
        end: Vec<u8>,
        target: Target,
        is: Is,
        value: i64,
    ) -> Txn {
        let (target, union) = match target {
            Target::Create => (CompareTarget::Create, TargetUnion::CreateRevision(value)),
            Target::Mod => (CompareTarget::Mod, TargetUnion::ModRevision(value)),
            Target::Lease => (CompareTarget::Lease, TargetUnion::Lease(value)),
        };
        let result = match is {
            Is::Equal => CompareResult::Equal,
            Is::Less => CompareResult::Less,
        };
        self.compare.push(Compare {
            result: result as i32,
            target: target as i32,
            key,
            range_end: end,
            target_union: Some(union),
        });
        self
    }

    /// Bounded by `within` when given, instead of the store's timeout: for
    /// reads only (a write cut short may have been applied).
    pub(crate) fn within(mut self, within: Option<Duration>) -> Txn {
        self.within = within;
        self
    }

    /// Then (when every compare holds): put `value` at `key` on `lease`.
    pub(crate) fn put(mut self, key: Vec<u8>, value: Vec<u8>, lease: i64) -> Txn {
        self.success.push(put(key, value, lease));
        self
    }

    /// Then: delete `key`.
    pub(crate) fn delete(self, key: Vec<u8>) -> Txn {
        self.delete_range(key, Vec::new())
    }

    /// Then: delete every key in `[key, end)`.
    pub(crate) fn delete_range(mut self, key: Vec<u8>, end: Vec<u8>) -> Txn {
        self.success.push(RequestOp {
            request: Some(Op::RequestDeleteRange(DeleteRangeRequest {
                key,
                range_end: end,
                ..Default::default()
            })),
        });
        self
    }

    /// Else (when a compare fails): read `[key, end)`.
    pub(crate) fn or_read(mut self, key: Vec<u8>, end: Vec<u8>) -> Txn {
        self.failure.push(read(key, end));
        self
    }

    /// Then: read `[key, end)`.
    pub(crate) fn read(mut self, key: Vec<u8>, end: Vec<u8>) -> Txn {
        self.success.push(read(key, end));
        self
    }
}

fn put(key: Vec<u8>, value: Vec<u8>, lease: i64) -> RequestOp {
    RequestOp {
        request: Some(Op::RequestPut(PutRequest {
            key,
            value,
            lease,
            ..Default::default()
        })),
    }
}

fn read(key: Vec<u8>, end: Vec<u8>) -> RequestOp {
    RequestOp {
        request: Some(Op::RequestRange(RangeRequest {
            key,
            range_end: end,
            ..Default::default()
        })),
    }
}

/// The reads of a transaction's answer, in order.
pub(crate) fn reads(answer: TxnResponse) -> Vec<RangeResponse> {
    answer
        .responses
        .into_iter()
        .filter_map(|r| match r.response {
            Some(OpResponse::ResponseRange(range)) => Some(range),
            _ => None,
        })
        .collect()
}

/// The revision a transaction's answer was applied at.
pub(crate) fn revision(answer: &TxnResponse) -> i64 {
    answer.header.as_ref().map_or(0, |h| h.revision)
}
