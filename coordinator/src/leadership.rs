//! What this node does because it is (or stops being) the leader
//! (DESIGN §3.2–§3.3, docs/cluster.md "Failover").
//!
//! One task owns the leader's life cycle:
//!
//! ```text
//! follower ──start──▶ starting ──inherited log applied──▶ ready ──quorum lease lost──▶ degraded
//!     ▲                  │  ▲                               │                            │
//!     └──────stop────────┘  └──────────quorum acknowledged again────────────────────────┘
//! ```
//!
//! - **starting**: wait until every inherited entry is applied (ReadIndex),
//!   then restart every inherited lease at `ttl + election timeout` (I6),
//!   give every queued request whose call is not parked here a grace period
//!   to be reclaimed, and make the lease clock authoritative.
//! - **ready**: expire overdue leases, cancel unclaimed queue slots, prune
//!   old request ids — each proposal bound to this term's committed leader
//!   id, so a deposed leader can never commit it.
//! - **degraded**: a quorum has not acknowledged this leader for one
//!   election timeout. openraft already refuses new proposals (they answer
//!   `NO_QUORUM`); additionally parked calls fail with `LEADER_CHANGED` so
//!   their clients go and reclaim their slot wherever the majority is, and
//!   the lease clock stops refusing renewals on its own. When a quorum
//!   answers again the leader goes through *starting* once more.
//! - **stop** (another node leads): the lease clock stops being
//!   authoritative and parked calls fail with `LEADER_CHANGED` at once;
//!   writes still waiting for their commit answer `OUTCOME_UNKNOWN` at once
//!   (instead of at the write timeout), so their clients retry with the
//!   same request id on the new leader.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use openraft::ReadPolicy;
use openraft::alias::{CommittedLeaderIdOf, LeaderIdOf};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};

use crate::clock::Clock;
use crate::lease_clock::LeaseClock;
use crate::raft::TypeConfig;
use crate::service::{LockError, LockService, write_error};
use crate::state_machine::{Command, LogCommand, Outcome};
use crate::types::LeaseId;
use crate::waiters::ParkedCalls;

/// How often the leader looks for overdue leases and unclaimed slots.
const DUTY_TICK: Duration = Duration::from_millis(50);
/// How often the leader proposes PruneDedup: every second (every
/// retention, if that is shorter), so records live at most the retention
/// plus a second. A prune visits only what it removes (the state's
/// retention index), so frequent small prunes cost what one large one did,
/// without stalling every node's applies: once every 30 s, removing the
/// ~120,000 records of 30 s at the seed rate took 70–130 ms of one apply
/// (issue 18).
fn prune_every(retention: Duration) -> Duration {
    retention.min(Duration::from_secs(1))
}
/// Expire proposals in flight at once.
const MAX_EXPIRE_IN_FLIGHT: usize = 1024;

type LeaderId = LeaderIdOf<TypeConfig>;
type CommittedLeaderId = CommittedLeaderIdOf<TypeConfig>;

/// A change of this node's leadership, from `Raft::on_leader_change`.
#[derive(Debug)]
pub(crate) enum LeaderEvent {
    Started(LeaderId),
    Stopped,
}

enum Phase {
    Follower,
    Starting { leader: LeaderId, read: Option<JoinHandle<bool>> },
    Ready { leader: LeaderId, bound: CommittedLeaderId },
    Degraded { leader: LeaderId },
}

/// What the leader's duties need.
pub(crate) struct Duties {
    pub(crate) svc: LockService,
    pub(crate) leases: Arc<LeaseClock>,
    pub(crate) parked: Arc<ParkedCalls>,
    /// Added to every inherited lease (the longest election timeout).
    pub(crate) election_timeout: Duration,
}

/// What losing the quorum or the leadership does at once, from the duty
/// loop and from the `Raft::on_leader_change` callback: the lease clock
/// stops being authoritative, parked calls fail with LEADER_CHANGED, and
/// writes and quorum confirmations still waiting answer OUTCOME_UNKNOWN and
/// NO_QUORUM. Their callers retry with the same request id: on another node
/// that leads by then (which knows the outcome), or here once the quorum
/// answers again (the write is found by its request id, I7). Holding them to
/// the write timeout instead would keep a client of a cut-off leader from
/// looking for the new one for the whole 5 s (issue 17).
pub(crate) fn relinquish(leases: &LeaseClock, parked: &ParkedCalls, leadership_lost: &watch::Sender<u64>) {
    leases.set_authoritative(false);
    parked.leader_lost();
    leadership_lost.send_modify(|n| *n += 1);
}

