//! Tenants on a TLS coordinator (issue 9 part B, docs/security.md): tenant
//! alpha authenticates with a client certificate (mTLS), tenant beta with a
//! bearer token. Neither can acquire, renew, release, get or list the
//! other's resources — not even with the other's lease id — and the per-tenant
//! limits answer RESOURCE_EXHAUSTED naming the limit.

use std::sync::Arc;
use std::time::Duration;

use fencer_client::{Client, ClientError, ClientTls, Reason};
use fencer_coordinator::{
    CertFiles, CertUse, DEFAULT_TLS_HANDSHAKE_TIMEOUT, DevCa, Node, NodeTls, Tenants, bearer_token_sha256,
};
use fencer_testkit::{fencer_bin, free_port, node};
use tonic::Code;

const BETA_TOKEN: &str = "beta-secret-token-0123456789";
const GAMMA_TOKEN: &str = "gamma-secret-token-0123456789";

struct Setup {
    _dir: tempfile::TempDir,
    node: Node,
    ca: DevCa,
    alpha: CertFiles,
    ops: CertFiles,
}

fn tenants_file() -> String {
    format!(
        r#"
[[tenant]]
name = "alpha"
certificate_identities = ["alpha-client"]
[tenant.limits]
max_active_locks = 2
max_waiters = 1

[[tenant]]
name = "beta"
bearer_token_sha256 = ["{beta}"]

[[tenant]]
name = "gamma"
bearer_token_sha256 = ["{gamma}"]
[tenant.limits]
max_requests_per_sec = 3

[[tenant]]
name = "ops"
namespace = ""
certificate_identities = ["ops-client"]
[[tenant.permission]]
prefix = ""
allow = ["read", "admin"]
"#,
        beta = bearer_token_sha256(BETA_TOKEN),
        gamma = bearer_token_sha256(GAMMA_TOKEN),
    )
}

/// A single TLS node with the tenants above; `ca` also verifies clients.
async fn start_node(
    data: &std::path::Path,
    cert: &std::path::Path,
    key: &std::path::Path,
    ca: std::path::PathBuf,
) -> Node {
    let mut config = node::fast_config(data);
    config.tls = Some(NodeTls {
        cert_file: cert.to_path_buf(),
        key_file: key.to_path_buf(),
        client_ca_file: Some(ca),
        peer_ca_file: None,
        handshake_timeout: DEFAULT_TLS_HANDSHAKE_TIMEOUT,
    });
    config.tenants = Some(Arc::new(Tenants::parse("tenants.toml", &tenants_file()).unwrap()));
    node::start_with(config).await
}

async fn start() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().join("pki");
    let ca = DevCa::create(&pki, "ca").unwrap();
    let server = ca.issue("node", "node", &["127.0.0.1"], CertUse::Node).unwrap();
    let alpha = ca.issue("alpha", "alpha-client", &[], CertUse::Client).unwrap();
    let ops = ca.issue("ops", "ops-client", &[], CertUse::Client).unwrap();
    let node = start_node(&dir.path().join("data"), &server.cert_file, &server.key_file, ca.ca_file()).await;
    Setup { _dir: dir, node, ca, alpha, ops }
}

impl Setup {
    fn client(&self, cert: Option<&CertFiles>, token: Option<&str>) -> Client {
        let tls = ClientTls::from_files(
            &self.ca.ca_file(),
            cert.map(|c| c.cert_file.as_path()),
            cert.map(|c| c.key_file.as_path()),
        )
        .unwrap();
        let c = Client::new([self.node.local_addr().to_string()]).unwrap().with_tls(&tls).unwrap();
        match token {
            Some(t) => c.with_bearer_token(t).unwrap(),
            None => c,
        }
    }
}

