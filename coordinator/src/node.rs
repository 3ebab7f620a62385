//! A coordinator node: its data dir, raft, the stores, the server on its one
//! port, and the background duties that only the leader performs (expiry,
//! reclaim grace, dedup pruning). Every task has an owner and a shutdown path.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencer_proto::raft::raft_server::RaftServer;
use fencer_proto::v1::admin_server::AdminServer;
use fencer_proto::v1::lock_server::LockServer;
use openraft::rt::watch::WatchReceiver;
use openraft::{BasicNode, Config, ReadPolicy, SnapshotPolicy};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::api::{AdminApi, LockApi, router};
use crate::clock::Clock;
use crate::lease_clock::LeaseClock;
use crate::metrics::Metrics;
use crate::network::{Faults, MAX_RAFT_MESSAGE, NetworkFactory, RaftHandle, RaftService};
use crate::policy::Policy;
use crate::service::{LockService, ServiceInner, write_error};
use crate::state_machine::{Applied, Command, Event, Grant, LockState, LogCommand};
use crate::store::{ApplyObserver, LOG_FILE, LogStore, SNAPSHOT_DIR, STATE_FILE, StateMachineStore};
use crate::types::NodeId;
use crate::waiters::ParkedCalls;

/// Largest client request accepted on the lock API, in bytes.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;
/// How often the leader looks for overdue leases and unclaimed slots.
const DUTY_TICK: Duration = Duration::from_millis(100);
/// How often the leader proposes PruneDedup.
const PRUNE_EVERY: Duration = Duration::from_secs(60);
/// Expire proposals in flight at once.
const MAX_EXPIRE_IN_FLIGHT: usize = 1024;

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
    /// Initial voters, this node included. Empty: a single-node cluster.
    pub peers: BTreeMap<NodeId, String>,
    /// Leader heartbeat period.
    pub heartbeat: Duration,
    /// Election timeout range (min, max).
    pub election_timeout: (Duration, Duration),
    /// Build a snapshot every this many log entries.
    pub snapshot_every: u64,
    /// Request bounds; `None` derives them from the election timeout.
    pub policy: Option<Policy>,
    /// Fault injection for the raft transport (tests).
    pub faults: Option<Arc<dyn Faults>>,
}

