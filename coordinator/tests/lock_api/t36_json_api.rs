//! The JSON API's edges and the retried request id on one in-process node
//! (issue 15): a retry after its lease ended is answered LEASE_ENDED with
//! the original grant, over gRPC and JSON alike; a retry that differs is
//! REQUEST_ID_REUSED; an explicit 0 ttl is refused and an absent one is the
//! default; whatever the API cannot take answers the documented error body;
//! docs/openapi.json is what the node serves, and the real answers have
//! exactly the fields its schemas list.

use std::net::SocketAddr;
use std::time::Duration;

use fencer_proto::v1::AcquireRequest;
use fencer_testkit::grpc::reason;
use fencer_testkit::node::{grpc_client, start};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::Code;
use tonic_types::StatusExt;

/// One raw HTTP/1.1 exchange: `head` is the request line and headers
/// (without the blank line), `body` is sent as is with its length.
async fn raw(addr: SocketAddr, head: &str, body: &[u8]) -> (u16, Value) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("{head}\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n", body.len());
    s.write_all(req.as_bytes()).await.unwrap();
    let _ = s.write_all(body).await;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf)).await.expect("an answer").unwrap();
    let split = buf.windows(4).position(|w| w == b"\r\n\r\n").expect("a head");
    let head = String::from_utf8_lossy(&buf[..split]).to_string();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = &buf[split + 4..];
    let value = serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("{status}: the body is not JSON ({e}): {:?}", String::from_utf8_lossy(body)));
    (status, value)
}

async fn post(addr: SocketAddr, path: &str, body: &Value) -> (u16, Value) {
    raw(addr, &format!("POST {path} HTTP/1.1\r\nContent-Type: application/json"), body.to_string().as_bytes()).await
}

async fn get(addr: SocketAddr, path: &str) -> (u16, Value) {
    raw(addr, &format!("GET {path} HTTP/1.1"), b"").await
}

/// The error body's reason, after checking it has the documented shape.
fn error_reason(v: &Value) -> &str {
    let e = &v["error"];
    for key in ["code", "reason", "message"] {
        assert!(e[key].is_string(), "error.{key} in {v}");
    }
    assert!(e["metadata"].is_object(), "error.metadata in {v}");
    let code = e["code"].as_str().unwrap();
    assert!(code.chars().all(|c| c.is_ascii_uppercase() || c == '_'), "a gRPC code name: {code}");
    e["reason"].as_str().unwrap()
}

/// How far two readings of one expiry may differ: the first answer reads
/// the leader's monotonic lease deadline in wall time, LEASE_ENDED counts
/// from the granting entry's leader wall time (the same on every node).
const CLOCK_SLACK_MS: u64 = 100;

/// A number of milliseconds, as a JSON number or a metadata string.
fn ms(v: &Value) -> u64 {
    v.as_u64().or_else(|| v.as_str().and_then(|s| s.parse().ok())).unwrap_or_else(|| panic!("milliseconds: {v}"))
}

