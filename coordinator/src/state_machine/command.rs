//! The log entry and its commands (DESIGN §3.1): what the leader proposes,
//! with everything that varies between nodes (lease ids, wall time, policy
//! limits) chosen before proposing.

use std::fmt;

use serde::{Deserialize, Serialize};

use fencer_token::KeyId;

use super::record::Waiter;
use crate::types::{AuditText, Holder, LeaseId, NodeId, RequestId, ResourceName};

/// One entry of the replicated log: a command and the leader's wall-clock time
/// when it proposed it. The time is used only for the audit trail and for dedup
/// retention, never for lease safety.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogCommand {
    /// Leader wall-clock time at proposal, milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// What to do.
    pub cmd: Command,
}

impl fmt::Display for LogCommand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} @{}", self.cmd.name(), self.at_ms)
    }
}

/// The commands of DESIGN §3.1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Take the lock, or join its FIFO queue when `wait` is set.
    Acquire(AcquireCmd),
    /// Extend the current lease.
    Renew {
        /// The lock.
        resource: ResourceName,
        /// The lease to extend.
        lease_id: LeaseId,
    },
    /// Give up the current lease.
    Release {
        /// The lock.
        resource: ResourceName,
        /// The lease to end.
        lease_id: LeaseId,
    },
    /// End a lease whose deadline passed on the leader. Ignored unless the
    /// lease is current and has not been renewed since `basis_index`.
    Expire {
        /// The lock.
        resource: ResourceName,
        /// The lease to end.
        lease_id: LeaseId,
        /// The log index of the grant or renewal the leader's deadline counted from.
        basis_index: u64,
    },
    /// Take a queued request out of the queue (wait timeout, disconnect).
    CancelWait {
        /// The lock.
        resource: ResourceName,
        /// The queued request.
        request_id: RequestId,
    },
    /// Free the lock whoever holds it (operator action, audited).
    ForceRelease {
        /// The lock.
        resource: ResourceName,
        /// Who asked, as the operator's tool reported it (for the audit log).
        caller: AuditText,
        /// Why, in the operator's words (for the audit log).
        reason: AuditText,
    },
    /// Forget dedup and ended-lease records proposed before `older_than_ms`.
    PruneDedup {
        /// Wall-clock cut-off, milliseconds since the Unix epoch.
        older_than_ms: u64,
    },
    /// An Acquire counted against a tenant's quota (docs/security.md,
    /// "Tenants"): as [`Command::Acquire`], but refused with
    /// [`Rejection::TenantLimit`](super::Rejection::TenantLimit) when granting would hold more than
    /// `quota.max_active_locks` locks, or queueing would park more than
    /// `quota.max_waiters` waiters, under `quota.prefix`. Counted from the
    /// state at apply, so the limits are exact on every node.
    AcquireInQuota {
        /// The acquire.
        acquire: AcquireCmd,
        /// The tenant's limits, from the leader's tenants file.
        quota: Quota,
    },
    /// Make a node's token-signing public key known to the cluster (DESIGN
    /// P7). The secret half never leaves the node that made it; a leader
    /// signs only with a key of its own registered here.
    RegisterSigningKey {
        /// The key id tokens name (`kid`).
        kid: KeyId,
        /// The node that holds the secret key.
        node_id: NodeId,
        /// The Ed25519 public key.
        public_key: [u8; 32],
        /// Start of validity, Unix milliseconds (chosen by the node that made it).
        not_before_unix_ms: u64,
    },
    /// End a signing key's validity at `not_after_unix_ms` (exclusive).
    /// Only ever moves the end earlier.
    RetireSigningKey {
        /// The key.
        kid: KeyId,
        /// End of validity, Unix milliseconds.
        not_after_unix_ms: u64,
    },
}

/// What an acquire asks for, the same in [`Command::Acquire`] and
/// [`Command::AcquireInQuota`]. The fields are encoded in this order, as
/// the two commands carried them before they shared this struct (postcard
/// does not mark where a struct begins), so log entries keep their bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcquireCmd {
    /// The caller's id for this attempt (I7).
    pub request_id: RequestId,
    /// The lock.
    pub resource: ResourceName,
    /// Who asks, for humans.
    pub holder: Holder,
    /// Lease length.
    pub ttl_ms: u64,
    /// Queue when the lock is held instead of failing with LOCK_HELD.
    pub wait: bool,
    /// The lease id this request gets if granted, chosen by the leader.
    pub lease_id: LeaseId,
    /// The queue limit for this resource, from the leader's policy.
    pub max_waiters: u32,
}

impl AcquireCmd {
    /// The request as it waits in a queue (and as it holds the lock once granted).
    pub(super) fn waiter(&self) -> Waiter {
        Waiter {
            request_id: self.request_id.clone(),
            holder: self.holder.clone(),
            ttl_ms: self.ttl_ms,
            lease_id: self.lease_id,
        }
    }
}

/// A tenant's limits as carried in an [`Command::AcquireInQuota`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quota {
    /// The tenant's namespace: every resource starting with it counts.
    pub prefix: String,
    /// Held locks under the prefix, at most.
    pub max_active_locks: Option<u64>,
    /// Queued requests under the prefix, at most.
    pub max_waiters: Option<u64>,
}

impl Command {
    /// Short name for logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Acquire(_) | Self::AcquireInQuota { .. } => "acquire",
            Self::Renew { .. } => "renew",
            Self::Release { .. } => "release",
            Self::Expire { .. } => "expire",
            Self::CancelWait { .. } => "cancel_wait",
            Self::ForceRelease { .. } => "force_release",
            Self::PruneDedup { .. } => "prune_dedup",
            Self::RegisterSigningKey { .. } => "register_signing_key",
            Self::RetireSigningKey { .. } => "retire_signing_key",
        }
    }

    /// The resource the command is about, if any.
    pub fn resource(&self) -> Option<&ResourceName> {
        match self {
            Self::Acquire(AcquireCmd { resource, .. })
            | Self::AcquireInQuota { acquire: AcquireCmd { resource, .. }, .. }
            | Self::Renew { resource, .. }
            | Self::Release { resource, .. }
            | Self::Expire { resource, .. }
            | Self::CancelWait { resource, .. }
            | Self::ForceRelease { resource, .. } => Some(resource),
            Self::PruneDedup { .. } | Self::RegisterSigningKey { .. } | Self::RetireSigningKey { .. } => None,
        }
    }

    /// The acquire a command asks for, quota or not.
    pub fn acquire(&self) -> Option<&AcquireCmd> {
        match self {
            Self::Acquire(a) | Self::AcquireInQuota { acquire: a, .. } => Some(a),
            _ => None,
        }
    }
}
