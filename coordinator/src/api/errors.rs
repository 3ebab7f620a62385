//! The one mapping from [`LockError`] to a gRPC status and to an HTTP answer
//! (STYLE.md habit 4). Reasons travel as a `google.rpc.ErrorInfo` detail;
//! NOT_LEADER also carries the leader's address in ErrorInfo metadata and in
//! the `fencer-leader-addr` header; INVALID_ARGUMENT carries a BadRequest
//! naming the field.
//!
//! Over HTTP every error, the service's and the JSON front end's own (an
//! unknown path, a body that is not JSON, too large a request), is one
//! [`ApiError`]: `{"error": {"code", "reason", "message", "metadata"}}`
//! with `code` the gRPC code's name.

use std::collections::HashMap;

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use fencer_proto::{ERROR_DOMAIN, LEADER_ADDR_HEADER};
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::service::LockError;
use crate::types::InvalidField;

/// The gRPC code of an error.
pub fn grpc_code(e: &LockError) -> Code {
    match e {
        LockError::Invalid(_) => Code::InvalidArgument,
        LockError::LockHeld { .. } => Code::Aborted,
        LockError::WaitTimeout => Code::DeadlineExceeded,
        LockError::TooManyWaiters { .. } => Code::ResourceExhausted,
        LockError::NotHolder
        | LockError::LeaseExpired
        | LockError::RequestIdReused(_)
        | LockError::LeaseEnded { .. } => Code::FailedPrecondition,
        LockError::NotLeader { .. }
        | LockError::NoQuorum
        | LockError::Unknown(_)
        | LockError::LeaderChanged
        | LockError::ShuttingDown => Code::Unavailable,
        LockError::UnknownSigningKey(_) => Code::NotFound,
        LockError::SigningKeyRefused(_) => Code::FailedPrecondition,
        LockError::Internal(_) => Code::Internal,
        LockError::Unauthenticated(_) => Code::Unauthenticated,
        LockError::PermissionDenied { .. } => Code::PermissionDenied,
        LockError::TenantLimit { .. } => Code::ResourceExhausted,
    }
}

/// The HTTP status of an error for the JSON API.
pub fn http_status(e: &LockError) -> u16 {
    match e {
        LockError::Invalid(_) => 400,
        LockError::LockHeld { .. } => 409,
        LockError::WaitTimeout => 408,
        LockError::TooManyWaiters { .. } => 429,
        LockError::NotHolder | LockError::LeaseExpired | LockError::RequestIdReused(_) => 412,
        LockError::LeaseEnded { .. } => 410,
        LockError::NotLeader { .. }
        | LockError::NoQuorum
        | LockError::Unknown(_)
        | LockError::LeaderChanged
        | LockError::ShuttingDown => 503,
        LockError::UnknownSigningKey(_) => 404,
        LockError::SigningKeyRefused(_) => 412,
        LockError::Internal(_) => 500,
        LockError::Unauthenticated(_) => 401,
        LockError::PermissionDenied { .. } => 403,
        LockError::TenantLimit { .. } => 429,
    }
}

/// The canonical name of a gRPC code, as the JSON error's `code` says it
/// (`INVALID_ARGUMENT`, not `InvalidArgument`).
pub(crate) fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// An error answered over HTTP: the JSON error body and its status. Built
/// from a [`LockError`], or by the JSON front end for a request it cannot
/// take ([`ApiError::invalid`] and the others below).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApiError {
    status: StatusCode,
    code: Code,
    reason: &'static str,
    message: String,
    metadata: HashMap<String, String>,
    leader_addr: Option<String>,
}

/// The reasons the JSON front end answers itself, besides
/// [`LockError::reason`]'s (the OpenAPI document lists both).
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) const HTTP_REASONS: &[&str] = &[
    "NOT_FOUND",
    "METHOD_NOT_ALLOWED",
    "UNSUPPORTED_MEDIA_TYPE",
    "REQUEST_TOO_LARGE",
    "HEADERS_TOO_LARGE",
    "BODY_TIMEOUT",
    "NO_LOG_CONTROL",
];

impl ApiError {
    fn new(status: StatusCode, code: Code, reason: &'static str, message: String) -> Self {
        Self { status, code, reason, message, metadata: HashMap::new(), leader_addr: None }
    }

    /// The same error with one more metadata entry.
    pub(crate) fn with(mut self, key: &str, value: impl Into<String>) -> Self {
        self.metadata.insert(key.into(), value.into());
        self
    }

