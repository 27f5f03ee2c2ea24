//! The gRPC calls the engine makes, to one member of the cluster at a
//! time (pinned): a call that fails for the member's sake (unreachable,
//! timed out, no leader; or the third short bound in a row that ran out on
//! it) moves the calls after it to the next member, as
//! etcd's own client did with its pinned endpoint. A balancer over all
//! members kept sending a share of calls to a stopped member (its
//! connection stays open), each waiting out the timeout. Every call is
//! bounded ([`Client::connect`]'s request timeout): a call that a member
//! cannot answer (no leader, no quorum, a stopped process) fails with
//! `DeadlineExceeded` or `Unavailable` in bounded time, never hangs.
//!
//! With credentials (`etcd://user:password@…`), every call carries the
//! token etcd's `Authenticate` gave, as etcd's own client does: the first
//! call the cluster refuses for want of a token (none yet, one expired
//! after its idle TTL, one a member no longer knows) authenticates and is
//! sent once more. Refused calls were never applied, so sending again is
//! safe. A cluster without authentication is used as it is.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use alkstore_core::BoxError;
use futures::StreamExt;
use std::path::PathBuf;
use tonic::metadata::AsciiMetadataValue;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::proto::etcdserverpb::auth_client::AuthClient;
use crate::proto::etcdserverpb::cluster_client::ClusterClient;
use crate::proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use crate::proto::etcdserverpb::kv_client::KvClient;
use crate::proto::etcdserverpb::lease_client::LeaseClient;
use crate::proto::etcdserverpb::maintenance_client::MaintenanceClient;
use crate::proto::etcdserverpb::request_op::Request as Op;
use crate::proto::etcdserverpb::response_op::Response as OpResponse;
use crate::proto::etcdserverpb::watch_client::WatchClient;
use crate::proto::etcdserverpb::{
    AuthenticateRequest, Compare, DeleteRangeRequest, LeaseGrantRequest, LeaseKeepAliveRequest,
    LeaseRevokeRequest, LeaseTimeToLiveRequest, PutRequest, RangeRequest, RangeResponse, RequestOp,
    TxnRequest, TxnResponse,
};

/// How long one call may take, unless the URL says otherwise.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How long opening a connection to one member may take.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// A member's channel, every request on it carrying the client's token.
type Authed = InterceptedService<Channel, Token>;

/// The gRPC clients of one member, sharing its channel.
#[derive(Debug, Clone)]
pub(crate) struct Member {
    pub(crate) kv: KvClient<Authed>,
    pub(crate) lease: LeaseClient<Authed>,
    pub(crate) watch: WatchClient<Authed>,
    pub(crate) cluster: ClusterClient<Authed>,
    pub(crate) maintenance: MaintenanceClient<Authed>,
    auth: AuthClient<Channel>,
}

/// How a client calls the members.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Options {
    /// The bound on every call.
    pub(crate) timeout: Duration,
    /// The user the calls authenticate as, if any.
    pub(crate) credentials: Option<Credentials>,
    /// TLS, if the members serve it.
    pub(crate) tls: Option<Tls>,
}

/// TLS to the members, as `etcdctl`'s `--cacert`, `--cert` and `--key`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Tls {
    /// The CA to trust; `None`: the system's roots.
    pub(crate) ca: Option<PathBuf>,
    /// A client certificate and its key (both or neither).
    pub(crate) cert: Option<PathBuf>,
    pub(crate) key: Option<PathBuf>,
}

impl Tls {
    /// tonic's configuration, the files read (a file that cannot be read
    /// or holds no PEM is an error naming it).
    fn config(&self) -> Result<ClientTlsConfig, BoxError> {
        let read = |what: &str, path: &PathBuf| {
            std::fs::read(path)
                .map_err(|e| format!("cannot read the {what} {}: {e}", path.display()))
        };
        let mut config = ClientTlsConfig::new();
        config = match &self.ca {
            Some(ca) => {
                config.ca_certificate(Certificate::from_pem(read("CA certificate (cacert=)", ca)?))
            }
            None => config.with_native_roots(),
        };
        if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
            config = config.identity(Identity::from_pem(
                read("client certificate (cert=)", cert)?,
                read("client key (key=)", key)?,
            ));
        }
        Ok(config)
    }
}

/// A user of the cluster and its password (`etcd://user:password@…`).
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Credentials {
    pub(crate) user: String,
    pub(crate) password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"****")
            .finish()
    }
}

/// The token the calls carry (none before the first authentication),
/// shared by every member's channel. Its `Debug` never shows it.
#[derive(Clone, Default)]
pub(crate) struct Token(Arc<std::sync::RwLock<Option<AsciiMetadataValue>>>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.current() {
            Some(_) => f.write_str("Token(****)"),
            None => f.write_str("Token(none)"),
        }
    }
}