impl Duties {
    /// Runs until `shutdown`. Owns every proposal task it starts.
    pub(crate) async fn run(
        self,
        mut events: mpsc::UnboundedReceiver<LeaderEvent>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let clock = Clock;
        let mut phase = Phase::Follower;
        let mut tasks: JoinSet<Option<LeaseId>> = JoinSet::new();
        let mut expiring: HashSet<LeaseId> = HashSet::new();
        let mut last_prune = clock.now();
        let mut tick = tokio::time::interval(DUTY_TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let keep_promoted = self.svc.policy().unclaimed_slot_grace + self.svc.policy().max_wait;
        loop {
            tokio::select! {
                _ = shutdown.changed() => break,
                event = events.recv() => match event {
                    None => break,
                    Some(LeaderEvent::Started(leader)) => {
                        tracing::info!(%leader, "became leader; applying the inherited log before taking over leases");
                        abort_phase(&mut phase);
                        phase = Phase::Starting { read: Some(self.linearize()), leader };
                    }
                    Some(LeaderEvent::Stopped) => {
                        if !matches!(phase, Phase::Follower) {
                            tracing::info!("stopped being leader; parked calls answered LEADER_CHANGED");
                        }
                        abort_phase(&mut phase);
                        phase = Phase::Follower;
                        relinquish(&self.leases, &self.parked, &self.svc.inner.leadership_lost);
                        tasks.abort_all();
                        expiring.clear();
                    }
                },
                ok = async {
                    match &mut phase {
                        Phase::Starting { read: Some(h), .. } => h.await.unwrap_or(false),
                        _ => std::future::pending().await,
                    }
                } => {
                    let Phase::Starting { leader, read } = &mut phase else { continue };
                    *read = None;
                    let current = self.svc.inner.raft.as_leader().ok().map(|l| (*l.leader_id(), l.to_committed_leader_id()));
                    match current {
                        Some((id, bound)) if ok && id == *leader => {
                            self.take_over();
                            tracing::info!(%leader, "leader ready: inherited leases restarted at ttl + election timeout");
                            phase = Phase::Ready { leader: id, bound };
                        }
                        // Not confirmed yet (no quorum): the next tick tries again.
                        _ => {}
                    }
                }
                Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                    if let Ok(Some(lease)) = done {
                        expiring.remove(&lease);
                    }
                }
                _ = tick.tick() => {
                    // Every node forgets old promotions (all nodes apply them).
                    // Unclaimed slots only exist on a leader; outside *ready*
                    // they are dropped here and marked again at the takeover.
                    let unclaimed = self.parked.sweep(keep_promoted);
                    match &mut phase {
                        Phase::Follower => {}
                        Phase::Starting { read, .. } => {
                            if read.is_none() {
                                *read = Some(self.linearize());
                            }
                        }
                        Phase::Degraded { leader } => {
                            if self.quorum_recent() {
                                tracing::info!(%leader, "a quorum acknowledges this leader again; taking over leases anew");
                                let leader = *leader;
                                phase = Phase::Starting { read: Some(self.linearize()), leader };
                            }
                        }
                        Phase::Ready { leader, bound } => {
                            if !self.quorum_recent() {
                                tracing::warn!(%leader, "no quorum acknowledgement for an election timeout; refusing writes (NO_QUORUM) and failing parked calls");
                                relinquish(&self.leases, &self.parked, &self.svc.inner.leadership_lost);
                                tasks.abort_all();
                                expiring.clear();
                                phase = Phase::Degraded { leader: *leader };
                                continue;
                            }
                            let bound = *bound;
                            self.expire_overdue(&mut tasks, &mut expiring, &bound);
                            for (resource, request_id) in unclaimed {
                                tracing::info!(%resource, %request_id, "queue slot not reclaimed after a leader change; cancelling");
                                let svc = self.svc.clone();
                                tasks.spawn(async move {
                                    let cmd = Command::CancelWait { resource, request_id };
                                    if let Err(e) = propose_bound(&svc, cmd, bound).await {
                                        tracing::warn!(error = %e, "could not cancel an unclaimed queue slot");
                                    }
                                    None
                                });
                            }
                            if last_prune.elapsed() >= prune_every(self.svc.policy().dedup_retention) {
                                last_prune = clock.now();
                                let retention = self.svc.policy().dedup_retention.as_millis() as u64;
                                let older_than_ms = clock.wall_ms().saturating_sub(retention);
                                let svc = self.svc.clone();
                                tasks.spawn(async move {
                                    let cmd = Command::PruneDedup { older_than_ms };
                                    if let Err(e) = propose_bound(&svc, cmd, bound).await {
                                        tracing::debug!(error = %e, "prune not committed");
                                    }
                                    None
                                });
                            }
                        }
                    }
                }
            }
        }
        abort_phase(&mut phase);
        tasks.shutdown().await;
    }