    /// 400 INVALID_ARGUMENT naming the request `field` (`body` when the
    /// body as a whole is not what was expected).
    pub(crate) fn invalid(field: &str, message: String) -> Self {
        Self::new(StatusCode::BAD_REQUEST, Code::InvalidArgument, "INVALID_ARGUMENT", message).with("field", field)
    }

    /// 404: no route has this path.
    pub(crate) fn not_found(method: &str, path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            Code::NotFound,
            "NOT_FOUND",
            format!("no route for {method} {path} (the routes: GET /v1/openapi.json)"),
        )
        .with("path", path)
    }

    /// 405: the path exists, the method does not.
    pub(crate) fn method_not_allowed(method: &str, path: &str) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            Code::Unimplemented,
            "METHOD_NOT_ALLOWED",
            format!("{path} does not take {method} (the routes: GET /v1/openapi.json)"),
        )
        .with("path", path)
        .with("method", method)
    }

    /// 415: a body that is not declared JSON.
    pub(crate) fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Code::InvalidArgument,
            "UNSUPPORTED_MEDIA_TYPE",
            format!("the body must be JSON with content-type: application/json, not {content_type:?}"),
        )
        .with("content_type", content_type)
    }

    /// 413: the body is larger than `limit` bytes.
    pub(crate) fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            Code::ResourceExhausted,
            "REQUEST_TOO_LARGE",
            format!("the request body is larger than the limit of {limit} bytes"),
        )
        .with("limit", limit.to_string())
    }

    /// 431: the request line and headers are larger than `limit` bytes.
    pub(crate) fn headers_too_large(size: usize, limit: usize) -> Self {
        Self::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Code::ResourceExhausted,
            "HEADERS_TOO_LARGE",
            format!("the request line and headers are {size} bytes, above the limit of {limit} bytes"),
        )
        .with("limit", limit.to_string())
    }

    /// 408: the body did not arrive within `limit` of its head.
    pub(crate) fn body_timeout(limit: std::time::Duration) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            Code::DeadlineExceeded,
            "BODY_TIMEOUT",
            format!("the request body did not arrive within {limit:?} (the connection's body timeout)"),
        )
        .with("limit_ms", limit.as_millis().to_string())
    }

    /// 501: the process gave the node no log filter to change.
    pub(crate) fn no_log_control() -> Self {
        Self::new(
            StatusCode::NOT_IMPLEMENTED,
            Code::Unimplemented,
            "NO_LOG_CONTROL",
            "this process did not hand the node a log filter control".into(),
        )
    }

    /// The HTTP status.
    #[cfg(test)]
    pub(crate) fn status(&self) -> StatusCode {
        self.status
    }
}

