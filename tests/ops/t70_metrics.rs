//! Metrics move as an operator expects (issue 7) through one end-to-end
//! scenario: an acquire, a conflict, an expiry, refused renewals and
//! requests, and writes through the proxy — one accepted, one fenced off
//! with a stale token, one without a token. Every assertion is on the
//! difference between two scrapes, so nothing depends on timing.

use std::time::Duration;

use crate::stack::{PROXY_RESOURCE, Stack};
use fencer_proto::v1::lock_client::LockClient;
use fencer_proto::v1::{AcquireRequest, GetLockRequest, RenewRequest};
use fencer_proxy::testing::Method;
use fencer_testkit::eventually;
use fencer_testkit::metrics::Exposition;

fn acquire_req(resource: &str, request_id: &str, ttl_ms: u64) -> AcquireRequest {
    AcquireRequest {
        resource: resource.into(),
        request_id: request_id.into(),
        ttl_ms: Some(ttl_ms),
        wait_timeout_ms: 0,
        holder: "t70".into(),
    }
}

/// How much each series moved between two scrapes.
fn delta(before: &Exposition, after: &Exposition, series: &str) -> f64 {
    after.get(series) - before.get(series)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t70_metrics_move_through_acquire_conflict_expiry_and_a_proxy_rejection() {
    let s = Stack::start().await;
    let (node0, proxy0) = (s.scrape_node().await, s.scrape_proxy().await);
    let mut c = LockClient::connect(format!("http://{}", s.node.local_addr())).await.unwrap();

    // The coordinator: an acquire, a conflict, an invalid name, a refused
    // renewal, and a lease that nobody renews.
    let g = c.acquire(acquire_req(PROXY_RESOURCE, "t70-holder-1", 30_000)).await.unwrap().into_inner();
    let conflict = c.acquire(acquire_req(PROXY_RESOURCE, "t70-other-01", 30_000)).await.unwrap_err();
    assert_eq!(conflict.code(), tonic::Code::Aborted);
    assert!(c.acquire(acquire_req("/not/a/name", "t70-invalid1", 30_000)).await.is_err());
    let bogus = RenewRequest { resource: PROXY_RESOURCE.into(), lease_id: "0".repeat(32) };
    assert_eq!(c.renew(bogus).await.unwrap_err().code(), tonic::Code::FailedPrecondition);
    c.acquire(acquire_req("t70/expiring", "t70-expire-1", 500)).await.unwrap();
    eventually("the unrenewed lease expires", Duration::from_secs(5), || {
        let mut c = c.clone();
        async move {
            let view = c.get_lock(GetLockRequest { resource: "t70/expiring".into() }).await.unwrap().into_inner();
            (!view.held).then_some(())
        }
    })
    .await;

    // The proxy: the holder's token is accepted (and raises the epoch), an
    // older one is fenced off, a write without a token is refused.
    let proxy = s.proxy.local_addr();
    assert!(s.http.write(proxy, "/write", g.fencing_token).await.unwrap().status.is_success());
    assert_eq!(s.http.write(proxy, "/write", g.fencing_token - 1).await.unwrap().status.as_u16(), 409);
    let untokened = s.http.send(proxy, Method::POST, "/write", &[], "x=1").await.unwrap();
    assert_eq!(untokened.status.as_u16(), 428);

    // The audit lines are written by the persister thread just after apply.
    let node1 = eventually("three audit lines written", Duration::from_secs(5), || async {
        let now = s.scrape_node().await;
        (delta(&node0, &now, "fencer_audit_lines_total") >= 3.0).then_some(now)
    })
    .await;
    let proxy1 = s.scrape_proxy().await;

    let d = |series: &str| delta(&node0, &node1, series);
    assert_eq!(d(r#"fencer_requests_total{op="acquire",outcome="ok"}"#), 2.0);
    assert_eq!(d(r#"fencer_requests_total{op="acquire",outcome="conflict"}"#), 1.0);
    assert_eq!(d(r#"fencer_requests_total{op="acquire",outcome="invalid"}"#), 1.0);
    assert_eq!(d(r#"fencer_requests_total{op="renew",outcome="not_holder"}"#), 1.0);
    assert_eq!(d(r#"fencer_request_duration_seconds_count{op="acquire"}"#), 4.0);
    assert_eq!(d(r#"fencer_request_duration_seconds_count{op="renew"}"#), 1.0);
    assert_eq!(d(r#"fencer_requests_total{op="acquire_wait",outcome="ok"}"#), 0.0);
    assert_eq!(d("fencer_lease_expirations_total"), 1.0);
    assert_eq!(d("fencer_renew_failures_total"), 1.0);
    assert_eq!(d("fencer_leader_changes_total"), 0.0, "nothing moved the leader");
    // Two grants and one expiry changed the lock table; nothing else did.
    assert_eq!(d("fencer_audit_lines_total"), 3.0);
    // Three acquires (granted, conflict, expiring) are entries; a renewal,
    // refused or not, is decided without one (docs/coordinator.md "Renewals").
    assert!(d("fencer_raft_commit_duration_seconds_count") >= 3.0, "each write commits through raft");
    assert_eq!(d("fencer_renewals_confirmed_total"), 0.0, "the refused renewal is not counted as confirmed");
    assert!(d("fencer_raft_log_fsync_duration_seconds_count") >= 1.0);
    assert!(d("fencer_raft_applied_index") >= 4.0);
    assert_eq!(node1.get("fencer_locks_held"), 1.0, "the holder's lock; the expired one is gone");
    assert_eq!(node1.get("fencer_waiters"), 0.0);
    assert_eq!(node1.get("fencer_waiters_limit"), 100_000.0);
    for gauge in ["fencer_ready", "fencer_raft_is_leader", "fencer_raft_has_leader", "fencer_leader_ready"] {
        assert_eq!(node1.get(gauge), 1.0, "{gauge}");
    }
    assert!(node1.get("fencer_raft_term") >= 1.0);
    assert!(!node1.text.contains("t70/expiring") && !node1.text.contains("db/main"), "no resource name is a label");

    let p = |series: &str| delta(&proxy0, &proxy1, series);
    assert_eq!(p(r#"fencer_proxy_accepted_total{kind="write"}"#), 1.0);
    assert_eq!(p(r#"fencer_proxy_rejected_total{reason="stale_token"}"#), 1.0);
    assert_eq!(p(r#"fencer_proxy_rejected_total{reason="missing_token"}"#), 1.0);
    assert_eq!(p("fencer_proxy_epoch_advances_total"), 1.0);
    assert_eq!(p("fencer_proxy_upstream_latency_seconds_count"), 1.0);
    assert_eq!(proxy1.get("fencer_proxy_indeterminate_resources"), 0.0);
    assert!(!proxy1.text.contains("db/main"), "no resource name is a label");
    s.stop().await;
}
