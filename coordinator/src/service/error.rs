//! [`LockError`]: why a lock operation did not succeed.

use fencer_token::{LeaseIdError, ResourceNameError};

use crate::state_machine::Reuse;
use crate::types::{FencingToken, InvalidField, LeaseId, NodeId};

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
    /// The request id was first used for another request.
    #[error("the request id was first used for {}; use a fresh request id per attempt", match .0 {
        Reuse::Resource => "another resource",
        Reuse::HolderOrTtl => "the same resource with another holder or ttl",
    })]
    RequestIdReused(Reuse),
    /// A retried acquire whose grant has ended since (released, expired or
    /// force-released): the original grant, which holds nothing now.
    #[error(
        "this request id was granted the lock (token {token}), and that lease has ended since; acquire again with a new request id"
    )]
    LeaseEnded {
        /// The original grant's lease.
        lease_id: LeaseId,
        /// Its token.
        token: FencingToken,
        /// Its ttl.
        ttl_ms: u64,
        /// When it was due to expire if never renewed, counted from the
        /// entry that granted it (Unix ms, leader wall clock).
        expires_at_unix_ms: u64,
        /// Whether it was granted from the queue.
        waited: bool,
    },
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
            Self::RequestIdReused(_) => "REQUEST_ID_REUSED",
            Self::LeaseEnded { .. } => "LEASE_ENDED",
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
            | Self::RequestIdReused(_)
            | Self::Unauthenticated(_)
            | Self::PermissionDenied { .. }
            | Self::UnknownSigningKey(_)
            | Self::SigningKeyRefused(_) => "invalid",
            Self::LockHeld { .. } | Self::TooManyWaiters { .. } | Self::TenantLimit { .. } => "conflict",
            Self::WaitTimeout => "timeout",
            Self::NotHolder | Self::LeaseExpired | Self::LeaseEnded { .. } => "not_holder",
            Self::NotLeader { .. } | Self::NoQuorum | Self::LeaderChanged | Self::ShuttingDown => "unavailable",
            Self::Unknown(_) | Self::Internal(_) => "unknown",
        }
    }
}

/// A refused resource name in a request (field `resource`).
impl From<ResourceNameError> for LockError {
    fn from(e: ResourceNameError) -> Self {
        Self::Invalid(e.into())
    }
}

/// A refused lease id in a request (field `lease_id`).
impl From<LeaseIdError> for LockError {
    fn from(e: LeaseIdError) -> Self {
        Self::Invalid(e.into())
    }
}