impl Token {
    fn current(&self) -> Option<AsciiMetadataValue> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set(&self, token: AsciiMetadataValue) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Some(token);
    }
}

impl Interceptor for Token {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = self.current() {
            request.metadata_mut().insert("token", token);
        }
        Ok(request)
    }
}

/// Authentication: the credentials, the token they got, and one
/// authentication at a time.
#[derive(Debug)]
struct Auth {
    credentials: Credentials,
    token: Token,
    /// How many authentications were made, read before a call is sent: a
    /// call refused for want of a token authenticates only if none was
    /// made since (else it takes that one's token, or its error).
    attempts: AtomicU64,
    /// One authentication at a time, and the last one's error.
    last: tokio::sync::Mutex<Option<tonic::Status>>,
}

impl Auth {
    /// [`Client::authenticate`]'s work.
    async fn authenticate_on(&self, member: Member, seen: u64) -> Result<(), tonic::Status> {
        let mut last = self.last.lock().await;
        if self.attempts.load(Ordering::Acquire) != seen {
            return match &*last {
                None => Ok(()),
                Some(error) => Err(error.clone()),
            };
        }
        let request = AuthenticateRequest {
            name: self.credentials.user.clone(),
            password: self.credentials.password.clone(),
        };
        let answer = member.auth.clone().authenticate(request).await;
        let outcome = answer
            .map_err(|status| {
                tonic::Status::new(
                    status.code(),
                    format!(
                        "etcd refused the user {}: {}",
                        self.credentials.user,
                        status.message()
                    ),
                )
            })
            .and_then(|answer| {
                AsciiMetadataValue::try_from(answer.into_inner().token)
                    .map_err(|_| tonic::Status::internal("etcd answered a token that is not ASCII"))
            })
            .map(|token| self.token.set(token));
        *last = outcome.as_ref().err().cloned();
        self.attempts.fetch_add(1, Ordering::AcqRel);
        outcome
    }
}

/// The members of one cluster, and which one calls go to.
#[derive(Debug, Clone)]
pub(crate) struct Client {
    members: Arc<[Member]>,
    pinned: Arc<AtomicUsize>,
    /// Short bounds run out in a row on the pinned member.
    short_run_outs: Arc<AtomicUsize>,
    timeout: Duration,
    /// `None`: the URL gave no credentials.
    auth: Option<Arc<Auth>>,
    /// Calls sent (each sending of one), for tests that count round trips.
    sent: Arc<AtomicU64>,
}

