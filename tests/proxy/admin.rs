//! The proxy admin API's edges (issue 15 items 8, 11, 12): every refusal is
//! the documented problem+json, operator text is bounded before it is
//! audited, query strings are checked alike, and the bearer-token option.

use std::net::SocketAddr;
use std::time::Duration;

use fencer_proxy::testing::{Method, Status, TestClient, TestUpstream};
use fencer_proxy::{AdminClient, ProxyHandle};
use fencer_testkit::ProxyConfigBuilder;

const SOON: Duration = Duration::from_secs(20);
const TOKEN: &str = "s3cret-admin-token-0123456789";

struct Proxy {
    handle: ProxyHandle,
    dir: tempfile::TempDir,
    _upstream: TestUpstream,
}

impl Proxy {
    /// A proxy; `top` are top-level TOML lines (`dir` is substituted by
    /// the data directory's path).
    async fn start(top: &[&str]) -> Self {
        let upstream = TestUpstream::start().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut builder = ProxyConfigBuilder::new(&upstream.url(), dir.path()).write(&[], "/db/{name}/*", "db/{name}");
        for line in top {
            builder = builder.setting(&line.replace("{dir}", &dir.path().display().to_string()));
        }
        std::fs::write(dir.path().join("token"), format!("{TOKEN}\n")).unwrap();
        let handle = fencer_proxy::start(builder.build(), Some(1)).await.unwrap();
        Self { handle, dir, _upstream: upstream }
    }

    fn admin(&self) -> SocketAddr {
        self.handle.admin_addr()
    }

