//! In-process tests of the proxy's fence (DESIGN §4, P1–P8) against a gated
//! test upstream that records the order in which it applied writes.
//! Each test names the rule it protects; none asserts on timing.

use std::time::Duration;

use fencer_proxy::testing::{Method, Status, TestClient, TestUpstream};
use fencer_proxy::{AdminClient, ClearIndeterminateRequest, ProxyHandle, RaiseEpochRequest, RejectReason};
use fencer_testkit::{ProxyConfigBuilder, eventually};

/// Generous bound for anything that should happen "soon" on a noisy machine.
const SOON: Duration = Duration::from_secs(20);

struct Harness {
    upstream: TestUpstream,
    proxy: Option<ProxyHandle>,
    client: TestClient,
    admin: AdminClient,
    dir: tempfile::TempDir,
}

impl Harness {
    /// A proxy in front of a fresh test upstream; `extra` is appended to a
    /// config whose routes are: `GET /ping` read; `GET /query` with
    /// `q = "SHOW DATABASES"` read; `/db/{name}/*` writes `db/{name}`;
    /// `/query?db={db}` and `/write` write `influx/{db}` / `main`.
    async fn start(timeouts: &str, floor: u64) -> Self {
        let upstream = TestUpstream::start().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let config = ProxyConfigBuilder::new(&upstream.url(), dir.path())
            .setting("max_epoch_jump = 1000")
            .table("timeouts", timeouts)
            .read(&["GET"], "/ping")
            .read_if(&["GET"], "/query", ("q", "SHOW DATABASES"))
            .write(&[], "/db/{name}/*", "db/{name}")
            .write_if(&[], "/query", ("db", "{db}"), "influx/{db}")
            .write(&[], "/write", "main")
            .build();
        let proxy = fencer_proxy::start(config, Some(floor)).await.unwrap();
        let admin = AdminClient::new(&proxy.admin_addr().to_string(), SOON).unwrap();
        Self { upstream, proxy: Some(proxy), client: TestClient::new(), admin, dir }
    }

    fn addr(&self) -> std::net::SocketAddr {
        self.proxy.as_ref().unwrap().local_addr()
    }

    async fn write(&self, path: &str, token: u64) -> fencer_proxy::testing::TestResponse {
        self.client.write(self.addr(), path, token).await.unwrap()
    }

    async fn stop(mut self) {
        if let Some(p) = self.proxy.take() {
            p.shutdown().await;
        }
    }
}

// ---- t10: route classification (P5, P6) ----

/// P5: classification is by route, not method. A `GET /query` carrying a
/// `DROP` is a write: without a token it is refused and never forwarded;
/// only the allow-listed statement goes through without one.
#[tokio::test]
async fn t10_hidden_write_in_get_needs_a_token() {
    let h = Harness::start("", 0).await;
    let drop_db =
        h.client.send(h.addr(), Method::GET, "/query?db=metrics&q=DROP+DATABASE+metrics", &[], "").await.unwrap();
    assert_eq!(drop_db.status, Status::PRECONDITION_REQUIRED, "{:?}", drop_db.body);
    assert_eq!(drop_db.json()["type"], "urn:fencer:proxy:missing-token");
    assert!(h.upstream.events().is_empty(), "a write without a token reached the upstream: {:?}", h.upstream.events());

    let show = h.client.send(h.addr(), Method::GET, "/query?q=SHOW+DATABASES", &[], "").await.unwrap();
    assert_eq!(show.status, Status::OK);
    let ping = h.client.send(h.addr(), Method::GET, "/ping", &[], "").await.unwrap();
    assert_eq!(ping.status, Status::OK);
    // A read route matches its method only: POST /ping is not a read.
    let post_ping = h.client.send(h.addr(), Method::POST, "/ping", &[], "").await.unwrap();
    assert_eq!(post_ping.status, Status::NOT_FOUND);
    // Default deny: an unknown path is refused, not forwarded.
    let other = h.client.send(h.addr(), Method::GET, "/debug/vars", &[], "").await.unwrap();
    assert_eq!(other.status, Status::NOT_FOUND);
    assert_eq!(h.upstream.applied().len(), 2, "only the two reads were forwarded");
    // Malformed tokens are 400, not forwarded.
    let bad = h.client.send(h.addr(), Method::POST, "/write", &[("fencing-token", "4x2")], "").await.unwrap();
    assert_eq!(bad.status, Status::BAD_REQUEST);
    assert_eq!(h.upstream.applied().len(), 2);
    h.stop().await;
}

