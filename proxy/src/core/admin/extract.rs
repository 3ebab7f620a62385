//! The admin API's request checks, so that every refusal is the one
//! problem+json shape of [`AdminError`]: JSON bodies and query strings
//! (unknown fields refused), the body and head limits, unknown paths and
//! methods, and the bounds on operator text before it is audited.

use axum::Json;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Query, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

use crate::core::admin::AdminError;

/// Largest admin request body, in bytes.
pub const MAX_ADMIN_BODY_BYTES: usize = 64 * 1024;
/// Largest admin request head (request line and headers), in bytes.
pub const MAX_ADMIN_HEAD_BYTES: usize = 16 * 1024;
/// Most headers on an admin request.
pub const MAX_ADMIN_HEADERS: usize = 100;
/// Longest operator text (`reason`, a log filter), in bytes.
pub const MAX_OPERATOR_TEXT_BYTES: usize = 1024;

/// A JSON body whose refusals are problem+json.
pub(crate) struct AdminJson<T>(pub(crate) T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for AdminJson<T> {
    type Rejection = AdminError;

    async fn from_request(req: Request, state: &S) -> Result<Self, AdminError> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(Self(v)),
            Err(e) => Err(json_refusal(&e)),
        }
    }
}

fn json_refusal(e: &JsonRejection) -> AdminError {
    let (status, slug) = match e {
        JsonRejection::MissingJsonContentType(_) => (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported-media-type"),
        JsonRejection::JsonDataError(_) | JsonRejection::JsonSyntaxError(_) => (StatusCode::BAD_REQUEST, "bad-request"),
        other if other.status() == StatusCode::PAYLOAD_TOO_LARGE => (StatusCode::PAYLOAD_TOO_LARGE, "body-too-large"),
        other => (other.status(), "bad-request"),
    };
    let detail = match status {
        StatusCode::PAYLOAD_TOO_LARGE => {
            format!("the request body is larger than the admin API's {MAX_ADMIN_BODY_BYTES} bytes")
        }
        StatusCode::UNSUPPORTED_MEDIA_TYPE => {
            "the request body must be JSON with `content-type: application/json`".into()
        }
        _ => e.body_text(),
    };
    AdminError::Request { status, slug, detail }
}

/// A query string whose refusals are problem+json.
pub(crate) struct AdminQuery<T>(pub(crate) T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for AdminQuery<T> {
    type Rejection = AdminError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, AdminError> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(v)) => Ok(Self(v)),
            Err(e) => Err(query_refusal(&e)),
        }
    }
}

fn query_refusal(e: &QueryRejection) -> AdminError {
    AdminError::Request { status: StatusCode::BAD_REQUEST, slug: "bad-request", detail: e.body_text() }
}

/// Refuses a head beyond [`MAX_ADMIN_HEADERS`] or [`MAX_ADMIN_HEAD_BYTES`]
/// with 431 (hyper's own, much larger buffer answers a bare 431 beyond it).
pub(crate) async fn head_limits(req: Request, next: Next) -> Response {
    let headers = req.headers();
    let target = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    let size = req.method().as_str().len()
        + target
        + headers.iter().map(|(name, value)| name.as_str().len() + value.len() + 4).sum::<usize>();
    let detail = if headers.len() > MAX_ADMIN_HEADERS {
        format!("the request has {} headers; the admin API allows {MAX_ADMIN_HEADERS}", headers.len())
    } else if size > MAX_ADMIN_HEAD_BYTES {
        format!("the request line and headers are about {size} bytes; the admin API allows {MAX_ADMIN_HEAD_BYTES}")
    } else {
        return next.run(req).await;
    };
    AdminError::Request { status: StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, slug: "headers-too-large", detail }
        .into_response()
}

/// 404 for a path the admin API does not serve.
pub(crate) async fn no_such_path(req: Request) -> AdminError {
    AdminError::Request {
        status: StatusCode::NOT_FOUND,
        slug: "not-found",
        detail: format!("the proxy admin API has no {} {}", req.method(), bounded_path(req.uri().path())),
    }
}

/// 405 for a path served with other methods.
pub(crate) async fn no_such_method(req: Request) -> AdminError {
    AdminError::Request {
        status: StatusCode::METHOD_NOT_ALLOWED,
        slug: "method-not-allowed",
        detail: format!("{} is not allowed on {}", req.method(), bounded_path(req.uri().path())),
    }
}

/// A request path quoted in a detail, cut at 256 bytes.
fn bounded_path(path: &str) -> String {
    const MAX: usize = 256;
    if path.len() <= MAX {
        return path.to_owned();
    }
    let mut end = MAX;
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &path[..end], path.len())
}

/// Checks operator text before it is recorded (audit log, logs): at most
/// [`MAX_OPERATOR_TEXT_BYTES`] bytes and no control characters, so an audit
/// record stays one bounded line. Refused, never rewritten: what is audited
/// is what the operator sent.
pub(crate) fn operator_text(field: &str, text: &str) -> Result<(), AdminError> {
    if text.len() > MAX_OPERATOR_TEXT_BYTES {
        return Err(AdminError::BadRequest(format!(
            "{field} is {} bytes; operator text is at most {MAX_OPERATOR_TEXT_BYTES} bytes",
            text.len()
        )));
    }
    if let Some((at, c)) = text.chars().enumerate().find(|(_, c)| c.is_control()) {
        return Err(AdminError::BadRequest(format!(
            "{field}: character {at} is the control character U+{:04X}; operator text is one line without control characters",
            u32::from(c)
        )));
    }
    Ok(())
}
