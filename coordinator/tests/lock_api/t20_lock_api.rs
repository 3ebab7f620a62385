//! End to end over gRPC on one node (issue "Coordinator core"): grant,
//! conflict, waiting, wait timeout, cancel on disconnect, stale release (I4),
//! retries with the same request id (I7), expiry and promotion.

use std::time::Duration;

use fencer_proto::v1::lock_client::LockClient;
use fencer_proto::v1::{GetLockRequest, ListLocksRequest, ReleaseRequest, RenewRequest};
use fencer_testkit::eventually;
use fencer_testkit::grpc::reason;
use fencer_testkit::node::{acquire, grpc_client as client, start};
use tonic::Code;
use tonic::transport::Channel;

/// How long a waiter may take to show up in (or leave) the queue.
const SOON: Duration = Duration::from_secs(10);

/// Waits until `resource` has exactly `n` waiters (GetLock's count): the
/// queue is observed, never assumed from a sleep.
async fn waiters_become(c: &LockClient<Channel>, resource: &str, n: u32) {
    eventually(&format!("{n} waiter(s) queued on {resource}"), SOON, || {
        let mut c = c.clone();
        async move {
            let view = c.get_lock(GetLockRequest { resource: resource.into() }).await.unwrap().into_inner();
            (view.waiters == n).then_some(())
        }
    })
    .await;
}

#[tokio::test]
async fn t20_grant_then_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path()).await;
    let mut c = client(&node).await;
    let a = acquire(&mut c, "orders/1", "request-a-1", 5_000, 0).await.unwrap();
    assert_eq!(a.lease_id.len(), 32);
    assert!(a.fencing_token > 0);
    let err = acquire(&mut c, "orders/1", "request-b-1", 5_000, 0).await.unwrap_err();
    assert_eq!(err.code(), Code::Aborted);
    assert_eq!(reason(&err), "LOCK_HELD");
    let view = c.get_lock(GetLockRequest { resource: "orders/1".into() }).await.unwrap().into_inner();
    assert!(view.held);
    assert_eq!(view.fencing_token, a.fencing_token);
    assert_eq!(view.holder, "test/request-a-1");
    node.shutdown().await;
}

#[tokio::test]
async fn t21_retry_with_same_request_id_returns_the_same_lease() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path()).await;
    let mut c = client(&node).await;
    let first = acquire(&mut c, "jobs/x", "retry-me-please", 5_000, 0).await.unwrap();
    let again = acquire(&mut c, "jobs/x", "retry-me-please", 5_000, 0).await.unwrap();
    assert_eq!((first.lease_id.clone(), first.fencing_token), (again.lease_id, again.fencing_token));
    // The same request id on another resource is a caller bug, named as such.
    let err = acquire(&mut c, "jobs/y", "retry-me-please", 5_000, 0).await.unwrap_err();
    assert_eq!(reason(&err), "REQUEST_ID_REUSED");
    node.shutdown().await;
}

#[tokio::test]
async fn t22_stale_release_does_not_free_a_newer_holder() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path()).await;
    let mut c = client(&node).await;
    let a = acquire(&mut c, "r", "holder-a-0001", 5_000, 0).await.unwrap();
    c.release(ReleaseRequest { resource: "r".into(), lease_id: a.lease_id.clone() }).await.unwrap();
    let b = acquire(&mut c, "r", "holder-b-0001", 5_000, 0).await.unwrap();
    assert!(b.fencing_token > a.fencing_token);
    // A's release retried after B got the lock: idempotent, and B keeps it.
    let again =
        c.release(ReleaseRequest { resource: "r".into(), lease_id: a.lease_id.clone() }).await.unwrap().into_inner();
    assert!(again.released && !again.was_holder);
    let err = c.renew(RenewRequest { resource: "r".into(), lease_id: a.lease_id.clone() }).await.unwrap_err();
    assert_eq!(reason(&err), "NOT_HOLDER");
    let view = c.get_lock(GetLockRequest { resource: "r".into() }).await.unwrap().into_inner();
    assert_eq!(view.fencing_token, b.fencing_token);
    // An unknown lease id is refused too.
    let err = c.release(ReleaseRequest { resource: "r".into(), lease_id: "0".repeat(32) }).await.unwrap_err();
    assert_eq!(reason(&err), "NOT_HOLDER");
    node.shutdown().await;
}

