//! The rejected-write log record (DESIGN §4): what operators read through
//! the admin API, `fencer rejections` and `rejections.jsonl`. It names the
//! route template, never the raw path, and never carries bodies.

use serde::{Deserialize, Serialize};

/// URN prefix of every problem `type` the proxy answers with (HTTP data
/// path and admin API).
pub const PROBLEM_TYPE_PREFIX: &str = "urn:fencer:proxy:";

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectReason {
    /// The token is older than the resource's epoch (P1, 409).
    StaleToken,
    /// A write route without a token (P5, 428).
    MissingToken,
    /// The token header is neither a decimal u64 nor a well-formed signed
    /// token, or is repeated (400).
    MalformedToken,
    /// A plain token where signed tokens are required (P7, 403).
    UnsignedToken,
    /// A signed token whose signature does not verify: forged or altered
    /// (P7, 403).
    BadSignature,
    /// A signed token naming a key the proxy does not have (P7, 403).
    UnknownKey,
    /// A signed token whose key expired, at issue or now (P7, 403).
    ExpiredKey,
    /// A signed token issued before its key's window opened (P7, 403).
    KeyNotYetValid,
    /// A genuine signed token for another resource than the route's (P7, 403).
    WrongResource,
    /// The client's resource header disagrees with the route (P6, 400).
    ResourceMismatch,
    /// A higher token while the resource is indeterminate (P4, 503).
    Indeterminate,
    /// The token would raise the epoch by more than `max_epoch_jump` (P7
    /// stand-in, 422).
    TokenJumpTooLarge,
    /// No configured route matches (default deny, 404).
    NoRoute,
    /// The path or query is ambiguous (dot segments, encoded slashes,
    /// repeated parameters the route depends on) (400).
    AmbiguousRequest,
    /// The route's template produced an invalid resource name (400).
    InvalidResource,
    /// `max_resources` distinct resources are already tracked (503).
    TooManyResources,
    /// The declared body is larger than `max_request_body_bytes` (413).
    BodyTooLarge,
    /// PostgreSQL: a higher token found an older transaction it could not
    /// end (no admin connection, or the backend would not exit); FN004.
    Busy,
    /// PostgreSQL: the token changed inside a transaction after a fenced
    /// statement (G2, FN005).
    TokenChangeInTransaction,
    /// PostgreSQL: `PREPARE TRANSACTION`, `COMMIT PREPARED` or `ROLLBACK
    /// PREPARED` on a fenced connection (G8, FN006).
    RefusedStatement,
    /// PostgreSQL: a form of `SET`/`RESET fencer.token` or
    /// `fencer.resource` the sidecar does not support (`SET LOCAL`, a
    /// parameter, a list; FN006).
    UnsupportedStatement,
}

impl RejectReason {
    /// Every reason, so each metric series exists from the start.
    pub const ALL: [RejectReason; 21] = [
        Self::StaleToken,
        Self::MissingToken,
        Self::MalformedToken,
        Self::UnsignedToken,
        Self::BadSignature,
        Self::UnknownKey,
        Self::ExpiredKey,
        Self::KeyNotYetValid,
        Self::WrongResource,
        Self::Busy,
        Self::TokenChangeInTransaction,
        Self::RefusedStatement,
        Self::UnsupportedStatement,
        Self::ResourceMismatch,
        Self::Indeterminate,
        Self::TokenJumpTooLarge,
        Self::NoRoute,
        Self::AmbiguousRequest,
        Self::InvalidResource,
        Self::TooManyResources,
        Self::BodyTooLarge,
    ];

    /// The snake_case name used in logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::StaleToken => "stale_token",
            Self::MissingToken => "missing_token",
            Self::MalformedToken => "malformed_token",
            Self::UnsignedToken => "unsigned_token",
            Self::BadSignature => "bad_signature",
            Self::UnknownKey => "unknown_key",
            Self::ExpiredKey => "expired_key",
            Self::KeyNotYetValid => "key_not_yet_valid",
            Self::WrongResource => "wrong_resource",
            Self::ResourceMismatch => "resource_mismatch",
            Self::Indeterminate => "indeterminate",
            Self::TokenJumpTooLarge => "token_jump_too_large",
            Self::NoRoute => "no_route",
            Self::AmbiguousRequest => "ambiguous_request",
            Self::InvalidResource => "invalid_resource",
            Self::TooManyResources => "too_many_resources",
            Self::BodyTooLarge => "body_too_large",
            Self::Busy => "busy",
            Self::TokenChangeInTransaction => "token_change_in_transaction",
            Self::RefusedStatement => "refused_statement",
            Self::UnsupportedStatement => "unsupported_statement",
        }
    }
}

/// One rejected request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RejectionRecord {
    /// Position in the log, assigned when the record is stored; increasing.
    pub seq: u64,
    /// Wall time, RFC 3339.
    pub time: String,
    /// The resource the route names, when it could be decided.
    pub resource: Option<String>,
    /// The token the request carried or claimed (for a refused signed
    /// token, what its unverified claims say), when it had one.
    pub presented_token: Option<u64>,
    /// The resource's epoch when the request was refused.
    pub current_epoch: Option<u64>,
    /// The client certificate's identity on an mTLS listener, otherwise the
    /// peer address.
    pub caller: String,
    /// HTTP method.
    pub method: String,
    /// The matched route's path template, e.g. `/db/{name}/*`.
    pub route: Option<String>,
    /// The request id (from the request id header, or generated).
    pub request_id: String,
    /// Why.
    pub reason: RejectReason,
    /// The HTTP status answered; for the PostgreSQL sidecar, the HTTP
    /// status of the same refusal (409 stale, 428 no token, …).
    pub status: u16,
    /// PostgreSQL: the SQLSTATE answered (`FN001`…).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sqlstate: Option<String>,
}

/// A page of the rejection table, newest first.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RejectionsPage {
    /// Records, newest first.
    pub rejections: Vec<RejectionRecord>,
    /// Pass as `before` to get the next (older) page; absent on the last.
    pub next_before: Option<u64>,
    /// The table's bound (`rejection_table_max`).
    pub table_max: u64,
}
