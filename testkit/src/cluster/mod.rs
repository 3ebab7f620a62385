//! The in-process cluster harness (DESIGN §8): real coordinator nodes on
//! loopback in one process, each on its own data dir, with named faults:
//!
//! | verb | effect |
//! |---|---|
//! | [`Cluster::isolate`]`(n)` | every raft message to or from `n` is lost |
//! | [`Cluster::cut`]`(a, b)` | raft messages between `a` and `b` are lost, both ways |
//! | [`Cluster::drop_one_way`]`(a, b)` | raft messages from `a` to `b` are lost |
//! | [`Cluster::delay`]`(a, b, d)` | raft messages from `a` to `b` arrive `d` late |
//! | [`Cluster::drop_response_after_commit`]`(n)` | the next client response from `n` is lost after `n` answered |
//! | [`Cluster::crash`]`(n)` / [`Cluster::restart`]`(n)` | stop `n` at once (connections dropped, nothing flushed) / start it again on its data dir |
//! | [`Cluster::heal`] | every network fault removed |
//!
//! Clients reach every node whatever the raft network does: a minority side
//! is reachable, which is what the quorum tests need. Fast timings: heartbeat
//! 50 ms, election timeout 150–300 ms, so the shortest ttl is 500 ms.
//!
//! Operations made through [`Cluster::acquire`], [`Cluster::renew`] and
//! [`Cluster::release`] (and their `_any` forms that follow the leader) are
//! recorded in a [`History`] for the invariant checkers.

pub mod faults;
pub mod replicas;

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencer_coordinator::{Node, NodeConfig, NodeId, Policy};
use fencer_proto::v1::admin_client::AdminClient;
use fencer_proto::v1::lock_client::LockClient;
use fencer_proto::v1::{AcquireRequest, ReleaseRequest, RenewRequest};
use tokio::time::Instant;
use tonic::transport::Endpoint;
use tonic_types::StatusExt;

use self::faults::{ClientFaults, FaultyChannel, NetFaults};
use crate::grpc::answer_of;
use crate::history::{Answer, Call, History, Op};
use crate::{eventually, free_addr, free_ports};

pub use crate::node::{ELECTION, HEARTBEAT};
/// The longest election timeout: also the quorum lease.
pub const ELECTION_MAX: Duration = ELECTION.1;

/// A lock client of one node, through the client faults.
pub type Client = LockClient<FaultyChannel>;

/// One cluster at a time per test binary: the fast timings (150 ms election
/// timeout) assume the nodes get the CPU when their timers fire, which two
/// clusters sharing two cores would not.
static ONE_AT_A_TIME: std::sync::LazyLock<Arc<tokio::sync::Semaphore>> =
    std::sync::LazyLock::new(|| Arc::new(tokio::sync::Semaphore::new(1)));

