//! Regression (issue 18's 15-minute history run of 2026-12-05, seed
//! 1796508403845688240, I1): a leader that loses its quorum and regains it
//! without an election took over its leases again before it had applied an
//! `Expire` it had appended while it still had its quorum. The takeover
//! restarted that lease's deadline, a renewal without a log entry
//! succeeded, and the `Expire` committed after it (its `basis_index` cannot
//! see such a renewal) and ended the lease just reported renewed: a second
//! holder was granted within the renewed ttl. The takeover now waits until
//! everything in the leader's own log is applied (`leadership.rs`,
//! `linearize`).
//!
//! Deterministic: appends carrying entries are held back while heartbeats
//! pass, so the `Expire` stays uncommitted through the quorum loss and the
//! takeover. Without the fix the renewal succeeds in every run.

use std::time::Duration;

use fencer_coordinator::NodeId;
use fencer_testkit::cluster::{Cluster, ELECTION_MAX};
use fencer_testkit::history::{History, check_all};

/// Slack on top of one election timeout for timers on a busy 2-core machine.
const SLACK: Duration = Duration::from_millis(400);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t90_regression_an_expire_left_in_the_log_by_a_quorum_loss_ends_no_lease_reported_renewed() {
    let c = Cluster::start(3).await;
    let h = History::new();
    let leader = c.leader(Duration::from_secs(10)).await;
    let ttl = 1_000;
    let g = c.acquire(&h, leader, "expire/a", "expire-a-0001", ttl, 0).await.unwrap();
    let followers: Vec<NodeId> = c.ids().into_iter().filter(|n| *n != leader).collect();
    // Heartbeats keep the leader acknowledged; nothing it appends commits.
    for f in &followers {
        c.hold_entries(leader, *f);
    }
    tokio::time::sleep(Duration::from_millis(ttl) + SLACK).await;
    let s = c.node(leader).service().status();
    assert!(
        s.last_log_index > s.commit_index,
        "the expiry task's Expire waits, uncommitted, in the leader's log: {s:?}"
    );
    let waiting = s.last_log_index;

    // The quorum goes, and comes back without an election.
    for f in &followers {
        c.crash(*f).await;
    }
    tokio::time::sleep(ELECTION_MAX + SLACK).await;
    assert_eq!(c.http_get(leader, "/readyz").await.map(|r| r.0), Some(503), "the lone leader has no quorum");
    for f in &followers {
        c.restart(*f).await;
    }
    tokio::time::sleep(ELECTION_MAX + SLACK).await;
    let s = c.node(leader).service().status();
    assert_eq!(s.state, "leader", "the same leader, acknowledged again: {s:?}");
    assert!(s.commit_index < waiting, "the Expire is still held back: {s:?}");

    // A renewal now must not win over the Expire waiting in the log.
    let renew = c.renew(&h, leader, "expire/a", &g.lease_id);
    let heal = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        c.heal();
    };
    let (renewed, ()) = tokio::join!(renew, heal);
    let next = c.acquire(&h, leader, "expire/a", "expire-b-0001", ttl, 5_000).await;
    check_all(&h.ops());
    assert!(renewed.is_err(), "a lease whose Expire was in the log was reported renewed: {renewed:?}");
    assert!(next.is_ok_and(|n| n.fencing_token > g.fencing_token), "the expired lock is granted to the next client");
    c.shutdown().await;
}