impl Client {
    /// A client of the members at `endpoints` (`host:port`), as `options`
    /// say. Connects lazily: the first call finds out whether a member
    /// answers (TLS files are read now).
    pub(crate) fn connect(endpoints: &[String], options: &Options) -> Result<Client, BoxError> {
        let timeout = options.timeout;
        let tls = options.tls.as_ref().map(Tls::config).transpose()?;
        let scheme = match tls {
            Some(_) => "https",
            None => "http",
        };
        let token = Token::default();
        let members = endpoints
            .iter()
            .map(|endpoint| {
                let mut channel = Endpoint::from_shared(format!("{scheme}://{endpoint}"))?;
                if let Some(tls) = &tls {
                    channel = channel.tls_config(tls.clone())?;
                }
                let channel = channel
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
                let authed = InterceptedService::new(channel.clone(), token.clone());
                Ok(Member {
                    kv: KvClient::new(authed.clone()),
                    lease: LeaseClient::new(authed.clone()),
                    watch: WatchClient::new(authed.clone()),
                    cluster: ClusterClient::new(authed.clone()),
                    maintenance: MaintenanceClient::new(authed),
                    auth: AuthClient::new(channel),
                })
            })
            .collect::<Result<Vec<_>, tonic::transport::Error>>()?;
        let credentials = options.credentials.clone();
        // Stores start on different members, spreading the load.
        let start = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos() as usize)
            % members.len().max(1);
        Ok(Client {
            members: members.into(),
            pinned: Arc::new(AtomicUsize::new(start)),
            short_run_outs: Arc::new(AtomicUsize::new(0)),
            timeout,
            auth: credentials.map(|credentials| {
                Arc::new(Auth {
                    credentials,
                    token,
                    attempts: AtomicU64::new(0),
                    last: tokio::sync::Mutex::new(None),
                })
            }),
            sent: Arc::default(),
        })
    }

    /// How many calls were sent through [`Client::call_on`] (a stream's
    /// opening is one, whatever it carries).
    pub(crate) fn calls_sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// How many times the client authenticated (0 without credentials).
    pub(crate) fn authentications(&self) -> u64 {
        self.auth
            .as_ref()
            .map_or(0, |auth| auth.attempts.load(Ordering::Acquire))
    }

    /// The bound on every call.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Runs `call` on the pinned member; if it fails for the member's sake,
    /// the calls after it go to the next member. A call refused for want of
    /// a token runs once more after authenticating.
    pub(crate) async fn call<T, F, Fut>(&self, call: F) -> Result<T, tonic::Status>
    where
        F: Fn(Member) -> Fut,
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
        F: Fn(Member) -> Fut,
        Fut: Future<Output = Result<T, tonic::Status>>,
    {
        let index = self.pinned.load(Ordering::Relaxed) % self.members.len();
        let answer = self.call_on(index, within, call).await;
        match &answer {
            Ok(_) => self.short_run_outs.store(0, Ordering::Relaxed),
            Err(status) if member_at_fault(status) => {
                // A short bound running out is the caller's, not the
                // member's, fault — unless it keeps happening: a member
                // cut off from its leader answers no read in time, and a
                // store making only short waiting acquires would stay on
                // it for good.
                let ours = within.is_some_and(|w| w < self.timeout) && ran_out(status);
                let again = ours && self.short_run_outs.fetch_add(1, Ordering::Relaxed) + 1 >= 3;
                if !ours || again {
                    // Once for all the calls that failed on it at once.
                    let next = (index + 1) % self.members.len();
                    let _ = self.pinned.compare_exchange(
                        index,
                        next,
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    );
                    self.short_run_outs.store(0, Ordering::Relaxed);
                }
            }
            Err(_) => {}
        }
        answer
    }

    /// Runs `call` on member `index`, whatever the pinned one; sent once
    /// more after authenticating if refused for want of a token. The
    /// authentication and the second sending end within the call's bound
    /// (`within`, else the store's timeout) from its start.
    pub(crate) async fn call_on<T, F, Fut>(
        &self,
        index: usize,
        within: Option<Duration>,
        call: F,
    ) -> Result<T, tonic::Status>
    where
        F: Fn(Member) -> Fut,
        Fut: Future<Output = Result<T, tonic::Status>>,
    {
        let started = tokio::time::Instant::now();
        let member = &self.members[index % self.members.len()];
        let seen = self
            .auth
            .as_ref()
            .map_or(0, |auth| auth.attempts.load(Ordering::Acquire));
        self.sent.fetch_add(1, Ordering::Relaxed);
        let answer = call(member.clone()).await;
        match answer {
            Err(status) if wants_token(&status) => {
                let until = started + within.unwrap_or(self.timeout);
                let again = async {
                    self.authenticate(member, seen).await?;
                    self.sent.fetch_add(1, Ordering::Relaxed);
                    call(member.clone()).await
                };
                tokio::time::timeout_at(until, again)
                    .await
                    .unwrap_or_else(|_| {
                        Err(tonic::Status::deadline_exceeded(
                            "authenticating again took longer than the call's bound",
                        ))
                    })
            }
            answer => answer,
        }
    }

    /// Authenticates with the URL's credentials on `member`, unless an
    /// authentication was made since the refused call was sent (`seen`
    /// made before): then its token is used, or its error answered (the
    /// calls refused together make one authentication, not one each).
    /// Without credentials, the refusal is explained.
    ///
    /// In a task of its own, bounded by the store's timeout (the channel's):
    /// a caller whose bound is shorter than etcd's bcrypt check and Raft
    /// round (a waiting acquire's, 100 ms or less) stops waiting for it,
    /// but the authentication goes on and its token serves the next call.
    async fn authenticate(&self, member: &Member, seen: u64) -> Result<(), tonic::Status> {
        let Some(auth) = &self.auth else {
            return Err(tonic::Status::unauthenticated(
                "the cluster has authentication on: give the URL a user \
                 (etcd://user:password@host:2379/prefix)",
            ));
        };
        let (auth, member) = (auth.clone(), member.clone());
        tokio::spawn(async move { auth.authenticate_on(member, seen).await })
            .await
            .unwrap_or_else(|ended| {
                Err(tonic::Status::internal(format!(
                    "the authentication ended unanswered: {ended}"
                )))
            })
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
        self.call(|mut m| {
            let request = request.clone();
            async move { Ok(m.kv.range(request).await?.into_inner()) }
        })
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
        let request = TxnRequest {
            compare: txn.compare,
            success: txn.success,
            failure: txn.failure,
        };
        self.call_within(txn.within, |mut m| {
            let request = bounded(request.clone(), txn.within);
            async move { Ok(m.kv.txn(request).await?.into_inner()) }
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
        let granted = self
            .call_within(within, |mut m| {
                let request = bounded(LeaseGrantRequest { ttl, id: 0 }, within);
                async move { Ok(m.lease.lease_grant(request).await?.into_inner()) }
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

    /// Refreshes each lease of `ids` (no id twice) to its full TTL, every
    /// one on one keep-alive stream; the TTL each has now (0: gone), by id.
    pub(crate) async fn lease_keep_alive_many(
        &self,
        ids: &[i64],
    ) -> Result<HashMap<i64, i64>, tonic::Status> {
        self.call(|mut m| async move {
            let requests: Vec<LeaseKeepAliveRequest> =
                ids.iter().map(|&id| LeaseKeepAliveRequest { id }).collect();
            let request = futures::stream::iter(requests);
            let mut answers = m.lease.lease_keep_alive(request).await?.into_inner();
            // etcd answers each request in turn, then ends the stream.
            let mut left = HashMap::with_capacity(ids.len());
            while left.len() < ids.len() {
                let Some(answer) = answers.next().await else {
                    return Err(tonic::Status::unavailable(
                        "the keep-alive stream ended before answering every lease",
                    ));
                };
                let answer = answer?;
                left.insert(answer.id, answer.ttl.max(0));
            }
            Ok(left)
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

/// `message` as a request, bounded by `within` when given (else by the
/// channel's timeout, the store's).
fn bounded<T>(message: T, within: Option<Duration>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(within) = within {
        request.set_timeout(within);
    }
    request
}

/// Whether `status` refuses a call for want of a valid token: none sent
/// (the cluster turned authentication on), one the cluster no longer knows
/// (expired, or lost with a member's restart), or one older than a change
/// of users and roles. etcd refuses these before applying anything.
fn wants_token(status: &tonic::Status) -> bool {
    let message = status.message();
    matches!(
        status.code(),
        tonic::Code::Unauthenticated | tonic::Code::InvalidArgument
    ) && (message.contains("invalid auth token")
        || message.contains("user name is empty")
        || message.contains("revision of auth store is old"))
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
/// the server's). etcd answers some calls whose deadline passed on the
/// server (a linearizable read waiting for its index) with Go's context
/// error as it is, code `Unknown`: a loaded run saw waiting acquires fail
/// with it instead of answering "not granted".
pub(crate) fn ran_out(status: &tonic::Status) -> bool {
    match status.code() {
        tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => true,
        tonic::Code::Unknown => matches!(
            status.message(),
            "context deadline exceeded" | "context canceled"
        ),
        _ => false,
    }
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

    /// Compares that `key` is the key created at `revision`: there, and not
    /// deleted and put again since.
    pub(crate) fn when_created_at(self, key: Vec<u8>, revision: i64) -> Txn {
        self.when(key, Vec::new(), Target::Create, Is::Equal, revision)
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

    /// Then: put `value` at `key`, on the lease the key is on (it must
    /// exist: compare its create revision first, or the put fails the
    /// transaction with an error).
    pub(crate) fn put_keeping_lease(mut self, key: Vec<u8>, value: Vec<u8>) -> Txn {
        self.success.push(RequestOp {
            request: Some(Op::RequestPut(PutRequest {
                key,
                value,
                ignore_lease: true,
                ..Default::default()
            })),
        });
        self
    }

    /// Then: `inner`, a transaction of its own inside this one, whose
    /// compares decide its own operations only (a failed one does not
    /// fail this transaction).
    pub(crate) fn then_if(mut self, inner: Txn) -> Txn {
        self.success.push(RequestOp {
            request: Some(Op::RequestTxn(TxnRequest {
                compare: inner.compare,
                success: inner.success,
                failure: inner.failure,
            })),
        });
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_passed_on_the_server_is_running_out() {
        for (status, out) in [
            (tonic::Status::deadline_exceeded("timeout"), true),
            (tonic::Status::cancelled("gone"), true),
            (tonic::Status::unknown("context deadline exceeded"), true),
            (tonic::Status::unknown("context canceled"), true),
            (tonic::Status::unknown("transport error"), false),
            (
                tonic::Status::unavailable("context deadline exceeded"),
                false,
            ),
        ] {
            assert_eq!(ran_out(&status), out, "{status:?}");
        }
    }

    #[test]
    fn only_refusals_for_want_of_a_token_authenticate_again() {
        for (status, wants) in [
            (
                tonic::Status::unauthenticated("etcdserver: invalid auth token"),
                true,
            ),
            (
                tonic::Status::invalid_argument("etcdserver: user name is empty"),
                true,
            ),
            (
                tonic::Status::invalid_argument("etcdserver: revision of auth store is old"),
                true,
            ),
            (
                tonic::Status::invalid_argument(
                    "etcdserver: authentication failed, invalid user ID or password",
                ),
                false,
            ),
            (
                tonic::Status::permission_denied("etcdserver: permission denied"),
                false,
            ),
            (
                tonic::Status::unavailable("etcdserver: invalid auth token"),
                false,
            ),
        ] {
            assert_eq!(wants_token(&status), wants, "{status:?}");
        }
    }
}
