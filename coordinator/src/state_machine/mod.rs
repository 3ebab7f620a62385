//! The replicated lock state machine (DESIGN §3.1): a pure, deterministic
//! [`LockState::apply`] over plain data. No clocks, no randomness, no I/O:
//! everything that varies between nodes (lease ids, wall time, policy limits)
//! is chosen by the leader and carried inside the [`LogCommand`].
//!
//! Besides its [`Outcome`], each apply reports [`Event`]s (a lease started,
//! was renewed, ended; a waiter left the queue) for the node's lease clock,
//! parked calls and audit log.
//!
//! # Layout
//! - `command` — [`LogCommand`] and its [`Command`]s, what the leader proposes.
//! - `outcome` — [`Outcome`] (the answer to the proposer) and [`Event`].
//! - `record` — the records the state holds: locks and their FIFO queues
//!   ([`ResourceState`]), the request-id dedup table ([`DedupRecord`], I7),
//!   ended leases, signing keys.
//! - this module — [`LockState`] and its `apply`.

use std::collections::BTreeMap;

use imbl::OrdMap;

use fencer_token::{KeyId, MAX_KEYS, PublicKey};

use crate::types::{FencingToken, Holder, LeaseId, NodeId, RequestId, ResourceName};

mod command;
#[cfg(test)]
mod model_tests;
mod outcome;
mod record;

pub use self::command::{AcquireCmd, Command, LogCommand, Quota};
pub use self::outcome::{
    Applied, CancelOutcome, EndedGrant, Event, Grant, KeyChange, KeyRefusal, Outcome, QuotaLimit, Rejection, Reuse,
};
pub use self::record::{
    AcquireFingerprint, DedupOutcome, DedupRecord, EndReason, EndedLease, LockRecord, RequestKey, ResourceHash,
    ResourceState, SigningKeyRecord, Waiter, current_signing_key,
};

/// The whole replicated lock state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LockState {
    resources: OrdMap<ResourceName, ResourceState>,
    /// Request-id and ended-lease records (~240,000 each at the seed rate).
    /// B-trees, not hash maps: a hash map sizes itself to a power of two
    /// and sat at 46 % full at the seed rate (38 + 26 MB); B-tree nodes
    /// grow with the record count (~25 + 16 MB), and lookups stay cheap
    /// next to a raft round trip. The three big maps are persistent
    /// (`imbl`): cloning the state for a snapshot shares every node, and
    /// an apply meanwhile copies only the nodes it touches.
    dedup: OrdMap<RequestKey, DedupRecord>,
    ended: OrdMap<LeaseId, EndedLease>,
    /// Token-signing public keys (DESIGN P7), by key id.
    signing_keys: BTreeMap<KeyId, SigningKeyRecord>,
    /// Total queued requests over all resources.
    waiter_count: u64,
    /// Total held locks.
    lock_count: u64,
    /// Which records hold which second of `at_ms`, for the retention prune.
    retention: RetentionIndex,
}

/// Width of a [`RetentionIndex`] bucket, in milliseconds of `at_ms`.
const RETENTION_BUCKET_MS: u64 = 1_000;

/// The keys of the request-id and ended-lease records by the second of
/// their `at_ms`, so the retention prune visits only what it may remove
/// (issue 18): scanning both tables (~520,000 records at the seed state)
/// took ~70 ms of one apply, a stall of every node's applies each time.
///
/// Derived from the tables and never persisted: [`LockState::from_parts`]
/// rebuilds it. A record is listed under the second of its current
/// `at_ms` (a key may also linger under an earlier second, from before
/// its `at_ms` changed: the prune skips it there), except a queued request's
/// record, which a prune keeps and drops from the index until its outcome
/// changes, when it is listed again. So a prune removes exactly the records
/// a scan of the tables would — the same on every node, whatever each
/// node's index holds — and the index takes no part in comparing states.
#[derive(Debug, Clone, Default)]
struct RetentionIndex {
    dedup: OrdMap<u64, imbl::Vector<RequestKey>>,
    ended: OrdMap<u64, imbl::Vector<LeaseId>>,
}