impl From<&LockError> for ApiError {
    fn from(e: &LockError) -> Self {
        let status = StatusCode::from_u16(http_status(e)).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let leader_addr = match e {
            LockError::NotLeader { leader_addr, .. } => leader_addr.clone(),
            _ => None,
        };
        Self {
            status,
            code: grpc_code(e),
            reason: e.reason(),
            message: e.to_string(),
            metadata: metadata(e),
            leader_addr,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({
            "error": {
                "code": code_name(self.code),
                "reason": self.reason,
                "message": self.message,
                "metadata": self.metadata,
            }
        });
        let mut resp = (self.status, axum::Json(body)).into_response();
        if let Some(addr) = self.leader_addr
            && let Ok(v) = HeaderValue::from_str(&addr)
        {
            resp.headers_mut().insert(LEADER_ADDR_HEADER, v);
        }
        resp
    }
}

/// The ErrorInfo metadata of an error.
pub(crate) fn metadata(e: &LockError) -> HashMap<String, String> {
    let mut m = HashMap::new();
    match e {
        LockError::NotLeader { leader_id, leader_addr } => {
            if let Some(id) = leader_id {
                m.insert("leader_id".into(), id.to_string());
            }
            if let Some(addr) = leader_addr {
                m.insert("leader_addr".into(), addr.clone());
            }
        }
        LockError::LockHeld { holder, token } => {
            m.insert("holder".into(), holder.clone());
            m.insert("token".into(), token.to_string());
        }
        LockError::TooManyWaiters { limit } => {
            m.insert("limit".into(), limit.to_string());
        }
        LockError::Invalid(f) => {
            m.insert("field".into(), f.field().into());
            // The bounds in numbers, so a client can state them in its
            // caller's units (the CLI does: `--wait 10m`, "at most 5m").
            match f {
                InvalidField::Ttl { value, min, max } => {
                    m.insert("value_ms".into(), value.to_string());
                    m.insert("min_ms".into(), min.to_string());
                    m.insert("max_ms".into(), max.to_string());
                }
                InvalidField::WaitTimeout { value, max } => {
                    m.insert("value_ms".into(), value.to_string());
                    m.insert("max_ms".into(), max.to_string());
                }
                _ => {}
            }
        }
        LockError::LeaseEnded { lease_id, token, ttl_ms, expires_at_unix_ms, waited } => {
            m.insert("lease_id".into(), lease_id.to_string());
            m.insert("fencing_token".into(), token.to_string());
            m.insert("ttl_ms".into(), ttl_ms.to_string());
            m.insert("expires_at_unix_ms".into(), expires_at_unix_ms.to_string());
            m.insert("waited".into(), waited.to_string());
        }
        LockError::PermissionDenied { tenant, permission, resource } => {
            m.insert("tenant".into(), tenant.clone());
            m.insert("permission".into(), (*permission).into());
            m.insert("resource".into(), resource.clone());
        }
        LockError::TenantLimit { tenant, limit, value } => {
            if !tenant.is_empty() {
                m.insert("tenant".into(), tenant.clone());
            }
            m.insert("limit".into(), (*limit).into());
            m.insert("value".into(), value.to_string());
        }
        _ => {}
    }
    m
}

/// The gRPC status of an error, with its structured details.
pub fn to_status(e: &LockError) -> Status {
    let mut details = ErrorDetails::with_error_info(e.reason(), ERROR_DOMAIN, metadata(e));
    if let LockError::Invalid(f) = e {
        details.add_bad_request_violation(f.field(), f.to_string());
    }
    let mut status = Status::with_error_details(grpc_code(e), e.to_string(), details);
    if let LockError::NotLeader { leader_addr: Some(addr), .. } = e
        && let Ok(v) = addr.parse()
    {
        status.metadata_mut().insert(LEADER_ADDR_HEADER, v);
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::FencingToken;

    #[test]
    fn reasons_travel_as_error_info() {
        let status = to_status(&LockError::LockHeld { holder: "h".into(), token: FencingToken(7) });
        assert_eq!(status.code(), Code::Aborted);
        let info = status.get_error_details().error_info().cloned().unwrap();
        assert_eq!(info.reason, "LOCK_HELD");
        assert_eq!(info.domain, ERROR_DOMAIN);
        assert_eq!(info.metadata["token"], "7");
    }

    #[test]
    fn not_leader_carries_the_leader_address() {
        let e = LockError::NotLeader { leader_id: Some(2), leader_addr: Some("127.0.0.2:7420".into()) };
        let status = to_status(&e);
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(status.metadata().get(LEADER_ADDR_HEADER).unwrap(), "127.0.0.2:7420");
        let info = status.get_error_details().error_info().cloned().unwrap();
        assert_eq!(info.metadata["leader_addr"], "127.0.0.2:7420");
    }

    #[test]
    fn json_codes_are_the_grpc_names() {
        // Every code, not only those in use today: the JSON `code` is the
        // gRPC constant, never Debug output run through to_uppercase.
        let all = [
            (Code::Ok, "OK"),
            (Code::Cancelled, "CANCELLED"),
            (Code::Unknown, "UNKNOWN"),
            (Code::InvalidArgument, "INVALID_ARGUMENT"),
            (Code::DeadlineExceeded, "DEADLINE_EXCEEDED"),
            (Code::NotFound, "NOT_FOUND"),
            (Code::AlreadyExists, "ALREADY_EXISTS"),
            (Code::PermissionDenied, "PERMISSION_DENIED"),
            (Code::ResourceExhausted, "RESOURCE_EXHAUSTED"),
            (Code::FailedPrecondition, "FAILED_PRECONDITION"),
            (Code::Aborted, "ABORTED"),
            (Code::OutOfRange, "OUT_OF_RANGE"),
            (Code::Unimplemented, "UNIMPLEMENTED"),
            (Code::Internal, "INTERNAL"),
            (Code::Unavailable, "UNAVAILABLE"),
            (Code::DataLoss, "DATA_LOSS"),
            (Code::Unauthenticated, "UNAUTHENTICATED"),
        ];
        for (code, name) in all {
            assert_eq!(code_name(code), name);
        }
        let e = ApiError::from(&LockError::Invalid(InvalidField::ResourceDotDot));
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        assert_eq!(e.code, Code::InvalidArgument);
    }

    #[test]
    fn invalid_argument_names_the_field() {
        let status = to_status(&LockError::Invalid(InvalidField::ResourceDotDot));
        let bad = status.get_error_details().bad_request().cloned().unwrap();
        assert_eq!(bad.field_violations[0].field, "resource");
    }
}
