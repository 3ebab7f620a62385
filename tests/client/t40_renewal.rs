//! Renewal against a real in-process coordinator (DESIGN §5): a lease stays
//! held for many ttls; when the coordinator stops, the lease turns Uncertain
//! and then Lost no later than its local deadline; the deadline counts from
//! the send time of the request, never from the arrival of the answer.

use std::time::Duration;

use fencer_client::{AcquireError, LeaseState, LostReason};
use fencer_testkit::fault::FaultProxy;
use fencer_testkit::node;
use tokio::time::{Instant, sleep_until, timeout};

const TTL: Duration = Duration::from_millis(1000);

#[tokio::test]
async fn t40_renewal_keeps_a_lease_alive_for_many_ttls() {
    // Longer than the other tests' ttl: two slow commits in a row on a busy
    // machine must not end the lease.
    const TTL: Duration = Duration::from_millis(1500);
    let dir = tempfile::tempdir().unwrap();
    let node = node::start(dir.path()).await;
    let client = node::client(&node);
    let lease = client.acquire("t40/alive").ttl(TTL).await.unwrap();
    let first_deadline = lease.deadline();
    let lost = lease.lost();
    tokio::select! {
        reason = lost => panic!("lost while renewing: {reason}"),
        () = tokio::time::sleep(TTL * 7) => {}
    }
    assert!(!lease.check().is_lost());
    assert!(lease.deadline() > first_deadline + TTL * 5, "the deadline moved with the renewals");
    // The server agrees: still this lease, same token, nobody else can take it.
    let view = client.get("t40/alive").await.unwrap();
    assert!(view.held);
    assert_eq!(view.fencing_token, lease.token().get());
    let other = client.acquire("t40/alive").ttl(TTL).await;
    assert!(matches!(other, Err(AcquireError::NotAcquired(_))), "{other:?}");
    assert!(lease.release().await.unwrap().was_holder);
    assert!(!client.get("t40/alive").await.unwrap().held);
    node.shutdown().await;
}

#[tokio::test]
async fn t41_stopped_coordinator_makes_the_lease_uncertain_then_lost_by_its_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let node = node::start(dir.path()).await;
    let client = node::client(&node);
    let lease = client.acquire("t41/stop").ttl(TTL).await.unwrap();
    // Let a renewal or two happen first.
    let d0 = lease.deadline();
    for _ in 0..300 {
        if lease.deadline() > d0 + TTL / 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(lease.deadline() > d0, "renewed before the stop");
    let mut states = lease.state();
    assert_eq!(*states.borrow_and_update(), LeaseState::Held);

    node.shutdown().await;
    let stopped = Instant::now();
    // No renewal can succeed any more, so the deadline is fixed now, and it
    // counts from a send before the stop.
    let deadline = lease.deadline();
    assert!(deadline <= stopped + TTL - TTL / 10, "deadline {:?} after the stop", deadline - stopped);

    let mut uncertain_at = None;
    let lost_at = loop {
        let changed = timeout(TTL * 3, states.changed()).await;
        assert!(matches!(changed, Ok(Ok(()))), "no state change within 3 ttls");
        let now = Instant::now();
        match *states.borrow_and_update() {
            LeaseState::Uncertain => {
                uncertain_at.get_or_insert(now);
            }
            LeaseState::Lost(reason) => {
                assert_eq!(reason, LostReason::DeadlinePassed);
                break now;
            }
            LeaseState::Held => panic!("held again with the coordinator stopped"),
        }
    };
    let uncertain_at = uncertain_at.expect("Uncertain before Lost");
    assert!(uncertain_at < deadline, "uncertain {:?} after the deadline", uncertain_at - deadline);
    // Lost at the deadline: the watch a little later at worst (timer slack
    // on a busy machine), the clock check exactly.
    assert!(lost_at <= deadline + Duration::from_millis(500), "lost {:?} after the deadline", lost_at - deadline);
    assert!(lease.check().is_lost());
    drop(lease);
}

#[tokio::test]
async fn t42_deadline_counts_from_the_send_time_not_from_the_answer() {
    const TTL: Duration = Duration::from_secs(2);
    const DELAY: Duration = Duration::from_millis(400);
    let dir = tempfile::tempdir().unwrap();
    let node = node::start(dir.path()).await;
    let proxy = FaultProxy::start(node.local_addr()).await;
    // Every Acquire and Renew answer arrives 400 ms after the server sent it.
    proxy.faults().delay_answers = DELAY;
    let lease = proxy.client().acquire("t42/send").ttl(TTL).await.unwrap();
    let margin = TTL / 10;
    let acquire_seen = proxy.seen("acquire", "t42/send")[0].at;
    // The client sent the acquire before the fault layer saw it.
    assert!(
        lease.deadline() <= acquire_seen + TTL - margin,
        "first deadline {:?} past the grant's send time + ttl − margin",
        lease.deadline() - (acquire_seen + TTL - margin)
    );
    // The same for renewals: catch the moment the deadline moves.
    let mut checked = 0;
    let mut last = lease.deadline();
    let until = Instant::now() + TTL * 2;
    while Instant::now() < until && checked < 2 {
        let now = lease.deadline();
        if now != last {
            let sent_by = proxy.seen("renew", "t42/send").last().unwrap().at;
            assert!(now <= sent_by + TTL - margin, "renewal deadline {:?} too late", now - (sent_by + TTL - margin));
            last = now;
            checked += 1;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(checked, 2, "two renewals within two ttls");
    lease.release().await.unwrap();
    node.shutdown().await;
}

#[tokio::test]
async fn t41_the_clock_check_is_lost_exactly_at_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let node = node::start(dir.path()).await;
    let client = node::client(&node);
    let lease = client.acquire("t41/exact").ttl(TTL).await.unwrap();
    node.shutdown().await;
    let deadline = lease.deadline();
    sleep_until(deadline).await;
    assert!(lease.check().is_lost(), "at the deadline: {}", lease.check());
    assert!(!lease.is_held());
}
