//! Quorum (I5): a leader cut off from its majority stops granting and
//! renewing within one election timeout and answers UNAVAILABLE / NO_QUORUM,
//! while the majority elects a new leader and carries on; with two of three
//! nodes down nothing is granted and the state survives recovery.

use std::time::Duration;

use fencer_coordinator::NodeId;
use fencer_proto::v1::GetLockRequest;
use fencer_testkit::cluster::replicas::assert_replicas_agree;
use fencer_testkit::cluster::{Cluster, ELECTION_MAX};
use fencer_testkit::eventually;
use fencer_testkit::history::{Answer, Call, History, Op, check_all};

/// Slack on top of one election timeout for timers on a busy 2-core machine.
const SLACK: Duration = Duration::from_millis(400);

/// Sends, to node `n`, an acquire of a fresh resource, a renewal of `held`
/// and a Batch of two more renewals of it (sharing one quorum
/// confirmation) every 50 ms for `run`. The calls overlap: those accepted
/// before the quorum lease ran out wait until it did, the rest go on.
async fn hammer(c: &Cluster, h: &History, n: NodeId, run: Duration, held: (&str, &str), tag: &str) {
    let rounds = (run.as_millis() / 50) as u64;
    let calls = (0..rounds).map(|i| async move {
        tokio::time::sleep(Duration::from_millis(50 * i)).await;
        let (resource, request_id) = (format!("{tag}/new-{i}"), format!("{tag}-request-{i:04}"));
        let acquire = c.acquire(h, n, &resource, &request_id, 1_000, 0);
        let renew = c.renew(h, n, held.0, held.1);
        let batched = c.renew_batched(h, n, held.0, held.1, 2);
        let _ = tokio::join!(acquire, renew, batched);
    });
    futures::future::join_all(calls).await;
}

/// The operations sent to node `n` after `after`.
fn sent_after(ops: &[Op], n: NodeId, after: Duration) -> impl Iterator<Item = &Op> {
    let client = format!("node {n}");
    ops.iter().filter(move |op| op.client == client && op.sent > after)
}

