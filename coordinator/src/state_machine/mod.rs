//! The replicated lock state machine (DESIGN §3.1): a pure, deterministic
//! [`LockState::apply`] over plain data. No clocks, no randomness, no I/O:
//! everything that varies between nodes (lease ids, wall time, policy limits)
//! is chosen by the leader and carried inside the [`LogCommand`].
//!
//! Besides its [`Outcome`], each apply reports [`Event`]s (a lease started,
//! was renewed, ended; a waiter left the queue) for the node's lease clock,
//! parked calls and audit log, and records which keys it changed in
//! [`Changes`] so the store can persist exactly those.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;

use serde::{Deserialize, Serialize};

use fencer_token::{KeyId, MAX_KEYS, PublicKey};

use crate::types::{AuditText, FencingToken, Holder, LeaseId, NodeId, RequestId, ResourceName};

#[cfg(test)]
mod model_tests;

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
    Acquire {
        /// The caller's id for this attempt (I7).
        request_id: RequestId,
        /// The lock.
        resource: ResourceName,
        /// Who asks, for humans.
        holder: Holder,
        /// Lease length.
        ttl_ms: u64,
        /// Queue when the lock is held instead of failing with LOCK_HELD.
        wait: bool,
        /// The lease id this request gets if granted, chosen by the leader.
        lease_id: LeaseId,
        /// The queue limit for this resource, from the leader's policy.
        max_waiters: u32,
    },
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
    /// [`Rejection::TenantLimit`] when granting would hold more than
    /// `quota.max_active_locks` locks, or queueing would park more than
    /// `quota.max_waiters` waiters, under `quota.prefix`. Counted from the
    /// state at apply, so the limits are exact on every node.
    AcquireInQuota {
        /// The caller's id for this attempt (I7).
        request_id: RequestId,
        /// The lock.
        resource: ResourceName,
        /// Who asks, for humans.
        holder: Holder,
        /// Lease length.
        ttl_ms: u64,
        /// Queue when the lock is held instead of failing with LOCK_HELD.
        wait: bool,
        /// The lease id this request gets if granted, chosen by the leader.
        lease_id: LeaseId,
        /// The queue limit for this resource, from the leader's policy.
        max_waiters: u32,
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

impl Command {
    /// Short name for logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Acquire { .. } | Self::AcquireInQuota { .. } => "acquire",
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
            Self::Acquire { resource, .. }
            | Self::AcquireInQuota { resource, .. }
            | Self::Renew { resource, .. }
            | Self::Release { resource, .. }
            | Self::Expire { resource, .. }
            | Self::CancelWait { resource, .. }
            | Self::ForceRelease { resource, .. } => Some(resource),
            Self::PruneDedup { .. } | Self::RegisterSigningKey { .. } | Self::RetireSigningKey { .. } => None,
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
    /// The request id was first used for another resource.
    RequestIdReused,
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

/// What happened to a queued request when its wait was cancelled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CancelOutcome {
    /// It was still queued and is now out of the queue.
    Cancelled,
    /// It had been promoted first: the caller holds the lock.
    AlreadyGranted(Grant),
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

/// A token-signing public key the cluster knows (DESIGN P7), as replicated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SigningKeyRecord {
    /// The node that holds the secret key and signs with it.
    pub node_id: NodeId,
    /// The Ed25519 public key.
    pub public_key: [u8; 32],
    /// Start of validity, Unix milliseconds.
    pub not_before_unix_ms: u64,
    /// End of validity (exclusive), Unix milliseconds; `None`: no end yet.
    pub not_after_unix_ms: Option<u64>,
    /// Index of the entry that registered it.
    pub registered_index: u64,
    /// Leader wall time of that entry.
    pub registered_at_ms: u64,
}

impl SigningKeyRecord {
    /// Whether a token issued at `at_ms` may be signed with this key: inside
    /// `[not_before, not_after)`.
    pub fn valid_at(&self, at_ms: u64) -> bool {
        self.not_before_unix_ms <= at_ms && self.not_after_unix_ms.is_none_or(|end| at_ms < end)
    }
}

/// The key a node signs with at `now_ms`: among the keys of `node_id` in
/// `keys` that are valid now and pass `usable` (the node holds its secret),
/// the one that became valid last (ties: the larger key id). Every node and
/// `fencer keys list` choose the same way.
pub fn current_signing_key(
    keys: &BTreeMap<KeyId, SigningKeyRecord>,
    node_id: NodeId,
    now_ms: u64,
    mut usable: impl FnMut(&KeyId) -> bool,
) -> Option<(&KeyId, &SigningKeyRecord)> {
    keys.iter()
        .filter(|(kid, k)| k.node_id == node_id && k.valid_at(now_ms) && usable(kid))
        .max_by(|(ka, a), (kb, b)| a.not_before_unix_ms.cmp(&b.not_before_unix_ms).then_with(|| ka.cmp(kb)))
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
            Self::Rejected(Rejection::RequestIdReused) => "rejected: request id reused",
            Self::Rejected(Rejection::WaitCancelled) => "rejected: wait cancelled",
            Self::Rejected(Rejection::TenantLimit { .. }) => "rejected: tenant limit",
            Self::Renewed { .. } => "renewed",
            Self::Released { was_holder: true } => "released",
            Self::Released { was_holder: false } => "already released",
            Self::Expired { expired: true } => "expired",
            Self::Expired { expired: false } => "not expired (renewed meanwhile)",
            Self::WaitCancel(CancelOutcome::Cancelled) => "wait cancelled",
            Self::WaitCancel(CancelOutcome::AlreadyGranted(_)) => "wait already granted",
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

/// How a lease ended, remembered (until pruned) to tell LEASE_EXPIRED from NOT_HOLDER.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EndReason {
    /// Released by its holder.
    Released,
    /// Expired on the leader's clock.
    Expired,
    /// Freed by an operator.
    ForceReleased,
}

impl EndReason {
    /// Lowercase name for logs and the audit trail.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Released => "released",
            Self::Expired => "expired",
            Self::ForceReleased => "force_released",
        }
    }
}

