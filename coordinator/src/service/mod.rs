//! The lock operations of one node, shared by the gRPC and JSON front ends:
//! validation, leadership checks, proposing through raft, parking waiters,
//! linearizable reads. Errors are [`LockError`]; `api::errors` maps them to
//! statuses.
//!
//! - this module — [`LockService`]: proposing a command, leadership and
//!   quorum checks, linearizable reads.
//! - `error` — [`LockError`].
//! - `locks` — acquire (and its FIFO wait), renew, release, force-release,
//!   get and list.
//! - `status` — this node's view of the cluster: status, health, hot
//!   resources; membership changes.
//! - `keys` — the signing-key operations: signing grants, registering this
//!   node's keys, rotation and retirement (the keys themselves are module
//!   `signing`'s).

use std::sync::Arc;
use std::time::Duration;

use openraft::ReadPolicy;
use openraft::errors::{ClientWriteError, ForwardReason, ForwardToLeader, LinearizableReadError, RaftError};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::Instrument as _;

use crate::clock::Clock;
use crate::hot::HotTracker;
use crate::lease_clock::LeaseClock;
use crate::log_level::LogControlHandle;
use crate::metrics::Metrics;
use crate::policy::Policy;
use crate::raft::{RaftHandle, TypeConfig};
use crate::state_machine::{Command, LogCommand, Outcome};
use crate::store::StateMachineStore;
use crate::types::NodeId;
use crate::waiters::ParkedCalls;

mod error;
mod keys;
mod locks;
mod status;

pub use self::error::LockError;
pub(crate) use self::keys::register_keys;
pub(crate) use self::locks::QuorumConfirmation;
pub use self::locks::{AcquireRequest, ForceReleased, Granted, LockView, Released, Renewed};
pub use self::status::{Health, MemberView, StatusView};

/// How long a renewal waits for the replication of other writes to confirm
/// this leader before it asks for a heartbeat round of its own.
const PIGGYBACK_WAIT: Duration = Duration::from_millis(20);

/// Records `field` of the current `call` span (module `api::call`) when
/// debug logging is on for the coordinator. At the default level the span
/// keeps only its `op` and `resource`: formatting the fields recorded
/// later into every call's span cost ~3 % of a leader's CPU at the seed
/// rate (issue 18), for the few events a call logs at info level or above.
pub(crate) fn record_call_field(field: &str, value: impl tracing::Value) {
    if tracing::enabled!(target: "fencer_coordinator", tracing::Level::DEBUG) {
        tracing::Span::current().record(field, value);
    }
}

/// What the node's metrics watcher last saw of this node's leadership: the
/// calls a just-elected leader refused wait for it to leave `Waiting`.
/// Each carries the term, so that a change the watcher saw only in part
/// (acknowledged in one term, then in the next) is still a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QuorumAck {
    /// Not the leader.
    NotLeader(u64),
    /// The leader, not yet acknowledged by a quorum in its term.
    Waiting(u64),
    /// The leader, acknowledged by a quorum in its term.
    Acked(u64),
}