/// A cluster of in-process nodes. Every method takes `&self`, so faults and
/// crashes can be injected while clients run concurrently.
pub struct Cluster {
    _turn: tokio::sync::OwnedSemaphorePermit,
    _dir: tempfile::TempDir,
    root: PathBuf,
    configs: Mutex<BTreeMap<NodeId, NodeConfig>>,
    nodes: Mutex<BTreeMap<NodeId, Option<Arc<Node>>>>,
    /// The raft network's faults.
    pub net: Arc<NetFaults>,
    /// The client channels' faults.
    pub client_faults: Arc<ClientFaults>,
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Cluster {
    /// Starts `n` voters (ids 1..=n) and waits for a leader.
    pub async fn start(n: u64) -> Self {
        Self::start_with(n, |_| {}).await
    }

    /// Like [`start`](Self::start), with each node's config adjusted by `tweak`.
    pub async fn start_with(n: u64, tweak: impl Fn(&mut NodeConfig)) -> Self {
        let cluster = Self::prepare(n, tweak).await;
        let starts: Vec<_> = cluster.ids().into_iter().map(|id| start_node(cluster.config(id))).collect();
        for node in futures::future::join_all(starts).await {
            locked(&cluster.nodes).insert(*node.raft().node_id(), Some(Arc::new(node)));
        }
        cluster.settled(Duration::from_secs(20)).await;
        cluster.keys_registered(Duration::from_secs(20)).await;
        cluster
    }

    /// Waits until every running node has applied the signing-key
    /// registration of every running node (each registers its key through
    /// the log at start), so tests begin from a fixed log.
    pub async fn keys_registered(&self, timeout: Duration) {
        let running = self.running();
        eventually("every node's signing key registered everywhere", timeout, || async {
            let all = running.iter().all(|n| {
                let node = self.node(*n);
                let state = node.state();
                running.iter().all(|owner| state.signing_keys().values().any(|k| k.node_id == *owner))
            });
            all.then_some(())
        })
        .await
    }

    /// The configs of `n` voters, none started: start them with
    /// [`restart`](Self::restart), in any order.
    pub async fn prepare(n: u64, tweak: impl Fn(&mut NodeConfig)) -> Self {
        crate::log::init_from_env();
        let turn = ONE_AT_A_TIME.clone().acquire_owned().await.expect("the semaphore is never closed");
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let net = Arc::new(NetFaults::default());
        // Found together, so no two nodes are handed the same port.
        let ports = free_ports(n as usize).expect("free loopback ports");
        let addrs: BTreeMap<NodeId, SocketAddr> =
            (1..=n).zip(ports).map(|(id, port)| (id, SocketAddr::from(([127, 0, 0, 1], port)))).collect();
        let peers: BTreeMap<NodeId, String> = addrs.iter().map(|(id, a)| (*id, a.to_string())).collect();
        let mut configs = BTreeMap::new();
        let mut nodes = BTreeMap::new();
        for (id, addr) in &addrs {
            let mut c = NodeConfig::single(root.join(format!("n{id}")), *addr);
            c.node_id = *id;
            c.peers = peers.clone();
            c.heartbeat = HEARTBEAT;
            c.election_timeout = ELECTION;
            c.faults = Some(net.clone());
            let mut policy = Policy::for_election_timeout(ELECTION_MAX);
            policy.write_timeout = Duration::from_secs(2);
            // Long enough for a retry to reclaim its slot on a loaded 2-core machine,
            // short enough for the cancellation test to see it happen.
            policy.unclaimed_slot_grace = Duration::from_secs(5);
            c.policy = Some(policy);
            tweak(&mut c);
            configs.insert(*id, c);
            nodes.insert(*id, None);
        }
        Self {
            _turn: turn,
            _dir: dir,
            root,
            configs: Mutex::new(configs),
            nodes: Mutex::new(nodes),
            net,
            client_faults: Arc::new(ClientFaults::default()),
        }
    }

    /// Waits until every running node follows one leader that took over its
    /// leases. Returns the leader.
    pub async fn settled(&self, timeout: Duration) -> NodeId {
        let leader = self.leader(timeout).await;
        eventually("every node follows the leader", timeout, || async {
            let all = self.running().iter().all(|n| {
                let s = self.node(*n).service().status();
                s.leader_id == Some(leader) && (*n != leader || s.leader_ready)
            });
            all.then_some(leader)
        })
        .await
    }

    /// Every node id, running or not.
    pub fn ids(&self) -> Vec<NodeId> {
        locked(&self.configs).keys().copied().collect()
    }

    /// The ids of running nodes.
    pub fn running(&self) -> Vec<NodeId> {
        locked(&self.nodes).iter().filter(|(_, n)| n.is_some()).map(|(id, _)| *id).collect()
    }

    /// A running node. Do not keep the handle across a crash of that node.
    pub fn node(&self, n: NodeId) -> Arc<Node> {
        self.try_node(n).unwrap_or_else(|| panic!("node {n} is not running"))
    }

    fn try_node(&self, n: NodeId) -> Option<Arc<Node>> {
        locked(&self.nodes).get(&n).cloned().flatten()
    }

    /// Node `n`'s address.
    pub fn addr(&self, n: NodeId) -> String {
        locked(&self.configs)[&n].listen.to_string()
    }

    /// The config a node (re)starts with.
    pub fn config(&self, n: NodeId) -> NodeConfig {
        locked(&self.configs)[&n].clone()
    }

    /// A fresh data dir path under the cluster's temporary root.
    pub fn scratch_dir(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    // ---- faults -------------------------------------------------------

    /// Every raft message to or from `n` is lost.
    pub fn isolate(&self, n: NodeId) {
        self.net.isolate(n);
    }

    /// Raft messages between `a` and `b` are lost, both ways.
    pub fn cut(&self, a: NodeId, b: NodeId) {
        self.net.drop_one_way(a, b);
        self.net.drop_one_way(b, a);
    }

    /// Raft messages from `from` to `to` are lost.
    pub fn drop_one_way(&self, from: NodeId, to: NodeId) {
        self.net.drop_one_way(from, to);
    }

    /// Raft messages from `from` to `to` arrive `d` late.
    pub fn delay(&self, from: NodeId, to: NodeId, d: Duration) {
        self.net.delay(from, to, d);
    }

    /// Appends carrying entries from `from` to `to` are lost; heartbeats
    /// pass (see [`NetFaults::hold_entries`]).
    pub fn hold_entries(&self, from: NodeId, to: NodeId) {
        self.net.hold_entries(from, to);
    }

    /// Every snapshot `from` sends `to` is cut in the middle until
    /// [`heal`](Self::heal): half the body is sent, then the call is dropped
    /// (the stream reset).
    pub fn cut_snapshots(&self, from: NodeId, to: NodeId) {
        self.net.cut_snapshots(from, to);
    }

    /// The next client response from `n` is lost after `n` answered.
    pub fn drop_response_after_commit(&self, n: NodeId) {
        self.client_faults.drop_response_after_commit(n);
    }

    /// Every network and client fault removed.
    pub fn heal(&self) {
        self.net.heal();
        self.client_faults.heal();
    }

    /// Stops `n` at once: connections dropped mid-call, nothing flushed.
    pub async fn crash(&self, n: NodeId) {
        let Some(node) = locked(&self.nodes).get_mut(&n).and_then(Option::take) else { return };
        into_inner(node).await.abort().await;
    }

    /// Starts `n` again on its data dir and address.
    pub async fn restart(&self, n: NodeId) {
        assert!(self.try_node(n).is_none(), "node {n} is running");
        let node = start_node(self.config(n)).await;
        locked(&self.nodes).insert(n, Some(Arc::new(node)));
    }

    /// Starts a node that is not (yet) a member: pristine, with `peers` =
    /// the members' addresses plus its own, so it adopts their cluster and
    /// waits to be added. Returns its address.
    pub async fn add_node(&self, n: NodeId) -> String {
        let addr = free_addr();
        let c = {
            let mut configs = locked(&self.configs);
            let mut c = configs.values().next().unwrap().clone();
            c.node_id = n;
            c.listen = addr;
            c.data_dir = self.root.join(format!("n{n}"));
            c.peers.insert(n, addr.to_string());
            for other in configs.values_mut() {
                other.peers.insert(n, addr.to_string());
            }
            configs.insert(n, c.clone());
            c
        };
        let node = start_node(c).await;
        locked(&self.nodes).insert(n, Some(Arc::new(node)));
        addr.to_string()
    }

    // ---- observing ----------------------------------------------------

    /// The leader among running nodes: the node in the highest term that
    /// calls itself leader and that another running node follows (or the
    /// only node). Polls until there is one.
    pub async fn leader(&self, timeout: Duration) -> NodeId {
        self.leader_among(&self.running(), timeout).await
    }

    /// The leader among `ids` (see [`leader`](Self::leader)).
    pub async fn leader_among(&self, ids: &[NodeId], timeout: Duration) -> NodeId {
        eventually("a leader", timeout, || async { self.current_leader(ids) }).await
    }

    fn current_leader(&self, ids: &[NodeId]) -> Option<NodeId> {
        let mut best: Option<(u64, NodeId)> = None;
        for id in ids {
            let Some(node) = self.try_node(*id) else { continue };
            let s = node.service().status();
            if s.state != "leader" {
                continue;
            }
            let followed = ids.len() == 1
                || ids
                    .iter()
                    .any(|o| o != id && self.try_node(*o).is_some_and(|n| n.service().status().leader_id == Some(*id)));
            if followed && best.is_none_or(|(t, _)| s.term > t) {
                best = Some((s.term, *id));
            }
        }
        best.map(|(_, id)| id)
    }

    /// A lock client talking to node `n` only (no leader following), with
    /// the client faults applied.
    pub fn client(&self, n: NodeId) -> Client {
        LockClient::new(self.channel(n))
    }

    /// An admin client of node `n`, with the client faults applied.
    pub fn admin(&self, n: NodeId) -> AdminClient<FaultyChannel> {
        AdminClient::new(self.channel(n))
    }

    fn channel(&self, n: NodeId) -> FaultyChannel {
        let inner = Endpoint::from_shared(format!("http://{}", self.addr(n)))
            .unwrap()
            .connect_timeout(Duration::from_millis(500))
            .timeout(Duration::from_secs(10))
            .connect_lazy();
        FaultyChannel { node: n, inner, faults: self.client_faults.clone() }
    }

    // ---- recorded operations ------------------------------------------

    /// Acquire on node `n`, recorded in `h`.
    pub async fn acquire(
        &self,
        h: &History,
        n: NodeId,
        resource: &str,
        request_id: &str,
        ttl_ms: u64,
        wait_ms: u64,
    ) -> Result<fencer_proto::v1::AcquireResponse, tonic::Status> {
        let req = AcquireRequest {
            resource: resource.into(),
            request_id: request_id.into(),
            ttl_ms: Some(ttl_ms),
            wait_timeout_ms: wait_ms,
            // Not the node: a retry on another node is the same request
            // (same holder and ttl), or it is refused REQUEST_ID_REUSED.
            holder: format!("test/{request_id}"),
        };
        let sent = h.now();
        let r = self.client(n).acquire(req).await.map(|r| r.into_inner());
        let answer = match &r {
            Ok(g) => Answer::Granted { lease_id: g.lease_id.clone(), token: g.fencing_token, ttl_ms: g.ttl_ms },
            Err(s) => answer_of(s),
        };
        let call = Call::Acquire { resource: resource.into(), request_id: request_id.into(), ttl_ms };
        h.record(Op { client: format!("node {n}"), call, sent, answered: h.now(), answer });
        r
    }

    /// Renew on node `n`, recorded in `h`.
    pub async fn renew(
        &self,
        h: &History,
        n: NodeId,
        resource: &str,
        lease_id: &str,
    ) -> Result<fencer_proto::v1::RenewResponse, tonic::Status> {
        let sent = h.now();
        let req = RenewRequest { resource: resource.into(), lease_id: lease_id.into() };
        let r = self.client(n).renew(req).await.map(|r| r.into_inner());
        let answer = match &r {
            Ok(ok) => Answer::Renewed { token: ok.fencing_token },
            Err(s) => answer_of(s),
        };
        let call = Call::Renew { resource: resource.into(), lease_id: lease_id.into() };
        h.record(Op { client: format!("node {n}"), call, sent, answered: h.now(), answer });
        r
    }

    /// `copies` renewals of one lease in one Batch call on node `n` (they
    /// share one quorum confirmation), each recorded in `h` with its answer.
    pub async fn renew_batched(
        &self,
        h: &History,
        n: NodeId,
        resource: &str,
        lease_id: &str,
        copies: usize,
    ) -> Result<Vec<fencer_proto::v1::BatchResult>, tonic::Status> {
        use fencer_proto::v1::{BatchItem, BatchRequest, batch_item, batch_result};
        let sent = h.now();
        let item = BatchItem {
            call: Some(batch_item::Call::Renew(RenewRequest { resource: resource.into(), lease_id: lease_id.into() })),
        };
        let r = self.client(n).batch(BatchRequest { items: vec![item; copies] }).await.map(|r| r.into_inner().results);
        for i in 0..copies {
            let answer = match &r {
                Ok(results) => match results.get(i).and_then(|x| x.result.as_ref()) {
                    Some(batch_result::Result::Renew(ok)) => Answer::Renewed { token: ok.fencing_token },
                    Some(batch_result::Result::Error(e)) => answer_of(&tonic::Status::from(e)),
                    other => Answer::Unavailable { reason: format!("batch item {i}: unexpected answer {other:?}") },
                },
                Err(s) => answer_of(s),
            };
            let call = Call::Renew { resource: resource.into(), lease_id: lease_id.into() };
            h.record(Op { client: format!("node {n}"), call, sent, answered: h.now(), answer });
        }
        r
    }

    /// Release on node `n`, recorded in `h`.
    pub async fn release(
        &self,
        h: &History,
        n: NodeId,
        resource: &str,
        lease_id: &str,
    ) -> Result<fencer_proto::v1::ReleaseResponse, tonic::Status> {
        let sent = h.now();
        let req = ReleaseRequest { resource: resource.into(), lease_id: lease_id.into() };
        let r = self.client(n).release(req).await.map(|r| r.into_inner());
        let answer = match &r {
            Ok(ok) if ok.was_holder => Answer::Released,
            Ok(_) => Answer::AlreadyReleased,
            Err(s) => answer_of(s),
        };
        let call = Call::Release { resource: resource.into(), lease_id: lease_id.into() };
        h.record(Op { client: format!("node {n}"), call, sent, answered: h.now(), answer });
        r
    }

    /// `GET path` on node `n`'s HTTP side: (status, body).
    pub async fn http_get(&self, n: NodeId, path: &str) -> Option<(u16, String)> {
        crate::http_get(self.addr(n).as_str(), path, Duration::from_secs(5)).await.ok()
    }

    /// Acquire wherever the leader is: on UNAVAILABLE retry the same request
    /// id on the hinted leader or the next running node, for at most 10 s.
    pub async fn acquire_any(
        &self,
        h: &History,
        resource: &str,
        request_id: &str,
        ttl_ms: u64,
        wait_ms: u64,
    ) -> Result<fencer_proto::v1::AcquireResponse, tonic::Status> {
        self.routed(|n| self.acquire(h, n, resource, request_id, ttl_ms, wait_ms)).await
    }

    /// Renew wherever the leader is (see [`acquire_any`](Self::acquire_any)).
    pub async fn renew_any(
        &self,
        h: &History,
        resource: &str,
        lease_id: &str,
    ) -> Result<fencer_proto::v1::RenewResponse, tonic::Status> {
        self.routed(|n| self.renew(h, n, resource, lease_id)).await
    }

    /// Release wherever the leader is (see [`acquire_any`](Self::acquire_any)).
    pub async fn release_any(
        &self,
        h: &History,
        resource: &str,
        lease_id: &str,
    ) -> Result<fencer_proto::v1::ReleaseResponse, tonic::Status> {
        self.routed(|n| self.release(h, n, resource, lease_id)).await
    }

    async fn routed<T, F, Fut>(&self, mut call: F) -> Result<T, tonic::Status>
    where
        F: FnMut(NodeId) -> Fut,
        Fut: Future<Output = Result<T, tonic::Status>>,
    {
        let deadline = Instant::now() + Duration::from_secs(10);
        let running = self.running();
        let mut target = self.current_leader(&running).unwrap_or(running[0]);
        let mut turn = 0;
        loop {
            let r = call(target).await;
            let status = match &r {
                Ok(_) => return r,
                Err(s) if !matches!(answer_of(s), Answer::Unavailable { .. }) => return r,
                Err(s) => s,
            };
            if Instant::now() > deadline {
                return r;
            }
            let hinted = status
                .get_error_details()
                .error_info()
                .and_then(|i| i.metadata.get("leader_id").and_then(|l| l.parse::<NodeId>().ok()))
                .filter(|l| *l != target && self.running().contains(l));
            target = hinted.unwrap_or_else(|| {
                turn += 1;
                let running = self.running();
                running[turn % running.len()]
            });
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops every node gracefully.
    pub async fn shutdown(self) {
        for n in self.running() {
            let Some(node) = locked(&self.nodes).get_mut(&n).and_then(Option::take) else { continue };
            into_inner(node).await.shutdown().await;
        }
    }
}

/// Takes a node out of its `Arc` once the short-lived handles given out by
/// [`Cluster::node`] are gone.
async fn into_inner(mut node: Arc<Node>) -> Node {
    for _ in 0..500 {
        match Arc::try_unwrap(node) {
            Ok(n) => return n,
            Err(back) => node = back,
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("a handle to a crashed node is still held by the test");
}

/// Starts a node, retrying while the previous incarnation of the same data
/// dir still holds its files or port (an aborted node's last tasks may take
/// a moment to let go).
async fn start_node(config: NodeConfig) -> Node {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match Node::start(config.clone()).await {
            Ok(node) => return node,
            Err(e) if Instant::now() < deadline => {
                tracing::debug!(error = %e, "node {} not startable yet; retrying", config.node_id);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("node {} does not start: {e}", config.node_id),
        }
    }
}