/// P6: the sidecar decides the resource. A client header naming another
/// resource is refused; one that agrees is fine.
#[tokio::test]
async fn t11_resource_header_must_match_the_route() {
    let h = Harness::start("", 0).await;
    let wrong = h
        .client
        .send(
            h.addr(),
            Method::POST,
            "/db/orders/rows",
            &[("fencing-token", "5"), ("fencing-resource", "db/users")],
            "",
        )
        .await
        .unwrap();
    assert_eq!(wrong.status, Status::BAD_REQUEST, "{:?}", wrong.body);
    assert_eq!(wrong.json()["type"], "urn:fencer:proxy:resource-mismatch");
    assert!(h.upstream.events().is_empty());
    let right = h
        .client
        .send(
            h.addr(),
            Method::POST,
            "/db/orders/rows",
            &[("fencing-token", "5"), ("fencing-resource", "db/orders")],
            "",
        )
        .await
        .unwrap();
    assert_eq!(right.status, Status::OK);
    h.stop().await;
}

// ---- t20: the check (P1) and the rejection log ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t21_a_resource_never_seen_starts_at_the_floor() {
    // P10: the floor is the epoch of every resource the store has not seen,
    // so a token issued before the proxy existed cannot write anywhere.
    let h = Harness::start("", 100).await;
    let below = h.write("/db/fresh/rows/1", 99).await;
    assert_eq!(below.status, Status::CONFLICT, "{:?}", below.body);
    assert_eq!(below.json()["current_epoch"], 100);
    assert_eq!(h.write("/db/fresh/rows/1", 100).await.status, Status::OK, "the floor itself is current");
    assert_eq!(h.write("/db/other/rows/1", 101).await.status, Status::OK);
    assert_eq!(h.upstream.applied(), vec![Some(100), Some(101)]);
    h.stop().await;
}

