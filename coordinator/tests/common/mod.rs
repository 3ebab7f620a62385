//! Shared helpers of the coordinator's integration tests.
#![allow(dead_code, unreachable_pub, missing_docs)]

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use fencer_coordinator::{Node, NodeConfig};
use fencer_proto::v1::lock_client::LockClient;
use fencer_proto::v1::{AcquireRequest, AcquireResponse};
use tonic::transport::Channel;
use tonic_types::StatusExt;

/// Fast timings so expiry tests take well under a second: election timeout
/// 150–300 ms, so the shortest ttl is 500 ms.
pub fn fast_config(dir: &Path) -> NodeConfig {
    let mut c = NodeConfig::single(dir, "127.0.0.1:0".parse::<SocketAddr>().unwrap());
    c.heartbeat = Duration::from_millis(50);
    c.election_timeout = (Duration::from_millis(150), Duration::from_millis(300));
    c
}

pub async fn start(dir: &Path) -> Node {
    start_with(fast_config(dir)).await
}

pub async fn start_with(config: NodeConfig) -> Node {
    let node = Node::start(config).await.expect("node starts");
    node.wait_for_leader(Duration::from_secs(10)).await.expect("leader elected");
    // The leader is ready once its inherited state is applied.
    for _ in 0..200 {
        if node.service().status().state == "leader" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // And its signing key is registered (the first entry after the
    // membership on a new data dir), so tests see a fixed log order.
    for _ in 0..500 {
        if !node.state().signing_keys().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    node
}

pub async fn client(node: &Node) -> LockClient<Channel> {
    LockClient::connect(format!("http://{}", node.local_addr())).await.expect("connect")
}

pub fn acquire_req(resource: &str, request_id: &str, ttl_ms: u64, wait_ms: u64) -> AcquireRequest {
    AcquireRequest {
        resource: resource.into(),
        request_id: request_id.into(),
        ttl_ms,
        wait_timeout_ms: wait_ms,
        holder: format!("test/{request_id}"),
    }
}

pub async fn acquire(
    c: &mut LockClient<Channel>,
    resource: &str,
    request_id: &str,
    ttl_ms: u64,
    wait_ms: u64,
) -> Result<AcquireResponse, tonic::Status> {
    c.acquire(acquire_req(resource, request_id, ttl_ms, wait_ms)).await.map(|r| r.into_inner())
}

/// The ErrorInfo reason of a status.
pub fn reason(status: &tonic::Status) -> String {
    status.get_error_details().error_info().map(|i| i.reason.clone()).unwrap_or_default()
}
