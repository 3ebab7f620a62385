//! [`Client`]: endpoints, leader discovery and the calls of the lock API.
//!
//! These are single calls. [`Client::acquire`] (module `acquire`) builds on
//! them: retries of unknown outcomes, then a renewed [`crate::Lease`].
//!
//! Every call goes to the last node that answered as leader. When no leader
//! is known, or that node fails (its connection breaks, it has no quorum, it
//! is stopping), the call goes to every other endpoint at once, naming the
//! nodes it could not use in the `fencer-unreachable` header: a follower
//! that knows no leader, or only one of those, holds the call until a new
//! leader is known (the node that becomes leader serves it, the others answer
//! NOT_LEADER with its address, which is followed at once). A round in which
//! every call ended without an answer is followed by a short pause. A call
//! keeps trying until its timeout. Every operation of the API is safe to
//! resend: Acquire carries a request id (generated here when the caller gives
//! none, and kept across attempts), Renew and Release are idempotent.
//!
//! Connections are HTTP/2 with keep-alive pings, so a connection to a node
//! that vanished without closing it (a crashed host, a stopped process) fails
//! within [`KEEP_ALIVE_INTERVAL`] + [`KEEP_ALIVE_TIMEOUT`] instead of hanging
//! until the call's timeout.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencer_proto::UNREACHABLE_HEADER;

use fencer_proto::v1::admin_client::AdminClient;
use fencer_proto::v1::lock_client::LockClient;
use fencer_proto::v1::{
    AcquireRequest, AcquireResponse, AddLearnerRequest, ChangeMembershipRequest, ForceReleaseRequest,
    ForceReleaseResponse, GetLockRequest, GetLockResponse, ListLocksRequest, ListLocksResponse, ListSigningKeysRequest,
    ListSigningKeysResponse, MembershipResponse, ReleaseRequest, ReleaseResponse, RenewRequest, RenewResponse,
    RetireSigningKeyRequest, RetireSigningKeyResponse, RotateSigningKeyRequest, RotateSigningKeyResponse,
    StatusRequest, StatusResponse,
};
use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tracing::Instrument as _;

use crate::batch::{Answer, Batcher, Batching, Call};
use crate::error::{ClientError, Reason};

/// Bound on one TLS handshake with a coordinator.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on one TCP connect to a coordinator.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// An HTTP/2 ping goes out on every connection this often, even when idle…
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(1);
/// …and a connection whose ping is not answered within this is closed: its
/// calls fail at once and are routed elsewhere (a node that is alive answers
/// pings even when it is busy; a stopped or vanished one does not).
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(2);
/// How often one routed call is resent to the same node after an unknown
/// outcome before that node counts as unusable.
const MAX_RESENDS: usize = 2;
/// Nodes named in one `fencer-unreachable` header, at most.
const MAX_UNREACHABLE_NAMED: usize = 8;

/// The endpoint of `fencer dev`.
pub const DEFAULT_ENDPOINT: &str = "127.0.0.1:7420";

/// A fresh request id: 128 random bits as 32 hex digits.
pub fn new_request_id() -> String {
    let mut bytes = [0u8; 16];
    // The OS CSPRNG failing is not recoverable in any useful way here; fall
    // back to time-derived bits so the id is still unique in practice.
    if getrandom::fill(&mut bytes).is_err() {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        bytes = t.to_le_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A holder description for the audit log: `user@host/pid`.
pub fn default_holder() -> String {
    let user = std::env::var("USER").unwrap_or_else(|_| "unknown".into());
    let host =
        std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_string()).unwrap_or_else(|_| "localhost".into());
    format!("{user}@{host}/{}", std::process::id())
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("endpoints", &self.endpoints()).finish()
    }
}

