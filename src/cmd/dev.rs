//! `fencer dev`: the embedded default — a single-node coordinator with its
//! data in a local directory.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use fencer_coordinator::{Node, NodeConfig};

use super::coordinator::ObservabilityArgs;
use super::log_level::LogFilter;

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

    #[command(flatten)]
    observability: ObservabilityArgs,
}

pub(crate) async fn run(args: DevArgs, log: Arc<LogFilter>) -> anyhow::Result<ExitCode> {
    let mut config = NodeConfig::single(&args.data_dir, args.listen);
    args.observability.apply(&mut config, log);
    let node = Node::start(config).await?;
    let addr = node.local_addr();
    let data_dir = std::fs::canonicalize(&args.data_dir).unwrap_or(args.data_dir.clone());
    eprintln!(
        "\
fencer dev — single-node coordinator (the embedded default)
  endpoint  {addr}   gRPC, JSON over HTTP, /metrics, /livez, /readyz
  data dir  {data}   locks and tokens survive restarts
  audit log {audit}   every change, one JSON line (fencer audit --data-dir …)
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
  fencer top
  fencer audit --data-dir {data}
  curl -s http://{addr}/v1/locks/orders/42
Stop with Ctrl-C.",
        data = data_dir.display(),
        audit = node.audit_dir().map_or_else(|| "off".to_string(), |d| d.display().to_string()),
        cluster = node.cluster_id(),
    );
    super::shutdown_signal().await;
    node.shutdown().await;
    Ok(ExitCode::SUCCESS)
}
