//! The lock operations, shared by the gRPC and JSON front ends: validation,
//! leadership checks, proposing through raft, parking waiters, linearizable
//! reads. Errors are [`LockError`]; `api::errors` maps them to statuses.

use std::sync::Arc;
use std::time::Duration;

use openraft::ReadPolicy;
use openraft::errors::{ClientWriteError, ForwardReason, ForwardToLeader, RaftError};
use tokio::task::JoinHandle;
use tracing::Instrument as _;

use crate::clock::Clock;
use crate::hot::{HotOrder, HotResource, HotResources, HotTracker};
use crate::lease_clock::LeaseClock;
use crate::log_level::LogControlHandle;
use crate::metrics::{HealthGauges, Metrics};
use crate::policy::Policy;
use crate::raft::{RaftHandle, TypeConfig};
use crate::state_machine::{AcquireCmd, CancelOutcome, Command, Grant, LogCommand, Outcome, Rejection};
use crate::store::StateMachineStore;
use crate::types::{
    AuditText, FencingToken, Holder, InvalidField, LeaseId, NodeId, RequestId, ResourceName, check_resource_chars,
};
use crate::waiters::{ParkedCalls, Wake};

/// Why a lock operation did not succeed. Keeps "refused" (the request was
/// answered) apart from "unavailable" (the outcome may be unknown).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LockError {
    /// A field broke a rule.
    #[error("invalid argument: {0}")]
    Invalid(#[from] InvalidField),
    /// The lock is held and the request did not wait.
    #[error("lock is held by {holder:?} (token {token})")]
    LockHeld {
        /// The holder's description.
        holder: String,
        /// The holder's token.
        token: FencingToken,
    },
    /// The wait ended without the lock; the queue slot was cancelled.
    #[error("wait timed out; the queue slot was cancelled")]
    WaitTimeout,
    /// The wait queue is full.
    #[error("too many waiters (limit {limit})")]
    TooManyWaiters {
        /// The limit.
        limit: u64,
    },
    /// The lease is not the current holder.
    #[error("lease is not the current holder")]
    NotHolder,
    /// The lease expired or was force-released.
    #[error("lease expired")]
    LeaseExpired,
    /// The request id was already used for another resource.
    #[error("request id was already used for another resource; use a fresh request id per attempt")]
    RequestIdReused,
    /// This node is not the leader.
    #[error("not the leader{}", leader_addr.as_ref().map(|a| format!("; the leader is {a}")).unwrap_or_else(|| "; no leader is known".into()))]
    NotLeader {
        /// The leader's id, if known.
        leader_id: Option<NodeId>,
        /// The leader's address, if known.
        leader_addr: Option<String>,
    },
    /// The leader cannot reach a majority.
    #[error("the leader cannot reach a majority of the cluster")]
    NoQuorum,
    /// The write may or may not have committed; retry with the same request id.
    #[error("outcome unknown: {0}")]
    Unknown(String),
    /// Leadership moved while the call was parked; retry with the same request id.
    #[error("leadership changed while the call was waiting; retry with the same request id")]
    LeaderChanged,
    /// The node is shutting down.
    #[error("the node is shutting down")]
    ShuttingDown,
    /// No signing key has this key id.
    #[error("no signing key has the key id {0:?} (fencer keys list shows them)")]
    UnknownSigningKey(String),
    /// A signing-key change was refused; the message says why.
    #[error("signing key change refused: {0}")]
    SigningKeyRefused(String),
    /// A bug or a storage failure.
    #[error("internal error: {0}")]
    Internal(String),
    /// The caller's credentials are missing or name no tenant.
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// The caller's tenant may not do this to this resource.
    #[error("tenant {tenant:?} has no {permission} permission on {resource:?}")]
    PermissionDenied {
        /// The tenant.
        tenant: String,
        /// acquire, read or admin.
        permission: &'static str,
        /// The resource (or what else was asked for).
        resource: String,
    },
    /// A tenant limit was reached.
    #[error("tenant {tenant:?} reached its limit {limit} = {value}")]
    TenantLimit {
        /// The tenant ("" when only the state machine knew).
        tenant: String,
        /// max_active_locks, max_waiters or max_requests_per_sec.
        limit: &'static str,
        /// The limit's value.
        value: u64,
    },
}