/// A connection to a fencer cluster. Cheap to clone: clones share the
/// connections and the known leader.
///
/// Connections are driven by tasks on the tokio runtime that first used
/// them, so a client and its clones belong to one runtime: give each
/// runtime (each thread with its own runtime) a `Client` of its own.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    endpoints: Vec<String>,
    state: Mutex<State>,
    call_timeout: Duration,
    tls: Option<ClientTlsConfig>,
    auth: Auth,
    batching: Batching,
}

/// A connection to one node, with the caller's credentials on every call.
pub(crate) type Conn = InterceptedService<Channel, Auth>;

/// One node's connection and its batching queue (`None`: batching is off).
#[derive(Clone)]
pub(crate) struct Node {
    conn: Conn,
    batcher: Option<Batcher>,
}

impl Node {
    /// Sends `call`: through the batcher when it may share a request, or
    /// alone (batching off, a waiting acquire, or an attempt that carries
    /// its own metadata, which a batch could not).
    async fn send(self, attempt: Attempt, call: Call) -> Result<Answer, tonic::Status> {
        match self.batcher {
            Some(b) if call.batchable() && attempt.unreachable.is_none() => b.call(call).await,
            _ => call.send_alone(self.conn, &attempt).await,
        }
    }
}

/// Adds `authorization: Bearer …` to every call when a token is configured.
#[derive(Clone, Default)]
pub(crate) struct Auth(Option<MetadataValue<Ascii>>);

impl tonic::service::Interceptor for Auth {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            request.metadata_mut().insert("authorization", v.clone());
        }
        Ok(request)
    }
}

/// TLS towards the coordinators: the CA their certificates chain to and,
/// for mTLS, the client's certificate and key (PEM).
#[derive(Debug, Clone, Default)]
pub struct ClientTls {
    /// PEM of the CA(s) the coordinators' certificates chain to.
    pub ca_pem: Vec<u8>,
    /// PEM certificate chain and private key presented to the coordinator.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// The name to verify instead of each endpoint's host.
    pub domain_name: Option<String>,
}

impl ClientTls {
    /// Reads the PEM files: `ca` is required; `cert` and `key` go together.
    pub fn from_files(
        ca: &std::path::Path,
        cert: Option<&std::path::Path>,
        key: Option<&std::path::Path>,
    ) -> Result<Self, ClientError> {
        let read = |p: &std::path::Path| {
            std::fs::read(p).map_err(|e| ClientError::Config(format!("cannot read {}: {e}", p.display())))
        };
        let identity = match (cert, key) {
            (Some(c), Some(k)) => Some((read(c)?, read(k)?)),
            (None, None) => None,
            _ => {
                return Err(ClientError::Config(
                    "a client certificate needs its key, and a key its certificate".into(),
                ));
            }
        };
        Ok(Self { ca_pem: read(ca)?, identity, domain_name: None })
    }

    fn to_tonic(&self) -> ClientTlsConfig {
        let mut c =
            ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.ca_pem)).timeout(TLS_HANDSHAKE_TIMEOUT);
        if let Some((cert, key)) = &self.identity {
            c = c.identity(Identity::from_pem(cert, key));
        }
        if let Some(d) = &self.domain_name {
            c = c.domain_name(d.clone());
        }
        c
    }
}

#[derive(Default)]
struct State {
    nodes: HashMap<String, Node>,
    leader: Option<String>,
}

/// What one routed attempt carries besides its message: the nodes the call
/// could not use as leader (`fencer-unreachable`), so that a follower still
/// believing in one of them holds the call until it knows the next leader.
pub(crate) struct Attempt {
    unreachable: Option<MetadataValue<Ascii>>,
}

impl Attempt {
    pub(crate) fn new(unusable: &[String]) -> Self {
        let named: Vec<&str> = unusable.iter().take(MAX_UNREACHABLE_NAMED).map(String::as_str).collect();
        // An address that is not a valid header value is left out: the
        // follower then answers without waiting, which is only slower.
        let unreachable = (!named.is_empty()).then(|| named.join(",").parse().ok()).flatten();
        Self { unreachable }
    }

