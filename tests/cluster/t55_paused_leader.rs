//! A leader paused with SIGSTOP for longer than the election timeout comes
//! back as a follower, and nothing it had in flight — acquires it received
//! just before the pause, a renewal and an acquire queued in its socket
//! during the pause — produces a second holder (I1 with lease time, I2, I5,
//! I7). Real `fencer coordinator` processes on 127.0.0.x.

use std::sync::Arc;
use std::time::Duration;

use fencer_client::Client;
use fencer_proto::v1::lock_client::LockClient;
use fencer_proto::v1::{AcquireRequest, RenewRequest};
use fencer_testkit::grpc::{answer_of, client_answer};
use fencer_testkit::history::{Answer, Call, History, Op, check_all};
use fencer_testkit::proc_cluster::{ELECTION_MAX, ProcCluster};
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

const TTL: u64 = 1_500;

/// A raw client of exactly one node: no leader following, 5 s per call.
async fn direct(addr: &str) -> LockClient<Channel> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .timeout(Duration::from_secs(5))
        .connect_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    LockClient::new(channel)
}

async fn acquire_direct(h: &History, mut c: LockClient<Channel>, who: &str, resource: &str, rid: &str) -> Answer {
    let req = AcquireRequest {
        resource: resource.into(),
        request_id: rid.into(),
        ttl_ms: Some(TTL),
        wait_timeout_ms: 0,
        holder: who.into(),
    };
    let sent = h.now();
    let answer = match c.acquire(req).await {
        Ok(g) => {
            let g = g.into_inner();
            Answer::Granted { lease_id: g.lease_id, token: g.fencing_token, ttl_ms: g.ttl_ms }
        }
        Err(s) => answer_of(&s),
    };
    let call = Call::Acquire { resource: resource.into(), request_id: rid.into(), ttl_ms: TTL };
    h.record(Op { client: who.into(), call, sent, answered: h.now(), answer: answer.clone() });
    answer
}

async fn renew_direct(h: &History, mut c: LockClient<Channel>, who: &str, resource: &str, lease: &str) -> Answer {
    let sent = h.now();
    let answer = match c.renew(RenewRequest { resource: resource.into(), lease_id: lease.into() }).await {
        Ok(r) => Answer::Renewed { token: r.into_inner().fencing_token },
        Err(s) => answer_of(&s),
    };
    let call = Call::Renew { resource: resource.into(), lease_id: lease.into() };
    h.record(Op { client: who.into(), call, sent, answered: h.now(), answer: answer.clone() });
    answer
}