/// P1: a token below E gets 409 problem+json with resource, presented_token
/// and current_epoch; it never reaches the upstream; the rejection log
/// names it by route template, never by raw path.
#[tokio::test]
async fn t20_stale_token_is_refused_and_logged() {
    let h = Harness::start("", 0).await;
    assert_eq!(h.write("/db/orders/rows/17", 42).await.status, Status::OK);
    let stale = h.write("/db/orders/rows/17", 41).await;
    assert_eq!(stale.status, Status::CONFLICT);
    assert_eq!(stale.headers["content-type"], "application/problem+json");
    let p = stale.json();
    assert_eq!(p["type"], "urn:fencer:proxy:stale-token");
    assert_eq!(p["resource"], "db/orders");
    assert_eq!(p["presented_token"], 41);
    assert_eq!(p["current_epoch"], 42);
    assert_eq!(h.upstream.applied(), vec![Some(42)]);

    // The log is written asynchronously; poll for it.
    let mut found = None;
    for _ in 0..200 {
        let page = h.admin.rejections(None, 10).await.unwrap();
        if let Some(r) = page.rejections.into_iter().find(|r| r.reason == RejectReason::StaleToken) {
            found = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r = found.expect("the stale write is in the rejection log");
    assert_eq!(r.resource.as_deref(), Some("db/orders"));
    assert_eq!((r.presented_token, r.current_epoch), (Some(41), Some(42)));
    assert_eq!(r.route.as_deref(), Some("/db/{name}/*"));
    assert_eq!(r.method, "POST");
    assert!(r.caller.starts_with("127.0.0.1:"), "{}", r.caller);
    assert!(!serde_json::to_string(&r).unwrap().contains("rows/17"), "the raw path must not be logged");

    // The admin endpoints: metrics with the fencer_proxy_ prefix and no
    // resource names; readiness with the store and the upstream up.
    let admin = h.proxy.as_ref().unwrap().admin_addr();
    let metrics = h.client.send(admin, Method::GET, "/metrics", &[], "").await.unwrap();
    let text = String::from_utf8_lossy(&metrics.body);
    for needle in [
        "fencer_proxy_rejected_total{reason=\"stale_token\"} 1",
        "fencer_proxy_accepted_total{kind=\"write\"} 1",
        "fencer_proxy_epoch_advances_total 1",
        "fencer_proxy_epoch_persist_seconds_bucket",
        "fencer_proxy_drain_wait_seconds_count",
        "fencer_proxy_added_latency_seconds_count 1",
    ] {
        assert!(text.contains(needle), "{needle} missing from:\n{text}");
    }
    assert!(!text.contains("db/orders"), "a resource name leaked into metrics");
    let ready = h.client.send(admin, Method::GET, "/readyz", &[], "").await.unwrap();
    assert_eq!(ready.status, Status::OK, "{:?}", ready.body);
    h.stop().await;
}

// ---- t30: serialisation per resource (P3) ----

/// P3: A(41) is in flight at the upstream; B(42) must not reach the
/// upstream until A has finished; a later 41 is refused; the applied order
/// never shows 41 after 42.
#[tokio::test]
async fn t30_higher_token_waits_for_lower_in_flight() {
    let h = Harness::start("", 0).await;
    assert_eq!(h.write("/write", 40).await.status, Status::OK);
    h.upstream.hold(41);
    let (client, addr) = (h.client.clone(), h.addr());
    let a = tokio::spawn(async move { client.write(addr, "/write", 41).await.unwrap() });
    assert!(h.upstream.wait_arrived(41, SOON).await, "A never reached the upstream");

    let (client, addr) = (h.client.clone(), h.addr());
    let b = tokio::spawn(async move { client.write(addr, "/write", 42).await.unwrap() });
    // Give a broken fence every chance to let B through while A is held.
    let leaked = h.upstream.wait_arrived(42, Duration::from_millis(700)).await;
    assert!(!leaked, "B(42) reached the upstream while A(41) was still in flight: {:?}", h.upstream.events());
    assert!(!b.is_finished(), "B must wait for A");

    h.upstream.release(41);
    assert_eq!(a.await.unwrap().status, Status::OK);
    assert_eq!(b.await.unwrap().status, Status::OK);
    assert_eq!(h.write("/write", 41).await.status, Status::CONFLICT);
    let applied = h.upstream.applied();
    assert_eq!(applied, vec![Some(40), Some(41), Some(42)]);
    h.stop().await;
}

/// P1/P3: equal tokens share the guard: two writes with the current token
/// are at the upstream at the same time.
#[tokio::test]
async fn t31_equal_tokens_proceed_concurrently() {
    let h = Harness::start("", 0).await;
    assert_eq!(h.write("/write", 7).await.status, Status::OK);
    h.upstream.hold(7);
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let (client, addr) = (h.client.clone(), h.addr());
        tasks.push(tokio::spawn(async move { client.write(addr, "/write", 7).await.unwrap() }));
    }
    // 1 earlier arrival + 2 held at the gate together.
    let both = h.upstream.wait_arrivals(7, 3, SOON).await;
    h.upstream.release(7);
    assert!(both, "equal-token writes did not run concurrently: {:?}", h.upstream.events());
    for t in tasks {
        assert_eq!(t.await.unwrap().status, Status::OK);
    }
    h.stop().await;
}

/// P3 fairness: old-token writes that arrive while a new token waits for
/// the drain queue behind it. With A(41) in flight and B(42) waiting, a
/// flood of 41s must not reach the upstream (an unfair guard would keep
/// admitting them and B could wait forever); once A ends, B goes, and the
/// flood is refused.
#[tokio::test]
async fn t32_old_token_flood_does_not_starve_the_new_token() {
    const FLOOD: usize = 24;
    let h = Harness::start("", 0).await;
    assert_eq!(h.write("/write", 40).await.status, Status::OK);
    h.upstream.hold(41);
    let (client, addr) = (h.client.clone(), h.addr());
    let a = tokio::spawn(async move { client.write(addr, "/write", 41).await.unwrap() });
    assert!(h.upstream.wait_arrived(41, SOON).await);
    let (client, addr) = (h.client.clone(), h.addr());
    let b = tokio::spawn(async move { client.write(addr, "/write", 42).await.unwrap() });
    let mut queued = false;
    for _ in 0..400 {
        if h.admin.resource("main").await.unwrap().waiting == 1 {
            queued = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(queued, "B(42) never queued for the exclusive guard");

    let mut flood = Vec::new();
    for _ in 0..FLOOD {
        let (client, addr) = (h.client.clone(), h.addr());
        flood.push(tokio::spawn(async move { client.write(addr, "/write", 41).await.unwrap() }));
    }
    // Give an unfair guard every chance to let the flood in ahead of B.
    let overtook = h.upstream.wait_arrivals(41, 2, Duration::from_millis(700)).await;
    assert!(!overtook, "old-token writes overtook the waiting new token: {} arrived", h.upstream.arrivals(41));

    h.upstream.release(41);
    assert_eq!(a.await.unwrap().status, Status::OK);
    assert_eq!(b.await.unwrap().status, Status::OK);
    for f in flood {
        assert_eq!(f.await.unwrap().status, Status::CONFLICT);
    }
    assert_eq!(h.upstream.applied(), vec![Some(40), Some(41), Some(42)]);
    h.stop().await;
}

/// Resources are independent: while resource db/a is blocked (41 held at
/// the upstream and 42 waiting for it), db/b's writes go through.
#[tokio::test]
async fn t33_a_slow_resource_never_blocks_another() {
    let h = Harness::start("", 0).await;
    h.upstream.hold(41);
    let (client, addr) = (h.client.clone(), h.addr());
    let a = tokio::spawn(async move { client.write(addr, "/db/a/x", 41).await.unwrap() });
    assert!(h.upstream.wait_arrived(41, SOON).await);
    let (client, addr) = (h.client.clone(), h.addr());
    let a2 = tokio::spawn(async move { client.write(addr, "/db/a/x", 42).await.unwrap() });
    let b = tokio::time::timeout(SOON, h.write("/db/b/x", 43)).await.expect("db/b is not blocked by db/a");
    assert_eq!(b.status, Status::OK);
    assert!(!a2.is_finished());
    h.upstream.release(41);
    assert_eq!(a.await.unwrap().status, Status::OK);
    assert_eq!(a2.await.unwrap().status, Status::OK);
    h.stop().await;
}

// ---- t40: unknown outcomes (P4) ----

async fn wait_indeterminate(admin: &AdminClient, resource: &str, want: bool) {
    for _ in 0..400 {
        if admin.resource(resource).await.unwrap().indeterminate.is_some() == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("resource {resource} never became indeterminate={want}");
}

/// P4: the upstream hangs past the timeout → 504, never retried; the
/// resource is indeterminate, so a higher token gets 503 + Retry-After; once
/// the upstream connection closed and the quarantine passed, it proceeds.
#[tokio::test]
async fn t40_unknown_outcome_then_quarantine() {
    let h = Harness::start("response = \"300ms\"\nquarantine = \"3s\"", 0).await;
    assert_eq!(h.write("/write", 40).await.status, Status::OK);
    h.upstream.hang(41);
    let unknown = h.write("/write", 41).await;
    assert_eq!(unknown.status, Status::GATEWAY_TIMEOUT, "{:?}", unknown.body);
    assert_eq!(unknown.json()["type"], "urn:fencer:proxy:outcome-unknown");
    assert_eq!(h.upstream.arrivals(41), 1, "an unknown outcome is never retried");
    let status = h.admin.resource("main").await.unwrap();
    assert!(status.indeterminate.is_some(), "{status:?}");

    // The quarantine (3 s) only starts once the hung connection closed, and
    // the marker was checked just above, so 42 arrives inside it.
    let refused = h.write("/write", 42).await;
    assert_eq!(
        refused.status,
        Status::SERVICE_UNAVAILABLE,
        "a higher token went through an indeterminate resource: {:?}",
        refused.body
    );
    assert_eq!(refused.json()["type"], "urn:fencer:proxy:indeterminate");
    assert!(refused.headers.contains_key("retry-after"));
    assert!(!h.upstream.has_arrived(42));
    wait_indeterminate(&h.admin, "main", false).await;
    assert_eq!(h.write("/write", 42).await.status, Status::OK);
    assert_eq!(h.upstream.arrivals(41), 1);
    h.stop().await;
}

/// P4: an operator can clear the marker (audited) before the quarantine.
#[tokio::test]
async fn t41_operator_clears_indeterminate() {
    let h = Harness::start("response = \"300ms\"\nquarantine = \"1h\"", 0).await;
    h.upstream.hang(41);
    assert_eq!(h.write("/write", 41).await.status, Status::GATEWAY_TIMEOUT);
    assert_eq!(h.write("/write", 42).await.status, Status::SERVICE_UNAVAILABLE);
    let cleared = h
        .admin
        .clear_indeterminate(&ClearIndeterminateRequest {
            resource: "main".into(),
            reason: "checked the db by hand".into(),
        })
        .await
        .unwrap();
    assert!(cleared.was_indeterminate);
    assert_eq!(h.write("/write", 42).await.status, Status::OK);
    let audit = std::fs::read_to_string(h.dir.path().join(fencer_proxy::AUDIT_LOG_FILE)).unwrap();
    assert!(audit.contains("clear_indeterminate") && audit.contains("checked the db by hand"), "{audit}");
    h.stop().await;
}

// ---- t50: operator epoch moves (P8) and the jump cap (P7 stand-in) ----

/// P8: raise-epoch fences everyone below it and is audited; it never
/// lowers E.
#[tokio::test]
async fn t50_raise_epoch_never_lowers() {
    let h = Harness::start("", 0).await;
    assert_eq!(h.write("/write", 10).await.status, Status::OK);
    let raised = h
        .admin
        .raise_epoch(&RaiseEpochRequest { resource: "main".into(), epoch: 100, reason: "maintenance".into() })
        .await
        .unwrap();
    assert_eq!(raised.epoch, 100);
    assert_eq!(h.write("/write", 99).await.status, Status::CONFLICT);
    let lower =
        h.admin.raise_epoch(&RaiseEpochRequest { resource: "main".into(), epoch: 50, reason: "oops".into() }).await;
    assert!(
        matches!(lower, Err(fencer_proxy::AdminClientError::Status { status, .. }) if status == Status::CONFLICT),
        "{lower:?}"
    );
    assert_eq!(h.admin.resource("main").await.unwrap().epoch, 100);
    assert_eq!(h.write("/write", 100).await.status, Status::OK);
    let audit = std::fs::read_to_string(h.dir.path().join(fencer_proxy::AUDIT_LOG_FILE)).unwrap();
    assert!(audit.contains("\"raise_epoch\"") && audit.contains("maintenance"), "{audit}");
    h.stop().await;
}

/// P7 stand-in: one request may not raise E by more than max_epoch_jump
/// (1000 in this config); a forged huge token cannot lock everyone out.
#[tokio::test]
async fn t51_token_jump_is_capped() {
    let h = Harness::start("", 5).await;
    let forged = h.write("/write", 5 + 1001).await;
    assert_eq!(forged.status, Status::UNPROCESSABLE_ENTITY, "{:?}", forged.body);
    assert!(h.upstream.events().is_empty());
    assert_eq!(h.write("/write", 5 + 1000).await.status, Status::OK);
    h.stop().await;
}

// ---- t60: lifecycle ----

/// Graceful shutdown: a request in flight when shutdown starts finishes.
#[tokio::test]
async fn t60_graceful_shutdown_lets_in_flight_requests_finish() {
    let mut h = Harness::start("", 0).await;
    h.upstream.hold(3);
    let (client, addr) = (h.client.clone(), h.addr());
    let a = tokio::spawn(async move { client.write(addr, "/write", 3).await });
    assert!(h.upstream.wait_arrived(3, SOON).await);
    let proxy = h.proxy.take().unwrap();
    let mut stopping = tokio::spawn(proxy.shutdown());
    // Shutdown has begun once the proxy accepts no new connection (it
    // closes its listener first): only then may the request go on.
    eventually("the proxy stopped accepting connections", SOON, || async move {
        tokio::net::TcpStream::connect(addr).await.is_err().then_some(())
    })
    .await;
    // A bounded look for something that must not happen: shutdown does not
    // return while the request is held (a pass cannot be a timing accident).
    let early = tokio::time::timeout(Duration::from_millis(300), &mut stopping).await;
    assert!(early.is_err(), "shutdown returned with a request in flight");
    h.upstream.release(3);
    let resp = a.await.unwrap().expect("the in-flight request got its answer");
    assert_eq!(resp.status, Status::OK);
    tokio::time::timeout(SOON, stopping).await.expect("shutdown completes").unwrap();
}

/// Bodies stream through intact in both directions (8 MiB up).
#[tokio::test]
async fn t61_large_bodies_stream_through() {
    let h = Harness::start("", 0).await;
    let body = vec![b'x'; 8 << 20];
    let resp = h.client.send(h.addr(), Method::POST, "/write", &[("fencing-token", "1")], body.clone()).await.unwrap();
    assert_eq!(resp.status, Status::OK);
    assert_eq!(h.upstream.bodies(1)[0].len(), body.len());
    h.stop().await;
}