#[track_caller]
fn refused(e: &ClientError, code: Code, reason: Reason) {
    match e {
        ClientError::Refused { code: c, reason: r, .. } if *c == code && *r == reason => {}
        other => panic!("expected {code:?} {}, got {other:?}", reason.as_str()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t88_tenants_cannot_touch_each_others_resources() {
    let s = start().await;
    let alpha = s.client(Some(&s.alpha), None);
    let beta = s.client(None, Some(BETA_TOKEN));
    let ops = s.client(Some(&s.ops), None);

    let a = alpha.acquire("alpha/orders").ttl(Duration::from_secs(30)).await.unwrap();
    let b = beta.acquire("beta/orders").ttl(Duration::from_secs(30)).await.unwrap();
    let b_lease = b.lease_id().to_string();

    for (who, other, stolen) in
        [(&alpha, "beta/orders", b_lease.clone()), (&beta, "alpha/orders", a.lease_id().to_string())]
    {
        let e = who.acquire(other).await.unwrap_err();
        refused(e.client_error(), Code::PermissionDenied, Reason::PermissionDenied);
        assert_eq!(e.client_error().metadata().get("permission").map(String::as_str), Some("acquire"));
        refused(&who.renew(other, &stolen).await.unwrap_err(), Code::PermissionDenied, Reason::PermissionDenied);
        refused(&who.release(other, &stolen).await.unwrap_err(), Code::PermissionDenied, Reason::PermissionDenied);
        refused(&who.get(other).await.unwrap_err(), Code::PermissionDenied, Reason::PermissionDenied);
    }
    // A stolen lease id is useless on one's own resources too.
    refused(&alpha.renew("alpha/orders", &b_lease).await.unwrap_err(), Code::FailedPrecondition, Reason::NotHolder);
    refused(&alpha.release("alpha/orders", &b_lease).await.unwrap_err(), Code::FailedPrecondition, Reason::NotHolder);

    // Lists show only what the caller may read.
    let names = |r: fencer_client::ListLocksResponse| r.locks.into_iter().map(|l| l.resource).collect::<Vec<_>>();
    assert_eq!(names(alpha.list("", 100, "").await.unwrap()), ["alpha/orders"]);
    assert!(names(alpha.list("beta/", 100, "").await.unwrap()).is_empty());
    assert_eq!(names(beta.list("", 100, "").await.unwrap()), ["beta/orders"]);
    assert_eq!(names(ops.list("", 100, "").await.unwrap()), ["alpha/orders", "beta/orders"]);

    // Beta's lease survived every attempt.
    let view = beta.get("beta/orders").await.unwrap();
    assert!(view.held && view.fencing_token == b.token().0, "{view:?}");
    assert!(b.is_held());

    // The operator tenant reads everything and may force-release, but not acquire.
    let e = ops.acquire("beta/other").await.unwrap_err();
    refused(e.client_error(), Code::PermissionDenied, Reason::PermissionDenied);
    let forced = ops.force_release("beta/orders", "t88", "test").await.unwrap();
    assert!(forced.released);
    // The audit log names the authenticated tenant, not only the claimed
    // caller (polled: the line may reach the file a moment after the answer).
    let audit_dir = s.node.audit_dir().unwrap().to_path_buf();
    let mut callers = Vec::new();
    for _ in 0..100 {
        callers = fencer_coordinator::audit_files(&audit_dir)
            .unwrap()
            .iter()
            .flat_map(|f| fencer_coordinator::read_audit_file(f, &mut 0).unwrap())
            .filter(|r| r.log_index == forced.log_index)
            .filter_map(|r| r.caller)
            .collect::<Vec<String>>();
        if !callers.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(callers, ["[tenant ops] t88"]);
    let e = alpha.force_release("alpha/orders", "t88", "test").await.unwrap_err();
    refused(&e, Code::PermissionDenied, Reason::PermissionDenied);

    // No credentials, or unknown ones: UNAUTHENTICATED.
    refused(
        &s.client(None, None).get("alpha/orders").await.unwrap_err(),
        Code::Unauthenticated,
        Reason::Unauthenticated,
    );
    let stranger = s.client(None, Some("not-a-known-token"));
    refused(&stranger.get("alpha/orders").await.unwrap_err(), Code::Unauthenticated, Reason::Unauthenticated);
    let stranger_cert = s.ca.issue("stranger", "stranger", &[], CertUse::Client).unwrap();
    let e = s.client(Some(&stranger_cert), None).acquire("stranger/x").await.unwrap_err();
    refused(e.client_error(), Code::Unauthenticated, Reason::Unauthenticated);
    // A certificate and a token of different tenants.
    let both = s.client(Some(&s.alpha), Some(BETA_TOKEN));
    refused(&both.get("alpha/orders").await.unwrap_err(), Code::Unauthenticated, Reason::Unauthenticated);

    a.release().await.unwrap();
    drop(b);
    s.node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t89_tenant_limits_answer_resource_exhausted_naming_the_limit() {
    let s = start().await;
    let alpha = s.client(Some(&s.alpha), None);
    let beta = s.client(None, Some(BETA_TOKEN));
    let limit_of = |e: &ClientError| {
        refused(e, Code::ResourceExhausted, Reason::TenantLimit);
        e.metadata().get("limit").cloned().unwrap_or_default()
    };

    // max_active_locks = 2.
    let one = alpha.acquire("alpha/1").ttl(Duration::from_secs(30)).await.unwrap();
    let two = alpha.acquire("alpha/2").ttl(Duration::from_secs(30)).await.unwrap();
    let e = alpha.acquire("alpha/3").await.unwrap_err();
    assert_eq!(limit_of(e.client_error()), "max_active_locks");
    assert!(e.client_error().to_string().contains("alpha"), "{e}");
    // Another tenant is not affected.
    let other = beta.acquire("beta/1").await.unwrap();
    // Freeing one makes room again.
    one.release().await.unwrap();
    let three = alpha.acquire("alpha/3").ttl(Duration::from_secs(30)).await.unwrap();

    // max_waiters = 1: one caller queues on alpha/2, a second one may not.
    let queued = {
        let alpha = alpha.clone();
        tokio::spawn(async move { alpha.acquire("alpha/2").wait(Duration::from_secs(20)).await })
    };
    let mut waiting = false;
    for _ in 0..200 {
        if alpha.get("alpha/2").await.unwrap().waiters == 1 {
            waiting = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(waiting, "the first waiter never queued");
    let e = alpha.acquire("alpha/3").wait(Duration::from_secs(1)).await.unwrap_err();
    assert_eq!(limit_of(e.client_error()), "max_waiters");
    // The queued caller gets the lock once it is free: promotion keeps the count.
    two.release().await.unwrap();
    let promoted = queued.await.unwrap().unwrap();
    assert!(promoted.is_held());

    // max_requests_per_sec = 3 (per node): a burst beyond it is refused.
    let gamma = s.client(None, Some(GAMMA_TOKEN));
    let mut limited = None;
    for _ in 0..10 {
        if let Err(e) = gamma.get("gamma/x").await {
            limited = Some(limit_of(&e));
            break;
        }
    }
    assert_eq!(limited.as_deref(), Some("max_requests_per_sec"));

    for l in [three, promoted, other] {
        l.release().await.unwrap();
    }
    s.node.shutdown().await;
}

/// The JSON front end applies the same rules as gRPC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t88_json_over_https_applies_the_same_tenant_rules() {
    use fencer_proxy::testing::{CertUse as Use, TestClient, TestPki};
    use http::Method;
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::new(dir.path(), "json");
    let server = pki.issue("node", &["127.0.0.1"], Use::Server);
    let alpha_cert = pki.issue("alpha-client", &[], Use::Client);
    let node = start_node(&dir.path().join("data"), &server.cert_file, &server.key_file, pki.ca_file()).await;
    let addr = node.local_addr();
    let alpha = TestClient::with_tls(pki.client_config(Some(&alpha_cert)));
    let anonymous = TestClient::with_tls(pki.client_config(None));
    let bearer = format!("Bearer {BETA_TOKEN}");
    let beta_auth = [("authorization", bearer.as_str()), ("content-type", "application/json")];
    let json = [("content-type", "application/json")];

    let r = alpha.send(addr, Method::POST, "/v1/acquire", &json, r#"{"resource":"alpha/json"}"#).await.unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    let r = anonymous.send(addr, Method::POST, "/v1/acquire", &beta_auth, r#"{"resource":"beta/json"}"#).await.unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    let beta_lease = r.json()["lease_id"].as_str().unwrap().to_string();

    let lease_body = format!(r#"{{"resource":"beta/json","lease_id":"{beta_lease}"}}"#);
    for (method, path, body) in [
        (Method::GET, "/v1/locks/beta/json", String::new()),
        (Method::POST, "/v1/acquire", r#"{"resource":"beta/other"}"#.to_string()),
        (Method::POST, "/v1/renew", lease_body.clone()),
        (Method::POST, "/v1/release", lease_body.clone()),
        (Method::POST, "/v1/admin/force-release", r#"{"resource":"beta/json"}"#.to_string()),
        (Method::GET, "/v1/admin/hot", String::new()),
    ] {
        let r = alpha.send(addr, method.clone(), path, &json, body).await.unwrap();
        assert_eq!(r.status, 403, "{method} {path}: {r:?}");
        assert_eq!(r.json()["error"]["reason"], "PERMISSION_DENIED", "{method} {path}");
    }
    let r = anonymous.send(addr, Method::GET, "/v1/locks/alpha/json", &[], "").await.unwrap();
    assert_eq!((r.status.as_u16(), r.json()["error"]["reason"].as_str()), (401, Some("UNAUTHENTICATED")));
    let r = alpha.send(addr, Method::GET, "/v1/locks", &[], "").await.unwrap();
    let names: Vec<_> = r.json()["locks"].as_array().unwrap().iter().map(|l| l["resource"].clone()).collect();
    assert_eq!(names, ["alpha/json"]);
    // Health and metrics stay open; plaintext does not reach anything.
    assert_eq!(anonymous.send(addr, Method::GET, "/readyz", &[], "").await.unwrap().status, 200);
    assert!(TestClient::new().send(addr, Method::GET, "/readyz", &[], "").await.is_err());
    let r = anonymous.send(addr, Method::GET, "/v1/locks/beta/json", &beta_auth, "").await.unwrap();
    assert_eq!(r.json()["held"], true, "beta's lease survived: {r:?}");
    node.shutdown().await;
}

#[test]
fn t88_a_cluster_with_tenants_refuses_to_start_with_raft_open() {
    // Tenants mean nothing if anyone may speak raft to the nodes: without
    // --peer-ca a multi-node coordinator with --tenants does not start.
    let dir = tempfile::tempdir().unwrap();
    let tenants = dir.path().join("tenants.toml");
    std::fs::write(&tenants, tenants_file()).unwrap();
    let (a, b) = (free_port(), free_port());
    let out = std::process::Command::new(fencer_bin())
        .args(["coordinator", "--id", "1", "--listen", &format!("127.0.0.1:{a}")])
        .args(["--peers", &format!("1=127.0.0.1:{a},2=127.0.0.1:{b}")])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--tenants")
        .arg(&tenants)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started: {err}");
    assert!(err.contains("--peer-ca") && err.contains("raft traffic is open"), "{err}");
}
