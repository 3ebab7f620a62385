//! Which cluster a node belongs to, and how a cluster forms (docs/cluster.md,
//! "Bootstrap"). The rules, in the order a starting node applies them:
//!
//! 1. `identity.json` in the data dir names the cluster and the node. It is
//!    written once, durably, before the node takes part in any cluster, and
//!    never rewritten. A data dir whose node id differs from `--id`, or that
//!    holds raft data but no identity, is refused.
//! 2. A node with an identity says Hello to its peers at start. If peers
//!    answer and every answer names another cluster, the data dir belongs to
//!    another cluster: the node refuses to start ([`StartError::ForeignCluster`]).
//! 3. A pristine node (no identity) of a single-node configuration founds a
//!    new cluster with a random id and initialises raft.
//! 4. A pristine node of a multi-node configuration keeps saying Hello to its
//!    peers. The first answer that names a cluster is adopted: the node writes
//!    it as its identity and waits for the leader to replicate to it; it never
//!    initialises. The node with the smallest id in `--peers` founds the
//!    cluster instead (random id, `initialize` with every peer) once a majority
//!    of `--peers`, itself included, answered and none named a cluster.
//! 5. A founder whose raft state is still empty (it stopped between writing
//!    its identity and initialising) initialises again with the same peers:
//!    nobody else can have initialised, and initialising pristine nodes with
//!    identical membership is safe.
//! 6. An initialised node never initialises again. From then on membership
//!    lives in the raft log; `--peers` only tells a node whom to greet.
//!
//! Until a node knows its cluster it refuses raft messages, and every raft
//! message carries the sender's cluster id, so nodes of different clusters
//! never exchange log entries or votes.
//!
//! [`StartError::ForeignCluster`]: crate::StartError::ForeignCluster

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use fencer_proto::raft::HelloRequest;
use fencer_proto::raft::raft_client::RaftClient;
use serde::{Deserialize, Serialize};
use tonic::transport::ClientTlsConfig;

use crate::tls::peer_endpoint;
use crate::types::NodeId;

/// The identity file of a data dir.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct Identity {
    pub(crate) cluster_id: String,
    pub(crate) node_id: NodeId,
    /// This node founded the cluster (rule 5). Absent in data dirs written
    /// before clusters existed: those are initialised single nodes.
    #[serde(default)]
    pub(crate) founder: bool,
}

pub(crate) const IDENTITY_FILE: &str = "identity.json";