    /// `message` as a request carrying this attempt's metadata.
    pub(crate) fn request<M>(&self, message: M) -> tonic::Request<M> {
        let mut request = tonic::Request::new(message);
        if let Some(v) = &self.unreachable {
            request.metadata_mut().insert(UNREACHABLE_HEADER, v.clone());
        }
        request
    }
}

impl Client {
    /// A client of the cluster reachable at `endpoints` (`host:port`).
    pub fn new<I, S>(endpoints: I) -> Result<Self, ClientError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let endpoints: Vec<String> =
            endpoints.into_iter().map(Into::into).map(|e| e.trim().to_string()).filter(|e| !e.is_empty()).collect();
        if endpoints.is_empty() {
            return Err(ClientError::Config("no endpoints given".into()));
        }
        for e in &endpoints {
            endpoint(e, None)?;
        }
        let inner = Inner {
            endpoints,
            state: Mutex::new(State::default()),
            call_timeout: Duration::from_secs(10),
            tls: None,
            auth: Auth::default(),
            batching: Batching::default(),
        };
        Ok(Self { inner: Arc::new(inner) })
    }

    fn rebuilt(&self, change: impl FnOnce(&mut Inner)) -> Self {
        let mut inner = Inner {
            endpoints: self.inner.endpoints.clone(),
            state: Mutex::new(State::default()),
            call_timeout: self.inner.call_timeout,
            tls: self.inner.tls.clone(),
            auth: self.inner.auth.clone(),
            batching: self.inner.batching,
        };
        change(&mut inner);
        Self { inner: Arc::new(inner) }
    }

    /// Sets the time one call may take beyond any requested wait, every
    /// resend and the search for a new leader included (default 10 s). Call
    /// it before cloning: clones made earlier keep the old value.
    pub fn with_call_timeout(self, timeout: Duration) -> Self {
        self.rebuilt(|i| i.call_timeout = timeout)
    }

    /// Sets how calls in flight at once share requests (module docs of
    /// `batch`; on by default with [`crate::DEFAULT_BATCHING`], 2): once `max_in_flight` RPCs are
    /// outstanding on a node's connection, the Acquire (without a wait),
    /// Renew and Release calls made meanwhile leave together as one Batch
    /// request when one of them returns. A client with fewer calls in
    /// flight sends each alone, as before. 0 turns batching off: every call
    /// is its own RPC, however many are in flight. Call it before cloning.
    pub fn with_batching(self, max_in_flight: usize) -> Self {
        self.rebuilt(|i| i.batching.max_in_flight = max_in_flight)
    }

    /// Speaks TLS (https) to every endpoint, verifying the coordinators'
    /// certificates against `tls.ca_pem` and presenting the client
    /// certificate, if any (mTLS). Call it before cloning.
    pub fn with_tls(self, tls: &ClientTls) -> Result<Self, ClientError> {
        let config = tls.to_tonic();
        for e in &self.inner.endpoints {
            endpoint(e, Some(&config))?;
        }
        Ok(self.rebuilt(|i| i.tls = Some(config)))
    }

    /// Sends `authorization: Bearer <token>` with every call (a tenant's
    /// bearer token; docs/security.md). Use TLS with it: the token is a
    /// password. Call it before cloning.
    pub fn with_bearer_token(self, token: &str) -> Result<Self, ClientError> {
        let value: MetadataValue<Ascii> = format!("Bearer {token}")
            .parse()
            .map_err(|_| ClientError::Config("the bearer token must be printable ASCII".into()))?;
        Ok(self.rebuilt(|i| i.auth = Auth(Some(value))))
    }

    /// The configured endpoints.
    pub fn endpoints(&self) -> &[String] {
        &self.inner.endpoints
    }

    pub(crate) fn call_timeout(&self) -> Duration {
        self.inner.call_timeout
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn channel(&self, addr: &str) -> Result<Conn, ClientError> {
        self.node(addr).map(|n| n.conn)
    }

    /// The connection to `addr` and its batcher, made on first use.
    fn node(&self, addr: &str) -> Result<Node, ClientError> {
        let mut state = self.state();
        if let Some(n) = state.nodes.get(addr) {
            return Ok(n.clone());
        }
        let conn =
            InterceptedService::new(endpoint(addr, self.inner.tls.as_ref())?.connect_lazy(), self.inner.auth.clone());
        let batching = self.inner.batching;
        let batcher = (batching.max_in_flight > 0).then(|| Batcher::start(conn.clone(), batching));
        let node = Node { conn, batcher };
        state.nodes.insert(addr.to_string(), node.clone());
        Ok(node)
    }

    /// Runs `op` against the leader until it answers or the call's budget
    /// (`call_timeout + extra` from now) is spent.
    ///
    /// The known leader is asked alone. When no leader is known, or the
    /// leader fails (its connection breaks, it has no quorum, it is
    /// stopping), every other endpoint is asked at once: followers hold the
    /// call until they know a usable leader (the request names the nodes
    /// this call found unusable), the new leader serves it, and a hint to a
    /// node not asked yet is followed at once. Only when every call of a
    /// round ended without an answer does the client pause before the next.
    /// Resending is always safe: Acquire keeps its request id (I7), Renew and
    /// Release are idempotent.
    async fn route<T, F, Fut>(&self, extra: Duration, op: F) -> Result<T, ClientError>
    where
        F: Fn(Node, Attempt) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let budget = self.inner.call_timeout + extra;
        let deadline = tokio::time::Instant::now() + budget;
        let endpoints = &self.inner.endpoints;
        // Nodes this call found unusable as leader, in the order found.
        let mut unusable: Vec<String> = Vec::new();
        let mut in_flight: Vec<String> = Vec::new();
        let mut resends = 0usize;
        let call = |addr: String, unusable: &[String]| {
            let attempt = Attempt::new(unusable);
            let conn = self.node(&addr);
            let op = &op;
            async move {
                let result = match conn {
                    Ok(c) => {
                        op(c, attempt).await.map(tonic::Response::into_inner).map_err(|s| ClientError::from_status(&s))
                    }
                    // A hint naming an address that is not one: nobody to ask there.
                    Err(e) => {
                        Err(ClientError::Unavailable { reason: None, message: e.to_string(), metadata: HashMap::new() })
                    }
                };
                (addr, result)
            }
        };
        let mut calls = FuturesUnordered::new();
        let known = self.state().leader.clone();
        let first: Vec<String> = match known {
            Some(leader) => vec![leader],
            None => endpoints.clone(),
        };
        for addr in first {
            in_flight.push(addr.clone());
            calls.push(call(addr, &unusable));
        }
        let mut round = 0usize;
        let mut last =
            ClientError::Unavailable { reason: None, message: "no endpoint answered".into(), metadata: HashMap::new() };
        loop {
            if calls.is_empty() {
                // Every call of this round ended without a usable answer.
                let pause = backoff(round);
                if tokio::time::Instant::now() + pause >= deadline {
                    return Err(last);
                }
                tokio::time::sleep(pause).await;
                round += 1;
                // Every endpoint again: a node that failed may be back.
                for addr in endpoints {
                    in_flight.push(addr.clone());
                    calls.push(call(addr.clone(), &unusable));
                }
                continue;
            }
            let Ok(Some((addr, result))) = tokio::time::timeout_at(deadline, calls.next()).await else {
                return Err(ClientError::Unavailable {
                    reason: None,
                    message: format!("no node answered as leader within {budget:?} (last: {last})"),
                    metadata: HashMap::new(),
                });
            };
            if let Some(i) = in_flight.iter().position(|a| *a == addr) {
                in_flight.swap_remove(i);
            }
            let err = match result {
                Ok(answer) => {
                    tracing::debug!(%addr, "answered");
                    self.state().leader = Some(addr);
                    return Ok(answer);
                }
                Err(e) => e,
            };
            tracing::debug!(%addr, error = %err, "call failed");
            match &err {
                ClientError::Refused { .. } | ClientError::Config(_) => return Err(err),
                ClientError::Unavailable { reason: Some(Reason::NotLeader), .. } => match leader_hint(&err) {
                    Some(hint) if hint != addr && !unusable.contains(&hint) => {
                        self.state().leader = Some(hint.clone());
                        if !in_flight.contains(&hint) {
                            in_flight.push(hint.clone());
                            calls.push(call(hint, &unusable));
                        }
                    }
                    // The node held the call while it waited for a leader,
                    // and knows none this call can use.
                    _ => {}
                },
                ClientError::Unavailable { reason: Some(Reason::OutcomeUnknown | Reason::LeaderChanged), .. }
                    if resends < MAX_RESENDS =>
                {
                    // The write may have committed, or a parked call lost its
                    // leader: the same call again learns the outcome.
                    resends += 1;
                    in_flight.push(addr.clone());
                    calls.push(call(addr, &unusable));
                }
                ClientError::Unavailable { .. } => {
                    // Unreachable, without a quorum, stopping, or its outcomes
                    // stay unknown: ask every other node at once.
                    {
                        let mut st = self.state();
                        if st.leader.as_deref() == Some(addr.as_str()) {
                            st.leader = None;
                        }
                    }
                    if !unusable.contains(&addr) {
                        unusable.push(addr);
                    }
                    for e in endpoints {
                        if !in_flight.contains(e) && !unusable.contains(e) {
                            in_flight.push(e.clone());
                            calls.push(call(e.clone(), &unusable));
                        }
                    }
                }
            }
            last = err;
        }
    }

    /// One Acquire, routed to the leader. Transport failures are resent with
    /// the same request id (I7), each asking to wait only until `wait_end`;
    /// an unknown outcome the server reports is returned to the caller, which
    /// retries (module `acquire`).
    pub(crate) async fn acquire_once(
        &self,
        req: AcquireRequest,
        wait_end: tokio::time::Instant,
    ) -> Result<AcquireResponse, ClientError> {
        let wait = wait_end.saturating_duration_since(crate::clock::now());
        let span =
            tracing::debug_span!("fencer_call", op = "acquire", resource = %req.resource, request_id = %req.request_id);
        // The first send asks for the wait the request says (the whole wait
        // on an acquire's first attempt: `wait(5 min)` asks for exactly the
        // server's maximum, not a millisecond less); a resend for what is
        // left until `wait_end`.
        let first = std::sync::atomic::AtomicBool::new(true);
        self.route(wait, |c, attempt| {
            let mut req = req.clone();
            if !first.swap(false, std::sync::atomic::Ordering::Relaxed) {
                req.wait_timeout_ms = wait_end.saturating_duration_since(crate::clock::now()).as_millis() as u64;
            }
            async move { c.send(attempt, Call::Acquire(req)).await?.into_acquire().map(tonic::Response::new) }
        })
        .instrument(span)
        .await
    }

    /// Renews a lease.
    pub async fn renew(&self, resource: &str, lease_id: &str) -> Result<RenewResponse, ClientError> {
        let req = RenewRequest { resource: resource.into(), lease_id: lease_id.into() };
        self.route(Duration::ZERO, |c, attempt| {
            let call = Call::Renew(req.clone());
            async move { c.send(attempt, call).await?.into_renew().map(tonic::Response::new) }
        })
        .instrument(tracing::debug_span!("fencer_call", op = "renew", resource))
        .await
    }

    /// Releases a lease.
    pub async fn release(&self, resource: &str, lease_id: &str) -> Result<ReleaseResponse, ClientError> {
        let req = ReleaseRequest { resource: resource.into(), lease_id: lease_id.into() };
        self.route(Duration::ZERO, |c, attempt| {
            let call = Call::Release(req.clone());
            async move { c.send(attempt, call).await?.into_release().map(tonic::Response::new) }
        })
        .instrument(tracing::debug_span!("fencer_call", op = "release", resource))
        .await
    }

    /// A linearizable view of one lock.
    pub async fn get(&self, resource: &str) -> Result<GetLockResponse, ClientError> {
        let req = GetLockRequest { resource: resource.into() };
        self.route(Duration::ZERO, |c, attempt| {
            let req = attempt.request(req.clone());
            async move { LockClient::new(c.conn).get_lock(req).await }
        })
        .await
    }

    /// One page of held locks under `prefix`.
    pub async fn list(&self, prefix: &str, page_size: u32, page_token: &str) -> Result<ListLocksResponse, ClientError> {
        let req = ListLocksRequest { prefix: prefix.into(), page_size, page_token: page_token.into() };
        self.route(Duration::ZERO, |c, attempt| {
            let req = attempt.request(req.clone());
            async move { LockClient::new(c.conn).list_locks(req).await }
        })
        .await
    }

    /// Frees a lock whoever holds it (operator action, audited).
    pub async fn force_release(
        &self,
        resource: &str,
        caller: &str,
        reason: &str,
    ) -> Result<ForceReleaseResponse, ClientError> {
        let req = ForceReleaseRequest { resource: resource.into(), caller: caller.into(), reason: reason.into() };
        self.route(Duration::ZERO, |c, attempt| {
            let req = attempt.request(req.clone());
            async move { AdminClient::new(c.conn).force_release(req).await }
        })
        .await
    }

    /// The token-signing keys registered in the cluster (public halves),
    /// as the leader sees them.
    pub async fn signing_keys(&self) -> Result<ListSigningKeysResponse, ClientError> {
        self.route(Duration::ZERO, |c, attempt| {
            let req = attempt.request(ListSigningKeysRequest {});
            async move { AdminClient::new(c.conn).list_signing_keys(req).await }
        })
        .await
    }

    /// Ends signing key `kid`'s validity `after` from now (through the leader).
    pub async fn retire_signing_key(
        &self,
        kid: &str,
        after: Duration,
        force: bool,
    ) -> Result<RetireSigningKeyResponse, ClientError> {
        let req = RetireSigningKeyRequest { kid: kid.into(), after_ms: after.as_millis() as u64, force };
        self.route(Duration::ZERO, |c, attempt| {
            let req = attempt.request(req.clone());
            async move { AdminClient::new(c.conn).retire_signing_key(req).await }
        })
        .await
    }

    /// Has the node at `addr` (expected to be node `node_id`; 0: any) make
    /// and register a new signing key valid from `activate_in` after now.
    /// Asked directly: a key is made on the node that keeps it.
    pub async fn rotate_signing_key_on(
        &self,
        addr: &str,
        node_id: u64,
        activate_in: Duration,
    ) -> Result<RotateSigningKeyResponse, ClientError> {
        let channel = self.channel(addr)?;
        let req = RotateSigningKeyRequest { node_id, activate_in_ms: activate_in.as_millis() as u64 };
        // Making the key, then committing its registration.
        let limit = self.inner.call_timeout * 2;
        match tokio::time::timeout(limit, AdminClient::new(channel).rotate_signing_key(req)).await {
            Ok(Ok(r)) => Ok(r.into_inner()),
            Ok(Err(status)) => Err(ClientError::from_status(&status)),
            Err(_) => Err(ClientError::Unavailable {
                reason: None,
                message: format!("{addr} did not answer within {limit:?}; the key may have been made"),
                metadata: HashMap::new(),
            }),
        }
    }

    /// The status of one node, asked directly (no leader routing).
    pub async fn node_status(&self, addr: &str) -> Result<StatusResponse, ClientError> {
        let channel = self.channel(addr)?;
        match tokio::time::timeout(self.inner.call_timeout, AdminClient::new(channel).status(StatusRequest {})).await {
            Ok(Ok(r)) => Ok(r.into_inner()),
            Ok(Err(status)) => Err(ClientError::from_status(&status)),
            Err(_) => Err(ClientError::Unavailable {
                reason: None,
                message: format!("{addr} did not answer"),
                metadata: HashMap::new(),
            }),
        }
    }
}

