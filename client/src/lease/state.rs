//! What a lease knows about whether it still holds the lock: the
//! [`LeaseState`] (Held, Uncertain, Lost) the renewal task publishes, and
//! the check of that state against the clock.

use std::sync::Mutex;

use tokio::sync::watch;

use super::renewal::Timing;
use crate::clock::{self, Instant};
use fencer_token::{FencingToken, LeaseId};

/// What the client knows about its lease (DESIGN §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    /// The last renewal succeeded and the next one is not late: work may start.
    Held,
    /// A renewal failed or is late. The lease may still be valid, but do not
    /// start new work; finish or abandon what is running before the deadline.
    /// Becomes Held again if a renewal succeeds before the local deadline.
    Uncertain,
    /// The lease is over; this is final. Stop all work: another client may
    /// hold the lock (with a larger token) already.
    Lost(LostReason),
}

impl LeaseState {
    /// Whether work may start.
    pub fn is_held(self) -> bool {
        self == Self::Held
    }

    /// Whether the lease is over.
    pub fn is_lost(self) -> bool {
        matches!(self, Self::Lost(_))
    }

    /// Why the lease is over, if it is.
    pub fn lost_reason(self) -> Option<LostReason> {
        match self {
            Self::Lost(r) => Some(r),
            _ => None,
        }
    }
}

impl std::fmt::Display for LeaseState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Held => f.write_str("held"),
            Self::Uncertain => f.write_str("uncertain"),
            Self::Lost(r) => write!(f, "lost ({r})"),
        }
    }
}

/// Why a lease was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LostReason {
    /// The local deadline passed without a successful renewal: the send time
    /// of the last successful renewal + ttl − safety margin.
    DeadlinePassed,
    /// The server said the lease is not the holder (NOT_HOLDER).
    NotHolder,
    /// The server said the lease expired or was force-released (LEASE_EXPIRED).
    LeaseExpired,
    /// The lease was released (or dropped) by its owner.
    Released,
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::DeadlinePassed => "the local deadline passed without a successful renewal",
            Self::NotHolder => "the server says the lease is not the holder",
            Self::LeaseExpired => "the server says the lease expired",
            Self::Released => "released",
        })
    }
}

/// Deadline and next renewal, moved only by the renewal task.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Times {
    /// Local deadline: send time of the last successful renewal (or of the
    /// granted acquire) + ttl − safety margin.
    pub(crate) deadline: Instant,
    /// When the next renewal is due; Held turns Uncertain `late_after` past it.
    pub(crate) next_due: Instant,
}

/// The state shared by a [`Lease`](super::Lease), its
/// [`LeaseHandle`](super::LeaseHandle)s and its renewal task.
pub(crate) struct LeaseCore {
    pub(crate) resource: String,
    pub(crate) lease_id: LeaseId,
    pub(crate) token: FencingToken,
    pub(crate) request_id: String,
    pub(crate) timing: Timing,
    /// The leader's signature over the grant, when it sent one.
    pub(crate) signed_token: Option<String>,
    times: Mutex<Times>,
    state: watch::Sender<LeaseState>,
}

impl LeaseCore {
    pub(crate) fn new(
        resource: String,
        lease_id: LeaseId,
        token: FencingToken,
        request_id: String,
        timing: Timing,
        times: Times,
    ) -> Self {
        let (state, _) = watch::channel(LeaseState::Held);
        Self { resource, lease_id, token, request_id, timing, signed_token: None, times: Mutex::new(times), state }
    }

    /// The same core with the grant's signed token.
    pub(crate) fn with_signed_token(mut self, signed_token: Option<String>) -> Self {
        self.signed_token = signed_token;
        self
    }

    pub(crate) fn times(&self) -> Times {
        *self.times.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn set_times(&self, f: impl FnOnce(&mut Times)) {
        f(&mut self.times.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// The published state (may lag the clock; see [`LeaseCore::check`]).
    pub(crate) fn published(&self) -> LeaseState {
        *self.state.borrow()
    }

    /// Publishes Held or Uncertain, unless the lease is already lost (final).
    pub(crate) fn set(&self, new: LeaseState) {
        self.state.send_if_modified(|s| {
            if s.is_lost() || *s == new {
                return false;
            }
            *s = new;
            true
        });
    }

    /// Publishes Lost; returns false if it was lost already (the first reason stays).
    pub(crate) fn lose(&self, reason: LostReason) -> bool {
        self.state.send_if_modified(|s| {
            if s.is_lost() {
                return false;
            }
            *s = LeaseState::Lost(reason);
            true
        })
    }

    /// The state now, checked against the clock.
    pub(crate) fn check(&self) -> LeaseState {
        let published = self.published();
        if published.is_lost() {
            return published;
        }
        let times = self.times();
        let now = clock::now();
        if now >= times.deadline {
            return LeaseState::Lost(LostReason::DeadlinePassed);
        }
        if published == LeaseState::Held && now >= times.next_due + self.timing.late_after {
            return LeaseState::Uncertain;
        }
        published
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<LeaseState> {
        self.state.subscribe()
    }
}

/// Resolves with the reason once `rx` shows Lost.
pub(super) async fn wait_lost(mut rx: watch::Receiver<LeaseState>) -> LostReason {
    match rx.wait_for(|s| s.is_lost()).await {
        Ok(s) => s.lost_reason().unwrap_or(LostReason::Released),
        // Only the core owns the sender; it is gone once every owner is.
        Err(_) => LostReason::Released,
    }
}

/// Waits for `core` to be lost (tests).
#[cfg(test)]
pub(crate) async fn tests_wait_lost(core: &LeaseCore) -> LostReason {
    wait_lost(core.subscribe()).await
}
