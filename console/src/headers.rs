//! The headers on every console answer, page and data alike.
//!
//! The policy allows scripts, styles, images and fetches from the console's
//! own origin only: no inline script or style, no `eval`, no other host, no
//! framing, no form submissions anywhere, and DOM sinks that would parse
//! HTML from strings refuse to (Trusted Types with no policy). A page that
//! tried to reach anything else would be stopped by the browser and the
//! attempt would show in its console, which the browser tests watch.

use axum::Router;
use axum::http::{HeaderName, HeaderValue, header};
use axum::response::Response;

/// The Content-Security-Policy of every console answer.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'; \
     require-trusted-types-for 'script'; trusted-types 'none'";

/// `router` with the console's security headers on every answer.
pub fn secured<S: Clone + Send + Sync + 'static>(router: Router<S>) -> Router<S> {
    router.layer(axum::middleware::map_response(add_headers))
}

async fn add_headers(mut resp: Response) -> Response {
    let h = resp.headers_mut();
    let set = |h: &mut http::HeaderMap, name: HeaderName, value: &'static str| {
        h.insert(name, HeaderValue::from_static(value));
    };
    set(h, header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY);
    set(h, header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    set(h, header::X_FRAME_OPTIONS, "DENY");
    set(h, header::REFERRER_POLICY, "no-referrer");
    set(h, HeaderName::from_static("cross-origin-opener-policy"), "same-origin");
    set(h, HeaderName::from_static("cross-origin-resource-policy"), "same-origin");
    if !h.contains_key(header::CACHE_CONTROL) {
        set(h, header::CACHE_CONTROL, "no-store");
    }
    resp
}
