//! The one place where refusals and failures become HTTP responses
//! (STYLE habit 4): RFC 9457 `application/problem+json` bodies whose `type`
//! is a fencer URN, with the P1 fields for stale tokens.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use serde::Serialize;

use crate::core::fence::Rejection;
use crate::core::rejections::{PROBLEM_TYPE_PREFIX, RejectReason};
use crate::http::body::ProxyBody;

/// Everything the proxy answers itself instead of forwarding.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum Refusal {
    /// The fence or the classifier refused the request; it is logged.
    #[error("{}", .0.detail)]
    Rejected(Rejection),
    /// Connecting to the upstream failed: nothing was sent, safe to retry.
    #[error("{0}")]
    UpstreamUnreachable(String),
    /// Bytes went upstream and then the call timed out or was reset (P4);
    /// `cause` when the client's own body was cut (too large, too slow).
    #[error("{}", outcome_unknown_detail(resource, cause.as_deref()))]
    OutcomeUnknown { resource: String, cause: Option<String> },
    /// The head is larger than `limits.max_header_bytes` or has more than
    /// `limits.max_headers` headers; nothing was sent.
    #[error("{0}")]
    HeadersTooLarge(String),
    /// The client was too slow sending its body; nothing was sent.
    #[error("{0}")]
    ClientBodyTimeout(String),
    /// The client's body failed (the client reset it); nothing was sent.
    #[error("the request body could not be read: {0}")]
    ClientBodyFailed(String),
    /// The epoch store could not persist a raise; nothing was sent.
    #[error("the epoch store is unavailable: {0}")]
    StoreUnavailable(String),
    /// `max_concurrent_requests` are in flight.
    #[error("the proxy is at its concurrency limit; retry later")]
    Overloaded,
    /// Anything else inside the proxy.
    #[error("internal proxy error: {0}")]
    Internal(String),
}

#[derive(Serialize)]
struct Problem<'a> {
    #[serde(rename = "type")]
    kind: String,
    title: &'a str,
    status: u16,
    detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    resource: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    presented_token: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    current_epoch: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    request_id: Option<&'a str>,
}

impl Refusal {
    /// The status for each refusal; the only such table in the proxy.
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            Self::Rejected(r) => Self::status_of(r.reason),
            Self::UpstreamUnreachable(_) => StatusCode::BAD_GATEWAY,
            Self::OutcomeUnknown { .. } => StatusCode::GATEWAY_TIMEOUT,
            Self::HeadersTooLarge(_) => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Self::ClientBodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Self::ClientBodyFailed(_) => StatusCode::BAD_REQUEST,
            Self::StoreUnavailable(_) | Self::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The status a rejection answers with.
    pub(crate) fn status_of(reason: RejectReason) -> StatusCode {
        match reason {
            RejectReason::StaleToken => StatusCode::CONFLICT,
            RejectReason::MissingToken => StatusCode::PRECONDITION_REQUIRED,
            RejectReason::MalformedToken
            | RejectReason::ResourceMismatch
            | RejectReason::AmbiguousRequest
            | RejectReason::InvalidResource => StatusCode::BAD_REQUEST,
            RejectReason::UnsignedToken
            | RejectReason::BadSignature
            | RejectReason::UnknownKey
            | RejectReason::ExpiredKey
            | RejectReason::KeyNotYetValid
            | RejectReason::WrongResource => StatusCode::FORBIDDEN,
            RejectReason::Indeterminate | RejectReason::TooManyResources => StatusCode::SERVICE_UNAVAILABLE,
            RejectReason::TokenJumpTooLarge => StatusCode::UNPROCESSABLE_ENTITY,
            RejectReason::NoRoute => StatusCode::NOT_FOUND,
            RejectReason::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            // The PostgreSQL sidecar's own refusals never reach HTTP.
            RejectReason::Busy => StatusCode::SERVICE_UNAVAILABLE,
            RejectReason::TokenChangeInTransaction => StatusCode::CONFLICT,
            RejectReason::RefusedStatement => StatusCode::FORBIDDEN,
            RejectReason::UnsupportedStatement => StatusCode::BAD_REQUEST,
        }
    }