impl Client {
    /// Adds a learner, asking the node at `leader_addr` (operator action).
    pub async fn add_learner(&self, leader_addr: &str, id: u64, addr: &str) -> Result<MembershipResponse, ClientError> {
        let mut admin = AdminClient::new(self.channel(leader_addr)?);
        let req = AddLearnerRequest { node_id: id, addr: addr.into() };
        match tokio::time::timeout(self.inner.call_timeout * 3, admin.add_learner(req)).await {
            Ok(r) => r.map(tonic::Response::into_inner).map_err(|s| ClientError::from_status(&s)),
            Err(_) => Err(ClientError::Unavailable {
                reason: None,
                message: format!("{leader_addr} did not answer"),
                metadata: HashMap::new(),
            }),
        }
    }

    /// Replaces the voter set, asking the node at `leader_addr` (operator action).
    pub async fn change_membership(
        &self,
        leader_addr: &str,
        voters: Vec<u64>,
        retain: bool,
    ) -> Result<MembershipResponse, ClientError> {
        let mut admin = AdminClient::new(self.channel(leader_addr)?);
        let req = ChangeMembershipRequest { voters, retain };
        match tokio::time::timeout(self.inner.call_timeout * 3, admin.change_membership(req)).await {
            Ok(r) => r.map(tonic::Response::into_inner).map_err(|s| ClientError::from_status(&s)),
            Err(_) => Err(ClientError::Unavailable {
                reason: None,
                message: format!("{leader_addr} did not answer"),
                metadata: HashMap::new(),
            }),
        }
    }
}

