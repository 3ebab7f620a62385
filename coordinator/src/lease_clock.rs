//! Leader-local lease deadlines (DESIGN §3.2). Deadlines are not replicated:
//! each node keeps `lease → deadline` on its monotonic clock, set when it
//! applies a grant or a renewal (`now + ttl`, never earlier than the leader
//! received the request), and restarted at `now + ttl + election timeout` for
//! every current lease when the node becomes leader (I6). Only the leader acts
//! on them: the expiry task proposes `Expire` for overdue leases, carrying the
//! index the deadline counted from so a renewal committed meanwhile wins.
//!
//! The deadlines are *authoritative* — a Renew past its deadline is refused
//! at once — only while this node is a leader that has taken over its
//! inherited leases. On a follower, on a new leader still applying what it
//! inherited, or on a leader that lost its quorum, a deadline may be stale,
//! and the log decides instead.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::clock::{Clock, Instant};
use crate::state_machine::LockState;
use crate::types::{LeaseId, ResourceName};

#[derive(Debug, Clone)]
struct Deadline {
    resource: ResourceName,
    at: Instant,
    basis_index: u64,
}

/// A lease whose deadline passed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overdue {
    /// The lock.
    pub resource: ResourceName,
    /// The lease.
    pub lease_id: LeaseId,
    /// The index of the grant or renewal its deadline counted from.
    pub basis_index: u64,
}

/// The deadlines of every current lease known to this node.
#[derive(Debug, Default)]
pub struct LeaseClock {
    clock: Clock,
    deadlines: Mutex<HashMap<LeaseId, Deadline>>,
    authoritative: AtomicBool,
}

impl LeaseClock {
    /// An empty clock.
    pub fn new(clock: Clock) -> Self {
        Self { clock, deadlines: Mutex::new(HashMap::new()), authoritative: AtomicBool::new(false) }
    }

    /// Whether [`is_overdue`](Self::is_overdue) may refuse renewals: only on a
    /// leader that restarted its inherited leases and has a quorum.
    pub fn set_authoritative(&self, on: bool) {
        self.authoritative.store(on, Ordering::SeqCst);
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<LeaseId, Deadline>> {
        self.deadlines.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A grant or renewal at `index` was applied: the lease runs `ttl` from now.
    pub fn started(&self, resource: &ResourceName, lease_id: LeaseId, ttl_ms: u64, index: u64) {
        let at = self.clock.after(Duration::from_millis(ttl_ms));
        self.map().insert(lease_id, Deadline { resource: resource.clone(), at, basis_index: index });
    }

    /// The lease ended.
    pub fn ended(&self, lease_id: &LeaseId) {
        self.map().remove(lease_id);
    }

    /// Restarts every current lease of `state` at `ttl + extra` from now and
    /// forgets leases that are not current (becoming leader; snapshot install).
    pub fn reset_from(&self, state: &LockState, extra: Duration) {
        let now = self.clock.now();
        let mut map = self.map();
        map.clear();
        for (name, r) in state.resources() {
            if let Some(l) = &r.lock {
                let at = now + Duration::from_millis(l.ttl_ms) + extra;
                map.insert(l.lease_id, Deadline { resource: name.clone(), at, basis_index: l.renewed_index });
            }
        }
    }

    /// The deadline of a lease, if known.
    pub fn deadline(&self, lease_id: &LeaseId) -> Option<Instant> {
        self.map().get(lease_id).map(|d| d.at)
    }

    /// Whether this node's deadlines are authoritative (a ready leader).
    pub fn is_authoritative(&self) -> bool {
        self.authoritative.load(Ordering::SeqCst)
    }

    /// Whether the lease's deadline is known, has passed, and this node's
    /// deadlines are authoritative.
    pub fn is_overdue(&self, lease_id: &LeaseId) -> bool {
        self.authoritative.load(Ordering::SeqCst) && self.deadline(lease_id).is_some_and(|at| at <= self.clock.now())
    }

    /// Leases whose deadline has passed, at most `limit` of them.
    pub fn overdue(&self, limit: usize) -> Vec<Overdue> {
        let now = self.clock.now();
        self.map()
            .iter()
            .filter(|(_, d)| d.at <= now)
            .take(limit)
            .map(|(id, d)| Overdue { resource: d.resource.clone(), lease_id: *id, basis_index: d.basis_index })
            .collect()
    }

    /// Number of tracked leases.
    pub fn len(&self) -> usize {
        self.map().len()
    }

    /// Whether no lease is tracked.
    pub fn is_empty(&self) -> bool {
        self.map().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state_machine::{AcquireCmd, Command, LogCommand};
    use crate::types::{Holder, RequestId};

    #[tokio::test(start_paused = true)]
    async fn a_lease_is_overdue_only_after_its_ttl() {
        let c = LeaseClock::new(Clock);
        c.set_authoritative(true);
        let r = ResourceName::new("a").unwrap();
        let l = LeaseId::from_u128(1);
        c.started(&r, l, 3_000, 7);
        tokio::time::advance(Duration::from_millis(2_999)).await;
        assert!(c.overdue(10).is_empty());
        assert!(!c.is_overdue(&l));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(c.overdue(10), vec![Overdue { resource: r, lease_id: l, basis_index: 7 }]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_leader_restarts_inherited_leases_with_the_election_timeout_added() {
        let mut state = LockState::new();
        let lease = LeaseId::from_u128(9);
        state.apply(
            5,
            &LogCommand {
                at_ms: 0,
                cmd: Command::Acquire(AcquireCmd {
                    request_id: RequestId::new("request-1").unwrap(),
                    resource: ResourceName::new("a").unwrap(),
                    holder: Holder::default(),
                    ttl_ms: 3_000,
                    wait: false,
                    lease_id: lease,
                    max_waiters: 1,
                }),
            },
        );
        let c = LeaseClock::new(Clock);
        c.set_authoritative(true);
        c.reset_from(&state, Duration::from_millis(1_000));
        tokio::time::advance(Duration::from_millis(3_999)).await;
        assert!(!c.is_overdue(&lease));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(c.is_overdue(&lease));
        assert_eq!(c.overdue(1)[0].basis_index, 5);
        // A node that is not a ready leader never refuses a renewal itself.
        c.set_authoritative(false);
        assert!(!c.is_overdue(&lease));
    }
}