#[tokio::test]
async fn t36_a_retry_after_its_lease_ended_is_answered_lease_ended_with_the_original_grant() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path()).await;
    let addr = node.local_addr();
    let alice = json!({"resource": "dup/x", "request_id": "req-dup-alice-1", "ttl_ms": 10_000, "holder": "alice"});
    let (code, first) = post(addr, "/v1/acquire", &alice).await;
    assert_eq!(code, 200, "{first}");
    // While the lease holds the lock, a retry is the original grant.
    let (code, again) = post(addr, "/v1/acquire", &alice).await;
    assert_eq!(code, 200, "{again}");
    for field in ["resource", "lease_id", "fencing_token", "ttl_ms", "waited", "request_id"] {
        assert_eq!(again[field], first[field], "{field}");
    }
    // The expiry is the leader's lease deadline, read again in wall time.
    assert!(ms(&again["expires_at_unix_ms"]).abs_diff(ms(&first["expires_at_unix_ms"])) <= CLOCK_SLACK_MS);
    // A retry that asks for something else is not a retry.
    for other in [json!({"ttl_ms": 20_000}), json!({"holder": "mallory"}), json!({"resource": "dup/y"})] {
        let mut body = alice.clone();
        body.as_object_mut().unwrap().extend(other.as_object().unwrap().clone());
        let (code, v) = post(addr, "/v1/acquire", &body).await;
        assert_eq!((code, error_reason(&v)), (412, "REQUEST_ID_REUSED"), "{body}: {v}");
    }
    let lease = first["lease_id"].as_str().unwrap();
    let (code, _) = post(addr, "/v1/release", &json!({"resource": "dup/x", "lease_id": lease})).await;
    assert_eq!(code, 200);
    let bob = json!({"resource": "dup/x", "request_id": "req-dup-bob-1", "ttl_ms": 10_000, "holder": "bob"});
    let (code, bob) = post(addr, "/v1/acquire", &bob).await;
    assert_eq!(code, 200, "{bob}");

    // Alice's retry: never a live grant, the original one as ended.
    let (code, v) = post(addr, "/v1/acquire", &alice).await;
    assert_eq!((code, error_reason(&v)), (410, "LEASE_ENDED"), "{v}");
    assert_eq!(v["error"]["code"], "FAILED_PRECONDITION");
    let m = &v["error"]["metadata"];
    assert_eq!(m["lease_id"], first["lease_id"]);
    assert_eq!(m["fencing_token"], first["fencing_token"].to_string());
    let original = ms(&first["expires_at_unix_ms"]);
    assert!(ms(&m["expires_at_unix_ms"]).abs_diff(original) <= CLOCK_SLACK_MS, "the original expiry: {m} {first}");
    assert_eq!(m["ttl_ms"], "10000");
    let (_, view) = get(addr, "/v1/locks/dup/x").await;
    assert_eq!(view["fencing_token"], bob["fencing_token"], "Bob still holds it");

    // The same over gRPC.
    let mut c = grpc_client(&node).await;
    let req = AcquireRequest {
        resource: "dup/x".into(),
        request_id: "req-dup-alice-1".into(),
        ttl_ms: Some(10_000),
        wait_timeout_ms: 0,
        holder: "alice".into(),
    };
    let err = c.acquire(req.clone()).await.unwrap_err();
    assert_eq!((err.code(), reason(&err).as_str()), (Code::FailedPrecondition, "LEASE_ENDED"));
    let info = err.get_error_details().error_info().cloned().unwrap();
    assert_eq!(info.metadata["fencing_token"], first["fencing_token"].to_string());
    assert_eq!(info.metadata["expires_at_unix_ms"], m["expires_at_unix_ms"], "every answer alike");
    let err = c.acquire(AcquireRequest { ttl_ms: Some(20_000), ..req }).await.unwrap_err();
    assert_eq!(reason(&err), "REQUEST_ID_REUSED");
    node.shutdown().await;
}

#[tokio::test]
async fn t36_an_explicit_zero_ttl_is_refused_an_absent_one_is_the_default_and_unknown_fields_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path()).await;
    let addr = node.local_addr();
    let (code, v) = post(addr, "/v1/acquire", &json!({"resource": "ttl/a", "ttl_ms": 0})).await;
    assert_eq!((code, error_reason(&v)), (400, "INVALID_ARGUMENT"), "{v}");
    assert_eq!(v["error"]["metadata"]["field"], "ttl_ms");
    assert_eq!(v["error"]["metadata"]["value_ms"], "0");
    assert!(v["error"]["metadata"]["max_ms"].is_string(), "{v}");
    let (code, v) = post(addr, "/v1/acquire", &json!({"resource": "ttl/a", "ttl": 5000})).await;
    assert_eq!((code, error_reason(&v)), (400, "INVALID_ARGUMENT"), "{v}");
    assert_eq!(v["error"]["metadata"]["field"], "ttl", "the unknown field is named: {v}");
    let (code, v) = post(addr, "/v1/acquire", &json!({"resource": "ttl/a"})).await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["ttl_ms"], 30_000, "absent: the documented default");

    let mut c = grpc_client(&node).await;
    let req = AcquireRequest {
        resource: "ttl/b".into(),
        request_id: "ttl-zero-grpc".into(),
        ttl_ms: Some(0),
        wait_timeout_ms: 0,
        holder: "t36".into(),
    };
    let err = c.acquire(req.clone()).await.unwrap_err();
    assert_eq!((err.code(), reason(&err).as_str()), (Code::InvalidArgument, "INVALID_ARGUMENT"), "{err:?}");
    let granted = c.acquire(AcquireRequest { ttl_ms: None, ..req }).await.unwrap().into_inner();
    assert_eq!(granted.ttl_ms, 30_000);
    node.shutdown().await;
}

