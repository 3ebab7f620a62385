//! `fencer dev`: the embedded default — a single-node coordinator with its
//! data in a local directory.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use fencer_coordinator::{Node, NodeConfig};

/// Arguments of `fencer dev`.
#[derive(Debug, clap::Args)]
pub(crate) struct DevArgs {
    /// Where locks, the raft log and snapshots are kept. Restarting on the
    /// same directory keeps every lock and never reuses a token.
    #[arg(long, env = "FENCER_DATA_DIR", default_value = "./fencer-data")]
    data_dir: PathBuf,

    /// Address to serve gRPC, JSON over HTTP and /metrics on.
    #[arg(long, env = "FENCER_LISTEN", default_value = "127.0.0.1:7420")]
    listen: SocketAddr,
}

pub(crate) async fn run(args: DevArgs) -> anyhow::Result<ExitCode> {
    let config = NodeConfig::single(&args.data_dir, args.listen);
    let node = Node::start(config).await?;
    let addr = node.local_addr();
    let data_dir = std::fs::canonicalize(&args.data_dir).unwrap_or(args.data_dir.clone());
    eprintln!(
        "\
fencer dev — single-node coordinator (the embedded default)
  endpoint  {addr}   gRPC, JSON over HTTP, /metrics, /livez, /readyz
  data dir  {data}   locks and tokens survive restarts
  cluster   {cluster} (node 1)
  INSECURE: no TLS and no authentication; bind to loopback only. For local use.

Try, in another terminal:
  fencer acquire orders/42 --ttl 30s -o json
  fencer get orders/42
  fencer renew orders/42 --lease <lease_id>
  fencer release orders/42 --lease <lease_id>
  fencer exec orders/42 --ttl 30s -- sh -c 'echo token $FENCER_TOKEN'
  fencer list
  fencer status
  curl -s http://{addr}/v1/locks/orders/42
Stop with Ctrl-C.",
        data = data_dir.display(),
        cluster = node.cluster_id(),
    );
    super::shutdown_signal().await;
    node.shutdown().await;
    Ok(ExitCode::SUCCESS)
}
