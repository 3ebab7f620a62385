//! One in-process coordinator node with fast timings (heartbeat 50 ms,
//! election timeout 150–300 ms, so the shortest ttl is 500 ms), started and
//! waited on until it is ready: it leads, its inherited state is applied,
//! and its signing key is registered (the first entry after the membership
//! on a new data dir), so tests begin from a fixed log. Each wait fails
//! loudly.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use fencer_coordinator::{Node, NodeConfig};
use fencer_proto::v1::lock_client::LockClient;
use fencer_proto::v1::{AcquireRequest, AcquireResponse};
use tonic::transport::Channel;

use crate::eventually;

/// Heartbeat of test nodes.
pub const HEARTBEAT: Duration = Duration::from_millis(50);
/// Election timeout range of test nodes.
pub const ELECTION: (Duration, Duration) = (Duration::from_millis(150), Duration::from_millis(300));
/// How long a node may take to be ready.
pub const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// The config of a single node on `dir`, listening on a free loopback port,
/// with the fast timings.
pub fn fast_config(dir: &Path) -> NodeConfig {
    let mut c = NodeConfig::single(dir, SocketAddr::from(([127, 0, 0, 1], 0)));
    c.heartbeat = HEARTBEAT;
    c.election_timeout = ELECTION;
    c
}

/// Starts a node on `dir` and waits until it is ready.
pub async fn start(dir: &Path) -> Node {
    start_with(fast_config(dir)).await
}

/// Starts a node on `dir` listening on `listen` (to restart on the same port).
pub async fn start_on(dir: &Path, listen: SocketAddr) -> Node {
    let mut config = fast_config(dir);
    config.listen = listen;
    start_with(config).await
}

/// Starts a node with `config` and waits until it is ready.
pub async fn start_with(config: NodeConfig) -> Node {
    let node = Node::start(config).await.expect("node starts");
    wait_ready(&node).await;
    node
}

/// Waits until `node` leads with its state applied and its signing key
/// registered; panics naming what did not happen within [`READY_TIMEOUT`].
pub async fn wait_ready(node: &Node) {
    node.wait_for_leader(READY_TIMEOUT).await.expect("leader elected");
    eventually("the node leads with its inherited state applied", READY_TIMEOUT, || async {
        let s = node.service().status();
        (s.state == "leader" && s.leader_ready).then_some(())
    })
    .await;
    eventually("the node's signing key registered", READY_TIMEOUT, || async {
        (!node.state().signing_keys().is_empty()).then_some(())
    })
    .await;
}

/// A gRPC lock client of `node`.
pub async fn grpc_client(node: &Node) -> LockClient<Channel> {
    LockClient::connect(format!("http://{}", node.local_addr())).await.expect("connect")
}

/// A `fencer_client::Client` of `node` (directly, no fault layer).
pub fn client(node: &Node) -> fencer_client::Client {
    fencer_client::Client::new([node.local_addr().to_string()]).expect("a client of one loopback node")
}

/// An acquire request whose holder names the request id (`test/RID`).
pub fn acquire_req(resource: &str, request_id: &str, ttl_ms: u64, wait_ms: u64) -> AcquireRequest {
    AcquireRequest {
        resource: resource.into(),
        request_id: request_id.into(),
        ttl_ms: Some(ttl_ms),
        wait_timeout_ms: wait_ms,
        holder: format!("test/{request_id}"),
    }
}

/// Acquire over gRPC (see [`acquire_req`]).
pub async fn acquire(
    c: &mut LockClient<Channel>,
    resource: &str,
    request_id: &str,
    ttl_ms: u64,
    wait_ms: u64,
) -> Result<AcquireResponse, tonic::Status> {
    c.acquire(acquire_req(resource, request_id, ttl_ms, wait_ms)).await.map(|r| r.into_inner())
}