impl LockError {
    /// The machine-readable reason (google.rpc.ErrorInfo.reason).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Invalid(_) => "INVALID_ARGUMENT",
            Self::LockHeld { .. } => "LOCK_HELD",
            Self::WaitTimeout => "WAIT_TIMEOUT",
            Self::TooManyWaiters { .. } => "TOO_MANY_WAITERS",
            Self::NotHolder => "NOT_HOLDER",
            Self::LeaseExpired => "LEASE_EXPIRED",
            Self::RequestIdReused => "REQUEST_ID_REUSED",
            Self::NotLeader { .. } => "NOT_LEADER",
            Self::NoQuorum => "NO_QUORUM",
            Self::Unknown(_) => "OUTCOME_UNKNOWN",
            Self::LeaderChanged => "LEADER_CHANGED",
            Self::ShuttingDown => "SHUTTING_DOWN",
            Self::UnknownSigningKey(_) => "UNKNOWN_SIGNING_KEY",
            Self::SigningKeyRefused(_) => "SIGNING_KEY_REFUSED",
            Self::Internal(_) => "INTERNAL",
            Self::Unauthenticated(_) => "UNAUTHENTICATED",
            Self::PermissionDenied { .. } => "PERMISSION_DENIED",
            Self::TenantLimit { .. } => "TENANT_LIMIT",
        }
    }

    /// The outcome label for metrics (DESIGN §6).
    pub fn metric_outcome(&self) -> &'static str {
        match self {
            Self::Invalid(_)
            | Self::RequestIdReused
            | Self::Unauthenticated(_)
            | Self::PermissionDenied { .. }
            | Self::UnknownSigningKey(_)
            | Self::SigningKeyRefused(_) => "invalid",
            Self::LockHeld { .. } | Self::TooManyWaiters { .. } | Self::TenantLimit { .. } => "conflict",
            Self::WaitTimeout => "timeout",
            Self::NotHolder | Self::LeaseExpired => "not_holder",
            Self::NotLeader { .. } | Self::NoQuorum | Self::LeaderChanged | Self::ShuttingDown => "unavailable",
            Self::Unknown(_) | Self::Internal(_) => "unknown",
        }
    }
}

/// An acquire request, before validation.
#[derive(Debug, Clone, Default)]
pub struct AcquireRequest {
    /// The lock.
    pub resource: String,
    /// The caller's id for this attempt; empty → generated.
    pub request_id: String,
    /// Lease length; 0 → default.
    pub ttl_ms: u64,
    /// 0 → try once.
    pub wait_timeout_ms: u64,
    /// Who asks.
    pub holder: String,
    /// The caller's tenant limits, checked at apply (module `tenants`).
    pub quota: Option<crate::state_machine::Quota>,
}

/// A granted lease with the leader's expiry estimate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Granted {
    /// The grant.
    pub grant: Grant,
    /// The request id it is recorded under.
    pub request_id: RequestId,
    /// Wall-clock estimate of the server-side expiry.
    pub expires_at_unix_ms: u64,
    /// The grant signed by this leader (`v1.<claims>.<sig>`, DESIGN P7);
    /// `None` when it has no registered signing key valid now.
    pub signed_token: Option<String>,
}

/// A successful renewal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Renewed {
    /// The lease's token.
    pub token: FencingToken,
    /// Lease length.
    pub ttl_ms: u64,
    /// Wall-clock estimate of the server-side expiry.
    pub expires_at_unix_ms: u64,
}

/// A successful release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    /// The lease no longer holds the lock.
    pub released: bool,
    /// This call is the one that freed it.
    pub was_holder: bool,
}

/// The view of one lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockView {
    /// The lock.
    pub resource: ResourceName,
    /// Whether a lease holds it.
    pub held: bool,
    /// The holder's description.
    pub holder: String,
    /// The holder's token (0 when free).
    pub token: FencingToken,
    /// Queued requests.
    pub waiters: u32,
    /// Remaining lease time on the leader's clock.
    pub remaining_ttl_ms: u64,
    /// Lease length.
    pub ttl_ms: u64,
}

/// The result of a force-release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForceReleased {
    /// Token of the freed lease, if the lock was held.
    pub released_token: Option<FencingToken>,
    /// Index of the log entry.
    pub log_index: u64,
}

pub(crate) struct ServiceInner {
    pub(crate) raft: RaftHandle,
    pub(crate) sm: StateMachineStore,
    pub(crate) leases: Arc<LeaseClock>,
    pub(crate) parked: Arc<ParkedCalls>,
    pub(crate) policy: Policy,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) clock: Clock,
    pub(crate) cluster: Arc<crate::bootstrap::ClusterId>,
    /// The longest election timeout: the quorum lease and the health bound.
    pub(crate) election_timeout: Duration,
    /// Set when the node starts stopping: calls cut off by the stop are not
    /// "callers that went away", so their queue slots are left for the
    /// retries on the next leader to reclaim.
    pub(crate) stopping: std::sync::atomic::AtomicBool,
    /// The busiest resources (fed by the apply observer).
    pub(crate) hot: Arc<HotTracker>,
    /// Run-time log filter changes, when the process offers them.
    pub(crate) log_control: Option<LogControlHandle>,
    /// This node's token-signing keys (module `signing`).
    pub(crate) keys: Arc<crate::signing::NodeKeys>,
    /// How this node calls its peers (https with its certificate when the
    /// cluster runs TLS): signing-key registrations go to the leader this way.
    pub(crate) peer_tls: Option<tonic::transport::ClientTlsConfig>,
}

/// The lock operations of one node. Cheap to clone.
#[derive(Clone)]
pub struct LockService {
    pub(crate) inner: Arc<ServiceInner>,
}

fn not_leader(f: &ForwardToLeader<TypeConfig>) -> LockError {
    if f.reason == ForwardReason::LeaseExpired {
        return LockError::NoQuorum;
    }
    LockError::NotLeader { leader_id: f.leader_id, leader_addr: f.leader_node.as_ref().map(|n| n.addr.clone()) }
}

pub(crate) fn write_error(e: RaftError<TypeConfig, ClientWriteError<TypeConfig>>) -> LockError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => not_leader(&f),
        RaftError::APIError(ClientWriteError::LogEntryDiscarded(_)) => {
            LockError::Unknown("the leader changed before the write committed; retry with the same request id".into())
        }
        RaftError::APIError(e) => LockError::Internal(e.to_string()),
        RaftError::Fatal(_) => LockError::ShuttingDown,
    }
}

