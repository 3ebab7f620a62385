//! `fencer coordinator`: one node of a coordinator cluster.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use std::sync::Arc;

use fencer_coordinator::{AuditConfig, Node, NodeConfig, NodeTls, Tenants};

use super::log_level::LogFilter;
use super::parse_duration;

/// Status-port, audit-log and hot-resource flags of `fencer coordinator`
/// and `fencer dev` (docs/operations.md).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ObservabilityArgs {
    /// Also serve /metrics, /livez, /readyz, /v1/status and the operator
    /// endpoints (hot resources, log level) on this address, for scrapers
    /// and probes that should not reach the lock API. They stay on --listen.
    #[arg(long, env = "FENCER_STATUS_LISTEN")]
    status_listen: Option<SocketAddr>,

    /// Where the audit log is written [default: DATA_DIR/audit].
    #[arg(long, env = "FENCER_AUDIT_DIR")]
    audit_dir: Option<PathBuf>,

    /// Rotate the audit file before it passes this size: bytes, or with a
    /// K, M or G suffix (KiB, MiB, GiB). At least 4K.
    #[arg(long, env = "FENCER_AUDIT_MAX_FILE_SIZE", default_value = "64M", value_parser = parse_size)]
    audit_max_file_size: u64,

    /// Audit files kept, the current one included (2–1000); older ones are
    /// deleted. Disk use is at most about size × files.
    #[arg(long, env = "FENCER_AUDIT_MAX_FILES", default_value_t = 16, value_parser = clap::value_parser!(u32).range(2..=1000))]
    audit_max_files: u32,

    /// With --renewals-in-log: leave renewals out of the audit log (at the
    /// seed scale a third of all lines). Without it renewals write no log
    /// entry, so no audit line either.
    #[arg(long, env = "FENCER_AUDIT_SKIP_RENEWALS")]
    audit_skip_renewals: bool,

    /// Write every renewal as a raft entry, as before: each node applies it
    /// and its audit log records it, at about a third more log traffic at
    /// the seed mix. By default the leader confirms a renewal with a quorum
    /// round (ReadIndex) and writes no entry, so renewals are not in the
    /// audit log (docs/coordinator.md, "Renewals").
    #[arg(long, env = "FENCER_RENEWALS_IN_LOG")]
    renewals_in_log: bool,

    /// Resources tracked for `fencer top` (memory: about 600 bytes each).
    #[arg(long, env = "FENCER_HOT_CAPACITY", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    hot_capacity: u32,
}

/// The bounds of every connection to the node's ports (docs/coordinator.md
/// "Connections"): flags of `fencer coordinator` and `fencer dev`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ConnectionArgs {
    /// Connections open at once on a port; one more is closed at accept,
    /// logged and counted (fencer_connections_refused_total).
    #[arg(long, env = "FENCER_MAX_CONNECTIONS", default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    max_connections: u32,
    /// A connection that sends no byte (no TLS hello, no request) this long
    /// after accept is closed.
    #[arg(long, env = "FENCER_FIRST_BYTE_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    first_byte_timeout: Duration,
    /// Time to send an HTTP/1 request head (from the first byte, or from the
    /// previous answer on a keep-alive connection: also the idle timeout).
    #[arg(long, env = "FENCER_HEADER_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    header_timeout: Duration,
    /// Time to send a JSON request body after its head (408 BODY_TIMEOUT).
    #[arg(long, env = "FENCER_BODY_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    body_timeout: Duration,
}

impl ConnectionArgs {
    /// Sets the node's connection bounds; a zero timeout is refused.
    pub(crate) fn apply(&self, config: &mut NodeConfig) -> anyhow::Result<()> {
        for (flag, d) in [
            ("--first-byte-timeout", self.first_byte_timeout),
            ("--header-timeout", self.header_timeout),
            ("--body-timeout", self.body_timeout),
        ] {
            anyhow::ensure!(!d.is_zero(), "{flag} must be above 0");
        }
        config.connections = fencer_coordinator::ConnectionLimits {
            max_connections: self.max_connections as usize,
            first_byte_timeout: self.first_byte_timeout,
            header_timeout: self.header_timeout,
            body_timeout: self.body_timeout,
        };
        Ok(())
    }
}