pub(crate) struct ServiceInner {
    pub(crate) raft: RaftHandle,
    pub(crate) sm: StateMachineStore,
    pub(crate) leases: Arc<LeaseClock>,
    pub(crate) parked: Arc<ParkedCalls>,
    pub(crate) policy: Policy,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) clock: Clock,
    pub(crate) cluster: Arc<crate::bootstrap::ClusterId>,
    /// The longest election timeout: the quorum lease and the health bound.
    pub(crate) election_timeout: Duration,
    /// Set when the node starts stopping: calls cut off by the stop are not
    /// "callers that went away", so their queue slots are left for the
    /// retries on the next leader to reclaim.
    pub(crate) stopping: std::sync::atomic::AtomicBool,
    /// The busiest resources (fed by the apply observer).
    pub(crate) hot: Arc<HotTracker>,
    /// Run-time log filter changes, when the process offers them.
    pub(crate) log_control: Option<LogControlHandle>,
    /// This node's token-signing keys (module `signing`).
    pub(crate) keys: Arc<crate::signing::NodeKeys>,
    /// The leader this node knows, changed only when it changes (fed by the
    /// node's metrics watcher): what a held call waits on.
    pub(crate) leader: watch::Receiver<Option<NodeId>>,
    /// Whether this node leads and a quorum acknowledged it in its term,
    /// changed only when that changes (fed by the node's metrics watcher):
    /// what the calls refused by a just-elected leader wait on, so that
    /// thousands of them wake once, not at every raft metrics update.
    pub(crate) quorum_ack: watch::Receiver<QuorumAck>,
    /// Bumped when this node's leadership ends or its quorum lease runs out
    /// (`leadership::relinquish`): writes still waiting for their commit
    /// answer "outcome unknown" at once instead of at the write timeout.
    pub(crate) leadership_lost: watch::Sender<u64>,
    /// How this node calls its peers (https with its certificate when the
    /// cluster runs TLS): signing-key registrations go to the leader this way.
    pub(crate) peer_tls: Option<tonic::transport::ClientTlsConfig>,
    /// Proposals of this node waiting for their commit: while there are
    /// any, their replication carries the quorum confirmation a renewal
    /// needs, without a heartbeat round of its own.
    pub(crate) writes_in_flight: std::sync::atomic::AtomicUsize,
    /// When this node last accepted an append (or heartbeat) from a leader
    /// (module `network`): with Pre-Vote a follower cut off from everyone
    /// keeps its old leader in raft's metrics, so readiness asks this.
    pub(crate) leader_contact: crate::clock::LastSeen,
}

/// Counts a proposal in [`ServiceInner::writes_in_flight`] while it lives.
struct InFlight<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> InFlight<'a> {
    fn new(n: &'a std::sync::atomic::AtomicUsize) -> Self {
        n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self(n)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The lock operations of one node. Cheap to clone.
#[derive(Clone)]
pub struct LockService {
    pub(crate) inner: Arc<ServiceInner>,
}

fn not_leader(f: &ForwardToLeader<TypeConfig>) -> LockError {
    if f.reason == ForwardReason::LeaseExpired {
        return LockError::NoQuorum;
    }
    LockError::NotLeader { leader_id: f.leader_id, leader_addr: f.leader_node.as_ref().map(|n| n.addr.clone()) }
}

pub(crate) fn write_error(e: RaftError<TypeConfig, ClientWriteError<TypeConfig>>) -> LockError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => not_leader(&f),
        RaftError::APIError(ClientWriteError::LogEntryDiscarded(_)) => {
            LockError::Unknown("the leader changed before the write committed; retry with the same request id".into())
        }
        RaftError::APIError(e) => LockError::Internal(e.to_string()),
        RaftError::Fatal(_) => LockError::ShuttingDown,
    }
}

impl LockService {
    pub(crate) fn new(inner: ServiceInner) -> Self {
        Self { inner: Arc::new(inner) }
    }

