//! Parked Acquire calls (DESIGN §3.3). A queued request's call waits here on
//! the leader. When an applied entry promotes it, only that call is woken (no
//! thundering herd). A promotion that arrives before its call registered is
//! kept until the call comes for it. When this node stops being leader, every
//! parked call fails with LEADER_CHANGED so its client retries on the new
//! leader with the same request id and reclaims its slot (I7); on the new
//! leader, slots that nobody reclaims within a grace period are cancelled.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::oneshot;

use crate::clock::{Clock, Instant};
use crate::state_machine::{Grant, LockState};
use crate::types::{RequestId, ResourceName};

/// How a parked call ends, apart from its own wait timeout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wake {
    /// The request was promoted: it holds the lock.
    Granted(Grant),
    /// The request left the queue without the lock (cancelled elsewhere).
    Cancelled,
    /// This node stopped being leader; the outcome continues on the new one.
    LeaderChanged,
    /// Another call with the same request id took the slot over.
    Superseded,
}

enum Slot {
    Parked {
        generation: u64,
        tx: oneshot::Sender<Wake>,
    },
    /// Promoted before (or after) any call was parked for it.
    Promoted {
        grant: Grant,
        at: Instant,
    },
    /// Queued in the state but not claimed by any call on this node yet.
    Unclaimed {
        resource: ResourceName,
        until: Instant,
    },
}

/// A registration: its generation tells whether the slot is still this call's.
#[derive(Debug)]
pub struct Parked {
    /// Generation of the registration.
    pub generation: u64,
    /// Resolves when the call should wake.
    pub rx: oneshot::Receiver<Wake>,
}

/// The registry of parked calls of this node.
#[derive(Default)]
pub struct ParkedCalls {
    clock: Clock,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    slots: HashMap<RequestId, Slot>,
    next_generation: u64,
}