impl PartialEq for RetentionIndex {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for RetentionIndex {}

impl RetentionIndex {
    fn of(dedup: &OrdMap<RequestKey, DedupRecord>, ended: &OrdMap<LeaseId, EndedLease>) -> Self {
        let mut index = Self::default();
        for (key, rec) in dedup {
            index.request(*key, rec.at_ms);
        }
        for (id, rec) in ended {
            index.lease(*id, rec.at_ms);
        }
        index
    }

    fn request(&mut self, key: RequestKey, at_ms: u64) {
        self.dedup.entry(at_ms / RETENTION_BUCKET_MS).or_default().push_back(key);
    }

    fn lease(&mut self, id: LeaseId, at_ms: u64) {
        self.ended.entry(at_ms / RETENTION_BUCKET_MS).or_default().push_back(id);
    }
}

impl LockState {
    /// An empty state.
    pub fn new() -> Self {
        Self::default()
    }

    /// Rebuilds a state from its persisted parts.
    pub fn from_parts(
        resources: OrdMap<ResourceName, ResourceState>,
        dedup: OrdMap<RequestKey, DedupRecord>,
        ended: OrdMap<LeaseId, EndedLease>,
    ) -> Self {
        let lock_count = resources.values().filter(|r| r.lock.is_some()).count() as u64;
        let waiter_count = resources.values().map(|r| r.waiters.len() as u64).sum();
        let retention = RetentionIndex::of(&dedup, &ended);
        Self { resources, dedup, ended, signing_keys: BTreeMap::new(), waiter_count, lock_count, retention }
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
    pub fn resources(&self) -> &OrdMap<ResourceName, ResourceState> {
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
    pub fn dedup_records(&self) -> &OrdMap<RequestKey, DedupRecord> {
        &self.dedup
    }

    /// How a lease ended, if remembered.
    pub fn ended(&self, id: &LeaseId) -> Option<&EndedLease> {
        self.ended.get(id)
    }

    /// All ended-lease records.
    pub fn ended_records(&self) -> &OrdMap<LeaseId, EndedLease> {
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

    /// Applies the entry at log `index`. Deterministic: the same state, index
    /// and command always give the same result on every node.
    pub fn apply(&mut self, index: u64, entry: &LogCommand) -> Applied {
        let mut events = Vec::new();
        let at_ms = entry.at_ms;
        let outcome = match &entry.cmd {
            Command::Acquire(acquire) => {
                self.acquire(index, at_ms, acquire, RequestKey::of(&acquire.request_id), &mut events)
            }
            Command::AcquireInQuota { acquire, quota } => {
                let key = RequestKey::of(&acquire.request_id);
                match self.over_quota(&key, &acquire.resource, acquire.wait, quota) {
                    Some((limit, value)) => Outcome::Rejected(Rejection::TenantLimit { limit, value }),
                    None => self.acquire(index, at_ms, acquire, key, &mut events),
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
            .range::<_, str>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(move |(n, _)| n.as_str().starts_with(prefix))
    }

    fn current_lock(&self, resource: &ResourceName) -> Option<&LockRecord> {
        self.resources.get(resource).and_then(|r| r.lock.as_ref())
    }

    fn acquire(
        &mut self,
        index: u64,
        at_ms: u64,
        cmd: &AcquireCmd,
        key: RequestKey,
        events: &mut Vec<Event>,
    ) -> Outcome {
        let AcquireCmd { request_id, resource, wait, lease_id, max_waiters, .. } = cmd;
        let fingerprint = AcquireFingerprint::of(&cmd.holder, cmd.ttl_ms);
        if let Some(record) = self.dedup.get(&key) {
            events.push(Event::DedupHit { request_id: request_id.clone() });
            return self.replay(request_id, record, resource, fingerprint);
        }
        let state = self.resources.entry(resource.clone()).or_default();
        let (outcome, dedup) = match &state.lock {
            None => {
                let grant = state.grant(resource, index, at_ms, cmd.waiter(), false, events);
                self.lock_count += 1;
                let dedup = DedupOutcome::granted(&grant);
                (Outcome::Granted(grant), dedup)
            }
            Some(lock) if !wait => (
                Outcome::Rejected(Rejection::LockHeld { holder: lock.holder.clone(), token: lock.token }),
                DedupOutcome::LockHeld,
            ),
            Some(_) if state.waiters.len() >= *max_waiters as usize => (
                Outcome::Rejected(Rejection::TooManyWaiters { limit: *max_waiters }),
                DedupOutcome::TooManyWaiters { limit: *max_waiters },
            ),
            Some(_) => {
                state.waiters.push_back(cmd.waiter());
                self.waiter_count += 1;
                events.push(Event::WaiterQueued { resource: resource.clone(), request_id: request_id.clone() });
                let position = state.waiters.len() as u32;
                (Outcome::Queued { lease_id: *lease_id, position }, DedupOutcome::Queued { lease_id: *lease_id })
            }
        };
        // No branch leaves an idle record behind: an entry created above
        // (the lock was free) was granted, and the refusals need a held lock.
        debug_assert!(!self.resources.get(resource).is_some_and(ResourceState::is_idle));
        self.dedup
            .insert(key, DedupRecord { resource: ResourceHash::of(resource), outcome: dedup, at_ms, fingerprint });
        self.retention.request(key, at_ms);
        outcome
    }

    /// The original outcome of a retried request id (I7). A grant is
    /// answered as a grant only while its lease is current: once it ended,
    /// the retry learns the original grant as [`Rejection::LeaseEnded`].
    /// Decided here, from the replicated state, so every node answers alike.
    fn replay(
        &self,
        request_id: &RequestId,
        record: &DedupRecord,
        resource: &ResourceName,
        fingerprint: AcquireFingerprint,
    ) -> Outcome {
        if record.resource != ResourceHash::of(resource) {
            return Outcome::Rejected(Rejection::RequestIdReused(Reuse::Resource));
        }
        if record.fingerprint != AcquireFingerprint::UNKNOWN && record.fingerprint != fingerprint {
            return Outcome::Rejected(Rejection::RequestIdReused(Reuse::HolderOrTtl));
        }
        match &record.outcome {
            DedupOutcome::Granted { .. } => self.granted_or_ended(record, resource),
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

    /// Whether `lease_id` is the current lease of `resource`, so a renewal
    /// of it succeeds: its token and ttl, or the refusal a Renew entry would
    /// apply as. The one rule for renewals through the log and for the
    /// leader's renewals confirmed by a quorum round (DESIGN §3.2).
    pub fn renewable(&self, resource: &ResourceName, lease_id: &LeaseId) -> Result<(FencingToken, u64), Rejection> {
        match self.current_lock(resource) {
            Some(lock) if lock.lease_id == *lease_id => Ok((lock.token, lock.ttl_ms)),
            _ => Err(self.not_current(resource, lease_id)),
        }
    }

    fn renew(&mut self, index: u64, resource: &ResourceName, lease_id: &LeaseId, events: &mut Vec<Event>) -> Outcome {
        if let Err(rejection) = self.renewable(resource, lease_id) {
            return Outcome::Rejected(rejection);
        }
        let Some(lock) = self.resources.get_mut(resource).and_then(|r| r.lock.as_mut()) else {
            return Outcome::Rejected(self.not_current(resource, lease_id));
        };
        lock.renewed_index = index;
        let (token, ttl_ms, holder) = (lock.token, lock.ttl_ms, lock.holder.clone());
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
        self.retention.lease(old.lease_id, at_ms);
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
            let key = RequestKey::of(&next.request_id);
            let grant = state.grant(resource, index, at_ms, next, true, events);
            self.lock_count += 1;
            if let Some(rec) = self.dedup.get_mut(&key) {
                rec.outcome = DedupOutcome::granted(&grant);
                rec.at_ms = at_ms;
                self.retention.request(key, at_ms);
            }
        }
        if state.is_idle() {
            self.resources.remove(resource);
        }
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
            let key = RequestKey::of(request_id);
            if let Some(rec) = self.dedup.get_mut(&key) {
                rec.outcome = DedupOutcome::WaitCancelled;
                rec.at_ms = at_ms;
                self.retention.request(key, at_ms);
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
            Some(rec @ DedupRecord { outcome: DedupOutcome::Granted { .. }, .. })
                if rec.resource == ResourceHash::of(resource) =>
            {
                Outcome::WaitCancel(match self.granted_or_ended(rec, resource) {
                    Outcome::Granted(g) => CancelOutcome::AlreadyGranted(g),
                    Outcome::Rejected(Rejection::LeaseEnded(ended)) => CancelOutcome::GrantEnded(ended),
                    _ => CancelOutcome::NotWaiting,
                })
            }
            _ => Outcome::WaitCancel(CancelOutcome::NotWaiting),
        }
    }

    /// A recorded grant as a retry learns it: [`Outcome::Granted`] while its
    /// lease is the resource's current one, else [`Rejection::LeaseEnded`]
    /// with the original grant and the time it was granted.
    fn granted_or_ended(&self, record: &DedupRecord, resource: &ResourceName) -> Outcome {
        let DedupOutcome::Granted { lease_id, token, ttl_ms, waited } = &record.outcome else {
            return Outcome::Rejected(Rejection::NotHolder);
        };
        let grant =
            Grant { resource: resource.clone(), lease_id: *lease_id, token: *token, ttl_ms: *ttl_ms, waited: *waited };
        if self.current_lock(resource).is_some_and(|l| l.lease_id == *lease_id) {
            Outcome::Granted(grant)
        } else {
            // The record's time is the granting entry's (set when it was
            // granted, at once or by promotion, and never changed after).
            Outcome::Rejected(Rejection::LeaseEnded(EndedGrant { grant, granted_at_ms: record.at_ms }))
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
            events.push(Event::SigningKeyRetired { kid: kid.clone(), key: key.clone() });
        }
        KeyChange::Retired { not_after_unix_ms: end }
    }

    /// Forgets the request-id records (but a queued request's: its retry
    /// must find its slot) and ended-lease records older than
    /// `older_than_ms`, through the retention index: only the seconds
    /// before `older_than_ms` are visited.
    fn prune(&mut self, older_than_ms: u64) -> Outcome {
        let dedup = prune_table(&mut self.retention.dedup, &mut self.dedup, older_than_ms, |r| {
            (r.at_ms, !matches!(r.outcome, DedupOutcome::Queued { .. }))
        });
        let ended = prune_table(&mut self.retention.ended, &mut self.ended, older_than_ms, |r| (r.at_ms, true));
        Outcome::Pruned { dedup, ended }
    }
}

/// Removes from `records` what is older than `older_than_ms` and may go
/// (`time_and_removable` of a record), visiting only the buckets of `index`
/// that may hold such a record; returns how many were removed. A key listed
/// under a second its record's `at_ms` has since left is dropped there (it
/// is listed again under its new second); a record too old but not
/// removable is dropped from the index until it changes and is listed anew.
fn prune_table<K: Ord + Clone, R: Clone>(
    index: &mut OrdMap<u64, imbl::Vector<K>>,
    records: &mut OrdMap<K, R>,
    older_than_ms: u64,
    time_and_removable: impl Fn(&R) -> (u64, bool),
) -> u64 {
    // Every bucket that may hold an `at_ms` below the bound: the last one
    // may also hold newer records, which stay listed.
    let below = older_than_ms.div_ceil(RETENTION_BUCKET_MS);
    let buckets: Vec<u64> = index.range(..below).map(|(b, _)| *b).collect();
    let mut removed = 0u64;
    for b in buckets {
        let mut kept = imbl::Vector::new();
        for key in index.remove(&b).unwrap_or_default() {
            let Some((at_ms, removable)) = records.get(&key).map(&time_and_removable) else { continue };
            if at_ms / RETENTION_BUCKET_MS != b {
                continue;
            }
            if at_ms >= older_than_ms {
                kept.push_back(key);
            } else if removable {
                records.remove(&key);
                removed += 1;
            }
        }
        if !kept.is_empty() {
            index.insert(b, kept);
        }
    }
    removed
}
