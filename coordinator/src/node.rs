//! A coordinator node: its data dir, raft, the stores, the server on its one
//! port, bootstrap (`bootstrap`), and the leader's duties (`leadership`).
//! Every task has an owner and a shutdown path; [`Node::abort`] stops them
//! all at once, as a crash would.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fencer_proto::raft::raft_server::RaftServer;
use fencer_proto::v1::admin_server::AdminServer;
use fencer_proto::v1::lock_server::LockServer;
use openraft::rt::watch::WatchReceiver;
use openraft::{BasicNode, Config, SnapshotPolicy};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tonic::transport::ClientTlsConfig;

use crate::api::{AdminApi, Console, LockApi, router, status_router, with_json_errors};
use crate::audit::{AuditConfig, AuditLog};
use crate::bootstrap::{self, ClusterId, Identity, PristineStep};
use crate::clock::Clock;
use crate::hot::{DEFAULT_HOT_CAPACITY, HOT_HALF_LIFE, HotTracker};
use crate::leadership::{Duties, LeaderEvent, relinquish};
use crate::lease_clock::LeaseClock;
use crate::log_level::LogControlHandle;
use crate::metrics::Metrics;
use crate::network::{Faults, MAX_RAFT_MESSAGE, NetworkFactory, RaftService};
use crate::policy::Policy;
use crate::raft::{RaftHandle, TypeConfig};
use crate::server::{ConnectionLimits, Reserved};
use crate::service::{LockService, QuorumAck, ServiceInner, register_keys};
use crate::signing::NodeKeys;
use crate::snapshot_schedule::SnapshotSchedule;
use crate::state_machine::{AcquireCmd, Applied, Event, Grant, LockState, LogCommand};
use crate::store::{ApplyObserver, LOG_DIR, LogStore, SNAPSHOT_DIR, STATE_FILE, StateMachineStore, WalOptions};
use crate::tenants::{Authenticator, Tenants};
use crate::tls::{NodeTls, ServerTls, peer_client_tls};
use crate::types::NodeId;
use crate::waiters::ParkedCalls;

/// Largest client request accepted on the lock API, in bytes.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;
/// How long one Hello to a peer may take.
const HELLO_TIMEOUT: Duration = Duration::from_millis(1_000);
/// Pause between rounds of Hello while a pristine node looks for its cluster.
const JOIN_RETRY: Duration = Duration::from_millis(200);
/// How long a graceful stop lets in-flight calls finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Everything a node needs to start.
#[derive(Clone)]
pub struct NodeConfig {
    /// This node's id (1 for the embedded default).
    pub node_id: NodeId,
    /// Address to listen on (port 0 picks a free port).
    pub listen: SocketAddr,
    /// Address other nodes and clients use; defaults to the bound address.
    pub advertise: Option<String>,
    /// Where the log, state and snapshots live.
    pub data_dir: PathBuf,
    /// The voters the cluster forms with, this node included (`id → host:port`).
    /// Empty or only this node: a single-node cluster. Used to form the
    /// cluster and to greet peers at start; once formed, membership lives in
    /// the raft log (docs/cluster.md, "Bootstrap").
    pub peers: BTreeMap<NodeId, String>,
    /// Leader heartbeat period.
    pub heartbeat: Duration,
    /// The least time between two append requests to one follower
    /// ([`DEFAULT_REPLICATION_INTERVAL`]); zero sends each as soon as the
    /// previous one is answered.
    pub replication_interval: Duration,
    /// The least time from the start of one durable group commit of the
    /// raft log to the start of the next ([`LogStore::open_with`]); zero
    /// commits each group as soon as the previous one is durable. `None`:
    /// [`default_commit_gap`] of the cluster's voters, followed as they
    /// change.
    pub log_commit_gap: Option<Duration>,
    /// Election timeout range (min, max).
    pub election_timeout: (Duration, Duration),
    /// Build a snapshot every this many log entries, each member at its own
    /// phase ([`DEFAULT_SNAPSHOT_EVERY`]).
    pub snapshot_every: u64,
    /// Entries kept in the log behind each snapshot for followers that lag;
    /// one further behind is sent the snapshot instead. `None`: the smaller
    /// of [`DEFAULT_SNAPSHOT_CATCHUP_ENTRIES`] and `snapshot_every`.
    pub snapshot_catchup_entries: Option<u64>,
    /// Request bounds; `None` derives them from the election timeout.
    pub policy: Option<Policy>,
    /// Fault injection for the raft transport (tests).
    pub faults: Option<Arc<dyn Faults>>,
    /// A second address serving only `/metrics`, `/livez`, `/readyz`,
    /// `/v1/status` and the operator endpoints (hot resources, log level),
    /// for scrapers and probes that should not reach the lock API. They are
    /// served on `listen` too.
    pub status_listen: Option<SocketAddr>,
    /// The audit log; `None` writes none (embedded tests). Default: on, in
    /// `DATA_DIR/audit`.
    pub audit: Option<AuditConfig>,
    /// Resources tracked by the hot-resources endpoint (module `hot`).
    pub hot_capacity: usize,
    /// Run-time log filter changes (`/v1/admin/log-level`), when the
    /// process owns a reloadable subscriber.
    pub log_control: Option<LogControlHandle>,
    /// TLS on `listen` (the lock API and raft traffic); `None`: plaintext.
    /// The status port stays plaintext (docs/security.md).
    pub tls: Option<NodeTls>,
    /// Tenants (identities, permissions, limits); `None`: every caller may
    /// do everything (the insecure default).
    pub tenants: Option<Arc<Tenants>>,
    /// The bounds of every connection to the node's ports (first byte,
    /// head, body, number); defaults in [`ConnectionLimits::default`].
    pub connections: ConnectionLimits,
}