    /// Marks the node as stopping (see [`ServiceInner::stopping`]).
    pub(crate) fn begin_stop(&self) {
        self.inner.stopping.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// The policy in force.
    pub fn policy(&self) -> &Policy {
        &self.inner.policy
    }

    fn ensure_leader(&self) -> Result<(), LockError> {
        self.inner.raft.as_leader().map(|_| ()).map_err(|f| not_leader(&f))
    }

    /// Proposes a command and waits for its outcome, at most the write timeout.
    pub(crate) async fn propose(&self, cmd: Command) -> Result<Outcome, LockError> {
        self.propose_indexed(cmd).await.map(|(_, outcome)| outcome)
    }

    /// As [`Self::propose`], with the log index of the entry.
    async fn propose_indexed(&self, cmd: Command) -> Result<(u64, Outcome), LockError> {
        let entry = LogCommand { at_ms: self.inner.clock.wall_ms(), cmd };
        let started = self.inner.clock.now();
        let _in_flight = InFlight::new(&self.inner.writes_in_flight);
        // Boxed: openraft's write future is large, and each wrapper below
        // (timeout, select) would otherwise hold it twice, making every
        // call's future kilobytes larger to move.
        let write = Box::pin(async {
            match self.inner.raft.client_write(entry.clone()).await {
                // A leader elected a moment ago has no quorum acknowledgement
                // yet and refuses proposals until its first heartbeat round
                // returns. The refusal happened before anything was appended,
                // so proposing again once a quorum answered is safe.
                Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))
                    if f.reason == ForwardReason::LeaseExpired && self.await_first_quorum_ack().await =>
                {
                    self.inner.raft.client_write(entry).await
                }
                other => other,
            }
        });
        let mut lost = self.inner.leadership_lost.subscribe();
        lost.borrow_and_update();
        let write = async {
            tokio::select! {
                r = tokio::time::timeout(self.inner.policy.write_timeout, write) => r.map_err(|_| {
                    LockError::Unknown(format!(
                        "the write did not commit within {:?}; retry with the same request id",
                        self.inner.policy.write_timeout
                    ))
                }),
                // The entry may have committed (the new leader then has
                // it), may still commit (the quorum answers again), or not:
                // the outcome is unknown.
                _ = lost.changed() => Err(LockError::Unknown(
                    "this node lost its quorum or stopped leading before the write committed; \
                     retry with the same request id"
                        .into(),
                )),
            }
        };
        match write.await {
            Err(e) => Err(e),
            Ok(Err(e)) => Err(write_error(e)),
            Ok(Ok(resp)) => {
                self.inner.metrics.commit_seconds.observe(started.elapsed().as_secs_f64());
                record_call_field("log_index", resp.log_id.index);
                Ok((resp.log_id.index, resp.data))
            }
        }
    }

    /// Whether a quorum acknowledged this leader within one election timeout
    /// (always true for a single voter): while it holds, openraft's leader
    /// lease guarantees no other leader exists.
    pub(crate) fn has_quorum_lease(&self) -> bool {
        use openraft::rt::Instant as _;
        let m = self.inner.raft.metrics();
        let m = openraft::rt::watch::WatchReceiver::borrow_watched(&m);
        if m.state != openraft::ServerState::Leader {
            return false;
        }
        m.membership_config.membership().voter_ids().count() <= 1
            || m.last_quorum_acked.as_ref().is_some_and(|t| t.into_inner().elapsed() < self.inner.election_timeout)
    }

    /// After a proposal was refused for want of a quorum lease: on a leader
    /// that has not been acknowledged by a quorum yet in its term (just
    /// elected), waits at most one election timeout for the first
    /// acknowledgement, and says whether proposing again makes sense (also
    /// when the acknowledgement arrived between the refusal and now). A
    /// leader that had a quorum and lost it says no at once: NO_QUORUM.
    ///
    /// The wait is on [`ServiceInner::quorum_ack`], not on raft's metrics:
    /// after a leader change thousands of held calls land here at once, and
    /// raft's metrics change many times before the first acknowledgement
    /// (issue 17: each change woke every one of them).
    async fn await_first_quorum_ack(&self) -> bool {
        let deadline = tokio::time::Instant::now() + self.inner.election_timeout;
        let mut ack = self.inner.quorum_ack.clone();
        loop {
            // Seen before reading raft's metrics: a change published after
            // this read (the watcher reads them later) wakes the wait below.
            ack.borrow_and_update();
            let (leader, acked) = {
                let m = self.inner.raft.metrics();
                let m = openraft::rt::watch::WatchReceiver::borrow_watched(&m);
                (m.state == openraft::ServerState::Leader, m.last_quorum_acked.is_some())
            };
            if !leader {
                return false;
            }
            // Read after `acked`: an acknowledgement that arrived since counts.
            if self.has_quorum_lease() {
                return true;
            }
            if acked {
                return false;
            }
            match tokio::time::timeout_at(deadline, ack.changed()).await {
                Ok(Ok(())) => {}
                // Out of time, or the node is stopping.
                Ok(Err(_)) | Err(_) => return false,
            }
        }
    }

    /// How long a follower holds a lock call for a leader: three election
    /// timeouts, time enough for the followers' leases of a dead leader to
    /// run out, an election to run and its winner to be heard of.
    pub(crate) fn leader_wait(&self) -> Duration {
        self.inner.election_timeout * 3
    }

    /// Whether this node can answer a lock call now: it leads (with or
    /// without a quorum: NO_QUORUM is an answer), or it knows a leader that
    /// is not among the nodes the caller reports `unreachable`, or it is
    /// not part of a cluster (yet) or is stopping.
    fn can_answer(&self, unreachable: &[String]) -> bool {
        if self.inner.stopping.load(std::sync::atomic::Ordering::SeqCst) {
            return true;
        }
        match self.inner.raft.as_leader() {
            Ok(_) => true,
            Err(f) => match f.leader_node {
                Some(node) => !unreachable.contains(&node.addr),
                None => {
                    let m = self.inner.raft.metrics();
                    let m = openraft::rt::watch::WatchReceiver::borrow_watched(&m);
                    m.membership_config.membership().voter_ids().next().is_none()
                }
            },
        }
    }

    /// Holds a lock call on a follower that knows no leader, or only one the
    /// caller reports unreachable, until it knows another (or leads itself),
    /// at most [`Self::leader_wait`]: the caller then hears of the new leader
    /// the moment it is known, instead of polling through the election or
    /// being sent back to the node that just failed. The call then runs as
    /// usual: served here if this node leads now, NOT_LEADER with the new
    /// leader's address otherwise (or with what this node still knows, once
    /// the wait ran out).
    pub(crate) async fn await_leader(&self, unreachable: &[String]) {
        let mut leader = self.inner.leader.clone();
        leader.borrow_and_update();
        if self.can_answer(unreachable) {
            return;
        }
        let wait = async {
            while leader.changed().await.is_ok() {
                if self.can_answer(unreachable) {
                    return;
                }
            }
        };
        if tokio::time::timeout(self.leader_wait(), wait).await.is_err() {
            tracing::debug!(?unreachable, "no usable leader known after waiting; answering with what this node knows");
        }
    }

    /// Proposes in a task of its own, so the write completes (and its outcome
    /// can be acted on) even if the caller goes away.
    fn propose_detached(&self, cmd: Command) -> JoinHandle<Result<Outcome, LockError>> {
        let svc = self.clone();
        tokio::spawn(async move { svc.propose(cmd).await }.in_current_span())
    }

    /// Waits until a quorum acknowledged a replication request this leader
    /// sent after the call (ReadIndex, never a lease) and the state applied
    /// everything committed before it: the confirmation of a renewal
    /// without a log entry (DESIGN §3.2). While other writes are in flight
    /// their replication carries it (no extra round trip); otherwise, or if
    /// none qualifies within [`PIGGYBACK_WAIT`], a heartbeat round does.
    pub(crate) async fn confirm_quorum(&self) -> Result<(), LockError> {
        use std::sync::atomic::Ordering;
        if self.inner.writes_in_flight.load(Ordering::Relaxed) > 0 {
            let option = openraft::LinearizerOption::new(Some(Duration::ZERO), false).with_wait_timeout(PIGGYBACK_WAIT);
            match Box::pin(self.inner.raft.ensure_linearizable(option)).await {
                // No qualifying acknowledgement in time: ask with a round.
                Err(RaftError::APIError(LinearizableReadError::QuorumNotEnough(_))) => {}
                other => return other.map(|_| ()).map_err(read_error),
            }
        }
        self.linearize().await
    }

    /// Waits until reads on this node are linearizable (ReadIndex, never lease reads).
    pub(crate) async fn linearize(&self) -> Result<(), LockError> {
        self.ensure_leader()?;
        let mut lost = self.inner.leadership_lost.subscribe();
        lost.borrow_and_update();
        let read = tokio::select! {
            r = tokio::time::timeout(
                self.inner.policy.write_timeout,
                Box::pin(self.inner.raft.ensure_linearizable(ReadPolicy::ReadIndex)),
            ) => r.map_err(|_| LockError::NoQuorum)?,
            _ = lost.changed() => return Err(LockError::NoQuorum),
        };
        read.map(|_| ()).map_err(read_error)
    }
}

/// What a failed linearizable read (ReadIndex) tells the caller.
fn read_error(e: RaftError<TypeConfig, LinearizableReadError<TypeConfig>>) -> LockError {
    match e {
        RaftError::APIError(LinearizableReadError::ForwardToLeader(f)) => not_leader(&f),
        RaftError::APIError(LinearizableReadError::QuorumNotEnough(_)) => LockError::NoQuorum,
        RaftError::Fatal(_) => LockError::ShuttingDown,
    }
}
