//! The console's files, embedded in the binary at compile time, and the
//! routes that serve them: `/ui/` (the page, with this process's page
//! token written in) and `/ui/static/NAME` (scripts, style, icon).
//!
//! The page itself holds no data: everything it shows comes from the
//! server's `/ui/api/` endpoints, which check the caller like the API does.

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

use crate::page_token::PageToken;

/// One embedded file.
#[derive(Debug, Clone, Copy)]
pub struct Asset {
    /// Its name under `/ui/static/`.
    pub name: &'static str,
    /// Its `Content-Type`.
    pub content_type: &'static str,
    /// Its bytes.
    pub body: &'static str,
}

/// Every file under `/ui/static/`.
pub const ASSETS: &[Asset] = &[
    Asset { name: "console.css", content_type: "text/css; charset=utf-8", body: include_str!("../assets/console.css") },
    Asset {
        name: "console.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("../assets/console.js"),
    },
    Asset { name: "ui.js", content_type: "text/javascript; charset=utf-8", body: include_str!("../assets/ui.js") },
    Asset {
        name: "charts.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("../assets/charts.js"),
    },
    Asset {
        name: "coordinator.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("../assets/coordinator.js"),
    },
    Asset {
        name: "proxy.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("../assets/proxy.js"),
    },
    Asset { name: "icon.svg", content_type: "image/svg+xml", body: include_str!("../assets/icon.svg") },
];

/// The page; `{{PAGE_TOKEN}}` is replaced by the process's token.
const INDEX: &str = include_str!("../assets/index.html");

/// `/ui` (a redirect), `/ui/` (the page) and `/ui/static/NAME`, with the
/// console's security headers.
pub fn assets_router(token: PageToken) -> Router {
    let page: std::sync::Arc<str> = INDEX.replace("{{PAGE_TOKEN}}", token.as_str()).into();
    crate::secured(
        Router::new()
            .route("/ui", get(|| async { Redirect::permanent("/ui/") }))
            .route("/ui/", get(index))
            .route("/ui/static/{name}", get(asset))
            .with_state(page),
    )
}

async fn index(State(page): State<std::sync::Arc<str>>) -> Response {
    let mut resp = ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], page.to_string()).into_response();
    resp.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

async fn asset(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|a| a.name == name) {
        Some(a) => {
            let mut resp = ([(header::CONTENT_TYPE, a.content_type)], a.body).into_response();
            // Revalidate each time: a binary upgrade must not run old scripts.
            resp.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            resp
        }
        None => (StatusCode::NOT_FOUND, "no such console file\n").into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt as _;
    use tower::ServiceExt as _;

    async fn get(router: &Router, path: &str) -> (StatusCode, http::HeaderMap, String) {
        let req = http::Request::get(path).body(axum::body::Body::empty()).unwrap();
        let resp = router.clone().oneshot(req).await.unwrap();
        let (parts, body) = resp.into_parts();
        let body = String::from_utf8(body.collect().await.unwrap().to_bytes().to_vec()).unwrap();
        (parts.status, parts.headers, body)
    }

    #[tokio::test]
    async fn the_page_carries_the_token_and_a_strict_policy() {
        let token = PageToken::generate().unwrap();
        let router = assets_router(token.clone());
        let (status, headers, body) = get(&router, "/ui/").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains(token.as_str()));
        assert!(!body.contains("{{"), "every placeholder is filled");
        assert_eq!(headers[header::CONTENT_SECURITY_POLICY], crate::CONTENT_SECURITY_POLICY);
        assert_eq!(headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        assert_eq!(headers[header::CACHE_CONTROL], "no-store");
        let (status, headers, _) = get(&router, "/ui").await;
        assert_eq!(status, StatusCode::PERMANENT_REDIRECT);
        assert_eq!(headers[header::LOCATION], "/ui/");
    }

    #[tokio::test]
    async fn every_asset_is_served_and_nothing_else() {
        let router = assets_router(PageToken::generate().unwrap());
        for a in ASSETS {
            let (status, headers, body) = get(&router, &format!("/ui/static/{}", a.name)).await;
            assert_eq!(status, StatusCode::OK, "{}", a.name);
            assert_eq!(headers[header::CONTENT_TYPE], a.content_type);
            assert_eq!(body, a.body);
        }
        assert_eq!(get(&router, "/ui/static/../Cargo.toml").await.0, StatusCode::NOT_FOUND);
        assert_eq!(get(&router, "/ui/static/nope.js").await.0, StatusCode::NOT_FOUND);
    }

    /// The page must run under its own policy: no inline script or style,
    /// no handler attributes, nothing fetched from elsewhere, no HTML parsed
    /// from strings.
    #[test]
    fn no_file_needs_what_the_policy_forbids() {
        let index = INDEX.to_ascii_lowercase();
        for bad in ["<script>", "style=", " onclick", " onload", " onerror", "javascript:", "http://", "https://"] {
            assert!(!index.contains(bad), "index.html contains {bad:?}");
        }
        for a in ASSETS.iter().filter(|a| a.name.ends_with(".js")) {
            for bad in ["innerhtml", "outerhtml", "insertadjacenthtml", "document.write", "eval(", "new function"] {
                assert!(!a.body.to_ascii_lowercase().contains(bad), "{} uses {bad}", a.name);
            }
            for line in a.body.lines() {
                let l = line.trim_start();
                if l.starts_with("//") || l.starts_with('*') {
                    continue;
                }
                // The SVG namespace is a name, not an address.
                let line = line.replace("'http://www.w3.org/2000/svg'", "");
                assert!(!line.contains("http://") && !line.contains("https://"), "{}: {line}", a.name);
                assert!(!line.contains("localStorage"), "{}: the bearer token lives in sessionStorage only", a.name);
                assert!(!line.contains("document.cookie"), "{}: the console uses no cookie", a.name);
            }
        }
    }
}