/// The current lease of a resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockRecord {
    /// The lease's id.
    pub lease_id: LeaseId,
    /// Who holds it.
    pub holder: Holder,
    /// Its fencing token.
    pub token: FencingToken,
    /// Lease length.
    pub ttl_ms: u64,
    /// The request that created it.
    pub request_id: RequestId,
    /// Index of the grant or the latest renewal.
    pub renewed_index: u64,
    /// Leader wall time of the grant, for humans.
    pub granted_at_ms: u64,
}

/// A queued acquire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Waiter {
    /// The queued request.
    pub request_id: RequestId,
    /// Who waits.
    pub holder: Holder,
    /// Lease length once granted.
    pub ttl_ms: u64,
    /// Lease id once granted.
    pub lease_id: LeaseId,
}

/// Lock and queue of one resource. Deleted when both are empty.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceState {
    /// The current lease, if any.
    pub lock: Option<LockRecord>,
    /// FIFO of waiting requests.
    pub waiters: VecDeque<Waiter>,
}

impl ResourceState {
    fn is_idle(&self) -> bool {
        self.lock.is_none() && self.waiters.is_empty()
    }
}

/// What a request id led to, kept for retries (I7).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DedupOutcome {
    /// Granted this lease and token.
    Granted {
        /// The lease.
        lease_id: LeaseId,
        /// Its token.
        token: FencingToken,
        /// Its ttl.
        ttl_ms: u64,
        /// Granted from the queue.
        waited: bool,
    },
    /// Queued with this future lease id.
    Queued {
        /// The lease id it gets when promoted.
        lease_id: LeaseId,
    },
    /// Refused because the lock was held.
    LockHeld,
    /// Refused because the queue was full.
    TooManyWaiters {
        /// The limit.
        limit: u32,
    },
    /// Queued, then cancelled before promotion.
    WaitCancelled,
}

/// A dedup record: the outcome of a request id. Kept compact (one is kept
/// per acquire for the retention period): the resource is remembered only as
/// a [`ResourceHash`], enough to refuse a request id reused elsewhere.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DedupRecord {
    /// Which resource the request id was used for.
    pub resource: ResourceHash,
    /// What it led to.
    pub outcome: DedupOutcome,
    /// Leader wall time of the entry that last changed the outcome (first
    /// seen, promoted or cancelled); retention counts from it.
    pub at_ms: u64,
}