fn leader_hint(err: &ClientError) -> Option<String> {
    match err {
        ClientError::Unavailable { metadata, .. } => metadata.get("leader_addr").cloned(),
        _ => None,
    }
}

/// The pause after a round in which no node answered: 25 ms doubling to at
/// most 400 ms. Followers hold calls during an election, so rounds end early
/// only when nodes refuse connections or the whole cluster has no leader.
fn backoff(attempt: usize) -> Duration {
    Duration::from_millis((25u64 << attempt.min(4)).min(400))
}

/// The endpoint of `addr` (`host:port`, or a URL): https with `tls`; a
/// scheme that contradicts the TLS setting is refused rather than guessed.
fn endpoint(addr: &str, tls: Option<&ClientTlsConfig>) -> Result<Endpoint, ClientError> {
    let uri = match (addr.split_once("://").map(|(scheme, _)| scheme), tls) {
        (Some("http"), None) | (Some("https"), Some(_)) => addr.to_string(),
        (Some("https"), None) => {
            return Err(ClientError::Config(format!(
                "endpoint {addr:?} is https: give the CA its certificate chains to (--ca / FENCER_CA)"
            )));
        }
        (Some("http"), Some(_)) => {
            return Err(ClientError::Config(format!("endpoint {addr:?} is plain http, but TLS is configured")));
        }
        (Some(other), _) => return Err(ClientError::Config(format!("endpoint {addr:?}: unknown scheme {other:?}"))),
        (None, None) => format!("http://{addr}"),
        (None, Some(_)) => format!("https://{addr}"),
    };
    let e = Endpoint::from_shared(uri)
        .map(|e| {
            e.connect_timeout(CONNECT_TIMEOUT)
                .tcp_nodelay(true)
                .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
                .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
                .keep_alive_while_idle(true)
        })
        .map_err(|e| ClientError::Config(format!("bad endpoint {addr:?}: {e}")))?;
    match tls {
        None => Ok(e),
        Some(t) => e.tls_config(t.clone()).map_err(|e| ClientError::Config(format!("TLS for {addr:?}: {e}"))),
    }
}