#[tokio::test]
async fn t36_whatever_the_api_cannot_take_answers_the_documented_error_body() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path()).await;
    let addr = node.local_addr();
    let json_ct = "Content-Type: application/json";
    let cases: Vec<(String, Vec<u8>, u16, &str)> = vec![
        ("GET /v1/nope HTTP/1.1".into(), vec![], 404, "NOT_FOUND"),
        ("POST /nope HTTP/1.1".into(), vec![], 404, "NOT_FOUND"),
        ("GET /v1/locks/ HTTP/1.1".into(), vec![], 404, "NOT_FOUND"),
        ("DELETE /v1/acquire HTTP/1.1".into(), vec![], 405, "METHOD_NOT_ALLOWED"),
        (format!("POST /v1/acquire HTTP/1.1\r\n{json_ct}"), b"{\"resource\":".to_vec(), 400, "INVALID_ARGUMENT"),
        (format!("POST /v1/acquire HTTP/1.1\r\n{json_ct}"), br#"{"resource":7}"#.to_vec(), 400, "INVALID_ARGUMENT"),
        (format!("POST /v1/acquire HTTP/1.1\r\n{json_ct}"), b"[\"a\"]".to_vec(), 400, "INVALID_ARGUMENT"),
        ("POST /v1/acquire HTTP/1.1\r\nContent-Type: text/plain".into(), b"{}".to_vec(), 415, "UNSUPPORTED_MEDIA_TYPE"),
        ("POST /v1/acquire HTTP/1.1".into(), b"{}".to_vec(), 415, "UNSUPPORTED_MEDIA_TYPE"),
        (format!("POST /v1/acquire HTTP/1.1\r\n{json_ct}"), vec![b' '; 70 * 1024], 413, "REQUEST_TOO_LARGE"),
        (format!("GET /v1/status HTTP/1.1\r\nX-Big: {}", "a".repeat(40 * 1024)), vec![], 431, "HEADERS_TOO_LARGE"),
        ("GET /v1/locks?page_token=garbage HTTP/1.1".into(), vec![], 400, "INVALID_ARGUMENT"),
        ("GET /v1/locks?page_token=%FF%FE HTTP/1.1".into(), vec![], 400, "INVALID_ARGUMENT"),
        ("GET /v1/locks?pagesize=3 HTTP/1.1".into(), vec![], 400, "INVALID_ARGUMENT"),
        ("GET /v1/locks?page_size=x HTTP/1.1".into(), vec![], 400, "INVALID_ARGUMENT"),
    ];
    for (head, body, want, want_reason) in cases {
        let (code, v) = raw(addr, &head, &body).await;
        assert_eq!((code, error_reason(&v)), (want, want_reason), "{head}: {v}");
    }
    // Operator text is bounded and free of control characters before it
    // is logged or recorded (issue 15 item 11, the coordinator's part).
    for reason in ["stuck\njob".to_string(), "nul\u{0}".to_string(), "x".repeat(2_000)] {
        let body = json!({"resource": "ops/a", "caller": "alice", "reason": reason});
        let (code, v) = post(addr, "/v1/admin/force-release", &body).await;
        assert_eq!((code, v["error"]["metadata"]["field"].as_str()), (400, Some("reason")), "{v}");
    }
    let body = json!({"resource": "ops/a", "caller": "al\rice", "reason": "ok"});
    let (code, v) = post(addr, "/v1/admin/force-release", &body).await;
    assert_eq!((code, v["error"]["metadata"]["field"].as_str()), (400, Some("caller")), "{v}");
    let (_, v) = post(addr, "/v1/renew", &json!({"resource": "a", "lease_id": "x"})).await;
    assert_eq!(v["error"]["code"], "INVALID_ARGUMENT", "the gRPC name, not InvalidArgument: {v}");
    node.shutdown().await;
}