impl LockService {
    pub(crate) fn new(inner: ServiceInner) -> Self {
        Self { inner: Arc::new(inner) }
    }

    /// Marks the node as stopping (see [`ServiceInner::stopping`]).
    pub(crate) fn begin_stop(&self) {
        self.inner.stopping.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// The policy in force.
    pub fn policy(&self) -> &Policy {
        &self.inner.policy
    }

    fn ensure_leader(&self) -> Result<(), LockError> {
        self.inner.raft.as_leader().map(|_| ()).map_err(|f| not_leader(&f))
    }

    /// Proposes a command and waits for its outcome, at most the write timeout.
    pub(crate) async fn propose(&self, cmd: Command) -> Result<Outcome, LockError> {
        self.propose_indexed(cmd).await.map(|(_, outcome)| outcome)
    }

    /// As [`Self::propose`], with the log index of the entry.
    async fn propose_indexed(&self, cmd: Command) -> Result<(u64, Outcome), LockError> {
        let entry = LogCommand { at_ms: self.inner.clock.wall_ms(), cmd };
        let started = self.inner.clock.now();
        let write = async {
            match self.inner.raft.client_write(entry.clone()).await {
                // A leader elected a moment ago has no quorum acknowledgement
                // yet and refuses proposals until its first heartbeat round
                // returns. The refusal happened before anything was appended,
                // so proposing again once a quorum answered is safe.
                Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))
                    if f.reason == ForwardReason::LeaseExpired && self.await_first_quorum_ack().await =>
                {
                    self.inner.raft.client_write(entry).await
                }
                other => other,
            }
        };
        match tokio::time::timeout(self.inner.policy.write_timeout, write).await {
            Err(_) => Err(LockError::Unknown(format!(
                "the write did not commit within {:?}; retry with the same request id",
                self.inner.policy.write_timeout
            ))),
            Ok(Err(e)) => Err(write_error(e)),
            Ok(Ok(resp)) => {
                self.inner.metrics.commit_seconds.observe(started.elapsed().as_secs_f64());
                tracing::Span::current().record("log_index", resp.log_id.index);
                Ok((resp.log_id.index, resp.data))
            }
        }
    }

    /// Whether a quorum acknowledged this leader within one election timeout
    /// (always true for a single voter): while it holds, openraft's leader
    /// lease guarantees no other leader exists.
    pub(crate) fn has_quorum_lease(&self) -> bool {
        use openraft::rt::Instant as _;
        let m = self.inner.raft.metrics();
        let m = openraft::rt::watch::WatchReceiver::borrow_watched(&m);
        if m.state != openraft::ServerState::Leader {
            return false;
        }
        m.membership_config.membership().voter_ids().count() <= 1
            || m.last_quorum_acked.as_ref().is_some_and(|t| t.into_inner().elapsed() < self.inner.election_timeout)
    }

    /// After a proposal was refused for want of a quorum lease: on a leader
    /// that has not been acknowledged by a quorum yet in its term (just
    /// elected), waits at most one election timeout for the first
    /// acknowledgement, and says whether proposing again makes sense (also
    /// when the acknowledgement arrived between the refusal and now). A
    /// leader that had a quorum and lost it says no at once: NO_QUORUM.
    async fn await_first_quorum_ack(&self) -> bool {
        use openraft::rt::Instant as _;
        let lease = self.inner.election_timeout;
        let valid = |m: &openraft::RaftMetrics<TypeConfig>| {
            m.last_quorum_acked.as_ref().is_some_and(|t| t.into_inner().elapsed() < lease)
        };
        let (leader, acked, valid_now) = {
            let m = self.inner.raft.metrics();
            let m = openraft::rt::watch::WatchReceiver::borrow_watched(&m);
            (m.state == openraft::ServerState::Leader, m.last_quorum_acked.is_some(), valid(&m))
        };
        if !leader || valid_now {
            return leader;
        }
        if acked {
            return false;
        }
        self.inner
            .raft
            .wait(Some(lease))
            .metrics(|m| m.state != openraft::ServerState::Leader || valid(m), "first quorum acknowledgement")
            .await
            .is_ok_and(|m| m.state == openraft::ServerState::Leader)
    }

    /// Proposes in a task of its own, so the write completes (and its outcome
    /// can be acted on) even if the caller goes away.
    fn propose_detached(&self, cmd: Command) -> JoinHandle<Result<Outcome, LockError>> {
        let svc = self.clone();
        tokio::spawn(async move { svc.propose(cmd).await }.in_current_span())
    }

    fn expires_at(&self, lease_id: &LeaseId, ttl_ms: u64) -> u64 {
        let clock = &self.inner.clock;
        match self.inner.leases.deadline(lease_id) {
            Some(d) => clock.to_wall_ms(d),
            None => clock.wall_ms() + ttl_ms,
        }
    }

    /// Every grant answered (at once, after a wait, or to a retry) passes
    /// here: it is signed now, on this leader, from the applied grant.
    async fn granted(&self, grant: Grant, request_id: RequestId) -> Granted {
        // After a wait another call's entry granted this one: its index is
        // the token (I2). (An immediate grant's index was recorded by propose.)
        if grant.waited {
            tracing::Span::current().record("log_index", grant.token.0);
        }
        let expires_at_unix_ms = self.expires_at(&grant.lease_id, grant.ttl_ms);
        let signed_token = self.sign_grant(grant.resource.as_str(), grant.token.0, grant.lease_id.to_u128()).await;
        Granted { grant, request_id, expires_at_unix_ms, signed_token }
    }

    /// Acquire (DESIGN §2, §3.3).
    pub async fn acquire(&self, req: AcquireRequest) -> Result<Granted, LockError> {
        let policy = &self.inner.policy;
        let resource = ResourceName::new(req.resource)?;
        let request_id = if req.request_id.is_empty() {
            RequestId::random().map_err(|e| LockError::Internal(format!("random request id: {e}")))?
        } else {
            RequestId::new(req.request_id)?
        };
        tracing::Span::current().record("request_id", request_id.as_str());
        let holder = Holder::new(req.holder)?;
        let ttl = policy.ttl(req.ttl_ms)?;
        let wait = policy.wait(req.wait_timeout_ms)?;
        self.ensure_leader()?;
        let lease_id = LeaseId::random().map_err(|e| LockError::Internal(format!("random lease id: {e}")))?;
        let acquire = AcquireCmd {
            request_id: request_id.clone(),
            resource: resource.clone(),
            holder,
            ttl_ms: ttl.as_millis() as u64,
            wait: !wait.is_zero(),
            lease_id,
            max_waiters: policy.max_waiters_per_resource,
        };
        let cmd = match req.quota {
            None => Command::Acquire(acquire),
            Some(quota) => Command::AcquireInQuota { acquire, quota },
        };
        if wait.is_zero() {
            return match self.propose(cmd).await? {
                Outcome::Granted(g) => Ok(self.granted(g, request_id).await),
                // A retry of a request that once waited: report its slot's fate.
                Outcome::Queued { .. } => self.wait_in_queue(resource, request_id, None, Duration::ZERO).await,
                other => Err(self.refusal(other)),
            };
        }
        if self.inner.metrics.waiters.get() as u64 >= policy.max_waiters_total {
            self.inner.metrics.waiter_limit_reached(false);
            return Err(LockError::TooManyWaiters { limit: policy.max_waiters_total });
        }
        self.wait_in_queue(resource, request_id, Some(cmd), wait).await
    }

    /// Parks the call, proposes (if `cmd`), and waits for exactly one of:
    /// granted, WAIT_TIMEOUT (through a committed CancelWait), or unavailable.
    async fn wait_in_queue(
        &self,
        resource: ResourceName,
        request_id: RequestId,
        cmd: Option<Command>,
        wait: Duration,
    ) -> Result<Granted, LockError> {
        let deadline = self.inner.clock.after(wait);
        let mut parked = self.inner.parked.park(&request_id);
        let mut guard = WaitGuard {
            svc: self.clone(),
            resource: resource.clone(),
            request_id: request_id.clone(),
            generation: parked.generation,
            write: cmd.map(|c| self.propose_detached(c)),
            armed: true,
        };
        self.inner.metrics.parked_calls.inc();
        let _parked_gauge = GaugeGuard(self.inner.metrics.clone());
        if let Some(write) = guard.write.as_mut() {
            let outcome = write.await.map_err(|e| LockError::Internal(format!("acquire task: {e}")));
            guard.write = None;
            match outcome.and_then(|r| r) {
                Ok(Outcome::Granted(g)) => {
                    guard.disarm();
                    return Ok(self.granted(g, request_id).await);
                }
                Ok(Outcome::Queued { .. }) => {}
                Ok(other) => {
                    guard.disarm();
                    return Err(self.refusal(other));
                }
                Err(e) => {
                    // Unknown or refused before commit: the client retries with
                    // the same request id, which finds its slot if it was queued.
                    guard.disarm();
                    return Err(e);
                }
            }
        }
        tokio::select! {
            wake = &mut parked.rx => {
                guard.disarm();
                match wake {
                    Ok(Wake::Granted(g)) => Ok(self.granted(g, request_id).await),
                    Ok(Wake::Cancelled) => Err(LockError::WaitTimeout),
                    Ok(Wake::LeaderChanged) | Err(_) => Err(LockError::LeaderChanged),
                    Ok(Wake::Superseded) => Err(LockError::Unknown(
                        "another call with the same request id took over this queue slot".into(),
                    )),
                }
            }
            () = tokio::time::sleep_until(deadline) => {
                guard.disarm();
                self.inner.parked.unpark(&request_id, parked.generation);
                let cancel = self.propose_detached(Command::CancelWait { resource, request_id: request_id.clone() });
                match cancel.await.map_err(|e| LockError::Internal(format!("cancel task: {e}")))?? {
                    Outcome::WaitCancel(CancelOutcome::AlreadyGranted(g)) => Ok(self.granted(g, request_id).await),
                    Outcome::WaitCancel(_) => Err(LockError::WaitTimeout),
                    other => Err(LockError::Internal(format!("unexpected outcome of CancelWait: {other:?}"))),
                }
            }
        }
    }

    fn refusal(&self, outcome: Outcome) -> LockError {
        match outcome {
            Outcome::Rejected(r) => match r {
                Rejection::LockHeld { holder, token } => LockError::LockHeld { holder: holder.to_string(), token },
                Rejection::TooManyWaiters { limit } => {
                    self.inner.metrics.waiter_limit_reached(true);
                    LockError::TooManyWaiters { limit: u64::from(limit) }
                }
                Rejection::NotHolder => LockError::NotHolder,
                Rejection::LeaseExpired => LockError::LeaseExpired,
                Rejection::RequestIdReused => LockError::RequestIdReused,
                Rejection::WaitCancelled => LockError::WaitTimeout,
                Rejection::TenantLimit { limit, value } => {
                    LockError::TenantLimit { tenant: String::new(), limit: limit.as_str(), value }
                }
            },
            other => LockError::Internal(format!("unexpected outcome {other:?}")),
        }
    }

    /// Renew (DESIGN §3.2): refused at once when the leader's deadline passed.
    pub async fn renew(&self, resource: &str, lease_id: &str) -> Result<Renewed, LockError> {
        let resource = ResourceName::new(resource)?;
        let lease_id: LeaseId = lease_id.parse()?;
        self.ensure_leader()?;
        // The local deadline decides only while a quorum vouches that no
        // other leader can exist; a deposed or cut-off leader must answer
        // UNAVAILABLE (through the log: NO_QUORUM), never LEASE_EXPIRED.
        if self.inner.leases.is_overdue(&lease_id) && self.has_quorum_lease() {
            self.inner.metrics.renew_failures.inc();
            return Err(LockError::LeaseExpired);
        }
        match self.propose(Command::Renew { resource, lease_id }).await {
            Ok(Outcome::Renewed { token, ttl_ms }) => {
                Ok(Renewed { token, ttl_ms, expires_at_unix_ms: self.expires_at(&lease_id, ttl_ms) })
            }
            Ok(other) => {
                self.inner.metrics.renew_failures.inc();
                Err(self.refusal(other))
            }
            Err(e) => {
                self.inner.metrics.renew_failures.inc();
                Err(e)
            }
        }
    }

    /// Release (I4: a stale lease id never frees a newer holder).
    pub async fn release(&self, resource: &str, lease_id: &str) -> Result<Released, LockError> {
        let resource = ResourceName::new(resource)?;
        let lease_id: LeaseId = lease_id.parse()?;
        self.ensure_leader()?;
        match self.propose(Command::Release { resource, lease_id }).await? {
            Outcome::Released { was_holder } => Ok(Released { released: true, was_holder }),
            other => Err(self.refusal(other)),
        }
    }

    /// Force-release (operator action): `caller` and `reason` travel in the
    /// log entry, so every node's audit log records who asked and why.
    pub async fn force_release(&self, resource: &str, caller: &str, reason: &str) -> Result<ForceReleased, LockError> {
        let resource = ResourceName::new(resource)?;
        let caller = AuditText::new(caller, "caller")?;
        let reason = AuditText::new(reason, "reason")?;
        self.ensure_leader()?;
        match self.propose_indexed(Command::ForceRelease { resource, caller, reason }).await? {
            (log_index, Outcome::ForceReleased { released_token }) => Ok(ForceReleased { released_token, log_index }),
            (_, other) => Err(LockError::Internal(format!("unexpected outcome {other:?}"))),
        }
    }

    /// Waits until reads on this node are linearizable (ReadIndex, never lease reads).
    pub(crate) async fn linearize(&self) -> Result<(), LockError> {
        self.ensure_leader()?;
        let read = tokio::time::timeout(
            self.inner.policy.write_timeout,
            self.inner.raft.ensure_linearizable(ReadPolicy::ReadIndex),
        )
        .await
        .map_err(|_| LockError::NoQuorum)?;
        match read {
            Ok(_) => Ok(()),
            Err(RaftError::APIError(openraft::errors::LinearizableReadError::ForwardToLeader(f))) => {
                Err(not_leader(&f))
            }
            Err(RaftError::APIError(_)) => Err(LockError::NoQuorum),
            Err(RaftError::Fatal(_)) => Err(LockError::ShuttingDown),
        }
    }

    fn view(&self, resource: ResourceName, state: Option<&crate::state_machine::ResourceState>) -> LockView {
        match state.and_then(|s| s.lock.as_ref().map(|l| (l, s.waiters.len()))) {
            Some((lock, waiters)) => LockView {
                remaining_ttl_ms: self
                    .inner
                    .leases
                    .deadline(&lock.lease_id)
                    .map_or(0, |d| self.inner.clock.millis_until(d)),
                resource,
                held: true,
                holder: lock.holder.to_string(),
                token: lock.token,
                waiters: waiters as u32,
                ttl_ms: lock.ttl_ms,
            },
            None => LockView {
                resource,
                held: false,
                holder: String::new(),
                token: FencingToken(0),
                waiters: 0,
                remaining_ttl_ms: 0,
                ttl_ms: 0,
            },
        }
    }

    /// GetLock: a linearizable view of one resource.
    pub async fn get(&self, resource: &str) -> Result<LockView, LockError> {
        let resource = ResourceName::new(resource)?;
        self.linearize().await?;
        let state = self.inner.sm.read();
        Ok(self.view(resource.clone(), state.resource(&resource)))
    }

    /// ListLocks: held locks whose name starts with `prefix`, in name order,
    /// `page_size` at a time (0 → 100).
    pub async fn list(
        &self,
        prefix: &str,
        page_size: u32,
        page_token: &str,
    ) -> Result<(Vec<LockView>, String), LockError> {
        self.list_where(prefix, page_size, page_token, |_| true).await
    }

    /// [`list`](Self::list) of the resources `visible` admits only (a
    /// tenant's readable prefixes); the others are skipped as if absent.
    pub async fn list_where(
        &self,
        prefix: &str,
        page_size: u32,
        page_token: &str,
        visible: impl Fn(&str) -> bool,
    ) -> Result<(Vec<LockView>, String), LockError> {
        check_resource_chars(prefix).map_err(|e| InvalidField::Prefix(e.to_string()))?;
        let max = self.inner.policy.max_page_size;
        if page_size > max {
            return Err(InvalidField::PageSize { value: page_size, max }.into());
        }
        let page_size = if page_size == 0 { 100 } else { page_size as usize };
        let after = if page_token.is_empty() {
            None
        } else {
            Some(ResourceName::new(page_token).map_err(|_| InvalidField::PageToken)?)
        };
        self.linearize().await?;
        let state = self.inner.sm.read();
        // Seek straight to the first name at or after both the prefix and the
        // page token, instead of walking the table from its start.
        use std::ops::Bound;
        let from = match &after {
            Some(a) if a.as_str() >= prefix => Bound::Excluded(a.as_str()),
            _ => Bound::Included(prefix),
        };
        let range = state.resources().range::<str, _>((from, Bound::Unbounded));
        let mut out = Vec::new();
        let mut next = String::new();
        for (name, r) in range {
            if !name.as_str().starts_with(prefix) {
                break;
            }
            if !visible(name.as_str()) {
                continue;
            }
            if out.len() == page_size {
                next = out.last().map(|v: &LockView| v.resource.to_string()).unwrap_or_default();
                break;
            }
            out.push(self.view(name.clone(), Some(r)));
        }
        Ok((out, next))
    }
}

