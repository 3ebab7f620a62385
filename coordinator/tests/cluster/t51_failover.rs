//! Leader changes (DESIGN §3.2–§3.3): a killed leader loses no acknowledged
//! grant and tokens keep growing (I1, I2); a response lost after commit is
//! recovered by retrying the request id on the new leader (I7); parked
//! waiters fail LEADER_CHANGED and reclaim their slot, and unclaimed slots
//! are cancelled after the grace period; calls held through an election
//! are served by its winner without a retry; a lease is never expired
//! early, also across a leader change (I6).

use std::time::Duration;

use fencer_coordinator::{NodeId, ResourceName};
use fencer_proto::v1::GetLockRequest;
use fencer_testkit::cluster::replicas::assert_replicas_agree;
use fencer_testkit::cluster::{Cluster, ELECTION_MAX};
use fencer_testkit::eventually;
use fencer_testkit::grpc::reason;
use fencer_testkit::history::{Answer, Call, History, check_all};
use tokio::time::Instant;

const TIMEOUT: Duration = Duration::from_secs(10);

/// One client of the acquire stream: takes locks from a small shared pool
/// (waiting a little), holds each briefly and releases it; follows the
/// leader and retries with the same request id.
async fn stream_client(c: &Cluster, h: &History, id: usize, until: Instant) {
    for attempt in 0..200 {
        if Instant::now() >= until {
            return;
        }
        let resource = format!("stream/{}", attempt % 4);
        let request_id = format!("stream-{id}-{attempt:04}");
        if let Ok(g) = c.acquire_any(h, &resource, &request_id, 2_000, 300).await {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let _ = c.release_any(h, &resource, &g.lease_id).await;
        }
    }
}

