//! Readiness (issue 7): `/readyz`, the `fencer_ready` gauge and the Status
//! RPC turn not-ready on every node when the cluster loses its quorum, and
//! ready again when the quorum is back.

use std::time::Duration;

use fencer_proto::v1::StatusRequest;
use fencer_testkit::cluster::Cluster;
use fencer_testkit::eventually;

/// `/readyz` of node `n`: (status code, body).
async fn readyz(c: &Cluster, n: u64) -> (u16, String) {
    c.http_get(n, "/readyz").await.unwrap_or((0, "no answer".into()))
}

/// The value of an unlabelled gauge in node `n`'s `/metrics`.
async fn gauge(c: &Cluster, n: u64, name: &str) -> Option<f64> {
    let (_, text) = c.http_get(n, "/metrics").await?;
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t54_readiness_flips_when_quorum_is_lost_and_comes_back() {
    let c = Cluster::start(3).await;
    let leader = c.leader(Duration::from_secs(10)).await;
    let followers: Vec<u64> = c.ids().into_iter().filter(|n| *n != leader).collect();
    for n in c.ids() {
        eventually(&format!("node {n} ready"), Duration::from_secs(10), || async {
            (readyz(&c, n).await.0 == 200).then_some(())
        })
        .await;
    }
    assert_eq!(gauge(&c, leader, "fencer_ready").await, Some(1.0));
    let status = c.admin(leader).status(StatusRequest {}).await.unwrap().into_inner();
    assert!(status.ready && status.leader_ready && status.millis_since_quorum_ack >= 0, "{status:?}");

    // No node can reach a majority: the leader keeps its title but loses
    // its quorum acknowledgements; the followers lose their leader.
    for f in &followers {
        c.isolate(*f);
    }
    // 503 is what the wait is for (it fails loudly without it); the body
    // must then say why.
    let body = eventually("the leader not ready (503)", Duration::from_secs(10), || async {
        let (code, body) = readyz(&c, leader).await;
        (code == 503).then_some(body)
    })
    .await;
    assert!(body.contains("quorum"), "the reason names the quorum: {body}");
    for f in &followers {
        let body = eventually(&format!("follower {f} not ready"), Duration::from_secs(10), || async {
            let r = readyz(&c, *f).await;
            (r.0 == 503).then_some(r.1)
        })
        .await;
        assert!(body.contains("no leader"), "{body}");
    }
    assert_eq!(gauge(&c, leader, "fencer_ready").await, Some(0.0));
    let age = gauge(&c, leader, "fencer_raft_quorum_ack_age_seconds").await.unwrap_or(0.0);
    assert!(age > gauge(&c, leader, "fencer_raft_election_timeout_seconds").await.unwrap(), "age {age}");
    let status = c.admin(leader).status(StatusRequest {}).await.unwrap().into_inner();
    assert!(!status.ready && status.ready_reason.contains("quorum"), "{status:?}");

    // The quorum is back: every node is ready again.
    c.heal();
    for n in c.ids() {
        eventually(&format!("node {n} ready again"), Duration::from_secs(15), || async {
            (readyz(&c, n).await.0 == 200 && gauge(&c, n, "fencer_ready").await == Some(1.0)).then_some(())
        })
        .await;
    }
    c.shutdown().await;
}
