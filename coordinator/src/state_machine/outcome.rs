//! What applying an entry answers and reports: the [`Outcome`] for the
//! proposer (the raft response type) and the [`Event`]s for the node's
//! lease clock, parked calls and audit log.

use serde::{Deserialize, Serialize};

use fencer_token::{KeyId, MAX_KEYS};

use super::record::{EndReason, SigningKeyRecord};
use crate::types::{FencingToken, Holder, LeaseId, RequestId, ResourceName};
/// Which tenant limit refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum QuotaLimit {
    /// `max_active_locks`.
    ActiveLocks,
    /// `max_waiters`.
    Waiters,
}

impl QuotaLimit {
    /// The limit's name in the tenants file and in errors.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ActiveLocks => "max_active_locks",
            Self::Waiters => "max_waiters",
        }
    }
}

/// A granted lease as returned to the caller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// The lock.
    pub resource: ResourceName,
    /// The lease's id.
    pub lease_id: LeaseId,
    /// The fencing token: index of the entry that granted it.
    pub token: FencingToken,
    /// Lease length.
    pub ttl_ms: u64,
    /// Whether the grant came from the wait queue.
    pub waited: bool,
}

/// Why a command changed nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Rejection {
    /// The lock is held and the request did not ask to wait.
    LockHeld {
        /// The current holder's description.
        holder: Holder,
        /// The current holder's token.
        token: FencingToken,
    },
    /// The wait queue is full.
    TooManyWaiters {
        /// The limit that was hit.
        limit: u32,
    },
    /// The lease id is not the current holder and never ended by expiry.
    NotHolder,
    /// The lease expired or was force-released.
    LeaseExpired,
    /// The request id was first used for another request.
    RequestIdReused(Reuse),
    /// The request id's acquire was granted, and that lease has ended
    /// since (released, expired or force-released): the original grant,
    /// which no longer holds the lock (I7 never answers an ended lease as
    /// a live one).
    LeaseEnded(EndedGrant),
    /// The request waited and its wait was cancelled before it was granted.
    WaitCancelled,
    /// A tenant limit: nothing changed, and nothing was recorded for the
    /// request id (a retry is judged afresh).
    TenantLimit {
        /// Which limit.
        limit: QuotaLimit,
        /// Its value.
        value: u64,
    },
}

/// What a reused request id was first used for, unlike its retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reuse {
    /// Another resource.
    Resource,
    /// The same resource, with another holder or ttl.
    HolderOrTtl,
}

/// A grant whose lease ended after it was granted, as a retry of its
/// request id learns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndedGrant {
    /// The original grant.
    pub grant: Grant,
    /// Leader wall time of the entry that granted it (so the original
    /// expiry is `granted_at_ms + ttl_ms`).
    pub granted_at_ms: u64,
}

/// What happened to a queued request when its wait was cancelled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CancelOutcome {
    /// It was still queued and is now out of the queue.
    Cancelled,
    /// It had been promoted first: the caller holds the lock.
    AlreadyGranted(Grant),
    /// It had been promoted, and that lease has ended since.
    GrantEnded(EndedGrant),
    /// It is neither queued nor granted (unknown, or already cancelled).
    NotWaiting,
}

/// The result of applying one log entry (the raft response type).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// The lock was granted (now, or earlier for a retried request id).
    Granted(Grant),
    /// The request is in the wait queue.
    Queued {
        /// The lease id it will get when promoted.
        lease_id: LeaseId,
        /// 1-based position in the queue.
        position: u32,
    },
    /// Nothing changed, for this reason.
    Rejected(Rejection),
    /// The lease was extended.
    Renewed {
        /// The lease's token.
        token: FencingToken,
        /// Lease length.
        ttl_ms: u64,
    },
    /// The lease no longer holds the lock.
    Released {
        /// Whether this command is the one that freed it.
        was_holder: bool,
    },
    /// Result of an Expire command.
    Expired {
        /// Whether the lease was current (and not renewed since) and is now ended.
        expired: bool,
    },
    /// Result of a CancelWait command.
    WaitCancel(CancelOutcome),
    /// Result of a ForceRelease command.
    ForceReleased {
        /// Token of the lease that was freed, if the lock was held.
        released_token: Option<FencingToken>,
    },
    /// Result of a PruneDedup command.
    Pruned {
        /// Dedup records removed.
        dedup: u64,
        /// Ended-lease records removed.
        ended: u64,
    },
    /// A blank or membership entry.
    Noop,
    /// Result of a RegisterSigningKey or RetireSigningKey command.
    SigningKey(KeyChange),
}

