//! Retries of unknown outcomes (DESIGN §2, §5, I7), through a fault layer
//! that loses answers or cuts calls between the client and the coordinator:
//!
//! - t45: a lost Acquire answer is retried with the same request id and
//!   returns the same lease (id and token) the server granted the first
//!   time — both when the loss looks like a broken connection and when the
//!   server says OUTCOME_UNKNOWN.
//! - t46: a waiting Acquire whose call is cut is retried with the same
//!   request id and re-parks in its own queue slot: never a second waiter.
//!   When the server did notice the cut and cancelled the slot, the client
//!   starts over with a fresh id only after that cancellation — still never
//!   two waiters at once.

use std::collections::BTreeSet;
use std::time::Duration;

use fencer_client::Client;
use fencer_testkit::fault::{FaultProxy, Loss};
use fencer_testkit::node;
use tokio::time::Instant;

#[tokio::test]
async fn t45_a_lost_answer_is_retried_with_the_same_request_id_and_returns_the_same_lease() {
    let dir = tempfile::tempdir().unwrap();
    let node = node::start(dir.path()).await;
    let proxy = FaultProxy::start(node.local_addr()).await;
    let direct = node::client(&node);
    for (loss, resource) in [(Loss::Transport, "t45/transport"), (Loss::OutcomeUnknown, "t45/unknown")] {
        {
            let mut f = proxy.faults();
            f.drop_acquire_answers = 1;
            f.loss = Some(loss);
        }
        let lease = proxy.client().acquire(resource).ttl(Duration::from_secs(5)).await.unwrap();
        let attempts = proxy.seen("acquire", resource);
        assert!(attempts.len() >= 2, "{loss:?}: the lost answer was retried: {attempts:?}");
        assert!(
            attempts.iter().all(|a| a.request_id == lease.request_id()),
            "{loss:?}: every attempt carries the same request id: {attempts:?}"
        );
        let lost_answer = proxy.faults().dropped.pop().unwrap().expect("the first attempt was granted");
        assert_eq!(lost_answer.lease_id, lease.lease_id().to_string(), "{loss:?}: the same lease");
        assert_eq!(lost_answer.fencing_token, lease.token().get(), "{loss:?}: the same token");
        let view = direct.get(resource).await.unwrap();
        assert_eq!(view.fencing_token, lease.token().get());
        lease.release().await.unwrap();
    }
    node.shutdown().await;
}

/// Samples the waiter count of `resource` until `until`, returning the largest.
async fn max_waiters(client: &Client, resource: &str, until: Instant) -> u32 {
    let mut max = 0;
    while Instant::now() < until {
        max = max.max(client.get(resource).await.unwrap().waiters);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    max
}

#[tokio::test]
async fn t46_retries_of_a_waiting_acquire_never_create_a_second_waiter() {
    let ttl = Duration::from_secs(10);
    let dir = tempfile::tempdir().unwrap();
    let node = node::start(dir.path()).await;
    let proxy = FaultProxy::start(node.local_addr()).await;
    let direct = node::client(&node);

    for (cancel_upstream, resource) in [(false, "t46/kept"), (true, "t46/cancelled")] {
        let a = direct.acquire(resource).ttl(ttl).await.unwrap();
        {
            let mut f = proxy.faults();
            f.cut_acquires = 1;
            f.cut_after = Duration::from_millis(300);
            f.cancel_upstream = cancel_upstream;
        }
        let b_client = proxy.client();
        let r = resource.to_string();
        let b = tokio::spawn(async move { b_client.acquire(r).ttl(ttl).wait(Duration::from_secs(20)).await });
        // The cut happens at 300 ms; the retry follows within a backoff.
        let max = max_waiters(&direct, resource, Instant::now() + Duration::from_millis(1500)).await;
        assert_eq!(max, 1, "cancel_upstream={cancel_upstream}: at most one waiter, ever");
        let attempts = proxy.seen("acquire", resource);
        assert!(attempts.len() >= 2, "the cut call was retried: {attempts:?}");
        let ids: BTreeSet<_> = attempts.iter().map(|a| a.request_id.clone()).collect();
        if cancel_upstream {
            // The server cancelled the slot (it saw the call go); the retry
            // learned that (an early WAIT_TIMEOUT) and the client started
            // over with a fresh id.
            assert_eq!(ids.len(), 2, "{attempts:?}");
        } else {
            assert_eq!(ids.len(), 1, "every retry with the same request id: {attempts:?}");
        }
        // Retries ask to wait only for what is left of the caller's budget.
        assert!(attempts.windows(2).all(|w| w[1].wait_ms < w[0].wait_ms), "{attempts:?}");

        assert!(a.release().await.unwrap().was_holder);
        let b = tokio::time::timeout(Duration::from_secs(10), b).await.expect("B is granted").unwrap().unwrap();
        let view = direct.get(resource).await.unwrap();
        assert_eq!((view.held, view.fencing_token, view.waiters), (true, b.token().get(), 0));
        assert!(b.is_held());
        b.release().await.unwrap();
    }
    node.shutdown().await;
}
