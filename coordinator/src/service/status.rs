//! This node's view of the cluster (status, health, the busiest resources)
//! and membership changes.

use std::time::Duration;

use super::{LockError, LockService, write_error};
use crate::hot::{HotOrder, HotResource, HotResources};
use crate::log_level::LogControlHandle;
use crate::metrics::HealthGauges;
use crate::raft::TypeConfig;
use crate::types::NodeId;

fn server_state(s: openraft::ServerState) -> &'static str {
    match s {
        openraft::ServerState::Leader => "leader",
        openraft::ServerState::Follower => "follower",
        openraft::ServerState::Candidate => "candidate",
        openraft::ServerState::Learner => "learner",
        openraft::ServerState::Shutdown => "shutdown",
    }
}

/// One member as seen by this node.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MemberView {
    /// Node id.
    pub id: NodeId,
    /// Address.
    pub addr: String,
    /// voter or learner.
    pub role: &'static str,
    /// Highest index known replicated to it (leader only).
    pub matched_index: u64,
    /// Milliseconds since the leader last heard from it; -1 when unknown.
    pub last_ack_ms: i64,
    /// self, ok, lagging, unreachable or unknown.
    pub health: &'static str,
}

/// This node's view of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StatusView {
    /// This node.
    pub node_id: NodeId,
    /// The cluster it belongs to.
    pub cluster_id: String,
    /// leader, follower, candidate, learner or shutdown.
    pub state: &'static str,
    /// The leader, if known.
    pub leader_id: Option<NodeId>,
    /// The leader's address, if known.
    pub leader_addr: Option<String>,
    /// Current term.
    pub term: u64,
    /// Last log index.
    pub last_log_index: u64,
    /// Committed index.
    pub commit_index: u64,
    /// Applied index.
    pub applied_index: u64,
    /// Index of the latest snapshot.
    pub snapshot_index: u64,
    /// Highest purged index.
    pub purged_index: u64,
    /// Members.
    pub members: Vec<MemberView>,
    /// Held locks.
    pub locks_held: u64,
    /// Queued waiters.
    pub waiters: u64,
    /// Milliseconds since a quorum last acknowledged this leader (leader only).
    pub millis_since_quorum_ack: Option<u64>,
    /// This node is a leader that took over its inherited leases and has a
    /// quorum: it grants, renews and expires (docs/cluster.md, "Failover").
    pub leader_ready: bool,
    /// What `/readyz` answers (docs/operations.md, "Health").
    pub ready: bool,
    /// Why the node is or is not ready, for humans.
    pub ready_reason: String,
    /// fencer version.
    pub version: &'static str,
}

/// Liveness and readiness of a node (docs/operations.md, "Health").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    /// The node can still make progress: raft runs and the state and audit
    /// files are writable. When false, restart the process.
    pub live: bool,
    /// Why not live.
    pub live_reason: String,
    /// A leader is known and, on the leader, a quorum acknowledged it within
    /// one election timeout (on a follower: it heard from the leader within
    /// two); the node is not stopping.
    pub ready: bool,
    /// Why (or why not) ready.
    pub ready_reason: String,
    /// A leader is known (on a follower: and heard from within two election
    /// timeouts).
    pub has_leader: bool,
    /// This node is a leader that took over its leases and has a quorum.
    pub leader_ready: bool,
    /// On the leader: time since a quorum last acknowledged it.
    pub quorum_ack_age: Option<Duration>,
}