/// Decrements the parked-calls gauge however the call ends.
struct GaugeGuard(Arc<Metrics>);

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.parked_calls.dec();
    }
}

/// Cleans up after a waiting call that went away (client disconnect): cancels
/// its queue slot, or releases the lease if it was granted meanwhile.
struct WaitGuard {
    svc: LockService,
    resource: ResourceName,
    request_id: RequestId,
    generation: u64,
    write: Option<JoinHandle<Result<Outcome, LockError>>>,
    armed: bool,
}

impl WaitGuard {
    fn disarm(&mut self) {
        if self.armed {
            self.armed = false;
            self.svc.inner.parked.unpark(&self.request_id, self.generation);
        }
    }
}

impl Drop for WaitGuard {
    fn drop(&mut self) {
        if !self.armed || self.svc.inner.stopping.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let parked = &self.svc.inner.parked;
        // If a retry took the slot over, it is no longer ours to clean up.
        let ours = parked.unpark(&self.request_id, self.generation) || parked.take_promoted(&self.request_id);
        if !ours {
            return;
        }
        let (svc, resource, request_id, write) =
            (self.svc.clone(), self.resource.clone(), self.request_id.clone(), self.write.take());
        tokio::spawn(async move {
            if let Some(write) = write {
                match write.await {
                    Ok(Ok(Outcome::Granted(g))) => {
                        return svc.release_orphan(&g).await;
                    }
                    Ok(Ok(Outcome::Queued { .. })) => {}
                    _ => return,
                }
            }
            if svc.ensure_leader().is_err() {
                return; // the new leader's grace sweep cancels the slot
            }
            tracing::debug!(%resource, %request_id, "caller went away; cancelling its queue slot");
            match svc.propose(Command::CancelWait { resource, request_id }).await {
                Ok(Outcome::WaitCancel(CancelOutcome::AlreadyGranted(g))) => svc.release_orphan(&g).await,
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "could not cancel the queue slot of a departed caller"),
            }
        });
    }
}

