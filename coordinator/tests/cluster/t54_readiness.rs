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

/// Pre-Vote (issue 17): a follower cut off from everyone for many election
/// timeouts campaigns only in Pre-Vote rounds, which bump no term. It turns
/// not ready on its own (it heard nothing from its leader, though raft's
/// metrics still name it), and when it is back the leader is still the
/// leader, in the same term. Without Pre-Vote the follower would raise its
/// term at every election timeout and depose the leader on its return.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t54_a_follower_cut_off_and_back_neither_raises_its_term_nor_deposes_the_leader() {
    let c = Cluster::start(3).await;
    let leader = c.leader(Duration::from_secs(10)).await;
    let term = c.node(leader).service().status().term;
    let f = c.ids().into_iter().find(|n| *n != leader).unwrap();
    eventually(&format!("node {f} ready"), Duration::from_secs(10), || async {
        (readyz(&c, f).await.0 == 200).then_some(())
    })
    .await;

    c.isolate(f);
    // Ten of its longest election timeouts: ten chances to campaign.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let cut_off = c.node(f).service().status();
    assert_eq!(cut_off.term, term, "the cut-off follower raised its term: {cut_off:?}");
    // Still naming its leader, it is not ready: it heard nothing from it.
    let (code, body) = readyz(&c, f).await;
    assert_eq!(code, 503, "the cut-off follower is ready: {body}");
    assert!(body.contains("no leader") && body.contains(&format!("node {leader}")), "{body}");
    assert_eq!(gauge(&c, f, "fencer_raft_has_leader").await, Some(0.0));

    c.heal();
    eventually(&format!("node {f} ready again"), Duration::from_secs(10), || async {
        (readyz(&c, f).await.0 == 200).then_some(())
    })
    .await;
    // Give a deposed leader's successor time to show up before looking.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(c.leader(Duration::from_secs(10)).await, leader, "the leader was deposed");
    for n in c.ids() {
        let s = c.node(n).service().status();
        assert_eq!(s.term, term, "node {n} is in another term: {s:?}");
    }
    c.shutdown().await;
}