impl LockService {
    /// This node's view of the cluster (not linearizable: a diagnostic).
    pub fn status(&self) -> StatusView {
        use openraft::rt::Instant as _;
        let m = openraft::rt::watch::WatchReceiver::borrow_watched(&self.inner.raft.metrics()).clone();
        let is_leader = m.state == openraft::ServerState::Leader;
        let membership = m.membership_config.membership();
        let voters: std::collections::BTreeSet<NodeId> = membership.voter_ids().collect();
        let last_log = m.last_log_index.unwrap_or(0);
        let mut members = Vec::new();
        for (id, node) in membership.nodes() {
            let matched = m.replication.as_ref().and_then(|r| r.get(id).cloned().flatten()).map(|l| l.index);
            let ack =
                m.heartbeat.as_ref().and_then(|h| h.get(id).cloned().flatten()).map(|i| i.elapsed().as_millis() as i64);
            let health = if *id == m.id {
                "self"
            } else if !is_leader {
                "unknown"
            } else {
                match ack {
                    None => "unreachable",
                    Some(ms) if ms > self.inner.election_timeout.as_millis() as i64 => "unreachable",
                    Some(_) if last_log.saturating_sub(matched.unwrap_or(0)) > 10_000 => "lagging",
                    Some(_) => "ok",
                }
            };
            members.push(MemberView {
                id: *id,
                addr: node.addr.clone(),
                role: if voters.contains(id) { "voter" } else { "learner" },
                matched_index: if *id == m.id { last_log } else { matched.unwrap_or(0) },
                last_ack_ms: if *id == m.id { 0 } else { ack.unwrap_or(-1) },
                health,
            });
        }
        let health = self.health_of(&m);
        let state = self.inner.sm.read();
        StatusView {
            node_id: m.id,
            cluster_id: self.inner.cluster.to_text(),
            state: server_state(m.state),
            leader_id: m.current_leader,
            leader_addr: m.current_leader.and_then(|l| membership.get_node(&l).map(|n| n.addr.clone())),
            term: m.current_term,
            last_log_index: last_log,
            commit_index: m.local_committed.as_ref().map_or(0, |l| l.index),
            applied_index: m.last_applied.as_ref().map_or(0, |l| l.index),
            snapshot_index: m.snapshot.as_ref().map_or(0, |l| l.index),
            purged_index: m.purged.as_ref().map_or(0, |l| l.index),
            members,
            locks_held: state.lock_count(),
            waiters: state.waiter_count(),
            millis_since_quorum_ack: if is_leader {
                m.last_quorum_acked.as_ref().map(|t| t.elapsed().as_millis() as u64)
            } else {
                None
            },
            leader_ready: is_leader && self.inner.leases.is_authoritative(),
            ready: health.ready,
            ready_reason: health.ready_reason,
            version: env!("CARGO_PKG_VERSION"),
        }
    }

    /// Liveness and readiness from raft's metrics and the stores.
    fn health_of(&self, m: &openraft::RaftMetrics<TypeConfig>) -> Health {
        use openraft::rt::Instant as _;
        let is_leader = m.state == openraft::ServerState::Leader;
        let quorum_ack_age = if is_leader { m.last_quorum_acked.as_ref().map(|t| t.elapsed()) } else { None };
        let (live, live_reason) = match (&m.running_state, self.inner.sm.failure_message()) {
            (Err(fatal), _) => (false, format!("raft stopped: {fatal}")),
            (Ok(()), Some(e)) => (false, format!("the state or audit file cannot be written: {e}")),
            (Ok(()), None) => (true, "raft runs and the files are writable".to_string()),
        };
        let limit = self.inner.election_timeout;
        // A follower that heard nothing from its leader for its view of the
        // leader's lease and then its longest election timer is looking for
        // a new one (with Pre-Vote, raft's metrics still name the old).
        let follower_limit = limit * 2;
        let contact = self.inner.leader_contact.age();
        let contact_fresh = contact.is_some_and(|age| age <= follower_limit);
        let voters = m.membership_config.membership().voter_ids().count();
        let (ready, ready_reason) = if !live {
            (false, live_reason.clone())
        } else if self.inner.stopping.load(std::sync::atomic::Ordering::SeqCst) {
            (false, "the node is shutting down".to_string())
        } else {
            match (m.current_leader, is_leader) {
                (None, _) => (false, "no leader known".to_string()),
                (Some(_), true) if voters <= 1 => (true, "leader of a single-node cluster".to_string()),
                (Some(_), true) => match quorum_ack_age {
                    Some(age) if age <= limit => {
                        (true, format!("leader; quorum acknowledged {} ms ago", age.as_millis()))
                    }
                    Some(age) => (
                        false,
                        format!(
                            "leader without a recent quorum (last acknowledgement {} ms ago, limit {} ms)",
                            age.as_millis(),
                            limit.as_millis()
                        ),
                    ),
                    None => (false, "leader without any quorum acknowledgement yet".to_string()),
                },
                (Some(l), false) => match contact {
                    Some(age) if age <= follower_limit => (
                        true,
                        format!("{}; leader is node {l}, heard from {} ms ago", server_state(m.state), age.as_millis()),
                    ),
                    Some(age) => (
                        false,
                        format!(
                            "no leader: nothing heard from node {l} for {} ms (limit {} ms)",
                            age.as_millis(),
                            follower_limit.as_millis()
                        ),
                    ),
                    None => (false, format!("no leader: node {l} has not been heard from since this node started")),
                },
            }
        };
        let has_leader = match (m.current_leader, is_leader) {
            (None, _) => false,
            (Some(_), true) => true,
            (Some(_), false) => contact_fresh,
        };
        Health {
            live,
            live_reason,
            ready,
            ready_reason,
            has_leader,
            leader_ready: is_leader && self.inner.leases.is_authoritative(),
            quorum_ack_age,
        }
    }