    /// Waits (bounded) until this leader has applied everything it inherited
    /// and everything it appended itself.
    ///
    /// The second half matters when a leader takes over again after losing
    /// its quorum (`Degraded`): an `Expire` it proposed while it was ready
    /// may still sit in its log, uncommitted, its waiter dropped. A quorum
    /// read (ReadIndex) waits only for what was committed; the takeover would
    /// then restart that lease's deadline, a renewal without a log entry
    /// would succeed, and the old `Expire` would commit after it (its basis
    /// index cannot see such a renewal) and end a lease just reported
    /// renewed: two holders (I1; found by a 15-minute history run). The
    /// last log index is read through the raft core, after any proposal sent
    /// before (its queue is in order).
    fn linearize(&self) -> JoinHandle<bool> {
        let raft = self.svc.inner.raft.clone();
        let limit = self.svc.policy().write_timeout;
        tokio::spawn(async move {
            let caught_up = async {
                raft.ensure_linearizable(ReadPolicy::ReadIndex).await.ok()?;
                let last = raft.with_raft_state(|st| st.log_ids.last().map(|l| l.index)).await.ok()?;
                raft.wait(None).applied_index_at_least(last, "this leader's own log applied").await.ok()
            };
            matches!(tokio::time::timeout(limit, caught_up).await, Ok(Some(_)))
        })
    }

    /// Restarts every inherited lease at ttl + election timeout and gives
    /// every queued request a grace period to be reclaimed.
    fn take_over(&self) {
        let state = self.svc.inner.sm.read();
        self.leases.reset_from(&state, self.election_timeout);
        self.parked.leader_started(&state, self.svc.policy().unclaimed_slot_grace);
        drop(state);
        self.leases.set_authoritative(true);
    }

    /// Whether a quorum acknowledged this leader within one election timeout.
    fn quorum_recent(&self) -> bool {
        self.svc.has_quorum_lease()
    }

    fn expire_overdue(
        &self,
        tasks: &mut JoinSet<Option<LeaseId>>,
        expiring: &mut HashSet<LeaseId>,
        bound: &CommittedLeaderId,
    ) {
        for o in self.leases.overdue(MAX_EXPIRE_IN_FLIGHT) {
            if expiring.len() >= MAX_EXPIRE_IN_FLIGHT || !expiring.insert(o.lease_id) {
                continue;
            }
            let (svc, bound) = (self.svc.clone(), *bound);
            tasks.spawn(async move {
                let cmd =
                    Command::Expire { resource: o.resource.clone(), lease_id: o.lease_id, basis_index: o.basis_index };
                match propose_bound(&svc, cmd, bound).await {
                    Ok(_) => tracing::debug!(resource = %o.resource, lease = %o.lease_id, "expired"),
                    Err(e) => tracing::debug!(error = %e, "expire not committed; will retry while leader"),
                }
                Some(o.lease_id)
            });
        }
    }
}

fn abort_phase(phase: &mut Phase) {
    if let Phase::Starting { read: Some(h), .. } = phase {
        h.abort();
    }
}

/// Proposes a leader-originated command that only this leader term may
/// commit: a deposed leader's proposals are refused (DESIGN §3.2).
async fn propose_bound(svc: &LockService, cmd: Command, leader: CommittedLeaderId) -> Result<Outcome, LockError> {
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