/// A stable 64-bit FNV-1a hash of a resource name: the same on every node and
/// every version, so it may be persisted and replicated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ResourceHash(pub u64);

impl ResourceHash {
    /// Hashes a resource name.
    pub fn of(name: &ResourceName) -> Self {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in name.as_str().bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        Self(h)
    }
}

/// The dedup table's key for a request id: the first 128 bits of its SHA-256.
///
/// The table holds one record per acquire for the retention period (~240,000
/// at the seed rate), so it keys by 16 inline bytes rather than the id's own
/// heap-allocated text (8–128 bytes). A cryptographic hash, not a fast one:
/// two request ids that collide would share a record, and with SHA-256 no one
/// can make them collide on purpose. Stable across nodes and versions, so it
/// is persisted (state file, snapshots) and every node computes the same.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RequestKey([u8; 16]);

impl RequestKey {
    /// The key of a request id.
    pub fn of(id: &RequestId) -> Self {
        use sha2::Digest as _;
        let digest = sha2::Sha256::digest(id.as_str().as_bytes());
        let mut key = [0u8; 16];
        key.copy_from_slice(&digest[..16]);
        Self(key)
    }

    /// The key as a number (big-endian), the form the state file stores.
    pub const fn to_u128(self) -> u128 {
        u128::from_be_bytes(self.0)
    }

    /// A key read back from its stored number.
    pub const fn from_u128(v: u128) -> Self {
        Self(v.to_be_bytes())
    }
}

impl std::fmt::Debug for RequestKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RequestKey({:032x})", self.to_u128())
    }
}

/// Remembers how a lease ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndedLease {
    /// Its resource.
    pub resource: ResourceHash,
    /// How it ended.
    pub reason: EndReason,
    /// Index of the entry that ended it.
    pub index: u64,
    /// Leader wall time of that entry.
    pub at_ms: u64,
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

/// Keys changed since the store last drained them.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Changes {
    /// Resources whose record changed (now present or deleted).
    pub resources: BTreeSet<ResourceName>,
    /// Dedup keys inserted or updated.
    pub dedup_put: BTreeSet<RequestKey>,
    /// Dedup keys removed.
    pub dedup_del: BTreeSet<RequestKey>,
    /// Ended-lease keys inserted.
    pub ended_put: BTreeSet<LeaseId>,
    /// Ended-lease keys removed.
    pub ended_del: BTreeSet<LeaseId>,
    /// Signing keys registered or changed.
    pub signing_keys: BTreeSet<KeyId>,
}

impl Changes {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.resources.is_empty()
            && self.dedup_put.is_empty()
            && self.dedup_del.is_empty()
            && self.ended_put.is_empty()
            && self.ended_del.is_empty()
            && self.signing_keys.is_empty()
    }
}

/// The result of [`LockState::apply`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// The response for the proposer.
    pub outcome: Outcome,
    /// What changed, in order.
    pub events: Vec<Event>,
}

/// The whole replicated lock state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockState {
    resources: BTreeMap<ResourceName, ResourceState>,
    /// Request-id and ended-lease records (~240,000 each at the seed rate).
    /// B-trees, not hash maps: a hash map sizes itself to a power of two
    /// and sat at 46 % full at the seed rate (38 + 26 MB); B-tree nodes
    /// grow with the record count (~25 + 16 MB), and lookups stay cheap
    /// next to a raft round trip.
    dedup: BTreeMap<RequestKey, DedupRecord>,
    ended: BTreeMap<LeaseId, EndedLease>,
    /// Token-signing public keys (DESIGN P7), by key id.
    #[serde(default)]
    signing_keys: BTreeMap<KeyId, SigningKeyRecord>,
    /// Total queued requests over all resources.
    waiter_count: u64,
    /// Total held locks.
    lock_count: u64,
    #[serde(skip)]
    changes: Changes,
}

impl LockState {
    /// An empty state.
    pub fn new() -> Self {
        Self::default()
    }