impl ObservabilityArgs {
    /// Puts these settings into a node's configuration.
    pub(crate) fn apply(&self, config: &mut NodeConfig, log: Arc<LogFilter>) {
        config.status_listen = self.status_listen;
        config.audit = Some(AuditConfig {
            dir: self.audit_dir.clone(),
            max_file_bytes: self.audit_max_file_size,
            max_files: self.audit_max_files,
            renewals: !self.audit_skip_renewals,
        });
        let mut policy = config.policy();
        policy.renewals_in_log = self.renewals_in_log;
        config.policy = Some(policy);
        config.hot_capacity = self.hot_capacity as usize;
        config.log_control = Some(log);
    }
}

/// TLS flags of `fencer coordinator` (docs/security.md, "TLS for the
/// coordinator").
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct TlsArgs {
    /// Serve the lock API and raft traffic over TLS with this certificate
    /// chain (PEM, leaf first); plaintext connections are then refused.
    #[arg(long, env = "FENCER_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,

    /// The private key of --tls-cert (PEM).
    #[arg(long, env = "FENCER_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,

    /// Verify client certificates against this CA (mTLS); a verified
    /// certificate names a client identity for --tenants.
    #[arg(long, env = "FENCER_TLS_CLIENT_CA", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,

    /// The CA of the cluster's nodes: raft traffic is accepted only with a
    /// client certificate it issued, and peers' certificates must chain to
    /// it. Required with TLS when the cluster has more than one node.
    #[arg(long, env = "FENCER_PEER_CA", requires = "tls_cert")]
    peer_ca: Option<PathBuf>,

    /// Bound on one TLS handshake.
    #[arg(long, env = "FENCER_TLS_HANDSHAKE_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    tls_handshake_timeout: Duration,
}

impl TlsArgs {
    /// The node's TLS settings, if TLS is on.
    pub(crate) fn node_tls(&self) -> Option<NodeTls> {
        Some(NodeTls {
            cert_file: self.tls_cert.clone()?,
            key_file: self.tls_key.clone()?,
            client_ca_file: self.tls_client_ca.clone(),
            peer_ca_file: self.peer_ca.clone(),
            handshake_timeout: self.tls_handshake_timeout,
        })
    }
}