impl NodeConfig {
    /// A single-node configuration with production timings.
    pub fn single(data_dir: impl Into<PathBuf>, listen: SocketAddr) -> Self {
        Self {
            node_id: 1,
            listen,
            advertise: None,
            data_dir: data_dir.into(),
            peers: BTreeMap::new(),
            heartbeat: Duration::from_millis(250),
            election_timeout: (Duration::from_millis(1000), Duration::from_millis(2000)),
            snapshot_every: 50_000,
            policy: None,
            faults: None,
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
    /// The data dir holds raft data but no identity file.
    #[error("data dir {0} holds raft data but no identity.json; it was not created by fencer or is damaged")]
    MissingIdentity(PathBuf),
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
}

/// The identity file of a data dir.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
struct Identity {
    cluster_id: String,
    node_id: NodeId,
}

const IDENTITY_FILE: &str = "identity.json";

fn read_identity(dir: &Path) -> Result<Option<Identity>, StartError> {
    let path = dir.join(IDENTITY_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| StartError::DataDir {
            path: path.clone(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(StartError::DataDir { path, source }),
    }
}

fn write_identity(dir: &Path, id: &Identity) -> Result<(), StartError> {
    let path = dir.join(IDENTITY_FILE);
    let tmp = dir.join("identity.json.tmp");
    let err = |source| StartError::DataDir { path: path.clone(), source };
    let bytes = serde_json::to_vec_pretty(id).map_err(|e| err(std::io::Error::other(e)))?;
    std::fs::write(&tmp, bytes).map_err(err)?;
    std::fs::File::open(&tmp).and_then(|f| f.sync_all()).map_err(err)?;
    std::fs::rename(&tmp, &path).map_err(err)?;
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(err)
}

/// Connects applied entries to the lease clock, parked calls and metrics.
struct NodeObserver {
    leases: Arc<LeaseClock>,
    parked: Arc<ParkedCalls>,
    metrics: Arc<Metrics>,
}

impl ApplyObserver for NodeObserver {
    fn on_applied(&self, index: u64, _entry: &LogCommand, applied: &Applied) {
        for e in &applied.events {
            match e {
                Event::LeaseStarted { resource, lease_id, token, ttl_ms, request_id, waited } => {
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
                Event::LeaseRenewed { resource, lease_id, ttl_ms, index } => {
                    self.leases.started(resource, *lease_id, *ttl_ms, *index);
                }
                Event::LeaseEnded { lease_id, reason, .. } => {
                    self.leases.ended(lease_id);
                    if *reason == crate::state_machine::EndReason::Expired {
                        self.metrics.expirations.inc();
                    }
                }
                Event::WaiterCancelled { request_id, .. } => self.parked.cancelled(request_id),
                Event::WaiterQueued { .. } => {}
                Event::DedupHit { .. } => {
                    self.metrics.dedup_hits.inc();
                }
            }
        }
    }

    fn on_state_replaced(&self, state: &LockState) {
        self.leases.reset_from(state, Duration::ZERO);
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
    cluster_id: Arc<str>,
    data_dir: PathBuf,
    shutdown_tx: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    _leader_watch: openraft::raft::WatchChangeHandle<crate::types::TypeConfig>,
}

impl Node {
    /// Opens the data dir, starts raft and serves on `config.listen`.
    pub async fn start(config: NodeConfig) -> Result<Node, StartError> {
        let dir = config.data_dir.clone();
        std::fs::create_dir_all(&dir).map_err(|source| StartError::DataDir { path: dir.clone(), source })?;
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|source| StartError::Bind { addr: config.listen, source })?;
        let local_addr = listener.local_addr().map_err(|source| StartError::Bind { addr: config.listen, source })?;
        let advertise = config.advertise.clone().unwrap_or_else(|| local_addr.to_string());
        let mut peers = config.peers.clone();
        if peers.is_empty() {
            peers.insert(config.node_id, advertise.clone());
        }
        if !peers.contains_key(&config.node_id) {
            return Err(StartError::Config(format!("--peers does not list this node's id {}", config.node_id)));
        }
        let identity = match read_identity(&dir)? {
            Some(id) if id.node_id != config.node_id => {
                return Err(StartError::WrongIdentity {
                    path: dir,
                    found_node: id.node_id,
                    found_cluster: id.cluster_id,
                    wanted_node: config.node_id,
                });
            }
            Some(id) => id,
            None if dir.join(LOG_FILE).exists() => return Err(StartError::MissingIdentity(dir)),
            None => {
                let cluster_id = if peers.len() == 1 {
                    crate::types::LeaseId::random().map_err(|e| StartError::Config(e.to_string()))?.to_string()
                } else {
                    cluster_id_for(&peers)
                };
                let id = Identity { cluster_id, node_id: config.node_id };
                write_identity(&dir, &id)?;
                id
            }
        };
        let cluster_id: Arc<str> = identity.cluster_id.clone().into();
        let metrics = Metrics::new();
        let clock = Clock;
        let leases = Arc::new(LeaseClock::new(clock));
        let parked = Arc::new(ParkedCalls::new(clock));
        let observer =
            Arc::new(NodeObserver { leases: leases.clone(), parked: parked.clone(), metrics: metrics.clone() });
        let (log, sm) = {
            let (dir, metrics) = (dir.clone(), metrics.clone());
            tokio::task::spawn_blocking(move || -> std::io::Result<(LogStore, StateMachineStore)> {
                let log = LogStore::open(&dir.join(LOG_FILE), metrics.clone())?;
                let sm =
                    StateMachineStore::open(&dir.join(STATE_FILE), &dir.join(SNAPSHOT_DIR), observer, metrics, clock)?;
                Ok((log, sm))
            })
            .await
            .map_err(|e| StartError::Storage(std::io::Error::other(e)))?
            .map_err(StartError::Storage)?
        };
        let raft_config = Config {
            cluster_name: "fencer".into(),
            heartbeat_interval: config.heartbeat.as_millis() as u64,
            election_timeout_min: config.election_timeout.0.as_millis() as u64,
            election_timeout_max: config.election_timeout.1.as_millis() as u64,
            install_snapshot_timeout: 10_000,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_every),
            max_in_snapshot_log_to_keep: 10_000.min(config.snapshot_every),
            purge_batch_size: 1024,
            max_payload_entries: 1024,
            ..Default::default()
        }
        .validate()
        .map_err(|e| StartError::Config(e.to_string()))?;
        let network = NetworkFactory::new(config.node_id, cluster_id.clone(), config.faults.clone());
        let raft = openraft::Raft::new(config.node_id, Arc::new(raft_config), network, log.clone(), sm.clone())
            .await
            .map_err(|e| StartError::Raft(e.to_string()))?;

        let policy = config.policy();
        let svc = LockService::new(ServiceInner {
            raft: raft.clone(),
            sm: sm.clone(),
            leases: leases.clone(),
            parked: parked.clone(),
            policy: policy.clone(),
            metrics: metrics.clone(),
            clock,
        });

        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let mut tasks = Vec::new();

        // Serve before initialising so peers and clients can reach us at once.
        let mut grpc = tonic::service::Routes::builder();
        grpc.add_service(
            LockServer::new(LockApi { svc: svc.clone(), metrics: metrics.clone() })
                .max_decoding_message_size(MAX_REQUEST_BYTES),
        )
        .add_service(
            AdminServer::new(AdminApi { svc: svc.clone(), metrics: metrics.clone(), cluster_id: cluster_id.clone() })
                .max_decoding_message_size(MAX_REQUEST_BYTES),
        )
        .add_service(
            RaftServer::new(RaftService::new(raft.clone(), config.node_id, cluster_id.clone()))
                .max_decoding_message_size(MAX_RAFT_MESSAGE)
                .max_encoding_message_size(MAX_RAFT_MESSAGE),
        );
        let app = grpc
            .routes()
            .into_axum_router()
            .merge(router(svc.clone(), metrics.clone(), cluster_id.clone(), config.election_timeout.1))
            .layer(axum::extract::DefaultBodyLimit::max(MAX_REQUEST_BYTES));
        let mut rx = shutdown_rx.clone();
        tasks.push(tokio::spawn(async move {
            let stop = async move {
                let _ = rx.wait_for(|s| *s).await;
            };
            if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(stop).await {
                tracing::error!(error = %e, "server stopped");
            }
        }));

        // Bootstrap a pristine single-node cluster; cluster bootstrap is in `cluster`.
        let pristine = raft.is_initialized().await.map(|i| !i).unwrap_or(false);
        if pristine {
            let members: BTreeMap<NodeId, BasicNode> =
                peers.iter().map(|(id, addr)| (*id, BasicNode { addr: addr.clone() })).collect();
            if members.len() == 1 || config.node_id == *peers.keys().next().unwrap_or(&0) {
                tracing::info!(node = config.node_id, members = ?peers, "initialising a new cluster");
                if let Err(e) = raft.initialize(members).await {
                    tracing::warn!(error = %e, "initialise refused (another node may have done it)");
                }
            }
        }

        let ready_leader: Arc<Mutex<Option<u64>>> = Arc::new(Mutex::new(None));
        let leader_watch = {
            let (raft_s, sm_s, leases_s, parked_s, ready_s) =
                (raft.clone(), sm.clone(), leases.clone(), parked.clone(), ready_leader.clone());
            let (parked_t, ready_t) = (parked.clone(), ready_leader.clone());
            let extra = config.election_timeout.1;
            let grace = policy.unclaimed_slot_grace;
            raft.on_leader_change(
                move |leader_id| {
                    let (raft, sm, leases, parked, ready) =
                        (raft_s.clone(), sm_s.clone(), leases_s.clone(), parked_s.clone(), ready_s.clone());
                    async move {
                        tracing::info!(%leader_id, "became leader; restarting inherited leases");
                        // Apply every inherited entry first, so every inherited
                        // lease gets ttl + election timeout (I6).
                        tokio::spawn(async move {
                            if raft.ensure_linearizable(ReadPolicy::ReadIndex).await.is_err() {
                                return;
                            }
                            let state = sm.read();
                            leases.reset_from(&state, extra);
                            parked.leader_started(&state, grace);
                            drop(state);
                            *ready.lock().unwrap_or_else(|p| p.into_inner()) = Some(leader_id.term);
                        });
                    }
                },
                move |leader_id| {
                    let (parked, ready) = (parked_t.clone(), ready_t.clone());
                    async move {
                        tracing::info!(%leader_id, "stopped being leader; failing parked calls");
                        *ready.lock().unwrap_or_else(|p| p.into_inner()) = None;
                        parked.leader_lost();
                    }
                },
            )
        };

        tasks.push(tokio::spawn(leader_duties(svc.clone(), leases, parked, ready_leader, shutdown_rx.clone())));
        tasks.push(tokio::spawn(watch_metrics(raft.clone(), metrics.clone(), shutdown_rx.clone())));

        tracing::info!(node = config.node_id, addr = %local_addr, cluster = %cluster_id, data_dir = %dir.display(), "coordinator node started");
        Ok(Node {
            raft,
            svc,
            metrics,
            sm,
            log,
            local_addr,
            cluster_id,
            data_dir: dir,
            shutdown_tx,
            tasks,
            _leader_watch: leader_watch,
        })
    }

    /// The address the node serves on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The lock operations of this node.
    pub fn service(&self) -> &LockService {
        &self.svc
    }

    /// The raft handle.
    pub fn raft(&self) -> &RaftHandle {
        &self.raft
    }

    /// The node's metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The cluster id.
    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    /// The data dir.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
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
        let _ = self.shutdown_tx.send(true);
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!(error = %e, "raft shutdown");
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
        tracing::info!("coordinator node stopped");
    }
}

/// A multi-node cluster's id: derived from its initial membership so every
/// node computes the same one before any message is exchanged.
fn cluster_id_for(peers: &BTreeMap<NodeId, String>) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for (id, addr) in peers {
        id.hash(&mut h);
        addr.hash(&mut h);
    }
    format!("c{:016x}", h.finish())
}

/// The leader's periodic work: expire overdue leases, cancel queue slots not
/// reclaimed after a leader change, prune old dedup records.
async fn leader_duties(
    svc: LockService,
    leases: Arc<LeaseClock>,
    parked: Arc<ParkedCalls>,
    ready_leader: Arc<Mutex<Option<u64>>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let clock = Clock;
    let in_flight: Arc<Mutex<HashSet<crate::types::LeaseId>>> = Arc::new(Mutex::new(HashSet::new()));
    let mut last_prune = clock.now();
    let keep_promoted = svc.policy().unclaimed_slot_grace + svc.policy().max_wait;
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            () = tokio::time::sleep(DUTY_TICK) => {}
        }
        let unclaimed = parked.sweep(keep_promoted);
        let Ok(leader) = svc.inner.raft.as_leader() else { continue };
        let term = leader.leader_id().term;
        if *ready_leader.lock().unwrap_or_else(|p| p.into_inner()) != Some(term) {
            continue;
        }
        let bound = leader.to_committed_leader_id();
        for o in leases.overdue(MAX_EXPIRE_IN_FLIGHT) {
            {
                let mut set = in_flight.lock().unwrap_or_else(|p| p.into_inner());
                if set.len() >= MAX_EXPIRE_IN_FLIGHT || !set.insert(o.lease_id) {
                    continue;
                }
            }
            let (svc, in_flight, bound) = (svc.clone(), in_flight.clone(), bound);
            tokio::spawn(async move {
                let cmd =
                    Command::Expire { resource: o.resource.clone(), lease_id: o.lease_id, basis_index: o.basis_index };
                match propose_bound(&svc, cmd, bound).await {
                    Ok(_) => tracing::debug!(resource = %o.resource, lease = %o.lease_id, "expired"),
                    Err(e) => tracing::debug!(error = %e, "expire not committed; will retry if still leader"),
                }
                in_flight.lock().unwrap_or_else(|p| p.into_inner()).remove(&o.lease_id);
            });
        }
        for (resource, request_id) in unclaimed {
            let svc = svc.clone();
            tokio::spawn(async move {
                tracing::info!(%resource, %request_id, "queue slot not reclaimed after leader change; cancelling");
                let cmd = Command::CancelWait { resource, request_id };
                if let Err(e) = propose_bound(&svc, cmd, bound).await {
                    tracing::warn!(error = %e, "could not cancel an unclaimed queue slot");
                }
            });
        }
        if last_prune.elapsed() >= PRUNE_EVERY {
            last_prune = clock.now();
            let older_than_ms = clock.wall_ms().saturating_sub(svc.policy().dedup_retention.as_millis() as u64);
            let svc = svc.clone();
            tokio::spawn(async move {
                if let Err(e) = propose_bound(&svc, Command::PruneDedup { older_than_ms }, bound).await {
                    tracing::debug!(error = %e, "prune not committed");
                }
            });
        }
    }
}

