//! The Batch call (issue 18): several Acquire, Renew and Release calls in
//! one request, each answered as the same call sent alone would be, in the
//! request's order; the renewals share one quorum confirmation and write no
//! log entry; the limits are refused by name.

use fencer_proto::v1::lock_client::LockClient;
use fencer_proto::v1::{
    AcquireResponse, BatchItem, BatchRequest, BatchResult, GetLockRequest, ReleaseRequest, RenewRequest, batch_item,
    batch_result,
};
use fencer_testkit::grpc::reason;
use fencer_testkit::metrics::Exposition;
use fencer_testkit::node::{acquire, acquire_req, grpc_client as client, start};
use tonic::transport::Channel;
use tonic::{Code, Status};

fn acquire_item(resource: &str, request_id: &str, wait_ms: u64) -> BatchItem {
    BatchItem { call: Some(batch_item::Call::Acquire(acquire_req(resource, request_id, 5_000, wait_ms))) }
}

fn renew_item(resource: &str, lease_id: &str) -> BatchItem {
    BatchItem {
        call: Some(batch_item::Call::Renew(RenewRequest { resource: resource.into(), lease_id: lease_id.into() })),
    }
}

fn release_item(resource: &str, lease_id: &str) -> BatchItem {
    BatchItem {
        call: Some(batch_item::Call::Release(ReleaseRequest { resource: resource.into(), lease_id: lease_id.into() })),
    }
}

async fn batch(c: &mut LockClient<Channel>, items: Vec<BatchItem>) -> Result<Vec<BatchResult>, Status> {
    c.batch(BatchRequest { items }).await.map(|r| r.into_inner().results)
}

/// An item's error as the status a call sent alone gets.
fn error_of(r: &BatchResult) -> Status {
    match &r.result {
        Some(batch_result::Result::Error(e)) => Status::from(e),
        other => panic!("expected an error, got {other:?}"),
    }
}

fn granted(r: &BatchResult) -> AcquireResponse {
    match &r.result {
        Some(batch_result::Result::Acquire(g)) => g.clone(),
        other => panic!("expected a grant, got {other:?}"),
    }
}

#[tokio::test]
async fn t38_a_batch_is_answered_item_by_item_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path()).await;
    let mut c = client(&node).await;
    let held = acquire(&mut c, "b/held", "holder-held-1", 5_000, 0).await.unwrap();
    let gone = acquire(&mut c, "b/gone", "holder-gone-1", 5_000, 0).await.unwrap();

    let results = batch(
        &mut c,
        vec![
            acquire_item("b/one", "batch-one-0001", 0),
            acquire_item("b/held", "batch-held-0001", 0),
            renew_item("b/held", &held.lease_id),
            release_item("b/gone", &gone.lease_id),
            acquire_item("b/two", "batch-two-0001", 0),
            acquire_item("b/wait", "batch-wait-0001", 1_000),
            BatchItem { call: None },
            renew_item("b/gone", "0123456789abcdef0123456789abcdef"),
            acquire_item("b//bad", "batch-bad-0001", 0),
        ],
    )
    .await
    .unwrap();
    assert_eq!(results.len(), 9);
    let (one, two) = (granted(&results[0]), granted(&results[4]));
    assert_eq!((one.resource.as_str(), two.resource.as_str()), ("b/one", "b/two"));
    assert_ne!(one.fencing_token, two.fencing_token, "each grant is its own entry (I2)");
    let conflict = error_of(&results[1]);
    assert_eq!((conflict.code(), reason(&conflict).as_str()), (Code::Aborted, "LOCK_HELD"));
    match &results[2].result {
        Some(batch_result::Result::Renew(r)) => assert_eq!(r.fencing_token, held.fencing_token),
        other => panic!("the renewal: {other:?}"),
    }
    match &results[3].result {
        Some(batch_result::Result::Release(r)) => assert!(r.released && r.was_holder),
        other => panic!("the release: {other:?}"),
    }
    for (i, field) in [(5, "wait_timeout_ms"), (6, "call"), (8, "resource")] {
        let e = error_of(&results[i]);
        assert_eq!((e.code(), reason(&e).as_str()), (Code::InvalidArgument, "INVALID_ARGUMENT"), "item {i}");
        assert!(e.message().starts_with(&format!("invalid argument: {field}:")), "item {i}: {}", e.message());
    }
    assert_eq!(reason(&error_of(&results[7])), "NOT_HOLDER");

    // Each item did exactly what it said: the waiting acquire never queued.
    let view = |r: &str| {
        let (mut c, r) = (c.clone(), r.to_string());
        async move { c.get_lock(GetLockRequest { resource: r }).await.unwrap().into_inner() }
    };
    assert!(view("b/one").await.held && view("b/two").await.held);
    assert!(!view("b/gone").await.held && !view("b/wait").await.held);
    assert_eq!(view("b/held").await.fencing_token, held.fencing_token, "the conflict did not take it");

    // A retried batch acquire is the same grant (I7), as a single call.
    let again = batch(&mut c, vec![acquire_item("b/one", "batch-one-0001", 0)]).await.unwrap();
    assert_eq!(granted(&again[0]).lease_id, one.lease_id);
    node.shutdown().await;
}

#[tokio::test]
async fn t38_renewals_in_a_batch_share_one_confirmation_and_write_no_entry() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path()).await;
    let mut c = client(&node).await;
    let mut leases = Vec::new();
    for i in 0..20 {
        let r = format!("b/renew/{i}");
        let g = acquire(&mut c, &r, &format!("holder-renew-{i:03}"), 5_000, 0).await.unwrap();
        leases.push((r, g));
    }
    let before = node.service().status().last_log_index;
    let confirmed = node.metrics().renewals_confirmed.get();
    let items = leases.iter().map(|(r, g)| renew_item(r, &g.lease_id)).collect();
    let results = batch(&mut c, items).await.unwrap();
    for ((_, g), r) in leases.iter().zip(&results) {
        match &r.result {
            Some(batch_result::Result::Renew(ok)) => {
                assert_eq!(ok.fencing_token, g.fencing_token);
                assert!(ok.expires_at_unix_ms >= g.expires_at_unix_ms, "the deadline moved on");
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(node.service().status().last_log_index, before, "no log entry for the renewals");
    assert_eq!(node.metrics().renewals_confirmed.get(), confirmed + 20);
    let scrape = Exposition::parse(&node.metrics().encode());
    assert_eq!(scrape.get("fencer_batch_items_count"), 1.0);
    assert_eq!(scrape.get("fencer_batch_items_sum"), 20.0);
    node.shutdown().await;
}

#[tokio::test]
async fn t38_an_empty_or_oversized_batch_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path()).await;
    let mut c = client(&node).await;
    let too_many = (0..257).map(|i| renew_item(&format!("b/{i}"), "0123456789abcdef0123456789abcdef")).collect();
    for (items, count) in [(Vec::new(), 0), (too_many, 257)] {
        let e = batch(&mut c, items).await.unwrap_err();
        assert_eq!((e.code(), reason(&e).as_str()), (Code::InvalidArgument, "INVALID_ARGUMENT"));
        assert_eq!(e.message(), format!("invalid argument: items: {count} items is outside 1..=256"));
    }
    let full = (0..256).map(|i| renew_item(&format!("b/{i}"), "0123456789abcdef0123456789abcdef")).collect();
    let results = batch(&mut c, full).await.unwrap();
    assert!(results.iter().all(|r| reason(&error_of(r)) == "NOT_HOLDER"), "256 items is allowed");
    node.shutdown().await;
}