/// Parses `4096`, `64K`, `64M`, `1G` (binary units).
fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (digits, unit) = match t.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => (&t[..i], t[i..].trim()),
        None => (t, ""),
    };
    let shift = match unit.to_ascii_uppercase().trim_end_matches("IB").trim_end_matches('B') {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        _ => return Err(format!("{s:?}: the unit must be K, M or G")),
    };
    let n: u64 = digits.parse().map_err(|_| format!("{s:?} is not a size like 4096, 64K or 64M"))?;
    let bytes = n.checked_shl(shift).filter(|b| b >> shift == n).ok_or_else(|| format!("{s:?} is too large"))?;
    if bytes < 4096 {
        return Err(format!("{s:?} is below the minimum of 4K"));
    }
    Ok(bytes)
}

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

    /// Leader heartbeat period (at most a third of --election-timeout).
    #[arg(long, env = "FENCER_HEARTBEAT", default_value = "50ms", value_parser = parse_duration)]
    heartbeat: Duration,

    /// The least time between two append requests to one follower. Under
    /// load the entries proposed meanwhile travel together: fewer, larger
    /// replication rounds, so less CPU per operation on every node, for at
    /// most this much more commit latency. A write after a quiet spell is
    /// never held. 0 sends each append as soon as the previous one is
    /// answered. At most --heartbeat (docs/cluster.md, "Timing").
    #[arg(long, env = "FENCER_REPLICATION_INTERVAL", default_value = "4ms", value_parser = parse_duration)]
    replication_interval: Duration,

    /// The least time from the start of one durable write of the raft log
    /// (one `fdatasync`) to the start of the next. Under load the appends
    /// that arrive meanwhile are written together: fewer syncs and thread
    /// wake-ups, so less CPU per operation. A write after a quiet spell is
    /// never held. Default: follows the cluster's voters: with others,
    /// --replication-interval, which a commit waits for anyway; as the only
    /// voter, 1 ms, since its own sync is the whole commit. 0 syncs each
    /// group as soon as the previous one is durable. At most --heartbeat
    /// (docs/cluster.md, "Timing").
    #[arg(long, env = "FENCER_LOG_COMMIT_GAP", value_parser = parse_duration)]
    log_commit_gap: Option<Duration>,

    /// Shortest election timeout; the longest is twice this, and is also
    /// the leader's quorum lease. A leader that dies is replaced after about
    /// 3 to 4 × this; a leader whose majority is silent for 2 × this stops
    /// granting. The shortest lease ttl accepted is 1.5 × the longest
    /// election timeout. Raise it on machines whose nodes can go without
    /// CPU or disk for a few hundred ms, and across regions
    /// (docs/cluster.md, "Timing").
    #[arg(long, env = "FENCER_ELECTION_TIMEOUT", default_value = "150ms", value_parser = parse_duration)]
    election_timeout: Duration,

    /// Build a snapshot (and purge the log behind it) every this many entries
    /// (at least 100), each member at its own phase of the period. Lower:
    /// quicker restarts (a restart replays up to 1.25 periods of log), more
    /// CPU (docs/coordinator.md, "The state").
    #[arg(long, env = "FENCER_SNAPSHOT_EVERY", default_value_t = fencer_coordinator::DEFAULT_SNAPSHOT_EVERY,
          value_parser = clap::value_parser!(u64).range(100..))]
    snapshot_every: u64,

    /// Entries kept in the log behind each snapshot for followers that lag
    /// (0 to 10,000,000); a follower further behind the newest snapshot is
    /// sent the snapshot instead. Default: 10,000, or --snapshot-every if
    /// smaller. Higher: fewer snapshot sends to followers that were away,
    /// more log on disk. 0: a follower even one entry behind the newest
    /// snapshot is sent the whole snapshot (docs/coordinator.md, "The state").
    #[arg(long, env = "FENCER_SNAPSHOT_CATCHUP_ENTRIES",
          value_parser = clap::value_parser!(u64).range(0..=10_000_000))]
    snapshot_catchup_entries: Option<u64>,

    #[command(flatten)]
    observability: ObservabilityArgs,
    #[command(flatten)]
    connections: ConnectionArgs,

    #[command(flatten)]
    tls: TlsArgs,

    /// Tenants (TOML): identities, namespaces, per-prefix permissions and
    /// limits (docs/security.md, "Tenants"). Without it every caller may do
    /// everything.
    #[arg(long, env = "FENCER_TENANTS")]
    tenants: Option<PathBuf>,

    /// Threads that run the node's async work: requests, raft, replication
    /// [default: half the CPUs available, at least 1]. The raft log's
    /// writer, the audit writer and snapshot building have threads of their
    /// own, and the kernel's network and disk work needs CPU too; a second
    /// worker on a 2-CPU machine cost the leader ~20 % more CPU per
    /// operation in hand-offs between the workers (docs/performance.md,
    /// "Worker threads").
    #[arg(long, env = "FENCER_WORKER_THREADS", value_parser = clap::value_parser!(u16).range(1..=1024))]
    worker_threads: Option<u16>,
}

impl CoordinatorArgs {
    /// The async runtime's worker threads: `--worker-threads`, or half the
    /// CPUs available (at least 1).
    pub(crate) fn worker_threads(&self) -> usize {
        match self.worker_threads {
            Some(n) => usize::from(n),
            None => std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1)),
        }
    }
}