/// Default leader heartbeat period (`--heartbeat`).
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_millis(50);

/// Default shortest election timeout (`--election-timeout`); the longest is
/// twice it and is also the quorum lease. A dead leader is replaced after
/// about 3–4 × this (the followers' view of its lease, 2 ×, then their own
/// election timeout: 0.45–0.6 s); a leader that hears no majority for 2 ×
/// this stops granting (I5); the shortest ttl is 1.5 × 2 × this, 450 ms,
/// raised to the policy's floor of 500 ms (docs/cluster.md, "Timing": what
/// this costs on a loaded machine).
pub const DEFAULT_ELECTION_TIMEOUT: Duration = Duration::from_millis(150);

/// Default least time between two append requests to one follower
/// (`--replication-interval`): under load, the entries proposed meanwhile
/// travel in one request, one follower `fdatasync` and one apply batch,
/// instead of a round every ~1 ms carrying a few each; a write after a
/// quiet spell is never held. At the seed workload it cut the followers'
/// CPU per operation by half for ~3 ms more median latency (issue 18;
/// docs/performance.md, "Replication pacing").
pub const DEFAULT_REPLICATION_INTERVAL: Duration = Duration::from_millis(4);

/// The commit gap of a node that is its cluster's only voter, unless
/// `--log-commit-gap` is given: there the log's own sync is the whole
/// commit, and the replication interval (4 ms) as its gap put a single
/// node's median acquire at 5.7 ms against 1.5 ms with this (seed load,
/// docs/performance.md "The commit gap of a single node").
pub const SINGLE_VOTER_COMMIT_GAP: Duration = Duration::from_millis(1);

/// The default least time between two durable group commits of a node's
/// raft log: with other voters, `replication_interval`, so that neither the
/// leader's own sync nor a follower's round holds a commit longer than the
/// other; as the only voter, [`SINGLE_VOTER_COMMIT_GAP`] (at most
/// `replication_interval`), since no follower's round paces its commits.
pub fn default_commit_gap(voters: usize, replication_interval: Duration) -> Duration {
    if voters > 1 { replication_interval } else { SINGLE_VOTER_COMMIT_GAP.min(replication_interval) }
}

/// Default snapshot period in log entries (`--snapshot-every`), etcd's
/// default too. Against 50,000 at the seed workload: half the builds, 2–4 µs
/// less CPU per operation on every node and a lower tail, for a restart
/// that replays up to ~125,000 entries (~0.7 s) and a log on disk about
/// twice as long (issue 18; docs/performance.md, "The snapshot period").
pub const DEFAULT_SNAPSHOT_EVERY: u64 = 100_000;

/// Entries kept behind a snapshot for lagging followers
/// (`--snapshot-catchup-entries`), at most `--snapshot-every`: a follower is
/// sent the snapshot (~30 MB at the seed state) only once it is further
/// behind the newest snapshot than this (~2.5 s of log at the seed rate).
pub const DEFAULT_SNAPSHOT_CATCHUP_ENTRIES: u64 = 10_000;

impl NodeConfig {
    /// A single-node configuration with production timings.
    pub fn single(data_dir: impl Into<PathBuf>, listen: SocketAddr) -> Self {
        Self {
            node_id: 1,
            listen,
            advertise: None,
            data_dir: data_dir.into(),
            peers: BTreeMap::new(),
            heartbeat: DEFAULT_HEARTBEAT,
            replication_interval: DEFAULT_REPLICATION_INTERVAL,
            log_commit_gap: None,
            election_timeout: (DEFAULT_ELECTION_TIMEOUT, DEFAULT_ELECTION_TIMEOUT * 2),
            snapshot_every: DEFAULT_SNAPSHOT_EVERY,
            snapshot_catchup_entries: None,
            policy: None,
            faults: None,
            status_listen: None,
            audit: Some(AuditConfig::default()),
            hot_capacity: DEFAULT_HOT_CAPACITY,
            log_control: None,
            tls: None,
            tenants: None,
            connections: ConnectionLimits::default(),
        }
    }

    /// The request policy in force.
    pub fn policy(&self) -> Policy {
        self.policy.clone().unwrap_or_else(|| Policy::for_election_timeout(self.election_timeout.1))
    }
}

