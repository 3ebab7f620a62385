//! An in-process coordinator node with fast timings: heartbeat 50 ms,
//! election 150–300 ms, so the shortest ttl is 500 ms (as in the
//! coordinator's own tests).

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use fencer_coordinator::{Node, NodeConfig};

pub fn fast_config(dir: &Path) -> NodeConfig {
    let mut c = NodeConfig::single(dir, "127.0.0.1:0".parse::<SocketAddr>().unwrap());
    c.heartbeat = Duration::from_millis(50);
    c.election_timeout = (Duration::from_millis(150), Duration::from_millis(300));
    c
}

/// Starts a node on `dir` and waits until it leads with its state applied.
pub async fn start(dir: &Path) -> Node {
    start_on(dir, "127.0.0.1:0".parse().unwrap()).await
}

/// Starts a node on `dir` listening on `listen` (to restart on the same port).
pub async fn start_on(dir: &Path, listen: SocketAddr) -> Node {
    let mut config = fast_config(dir);
    config.listen = listen;
    let node = Node::start(config).await.expect("node starts");
    node.wait_for_leader(Duration::from_secs(10)).await.expect("leader elected");
    for _ in 0..200 {
        if node.service().status().state == "leader" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    node
}

/// A client of `node` (directly, no fault layer).
pub fn client(node: &Node) -> fencer_client::Client {
    fencer_client::Client::new([node.local_addr().to_string()]).unwrap()
}
