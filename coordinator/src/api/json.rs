//! The edges of the JSON API: whatever request it cannot take is answered
//! with the documented error body ([`ApiError`]), never a framework's plain
//! text. A body is JSON (`content-type: application/json`), at most the
//! request limit, an object of the documented fields only, each of its
//! type ([`JsonBody`]); a query string has the documented parameters only
//! ([`Params`]); an unknown path answers 404 and a known path with another
//! method 405 ([`with_json_errors`]), except to gRPC clients, which get
//! gRPC's own UNIMPLEMENTED; a request head above
//! [`MAX_JSON_HEAD_BYTES`] answers 431.

use axum::Router;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

use super::errors::ApiError;
use crate::MAX_REQUEST_BYTES;
use crate::server::BodyTimeout;

/// The largest request line plus headers the JSON API takes (431 above).
/// The connection's HTTP/1 read buffer is larger (`server`), so a head up
/// to that size still gets this JSON answer; beyond it the HTTP layer
/// answers a bare 431 and closes the connection.
pub(crate) const MAX_JSON_HEAD_BYTES: usize = 32 * 1024;

/// A JSON request body of type `T`, which must refuse unknown fields
/// (`#[serde(deny_unknown_fields)]`): a misspelt field is an error, not a
/// default silently used.
pub(super) struct JsonBody<T>(pub(super) T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        check_json_content_type(req.headers())?;
        // The connection's body timeout (server); a request built without
        // one (in tests) gets the default.
        let limit = req
            .extensions()
            .get::<BodyTimeout>()
            .map_or_else(|| crate::ConnectionLimits::default().body_timeout, |t| t.0);
        let read = tokio::time::timeout(limit, Bytes::from_request(req, state));
        let bytes = read.await.map_err(|_| ApiError::body_timeout(limit))?.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::too_large(MAX_REQUEST_BYTES)
            } else {
                ApiError::invalid("body", format!("the body could not be read: {e}"))
            }
        })?;
        parse_body(&bytes).map(JsonBody)
    }
}

/// `application/json`, with parameters (`; charset=utf-8`) or as a
/// `+json` type; anything else, or none, is 415.
fn check_json_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return Err(ApiError::unsupported_media_type("(none)"));
    };
    let text = value.to_str().unwrap_or("(not text)");
    let essence = text.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    let json = essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json"));
    if json { Ok(()) } else { Err(ApiError::unsupported_media_type(text)) }
}

/// Decodes a body: the JSON must be well formed and one value, and every
/// field known and of its type; the error names the field.
fn parse_body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    // serde reads a struct from an array too (fields by position): only an
    // object is a body.
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::invalid("body", "the body must be a JSON object of the documented fields".into()));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let (path, inner) = (e.path().to_string(), e.into_inner());
        match inner.classify() {
            serde_json::error::Category::Data if path != "." => ApiError::invalid(&path, format!("{path}: {inner}")),
            serde_json::error::Category::Data => {
                ApiError::invalid("body", format!("the body must be a JSON object of the documented fields: {inner}"))
            }
            _ => ApiError::invalid("body", format!("the body is not valid JSON: {inner}")),
        }
    })?;
    de.end().map_err(|e| ApiError::invalid("body", format!("the body is not valid JSON: {e}")))?;
    Ok(value)
}

/// The parameters of a query string, taken one by one by name; whatever
/// is left when the handler is done, or given twice, is refused.
pub(super) struct Params(Vec<(String, String)>);

impl Params {
    /// The query string's parameters (percent-decoded; bytes that are not
    /// UTF-8 become U+FFFD, which no parameter value accepts).
    pub(super) fn parse(query: Option<&str>) -> Result<Self, ApiError> {
        let pairs: Vec<(String, String)> = form_urlencoded::parse(query.unwrap_or_default().as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        for (i, (name, _)) in pairs.iter().enumerate() {
            if pairs[..i].iter().any(|(n, _)| n == name) {
                return Err(ApiError::invalid(name, format!("{name}: given more than once")));
            }
        }
        Ok(Self(pairs))
    }

    /// The text value of `name`, if given.
    pub(super) fn text(&mut self, name: &str) -> Option<String> {
        let at = self.0.iter().position(|(n, _)| n == name)?;
        Some(self.0.remove(at).1)
    }

    /// The value of `name` parsed as a `T`, if given.
    pub(super) fn parsed<T: std::str::FromStr>(&mut self, name: &str, what: &str) -> Result<Option<T>, ApiError> {
        match self.text(name) {
            None => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| ApiError::invalid(name, format!("{name}: {v:?} is not {what}"))),
        }
    }