/// Reads the identity of a data dir, if it has one.
pub(crate) fn read_identity(dir: &Path) -> std::io::Result<Option<Identity>> {
    let path = dir.join(IDENTITY_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{}: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Writes the identity durably: temp file, fsync, rename, fsync the dir.
/// Blocking.
pub(crate) fn write_identity(dir: &Path, id: &Identity) -> std::io::Result<()> {
    let path = dir.join(IDENTITY_FILE);
    let tmp = dir.join("identity.json.tmp");
    let bytes = serde_json::to_vec_pretty(id).map_err(std::io::Error::other)?;
    std::fs::write(&tmp, bytes)?;
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, &path)?;
    std::fs::File::open(dir)?.sync_all()
}

/// A fresh cluster id: 128 random bits.
pub(crate) fn new_cluster_id() -> Result<String, getrandom::Error> {
    Ok(format!("c{}", crate::types::LeaseId::random()?))
}

/// The cluster id this node belongs to, once known. Shared by the raft
/// transport (both directions) and the admin views.
#[derive(Debug, Default)]
pub(crate) struct ClusterId {
    id: RwLock<Option<Arc<str>>>,
}

impl ClusterId {
    pub(crate) fn new(id: Option<String>) -> Self {
        Self { id: RwLock::new(id.map(Into::into)) }
    }

    /// The id, if this node has joined or founded a cluster.
    pub(crate) fn get(&self) -> Option<Arc<str>> {
        self.id.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The id, or "" while unknown.
    pub(crate) fn to_text(&self) -> String {
        self.get().map(|s| s.to_string()).unwrap_or_default()
    }

    /// Records the id once its identity file is durable.
    pub(crate) fn set(&self, id: &str) {
        *self.id.write().unwrap_or_else(|p| p.into_inner()) = Some(id.into());
    }
}

/// What one peer said to Hello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PeerAnswer {
    /// It answered: its node id and cluster id ("" while it has none).
    Answered { node_id: NodeId, cluster_id: String },
    /// It could not be reached in time.
    Unreachable(String),
}

/// Says Hello to one address.
pub(crate) async fn hello(
    addr: &str,
    from: NodeId,
    cluster_id: &str,
    timeout: Duration,
    tls: Option<&ClientTlsConfig>,
) -> PeerAnswer {
    let endpoint = match peer_endpoint(addr, tls) {
        Ok(e) => e.connect_timeout(timeout).tcp_nodelay(true),
        Err(e) => return PeerAnswer::Unreachable(e),
    };
    let call = async {
        let channel = endpoint.connect().await.map_err(|e| e.to_string())?;
        let mut client = RaftClient::new(channel);
        let resp = client
            .hello(HelloRequest { cluster_id: cluster_id.to_string(), from })
            .await
            .map_err(|s| s.message().to_string())?;
        Ok::<_, String>(resp.into_inner())
    };
    match tokio::time::timeout(timeout, call).await {
        Err(_) => PeerAnswer::Unreachable(format!("{addr} did not answer within {timeout:?}")),
        Ok(Err(e)) => PeerAnswer::Unreachable(format!("{addr}: {e}")),
        Ok(Ok(r)) => PeerAnswer::Answered { node_id: r.node_id, cluster_id: r.cluster_id },
    }
}

/// Says Hello to every peer but `me`, concurrently.
pub(crate) async fn greet_peers(
    peers: &BTreeMap<NodeId, String>,
    me: NodeId,
    cluster_id: &str,
    timeout: Duration,
    tls: Option<&ClientTlsConfig>,
) -> BTreeMap<NodeId, PeerAnswer> {
    let calls = peers.iter().filter(|(id, _)| **id != me).map(|(id, addr)| async move {
        let answer = hello(addr, me, cluster_id, timeout, tls).await;
        (*id, answer)
    });
    futures::future::join_all(calls).await.into_iter().collect()
}

/// Rule 2: the peers that answered from another cluster, if *every* peer
/// that named a cluster named another one (and at least one did). A peer
/// answering with an unexpected node id is reported too: the address is
/// wrong, or taken by someone else.
pub(crate) fn foreign_evidence(
    ours: &str,
    answers: &BTreeMap<NodeId, PeerAnswer>,
    peers: &BTreeMap<NodeId, String>,
) -> Option<Vec<String>> {
    let mut same = false;
    let mut other = Vec::new();
    for (id, a) in answers {
        if let PeerAnswer::Answered { node_id, cluster_id } = a {
            if cluster_id.is_empty() {
                continue;
            }
            if cluster_id == ours && node_id == id {
                same = true;
            } else {
                let addr = peers.get(id).map_or("?", String::as_str);
                other.push(format!("node {id} at {addr} answered as node {node_id} of cluster {cluster_id}"));
            }
        }
    }
    (!same && !other.is_empty()).then_some(other)
}

/// Rule 4: what a pristine node of a multi-node configuration should do
/// after one round of Hello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PristineStep {
    /// Adopt the cluster a peer named.
    Adopt { cluster_id: String, via: NodeId },
    /// Found a new cluster (smallest id, a majority answered, all pristine).
    Found,
    /// Ask again later.
    Wait { why: String },
}