    fn slug_and_title(&self) -> (&'static str, &'static str) {
        match self {
            Self::Rejected(r) => match r.reason {
                RejectReason::StaleToken => ("stale-token", "Fencing token is older than the resource's epoch"),
                RejectReason::MissingToken => ("missing-token", "This route is a write and needs a fencing token"),
                RejectReason::MalformedToken => {
                    ("malformed-token", "The fencing token is neither a decimal u64 nor a well-formed signed token")
                }
                RejectReason::UnsignedToken => ("unsigned-token", "This proxy requires signed fencing tokens"),
                RejectReason::BadSignature => ("bad-signature", "The token's signature does not verify"),
                RejectReason::UnknownKey => ("unknown-key", "The token names a signing key this proxy does not have"),
                RejectReason::ExpiredKey => ("expired-key", "The token's signing key has expired"),
                RejectReason::KeyNotYetValid => ("key-not-yet-valid", "The token predates its signing key"),
                RejectReason::WrongResource => ("wrong-resource", "The token was issued for another resource"),
                RejectReason::ResourceMismatch => ("resource-mismatch", "The resource header disagrees with the route"),
                RejectReason::Indeterminate => ("indeterminate", "The resource's last write has an unknown outcome"),
                RejectReason::TokenJumpTooLarge => {
                    ("token-jump-too-large", "The token is too far above the resource's epoch")
                }
                RejectReason::NoRoute => ("no-route", "No configured route matches this request"),
                RejectReason::AmbiguousRequest => ("ambiguous-request", "The request path or query is ambiguous"),
                RejectReason::InvalidResource => ("invalid-resource", "The route names an invalid resource"),
                RejectReason::TooManyResources => {
                    ("too-many-resources", "The proxy tracks its maximum number of resources")
                }
                RejectReason::BodyTooLarge => ("body-too-large", "The request body is larger than allowed"),
                RejectReason::Busy => ("busy", "An older transaction holds the resource"),
                RejectReason::TokenChangeInTransaction => {
                    ("token-change-in-transaction", "The token changed inside a transaction")
                }
                RejectReason::RefusedStatement => {
                    ("refused-statement", "The statement is refused on a fenced connection")
                }
                RejectReason::UnsupportedStatement => {
                    ("unsupported-statement", "The statement's form is not supported")
                }
            },
            Self::UpstreamUnreachable(_) => ("upstream-unreachable", "The upstream could not be reached"),
            Self::OutcomeUnknown { .. } => ("outcome-unknown", "The write's outcome is unknown"),
            Self::HeadersTooLarge(_) => ("headers-too-large", "The request head is larger than allowed"),
            Self::ClientBodyTimeout(_) => ("body-timeout", "The request body arrived too slowly"),
            Self::ClientBodyFailed(_) => ("body-failed", "The request body could not be read"),
            Self::StoreUnavailable(_) => ("store-unavailable", "The epoch store is unavailable"),
            Self::Overloaded => ("overloaded", "The proxy is overloaded"),
            Self::Internal(_) => ("internal", "Internal proxy error"),
        }
    }

    /// Renders the refusal as a problem+json response.
    pub(crate) fn into_response(self, request_id: Option<&str>) -> Response<ProxyBody> {
        let status = self.status();
        let (slug, title) = self.slug_and_title();
        let (resource, presented_token, current_epoch, retry_after) = match &self {
            Self::Rejected(r) => (r.resource.as_deref(), r.presented_token, r.current_epoch, r.retry_after_secs),
            Self::OutcomeUnknown { resource, .. } => (Some(resource.as_str()), None, None, None),
            Self::Overloaded | Self::StoreUnavailable(_) => (None, None, None, Some(1)),
            _ => (None, None, None, None),
        };
        let body = Problem {
            kind: format!("{PROBLEM_TYPE_PREFIX}{slug}"),
            title,
            status: status.as_u16(),
            detail: self.to_string(),
            resource,
            presented_token,
            current_epoch,
            request_id,
        };
        let json = serde_json::to_vec(&body).unwrap_or_default();
        let mut resp = Response::new(Full::new(Bytes::from(json)).map_err(|never| match never {}).boxed());
        *resp.status_mut() = status;
        resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        resp.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if let Some(secs) = retry_after {
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

fn outcome_unknown_detail(resource: &str, cause: Option<&str>) -> String {
    match cause {
        None => format!(
            "the upstream call for resource {resource} timed out or was reset after the request was sent; its outcome is unknown and it will not be retried"
        ),
        Some(cause) => format!(
            "{cause} after part of the request was sent for resource {resource}; its outcome is unknown and it will not be retried"
        ),
    }
}

/// Turns an error from the layers around the fence (load shed, concurrency
/// limit) into a response, so hyper never sees a service error.
pub(crate) fn respond_to_layer_error(err: tower::BoxError) -> Response<ProxyBody> {
    if err.is::<tower::load_shed::error::Overloaded>() {
        Refusal::Overloaded.into_response(None)
    } else if let Ok(refusal) = err.downcast::<Refusal>() {
        refusal.into_response(None)
    } else {
        Refusal::Internal("unexpected layer error".into()).into_response(None)
    }
}
