//! Admin API failures and the one place they become responses:
//! `application/problem+json` with a fencer URN `type`, like the data path
//! of the HTTP proxy.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::core::rejections::PROBLEM_TYPE_PREFIX;

/// Why an admin call was refused or failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AdminError {
    /// The request is malformed or names an invalid resource (400).
    #[error("{0}")]
    BadRequest(String),
    /// The resource or the keys file is not known (404).
    #[error("{0}")]
    NotFound(String),
    /// The call would lower an epoch (P8, 409).
    #[error("{0}")]
    WouldLower(String),
    /// The epoch store or an upstream is unavailable (503).
    #[error("{0}")]
    Unavailable(String),
    /// This process does not offer the call (501).
    #[error("{0}")]
    NotImplemented(String),
    /// The call lacks the admin bearer token, or presents another (401).
    #[error("{0}")]
    Unauthorized(String),
    /// The framework refused the request before a handler ran: its body
    /// (413, 415, 400), its head (431), its path (404) or method (405).
    #[error("{detail}")]
    Request {
        /// The status.
        status: StatusCode,
        /// The problem `type` slug.
        slug: &'static str,
        /// What is wrong.
        detail: String,
    },
}

impl AdminError {
    fn status_and_slug(&self) -> (StatusCode, &'static str) {
        match self {
            Self::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad-request"),
            Self::NotFound(_) => (StatusCode::NOT_FOUND, "not-found"),
            Self::WouldLower(_) => (StatusCode::CONFLICT, "epoch-would-decrease"),
            Self::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            Self::NotImplemented(_) => (StatusCode::NOT_IMPLEMENTED, "not-implemented"),
            Self::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            Self::Request { status, slug, .. } => (*status, slug),
        }
    }
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        let (status, slug) = self.status_and_slug();
        let body = serde_json::json!({
            "type": format!("{PROBLEM_TYPE_PREFIX}{slug}"),
            "title": slug,
            "status": status.as_u16(),
            "detail": self.to_string(),
        });
        let mut resp = Response::new(axum::body::Body::from(body.to_string()));
        *resp.status_mut() = status;
        resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        if status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        resp
    }
}