impl LockService {
    async fn release_orphan(&self, g: &Grant) {
        tracing::info!(resource = %g.resource, token = %g.token, "caller went away after its grant; releasing the orphaned lease");
        if let Err(e) = self.propose(Command::Release { resource: g.resource.clone(), lease_id: g.lease_id }).await {
            tracing::warn!(error = %e, "could not release an orphaned lease; it will expire");
        }
    }
}

fn server_state(s: openraft::ServerState) -> &'static str {
    match s {
        openraft::ServerState::Leader => "leader",
        openraft::ServerState::Follower => "follower",
        openraft::ServerState::Candidate => "candidate",
        openraft::ServerState::Learner => "learner",
        openraft::ServerState::Shutdown => "shutdown",
    }
}

/// One member as seen by this node.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MemberView {
    /// Node id.
    pub id: NodeId,
    /// Address.
    pub addr: String,
    /// voter or learner.
    pub role: &'static str,
    /// Highest index known replicated to it (leader only).
    pub matched_index: u64,
    /// Milliseconds since the leader last heard from it; -1 when unknown.
    pub last_ack_ms: i64,
    /// self, ok, lagging, unreachable or unknown.
    pub health: &'static str,
}

/// This node's view of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StatusView {
    /// This node.
    pub node_id: NodeId,
    /// The cluster it belongs to.
    pub cluster_id: String,
    /// leader, follower, candidate, learner or shutdown.
    pub state: &'static str,
    /// The leader, if known.
    pub leader_id: Option<NodeId>,
    /// The leader's address, if known.
    pub leader_addr: Option<String>,
    /// Current term.
    pub term: u64,
    /// Last log index.
    pub last_log_index: u64,
    /// Committed index.
    pub commit_index: u64,
    /// Applied index.
    pub applied_index: u64,
    /// Index of the latest snapshot.
    pub snapshot_index: u64,
    /// Highest purged index.
    pub purged_index: u64,
    /// Members.
    pub members: Vec<MemberView>,
    /// Held locks.
    pub locks_held: u64,
    /// Queued waiters.
    pub waiters: u64,
    /// Milliseconds since a quorum last acknowledged this leader (leader only).
    pub millis_since_quorum_ack: Option<u64>,
    /// This node is a leader that took over its inherited leases and has a
    /// quorum: it grants, renews and expires (docs/cluster.md, "Failover").
    pub leader_ready: bool,
    /// What `/readyz` answers (docs/operations.md, "Health").
    pub ready: bool,
    /// Why the node is or is not ready, for humans.
    pub ready_reason: String,
    /// fencer version.
    pub version: &'static str,
}