    /// Rebuilds a state from its persisted parts.
    pub fn from_parts(
        resources: BTreeMap<ResourceName, ResourceState>,
        dedup: BTreeMap<RequestKey, DedupRecord>,
        ended: BTreeMap<LeaseId, EndedLease>,
    ) -> Self {
        let lock_count = resources.values().filter(|r| r.lock.is_some()).count() as u64;
        let waiter_count = resources.values().map(|r| r.waiters.len() as u64).sum();
        Self {
            resources,
            dedup,
            ended,
            signing_keys: BTreeMap::new(),
            waiter_count,
            lock_count,
            changes: Changes::default(),
        }
    }

    /// The same state with these signing keys (rebuilding a persisted state).
    pub fn with_signing_keys(mut self, keys: BTreeMap<KeyId, SigningKeyRecord>) -> Self {
        self.signing_keys = keys;
        self
    }

    /// The registered signing keys, by key id.
    pub fn signing_keys(&self) -> &BTreeMap<KeyId, SigningKeyRecord> {
        &self.signing_keys
    }

    /// Lock and queue of one resource.
    pub fn resource(&self, name: &ResourceName) -> Option<&ResourceState> {
        self.resources.get(name)
    }

    /// All resources with a lock or waiters, in name order.
    pub fn resources(&self) -> &BTreeMap<ResourceName, ResourceState> {
        &self.resources
    }

    /// The dedup record of a request id.
    pub fn dedup(&self, id: &RequestId) -> Option<&DedupRecord> {
        self.dedup.get(&RequestKey::of(id))
    }

    /// The dedup record under a key.
    pub fn dedup_by_key(&self, key: &RequestKey) -> Option<&DedupRecord> {
        self.dedup.get(key)
    }

    /// All dedup records.
    pub fn dedup_records(&self) -> &BTreeMap<RequestKey, DedupRecord> {
        &self.dedup
    }

    /// How a lease ended, if remembered.
    pub fn ended(&self, id: &LeaseId) -> Option<&EndedLease> {
        self.ended.get(id)
    }

    /// All ended-lease records.
    pub fn ended_records(&self) -> &BTreeMap<LeaseId, EndedLease> {
        &self.ended
    }

    /// Number of held locks.
    pub fn lock_count(&self) -> u64 {
        self.lock_count
    }

    /// Number of queued requests.
    pub fn waiter_count(&self) -> u64 {
        self.waiter_count
    }

    /// Takes the keys changed since the last call.
    pub fn take_changes(&mut self) -> Changes {
        std::mem::take(&mut self.changes)
    }

    /// Applies the entry at log `index`. Deterministic: the same state, index
    /// and command always give the same result on every node.
    pub fn apply(&mut self, index: u64, entry: &LogCommand) -> Applied {
        let mut events = Vec::new();
        let at_ms = entry.at_ms;
        let outcome = match &entry.cmd {
            Command::Acquire { request_id, resource, holder, ttl_ms, wait, lease_id, max_waiters } => self.acquire(
                index,
                at_ms,
                (request_id, RequestKey::of(request_id)),
                resource,
                holder,
                *ttl_ms,
                *wait,
                *lease_id,
                *max_waiters,
                &mut events,
            ),
            Command::AcquireInQuota { request_id, resource, holder, ttl_ms, wait, lease_id, max_waiters, quota } => {
                let key = RequestKey::of(request_id);
                match self.over_quota(&key, resource, *wait, quota) {
                    Some((limit, value)) => Outcome::Rejected(Rejection::TenantLimit { limit, value }),
                    None => self.acquire(
                        index,
                        at_ms,
                        (request_id, key),
                        resource,
                        holder,
                        *ttl_ms,
                        *wait,
                        *lease_id,
                        *max_waiters,
                        &mut events,
                    ),
                }
            }
            Command::Renew { resource, lease_id } => self.renew(index, resource, lease_id, &mut events),
            Command::Release { resource, lease_id } => self.release(index, at_ms, resource, lease_id, &mut events),
            Command::Expire { resource, lease_id, basis_index } => {
                let current = self
                    .current_lock(resource)
                    .is_some_and(|l| l.lease_id == *lease_id && l.renewed_index == *basis_index);
                if current {
                    self.end_lease(index, at_ms, resource, EndReason::Expired, &mut events);
                }
                Outcome::Expired { expired: current }
            }
            Command::CancelWait { resource, request_id } => self.cancel_wait(at_ms, resource, request_id, &mut events),
            Command::ForceRelease { resource, .. } => {
                let token = self.current_lock(resource).map(|l| l.token);
                if token.is_some() {
                    self.end_lease(index, at_ms, resource, EndReason::ForceReleased, &mut events);
                }
                Outcome::ForceReleased { released_token: token }
            }
            Command::PruneDedup { older_than_ms } => self.prune(*older_than_ms),
            Command::RegisterSigningKey { kid, node_id, public_key, not_before_unix_ms } => Outcome::SigningKey(
                self.register_key(index, at_ms, kid, *node_id, public_key, *not_before_unix_ms, &mut events),
            ),
            Command::RetireSigningKey { kid, not_after_unix_ms } => {
                Outcome::SigningKey(self.retire_key(kid, *not_after_unix_ms, &mut events))
            }
        };
        Applied { outcome, events }
    }