    /// Refuses a parameter the handler did not take (a misspelling).
    pub(super) fn finish(self, known: &[&str]) -> Result<(), ApiError> {
        match self.0.into_iter().next() {
            None => Ok(()),
            Some((name, _)) => Err(ApiError::invalid(
                &name,
                format!("unknown query parameter {name:?} (the parameters are: {})", known.join(", ")),
            )),
        }
    }
}

/// Whether a request speaks gRPC (its own errors, in its own framing).
fn is_grpc(headers: &HeaderMap) -> bool {
    headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|t| t.starts_with("application/grpc"))
}

/// An unknown path: 404 with the JSON error, or gRPC's UNIMPLEMENTED to a
/// gRPC client (an unknown method, as tonic would answer it).
async fn unknown_path(req: Request) -> Response {
    if is_grpc(req.headers()) {
        let (parts, ()) = tonic::Status::unimplemented("").into_http::<()>().into_parts();
        return Response::from_parts(parts, axum::body::Body::empty());
    }
    ApiError::not_found(req.method().as_str(), req.uri().path()).into_response()
}

async fn unknown_method(req: Request) -> Response {
    ApiError::method_not_allowed(req.method().as_str(), req.uri().path()).into_response()
}

/// 431 for a request head above [`MAX_JSON_HEAD_BYTES`] (gRPC requests are
/// bounded by the HTTP/2 header-list limit instead).
async fn bounded_head(req: Request, next: Next) -> Response {
    if !is_grpc(req.headers()) {
        let line = req.method().as_str().len() + req.uri().to_string().len() + 12;
        let size = line + req.headers().iter().map(|(n, v)| n.as_str().len() + v.len() + 4).sum::<usize>();
        if size > MAX_JSON_HEAD_BYTES {
            return ApiError::headers_too_large(size, MAX_JSON_HEAD_BYTES).into_response();
        }
    }
    next.run(req).await
}

/// `app` (every route added) answering every request it has no route for,
/// and every head too large, with the JSON error body.
pub(crate) fn with_json_errors(app: Router) -> Router {
    app.method_not_allowed_fallback(unknown_method)
        .fallback(unknown_path)
        .layer(axum::middleware::from_fn(bounded_head))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Body {
        resource: String,
        #[serde(default)]
        ttl_ms: Option<u64>,
    }

    fn field(e: &ApiError) -> String {
        let resp = e.clone().into_response();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        format!("{e:?}")
    }

    #[test]
    fn every_bad_body_names_what_is_wrong() {
        assert!(parse_body::<Body>(br#"{"resource":"a","ttl_ms":5000}"#).is_ok());
        let unknown = parse_body::<Body>(br#"{"resource":"a","ttl":5000}"#).unwrap_err();
        assert!(field(&unknown).contains(r#""field": "ttl""#), "{unknown:?}");
        let wrong = parse_body::<Body>(br#"{"resource":"a","ttl_ms":"5s"}"#).unwrap_err();
        assert!(field(&wrong).contains(r#""field": "ttl_ms""#), "{wrong:?}");
        for bad in [&b"{"[..], b"not json", br#"{"resource":"a"} trailing"#, b"[1,2]", b""] {
            let e = parse_body::<Body>(bad).unwrap_err();
            assert!(field(&e).contains(r#""field": "body""#), "{}: {e:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn content_types_other_than_json_are_refused() {
        let with = |ct: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::CONTENT_TYPE, ct.parse().unwrap());
            check_json_content_type(&h)
        };
        assert!(with("application/json").is_ok());
        assert!(with("application/json; charset=utf-8").is_ok());
        assert!(with("application/merge-patch+json").is_ok());
        assert!(with("application/x-www-form-urlencoded").is_err());
        assert!(with("text/plain").is_err());
        assert!(check_json_content_type(&HeaderMap::new()).is_err());
    }

    #[test]
    fn query_parameters_are_known_once_and_typed() {
        let mut p = Params::parse(Some("prefix=a%2Fb&page_size=7")).unwrap();
        assert_eq!(p.text("prefix").as_deref(), Some("a/b"));
        assert_eq!(p.parsed::<u32>("page_size", "a number").unwrap(), Some(7));
        assert!(p.finish(&["prefix", "page_size"]).is_ok());
        assert!(Params::parse(Some("prefix=a&prefix=b")).is_err());
        let mut p = Params::parse(Some("page_size=x")).unwrap();
        assert!(p.parsed::<u32>("page_size", "a number").is_err());
        let p = Params::parse(Some("pagesize=1")).unwrap();
        assert!(p.finish(&["page_size"]).is_err());
    }
}