/// Why a node could not start. Each variant names what to fix.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The data dir cannot be created or read.
    #[error("data dir {path}: {source}")]
    DataDir {
        /// The dir.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The data dir belongs to another node or cluster.
    #[error(
        "data dir {path} belongs to node {found_node} of cluster {found_cluster}; refusing to start as node {wanted_node}"
    )]
    WrongIdentity {
        /// The dir.
        path: PathBuf,
        /// Node id found there.
        found_node: NodeId,
        /// Cluster id found there.
        found_cluster: String,
        /// Node id asked for.
        wanted_node: NodeId,
    },
    /// The data dir belongs to another cluster than the peers it was started with.
    #[error(
        "data dir {path} belongs to cluster {ours}, but its peers belong to another cluster ({}); \
         refusing to start. Start this node with its own data dir, or with --peers of its own cluster",
        evidence.join("; ")
    )]
    ForeignCluster {
        /// The dir.
        path: PathBuf,
        /// The cluster id in the dir.
        ours: String,
        /// What the peers answered.
        evidence: Vec<String>,
    },
    /// The data dir holds raft data (log entries, a vote) but no identity file.
    #[error("data dir {0} holds raft data but no identity.json; it was not created by fencer or is damaged")]
    MissingIdentity(PathBuf),
    /// The audit dir holds lines but the data dir is new: they belong to
    /// another life of this node or to another cluster, whose log indexes
    /// would be mistaken for this one's.
    #[error(
        "audit dir {path} holds lines up to log index {last_index}, but data dir {data_dir} is new; \
         move those files away or choose another --audit-dir (one audit dir never mixes two logs)"
    )]
    ForeignAudit {
        /// The audit dir.
        path: PathBuf,
        /// The data dir.
        data_dir: PathBuf,
        /// The last log index found in the audit dir.
        last_index: u64,
    },
    /// The configuration is inconsistent.
    #[error("configuration: {0}")]
    Config(String),
    /// The listen address cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
    /// The stores cannot be opened.
    #[error("storage: {0}")]
    Storage(std::io::Error),
    /// Raft refused to start.
    #[error("raft: {0}")]
    Raft(String),
    /// The TLS certificates, keys or CAs cannot be used.
    #[error("TLS: {0}")]
    Tls(String),
    /// The node's token-signing keys (`DATA_DIR/signing`) cannot be used.
    #[error("{0}")]
    SigningKeys(#[from] crate::signing::SigningKeyError),
}

/// Connects applied entries to the lease clock, parked calls, metrics and
/// the hot-resources tracker.
struct NodeObserver {
    leases: Arc<LeaseClock>,
    parked: Arc<ParkedCalls>,
    metrics: Arc<Metrics>,
    hot: Arc<HotTracker>,
    keys: Arc<NodeKeys>,
    clock: Clock,
}

impl ApplyObserver for NodeObserver {
    fn on_applied(&self, index: u64, entry: &LogCommand, applied: &Applied) {
        if let Some(AcquireCmd { resource, .. }) = entry.cmd.acquire()
            && !applied.events.iter().any(|e| matches!(e, Event::DedupHit { .. }))
        {
            self.hot.acquired(resource, self.clock.now());
        }
        for e in &applied.events {
            match e {
                Event::LeaseStarted { resource, lease_id, token, ttl_ms, request_id, waited, .. } => {
                    self.leases.started(resource, *lease_id, *ttl_ms, index);
                    if *waited {
                        let grant = Grant {
                            resource: resource.clone(),
                            lease_id: *lease_id,
                            token: *token,
                            ttl_ms: *ttl_ms,
                            waited: true,
                        };
                        self.parked.promoted(request_id, grant);
                    }
                }
                Event::LeaseRenewed { resource, lease_id, ttl_ms, index, .. } => {
                    self.leases.started(resource, *lease_id, *ttl_ms, *index);
                }
                Event::LeaseEnded { resource, lease_id, reason, granted_at_ms, .. } => {
                    self.leases.ended(lease_id);
                    let held = Duration::from_millis(entry.at_ms.saturating_sub(*granted_at_ms));
                    self.hot.lease_ended(resource, held, self.clock.now());
                    if *reason == crate::state_machine::EndReason::Expired {
                        self.metrics.expirations.inc();
                    }
                }
                Event::WaiterCancelled { request_id, .. } => self.parked.cancelled(request_id),
                Event::WaiterQueued { .. } => {}
                Event::SigningKeyRegistered { .. } | Event::SigningKeyRetired { .. } => self.keys.notify(),
                Event::DedupHit { .. } => {
                    self.metrics.dedup_hits.inc();
                }
            }
        }
    }

    fn on_state_replaced(&self, state: &LockState) {
        self.leases.reset_from(state, Duration::ZERO);
        self.keys.notify();
    }
}

/// A running coordinator node.
pub struct Node {
    raft: RaftHandle,
    svc: LockService,
    metrics: Arc<Metrics>,
    sm: StateMachineStore,
    log: LogStore,
    local_addr: SocketAddr,
    status_addr: Option<SocketAddr>,
    audit_dir: Option<PathBuf>,
    cluster: Arc<ClusterId>,
    data_dir: PathBuf,
    shutdown_tx: watch::Sender<bool>,
    server: JoinHandle<()>,
    status_server: Option<JoinHandle<()>>,
    tasks: Vec<JoinHandle<()>>,
    _leader_watch: openraft::raft::WatchChangeHandle<TypeConfig>,
}

fn data_dir_error(path: &Path) -> impl FnOnce(std::io::Error) -> StartError + '_ {
    move |source| StartError::DataDir { path: path.to_path_buf(), source }
}