    /// The tenant limit an Acquire would break, if any. A retried request
    /// id is never refused here: its recorded outcome stands (I7).
    fn over_quota(
        &self,
        key: &RequestKey,
        resource: &ResourceName,
        wait: bool,
        quota: &Quota,
    ) -> Option<(QuotaLimit, u64)> {
        if self.dedup.contains_key(key) {
            return None;
        }
        let prefix = quota.prefix.as_str();
        match self.current_lock(resource) {
            None => {
                let max = quota.max_active_locks?;
                let held = if prefix.is_empty() {
                    self.lock_count
                } else {
                    self.count_under(prefix, max, |r| u64::from(r.lock.is_some()))
                };
                (held >= max).then_some((QuotaLimit::ActiveLocks, max))
            }
            Some(_) if wait => {
                let max = quota.max_waiters?;
                let queued = if prefix.is_empty() {
                    self.waiter_count
                } else {
                    self.count_under(prefix, max, |r| r.waiters.len() as u64)
                };
                (queued >= max).then_some((QuotaLimit::Waiters, max))
            }
            Some(_) => None,
        }
    }

    /// Sums `count` over the resources under `prefix`, stopping once the sum
    /// reaches `stop_at` (so a check costs at most the limit's worth of entries).
    fn count_under(&self, prefix: &str, stop_at: u64, count: impl Fn(&ResourceState) -> u64) -> u64 {
        let mut n = 0u64;
        for (_, r) in self.resources_under(prefix) {
            n += count(r);
            if n >= stop_at {
                break;
            }
        }
        n
    }

    /// Resources whose name starts with `prefix`, in name order.
    fn resources_under<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = (&'a ResourceName, &'a ResourceState)> {
        use std::ops::Bound;
        self.resources
            .range::<str, _>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(move |(n, _)| n.as_str().starts_with(prefix))
    }

    fn current_lock(&self, resource: &ResourceName) -> Option<&LockRecord> {
        self.resources.get(resource).and_then(|r| r.lock.as_ref())
    }