/// Liveness and readiness of a node (docs/operations.md, "Health").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    /// The node can still make progress: raft runs and the state and audit
    /// files are writable. When false, restart the process.
    pub live: bool,
    /// Why not live.
    pub live_reason: String,
    /// A leader is known and, on the leader, a quorum acknowledged it within
    /// one election timeout; the node is not stopping.
    pub ready: bool,
    /// Why (or why not) ready.
    pub ready_reason: String,
    /// A leader is known.
    pub has_leader: bool,
    /// This node is a leader that took over its leases and has a quorum.
    pub leader_ready: bool,
    /// On the leader: time since a quorum last acknowledged it.
    pub quorum_ack_age: Option<Duration>,
}

impl LockService {
    /// This node's view of the cluster (not linearizable: a diagnostic).
    pub fn status(&self) -> StatusView {
        use openraft::rt::Instant as _;
        let m = openraft::rt::watch::WatchReceiver::borrow_watched(&self.inner.raft.metrics()).clone();
        let is_leader = m.state == openraft::ServerState::Leader;
        let membership = m.membership_config.membership();
        let voters: std::collections::BTreeSet<NodeId> = membership.voter_ids().collect();
        let last_log = m.last_log_index.unwrap_or(0);
        let mut members = Vec::new();
        for (id, node) in membership.nodes() {
            let matched = m.replication.as_ref().and_then(|r| r.get(id).cloned().flatten()).map(|l| l.index);
            let ack =
                m.heartbeat.as_ref().and_then(|h| h.get(id).cloned().flatten()).map(|i| i.elapsed().as_millis() as i64);
            let health = if *id == m.id {
                "self"
            } else if !is_leader {
                "unknown"
            } else {
                match ack {
                    None => "unreachable",
                    Some(ms) if ms > self.inner.election_timeout.as_millis() as i64 => "unreachable",
                    Some(_) if last_log.saturating_sub(matched.unwrap_or(0)) > 10_000 => "lagging",
                    Some(_) => "ok",
                }
            };
            members.push(MemberView {
                id: *id,
                addr: node.addr.clone(),
                role: if voters.contains(id) { "voter" } else { "learner" },
                matched_index: if *id == m.id { last_log } else { matched.unwrap_or(0) },
                last_ack_ms: if *id == m.id { 0 } else { ack.unwrap_or(-1) },
                health,
            });
        }
        let health = self.health_of(&m);
        let state = self.inner.sm.read();
        StatusView {
            node_id: m.id,
            cluster_id: self.inner.cluster.to_text(),
            state: server_state(m.state),
            leader_id: m.current_leader,
            leader_addr: m.current_leader.and_then(|l| membership.get_node(&l).map(|n| n.addr.clone())),
            term: m.current_term,
            last_log_index: last_log,
            commit_index: m.local_committed.as_ref().map_or(0, |l| l.index),
            applied_index: m.last_applied.as_ref().map_or(0, |l| l.index),
            snapshot_index: m.snapshot.as_ref().map_or(0, |l| l.index),
            purged_index: m.purged.as_ref().map_or(0, |l| l.index),
            members,
            locks_held: state.lock_count(),
            waiters: state.waiter_count(),
            millis_since_quorum_ack: if is_leader {
                m.last_quorum_acked.as_ref().map(|t| t.elapsed().as_millis() as u64)
            } else {
                None
            },
            leader_ready: is_leader && self.inner.leases.is_authoritative(),
            ready: health.ready,
            ready_reason: health.ready_reason,
            version: env!("CARGO_PKG_VERSION"),
        }
    }