/// Acquire through a leader-following client, retrying the same request id
/// while the outcome is unknown, for at most 15 s.
async fn acquire_following(h: &History, c: &Client, who: &str, resource: &str, rid: &str, wait: Duration) -> Answer {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let sent = h.now();
        // One routed attempt per loop turn: this test records each resend itself.
        let attempt = c
            .acquire(resource)
            .ttl(Duration::from_millis(TTL))
            .wait(wait)
            .holder(who)
            .request_id(rid)
            .retry_budget(Duration::ZERO)
            .grant()
            .await;
        let answer = match attempt {
            Ok(g) => Answer::Granted {
                lease_id: g.lease_id.to_string(),
                token: g.token.get(),
                ttl_ms: g.ttl.as_millis() as u64,
            },
            Err(e) => client_answer(e.client_error()),
        };
        let call = Call::Acquire { resource: resource.into(), request_id: rid.into(), ttl_ms: TTL };
        h.record(Op { client: who.into(), call, sent, answered: h.now(), answer: answer.clone() });
        if !matches!(answer, Answer::Unavailable { .. }) || Instant::now() > deadline {
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn renew_following(h: &History, c: &Client, who: &str, resource: &str, lease: &str) -> Answer {
    let sent = h.now();
    let answer = match c.renew(resource, lease).await {
        Ok(r) => Answer::Renewed { token: r.fencing_token },
        Err(e) => client_answer(&e),
    };
    let call = Call::Renew { resource: resource.into(), lease_id: lease.into() };
    h.record(Op { client: who.into(), call, sent, answered: h.now(), answer: answer.clone() });
    answer
}

fn granted(a: &Answer) -> (String, u64) {
    match a {
        Answer::Granted { lease_id, token, .. } => (lease_id.clone(), *token),
        other => panic!("expected a grant, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t55_a_leader_paused_past_the_election_timeout_returns_as_follower_without_a_second_holder() {
    let _turn = crate::one_cluster_at_a_time().await;
    let c = ProcCluster::start(3).await;
    let h = Arc::new(History::new());
    let old = c.settled(Duration::from_secs(20)).await;
    let old_term = c.status(old).await.unwrap()["term"].as_u64().unwrap();
    let others: Vec<u64> = c.ids().into_iter().filter(|n| *n != old).collect();
    let following = Arc::new(Client::new(c.addrs.values().cloned()).unwrap().with_call_timeout(Duration::from_secs(1)));
    let to_old = direct(&c.addrs[&old]).await;

    // A holds pause/a and keeps renewing through whoever leads; B holds
    // pause/b through the old leader and will try one renewal mid-pause.
    let a = granted(&acquire_direct(&h, to_old.clone(), "A", "pause/a", "pause-holder-a01").await);
    let b = granted(&acquire_direct(&h, to_old.clone(), "B", "pause/b", "pause-holder-b01").await);

    // In flight when the leader stops: acquires it just received.
    let burst: Vec<_> = (0..5)
        .map(|i| {
            let (h, to_old) = (h.clone(), to_old.clone());
            tokio::spawn(async move {
                acquire_direct(&h, to_old, "burst", &format!("pause/c{i}"), &format!("pause-burst-{i:04}")).await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(2)).await;
    c.pause(old);
    let paused_at = Instant::now();

    let stop = Arc::new(tokio::sync::Notify::new());
    let renewer = {
        let (h, following, stop, lease) = (h.clone(), following.clone(), stop.clone(), a.0.clone());
        tokio::spawn(async move {
            let mut last = Answer::Released;
            for _ in 0..100 {
                last = renew_following(&h, &following, "A", "pause/a", &lease).await;
                tokio::select! {
                    () = stop.notified() => break,
                    () = tokio::time::sleep(Duration::from_millis(300)) => {}
                }
            }
            last
        })
    };
    // W wants pause/b through the majority; it gets it once B's lease ran out there.
    let waiter = {
        let (h, following) = (h.clone(), following.clone());
        tokio::spawn(async move {
            acquire_following(&h, &following, "W", "pause/b", "pause-waiter-w01", Duration::from_secs(10)).await
        })
    };
    // Queued in the stopped leader's socket: an intruder on A's lock and,
    // late in the pause, B's renewal.
    let intruder = {
        let (h, to_old) = (h.clone(), to_old.clone());
        tokio::spawn(async move { acquire_direct(&h, to_old, "I", "pause/a", "pause-intruder-1").await })
    };
    let late_renew = {
        let (h, to_old, lease) = (h.clone(), to_old.clone(), b.0.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1_300)).await;
            renew_direct(&h, to_old, "B", "pause/b", &lease).await
        })
    };
    // Meanwhile the others elect a new leader.
    c.leader_among(&others, Duration::from_secs(10)).await;
    tokio::time::sleep_until(paused_at + ELECTION_MAX * 5).await;
    c.resume(old);

    let late_renew = late_renew.await.unwrap();
    assert!(
        matches!(late_renew, Answer::Unavailable { .. }),
        "the resumed old leader renewed: {late_renew:?}\n{}\n{:#?}",
        c.ids().iter().map(|n| c.logs(*n)).collect::<String>(),
        h.ops()
    );
    let intruder = intruder.await.unwrap();
    assert!(!matches!(intruder, Answer::Granted { .. }), "the resumed old leader granted a held lock: {intruder:?}");
    // The burst's outcomes: whatever was unknown is settled by retrying the
    // same request id on the cluster (I7).
    for (i, call) in burst.into_iter().enumerate() {
        if let Answer::Unavailable { .. } = call.await.unwrap() {
            let rid = format!("pause-burst-{i:04}");
            acquire_following(&h, &following, "burst", &format!("pause/c{i}"), &rid, Duration::ZERO).await;
        }
    }
    let w = granted(&waiter.await.unwrap());
    assert!(w.1 > b.1, "W's token {} must be above B's {}", w.1, b.1);

    // The old leader is back as a follower of a newer term.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = c.status(old).await;
        if let Some(s) = &s
            && s["state"] == "follower"
            && s["term"].as_u64() > Some(old_term)
            && s["leader_id"].as_u64().is_some_and(|l| l != old)
        {
            break;
        }
        assert!(Instant::now() < deadline, "the resumed leader did not become a follower: {s:?}\n{}", c.logs(old));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.notify_one();
    let last = renewer.await.unwrap();
    assert!(matches!(last, Answer::Renewed { .. }), "A keeps its lease through the change: {last:?}");
    let view = following.get("pause/a").await.unwrap();
    assert!(view.held && view.fencing_token == a.1, "A's lock changed hands: {view:?}");

    check_all(&h.ops());
    // Every node converges on the same applied state.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut views = Vec::new();
        for n in c.ids() {
            views.push(c.status(n).await.map(|s| (s["applied_index"].clone(), s["locks_held"].clone())));
        }
        if views.iter().all(|v| v.is_some() && *v == views[0]) {
            break;
        }
        assert!(Instant::now() < deadline, "the nodes do not converge: {views:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