#[tokio::test]
async fn t23_wait_then_grant_in_fifo_order() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path()).await;
    let mut c = client(&node).await;
    let a = acquire(&mut c, "q", "holder-a-0001", 5_000, 0).await.unwrap();
    let mut cb = c.clone();
    let b = tokio::spawn(async move { acquire(&mut cb, "q", "waiter-b-0001", 5_000, 10_000).await });
    // B is queued before C is even sent: FIFO order is B, C.
    waiters_become(&c, "q", 1).await;
    let mut cc = c.clone();
    let cwait = tokio::spawn(async move { acquire(&mut cc, "q", "waiter-c-0001", 5_000, 10_000).await });
    waiters_become(&c, "q", 2).await;
    c.release(ReleaseRequest { resource: "q".into(), lease_id: a.lease_id }).await.unwrap();
    let b = tokio::time::timeout(SOON, b).await.expect("B, first in the queue, is granted").unwrap().unwrap();
    assert!(b.waited);
    assert!(b.fencing_token > a.fencing_token);
    // Only B woke: C still waits, behind B.
    let view = c.get_lock(GetLockRequest { resource: "q".into() }).await.unwrap().into_inner();
    assert_eq!((view.holder.as_str(), view.waiters), ("test/waiter-b-0001", 1));
    assert!(!cwait.is_finished());
    c.release(ReleaseRequest { resource: "q".into(), lease_id: b.lease_id }).await.unwrap();
    let cgrant = cwait.await.unwrap().unwrap();
    assert!(cgrant.fencing_token > b.fencing_token);
    node.shutdown().await;
}

#[tokio::test]
async fn t24_wait_timeout_cancels_the_slot() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path()).await;
    let mut c = client(&node).await;
    let a = acquire(&mut c, "t", "holder-a-0001", 5_000, 0).await.unwrap();
    let err = acquire(&mut c, "t", "waiter-b-0001", 5_000, 300).await.unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded);
    assert_eq!(reason(&err), "WAIT_TIMEOUT");
    let view = c.get_lock(GetLockRequest { resource: "t".into() }).await.unwrap().into_inner();
    assert_eq!(view.waiters, 0, "the slot was cancelled through the log");
    // A retry of the timed-out request id returns the same outcome (I7).
    let err = acquire(&mut c, "t", "waiter-b-0001", 5_000, 300).await.unwrap_err();
    assert_eq!(reason(&err), "WAIT_TIMEOUT");
    // Releasing A leaves the lock free: nobody was promoted.
    c.release(ReleaseRequest { resource: "t".into(), lease_id: a.lease_id }).await.unwrap();
    assert!(!c.get_lock(GetLockRequest { resource: "t".into() }).await.unwrap().into_inner().held);
    node.shutdown().await;
}

#[tokio::test]
async fn t25_a_disconnected_waiter_is_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path()).await;
    let mut c = client(&node).await;
    let a = acquire(&mut c, "d", "holder-a-0001", 5_000, 0).await.unwrap();
    // A separate connection that goes away while waiting.
    let mut other = client(&node).await;
    let waiter = tokio::spawn(async move { acquire(&mut other, "d", "waiter-gone-01", 5_000, 30_000).await });
    // The waiter has queued: without this the test would pass on a waiter
    // that never waited.
    waiters_become(&c, "d", 1).await;
    waiter.abort();
    let _ = waiter.await;
    // The departed caller's slot is cancelled.
    waiters_become(&c, "d", 0).await;
    c.release(ReleaseRequest { resource: "d".into(), lease_id: a.lease_id }).await.unwrap();
    assert!(!c.get_lock(GetLockRequest { resource: "d".into() }).await.unwrap().into_inner().held);
    node.shutdown().await;
}

/// A's ttl in t26: long enough for B and C to queue behind A on a loaded
/// machine (the test checks they did, before A expired).
const TTL_MS: u64 = 2_000;

