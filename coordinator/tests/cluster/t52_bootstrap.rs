//! Forming a cluster and changing its members (docs/cluster.md,
//! "Bootstrap" and "Replacing a node"): bootstrap is automatic whatever the
//! start order and safe to repeat; a data dir from another cluster is
//! refused with a clear error; a dead node is replaced with add learner →
//! promote → remove.

use std::time::Duration;

use fencer_coordinator::{Node, NodeConfig, NodeId, SINGLE_VOTER_COMMIT_GAP, StartError};
use fencer_proto::v1::{AddLearnerRequest, ChangeMembershipRequest, GetLockRequest};
use fencer_testkit::cluster::Cluster;
use fencer_testkit::cluster::replicas::assert_replicas_agree;
use fencer_testkit::eventually;
use fencer_testkit::history::{History, check_all};

const TIMEOUT: Duration = Duration::from_secs(10);

fn identity(c: &Cluster, n: NodeId) -> serde_json::Value {
    let text = std::fs::read_to_string(c.config(n).data_dir.join("identity.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t52_bootstrap_is_automatic_in_any_start_order_and_safe_to_repeat() {
    let c = Cluster::prepare(3, |_| {}).await;
    let h = History::new();
    // Joiners first, the founder (smallest id) last.
    for n in [3, 2] {
        c.restart(n).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(c.node(n).cluster_id(), "", "node {n} cannot know a cluster before one exists");
    }
    c.restart(1).await;
    c.settled(TIMEOUT).await;
    let cluster_id = c.node(1).cluster_id();
    assert!(!cluster_id.is_empty());
    for n in c.ids() {
        eventually("every node knows the cluster", TIMEOUT, || async {
            (c.node(n).cluster_id() == cluster_id).then_some(())
        })
        .await;
        assert_eq!(identity(&c, n)["cluster_id"], cluster_id.as_str());
        assert_eq!(identity(&c, n)["founder"], n == 1, "only node 1 founded");
    }
    let mut grants = Vec::new();
    for i in 0..3 {
        grants.push(c.acquire_any(&h, &format!("boot/{i}"), &format!("boot-holder-{i:04}"), 30_000, 0).await.unwrap());
    }
    let membership_index = |c: &Cluster, n: NodeId| {
        let node = c.node(n);
        let m = openraft::rt::watch::WatchReceiver::borrow_watched(&node.raft().metrics()).membership_config.clone();
        m.log_id().as_ref().map(|l| l.index)
    };
    let formed_at = membership_index(&c, 1);

    // Restart everything twice, in different orders: nothing is formed again.
    for order in [[1, 2, 3], [3, 1, 2]] {
        for n in c.ids() {
            c.crash(n).await;
        }
        for n in order {
            c.restart(n).await;
        }
        let leader = c.settled(TIMEOUT).await;
        for n in c.ids() {
            assert_eq!(c.node(n).cluster_id(), cluster_id, "node {n} changed cluster on restart");
            assert_eq!(membership_index(&c, n), formed_at, "node {n}: the membership was re-initialised");
        }
        let mut client = c.client(leader);
        for (i, g) in grants.iter().enumerate() {
            let view = client.get_lock(GetLockRequest { resource: format!("boot/{i}") }).await.unwrap().into_inner();
            assert!(view.held && view.fencing_token == g.fencing_token, "boot/{i} changed: {view:?}");
        }
    }
    let next = c.acquire_any(&h, "boot/next", "boot-next-00001", 1_000, 0).await.unwrap();
    assert!(grants.iter().all(|g| next.fencing_token > g.fencing_token));
    assert_replicas_agree(&c, &c.ids(), TIMEOUT).await;
    check_all(&h.ops());
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t52_a_founder_that_stopped_before_initialising_forms_the_cluster_on_restart() {
    let c = Cluster::prepare(3, |_| {}).await;
    // The founder wrote its identity and died; the others had adopted it.
    for n in c.ids() {
        let dir = c.config(n).data_dir;
        std::fs::create_dir_all(&dir).unwrap();
        let id = serde_json::json!({"cluster_id": "c-interrupted", "node_id": n, "founder": n == 1});
        std::fs::write(dir.join("identity.json"), id.to_string()).unwrap();
    }
    for n in c.ids() {
        c.restart(n).await;
    }
    let leader = c.settled(TIMEOUT).await;
    assert_eq!(c.node(leader).cluster_id(), "c-interrupted");
    let h = History::new();
    c.acquire_any(&h, "interrupted/1", "interrupted-0001", 1_000, 0).await.expect("the cluster serves");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t52_a_data_dir_from_another_cluster_is_refused_with_a_clear_error() {
    let c = Cluster::start(3).await;
    let ours = c.node(1).cluster_id();
    // Another cluster's node 2: a single-node cluster, formed and stopped.
    let foreign_dir = c.scratch_dir("foreign-n2");
    let mut other = NodeConfig::single(&foreign_dir, "127.0.0.1:0".parse().unwrap());
    other.node_id = 2;
    let node = Node::start(other).await.expect("the other cluster starts");
    node.wait_for_leader(TIMEOUT).await.unwrap();
    let theirs = node.cluster_id();
    node.shutdown().await;
    assert_ne!(theirs, ours);

    // Node 2 of our cluster is started on the other cluster's data dir.
    c.crash(2).await;
    let mut wrong = c.config(2);
    wrong.data_dir = foreign_dir.clone();
    let err = Node::start(wrong).await.err().expect("a foreign data dir must be refused");
    let text = err.to_string();
    assert!(matches!(err, StartError::ForeignCluster { .. }), "{text}");
    assert!(text.contains(&theirs) && text.contains(&ours), "the error names both clusters: {text}");

    // Started under another node id, the dir is refused too.
    let mut renamed = c.config(3);
    renamed.data_dir = foreign_dir.clone();
    let err = Node::start(renamed).await.err().expect("a dir of node 2 refuses to run as node 3");
    assert!(matches!(err, StartError::WrongIdentity { found_node: 2, wanted_node: 3, .. }), "{err}");

    // Raft data without an identity is not trusted.
    std::fs::remove_file(foreign_dir.join("identity.json")).unwrap();
    let mut anonymous = c.config(2);
    anonymous.data_dir = foreign_dir.clone();
    let err = Node::start(anonymous).await.err().expect("raft data without identity is refused");
    assert!(matches!(err, StartError::MissingIdentity(_)), "{err}");
    // Also as a single node, which would otherwise found a cluster of its own.
    let mut alone = NodeConfig::single(&foreign_dir, "127.0.0.1:0".parse().unwrap());
    alone.node_id = 2;
    let err = Node::start(alone).await.err().expect("raft data without identity is refused");
    assert!(matches!(err, StartError::MissingIdentity(_)), "{err}");

    // The cluster never saw the impostor; node 2 comes back on its own dir.
    c.restart(2).await;
    c.settled(TIMEOUT).await;
    assert_eq!(c.node(2).cluster_id(), ours);
    assert_replicas_agree(&c, &c.ids(), TIMEOUT).await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t52_a_dead_node_is_replaced_add_learner_promote_remove() {
    let c = Cluster::start(3).await;
    let h = History::new();
    let mut grants = Vec::new();
    for i in 0..5 {
        grants.push(
            c.acquire_any(&h, &format!("member/{i}"), &format!("member-holder-{i:04}"), 30_000, 0).await.unwrap(),
        );
    }
    let leader = c.leader(TIMEOUT).await;
    let dead = c.ids().into_iter().find(|n| *n != leader).unwrap();
    c.crash(dead).await;

    // A new, pristine node 4 adopts the cluster by greeting its peers…
    let addr4 = c.add_node(4).await;
    eventually("node 4 adopts the cluster", TIMEOUT, || async {
        (c.node(4).cluster_id() == c.node(leader).cluster_id()).then_some(())
    })
    .await;
    let mut admin = c.admin(leader);
    // …is added as a learner and catches up…
    admin.add_learner(AddLearnerRequest { node_id: 4, addr: addr4 }).await.expect("add learner");
    // …is promoted, and the dead node is removed.
    let mut voters: Vec<NodeId> = vec![1, 2, 3, 4];
    admin.change_membership(ChangeMembershipRequest { voters: voters.clone(), retain: false }).await.expect("promote");
    voters.retain(|n| *n != dead);
    let r = admin.change_membership(ChangeMembershipRequest { voters: voters.clone(), retain: false }).await;
    let members = r.expect("remove the dead node").into_inner().members;
    let mut ids: Vec<NodeId> = members.iter().filter(|m| m.role == "voter").map(|m| m.id).collect();
    ids.sort();
    assert_eq!(ids, voters);
    assert!(!members.iter().any(|m| m.id == dead), "the removed node is gone, not kept as a learner: {members:?}");
    assert_replicas_agree(&c, &voters, TIMEOUT).await;

    // Node 4 counts for the quorum: with the old leader gone too, the two
    // remaining voters (one of them node 4) elect a leader and grant.
    c.crash(leader).await;
    let rest: Vec<NodeId> = voters.iter().copied().filter(|n| *n != leader).collect();
    let new = c.leader_among(&rest, TIMEOUT).await;
    let g = c.acquire(&h, new, "member/after", "member-after-0001", 1_000, 0).await.expect("the new voters grant");
    assert!(grants.iter().all(|old| g.fencing_token > old.fencing_token));
    let mut client = c.client(new);
    for (i, old) in grants.iter().enumerate() {
        let view = client.get_lock(GetLockRequest { resource: format!("member/{i}") }).await.unwrap().into_inner();
        assert_eq!(view.fencing_token, old.fencing_token, "member/{i} after the replacement");
    }
    check_all(&h.ops());
    c.shutdown().await;
}

/// Without `--log-commit-gap`, a node's raft-log commit gap follows its
/// cluster's voters: the replication interval with other voters (a
/// follower's round paces the commit anyway), 1 ms as the only one (its own
/// sync is the whole commit), changing as voters join and leave. A gap
/// that was configured stays whatever the voters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t52_the_log_commit_gap_follows_the_voters_unless_configured() {
    let c = Cluster::start(1).await;
    let interval = c.config(1).replication_interval;
    assert!(interval > SINGLE_VOTER_COMMIT_GAP, "the test needs the two defaults apart");
    let gaps_are = |what: &'static str, nodes: &'static [NodeId], gap: Duration| {
        let c = &c;
        eventually(what, TIMEOUT, move || async move {
            nodes.iter().all(|n| c.node(*n).log_commit_gap() == gap).then_some(())
        })
    };
    gaps_are("a lone voter commits 1 ms apart", &[1], SINGLE_VOTER_COMMIT_GAP).await;

    let addr2 = c.add_node(2).await;
    eventually("node 2 adopts the cluster", TIMEOUT, || async {
        (c.node(2).cluster_id() == c.node(1).cluster_id()).then_some(())
    })
    .await;
    // Node 1 leads alone (node 2, not a member yet, follows no one).
    let mut admin = c.admin(c.leader_among(&[1], TIMEOUT).await);
    admin.add_learner(AddLearnerRequest { node_id: 2, addr: addr2 }).await.expect("add learner");
    admin.change_membership(ChangeMembershipRequest { voters: vec![1, 2], retain: false }).await.expect("promote");
    gaps_are("two voters commit a replication interval apart", &[1, 2], interval).await;

    let mut admin = c.admin(c.leader_among(&[1, 2], TIMEOUT).await);
    admin.change_membership(ChangeMembershipRequest { voters: vec![1], retain: false }).await.expect("remove node 2");
    gaps_are("a lone voter again commits 1 ms apart", &[1], SINGLE_VOTER_COMMIT_GAP).await;
    c.shutdown().await;

    let configured = Duration::from_millis(3);
    for n in [1, 3] {
        let c = Cluster::start_with(n, |cfg| cfg.log_commit_gap = Some(configured)).await;
        c.leader(TIMEOUT).await;
        c.settled(TIMEOUT).await;
        for id in c.ids() {
            assert_eq!(c.node(id).log_commit_gap(), configured, "node {id} of {n}");
        }
        c.shutdown().await;
    }
}

/// A raft message reaching a node it was not sent to (a peer list that
/// gives one node another's address), or one that claims to come from the
/// receiving node itself, is refused before raft sees it, with an error
/// that names the nodes; the cluster carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t52_a_misrouted_raft_message_is_refused_and_named() {
    use fencer_proto::raft::RaftPayload;
    use fencer_proto::raft::raft_client::RaftClient;

    let c = Cluster::start(3).await;
    let leader = c.leader(TIMEOUT).await;
    let follower = c.ids().into_iter().find(|n| *n != leader).unwrap();
    let cluster_id = c.node(follower).cluster_id();
    let mut raft = RaftClient::connect(format!("http://{}", c.addr(follower))).await.unwrap();
    let send = |from: NodeId, to: NodeId| RaftPayload { cluster_id: cluster_id.clone(), from, to, data: Vec::new() };

    let other = c.ids().into_iter().find(|n| *n != leader && *n != follower).unwrap();
    let s = raft.append_entries(send(leader, other)).await.expect_err("a message for another node");
    assert_eq!(s.code(), tonic::Code::FailedPrecondition, "{s:?}");
    assert!(
        s.message().contains(&format!("for node {other} from node {leader} reached node {follower}")),
        "the error names the nodes: {s:?}"
    );
    let s = raft.append_entries(send(follower, follower)).await.expect_err("a message from itself");
    assert_eq!(s.code(), tonic::Code::FailedPrecondition, "{s:?}");
    assert!(s.message().contains(&format!("claims to come from node {follower}")), "{s:?}");
    let s = raft.vote(send(follower, 0)).await.expect_err("a vote from itself, `to` not said");
    assert_eq!(s.code(), tonic::Code::FailedPrecondition, "{s:?}");

    // Correctly addressed traffic goes on: the same leader, still granting.
    assert_eq!(c.settled(TIMEOUT).await, leader);
    let h = History::new();
    c.acquire_any(&h, "route/a", "route-holder-0001", 5_000, 0).await.expect("the cluster still grants");
    check_all(&h.ops());
    c.shutdown().await;
}