fn is_success(a: &Answer) -> bool {
    matches!(a, Answer::Granted { .. } | Answer::Renewed { .. } | Answer::Released | Answer::AlreadyReleased)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t50_isolated_old_leader_cannot_grant_or_renew_after_one_election_timeout() {
    let c = Cluster::start(3).await;
    let h = History::new();
    let old = c.leader(Duration::from_secs(10)).await;
    let majority: Vec<NodeId> = c.ids().into_iter().filter(|n| *n != old).collect();

    let held = c.acquire(&h, old, "iso/held", "iso-holder-0001", 1_500, 0).await.expect("grant before the partition");
    c.renew(&h, old, "iso/held", &held.lease_id).await.expect("renew before the partition");

    c.isolate(old);
    let isolated = h.now();

    // The minority side is asked for grants and renewals from the moment it
    // is cut off; meanwhile the majority elects a leader.
    let minority = hammer(&c, &h, old, ELECTION_MAX * 4, ("iso/held", &held.lease_id), "iso");
    let new_leader = async {
        let l = c.leader_among(&majority, Duration::from_secs(10)).await;
        // The majority grants what the minority could not: a fresh resource…
        let fresh = c.acquire(&h, l, "iso/new-1", "iso-majority-0001", 1_000, 0).await;
        // …and the held one, once its holder (who cannot renew) lost it.
        let taken = c.acquire(&h, l, "iso/held", "iso-majority-0002", 1_000, 10_000).await;
        (l, fresh, taken)
    };
    let ((), (new, fresh, taken)) = tokio::join!(minority, new_leader);
    assert_ne!(new, old);

    let ops = h.ops();
    // Nothing the minority was asked after the isolation succeeded…
    for op in sent_after(&ops, old, isolated) {
        assert!(!is_success(&op.answer), "the isolated old leader reported success: {op:?}");
        // …and none was held to the write timeout (2 s here): what it had
        // accepted answers OUTCOME_UNKNOWN once its quorum lease ran out,
        // so the caller looks for the new leader at once.
        let lease_end = isolated + ELECTION_MAX;
        assert!(
            op.answered < op.sent.max(lease_end) + SLACK,
            "the isolated old leader held a call {:?} past the end of its quorum lease ({ELECTION_MAX:?} \
             after the isolation): {op:?}",
            op.answered.saturating_sub(op.sent.max(lease_end))
        );
    }
    let unknown = sent_after(&ops, old, isolated)
        .filter(|op| matches!(&op.answer, Answer::Unavailable { reason } if reason.starts_with("OUTCOME_UNKNOWN")))
        .count();
    assert!(unknown >= 1, "no call was accepted before the quorum lease ran out; the test lost its point");
    // …and after one election timeout it refuses at once with NO_QUORUM.
    let mut refused = 0;
    for op in sent_after(&ops, old, isolated + ELECTION_MAX + SLACK) {
        match &op.answer {
            Answer::Unavailable { reason } if reason.starts_with("NO_QUORUM") => refused += 1,
            other => {
                panic!("after one election timeout the old leader must answer NO_QUORUM, got {other:?} for {op:?}")
            }
        }
        assert!(op.answered - op.sent < Duration::from_secs(1), "NO_QUORUM must come at once: {op:?}");
    }
    assert!(refused >= 4, "too few calls reached the old leader after the election timeout ({refused})");
    let (code, body) = c.http_get(old, "/readyz").await.expect("readyz answers");
    assert_eq!(code, 503, "the isolated old leader must not be ready: {body}");
    assert_eq!(c.http_get(new, "/readyz").await.map(|r| r.0), Some(200));

    // The majority granted the same resource, with larger tokens.
    let fresh = fresh.expect("the majority grants a fresh resource");
    let taken = taken.expect("the majority grants the held resource once its lease ran out");
    assert!(fresh.fencing_token > held.fencing_token && taken.fencing_token > held.fencing_token);

    // Healed, the old leader follows; nothing it accepted alone survives.
    c.heal();
    eventually("the old leader follows the new one", Duration::from_secs(10), || async {
        let s = c.node(old).service().status();
        (s.state == "follower" && s.leader_id == Some(new)).then_some(())
    })
    .await;
    assert_replicas_agree(&c, &c.ids(), Duration::from_secs(10)).await;
    let mut client = c.client(new);
    for i in 0..ELECTION_MAX.as_millis() as u64 * 4 / 50 {
        let resource = format!("iso/new-{i}");
        let view = client.get_lock(GetLockRequest { resource: resource.clone() }).await.unwrap().into_inner();
        let ours = i == 1 && view.fencing_token == fresh.fencing_token;
        assert!(!view.held || ours, "{resource} was granted by the isolated leader: {view:?}");
    }
    check_all(&ops);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t50_two_of_three_down_nothing_is_granted_and_the_state_survives() {
    let c = Cluster::start(3).await;
    let h = History::new();
    let leader = c.leader(Duration::from_secs(10)).await;
    let mut before = Vec::new();
    for i in 0..5 {
        let g = c.acquire(&h, leader, &format!("down/{i}"), &format!("down-holder-{i:04}"), 10_000, 0).await.unwrap();
        before.push(g);
    }
    let followers: Vec<NodeId> = c.ids().into_iter().filter(|n| *n != leader).collect();
    for f in &followers {
        c.crash(*f).await;
    }
    // After one election timeout the lone leader has no quorum lease left.
    tokio::time::sleep(ELECTION_MAX + SLACK).await;
    let outage = h.now();
    let commit_before = c.node(leader).service().status().commit_index;
    hammer(&c, &h, leader, Duration::from_millis(1_000), ("down/0", &before[0].lease_id), "down").await;
    let ops = h.ops();
    let mut n = 0;
    for op in sent_after(&ops, leader, outage) {
        match &op.answer {
            Answer::Unavailable { reason } if reason.starts_with("NO_QUORUM") => n += 1,
            other => panic!("with two of three nodes down every call must fail NO_QUORUM, got {other:?} for {op:?}"),
        }
    }
    assert!(n >= 20, "too few calls during the outage ({n})");
    assert_eq!(c.node(leader).service().status().commit_index, commit_before, "nothing commits without a quorum");
    assert_eq!(c.http_get(leader, "/readyz").await.map(|r| r.0), Some(503));

    for f in &followers {
        c.restart(*f).await;
    }
    let leader = c.leader(Duration::from_secs(10)).await;
    assert_replicas_agree(&c, &c.ids(), Duration::from_secs(10)).await;
    // Every lease from before is intact: same token, and its holder renews it.
    let mut client = c.client(leader);
    for (i, g) in before.iter().enumerate() {
        let resource = format!("down/{i}");
        let view = client.get_lock(GetLockRequest { resource: resource.clone() }).await.unwrap().into_inner();
        assert!(view.held && view.fencing_token == g.fencing_token, "{resource} changed across the outage: {view:?}");
        let r = c.renew(&h, leader, &resource, &g.lease_id).await.expect("the old lease renews after recovery");
        assert_eq!(r.fencing_token, g.fencing_token);
    }
    // Nothing asked during the outage was granted, then or later.
    for op in sent_after(&ops, leader, outage) {
        if let Call::Acquire { resource, .. } = &op.call {
            let view = client.get_lock(GetLockRequest { resource: resource.clone() }).await.unwrap().into_inner();
            assert!(!view.held, "{resource}, asked during the outage, is held: {view:?}");
        }
    }
    let max = before.iter().map(|g| g.fencing_token).max().unwrap();
    let next = c.acquire(&h, leader, "down/after", "down-after-0001", 1_000, 0).await.unwrap();
    assert!(next.fencing_token > max);
    check_all(&h.ops());
    c.shutdown().await;
}