    /// Liveness and readiness of this node now.
    pub fn health(&self) -> Health {
        let m = openraft::rt::watch::WatchReceiver::borrow_watched(&self.inner.raft.metrics()).clone();
        self.health_of(&m)
    }

    /// Brings the time-dependent gauges up to date (before a scrape).
    pub(crate) fn refresh_health_metrics(&self) {
        let h = self.health();
        self.inner.metrics.set_health(HealthGauges {
            ready: h.ready,
            has_leader: h.has_leader,
            leader_ready: h.leader_ready,
            quorum_ack_age: h.quorum_ack_age,
        });
    }

    /// The busiest resources this node has applied, at most `limit`, by
    /// `order` (module `hot`).
    pub fn hot(&self, order: HotOrder, limit: usize) -> HotResources {
        let clock = &self.inner.clock;
        let hot = &self.inner.hot;
        // Read the tracker first and let it go: apply takes the state lock,
        // then the tracker's.
        let tracked = hot.snapshot(clock.now());
        let now_ms = clock.wall_ms();
        let mut resources: Vec<HotResource> = {
            let state = self.inner.sm.read();
            tracked
                .into_iter()
                .map(|t| {
                    let r = state.resource(&t.resource);
                    let lock = r.and_then(|r| r.lock.as_ref());
                    HotResource {
                        resource: t.resource.to_string(),
                        acquires_per_sec: t.acquires_per_sec,
                        error_per_sec: t.error_per_sec,
                        waiters: r.map_or(0, |r| r.waiters.len() as u32),
                        held: lock.is_some(),
                        holder: lock.map(|l| l.holder.to_string()),
                        token: lock.map(|l| l.token.0),
                        held_for_secs: lock.map(|l| now_ms.saturating_sub(l.granted_at_ms) as f64 / 1000.0),
                        mean_hold_secs: t.mean_hold_secs,
                    }
                })
                .collect()
        };
        let by_rate = |a: &HotResource, b: &HotResource| b.acquires_per_sec.total_cmp(&a.acquires_per_sec);
        match order {
            HotOrder::Acquires => resources.sort_by(by_rate),
            HotOrder::Waiters => resources.sort_by(|a, b| b.waiters.cmp(&a.waiters).then_with(|| by_rate(a, b))),
            HotOrder::Hold => resources.sort_by(|a, b| {
                b.held_for_secs.unwrap_or(-1.0).total_cmp(&a.held_for_secs.unwrap_or(-1.0)).then_with(|| by_rate(a, b))
            }),
        }
        let tracked = resources.len();
        resources.truncate(limit);
        HotResources {
            node_id: *self.inner.raft.node_id(),
            by: order.as_str().to_string(),
            capacity: hot.capacity(),
            tracked,
            half_life_secs: hot.half_life().as_secs_f64(),
            resources,
        }
    }

    /// Slots of the hot-resources tracker.
    pub fn hot_capacity(&self) -> usize {
        self.inner.hot.capacity()
    }

    /// The run-time log filter control, if the process offers one.
    pub(crate) fn log_control(&self) -> Option<&LogControlHandle> {
        self.inner.log_control.as_ref()
    }

    /// Adds a learner that catches up from the leader.
    pub async fn add_learner(&self, id: NodeId, addr: String) -> Result<u64, LockError> {
        self.ensure_leader()?;
        let r = self.inner.raft.add_learner(id, openraft::BasicNode { addr }, true).await.map_err(write_error)?;
        Ok(r.log_id.index)
    }

    /// Replaces the voter set.
    pub async fn change_membership(&self, voters: Vec<NodeId>, retain: bool) -> Result<u64, LockError> {
        self.ensure_leader()?;
        let set: std::collections::BTreeSet<NodeId> = voters.into_iter().collect();
        let r = self.inner.raft.change_membership(set, retain).await.map_err(write_error)?;
        Ok(r.log_id.index)
    }
}
