//! [`Client`]: endpoints, leader discovery and the calls of the lock API.
//!
//! These are single calls. [`Client::acquire`] (module `acquire`) builds on
//! them: retries of unknown outcomes, then a renewed [`crate::Lease`].
//!
//! Every call goes to the last node that answered as leader, else to the
//! endpoints in order. NOT_LEADER with an address moves the call to that
//! address; NOT_LEADER without one (an election is running) and transport
//! failures move it to the next endpoint after a short pause. The number of
//! attempts is bounded. Every operation of the API is safe to resend: Acquire
//! carries a request id (generated here when the caller gives none, and kept
//! across attempts), Renew and Release are idempotent.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencer_proto::v1::admin_client::AdminClient;
use fencer_proto::v1::lock_client::LockClient;
use fencer_proto::v1::{
    AcquireRequest, AcquireResponse, AddLearnerRequest, ChangeMembershipRequest, ForceReleaseRequest,
    ForceReleaseResponse, GetLockRequest, GetLockResponse, ListLocksRequest, ListLocksResponse, ListSigningKeysRequest,
    ListSigningKeysResponse, MembershipResponse, ReleaseRequest, ReleaseResponse, RenewRequest, RenewResponse,
    RetireSigningKeyRequest, RetireSigningKeyResponse, RotateSigningKeyRequest, RotateSigningKeyResponse,
    StatusRequest, StatusResponse,
};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tracing::Instrument as _;

use crate::error::{ClientError, Reason};

/// Bound on one TLS handshake with a coordinator.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

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
    max_attempts: usize,
    tls: Option<ClientTlsConfig>,
    auth: Auth,
}