    /// Liveness and readiness from raft's metrics and the stores.
    fn health_of(&self, m: &openraft::RaftMetrics<TypeConfig>) -> Health {
        use openraft::rt::Instant as _;
        let is_leader = m.state == openraft::ServerState::Leader;
        let quorum_ack_age = if is_leader { m.last_quorum_acked.as_ref().map(|t| t.elapsed()) } else { None };
        let (live, live_reason) = match (&m.running_state, self.inner.sm.failure_message()) {
            (Err(fatal), _) => (false, format!("raft stopped: {fatal}")),
            (Ok(()), Some(e)) => (false, format!("the state or audit file cannot be written: {e}")),
            (Ok(()), None) => (true, "raft runs and the files are writable".to_string()),
        };
        let limit = self.inner.election_timeout;
        let voters = m.membership_config.membership().voter_ids().count();
        let (ready, ready_reason) = if !live {
            (false, live_reason.clone())
        } else if self.inner.stopping.load(std::sync::atomic::Ordering::SeqCst) {
            (false, "the node is shutting down".to_string())
        } else {
            match (m.current_leader, is_leader) {
                (None, _) => (false, "no leader known".to_string()),
                (Some(_), true) if voters <= 1 => (true, "leader of a single-node cluster".to_string()),
                (Some(_), true) => match quorum_ack_age {
                    Some(age) if age <= limit => {
                        (true, format!("leader; quorum acknowledged {} ms ago", age.as_millis()))
                    }
                    Some(age) => (
                        false,
                        format!(
                            "leader without a recent quorum (last acknowledgement {} ms ago, limit {} ms)",
                            age.as_millis(),
                            limit.as_millis()
                        ),
                    ),
                    None => (false, "leader without any quorum acknowledgement yet".to_string()),
                },
                (Some(l), false) => (true, format!("{}; leader is node {l}", server_state(m.state))),
            }
        };
        Health {
            live,
            live_reason,
            ready,
            ready_reason,
            has_leader: m.current_leader.is_some(),
            leader_ready: is_leader && self.inner.leases.is_authoritative(),
            quorum_ack_age,
        }
    }