    #[allow(clippy::too_many_arguments)]
    fn acquire(
        &mut self,
        index: u64,
        at_ms: u64,
        (request_id, key): (&RequestId, RequestKey),
        resource: &ResourceName,
        holder: &Holder,
        ttl_ms: u64,
        wait: bool,
        lease_id: LeaseId,
        max_waiters: u32,
        events: &mut Vec<Event>,
    ) -> Outcome {
        if let Some(record) = self.dedup.get(&key) {
            events.push(Event::DedupHit { request_id: request_id.clone() });
            return self.replay(request_id, record, resource);
        }
        let state = self.resources.entry(resource.clone()).or_default();
        let (outcome, dedup) = match &state.lock {
            None => {
                state.lock = Some(LockRecord {
                    lease_id,
                    holder: holder.clone(),
                    token: FencingToken(index),
                    ttl_ms,
                    request_id: request_id.clone(),
                    renewed_index: index,
                    granted_at_ms: at_ms,
                });
                self.lock_count += 1;
                events.push(Event::LeaseStarted {
                    resource: resource.clone(),
                    lease_id,
                    token: FencingToken(index),
                    ttl_ms,
                    request_id: request_id.clone(),
                    holder: holder.clone(),
                    waited: false,
                });
                let grant =
                    Grant { resource: resource.clone(), lease_id, token: FencingToken(index), ttl_ms, waited: false };
                (
                    Outcome::Granted(grant),
                    DedupOutcome::Granted { lease_id, token: FencingToken(index), ttl_ms, waited: false },
                )
            }
            Some(lock) if !wait => (
                Outcome::Rejected(Rejection::LockHeld { holder: lock.holder.clone(), token: lock.token }),
                DedupOutcome::LockHeld,
            ),
            Some(_) if state.waiters.len() >= max_waiters as usize => (
                Outcome::Rejected(Rejection::TooManyWaiters { limit: max_waiters }),
                DedupOutcome::TooManyWaiters { limit: max_waiters },
            ),
            Some(_) => {
                state.waiters.push_back(Waiter {
                    request_id: request_id.clone(),
                    holder: holder.clone(),
                    ttl_ms,
                    lease_id,
                });
                self.waiter_count += 1;
                events.push(Event::WaiterQueued { resource: resource.clone(), request_id: request_id.clone() });
                (Outcome::Queued { lease_id, position: state.waiters.len() as u32 }, DedupOutcome::Queued { lease_id })
            }
        };
        // A refusal may have created an empty entry above; idle records are deleted.
        if self.resources.get(resource).is_some_and(ResourceState::is_idle) {
            self.resources.remove(resource);
        } else {
            self.changes.resources.insert(resource.clone());
        }
        self.dedup.insert(key, DedupRecord { resource: ResourceHash::of(resource), outcome: dedup, at_ms });
        self.changes.dedup_put.insert(key);
        outcome
    }

    /// The original outcome of a retried request id (I7).
    fn replay(&self, request_id: &RequestId, record: &DedupRecord, resource: &ResourceName) -> Outcome {
        if record.resource != ResourceHash::of(resource) {
            return Outcome::Rejected(Rejection::RequestIdReused);
        }
        match &record.outcome {
            DedupOutcome::Granted { lease_id, token, ttl_ms, waited } => Outcome::Granted(Grant {
                resource: resource.clone(),
                lease_id: *lease_id,
                token: *token,
                ttl_ms: *ttl_ms,
                waited: *waited,
            }),
            DedupOutcome::Queued { lease_id } => {
                let position = self
                    .resources
                    .get(resource)
                    .and_then(|r| r.waiters.iter().position(|w| &w.request_id == request_id))
                    .map_or(0, |p| p as u32 + 1);
                Outcome::Queued { lease_id: *lease_id, position }
            }
            DedupOutcome::LockHeld => {
                let (holder, token) = self
                    .current_lock(resource)
                    .map(|l| (l.holder.clone(), l.token))
                    .unwrap_or((Holder::default(), FencingToken(0)));
                Outcome::Rejected(Rejection::LockHeld { holder, token })
            }
            DedupOutcome::TooManyWaiters { limit } => Outcome::Rejected(Rejection::TooManyWaiters { limit: *limit }),
            DedupOutcome::WaitCancelled => Outcome::Rejected(Rejection::WaitCancelled),
        }
    }

    fn not_current(&self, resource: &ResourceName, lease_id: &LeaseId) -> Rejection {
        match self.ended.get(lease_id) {
            Some(e) if e.reason != EndReason::Released && e.resource == ResourceHash::of(resource) => {
                Rejection::LeaseExpired
            }
            _ => Rejection::NotHolder,
        }
    }

    fn renew(&mut self, index: u64, resource: &ResourceName, lease_id: &LeaseId, events: &mut Vec<Event>) -> Outcome {
        let Some(lock) = self.resources.get_mut(resource).and_then(|r| r.lock.as_mut()) else {
            return Outcome::Rejected(self.not_current(resource, lease_id));
        };
        if lock.lease_id != *lease_id {
            return Outcome::Rejected(self.not_current(resource, lease_id));
        }
        lock.renewed_index = index;
        let (token, ttl_ms, holder) = (lock.token, lock.ttl_ms, lock.holder.clone());
        self.changes.resources.insert(resource.clone());
        events.push(Event::LeaseRenewed {
            resource: resource.clone(),
            lease_id: *lease_id,
            token,
            holder,
            ttl_ms,
            index,
        });
        Outcome::Renewed { token, ttl_ms }
    }