impl ParkedCalls {
    /// An empty registry.
    pub fn new(clock: Clock) -> Self {
        Self { clock, inner: Mutex::new(Inner::default()) }
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Parks a call for `request_id`. A promotion that already happened wakes
    /// it at once; an earlier call for the same id is superseded.
    pub fn park(&self, request_id: &RequestId) -> Parked {
        let (tx, rx) = oneshot::channel();
        let mut inner = self.inner();
        inner.next_generation += 1;
        let generation = inner.next_generation;
        match inner.slots.remove(request_id) {
            Some(Slot::Promoted { grant, .. }) => {
                let _ = tx.send(Wake::Granted(grant));
                return Parked { generation, rx };
            }
            Some(Slot::Parked { tx: old, .. }) => {
                let _ = old.send(Wake::Superseded);
            }
            Some(Slot::Unclaimed { .. }) | None => {}
        }
        inner.slots.insert(request_id.clone(), Slot::Parked { generation, tx });
        Parked { generation, rx }
    }

    /// Removes the registration if it is still `generation`'s. Returns whether
    /// it was: only then may the caller act on the slot (cancel, release).
    pub fn unpark(&self, request_id: &RequestId, generation: u64) -> bool {
        let mut inner = self.inner();
        match inner.slots.get(request_id) {
            Some(Slot::Parked { generation: g, .. }) if *g == generation => {
                inner.slots.remove(request_id);
                true
            }
            _ => false,
        }
    }

    /// Removes an unclaimed promotion of `request_id`; whether there was one.
    pub fn take_promoted(&self, request_id: &RequestId) -> bool {
        let mut inner = self.inner();
        if matches!(inner.slots.get(request_id), Some(Slot::Promoted { .. })) {
            inner.slots.remove(request_id);
            return true;
        }
        false
    }

    /// An applied entry promoted `request_id` to holder.
    pub fn promoted(&self, request_id: &RequestId, grant: Grant) {
        let mut inner = self.inner();
        match inner.slots.remove(request_id) {
            Some(Slot::Parked { tx, generation }) => {
                if let Err(Wake::Granted(grant)) = tx.send(Wake::Granted(grant)) {
                    // The call is gone but its guard has not run yet: keep the
                    // grant so the guard's CancelWait/Release finds it.
                    let _ = generation;
                    inner.slots.insert(request_id.clone(), Slot::Promoted { grant, at: self.clock.now() });
                }
            }
            _ => {
                inner.slots.insert(request_id.clone(), Slot::Promoted { grant, at: self.clock.now() });
            }
        }
    }

    /// An applied entry took `request_id` out of its queue without the lock.
    pub fn cancelled(&self, request_id: &RequestId) {
        if let Some(Slot::Parked { tx, .. }) = self.inner().slots.remove(request_id) {
            let _ = tx.send(Wake::Cancelled);
        }
    }

    /// This node stopped being leader: wake every parked call.
    pub fn leader_lost(&self) {
        let mut inner = self.inner();
        for (_, slot) in inner.slots.drain() {
            if let Slot::Parked { tx, .. } = slot {
                let _ = tx.send(Wake::LeaderChanged);
            }
        }
    }

    /// This node became leader: every queued request of `state` that has no
    /// call parked here gets `grace` to be reclaimed. Calls that parked
    /// while this leader was still taking over stay parked (a previous
    /// term's calls were all woken by [`leader_lost`](Self::leader_lost)).
    pub fn leader_started(&self, state: &LockState, grace: Duration) {
        let until = self.clock.after(grace);
        let mut inner = self.inner();
        inner.slots.retain(|_, slot| !matches!(slot, Slot::Unclaimed { .. }));
        for (name, r) in state.resources() {
            for w in &r.waiters {
                inner
                    .slots
                    .entry(w.request_id.clone())
                    .or_insert_with(|| Slot::Unclaimed { resource: name.clone(), until });
            }
        }
    }

    /// Slots whose reclaim grace has passed (to cancel), and promotions that
    /// no call claimed within `keep` (forgotten; their leases expire unrenewed).
    pub fn sweep(&self, keep: Duration) -> Vec<(ResourceName, RequestId)> {
        let now = self.clock.now();
        let mut expired = Vec::new();
        self.inner().slots.retain(|id, slot| match slot {
            Slot::Unclaimed { resource, until } if *until <= now => {
                expired.push((resource.clone(), id.clone()));
                false
            }
            Slot::Promoted { at, .. } => now.saturating_duration_since(*at) < keep,
            _ => true,
        });
        expired
    }

    /// Number of calls currently parked.
    pub fn parked_count(&self) -> usize {
        self.inner().slots.values().filter(|s| matches!(s, Slot::Parked { .. })).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{FencingToken, LeaseId};

    fn grant() -> Grant {
        Grant {
            resource: ResourceName::new("r").unwrap(),
            lease_id: LeaseId::from_u128(1),
            token: FencingToken(5),
            ttl_ms: 1000,
            waited: true,
        }
    }

    #[tokio::test]
    async fn only_the_promoted_call_wakes() {
        let p = ParkedCalls::new(Clock);
        let a = RequestId::new("request-a").unwrap();
        let b = RequestId::new("request-b").unwrap();
        let pa = p.park(&a);
        let mut pb = p.park(&b);
        p.promoted(&a, grant());
        assert_eq!(pa.rx.await.unwrap(), Wake::Granted(grant()));
        assert!(pb.rx.try_recv().is_err(), "b must not wake");
    }

    #[tokio::test]
    async fn an_early_promotion_waits_for_its_call() {
        let p = ParkedCalls::new(Clock);
        let a = RequestId::new("request-a").unwrap();
        p.promoted(&a, grant());
        assert_eq!(p.park(&a).rx.await.unwrap(), Wake::Granted(grant()));
    }

    #[tokio::test]
    async fn a_retry_supersedes_the_old_call_and_only_the_new_one_owns_the_slot() {
        let p = ParkedCalls::new(Clock);
        let a = RequestId::new("request-a").unwrap();
        let first = p.park(&a);
        let second = p.park(&a);
        assert_eq!(first.rx.await.unwrap(), Wake::Superseded);
        assert!(!p.unpark(&a, first.generation));
        assert!(p.unpark(&a, second.generation));
    }

    #[tokio::test]
    async fn a_call_parked_while_the_leader_takes_over_keeps_its_slot() {
        use crate::state_machine::{AcquireCmd, Command, LogCommand};
        use crate::types::{Holder, LeaseId};
        let mut state = LockState::new();
        let acquire = |id: &str, lease: u128| LogCommand {
            at_ms: 0,
            cmd: Command::Acquire(AcquireCmd {
                request_id: RequestId::new(id).unwrap(),
                resource: ResourceName::new("r").unwrap(),
                holder: Holder::default(),
                ttl_ms: 1000,
                wait: true,
                lease_id: LeaseId::from_u128(lease),
                max_waiters: 10,
            }),
        };
        state.apply(1, &acquire("holder-1", 1));
        state.apply(2, &acquire("request-a", 2));
        state.apply(3, &acquire("request-b", 3));
        let p = ParkedCalls::new(Clock);
        let a = RequestId::new("request-a").unwrap();
        let mut pa = p.park(&a);
        p.leader_started(&state, Duration::ZERO);
        assert!(pa.rx.try_recv().is_err(), "the parked call must not be woken");
        assert!(p.unpark(&a, pa.generation));
        // Only the slot nobody claimed is swept.
        let swept = p.sweep(Duration::from_secs(60));
        assert_eq!(swept, vec![(ResourceName::new("r").unwrap(), RequestId::new("request-b").unwrap())]);
    }

    #[tokio::test]
    async fn losing_leadership_wakes_every_call() {
        let p = ParkedCalls::new(Clock);
        let a = RequestId::new("request-a").unwrap();
        let pa = p.park(&a);
        p.leader_lost();
        assert_eq!(pa.rx.await.unwrap(), Wake::LeaderChanged);
    }
}