/// A connection to one node, with the caller's credentials on every call.
pub(crate) type Conn = InterceptedService<Channel, Auth>;

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
    channels: HashMap<String, Conn>,
    leader: Option<String>,
    /// The endpoint to try first when no leader is known.
    cursor: usize,
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
        let max_attempts = 3 * endpoints.len() + 3;
        let inner = Inner {
            endpoints,
            state: Mutex::new(State::default()),
            call_timeout: Duration::from_secs(10),
            max_attempts,
            tls: None,
            auth: Auth::default(),
        };
        Ok(Self { inner: Arc::new(inner) })
    }

    fn rebuilt(&self, change: impl FnOnce(&mut Inner)) -> Self {
        let mut inner = Inner {
            endpoints: self.inner.endpoints.clone(),
            state: Mutex::new(State::default()),
            call_timeout: self.inner.call_timeout,
            max_attempts: self.inner.max_attempts,
            tls: self.inner.tls.clone(),
            auth: self.inner.auth.clone(),
        };
        change(&mut inner);
        Self { inner: Arc::new(inner) }
    }

    /// Sets the time one attempt may take beyond any requested wait. Call it
    /// before cloning: clones made earlier keep the old value.
    pub fn with_call_timeout(self, timeout: Duration) -> Self {
        self.rebuilt(|i| i.call_timeout = timeout)
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
        let mut state = self.state();
        if let Some(c) = state.channels.get(addr) {
            return Ok(c.clone());
        }
        let c =
            InterceptedService::new(endpoint(addr, self.inner.tls.as_ref())?.connect_lazy(), self.inner.auth.clone());
        state.channels.insert(addr.to_string(), c.clone());
        Ok(c)
    }

    /// Runs `op` against the leader, following hints, within bounded attempts.
    async fn route<T, F, Fut>(&self, extra: Duration, op: F) -> Result<T, ClientError>
    where
        F: Fn(Conn) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        // Start where the last failure left off, so a dead node is not the
        // first one every call tries.
        let (mut cursor, mut target) = {
            let st = self.state();
            (st.cursor, st.leader.clone())
        };
        let mut failed_in_round = 0usize;
        let mut round = 0usize;
        let mut last =
            ClientError::Unavailable { reason: None, message: "no endpoint tried".into(), metadata: HashMap::new() };
        let endpoints = &self.inner.endpoints;
        let call_timeout = self.inner.call_timeout;
        for attempt in 0..self.inner.max_attempts {
            let addr = match target.take() {
                Some(a) => a,
                None => {
                    let a = endpoints[cursor % endpoints.len()].clone();
                    cursor = cursor.wrapping_add(1);
                    a
                }
            };
            let channel = self.channel(&addr)?;
            let result = tokio::time::timeout(call_timeout + extra, op(channel)).await;
            let err = match result {
                Ok(Ok(resp)) => {
                    tracing::debug!(attempt, %addr, "answered");
                    self.state().leader = Some(addr);
                    return Ok(resp.into_inner());
                }
                Ok(Err(status)) => ClientError::from_status(&status),
                Err(_) => ClientError::Unavailable {
                    reason: None,
                    message: format!("{addr} did not answer within {:?}", call_timeout + extra),
                    metadata: HashMap::new(),
                },
            };
            tracing::debug!(attempt, %addr, error = %err, "call failed");
            match &err {
                ClientError::Refused { .. } => return Err(err),
                ClientError::Unavailable { reason: Some(Reason::NotLeader), .. } => {
                    let hint = leader_hint(&err);
                    self.state().leader = hint.clone();
                    if hint.is_none() || hint.as_deref() == Some(addr.as_str()) {
                        // An election is running: ask again soon.
                        tokio::time::sleep(backoff(attempt.min(3))).await;
                    } else {
                        target = hint;
                    }
                }
                ClientError::Unavailable { reason: Some(Reason::OutcomeUnknown | Reason::LeaderChanged), .. } => {
                    // The server could not tell; the caller decides (same request id).
                    return Err(err);
                }
                ClientError::Unavailable { .. } => {
                    // This node is unreachable: try the other endpoints at
                    // once; pause only after a whole round failed.
                    {
                        let mut st = self.state();
                        st.leader = None;
                        st.cursor = cursor;
                    }
                    failed_in_round += 1;
                    if failed_in_round >= endpoints.len() {
                        failed_in_round = 0;
                        tokio::time::sleep(backoff(round)).await;
                        round += 1;
                    }
                }
                ClientError::Config(_) => return Err(err),
            }
            last = err;
        }
        Err(last)
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
        self.route(wait, |c| {
            let mut req = req.clone();
            if !first.swap(false, std::sync::atomic::Ordering::Relaxed) {
                req.wait_timeout_ms = wait_end.saturating_duration_since(crate::clock::now()).as_millis() as u64;
            }
            async move { LockClient::new(c).acquire(req).await }
        })
        .instrument(span)
        .await
    }

    /// Renews a lease.
    pub async fn renew(&self, resource: &str, lease_id: &str) -> Result<RenewResponse, ClientError> {
        let req = RenewRequest { resource: resource.into(), lease_id: lease_id.into() };
        self.route(Duration::ZERO, |c| {
            let req = req.clone();
            async move { LockClient::new(c).renew(req).await }
        })
        .instrument(tracing::debug_span!("fencer_call", op = "renew", resource))
        .await
    }

    /// Releases a lease.
    pub async fn release(&self, resource: &str, lease_id: &str) -> Result<ReleaseResponse, ClientError> {
        let req = ReleaseRequest { resource: resource.into(), lease_id: lease_id.into() };
        self.route(Duration::ZERO, |c| {
            let req = req.clone();
            async move { LockClient::new(c).release(req).await }
        })
        .instrument(tracing::debug_span!("fencer_call", op = "release", resource))
        .await
    }

    /// A linearizable view of one lock.
    pub async fn get(&self, resource: &str) -> Result<GetLockResponse, ClientError> {
        let req = GetLockRequest { resource: resource.into() };
        self.route(Duration::ZERO, |c| {
            let req = req.clone();
            async move { LockClient::new(c).get_lock(req).await }
        })
        .await
    }

    /// One page of held locks under `prefix`.
    pub async fn list(&self, prefix: &str, page_size: u32, page_token: &str) -> Result<ListLocksResponse, ClientError> {
        let req = ListLocksRequest { prefix: prefix.into(), page_size, page_token: page_token.into() };
        self.route(Duration::ZERO, |c| {
            let req = req.clone();
            async move { LockClient::new(c).list_locks(req).await }
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
        self.route(Duration::ZERO, |c| {
            let req = req.clone();
            async move { AdminClient::new(c).force_release(req).await }
        })
        .await
    }

    /// The token-signing keys registered in the cluster (public halves),
    /// as the leader sees them.
    pub async fn signing_keys(&self) -> Result<ListSigningKeysResponse, ClientError> {
        self.route(
            Duration::ZERO,
            |c| async move { AdminClient::new(c).list_signing_keys(ListSigningKeysRequest {}).await },
        )
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
        self.route(Duration::ZERO, |c| {
            let req = req.clone();
            async move { AdminClient::new(c).retire_signing_key(req).await }
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

/// 25 ms doubling to at most 400 ms: short enough to find a new leader
/// within a heartbeat or two of its election.
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
        .map(|e| e.connect_timeout(Duration::from_secs(2)).tcp_nodelay(true))
        .map_err(|e| ClientError::Config(format!("bad endpoint {addr:?}: {e}")))?;
    match tls {
        None => Ok(e),
        Some(t) => e.tls_config(t.clone()).map_err(|e| ClientError::Config(format!("TLS for {addr:?}: {e}"))),
    }
}