/// Runs a blocking file operation off the async workers.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> std::io::Result<T> + Send + 'static) -> std::io::Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(std::io::Error::other)?
}

impl Node {
    /// Opens the data dir, starts raft, serves on `config.listen` and joins
    /// or forms the cluster (module `bootstrap`).
    pub async fn start(config: NodeConfig) -> Result<Node, StartError> {
        let dir = config.data_dir.clone();
        std::fs::create_dir_all(&dir).map_err(data_dir_error(&dir))?;
        if !config.peers.is_empty() && !config.peers.contains_key(&config.node_id) {
            return Err(StartError::Config(format!("--peers does not list this node's id {}", config.node_id)));
        }
        let single = config.peers.keys().all(|id| *id == config.node_id);
        let identity = {
            let d = dir.clone();
            blocking(move || bootstrap::read_identity(&d)).await.map_err(data_dir_error(&dir))?
        };
        let identity = match identity {
            Some(id) if id.node_id != config.node_id => {
                return Err(StartError::WrongIdentity {
                    path: dir,
                    found_node: id.node_id,
                    found_cluster: id.cluster_id,
                    wanted_node: config.node_id,
                });
            }
            other => other,
        };
        // A pristine node creates its files before it knows its cluster; a
        // log with entries or votes but no identity is another matter.
        if identity.is_none() {
            let log_file = dir.join(LOG_DIR);
            if blocking(move || LogStore::holds_raft_data(&log_file)).await.map_err(StartError::Storage)? {
                return Err(StartError::MissingIdentity(dir));
            }
        }
        let server_tls =
            config.tls.as_ref().map(ServerTls::new).transpose().map_err(|e| StartError::Tls(e.to_string()))?;
        let peer_tls =
            config.tls.as_ref().map(peer_client_tls).transpose().map_err(|e| StartError::Tls(e.to_string()))?.flatten();
        if config.tls.is_some() && peer_tls.is_none() && !single {
            return Err(StartError::Config(
                "TLS for a cluster of several nodes needs --peer-ca: the CA the nodes' certificates chain to".into(),
            ));
        }
        // Rule 2: greet the peers before listening or touching the stores;
        // refuse a foreign data dir.
        if let Some(id) = &identity
            && !single
        {
            let answers =
                bootstrap::greet_peers(&config.peers, config.node_id, &id.cluster_id, HELLO_TIMEOUT, peer_tls.as_ref())
                    .await;
            if let Some(evidence) = bootstrap::foreign_evidence(&id.cluster_id, &answers, &config.peers) {
                return Err(StartError::ForeignCluster { path: dir, ours: id.cluster_id.clone(), evidence });
            }
        }
        // Bound now, listened on only once the node serves (`Reserved`).
        // Two ports that would clash only when they listen clash now.
        if let Some(status) = config.status_listen
            && status.port() != 0
            && status.port() == config.listen.port()
            && (status.ip() == config.listen.ip()
                || status.ip().is_unspecified()
                || config.listen.ip().is_unspecified())
        {
            return Err(StartError::Config(format!(
                "--status-listen {status} and --listen {} are the same port",
                config.listen
            )));
        }
        let listener =
            Reserved::bind(config.listen).map_err(|source| StartError::Bind { addr: config.listen, source })?;
        let local_addr = listener.local_addr();
        let status_listener = match config.status_listen {
            Some(addr) => Some(Reserved::bind(addr).map_err(|source| StartError::Bind { addr, source })?),
            None => None,
        };
        let status_addr = status_listener.as_ref().map(Reserved::local_addr);
        let advertise = config.advertise.clone().unwrap_or_else(|| local_addr.to_string());
        let mut peers = config.peers.clone();
        peers.entry(config.node_id).or_insert(advertise);
        let metrics = Metrics::new();
        let policy = config.policy();
        metrics.waiters_limit.set(i64::try_from(policy.max_waiters_total).unwrap_or(i64::MAX));
        metrics.waiters_per_resource_limit.set(i64::from(policy.max_waiters_per_resource));
        metrics.election_timeout.set(config.election_timeout.1.as_secs_f64());
        let clock = Clock;
        let leases = Arc::new(LeaseClock::new(clock));
        let parked = Arc::new(ParkedCalls::new(clock));
        let hot = Arc::new(HotTracker::new(config.hot_capacity, HOT_HALF_LIFE));
        let keys = {
            let (d, id, now) = (dir.clone(), config.node_id, clock.wall_ms());
            let opened = tokio::task::spawn_blocking(move || NodeKeys::open(&d, id, now))
                .await
                .map_err(|e| StartError::Storage(std::io::Error::other(e)))?;
            Arc::new(opened?)
        };
        let observer = Arc::new(NodeObserver {
            leases: leases.clone(),
            parked: parked.clone(),
            metrics: metrics.clone(),
            hot: hot.clone(),
            keys: keys.clone(),
            clock,
        });
        let audit_dir = config.audit.as_ref().map(|a| a.dir_for(&dir));
        let audit = match (&config.audit, &audit_dir) {
            (Some(audit), Some(audit_dir)) => {
                let (a, d, m) = (audit.clone(), audit_dir.clone(), metrics.clone());
                let log = blocking(move || AuditLog::open(&d, &a, m)).await.map_err(StartError::Storage)?;
                // Skipping "already written" lines is right for a log
                // re-applied on its own data dir, never for a new one.
                if let (None, Some((last_index, _))) = (&identity, log.last_position()) {
                    return Err(StartError::ForeignAudit { path: audit_dir.clone(), data_dir: dir, last_index });
                }
                Some(log)
            }
            _ => None,
        };
        let (log, sm) = {
            // Until the membership is known (the metrics watcher follows it
            // from then on when no gap is configured): as in a cluster.
            let commit_gap = config.log_commit_gap.unwrap_or(config.replication_interval);
            let (dir, metrics) = (dir.clone(), metrics.clone());
            blocking(move || -> std::io::Result<(LogStore, StateMachineStore)> {
                let log = LogStore::open_with(&dir.join(LOG_DIR), metrics.clone(), WalOptions::default(), commit_gap)?;
                let sm = StateMachineStore::open(
                    &dir.join(STATE_FILE),
                    &dir.join(SNAPSHOT_DIR),
                    observer,
                    metrics,
                    clock,
                    audit,
                )?;
                Ok((log, sm))
            })
            .await
            .map_err(StartError::Storage)?
        };
        let identity = match identity {
            Some(id) => Some(id),
            // Rule 3: a pristine single node founds its own cluster.
            None if single => {
                let cluster_id = bootstrap::new_cluster_id().map_err(|e| StartError::Config(e.to_string()))?;
                let id = Identity { cluster_id, node_id: config.node_id, founder: true };
                let (d, i) = (dir.clone(), id.clone());
                blocking(move || bootstrap::write_identity(&d, &i)).await.map_err(data_dir_error(&dir))?;
                Some(id)
            }
            None => None,
        };
        let cluster = Arc::new(ClusterId::new(identity.as_ref().map(|i| i.cluster_id.clone())));
        let raft_config = Config {
            cluster_name: "fencer".into(),
            heartbeat_interval: config.heartbeat.as_millis() as u64,
            election_timeout_min: config.election_timeout.0.as_millis() as u64,
            election_timeout_max: config.election_timeout.1.as_millis() as u64,
            install_snapshot_timeout: 10_000,
            // Built at a phase of its own per node (`watch_metrics`), not
            // by openraft's policy, which would build on every node at once.
            snapshot_policy: SnapshotPolicy::Never,
            max_in_snapshot_log_to_keep: config
                .snapshot_catchup_entries
                .unwrap_or(DEFAULT_SNAPSHOT_CATCHUP_ENTRIES.min(config.snapshot_every)),
            purge_batch_size: (config.snapshot_every / 4).clamp(1, 1024),
            max_payload_entries: 1024,
            // Pre-Vote (issue 17): a follower campaigns only once the other
            // voters would elect it, so a candidate with a shorter log no
            // longer spends a term that the better one then collides with
            // (an extra election timeout on the failover), and a follower
            // starved of CPU cannot depose a healthy leader. With it a
            // follower cut off from everyone keeps its old leader in raft's
            // metrics; its readiness counts from its last leader contact
            // (`ServiceInner::leader_contact`). Nodes of a build without it
            // serve the PreVote RPC too.
            enable_pre_vote: Some(true),
            ..Default::default()
        }
        .validate()
        .map_err(|e| StartError::Config(e.to_string()))?;
        let network = NetworkFactory::new(
            config.node_id,
            cluster.clone(),
            config.faults.clone(),
            peer_tls.clone(),
            config.replication_interval,
        );
        let raft = openraft::Raft::new(config.node_id, Arc::new(raft_config), network, log.clone(), sm.clone())
            .await
            .map_err(|e| StartError::Raft(e.to_string()))?;

        let (leader_tx, leader_rx) = watch::channel(None);
        let (acked_tx, acked_rx) = watch::channel(QuorumAck::NotLeader(0));
        let svc = LockService::new(ServiceInner {
            raft: raft.clone(),
            sm: sm.clone(),
            leases: leases.clone(),
            parked: parked.clone(),
            policy: policy.clone(),
            metrics: metrics.clone(),
            clock,
            cluster: cluster.clone(),
            election_timeout: config.election_timeout.1,
            stopping: std::sync::atomic::AtomicBool::new(false),
            hot,
            log_control: config.log_control.clone(),
            keys,
            peer_tls: peer_tls.clone(),
            leader: leader_rx,
            quorum_ack: acked_rx,
            leadership_lost: watch::Sender::new(0),
            writes_in_flight: std::sync::atomic::AtomicUsize::new(0),
            leader_contact: crate::clock::LastSeen::never(),
        });

        let (shutdown_tx, shutdown_rx) = watch::channel(false);

        // A client CA without tenants means mTLS: a verified client
        // certificate is the whole authorisation (the single implicit tenant).
        let mtls_only = config.tenants.is_none() && config.tls.as_ref().is_some_and(|t| t.client_ca_file.is_some());
        let auth = Authenticator::new(config.tenants.clone(), mtls_only);
        // Serve before bootstrap so peers can greet us and clients reach us at once.
        let mut grpc = tonic::service::Routes::builder();
        grpc.add_service(
            LockServer::new(LockApi { svc: svc.clone(), metrics: metrics.clone(), auth: auth.clone() })
                .max_decoding_message_size(MAX_REQUEST_BYTES),
        )
        .add_service(
            AdminServer::new(AdminApi { svc: svc.clone(), metrics: metrics.clone(), auth: auth.clone() })
                .max_decoding_message_size(MAX_REQUEST_BYTES),
        )
        .add_service(
            RaftServer::new(RaftService::new(
                raft.clone(),
                config.node_id,
                cluster.clone(),
                server_tls.is_some(),
                svc.clone(),
                dir.join(SNAPSHOT_DIR),
            ))
            .max_decoding_message_size(MAX_RAFT_MESSAGE)
            .max_encoding_message_size(MAX_RAFT_MESSAGE),
        );
        let console = Console::new(svc.clone(), metrics.clone(), auth.clone(), audit_dir.clone())
            .map_err(|e| StartError::Config(format!("the console's page token: {e}")))?;
        let app = with_json_errors(
            grpc.routes()
                .into_axum_router()
                .merge(router(svc.clone(), metrics.clone(), auth.clone()))
                .merge(console.router(true)),
        )
        .layer(axum::extract::DefaultBodyLimit::max(MAX_REQUEST_BYTES));
        let (limits, refused) = (config.connections.clone(), metrics.connections_refused.clone());
        let listen = |port: Reserved| {
            let addr = port.local_addr();
            port.listen().map_err(|source| StartError::Bind { addr, source })
        };
        let listener = listen(listener)?;
        let status_listener = status_listener.map(listen).transpose()?;
        let server = tokio::spawn(crate::server::serve(
            listener,
            app,
            server_tls,
            limits.clone(),
            refused.clone(),
            shutdown_rx.clone(),
            SHUTDOWN_GRACE,
        ));
        let status_server = status_listener.map(|l| {
            let app = with_json_errors(
                status_router(svc.clone(), metrics.clone(), auth.clone()).merge(console.router(false)),
            )
            .layer(axum::extract::DefaultBodyLimit::max(MAX_REQUEST_BYTES));
            tokio::spawn(crate::server::serve(l, app, None, limits, refused, shutdown_rx.clone(), SHUTDOWN_GRACE))
        });

        let mut tasks = Vec::new();
        let initialized = raft.is_initialized().await.map_err(|e| StartError::Raft(e.to_string()))?;
        let members: BTreeMap<NodeId, BasicNode> =
            peers.iter().map(|(id, addr)| (*id, BasicNode { addr: addr.clone() })).collect();
        match &identity {
            Some(id) => {
                // Rules 3 and 5; rule 6: an initialised node never initialises again.
                if !initialized && (single || id.founder) {
                    tracing::info!(node = config.node_id, members = ?peers, cluster = %id.cluster_id, "initialising the cluster");
                    if let Err(e) = raft.initialize(members).await {
                        tracing::warn!(error = %e, "initialise refused");
                    }
                } else if !initialized {
                    tracing::info!(cluster = %id.cluster_id, "joined the cluster; waiting for its leader to replicate");
                }
            }
            // Rule 4: look for the cluster (or found it) in the background.
            None => tasks.push(tokio::spawn(join_cluster(
                JoinCtx {
                    raft: raft.clone(),
                    dir: dir.clone(),
                    me: config.node_id,
                    peers: peers.clone(),
                    cluster: cluster.clone(),
                    tls: peer_tls.clone(),
                },
                shutdown_rx.clone(),
            ))),
        }

        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let leader_watch = {
            let (start_tx, stop_tx) = (events_tx.clone(), events_tx);
            let (leases, parked, svc) = (leases.clone(), parked.clone(), svc.clone());
            raft.on_leader_change(
                move |leader_id| {
                    let _ = start_tx.send(LeaderEvent::Started(leader_id));
                    async {}
                },
                move |leader_id| {
                    tracing::debug!(%leader_id, "leadership ended");
                    // Parked calls must not wait for the duty loop.
                    relinquish(&leases, &parked, &svc.inner.leadership_lost);
                    let _ = stop_tx.send(LeaderEvent::Stopped);
                    async {}
                },
            )
        };
        let duties = Duties { svc: svc.clone(), leases, parked, election_timeout: config.election_timeout.1 };
        tasks.push(tokio::spawn(duties.run(events_rx, shutdown_rx.clone())));
        tasks.push(tokio::spawn(watch_metrics(
            raft.clone(),
            metrics.clone(),
            SnapshotSchedule::new(config.snapshot_every, config.node_id),
            config
                .log_commit_gap
                .is_none()
                .then(|| CommitGapByVoters { log: log.clone(), replication_interval: config.replication_interval }),
            leader_tx,
            acked_tx,
            shutdown_rx.clone(),
        )));
        tasks.push(tokio::spawn(register_keys(svc.clone(), shutdown_rx.clone())));
        tasks.push(tokio::spawn(console.sample(shutdown_rx.clone())));

        tracing::info!(
            node = config.node_id,
            addr = %local_addr,
            status_addr = status_addr.map(|a| a.to_string()),
            cluster = %cluster.to_text(),
            data_dir = %dir.display(),
            audit_dir = audit_dir.as_ref().map(|d| d.display().to_string()),
            "coordinator node started"
        );
        Ok(Node {
            raft,
            svc,
            metrics,
            sm,
            log,
            local_addr,
            status_addr,
            audit_dir,
            cluster,
            data_dir: dir,
            shutdown_tx,
            server,
            status_server,
            tasks,
            _leader_watch: leader_watch,
        })
    }