/// Proposes a leader-originated command that only this leader term may
/// commit: a deposed leader's expiry proposals are refused (DESIGN §3.2).
async fn propose_bound(
    svc: &LockService,
    cmd: Command,
    leader: openraft::alias::CommittedLeaderIdOf<crate::types::TypeConfig>,
) -> Result<crate::state_machine::Outcome, crate::service::LockError> {
    use crate::service::LockError;
    let entry = LogCommand { at_ms: Clock.wall_ms(), cmd };
    let (responder, rx) = openraft::impls::ProgressResponder::complete_only();
    svc.inner.raft.write(entry).with_leader(leader).responder(responder).await.map_err(|_| LockError::ShuttingDown)?;
    match tokio::time::timeout(svc.policy().write_timeout, rx).await {
        Err(_) => Err(LockError::Unknown("not committed in time".into())),
        Ok(Err(_)) => Err(LockError::ShuttingDown),
        Ok(Ok(Err(e))) => Err(write_error(openraft::errors::RaftError::APIError(e))),
        Ok(Ok(Ok(resp))) => Ok(resp.data),
    }
}

/// Mirrors raft metrics into Prometheus gauges and counts leader changes.
async fn watch_metrics(raft: RaftHandle, metrics: Arc<Metrics>, mut shutdown: watch::Receiver<bool>) {
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
            }
        }
        tokio::select! {
            _ = shutdown.changed() => return,
            r = rx.changed() => if r.is_err() { return },
        }
    }
}