    fn release(
        &mut self,
        index: u64,
        at_ms: u64,
        resource: &ResourceName,
        lease_id: &LeaseId,
        events: &mut Vec<Event>,
    ) -> Outcome {
        if self.current_lock(resource).is_some_and(|l| l.lease_id == *lease_id) {
            self.end_lease(index, at_ms, resource, EndReason::Released, events);
            return Outcome::Released { was_holder: true };
        }
        match self.ended.get(lease_id) {
            // A retried release of a lease that was released: already done.
            Some(e) if e.reason == EndReason::Released && e.resource == ResourceHash::of(resource) => {
                Outcome::Released { was_holder: false }
            }
            _ => Outcome::Rejected(self.not_current(resource, lease_id)),
        }
    }

    /// Ends the current lease of `resource` and promotes the head waiter, whose
    /// token is this entry's index.
    fn end_lease(
        &mut self,
        index: u64,
        at_ms: u64,
        resource: &ResourceName,
        reason: EndReason,
        events: &mut Vec<Event>,
    ) {
        let Some(state) = self.resources.get_mut(resource) else { return };
        let Some(old) = state.lock.take() else { return };
        self.lock_count -= 1;
        self.ended.insert(old.lease_id, EndedLease { resource: ResourceHash::of(resource), reason, index, at_ms });
        self.changes.ended_put.insert(old.lease_id);
        self.changes.ended_del.remove(&old.lease_id);
        events.push(Event::LeaseEnded {
            resource: resource.clone(),
            lease_id: old.lease_id,
            token: old.token,
            holder: old.holder,
            granted_at_ms: old.granted_at_ms,
            reason,
        });
        if let Some(next) = state.waiters.pop_front() {
            self.waiter_count -= 1;
            let token = FencingToken(index);
            state.lock = Some(LockRecord {
                lease_id: next.lease_id,
                holder: next.holder.clone(),
                token,
                ttl_ms: next.ttl_ms,
                request_id: next.request_id.clone(),
                renewed_index: index,
                granted_at_ms: at_ms,
            });
            self.lock_count += 1;
            let key = RequestKey::of(&next.request_id);
            if let Some(rec) = self.dedup.get_mut(&key) {
                rec.outcome =
                    DedupOutcome::Granted { lease_id: next.lease_id, token, ttl_ms: next.ttl_ms, waited: true };
                rec.at_ms = at_ms;
                self.changes.dedup_put.insert(key);
            }
            events.push(Event::LeaseStarted {
                resource: resource.clone(),
                lease_id: next.lease_id,
                token,
                ttl_ms: next.ttl_ms,
                request_id: next.request_id,
                holder: next.holder,
                waited: true,
            });
        }
        if state.is_idle() {
            self.resources.remove(resource);
        }
        self.changes.resources.insert(resource.clone());
    }

