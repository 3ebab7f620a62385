//! `fencer dev`: the embedded default — a single-node coordinator with its
//! data in a local directory.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use fencer_coordinator::{DEFAULT_TLS_HANDSHAKE_TIMEOUT, DevPki, Node, NodeConfig, NodeTls};

use super::coordinator::{ConnectionArgs, ObservabilityArgs};
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

    /// Serve over TLS with a local CA, created on first use in
    /// DATA_DIR/tls (a server certificate for 127.0.0.1, ::1 and localhost,
    /// and a client certificate for mTLS), and print how clients use them.
    #[arg(long, env = "FENCER_DEV_TLS")]
    tls: bool,

    /// Tenants (TOML; docs/security.md, "Tenants"). Without it every caller
    /// may do everything.
    #[arg(long, env = "FENCER_TENANTS")]
    tenants: Option<PathBuf>,

    #[command(flatten)]
    observability: ObservabilityArgs,
    #[command(flatten)]
    connections: ConnectionArgs,
}

pub(crate) async fn run(args: DevArgs, log: Arc<LogFilter>) -> anyhow::Result<ExitCode> {
    let mut config = NodeConfig::single(&args.data_dir, args.listen);
    args.observability.apply(&mut config, log);
    args.connections.apply(&mut config)?;
    let pki = if args.tls {
        let dir = args.data_dir.join("tls");
        let pki = tokio::task::spawn_blocking(move || DevPki::load_or_create(&dir))
            .await?
            .map_err(|e| anyhow::anyhow!("cannot create the dev certificates in DATA_DIR/tls: {e}"))?;
        config.tls = Some(NodeTls {
            cert_file: pki.server.cert_file.clone(),
            key_file: pki.server.key_file.clone(),
            client_ca_file: Some(pki.ca_file.clone()),
            peer_ca_file: None,
            handshake_timeout: DEFAULT_TLS_HANDSHAKE_TIMEOUT,
        });
        Some(pki)
    } else {
        None
    };
    config.tenants = super::coordinator::load_tenants(args.tenants.as_ref()).await?;
    let tenants = config.tenants.as_ref().map(|t| t.tenants().len());
    let node = Node::start(config).await?;
    let addr = node.local_addr();
    let data_dir = std::fs::canonicalize(&args.data_dir).unwrap_or(args.data_dir.clone());
    let abs = |p: &std::path::Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf()).display().to_string();
    let (security, flags, curl) = match &pki {
        None => (
            match tenants {
                None => "  INSECURE: no TLS and no authentication (every client may do everything);\n  \
                         bind to loopback only. For local use. `fencer dev --tls` adds TLS and mTLS."
                    .to_string(),
                Some(n) => format!(
                    "  tenants   {n} from --tenants (bearer tokens only: no TLS)\n  \
                     INSECURE: no TLS — bearer tokens and lease ids cross the network in plaintext. \
                     `fencer dev --tls` adds TLS."
                ),
            },
            String::new(),
            format!("curl -s http://{addr}/v1/locks/orders/42"),
        ),
        Some(p) => {
            let (ca, cert, key) = (abs(&p.ca_file), abs(&p.client.cert_file), abs(&p.client.key_file));
            (
                format!(
                    "  TLS       certificates in {dir} ({state}; the CA key is there too: dev only)\n  \
                     {who}\n\n\
                     Clients need the CA and (for mTLS) the client certificate; set them once:\n  \
                     export FENCER_ENDPOINTS={addr} FENCER_CA={ca} FENCER_CERT={cert} FENCER_KEY={key}\n\
                     or pass them to each command:\n  \
                     fencer acquire orders/42 --endpoints {addr} --ca {ca} --cert {cert} --key {key}",
                    dir = abs(&data_dir.join("tls")),
                    who = match tenants {
                        None => "INSECURE: no tenants — any client with a certificate from this CA may do everything."
                            .to_string(),
                        Some(n) =>
                            format!("tenants   {n} from --tenants: callers need a known certificate or bearer token"),
                    },
                    state = if p.created { "created now" } else { "reused" },
                ),
                " (with the exports above)".to_string(),
                format!("curl -s --cacert {ca} --cert {cert} --key {key} https://{addr}/v1/locks/orders/42"),
            )
        }
    };
    eprintln!(
        "\
fencer dev — single-node coordinator (the embedded default)
  endpoint  {scheme}{addr}   gRPC, JSON over HTTP, /metrics, /livez, /readyz
  console   {console}   the operator console, in a browser{console_note}
  data dir  {data}   locks and tokens survive restarts
  audit log {audit}   every change, one JSON line (fencer audit --data-dir …)
  cluster   {cluster} (node 1)
{security}

Try, in another terminal{flags}:
  fencer acquire orders/42 --ttl 30s -o json
  fencer get orders/42
  fencer renew orders/42 --lease <lease_id>
  fencer release orders/42 --lease <lease_id>
  fencer exec orders/42 --ttl 30s -- sh -c 'echo token $FENCER_TOKEN'
  fencer list
  fencer status
  fencer top
  fencer audit --data-dir {data}
  {curl}
Stop with Ctrl-C.",
        scheme = if pki.is_some() { "https://" } else { "" },
        console = console_urls(node.local_addr(), pki.is_some(), node.status_addr()),
        console_note = match (&pki, tenants) {
            (Some(_), None) => " (import the client certificate and trust the CA)",
            (_, Some(_)) => " (enter a tenant's bearer token in the page)",
            (None, None) => "",
        },
        data = data_dir.display(),
        audit = node.audit_dir().map_or_else(|| "off".to_string(), |d| d.display().to_string()),
        cluster = node.cluster_id(),
    );
    super::shutdown_signal().await;
    node.shutdown().await;
    Ok(ExitCode::SUCCESS)
}

/// The console's address on the node's port and, when set, on the status
/// port (always plaintext, read only).
fn console_urls(addr: SocketAddr, tls: bool, status: Option<SocketAddr>) -> String {
    let main = format!("{}://{addr}/ui/", if tls { "https" } else { "http" });
    match status {
        Some(s) => format!("{main} (read only: http://{s}/ui/)"),
        None => main,
    }
}
