//! The records of the lock state, as the state file and snapshots hold
//! them: the lock and queue of a resource, what each request id led to
//! (the dedup table, I7), how ended leases ended, and the signing keys.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use fencer_token::KeyId;

use super::outcome::{Event, Grant};
use crate::types::{FencingToken, Holder, LeaseId, NodeId, RequestId, ResourceName};
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
    pub(super) fn is_idle(&self) -> bool {
        self.lock.is_none() && self.waiters.is_empty()
    }

    /// Gives the lock to `request` (a new request, or the head of the queue
    /// when `waited`) by the entry at `index`: the index is its token (I2).
    /// The one place a lease starts, so the lock record, the event and the
    /// grant always agree.
    pub(super) fn grant(
        &mut self,
        resource: &ResourceName,
        index: u64,
        at_ms: u64,
        request: Waiter,
        waited: bool,
        events: &mut Vec<Event>,
    ) -> Grant {
        let Waiter { request_id, holder, ttl_ms, lease_id } = request;
        let token = FencingToken(index);
        events.push(Event::LeaseStarted {
            resource: resource.clone(),
            lease_id,
            token,
            ttl_ms,
            request_id: request_id.clone(),
            holder: holder.clone(),
            waited,
        });
        self.lock = Some(LockRecord {
            lease_id,
            holder,
            token,
            ttl_ms,
            request_id,
            renewed_index: index,
            granted_at_ms: at_ms,
        });
        Grant { resource: resource.clone(), lease_id, token, ttl_ms, waited }
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

impl DedupOutcome {
    /// The record of a grant.
    pub(super) fn granted(g: &Grant) -> Self {
        Self::Granted { lease_id: g.lease_id, token: g.token, ttl_ms: g.ttl_ms, waited: g.waited }
    }
}

/// A dedup record: the outcome of a request id. Kept compact (one is kept
/// per acquire for the retention period): the resource is remembered only as
/// a [`ResourceHash`], and the holder and ttl asked for as an
/// [`AcquireFingerprint`], enough to refuse a request id reused for another
/// request.
///
/// Stored (state file, snapshots) as postcard in two versions: version 1 is
/// `resource, outcome, at_ms`; version 2 appends the fingerprint. A record
/// without a fingerprint (written by a version before 2, or applied by one)
/// is stored as version 1, so its bytes stay what they were; a version-1
/// reader ignores the appended bytes (postcard reads a value's prefix), so
/// nodes of both versions read each other's records and snapshots
/// ([`DedupRecord::to_stored`], [`DedupRecord::from_stored`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DedupRecord {
    /// Which resource the request id was used for.
    pub resource: ResourceHash,
    /// What it led to.
    pub outcome: DedupOutcome,
    /// Leader wall time of the entry that last changed the outcome (first
    /// seen, promoted or cancelled); retention counts from it.
    pub at_ms: u64,
    /// The holder and ttl the request asked for (version 2);
    /// [`AcquireFingerprint::UNKNOWN`] for a record from before.
    #[serde(skip)]
    pub fingerprint: AcquireFingerprint,
}

impl DedupRecord {
    /// The stored bytes: version 1, plus the fingerprint when known (version 2).
    pub fn to_stored(&self) -> postcard::Result<Vec<u8>> {
        let mut bytes = postcard::to_stdvec(self)?;
        if self.fingerprint != AcquireFingerprint::UNKNOWN {
            bytes.extend(postcard::to_stdvec(&self.fingerprint.0)?);
        }
        Ok(bytes)
    }

    /// A record read back from its stored bytes, of either version.
    pub fn from_stored(bytes: &[u8]) -> postcard::Result<Self> {
        let (mut record, rest): (Self, _) = postcard::take_from_bytes(bytes)?;
        if !rest.is_empty() {
            let (fingerprint, rest): (u64, _) = postcard::take_from_bytes(rest)?;
            if !rest.is_empty() {
                return Err(postcard::Error::DeserializeBadEncoding);
            }
            record.fingerprint = AcquireFingerprint(fingerprint);
        }
        Ok(record)
    }
}

/// What an acquire asked for besides its resource (holder and ttl), as a
/// stable 64-bit FNV-1a hash: a retry that asks for something else is not
/// a retry (REQUEST_ID_REUSED). Not a secret and not collision-proof: it
/// catches a request id reused by mistake, it does not authenticate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AcquireFingerprint(pub u64);

impl AcquireFingerprint {
    /// Not recorded (a record from before version 2): not compared.
    pub const UNKNOWN: Self = Self(0);

    /// The fingerprint of an acquire of `holder` for `ttl_ms`; never
    /// [`Self::UNKNOWN`].
    pub fn of(holder: &Holder, ttl_ms: u64) -> Self {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in holder.as_str().bytes().chain([0xff]).chain(ttl_ms.to_le_bytes()) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        Self(h.max(1))
    }
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
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RequestKey([u8; 16]);

/// The bytes' order, compared as one big-endian number: two integer
/// comparisons instead of a `memcmp` call, on every lookup of a table of
/// ~240,000 records.
impl Ord for RequestKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.to_u128().cmp(&other.to_u128())
    }
}

impl PartialOrd for RequestKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

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