    fn audit(&self) -> String {
        std::fs::read_to_string(self.dir.path().join(fencer_proxy::AUDIT_LOG_FILE)).unwrap_or_default()
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> (Status, serde_json::Value) {
        let resp = TestClient::new().send(self.admin(), method, path, headers, body.to_owned()).await.unwrap();
        let ct = resp.headers.get("content-type").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
        let json = resp.json();
        if !resp.status.is_success() {
            assert_eq!(ct, "application/problem+json", "{} {path}: {:?}", resp.status, resp.body);
            assert_eq!(json["status"], resp.status.as_u16(), "{json}");
            assert!(json["type"].as_str().unwrap().starts_with("urn:fencer:proxy:"), "{json}");
            assert!(!json["detail"].as_str().unwrap().is_empty(), "{json}");
        }
        (resp.status, json)
    }
}

const JSON: (&str, &str) = ("content-type", "application/json");

/// Issue 15 item 8: the framework's refusals on the admin port (malformed
/// JSON, wrong types, unknown fields, no content type, a body or head too
/// large, an unknown path or method) are problem+json, like the handlers'.
#[tokio::test]
async fn t110_every_admin_refusal_is_problem_json() {
    let p = Proxy::start(&[]).await;
    let raise = "/v1/raise-epoch";
    for (what, headers, body, status, slug) in [
        ("malformed JSON", &[JSON][..], "{", Status::BAD_REQUEST, "bad-request"),
        ("a wrong type", &[JSON], r#"{"resource":"a","epoch":"5","reason":"r"}"#, Status::BAD_REQUEST, "bad-request"),
        (
            "an unknown field",
            &[JSON],
            r#"{"resource":"a","epoch":5,"reason":"r","force":true}"#,
            Status::BAD_REQUEST,
            "bad-request",
        ),
        (
            "no content type",
            &[],
            r#"{"resource":"a","epoch":5,"reason":"r"}"#,
            Status::UNSUPPORTED_MEDIA_TYPE,
            "unsupported-media-type",
        ),
    ] {
        let (got, json) = p.send(Method::POST, raise, headers, body).await;
        assert_eq!(got, status, "{what}: {json}");
        assert_eq!(json["type"], format!("urn:fencer:proxy:{slug}"), "{what}: {json}");
    }
    let (_, json) =
        p.send(Method::POST, raise, &[JSON], r#"{"resource":"a","epoch":5,"reason":"r","force":true}"#).await;
    assert!(json["detail"].as_str().unwrap().contains("force"), "the unknown field is named: {json}");

    let huge = format!(r#"{{"resource":"a","epoch":5,"reason":"{}"}}"#, "r".repeat(fencer_proxy::MAX_ADMIN_BODY_BYTES));
    let (got, json) = p.send(Method::POST, raise, &[JSON], &huge).await;
    assert_eq!(got, Status::PAYLOAD_TOO_LARGE, "{json}");
    assert!(json["detail"].as_str().unwrap().contains("65536"), "{json}");

    let big = "b".repeat(fencer_proxy::MAX_ADMIN_HEAD_BYTES + 1);
    let (got, json) = p.send(Method::GET, "/v1/resources", &[("x-big", &big)], "").await;
    assert_eq!(got, Status::REQUEST_HEADER_FIELDS_TOO_LARGE, "{json}");
    assert_eq!(json["type"], "urn:fencer:proxy:headers-too-large");

    let (got, json) = p.send(Method::GET, "/v1/nope", &[], "").await;
    assert_eq!(got, Status::NOT_FOUND, "{json}");
    assert!(json["detail"].as_str().unwrap().contains("/v1/nope"), "{json}");
    let (got, _) = p.send(Method::DELETE, "/v1/resources", &[], "").await;
    assert_eq!(got, Status::METHOD_NOT_ALLOWED);
    assert!(p.audit().is_empty(), "a refused call was audited: {}", p.audit());
    p.handle.shutdown().await;
}

/// Issue 15 item 12: an unknown query parameter (`page_token=garbage`) and
/// a query that does not decode (`%FF%FE`) are refused the same way: 400
/// `bad-request` naming the problem, not a 200 that ignored it.
#[tokio::test]
async fn t111_bad_admin_queries_are_refused_alike() {
    let p = Proxy::start(&[]).await;
    for path in [
        "/v1/resources?page_token=garbage",
        "/v1/rejections?page_token=garbage",
        "/v1/resources?%FF%FE",
        "/v1/resources?after=%FF%FE",
        "/v1/rejections?before=garbage",
        "/v1/rejections?limit=0",
    ] {
        let (got, json) = p.send(Method::GET, path, &[], "").await;
        assert_eq!(got, Status::BAD_REQUEST, "{path}: {json}");
        assert_eq!(json["type"], "urn:fencer:proxy:bad-request", "{path}: {json}");
    }
    let (_, json) = p.send(Method::GET, "/v1/resources?page_token=garbage", &[], "").await;
    assert!(json["detail"].as_str().unwrap().contains("page_token"), "{json}");
    let (got, _) = p.send(Method::GET, "/v1/resources?after=a&limit=5", &[], "").await;
    assert_eq!(got, Status::OK);
    p.handle.shutdown().await;
}

/// Issue 15 item 11: operator text is bounded and one line before it is
/// recorded: a `reason` above 1024 bytes or with a control character is
/// refused with 400 naming the rule, and nothing reaches `audit.jsonl`.
#[tokio::test]
async fn t112_operator_text_is_bounded_before_it_is_audited() {
    let p = Proxy::start(&[]).await;
    let long = "r".repeat(fencer_proxy::MAX_OPERATOR_TEXT_BYTES + 1);
    for (path, body, says) in [
        ("/v1/raise-epoch", serde_json::json!({"resource":"a","epoch":5,"reason":long}), "at most 1024 bytes"),
        ("/v1/raise-epoch", serde_json::json!({"resource":"a","epoch":5,"reason":"x\ny"}), "U+000A"),
        ("/v1/raise-epoch", serde_json::json!({"resource":"a","epoch":5,"reason":"x\u{0}y"}), "U+0000"),
        ("/v1/clear-indeterminate", serde_json::json!({"resource":"a","reason":long}), "at most 1024 bytes"),
        ("/v1/clear-indeterminate", serde_json::json!({"resource":"a","reason":"\u{1b}[31m"}), "U+001B"),
        ("/v1/raise-epoch", serde_json::json!({"resource":"x".repeat(30_000),"epoch":5,"reason":"r"}), "30000 bytes"),
    ] {
        let (got, json) = p.send(Method::POST, path, &[JSON], &body.to_string()).await;
        assert_eq!(got, Status::BAD_REQUEST, "{path}: {json}");
        let detail = json["detail"].as_str().unwrap();
        assert!(detail.contains(says), "{path}: {detail}");
        assert!(detail.len() < 600, "{path}: the detail echoes the input: {} bytes", detail.len());
    }
    assert!(p.audit().is_empty(), "refused text was audited: {}", p.audit());
    let admin = AdminClient::new(&p.admin().to_string(), SOON).unwrap();
    let ok =
        fencer_proxy::RaiseEpochRequest { resource: "a".into(), epoch: 5, reason: "restore – ünïcode ok".into() };
    assert_eq!(admin.raise_epoch(&ok).await.unwrap().epoch, 5);
    assert_eq!(p.audit().lines().count(), 1);
    p.handle.shutdown().await;
}

/// Issue 15 item 11: with `admin_token_file`, every admin call but the
/// probes needs `Authorization: Bearer TOKEN` (401 problem+json without or
/// with another); the CLI's client reads the same file.
#[tokio::test]
async fn t113_the_admin_token_guards_the_admin_api() {
    let p = Proxy::start(&["admin_token_file = \"{dir}/token\""]).await;
    for (method, path, body) in [
        (Method::GET, "/v1/resources", ""),
        (Method::GET, "/v1/rejections", ""),
        (Method::GET, "/metrics", ""),
        (Method::POST, "/v1/raise-epoch", r#"{"resource":"a","epoch":5,"reason":"r"}"#),
        (Method::GET, "/v1/nope", ""),
        // The console's data sits behind the same token.
        (Method::GET, "/ui/api/session", ""),
        (Method::GET, "/ui/api/resources", ""),
        (Method::GET, "/ui/api/rejections", ""),
    ] {
        for auth in [None, Some("Bearer not-the-token-at-all-00"), Some(TOKEN)] {
            let header;
            let mut headers = vec![JSON];
            if let Some(a) = auth {
                header = a.to_owned();
                headers.push(("authorization", &header));
            }
            let (got, json) = p.send(method.clone(), path, &headers, body).await;
            assert_eq!(got, Status::UNAUTHORIZED, "{method} {path} with {auth:?}: {json}");
            assert_eq!(json["type"], "urn:fencer:proxy:unauthorized");
        }
        let bearer = format!("Bearer {TOKEN}");
        let (got, json) = p.send(method.clone(), path, &[JSON, ("authorization", &bearer)], body).await;
        assert_ne!(got, Status::UNAUTHORIZED, "{method} {path}: {json}");
    }
    for probe in ["/livez", "/readyz"] {
        let (got, _) = p.send(Method::GET, probe, &[], "").await;
        assert_eq!(got, Status::OK, "{probe} needs no token");
    }
    // The console's page itself loads without it (and then asks for it).
    let page = TestClient::new().send(p.admin(), Method::GET, "/ui/", &[], String::new()).await.unwrap();
    assert_eq!(page.status, Status::OK, "the console page needs no token");
    let without = AdminClient::new(&p.admin().to_string(), SOON).unwrap();
    assert!(without.resources(None, 1).await.unwrap_err().to_string().contains("401"));
    let with = without.with_token_file(&p.dir.path().join("token")).unwrap();
    assert_eq!(with.resources(None, 1).await.unwrap().floor, 1);
    assert_eq!(p.audit().lines().count(), 1, "only the authenticated raise is audited");
    p.handle.shutdown().await;

    // An unusable token file stops the start, naming it.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("token"), "short\n").unwrap();
    let upstream = TestUpstream::start().await.unwrap();
    let config = ProxyConfigBuilder::new(&upstream.url(), dir.path())
        .setting(&format!("admin_token_file = {:?}", dir.path().join("token").display().to_string()))
        .write(&[], "/db/{name}/*", "db/{name}")
        .build();
    let err = fencer_proxy::start(config, Some(1)).await.unwrap_err().to_string();
    assert!(err.contains("admin_token_file") && err.contains("16–1024 bytes"), "{err}");
}