impl Outcome {
    /// Short name for logs (no lease ids: they are capabilities).
    pub fn name(&self) -> &'static str {
        match self {
            Self::Granted(_) => "granted",
            Self::Queued { .. } => "queued",
            Self::Rejected(Rejection::LockHeld { .. }) => "rejected: lock held",
            Self::Rejected(Rejection::TooManyWaiters { .. }) => "rejected: too many waiters",
            Self::Rejected(Rejection::NotHolder) => "rejected: not holder",
            Self::Rejected(Rejection::LeaseExpired) => "rejected: lease expired",
            Self::Rejected(Rejection::RequestIdReused(_)) => "rejected: request id reused",
            Self::Rejected(Rejection::LeaseEnded(_)) => "rejected: the grant's lease has ended",
            Self::Rejected(Rejection::WaitCancelled) => "rejected: wait cancelled",
            Self::Rejected(Rejection::TenantLimit { .. }) => "rejected: tenant limit",
            Self::Renewed { .. } => "renewed",
            Self::Released { was_holder: true } => "released",
            Self::Released { was_holder: false } => "already released",
            Self::Expired { expired: true } => "expired",
            Self::Expired { expired: false } => "not expired (renewed meanwhile)",
            Self::WaitCancel(CancelOutcome::Cancelled) => "wait cancelled",
            Self::WaitCancel(CancelOutcome::AlreadyGranted(_)) => "wait already granted",
            Self::WaitCancel(CancelOutcome::GrantEnded(_)) => "wait granted, lease ended since",
            Self::WaitCancel(CancelOutcome::NotWaiting) => "not waiting",
            Self::ForceReleased { released_token: Some(_) } => "force-released",
            Self::ForceReleased { released_token: None } => "force-release of a free lock",
            Self::Pruned { .. } => "pruned",
            Self::Noop => "noop",
            Self::SigningKey(KeyChange::Registered) => "signing key registered",
            Self::SigningKey(KeyChange::AlreadyRegistered) => "signing key already registered",
            Self::SigningKey(KeyChange::Retired { .. }) => "signing key retired",
            Self::SigningKey(KeyChange::Refused(_)) => "signing key change refused",
        }
    }
}

/// What a signing-key command did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum KeyChange {
    /// The key is now registered.
    Registered,
    /// The same key (id, node and public key) was registered already: nothing changed.
    AlreadyRegistered,
    /// The key's validity now ends at this time (the earlier of the old and new end).
    Retired {
        /// End of validity, Unix milliseconds (exclusive).
        not_after_unix_ms: u64,
    },
    /// Nothing changed, for this reason.
    Refused(KeyRefusal),
}

/// Why a signing-key command changed nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum KeyRefusal {
    /// Another key (other node or other public key) has this id.
    KeyIdTaken,
    /// The public key is not a valid, strong Ed25519 point.
    WeakPublicKey,
    /// The cluster holds [`MAX_KEYS`] keys already (a proxy key set holds no more).
    TooManyKeys,
    /// No key has this id.
    UnknownKey,
    /// The end would not be after the key's start.
    EmptyWindow {
        /// The key's start.
        not_before_unix_ms: u64,
    },
}

impl std::fmt::Display for KeyRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::KeyIdTaken => f.write_str("another signing key already has this key id"),
            Self::WeakPublicKey => f.write_str("the public key is not a valid, strong Ed25519 key"),
            Self::TooManyKeys => {
                write!(f, "the cluster holds {MAX_KEYS} signing keys already (a proxy key set holds no more)")
            }
            Self::UnknownKey => f.write_str("no signing key has this key id"),
            Self::EmptyWindow { not_before_unix_ms } => {
                write!(f, "the key is valid only from {not_before_unix_ms} (Unix ms); its end must be after that")
            }
        }
    }
}

/// What an apply did, for the node's lease clock, parked calls and audit log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A lease started (immediate grant or promotion from the queue).
    LeaseStarted {
        /// The lock.
        resource: ResourceName,
        /// The lease.
        lease_id: LeaseId,
        /// Its token (= the index of the entry).
        token: FencingToken,
        /// Its ttl.
        ttl_ms: u64,
        /// The request that gets it.
        request_id: RequestId,
        /// Who holds it now.
        holder: Holder,
        /// Whether it came from the queue.
        waited: bool,
    },
    /// A lease was renewed at `index`.
    LeaseRenewed {
        /// The lock.
        resource: ResourceName,
        /// The lease.
        lease_id: LeaseId,
        /// Its token.
        token: FencingToken,
        /// Who holds it.
        holder: Holder,
        /// Its ttl.
        ttl_ms: u64,
        /// The index of the renewal.
        index: u64,
    },
    /// A lease ended.
    LeaseEnded {
        /// The lock.
        resource: ResourceName,
        /// The lease.
        lease_id: LeaseId,
        /// Its token.
        token: FencingToken,
        /// Who held it.
        holder: Holder,
        /// Leader wall time of its grant, so the hold time is
        /// `at_ms - granted_at_ms` of the ending entry.
        granted_at_ms: u64,
        /// How.
        reason: EndReason,
    },
    /// A request joined a queue.
    WaiterQueued {
        /// The lock.
        resource: ResourceName,
        /// The request.
        request_id: RequestId,
    },
    /// An acquire was answered from the dedup table (a retry, I7).
    DedupHit {
        /// The request.
        request_id: RequestId,
    },
    /// A signing key was registered.
    SigningKeyRegistered {
        /// The key id.
        kid: KeyId,
        /// The record now in the state.
        key: SigningKeyRecord,
    },
    /// A signing key's end of validity was set or moved earlier.
    SigningKeyRetired {
        /// The key id.
        kid: KeyId,
        /// The record now in the state.
        key: SigningKeyRecord,
    },
    /// A queued request left the queue without being granted.
    WaiterCancelled {
        /// The lock.
        resource: ResourceName,
        /// The request.
        request_id: RequestId,
        /// Who waited.
        holder: Holder,
        /// The lease id it would have got.
        lease_id: LeaseId,
    },
}

/// The result of [`LockState::apply`](super::LockState::apply).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// The response for the proposer.
    pub outcome: Outcome,
    /// What changed, in order.
    pub events: Vec<Event>,
}