/// The waiters queued on `n` for `resource`, by request id.
fn queued(c: &Cluster, n: NodeId, resource: &str) -> Vec<String> {
    let node = c.node(n);
    let state = node.state();
    state
        .resource(&ResourceName::new(resource).unwrap())
        .map(|r| r.waiters.iter().map(|w| w.request_id.to_string()).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t51_leader_killed_during_a_stream_of_acquires_loses_no_grant() {
    let c = Cluster::start(3).await;
    let h = History::new();
    let old = c.leader(TIMEOUT).await;
    let until = Instant::now() + Duration::from_millis(3_000);
    let clients = futures::future::join_all((0..6).map(|i| stream_client(&c, &h, i, until)));
    let kill = async {
        tokio::time::sleep(Duration::from_millis(800)).await;
        let at = h.now();
        c.crash(old).await;
        at
    };
    let (_, killed_at) = tokio::join!(clients, kill);

    let ops = h.ops();
    let granted: Vec<(String, String, String, u64, Duration, Duration)> = ops
        .iter()
        .filter_map(|op| match (&op.call, &op.answer) {
            (Call::Acquire { resource, request_id, .. }, Answer::Granted { lease_id, token, .. }) => {
                Some((resource.clone(), request_id.clone(), lease_id.clone(), *token, op.sent, op.answered))
            }
            _ => None,
        })
        .collect();
    let before: Vec<_> = granted.iter().filter(|g| g.5 < killed_at).collect();
    let after: Vec<_> = granted.iter().filter(|g| g.4 > killed_at).collect();
    assert!(before.len() >= 5, "too little progress before the kill: {} grants", before.len());
    assert!(after.len() >= 5, "too little progress after the kill: {} grants", after.len());
    // Tokens strictly increase across the change.
    let max_before = before.iter().map(|g| g.3).max().unwrap();
    let min_after = after.iter().map(|g| g.3).min().unwrap();
    assert!(min_after > max_before, "a grant after the kill ({min_after}) is not above one before it ({max_before})");

    // Every acknowledged grant survived: its request id still returns it,
    // as a live grant while it holds the lock, else as LEASE_ENDED with the
    // same lease and token (the stream released most of them).
    let new = c.leader(TIMEOUT).await;
    for (resource, request_id, lease_id, token, _, _) in &granted {
        let again = match c.acquire(&h, new, resource, request_id, 2_000, 0).await {
            Ok(g) => (g.lease_id, g.fencing_token),
            Err(s) if reason(&s) == "LEASE_ENDED" => {
                use tonic_types::StatusExt as _;
                let info = s.get_error_details().error_info().cloned().expect("ErrorInfo");
                (info.metadata["lease_id"].clone(), info.metadata["fencing_token"].parse().unwrap())
            }
            Err(s) => panic!("acknowledged grant {request_id} lost: {s:?}"),
        };
        assert_eq!((&again.0, again.1), (lease_id, *token), "grant {request_id} changed");
    }
    check_all(&h.ops());
    c.restart(old).await;
    assert_replicas_agree(&c, &c.ids(), TIMEOUT).await;
    c.shutdown().await;
}

/// Calls a follower held through the election (they name the dead leader
/// unreachable) are served by the node that wins it as soon as a quorum
/// acknowledges it, without a retry: a just-elected leader refuses
/// proposals until its first quorum acknowledgement, and the calls refused
/// that way wait for it (`await_first_quorum_ack`) instead of failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t51_calls_held_through_an_election_are_served_by_the_new_leader_without_a_retry() {
    use fencer_proto::UNREACHABLE_HEADER;
    use fencer_proto::v1::AcquireRequest;
    let c = Cluster::start(3).await;
    let old = c.leader(TIMEOUT).await;
    let dead = c.addr(old);
    c.crash(old).await;
    let followers: Vec<NodeId> = c.ids().into_iter().filter(|&n| n != old).collect();
    let calls = followers.iter().flat_map(|&n| (0..20).map(move |i| (n, i))).map(|(n, i)| {
        let mut client = c.client(n);
        let dead = dead.clone();
        async move {
            let mut req = tonic::Request::new(AcquireRequest {
                resource: format!("held/{n}/{i}"),
                request_id: format!("held-{n}-{i}"),
                ttl_ms: Some(5_000),
                wait_timeout_ms: 0,
                holder: format!("test/held-{n}-{i}"),
            });
            req.metadata_mut().insert(UNREACHABLE_HEADER, dead.parse().unwrap());
            (n, client.acquire(req).await.map(|r| r.into_inner().fencing_token))
        }
    });
    let answers = futures::future::join_all(calls).await;
    let new = c.leader(TIMEOUT).await;
    let at_new: Vec<_> = answers.iter().filter(|(n, _)| *n == new).collect();
    assert_eq!(at_new.len(), 20);
    for (_, a) in &at_new {
        if let Err(s) = a {
            panic!("a call held on node {new} through its election was not served: {} {s:?}", reason(s));
        }
    }
    for (n, a) in answers.iter().filter(|(n, _)| *n != new) {
        if let Err(s) = a {
            assert_eq!(reason(s), "NOT_LEADER", "node {n}: {s:?}");
        }
    }
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t51_response_lost_after_commit_retry_on_the_new_leader_returns_the_original_grant() {
    let c = Cluster::start(3).await;
    let h = History::new();
    let old = c.leader(TIMEOUT).await;
    let others: Vec<NodeId> = c.ids().into_iter().filter(|n| *n != old).collect();

    c.drop_response_after_commit(old);
    let lost = c.acquire(&h, old, "lost/1", "lost-holder-0001", 30_000, 0).await;
    assert!(lost.is_err(), "the response should have been lost");
    // It committed all the same: the old leader applied it before answering.
    let (lease_id, token) = {
        let node = c.node(old);
        let state = node.state();
        let lock = state.resource(&ResourceName::new("lost/1").unwrap()).and_then(|r| r.lock.clone());
        let lock = lock.expect("the lost acquire committed");
        (lock.lease_id.to_string(), lock.token.0)
    };

    // A waiter queues on the old leader, then the old leader dies under it.
    let waiter = c.acquire(&h, old, "lost/1", "lost-waiter-0001", 5_000, 10_000);
    let crash = async {
        eventually("the waiter is queued", TIMEOUT, || async {
            (queued(&c, old, "lost/1") == ["lost-waiter-0001"]).then_some(())
        })
        .await;
        c.crash(old).await;
    };
    let (first_wait, ()) = tokio::join!(waiter, crash);
    assert!(first_wait.is_err(), "the waiter's call died with its leader");
    let new = c.leader_among(&others, TIMEOUT).await;

    // The retry on the new leader returns the original grant (I7)…
    let retry = c.acquire(&h, new, "lost/1", "lost-holder-0001", 30_000, 0).await.expect("the retry succeeds");
    assert_eq!((retry.lease_id.as_str(), retry.fencing_token), (lease_id.as_str(), token));
    // …and no second lease exists: another request finds the lock held by it.
    let other = c.acquire(&h, new, "lost/1", "lost-other-0001", 5_000, 0).await.unwrap_err();
    assert_eq!(reason(&other), "LOCK_HELD");
    // The waiter's retry reclaims its one queue slot, and is promoted on release.
    let waiter = c.acquire(&h, new, "lost/1", "lost-waiter-0001", 5_000, 10_000);
    let release = async {
        eventually("the waiter parks on the new leader", TIMEOUT, || async {
            let parked = c.node(new).metrics().parked_calls.get() == 1;
            (parked && queued(&c, new, "lost/1") == ["lost-waiter-0001"]).then_some(())
        })
        .await;
        c.release(&h, new, "lost/1", &lease_id).await.expect("release the recovered lease")
    };
    let (promoted, _) = tokio::join!(waiter, release);
    let promoted = promoted.expect("the reclaimed slot is promoted");
    assert!(promoted.waited && promoted.fencing_token > token);
    check_all(&h.ops());
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t51_parked_waiters_fail_leader_changed_reclaim_their_slot_and_unclaimed_slots_are_cancelled() {
    let c = Cluster::start(3).await;
    let h = History::new();
    let old = c.leader(TIMEOUT).await;
    let others: Vec<NodeId> = c.ids().into_iter().filter(|n| *n != old).collect();
    let a = c.acquire(&h, old, "park/1", "park-holder-0001", 5_000, 0).await.unwrap();

    // B and C wait on the old leader; the old leader is cut off.
    let b = c.acquire(&h, old, "park/1", "park-waiter-b001", 5_000, 20_000);
    let cc = c.acquire(&h, old, "park/1", "park-waiter-c001", 5_000, 20_000);
    let cut = async {
        eventually("two waiters queued", TIMEOUT, || async { (queued(&c, old, "park/1").len() == 2).then_some(()) })
            .await;
        c.isolate(old);
    };
    let (b, cc, ()) = tokio::join!(b, cc, cut);
    for (name, r) in [("B", &b), ("C", &cc)] {
        let s = r.as_ref().expect_err("a parked call cannot be granted by a deposed leader");
        assert_eq!((s.code(), reason(s)), (tonic::Code::Unavailable, "LEADER_CHANGED".to_string()), "{name}: {s:?}");
    }

    // B retries with its request id on the new leader; C's client is gone.
    let new = c.leader_among(&others, TIMEOUT).await;
    let b = async {
        let b = c.acquire(&h, new, "park/1", "park-waiter-b001", 5_000, 20_000).await;
        if let Ok(g) = &b {
            let _ = c.release(&h, new, "park/1", &g.lease_id).await;
        }
        b
    };
    let d = async {
        // D queues after B has reclaimed its place.
        tokio::time::sleep(Duration::from_millis(200)).await;
        c.acquire(&h, new, "park/1", "park-waiter-d001", 5_000, 20_000).await
    };
    let drive = async {
        // C's slot is cancelled after the grace period; B's is kept.
        eventually("the unclaimed slot is cancelled", TIMEOUT, || async {
            (queued(&c, new, "park/1") == ["park-waiter-b001", "park-waiter-d001"]).then_some(())
        })
        .await;
        c.release(&h, new, "park/1", &a.lease_id).await.expect("A releases");
    };
    let (b, d, ()) = tokio::join!(b, d, drive);
    let b = b.expect("B reclaimed its slot and was promoted");
    let d = d.expect("D is granted after B");
    assert!(b.waited && b.fencing_token > a.fencing_token);
    assert!(d.fencing_token > b.fencing_token, "FIFO: B queued before D");
    let retry_c = c.acquire(&h, new, "park/1", "park-waiter-c001", 5_000, 0).await.unwrap_err();
    assert_eq!(reason(&retry_c), "WAIT_TIMEOUT", "C's unclaimed slot was cancelled");
    c.heal();
    check_all(&h.ops());
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t51_a_lease_is_never_expired_before_ttl_after_its_last_renew_even_across_a_leader_change() {
    let c = Cluster::start(3).await;
    let h = History::new();
    let ttl = 800u64;

    // Without a leader change: renewals move the deadline.
    let g = c.acquire_any(&h, "time/a", "time-holder-a001", ttl, 0).await.unwrap();
    let mut last_renew = Duration::ZERO;
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let sent = h.now();
        c.renew_any(&h, "time/a", &g.lease_id).await.expect("renew in time");
        last_renew = sent;
    }
    let b = c.acquire_any(&h, "time/a", "time-waiter-a001", ttl, 5_000).await.expect("granted after expiry");
    let seen = h.now();
    assert!(b.waited && b.fencing_token > g.fencing_token);
    assert!(seen >= last_renew + Duration::from_millis(ttl), "expired {:?} after the last renew", seen - last_renew);
    assert!(seen < last_renew + Duration::from_millis(ttl) + Duration::from_secs(3), "expiry never came");

    // Across a leader change: the new leader restarts the lease at ttl +
    // election timeout, counted from when it took over.
    let old = c.leader(TIMEOUT).await;
    let others: Vec<NodeId> = c.ids().into_iter().filter(|n| *n != old).collect();
    let g = c.acquire(&h, old, "time/b", "time-holder-b001", ttl, 0).await.unwrap();
    let renewed = h.now();
    c.renew(&h, old, "time/b", &g.lease_id).await.expect("renew on the old leader");
    let killed = h.now();
    c.crash(old).await;
    let new = c.leader_among(&others, TIMEOUT).await;
    eventually("the new leader took over the leases", TIMEOUT, || async {
        c.node(new).service().status().leader_ready.then_some(())
    })
    .await;
    let view = c.client(new).get_lock(GetLockRequest { resource: "time/b".into() }).await.unwrap().into_inner();
    assert_eq!(view.fencing_token, g.fencing_token);
    assert!(view.remaining_ttl_ms > ttl, "the new leader must restart the lease at ttl + election timeout: {view:?}");
    let b = c.acquire(&h, new, "time/b", "time-waiter-b001", ttl, 5_000).await.expect("granted after expiry");
    let seen = h.now();
    assert!(b.fencing_token > g.fencing_token);
    assert!(seen >= renewed + Duration::from_millis(ttl), "expired early: {:?} after the last renew", seen - renewed);
    assert!(
        seen >= killed + Duration::from_millis(ttl) + ELECTION_MAX,
        "expired {:?} after the leader died; the new leader owes ttl + election timeout",
        seen - killed
    );
    check_all(&h.ops());
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t51_a_slow_new_leader_expires_nothing_before_it_took_over_the_leases() {
    let c = Cluster::start(3).await;
    let h = History::new();
    let ttl = 500u64;
    let old = c.leader(TIMEOUT).await;
    let others: Vec<NodeId> = c.ids().into_iter().filter(|n| *n != old).collect();
    let g = c.acquire(&h, old, "slow/a", "slow-holder-a001", ttl, 0).await.unwrap();
    c.renew(&h, old, "slow/a", &g.lease_id).await.expect("renew on the old leader");
    // The leader dies late in the lease, and the survivors talk slowly: by
    // the time one of them leads, the deadline its follower clock holds has
    // passed, and confirming its leadership takes a few round trips more.
    tokio::time::sleep(Duration::from_millis(ttl * 4 / 5)).await;
    c.delay(others[0], others[1], Duration::from_millis(60));
    c.delay(others[1], others[0], Duration::from_millis(60));
    c.crash(old).await;
    let new = c.leader_among(&others, TIMEOUT).await;
    eventually("the slow leader took over the leases", TIMEOUT, || async {
        c.node(new).service().status().leader_ready.then_some(())
    })
    .await;
    c.heal();
    let view = c.client(new).get_lock(GetLockRequest { resource: "slow/a".into() }).await.unwrap().into_inner();
    assert!(view.remaining_ttl_ms > ttl, "the lease restarts at ttl + election timeout on takeover: {view:?}");
    // Well within that, anything proposed before the takeover has landed.
    tokio::time::sleep(Duration::from_millis(ttl / 2)).await;
    let view = c.client(new).get_lock(GetLockRequest { resource: "slow/a".into() }).await.unwrap().into_inner();
    assert!(view.held && view.fencing_token == g.fencing_token, "expired before the new leader took over: {view:?}");
    check_all(&h.ops());
    c.shutdown().await;
}
