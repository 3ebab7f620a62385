//! Leader-local lease deadlines (DESIGN §3.2). Deadlines are not replicated:
//! each node keeps `lease → deadline` on its monotonic clock, set when it
//! applies a grant or a renewal (`now + ttl`, never earlier than the leader
//! received the request), and restarted at `now + ttl + election timeout` for
//! every current lease when the node becomes leader (I6). Only the leader acts
//! on them: the expiry task proposes `Expire` for overdue leases, carrying the
//! index the deadline counted from so a renewal committed meanwhile wins.
//!
//! A renewal confirmed by a quorum round instead of a log entry (the
//! default, DESIGN §3.2) moves the deadline with [`LeaseClock::extend`]. It
//! is refused once the expiry task picked the lease (the Expire entry it
//! proposes cannot see such a renewal), so whichever of the two comes first
//! decides, under one lock.
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
    /// Handed to the expiry task: an Expire may be on its way, so a renewal
    /// without a log entry must not succeed any more.
    expiring: bool,
}

/// What [`LeaseClock::extend`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extended {
    /// The lease now runs until this instant.
    Until(Instant),
    /// The expiry task already picked the lease: the renewal is refused
    /// (LEASE_EXPIRED), even if the Expire then fails to commit.
    Expiring,
    /// This node has no authoritative deadline for it (not a ready leader,
    /// or the lease ended meanwhile): the caller decides by the state or the log.
    Unknown,
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
        self.map().insert(lease_id, Deadline { resource: resource.clone(), at, basis_index: index, expiring: false });
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
                let d = Deadline { resource: name.clone(), at, basis_index: l.renewed_index, expiring: false };
                map.insert(l.lease_id, d);
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

    /// A renewal confirmed by a quorum round (no log entry): the lease runs
    /// `ttl` from now, unless the expiry task already picked it.
    pub fn extend(&self, lease_id: &LeaseId, ttl_ms: u64) -> Extended {
        if !self.is_authoritative() {
            return Extended::Unknown;
        }
        let at = self.clock.after(Duration::from_millis(ttl_ms));
        match self.map().get_mut(lease_id) {
            None => Extended::Unknown,
            Some(d) if d.expiring => Extended::Expiring,
            Some(d) => {
                d.at = d.at.max(at);
                Extended::Until(d.at)
            }
        }
    }

    /// Leases whose deadline has passed, at most `limit` of them, for the
    /// expiry task: each is marked so that no renewal without a log entry
    /// succeeds from now on (the mark goes with the lease, or when a
    /// renewal through the log restarts it).
    pub fn overdue(&self, limit: usize) -> Vec<Overdue> {
        let now = self.clock.now();
        self.map()
            .iter_mut()
            .filter(|(_, d)| d.at <= now)
            .take(limit)
            .map(|(id, d)| {
                d.expiring = true;
                Overdue { resource: d.resource.clone(), lease_id: *id, basis_index: d.basis_index }
            })
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
    async fn a_renewal_without_an_entry_loses_to_an_expiry_already_picked() {
        let c = LeaseClock::new(Clock);
        let r = ResourceName::new("a").unwrap();
        let (l, other) = (LeaseId::from_u128(1), LeaseId::from_u128(2));
        c.started(&r, l, 3_000, 7);
        // Not a ready leader: the log decides.
        assert_eq!(c.extend(&l, 3_000), Extended::Unknown);
        c.set_authoritative(true);
        assert_eq!(c.extend(&other, 3_000), Extended::Unknown, "a lease this node does not track");
        tokio::time::advance(Duration::from_millis(2_000)).await;
        let Extended::Until(at) = c.extend(&l, 3_000) else { panic!("a live lease is extended") };
        assert_eq!(c.deadline(&l), Some(at));
        assert_eq!(at, Clock.after(Duration::from_millis(3_000)), "ttl from the renewal, not from the grant");
        // Never moved earlier by a shorter ttl.
        assert_eq!(c.extend(&l, 1_000), Extended::Until(at));
        tokio::time::advance(Duration::from_millis(3_000)).await;
        assert_eq!(c.overdue(10).len(), 1, "overdue now, and handed to the expiry task");
        assert_eq!(c.extend(&l, 3_000), Extended::Expiring, "an Expire may be on its way");
        // A renewal through the log (applied) restarts the lease and clears the mark.
        c.started(&r, l, 3_000, 9);
        assert!(matches!(c.extend(&l, 3_000), Extended::Until(_)));
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