    /// The address the node serves on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The address of the status port, when `status_listen` was given.
    pub fn status_addr(&self) -> Option<SocketAddr> {
        self.status_addr
    }

    /// Where this node writes its audit log, when it writes one.
    pub fn audit_dir(&self) -> Option<&Path> {
        self.audit_dir.as_deref()
    }

    /// The lock operations of this node.
    pub fn service(&self) -> &LockService {
        &self.svc
    }

    /// The raft handle.
    pub fn raft(&self) -> &RaftHandle {
        &self.raft
    }

    /// The raft log's commit gap now in force: `--log-commit-gap`, or
    /// [`default_commit_gap`] of the cluster's voters.
    pub fn log_commit_gap(&self) -> Duration {
        self.log.commit_gap()
    }

    /// The node's metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The cluster id; empty while a pristine node is still looking for its cluster.
    pub fn cluster_id(&self) -> String {
        self.cluster.to_text()
    }

    /// The data dir.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The applied lock state of this node (any role; for diagnostics and
    /// tests that compare replicas). Hold the guard briefly: apply waits on it.
    pub fn state(&self) -> std::sync::RwLockReadGuard<'_, LockState> {
        self.sm.read()
    }

    /// Index of the last entry applied on this node.
    pub fn applied_index(&self) -> Option<u64> {
        self.sm.applied_index()
    }

    /// Waits until some node is known as leader.
    pub async fn wait_for_leader(&self, timeout: Duration) -> Result<NodeId, String> {
        let m = self
            .raft
            .wait(Some(timeout))
            .metrics(|m| m.current_leader.is_some(), "a leader is known")
            .await
            .map_err(|e| e.to_string())?;
        m.current_leader.ok_or_else(|| "no leader".to_string())
    }

    /// Stops serving, stops raft and makes the state durable. In-flight
    /// requests get a short while to finish.
    pub async fn shutdown(self) {
        self.svc.begin_stop();
        let _ = self.shutdown_tx.send(true);
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!(error = %e, "raft shutdown");
        }
        let _ = tokio::time::timeout(SHUTDOWN_GRACE + Duration::from_secs(1), self.server).await;
        if let Some(s) = self.status_server {
            let _ = tokio::time::timeout(SHUTDOWN_GRACE + Duration::from_secs(1), s).await;
        }
        for t in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
        if let Err(e) = self.log.sync().await {
            tracing::warn!(error = %e, "log sync at shutdown");
        }
        if let Err(e) = self.sm.sync().await {
            tracing::warn!(error = %e, "state sync at shutdown");
        }
        let closed = [self.log.closed(), self.sm.closed()];
        drop((self.raft, self.svc, self.sm, self.log, self._leader_watch));
        wait_closed(closed).await;
        tracing::info!("coordinator node stopped");
    }

    /// Stops at once, as a crash would: every connection is dropped mid-call,
    /// background tasks are aborted, and nothing is flushed beyond what the
    /// stores already made durable. For fault-injection tests; a process
    /// exits the same way on kill -9.
    pub async fn abort(self) {
        self.svc.begin_stop();
        self.server.abort();
        if let Some(s) = &self.status_server {
            s.abort();
        }
        for t in &self.tasks {
            t.abort();
        }
        let _ = self.shutdown_tx.send(true);
        let _ = self.raft.shutdown().await;
        let _ = self.server.await;
        if let Some(s) = self.status_server {
            let _ = s.await;
        }
        for t in self.tasks {
            let _ = t.await;
        }
        let closed = [self.log.closed(), self.sm.closed()];
        drop((self.raft, self.svc, self.sm, self.log, self._leader_watch));
        wait_closed(closed).await;
        tracing::info!("coordinator node aborted");
    }
}