    /// Liveness and readiness of this node now.
    pub fn health(&self) -> Health {
        let m = openraft::rt::watch::WatchReceiver::borrow_watched(&self.inner.raft.metrics()).clone();
        self.health_of(&m)
    }

    /// Brings the time-dependent gauges up to date (before a scrape).
    pub(crate) fn refresh_health_metrics(&self) {
        let h = self.health();
        self.inner.metrics.set_health(HealthGauges {
            ready: h.ready,
            has_leader: h.has_leader,
            leader_ready: h.leader_ready,
            quorum_ack_age: h.quorum_ack_age,
        });
    }

    /// The busiest resources this node has applied, at most `limit`, by
    /// `order` (module `hot`).
    pub fn hot(&self, order: HotOrder, limit: usize) -> HotResources {
        let clock = &self.inner.clock;
        let hot = &self.inner.hot;
        // Read the tracker first and let it go: apply takes the state lock,
        // then the tracker's.
        let tracked = hot.snapshot(clock.now());
        let now_ms = clock.wall_ms();
        let mut resources: Vec<HotResource> = {
            let state = self.inner.sm.read();
            tracked
                .into_iter()
                .map(|t| {
                    let r = state.resource(&t.resource);
                    let lock = r.and_then(|r| r.lock.as_ref());
                    HotResource {
                        resource: t.resource.to_string(),
                        acquires_per_sec: t.acquires_per_sec,
                        error_per_sec: t.error_per_sec,
                        waiters: r.map_or(0, |r| r.waiters.len() as u32),
                        held: lock.is_some(),
                        holder: lock.map(|l| l.holder.to_string()),
                        token: lock.map(|l| l.token.0),
                        held_for_secs: lock.map(|l| now_ms.saturating_sub(l.granted_at_ms) as f64 / 1000.0),
                        mean_hold_secs: t.mean_hold_secs,
                    }
                })
                .collect()
        };
        let by_rate = |a: &HotResource, b: &HotResource| b.acquires_per_sec.total_cmp(&a.acquires_per_sec);
        match order {
            HotOrder::Acquires => resources.sort_by(by_rate),
            HotOrder::Waiters => resources.sort_by(|a, b| b.waiters.cmp(&a.waiters).then_with(|| by_rate(a, b))),
            HotOrder::Hold => resources.sort_by(|a, b| {
                b.held_for_secs.unwrap_or(-1.0).total_cmp(&a.held_for_secs.unwrap_or(-1.0)).then_with(|| by_rate(a, b))
            }),
        }
        let tracked = resources.len();
        resources.truncate(limit);
        HotResources {
            node_id: *self.inner.raft.node_id(),
            by: order.as_str().to_string(),
            capacity: hot.capacity(),
            tracked,
            half_life_secs: hot.half_life().as_secs_f64(),
            resources,
        }
    }

    /// Slots of the hot-resources tracker.
    pub fn hot_capacity(&self) -> usize {
        self.inner.hot.capacity()
    }

    /// The run-time log filter control, if the process offers one.
    pub(crate) fn log_control(&self) -> Option<&LogControlHandle> {
        self.inner.log_control.as_ref()
    }

    /// Adds a learner that catches up from the leader.
    pub async fn add_learner(&self, id: NodeId, addr: String) -> Result<u64, LockError> {
        self.ensure_leader()?;
        let r = self.inner.raft.add_learner(id, openraft::BasicNode { addr }, true).await.map_err(write_error)?;
        Ok(r.log_id.index)
    }

    /// Replaces the voter set.
    pub async fn change_membership(&self, voters: Vec<NodeId>, retain: bool) -> Result<u64, LockError> {
        self.ensure_leader()?;
        let set: std::collections::BTreeSet<NodeId> = voters.into_iter().collect();
        let r = self.inner.raft.change_membership(set, retain).await.map_err(write_error)?;
        Ok(r.log_id.index)
    }
}
