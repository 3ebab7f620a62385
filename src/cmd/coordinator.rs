//! `fencer coordinator`: one node of a coordinator cluster.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use fencer_coordinator::{Node, NodeConfig};

use super::parse_duration;

/// Arguments of `fencer coordinator`.
#[derive(Debug, clap::Args)]
pub(crate) struct CoordinatorArgs {
    /// This node's id (a positive integer, unique in the cluster).
    #[arg(long, env = "FENCER_NODE_ID", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    id: u64,

    /// Address to listen on.
    #[arg(long, env = "FENCER_LISTEN", default_value = "127.0.0.1:7420")]
    listen: SocketAddr,

    /// Address peers and clients use to reach this node (default: --listen).
    #[arg(long, env = "FENCER_ADVERTISE")]
    advertise: Option<String>,

    /// The voters the cluster forms with, this node included:
    /// `1=host:port,2=host:port,3=host:port`. Leave empty for a single-node
    /// cluster. Run the same command on every node: the node with the
    /// smallest id founds the cluster, the others join it. A node that joins
    /// an existing cluster lists some of its members and itself. Once
    /// formed, membership changes only through `fencer member`.
    #[arg(long, env = "FENCER_PEERS", value_delimiter = ',', value_parser = parse_peer)]
    peers: Vec<(u64, String)>,

    /// Where the raft log, the lock state and snapshots are kept.
    #[arg(long, env = "FENCER_DATA_DIR")]
    data_dir: PathBuf,

    /// Leader heartbeat period.
    #[arg(long, env = "FENCER_HEARTBEAT", default_value = "250ms", value_parser = parse_duration)]
    heartbeat: Duration,

    /// Shortest election timeout; the longest is twice this. The shortest
    /// lease ttl accepted is 1.5 × the longest election timeout.
    #[arg(long, env = "FENCER_ELECTION_TIMEOUT", default_value = "1s", value_parser = parse_duration)]
    election_timeout: Duration,

    /// Build a snapshot (and purge the log behind it) every this many entries.
    #[arg(long, env = "FENCER_SNAPSHOT_EVERY", default_value_t = 50_000)]
    snapshot_every: u64,
}

fn parse_peer(s: &str) -> Result<(u64, String), String> {
    let (id, addr) = s.split_once('=').ok_or_else(|| format!("{s:?} is not ID=HOST:PORT"))?;
    let id: u64 = id.trim().parse().map_err(|_| format!("{id:?} in {s:?} is not a node id"))?;
    if id == 0 {
        return Err("node ids start at 1".into());
    }
    let addr = addr.trim();
    if addr.rsplit_once(':').and_then(|(_, p)| p.parse::<u16>().ok()).is_none() {
        return Err(format!("{addr:?} in {s:?} is not HOST:PORT"));
    }
    Ok((id, addr.to_string()))
}

pub(crate) async fn run(args: CoordinatorArgs) -> anyhow::Result<ExitCode> {
    let mut peers = BTreeMap::new();
    for (id, addr) in args.peers {
        if let Some(prev) = peers.insert(id, addr.clone()) {
            anyhow::bail!("--peers names node {id} twice ({prev} and {addr})");
        }
    }
    if args.heartbeat * 3 > args.election_timeout {
        anyhow::bail!(
            "--heartbeat {:?} must be at most a third of --election-timeout {:?}",
            args.heartbeat,
            args.election_timeout
        );
    }
    let mut config = NodeConfig::single(&args.data_dir, args.listen);
    config.node_id = args.id;
    config.advertise = args.advertise;
    config.peers = peers;
    config.heartbeat = args.heartbeat;
    config.election_timeout = (args.election_timeout, args.election_timeout * 2);
    config.snapshot_every = args.snapshot_every.max(1_000);
    let node = Node::start(config).await?;
    let cluster = node.cluster_id();
    eprintln!(
        "fencer coordinator: node {} serving on {} ({})",
        args.id,
        node.local_addr(),
        if cluster.is_empty() {
            "looking for its cluster among --peers".to_string()
        } else {
            format!("cluster {cluster}")
        }
    );
    super::shutdown_signal().await;
    node.shutdown().await;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::parse_peer;

    #[test]
    fn peers_are_id_equals_address() {
        assert_eq!(parse_peer("2=127.0.0.2:7420").unwrap(), (2, "127.0.0.2:7420".to_string()));
        assert!(parse_peer("127.0.0.2:7420").is_err());
        assert!(parse_peer("0=a:1").is_err());
        assert!(parse_peer("1=nohost").is_err());
    }
}
