//! Errors of client calls, decoded from the server's structured details.

use std::collections::HashMap;

use tonic::{Code, Status};
use tonic_types::StatusExt;

/// The machine-readable reason of a refusal (DESIGN §2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// The lock is held and the request did not wait.
    LockHeld,
    /// The wait ended without the lock.
    WaitTimeout,
    /// The wait queue is full.
    TooManyWaiters,
    /// The lease is not the current holder.
    NotHolder,
    /// The lease expired or was force-released.
    LeaseExpired,
    /// The request id was used before for another request (resource,
    /// holder or ttl).
    RequestIdReused,
    /// A retried acquire whose grant has ended since: it holds nothing
    /// (metadata: the original `lease_id`, `fencing_token`,
    /// `expires_at_unix_ms`).
    LeaseEnded,
    /// The node is not the leader.
    NotLeader,
    /// The leader has no quorum.
    NoQuorum,
    /// A field broke a rule.
    InvalidArgument,
    /// The write may or may not have committed.
    OutcomeUnknown,
    /// Leadership changed while the call was parked.
    LeaderChanged,
    /// The node is shutting down.
    ShuttingDown,
    /// The credentials (client certificate, bearer token) are missing or
    /// name no tenant.
    Unauthenticated,
    /// The caller's tenant may not do this to this resource (metadata:
    /// `tenant`, `permission`, `resource`).
    PermissionDenied,
    /// A tenant limit was reached (metadata: `limit` names it, `value`).
    TenantLimit,
    /// Any other reason, as sent.
    Other(String),
}

impl Reason {
    /// Parses a reason constant.
    pub fn parse(s: &str) -> Self {
        match s {
            "LOCK_HELD" => Self::LockHeld,
            "WAIT_TIMEOUT" => Self::WaitTimeout,
            "TOO_MANY_WAITERS" => Self::TooManyWaiters,
            "NOT_HOLDER" => Self::NotHolder,
            "LEASE_EXPIRED" => Self::LeaseExpired,
            "REQUEST_ID_REUSED" => Self::RequestIdReused,
            "LEASE_ENDED" => Self::LeaseEnded,
            "NOT_LEADER" => Self::NotLeader,
            "NO_QUORUM" => Self::NoQuorum,
            "INVALID_ARGUMENT" => Self::InvalidArgument,
            "OUTCOME_UNKNOWN" => Self::OutcomeUnknown,
            "LEADER_CHANGED" => Self::LeaderChanged,
            "SHUTTING_DOWN" => Self::ShuttingDown,
            "UNAUTHENTICATED" => Self::Unauthenticated,
            "PERMISSION_DENIED" => Self::PermissionDenied,
            "TENANT_LIMIT" => Self::TenantLimit,
            other => Self::Other(other.to_string()),
        }
    }

    /// The reason constant.
    pub fn as_str(&self) -> &str {
        match self {
            Self::LockHeld => "LOCK_HELD",
            Self::WaitTimeout => "WAIT_TIMEOUT",
            Self::TooManyWaiters => "TOO_MANY_WAITERS",
            Self::NotHolder => "NOT_HOLDER",
            Self::LeaseExpired => "LEASE_EXPIRED",
            Self::RequestIdReused => "REQUEST_ID_REUSED",
            Self::LeaseEnded => "LEASE_ENDED",
            Self::NotLeader => "NOT_LEADER",
            Self::NoQuorum => "NO_QUORUM",
            Self::InvalidArgument => "INVALID_ARGUMENT",
            Self::OutcomeUnknown => "OUTCOME_UNKNOWN",
            Self::LeaderChanged => "LEADER_CHANGED",
            Self::ShuttingDown => "SHUTTING_DOWN",
            Self::Unauthenticated => "UNAUTHENTICATED",
            Self::PermissionDenied => "PERMISSION_DENIED",
            Self::TenantLimit => "TENANT_LIMIT",
            Self::Other(s) => s,
        }
    }
}

/// Why a client call failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClientError {
    /// The server answered and refused: the outcome is known.
    #[error("{message}")]
    Refused {
        /// gRPC code.
        code: Code,
        /// Why.
        reason: Reason,
        /// Server message.
        message: String,
        /// ErrorInfo metadata (leader address, holder, limit, field…).
        metadata: HashMap<String, String>,
    },
    /// No server could answer, or it could not say whether the operation
    /// happened. For Acquire, retry with the same request id.
    #[error("unavailable: {message}")]
    Unavailable {
        /// Why, if the server said.
        reason: Option<Reason>,
        /// What happened.
        message: String,
        /// ErrorInfo metadata (for NOT_LEADER: `leader_id`, `leader_addr`).
        metadata: HashMap<String, String>,
    },
    /// The client was configured wrongly (no endpoints, bad address).
    #[error("configuration: {0}")]
    Config(String),
}

impl ClientError {
    /// The reason, if the server gave one.
    pub fn reason(&self) -> Option<&Reason> {
        match self {
            Self::Refused { reason, .. } => Some(reason),
            Self::Unavailable { reason, .. } => reason.as_ref(),
            Self::Config(_) => None,
        }
    }

    /// The ErrorInfo metadata the server sent (empty for configuration errors).
    pub fn metadata(&self) -> &HashMap<String, String> {
        static EMPTY: std::sync::OnceLock<HashMap<String, String>> = std::sync::OnceLock::new();
        match self {
            Self::Refused { metadata, .. } | Self::Unavailable { metadata, .. } => metadata,
            Self::Config(_) => EMPTY.get_or_init(HashMap::new),
        }
    }

    /// Whether the outcome is unknown and a retry (same request id) is the way on.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Self::Unavailable { .. })
    }

    pub(crate) fn from_status(status: &Status) -> Self {
        let details = status.get_error_details();
        let info = details.error_info();
        let reason = info.map(|i| Reason::parse(&i.reason));
        let metadata = info.map(|i| i.metadata.clone()).unwrap_or_default();
        match status.code() {
            Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded
                if reason.as_ref().is_none_or(|r| *r != Reason::WaitTimeout) =>
            {
                Self::Unavailable { reason, message: status.message().to_string(), metadata }
            }
            // Without fencer's ErrorInfo these come from the HTTP/2 layer, not
            // from the coordinator: a GOAWAY (ENHANCE_YOUR_CALM maps to
            // RESOURCE_EXHAUSTED, a protocol error to INTERNAL) ends every call
            // on the connection, whatever each call's outcome was.
            Code::ResourceExhausted | Code::Internal if info.is_none() => Self::Unavailable {
                reason: None,
                message: format!("the connection failed ({:?}): {}", status.code(), status.message()),
                metadata,
            },
            code => Self::Refused {
                code,
                reason: reason.unwrap_or_else(|| Reason::Other(format!("{code:?}").to_uppercase())),
                message: status.message().to_string(),
                metadata,
            },
        }
    }
}
