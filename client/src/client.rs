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
    AcquireRequest, AcquireResponse, ForceReleaseRequest, ForceReleaseResponse, GetLockRequest, GetLockResponse,
    ListLocksRequest, ListLocksResponse, ListSigningKeysRequest, ListSigningKeysResponse, ReleaseRequest,
    ReleaseResponse, RenewRequest, RenewResponse, RetireSigningKeyRequest, RetireSigningKeyResponse,
    RotateSigningKeyRequest, RotateSigningKeyResponse, StatusRequest, StatusResponse,
};
use tonic::transport::{Channel, Endpoint};
use tracing::Instrument as _;

use crate::error::{ClientError, Reason};

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
}

#[derive(Default)]
struct State {
    channels: HashMap<String, Channel>,
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
            endpoint(e)?;
        }
        let max_attempts = 3 * endpoints.len() + 3;
        let inner = Inner {
            endpoints,
            state: Mutex::new(State::default()),
            call_timeout: Duration::from_secs(10),
            max_attempts,
        };
        Ok(Self { inner: Arc::new(inner) })
    }

    /// Sets the time one attempt may take beyond any requested wait. Call it
    /// before cloning: clones made earlier keep the old value.
    pub fn with_call_timeout(self, timeout: Duration) -> Self {
        let inner = Inner {
            endpoints: self.inner.endpoints.clone(),
            state: Mutex::new(State::default()),
            call_timeout: timeout,
            max_attempts: self.inner.max_attempts,
        };
        Self { inner: Arc::new(inner) }
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

    fn channel(&self, addr: &str) -> Result<Channel, ClientError> {
        let mut state = self.state();
        if let Some(c) = state.channels.get(addr) {
            return Ok(c.clone());
        }
        let c = endpoint(addr)?.connect_lazy();
        state.channels.insert(addr.to_string(), c.clone());
        Ok(c)
    }

    /// Runs `op` against the leader, following hints, within bounded attempts.
    async fn route<T, F, Fut>(&self, extra: Duration, op: F) -> Result<T, ClientError>
    where
        F: Fn(Channel) -> Fut,
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
        self.route(wait, |c| {
            let mut req = req.clone();
            req.wait_timeout_ms = wait_end.saturating_duration_since(crate::clock::now()).as_millis() as u64;
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

fn endpoint(addr: &str) -> Result<Endpoint, ClientError> {
    let uri = if addr.starts_with("http://") || addr.starts_with("https://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    };
    Endpoint::from_shared(uri)
        .map(|e| e.connect_timeout(Duration::from_secs(2)).tcp_nodelay(true))
        .map_err(|e| ClientError::Config(format!("bad endpoint {addr:?}: {e}")))
}