#[tokio::test]
async fn t26_expiry_frees_the_lock_after_its_ttl_and_promotes_exactly_one_waiter() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path()).await;
    let mut c = client(&node).await;
    let t0 = tokio::time::Instant::now();
    let a = acquire(&mut c, "e", "holder-a-0001", TTL_MS, 0).await.unwrap();
    let mut cb = c.clone();
    let b = tokio::spawn(async move { acquire(&mut cb, "e", "waiter-b-0001", 5_000, 10_000).await });
    // B is queued before C is sent, so B is first (FIFO), whatever the
    // scheduling of the two tasks.
    waiters_become(&c, "e", 1).await;
    let mut cc = c.clone();
    let cw = tokio::spawn(async move { acquire(&mut cc, "e", "waiter-c-0001", 5_000, 10_000).await });
    waiters_become(&c, "e", 2).await;
    assert!(t0.elapsed() < Duration::from_millis(TTL_MS), "both queued while A held the lock: {:?}", t0.elapsed());
    let b = tokio::time::timeout(SOON, b).await.expect("B, first in the queue, is granted").unwrap().unwrap();
    assert!(t0.elapsed() >= Duration::from_millis(TTL_MS), "expired before its ttl: {:?}", t0.elapsed());
    assert!(b.waited && b.fencing_token > a.fencing_token);
    // A's lease is gone: renewing says so.
    let err = c.renew(RenewRequest { resource: "e".into(), lease_id: a.lease_id }).await.unwrap_err();
    assert_eq!(reason(&err), "LEASE_EXPIRED");
    // Exactly one waiter was promoted: C still waits behind B.
    let view = c.get_lock(GetLockRequest { resource: "e".into() }).await.unwrap().into_inner();
    assert_eq!((view.fencing_token, view.waiters), (b.fencing_token, 1));
    assert!(!cw.is_finished());
    cw.abort();
    node.shutdown().await;
}

#[tokio::test]
async fn t27_renewal_keeps_the_lease_alive() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path()).await;
    let mut c = client(&node).await;
    let a = acquire(&mut c, "kept", "holder-a-0001", 600, 0).await.unwrap();
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let r =
            c.renew(RenewRequest { resource: "kept".into(), lease_id: a.lease_id.clone() }).await.unwrap().into_inner();
        assert_eq!(r.fencing_token, a.fencing_token);
    }
    let view = c.get_lock(GetLockRequest { resource: "kept".into() }).await.unwrap().into_inner();
    assert!(view.held && view.fencing_token == a.fencing_token);
    node.shutdown().await;
}

#[tokio::test]
async fn t28_invalid_input_names_the_rule() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path()).await;
    let mut c = client(&node).await;
    for (resource, rid, ttl) in [("a//b", "request-1", 5_000), ("ok", "short", 5_000), ("ok", "request-1", 10)] {
        let err = acquire(&mut c, resource, rid, ttl, 0).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{resource} {rid} {ttl}");
        assert_eq!(reason(&err), "INVALID_ARGUMENT");
    }
    let err = acquire(&mut c, "a//b", "request-1", 5_000, 0).await.unwrap_err();
    assert!(err.message().contains("'//'"), "{}", err.message());
    let err = c.renew(RenewRequest { resource: "ok".into(), lease_id: "xyz".into() }).await.unwrap_err();
    assert!(err.message().contains("lease_id"), "{}", err.message());
    node.shutdown().await;
}

#[tokio::test]
async fn t29_list_pages_through_held_locks() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path()).await;
    let mut c = client(&node).await;
    for i in 0..5 {
        acquire(&mut c, &format!("list/{i}"), &format!("list-request-{i}"), 5_000, 0).await.unwrap();
    }
    acquire(&mut c, "other/1", "other-request-1", 5_000, 0).await.unwrap();
    let p1 = c
        .list_locks(ListLocksRequest { prefix: "list/".into(), page_size: 3, page_token: String::new() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(p1.locks.len(), 3);
    let p2 = c
        .list_locks(ListLocksRequest { prefix: "list/".into(), page_size: 3, page_token: p1.next_page_token.clone() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(p2.locks.len(), 2);
    assert!(p2.next_page_token.is_empty());
    let names: Vec<_> = p1.locks.iter().chain(&p2.locks).map(|l| l.resource.clone()).collect();
    assert_eq!(names, ["list/0", "list/1", "list/2", "list/3", "list/4"]);
    node.shutdown().await;
}