/// The property names of schema `name` in the document.
fn properties<'a>(doc: &'a Value, name: &str) -> Vec<&'a str> {
    let mut p: Vec<&str> =
        doc["components"]["schemas"][name]["properties"].as_object().unwrap().keys().map(String::as_str).collect();
    p.sort();
    p
}

fn keys(v: &Value) -> Vec<&str> {
    let mut k: Vec<&str> =
        v.as_object().unwrap_or_else(|| panic!("an object: {v}")).keys().map(String::as_str).collect();
    k.sort();
    k
}

#[tokio::test]
async fn t36_the_served_openapi_document_matches_the_real_answers() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path()).await;
    let addr = node.local_addr();
    let (code, doc) = get(addr, "/v1/openapi.json").await;
    assert_eq!(code, 200);
    let file: Value =
        serde_json::from_str(include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi.json"))).unwrap();
    assert_eq!(doc, file, "the node serves docs/openapi.json");

    let (code, grant) = post(addr, "/v1/acquire", &json!({"resource": "oa/a", "holder": "t36"})).await;
    assert_eq!(code, 200);
    assert_eq!(keys(&grant), properties(&doc, "Grant"));
    let lease = json!({"resource": "oa/a", "lease_id": grant["lease_id"]});
    assert_eq!(properties(&doc, "LeaseRequest"), keys(&lease));
    let (_, renewed) = post(addr, "/v1/renew", &lease).await;
    assert_eq!(keys(&renewed), properties(&doc, "Renewed"));
    let (_, lock) = get(addr, "/v1/locks/oa/a").await;
    assert_eq!(keys(&lock), properties(&doc, "Lock"));
    let (_, list) = get(addr, "/v1/locks?prefix=oa/&page_size=10").await;
    assert_eq!(keys(&list), properties(&doc, "LockList"));
    assert_eq!(keys(&list["locks"][0]), properties(&doc, "Lock"));
    let (_, released) = post(addr, "/v1/release", &lease).await;
    assert_eq!(keys(&released), properties(&doc, "Released"));
    let (_, forced) = post(addr, "/v1/admin/force-release", &json!({"resource": "oa/a", "reason": "t36"})).await;
    assert_eq!(keys(&forced), properties(&doc, "ForceReleased"));
    let (_, status) = get(addr, "/v1/status").await;
    assert_eq!(keys(&status), properties(&doc, "Status"));
    assert_eq!(keys(&status["members"][0]), properties(&doc, "Member"));
    let (_, keys_page) = get(addr, "/v1/admin/signing-keys").await;
    assert_eq!(keys(&keys_page), properties(&doc, "SigningKeys"));
    assert_eq!(keys(&keys_page["keys"][0]), properties(&doc, "SigningKey"));
    let (_, hot) = get(addr, "/v1/admin/hot?by=acquires&limit=5").await;
    assert_eq!(keys(&hot), properties(&doc, "HotResources"));
    let (code, v) = get(addr, "/v1/admin/log-level").await;
    assert_eq!((code, error_reason(&v)), (501, "NO_LOG_CONTROL"), "no log control in this test node");
    // Every request schema's fields are the ones the API takes: one more is refused.
    for (path, schema, body) in [
        ("/v1/acquire", "AcquireRequest", json!({"resource": "oa/b"})),
        ("/v1/renew", "LeaseRequest", lease.clone()),
        ("/v1/admin/force-release", "ForceReleaseRequest", json!({"resource": "oa/b"})),
    ] {
        let mut full = body.clone();
        for p in properties(&doc, schema) {
            full.as_object_mut().unwrap().entry(p).or_insert(json!(if p.ends_with("_ms") {
                json!(5000)
            } else {
                json!("abcdefgh")
            }));
        }
        let (code, v) = post(addr, path, &full).await;
        assert!(
            code != 400 || v["error"]["metadata"]["field"] != "body",
            "{path}: every documented field is known: {v}"
        );
        let mut more = body;
        more.as_object_mut().unwrap().insert("surplus".into(), json!(1));
        let (code, v) = post(addr, path, &more).await;
        assert_eq!((code, v["error"]["metadata"]["field"].as_str()), (400, Some("surplus")), "{path}: {v}");
    }
    node.shutdown().await;
}