/// Waits (at most 5 s) until the log and state files are closed, so the data
/// dir can be opened again as soon as a stopped node's `shutdown` returns.
async fn wait_closed(closed: [watch::Receiver<()>; 2]) {
    for mut c in closed {
        let wait = async move { while c.changed().await.is_ok() {} };
        if tokio::time::timeout(Duration::from_secs(5), wait).await.is_err() {
            tracing::warn!("a store file is still open 5 s after stopping; something still holds a handle");
        }
    }
}

struct JoinCtx {
    raft: RaftHandle,
    dir: PathBuf,
    me: NodeId,
    peers: BTreeMap<NodeId, String>,
    cluster: Arc<ClusterId>,
    tls: Option<ClientTlsConfig>,
}

/// Rule 4 of `bootstrap`: greet the peers until one names the cluster (adopt
/// it) or, as the founder, until a majority answered pristine (found it).
async fn join_cluster(ctx: JoinCtx, mut shutdown: watch::Receiver<bool>) {
    let mut rounds = 0u64;
    loop {
        let answers = bootstrap::greet_peers(&ctx.peers, ctx.me, "", HELLO_TIMEOUT, ctx.tls.as_ref()).await;
        let step = bootstrap::pristine_step(ctx.me, &ctx.peers, &answers);
        let identity = match &step {
            PristineStep::Adopt { cluster_id, via } => {
                tracing::info!(cluster = %cluster_id, via, "adopting the cluster of a peer");
                Some(Identity { cluster_id: cluster_id.clone(), node_id: ctx.me, founder: false })
            }
            PristineStep::Found => match bootstrap::new_cluster_id() {
                Ok(cluster_id) => {
                    tracing::info!(cluster = %cluster_id, members = ?ctx.peers, "founding a new cluster");
                    Some(Identity { cluster_id, node_id: ctx.me, founder: true })
                }
                Err(e) => {
                    tracing::error!(error = %e, "no randomness for a cluster id");
                    None
                }
            },
            PristineStep::Wait { why } => {
                if rounds.is_multiple_of(25) {
                    tracing::info!(%why, "looking for the cluster");
                }
                None
            }
        };
        if let Some(id) = identity {
            let (dir, i) = (ctx.dir.clone(), id.clone());
            match blocking(move || bootstrap::write_identity(&dir, &i)).await {
                Err(e) => tracing::error!(error = %e, "cannot write identity.json; will retry"),
                Ok(()) => {
                    ctx.cluster.set(&id.cluster_id);
                    if id.founder {
                        let members: BTreeMap<NodeId, BasicNode> =
                            ctx.peers.iter().map(|(id, addr)| (*id, BasicNode { addr: addr.clone() })).collect();
                        if let Err(e) = ctx.raft.initialize(members).await {
                            tracing::warn!(error = %e, "initialise refused");
                        }
                    }
                    return;
                }
            }
        }
        rounds += 1;
        tokio::select! {
            _ = shutdown.changed() => return,
            () = tokio::time::sleep(JOIN_RETRY) => {}
        }
    }
}