    fn cancel_wait(
        &mut self,
        at_ms: u64,
        resource: &ResourceName,
        request_id: &RequestId,
        events: &mut Vec<Event>,
    ) -> Outcome {
        if let Some(state) = self.resources.get_mut(resource)
            && let Some(pos) = state.waiters.iter().position(|w| &w.request_id == request_id)
        {
            let waiter = state.waiters.remove(pos).expect("position is in the queue");
            self.waiter_count -= 1;
            if state.is_idle() {
                self.resources.remove(resource);
            }
            self.changes.resources.insert(resource.clone());
            let key = RequestKey::of(request_id);
            if let Some(rec) = self.dedup.get_mut(&key) {
                rec.outcome = DedupOutcome::WaitCancelled;
                rec.at_ms = at_ms;
                self.changes.dedup_put.insert(key);
            }
            events.push(Event::WaiterCancelled {
                resource: resource.clone(),
                request_id: request_id.clone(),
                holder: waiter.holder,
                lease_id: waiter.lease_id,
            });
            return Outcome::WaitCancel(CancelOutcome::Cancelled);
        }
        match self.dedup.get(&RequestKey::of(request_id)) {
            Some(DedupRecord {
                resource: r,
                outcome: DedupOutcome::Granted { lease_id, token, ttl_ms, waited },
                ..
            }) if *r == ResourceHash::of(resource) => Outcome::WaitCancel(CancelOutcome::AlreadyGranted(Grant {
                resource: resource.clone(),
                lease_id: *lease_id,
                token: *token,
                ttl_ms: *ttl_ms,
                waited: *waited,
            })),
            _ => Outcome::WaitCancel(CancelOutcome::NotWaiting),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn register_key(
        &mut self,
        index: u64,
        at_ms: u64,
        kid: &KeyId,
        node_id: NodeId,
        public_key: &[u8; 32],
        not_before_unix_ms: u64,
        events: &mut Vec<Event>,
    ) -> KeyChange {
        if let Some(existing) = self.signing_keys.get(kid) {
            return if existing.node_id == node_id && existing.public_key == *public_key {
                KeyChange::AlreadyRegistered
            } else {
                KeyChange::Refused(KeyRefusal::KeyIdTaken)
            };
        }
        // Deterministic: the same bytes give the same answer on every node.
        if PublicKey::from_bytes(public_key).is_err() {
            return KeyChange::Refused(KeyRefusal::WeakPublicKey);
        }
        if self.signing_keys.len() >= MAX_KEYS {
            return KeyChange::Refused(KeyRefusal::TooManyKeys);
        }
        let key = SigningKeyRecord {
            node_id,
            public_key: *public_key,
            not_before_unix_ms,
            not_after_unix_ms: None,
            registered_index: index,
            registered_at_ms: at_ms,
        };
        self.signing_keys.insert(kid.clone(), key.clone());
        self.changes.signing_keys.insert(kid.clone());
        events.push(Event::SigningKeyRegistered { kid: kid.clone(), key });
        KeyChange::Registered
    }

    fn retire_key(&mut self, kid: &KeyId, not_after_unix_ms: u64, events: &mut Vec<Event>) -> KeyChange {
        let Some(key) = self.signing_keys.get_mut(kid) else {
            return KeyChange::Refused(KeyRefusal::UnknownKey);
        };
        if not_after_unix_ms <= key.not_before_unix_ms {
            return KeyChange::Refused(KeyRefusal::EmptyWindow { not_before_unix_ms: key.not_before_unix_ms });
        }
        // The end only ever moves earlier: a retired key never comes back.
        let end = key.not_after_unix_ms.map_or(not_after_unix_ms, |old| old.min(not_after_unix_ms));
        if key.not_after_unix_ms != Some(end) {
            key.not_after_unix_ms = Some(end);
            self.changes.signing_keys.insert(kid.clone());
            events.push(Event::SigningKeyRetired { kid: kid.clone(), key: key.clone() });
        }
        KeyChange::Retired { not_after_unix_ms: end }
    }

    fn prune(&mut self, older_than_ms: u64) -> Outcome {
        let mut dedup_removed = Vec::new();
        self.dedup.retain(|id, rec| {
            // A queued request keeps its record: its retry must find its slot.
            let keep = rec.at_ms >= older_than_ms || matches!(rec.outcome, DedupOutcome::Queued { .. });
            if !keep {
                dedup_removed.push(*id);
            }
            keep
        });
        let mut ended_removed = Vec::new();
        self.ended.retain(|id, rec| {
            let keep = rec.at_ms >= older_than_ms;
            if !keep {
                ended_removed.push(*id);
            }
            keep
        });
        let out = Outcome::Pruned { dedup: dedup_removed.len() as u64, ended: ended_removed.len() as u64 };
        for id in dedup_removed {
            self.changes.dedup_put.remove(&id);
            self.changes.dedup_del.insert(id);
        }
        for id in ended_removed {
            self.changes.ended_put.remove(&id);
            self.changes.ended_del.insert(id);
        }
        out
    }
}