/// Loads a tenants file off the async workers; an invalid file stops the
/// start with its line and reason.
pub(crate) async fn load_tenants(path: Option<&PathBuf>) -> anyhow::Result<Option<Arc<Tenants>>> {
    let Some(path) = path.cloned() else { return Ok(None) };
    let tenants = tokio::task::spawn_blocking(move || Tenants::load(&path)).await??;
    Ok(Some(Arc::new(tenants)))
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

pub(crate) async fn run(args: CoordinatorArgs, log: Arc<LogFilter>) -> anyhow::Result<ExitCode> {
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
    if args.replication_interval > args.heartbeat {
        anyhow::bail!(
            "--replication-interval {:?} must be at most --heartbeat {:?}",
            args.replication_interval,
            args.heartbeat
        );
    }
    if let Some(gap) = args.log_commit_gap
        && gap > args.heartbeat
    {
        anyhow::bail!("--log-commit-gap {gap:?} must be at most --heartbeat {:?}", args.heartbeat);
    }
    let mut config = NodeConfig::single(&args.data_dir, args.listen);
    config.node_id = args.id;
    config.advertise = args.advertise;
    config.peers = peers;
    config.heartbeat = args.heartbeat;
    config.replication_interval = args.replication_interval;
    config.log_commit_gap = args.log_commit_gap;
    config.election_timeout = (args.election_timeout, args.election_timeout * 2);
    config.snapshot_every = args.snapshot_every;
    config.snapshot_catchup_entries = args.snapshot_catchup_entries;
    args.observability.apply(&mut config, log);
    args.connections.apply(&mut config)?;
    config.tls = args.tls.node_tls();
    config.tenants = load_tenants(args.tenants.as_ref()).await?;
    let peers_authenticated = config.tls.as_ref().is_some_and(|t| t.peer_ca_file.is_some());
    if config.tenants.is_some() && config.peers.len() > 1 && !peers_authenticated {
        // Tenants are worth nothing if anyone can speak raft to the node
        // (append entries, change members, register a signing key).
        anyhow::bail!(
            "--tenants on a cluster of {} nodes needs --tls-cert, --tls-key and --peer-ca: \
             without them raft traffic is open to anyone who reaches the port (docs/security.md)",
            config.peers.len()
        );
    }
    if config.tenants.is_some() && config.tls.is_none() {
        tracing::warn!("--tenants without TLS: bearer tokens cross the network in plaintext");
    }
    let tls = config.tls.is_some();
    let node = Node::start(config).await?;
    let cluster = node.cluster_id();
    eprintln!(
        "fencer coordinator: node {} serving on {}{}{} ({})",
        args.id,
        node.local_addr(),
        if tls { " (TLS)" } else { " (plaintext)" },
        node.status_addr().map(|a| format!(", status on {a}")).unwrap_or_default(),
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
    use clap::Parser;

    use super::{CoordinatorArgs, parse_peer, parse_size};

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: CoordinatorArgs,
    }

    #[test]
    fn the_timing_flags_default_to_the_library_defaults() {
        let cli = Cli::try_parse_from(["fencer", "--data-dir", "d"]).expect("only --data-dir is required");
        assert_eq!(cli.args.heartbeat, fencer_coordinator::DEFAULT_HEARTBEAT);
        assert_eq!(cli.args.election_timeout, fencer_coordinator::DEFAULT_ELECTION_TIMEOUT);
        assert_eq!(cli.args.replication_interval, fencer_coordinator::DEFAULT_REPLICATION_INTERVAL);
        assert_eq!(cli.args.log_commit_gap, None, "follows the voters");
        assert_eq!(cli.args.snapshot_every, fencer_coordinator::DEFAULT_SNAPSHOT_EVERY);
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(cli.args.worker_threads(), (cpus / 2).max(1), "half the CPUs by default");
        let cli = Cli::try_parse_from(["fencer", "--data-dir", "d", "--worker-threads", "3"]).unwrap();
        assert_eq!(cli.args.worker_threads(), 3);
        assert!(Cli::try_parse_from(["fencer", "--data-dir", "d", "--worker-threads", "0"]).is_err());
    }

    #[test]
    fn snapshot_catchup_entries_are_bounded_and_default_to_the_library() {
        let parse = |v: &str| Cli::try_parse_from(["fencer", "--data-dir", "d", "--snapshot-catchup-entries", v]);
        assert_eq!(Cli::try_parse_from(["fencer", "--data-dir", "d"]).unwrap().args.snapshot_catchup_entries, None);
        assert_eq!(parse("0").unwrap().args.snapshot_catchup_entries, Some(0));
        assert_eq!(parse("10000000").unwrap().args.snapshot_catchup_entries, Some(10_000_000));
        let e = parse("10000001").err().expect("above the limit").to_string();
        assert!(e.contains("--snapshot-catchup-entries"), "{e}");
        assert!(parse("-1").is_err() && parse("many").is_err());
    }

    #[test]
    fn sizes_take_binary_units_and_a_floor() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64K").unwrap(), 64 << 10);
        assert_eq!(parse_size("64M").unwrap(), 64 << 20);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert!(parse_size("1K").is_err(), "below 4 KiB");
        assert!(parse_size("12T").is_err());
        assert!(parse_size("lots").is_err());
        assert!(parse_size("99999999999999G").is_err());
    }

    #[test]
    fn peers_are_id_equals_address() {
        assert_eq!(parse_peer("2=127.0.0.2:7420").unwrap(), (2, "127.0.0.2:7420".to_string()));
        assert!(parse_peer("127.0.0.2:7420").is_err());
        assert!(parse_peer("0=a:1").is_err());
        assert!(parse_peer("1=nohost").is_err());
    }
}
