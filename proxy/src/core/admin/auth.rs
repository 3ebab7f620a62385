//! Bearer-token authentication of the admin API (`admin_token_file`): the
//! token is read from a file at start, never from the command line or the
//! environment, and every endpoint but the probes (`/livez`, `/readyz`)
//! requires `Authorization: Bearer TOKEN`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::core::admin::AdminError;

/// Shortest admin token accepted, in bytes.
pub const MIN_ADMIN_TOKEN_BYTES: usize = 16;
/// Longest admin token accepted, in bytes.
pub const MAX_ADMIN_TOKEN_BYTES: usize = 1024;

/// Endpoints open without the token: liveness and readiness probes.
const OPEN_PATHS: [&str; 2] = ["/livez", "/readyz"];

/// Why the admin token file is unusable.
#[derive(Debug, thiserror::Error)]
pub enum AdminTokenError {
    /// The file could not be read.
    #[error("admin_token_file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file's content is not a usable token.
    #[error("admin_token_file {}: {reason}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

/// Reads an admin token file as the proxy does (for clients that build
/// their own requests); `None` when [`ADMIN_TOKEN_FILE_ENV`] is unset.
///
/// [`ADMIN_TOKEN_FILE_ENV`]: crate::core::admin::ADMIN_TOKEN_FILE_ENV
pub fn admin_token_from_env() -> Result<Option<String>, AdminTokenError> {
    match std::env::var_os(crate::core::admin::ADMIN_TOKEN_FILE_ENV) {
        Some(path) if !path.is_empty() => {
            let token = AdminToken::load(Path::new(&path))?;
            Ok(Some(String::from_utf8_lossy(&token.0).into_owned()))
        }
        _ => Ok(None),
    }
}

/// The admin API's bearer token.
#[derive(Clone)]
pub(crate) struct AdminToken(Arc<[u8]>);

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(..)")
    }
}

impl AdminToken {
    /// Reads the token from `path`: its content without the trailing line
    /// end, [`MIN_ADMIN_TOKEN_BYTES`]–[`MAX_ADMIN_TOKEN_BYTES`] visible
    /// ASCII characters.
    pub(crate) fn load(path: &Path) -> Result<Self, AdminTokenError> {
        let invalid = |reason: String| AdminTokenError::Invalid { path: path.to_path_buf(), reason };
        let meta = std::fs::metadata(path).map_err(|source| AdminTokenError::Read { path: path.into(), source })?;
        // Bound the read before it happens (a token is short).
        if meta.len() > (MAX_ADMIN_TOKEN_BYTES + 2) as u64 {
            return Err(invalid(format!("{} bytes; a token is at most {MAX_ADMIN_TOKEN_BYTES} bytes", meta.len())));
        }
        let raw = std::fs::read(path).map_err(|source| AdminTokenError::Read { path: path.into(), source })?;
        let token = raw.strip_suffix(b"\n").unwrap_or(&raw);
        let token = token.strip_suffix(b"\r").unwrap_or(token);
        Self::new(token).map_err(invalid)
    }

    fn new(token: &[u8]) -> Result<Self, String> {
        if !(MIN_ADMIN_TOKEN_BYTES..=MAX_ADMIN_TOKEN_BYTES).contains(&token.len()) {
            return Err(format!(
                "the token is {} bytes; it must be {MIN_ADMIN_TOKEN_BYTES}–{MAX_ADMIN_TOKEN_BYTES} bytes",
                token.len()
            ));
        }
        if let Some(at) = token.iter().position(|b| !b.is_ascii_graphic()) {
            return Err(format!(
                "byte {at} of the token is not a visible ASCII character (spaces and control characters are not allowed)"
            ));
        }
        Ok(Self(token.into()))
    }

    /// The `Authorization` header value that presents it.
    pub(crate) fn bearer(&self) -> http::HeaderValue {
        let mut value = b"Bearer ".to_vec();
        value.extend_from_slice(&self.0);
        let mut value = http::HeaderValue::from_bytes(&value).expect("visible ASCII is a valid header value");
        value.set_sensitive(true);
        value
    }

    /// Whether `presented` is the token, in time that does not depend on
    /// where they differ.
    fn matches(&self, presented: &[u8]) -> bool {
        let expected = &*self.0;
        if presented.len() != expected.len() {
            return false;
        }
        expected.iter().zip(presented).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }
}

/// The middleware: refuses a call without the right bearer token (401).
pub(crate) async fn require_token(State(token): State<AdminToken>, req: Request, next: Next) -> Response {
    if OPEN_PATHS.contains(&req.uri().path()) {
        return next.run(req).await;
    }
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer ").or_else(|| v.as_bytes().strip_prefix(b"bearer ")));
    match presented {
        Some(p) if token.matches(p) => next.run(req).await,
        Some(_) => AdminError::Unauthorized("the bearer token is not the admin token".into()).into_response(),
        None => AdminError::Unauthorized(
            "this admin API requires `Authorization: Bearer TOKEN` (the proxy's admin_token_file)".into(),
        )
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_file_is_bounded_and_printable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "0123456789abcdef\n").unwrap();
        let token = AdminToken::load(&path).unwrap();
        assert!(token.matches(b"0123456789abcdef"));
        assert!(!token.matches(b"0123456789abcdeX"));
        assert!(!token.matches(b"0123456789abcde"));
        for (content, says) in [
            ("short\n", "it must be 16–1024 bytes"),
            ("0123456789 abcdef\n", "byte 10"),
            ("0123456789abcdef\n\n", "byte 16"),
        ] {
            std::fs::write(&path, content).unwrap();
            let err = AdminToken::load(&path).unwrap_err().to_string();
            assert!(err.contains(says) && err.contains("admin_token_file"), "{content:?}: {err}");
        }
        std::fs::write(&path, "a".repeat(5000)).unwrap();
        assert!(AdminToken::load(&path).unwrap_err().to_string().contains("at most 1024 bytes"));
        assert!(AdminToken::load(&dir.path().join("absent")).is_err());
    }
}