pub(crate) fn pristine_step(
    me: NodeId,
    peers: &BTreeMap<NodeId, String>,
    answers: &BTreeMap<NodeId, PeerAnswer>,
) -> PristineStep {
    // Adopt only what a peer says about itself under the id we expect there.
    for (id, a) in answers {
        if let PeerAnswer::Answered { node_id, cluster_id } = a
            && !cluster_id.is_empty()
            && node_id == id
        {
            return PristineStep::Adopt { cluster_id: cluster_id.clone(), via: *id };
        }
    }
    let smallest = peers.keys().next().copied().unwrap_or(me);
    if smallest != me {
        return PristineStep::Wait { why: format!("waiting for node {smallest} to found the cluster") };
    }
    let pristine = |a: &&PeerAnswer| matches!(a, PeerAnswer::Answered { cluster_id, .. } if cluster_id.is_empty());
    let answered = 1 + answers.values().filter(pristine).count();
    let majority = peers.len() / 2 + 1;
    if answered >= majority {
        PristineStep::Found
    } else {
        PristineStep::Wait {
            why: format!("{answered} of {} peers answered as pristine; founding needs {majority}", peers.len()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peers() -> BTreeMap<NodeId, String> {
        (1..=3).map(|i| (i, format!("127.0.0.{i}:7420"))).collect()
    }

    fn answered(id: NodeId, cluster: &str) -> PeerAnswer {
        PeerAnswer::Answered { node_id: id, cluster_id: cluster.into() }
    }

    #[test]
    fn a_pristine_node_adopts_the_cluster_a_peer_names() {
        let answers = BTreeMap::from([(2, answered(2, "")), (3, answered(3, "cX"))]);
        assert_eq!(pristine_step(1, &peers(), &answers), PristineStep::Adopt { cluster_id: "cX".into(), via: 3 });
        // A peer answering under an unexpected id is not trusted.
        let answers = BTreeMap::from([(2, answered(7, "cX")), (3, PeerAnswer::Unreachable("down".into()))]);
        assert!(matches!(pristine_step(1, &peers(), &answers), PristineStep::Wait { .. }));
    }

    #[test]
    fn only_the_smallest_id_founds_and_only_with_a_majority_of_pristine_peers() {
        let down = PeerAnswer::Unreachable("down".into());
        let one_up = BTreeMap::from([(2, answered(2, "")), (3, down.clone())]);
        assert_eq!(pristine_step(1, &peers(), &one_up), PristineStep::Found);
        assert!(matches!(pristine_step(2, &peers(), &one_up), PristineStep::Wait { .. }));
        let none_up = BTreeMap::from([(2, down.clone()), (3, down)]);
        assert!(matches!(pristine_step(1, &peers(), &none_up), PristineStep::Wait { .. }));
    }

    #[test]
    fn a_data_dir_is_foreign_only_when_no_peer_shares_its_cluster() {
        let p = peers();
        let all_other = BTreeMap::from([(2, answered(2, "cB")), (3, answered(3, "cB"))]);
        assert_eq!(foreign_evidence("cA", &all_other, &p).map(|v| v.len()), Some(2));
        let mixed = BTreeMap::from([(2, answered(2, "cA")), (3, answered(3, "cB"))]);
        assert_eq!(foreign_evidence("cA", &mixed, &p), None);
        let pristine = BTreeMap::from([(2, answered(2, "")), (3, PeerAnswer::Unreachable("x".into()))]);
        assert_eq!(foreign_evidence("cA", &pristine, &p), None);
    }

    #[test]
    fn identity_round_trips_and_old_files_are_not_founders() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_identity(dir.path()).unwrap(), None);
        let id = Identity { cluster_id: "cX".into(), node_id: 2, founder: true };
        write_identity(dir.path(), &id).unwrap();
        assert_eq!(read_identity(dir.path()).unwrap(), Some(id));
        std::fs::write(dir.path().join(IDENTITY_FILE), r#"{"cluster_id":"c1","node_id":1}"#).unwrap();
        assert!(!read_identity(dir.path()).unwrap().unwrap().founder);
    }
}