/// Keeps the raft log's commit gap at [`default_commit_gap`] of the
/// cluster's voters, when `--log-commit-gap` is not given.
struct CommitGapByVoters {
    log: LogStore,
    replication_interval: Duration,
}

impl CommitGapByVoters {
    /// Sets the gap for `voters`, logging a change. No voters: the
    /// membership is not known yet (a node starting, or a pristine one
    /// looking for its cluster); the gap stays as it is.
    fn follow(&self, voters: usize) {
        if voters == 0 {
            return;
        }
        let gap = default_commit_gap(voters, self.replication_interval);
        if self.log.commit_gap() != gap {
            tracing::info!(voters, gap = ?gap, "raft log commit gap set for the cluster's voters");
            self.log.set_commit_gap(gap);
        }
    }
}

/// Mirrors raft metrics into Prometheus gauges, counts leader changes and
/// publishes the known leader (what held calls wait on, module `service`)
/// and whether this node leads with a quorum acknowledgement in its term
/// (what the calls a just-elected leader refused wait on).
async fn watch_metrics(
    raft: RaftHandle,
    metrics: Arc<Metrics>,
    mut snapshots: SnapshotSchedule,
    commit_gap: Option<CommitGapByVoters>,
    leader: watch::Sender<Option<NodeId>>,
    quorum_ack: watch::Sender<QuorumAck>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut rx = raft.metrics();
    let mut last_leader = None;
    loop {
        {
            let m = rx.borrow_and_update().clone();
            metrics.term.set(m.current_term as i64);
            metrics.is_leader.set(i64::from(m.state == openraft::ServerState::Leader));
            metrics.commit_index.set(m.local_committed.as_ref().map_or(0, |l| l.index) as i64);
            if m.current_leader != last_leader {
                if last_leader.is_some() || m.current_leader.is_some() {
                    metrics.leader_changes.inc();
                }
                last_leader = m.current_leader;
                leader.send_replace(m.current_leader);
            }
            let term = m.current_term;
            let ack = match (m.state == openraft::ServerState::Leader, m.last_quorum_acked.is_some()) {
                (false, _) => QuorumAck::NotLeader(term),
                (true, false) => QuorumAck::Waiting(term),
                (true, true) => QuorumAck::Acked(term),
            };
            quorum_ack.send_if_modified(|a| std::mem::replace(a, ack) != ack);
            let applied = m.last_applied.as_ref().map_or(0, |l| l.index);
            let snapshot = m.snapshot.as_ref().map_or(0, |l| l.index);
            if let Some(gap) = &commit_gap {
                gap.follow(m.membership_config.membership().voter_ids().count());
            }
            let members = m.membership_config.nodes().map(|(id, _)| *id);
            if snapshots.due(applied, snapshot, members, crate::clock::Instant::now()) {
                tracing::debug!(applied, snapshot, "snapshot due");
                // Refused only once raft has stopped; the metrics channel
                // then closes and ends this loop.
                if let Err(error) = raft.trigger().snapshot().await {
                    tracing::debug!(%error, "snapshot request refused");
                }
            }
        }
        tokio::select! {
            _ = shutdown.changed() => return,
            r = rx.changed() => if r.is_err() { return },
        }
    }
}
