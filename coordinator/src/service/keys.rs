//! The signing-key operations of the service (DESIGN P7, module `signing`):
//! signing a grant with this node's current key, registering this node's
//! keys through the log (proposed here on the leader, sent to the leader
//! from a follower), listing, rotating and retiring keys.

use std::collections::BTreeMap;
use std::time::Duration;

use fencer_proto::raft::RaftPayload;
use fencer_proto::raft::raft_client::RaftClient;
use fencer_token::KeyId;
use tokio::sync::watch;

use super::{LockError, LockService};
use crate::signing::{KeyRegistration, NodeKeys, SigningKeyView, key_view};
use crate::state_machine::{Command, KeyChange, KeyRefusal, Outcome, SigningKeyRecord};
use crate::store::{decode, encode};
use crate::types::NodeId;

/// How long a grant waits for this node's own key registration to commit.
const KEY_WAIT: Duration = Duration::from_secs(2);
/// Pause between registration attempts while a local key is unregistered.
const REGISTER_RETRY: Duration = Duration::from_millis(300);
/// Pause between checks once every local key is registered.
const REGISTER_IDLE: Duration = Duration::from_secs(2);

fn key_refused(kid: &KeyId, r: &KeyRefusal) -> LockError {
    match r {
        KeyRefusal::UnknownKey => LockError::UnknownSigningKey(kid.to_string()),
        other => LockError::SigningKeyRefused(format!("key {kid}: {other}")),
    }
}

impl LockService {
    fn keys(&self) -> &NodeKeys {
        &self.inner.keys
    }

    /// The signed token for a grant, signed now with this node's current
    /// key; waits up to [`KEY_WAIT`] while this node's own key registration
    /// is pending. `None` when there is no usable key.
    pub(crate) async fn sign_grant(&self, resource: &str, token: u64, lease_id: u128) -> Option<String> {
        // The usual case, on every grant: a registered key, nothing to wait for.
        let now_ms = self.inner.clock.wall_ms();
        let kid = self.keys().choose(self.inner.sm.read().signing_keys(), now_ms);
        if let Some(kid) = kid {
            return self.keys().sign(&kid, resource, token, lease_id, now_ms);
        }
        // Subscribed before the loop checks again, so no change is missed.
        let mut changed = self.keys().subscribe();
        let deadline = self.inner.clock.after(KEY_WAIT);
        loop {
            let now_ms = self.inner.clock.wall_ms();
            let (kid, pending) = {
                let state = self.inner.sm.read();
                let registry = state.signing_keys();
                let kid = self.keys().choose(registry, now_ms);
                (kid, kid_pending(self.keys(), registry))
            };
            if let Some(kid) = kid {
                return self.keys().sign(&kid, resource, token, lease_id, now_ms);
            }
            if !pending {
                tracing::warn!(
                    resource,
                    "no registered signing key of this node is valid now; the grant is not signed"
                );
                return None;
            }
            tokio::select! {
                r = changed.changed() => if r.is_err() { return None },
                () = tokio::time::sleep_until(deadline) => {
                    tracing::warn!(resource, "this node's signing key is not registered yet; the grant is not signed");
                    return None;
                }
            }
        }
    }

    /// Registers a local key: proposed here on the leader, else sent to the
    /// leader over the raft transport.
    pub(crate) async fn register_own_key(
        &self,
        kid: KeyId,
        public_key: [u8; 32],
        not_before_unix_ms: u64,
    ) -> Result<KeyChange, LockError> {
        let me = *self.inner.raft.node_id();
        if self.inner.raft.as_leader().is_ok() {
            return self.propose_registration(me, kid, public_key, not_before_unix_ms).await;
        }
        let leader = {
            let m = self.inner.raft.metrics();
            let m = openraft::rt::watch::WatchReceiver::borrow_watched(&m);
            m.current_leader.and_then(|l| m.membership_config.membership().get_node(&l).map(|n| (l, n.addr.clone())))
        };
        // No leader known, or this node about to lead (its metrics name
        // it before `as_leader` does): the registration is retried later,
        // never sent to this node itself.
        let Some((leader_id, addr)) = leader.filter(|(l, _)| *l != me) else {
            return Err(LockError::NotLeader { leader_id: None, leader_addr: None });
        };
        let registration = KeyRegistration { kid, public_key, not_before_unix_ms };
        let data = encode(&registration).map_err(|e| LockError::Internal(e.to_string()))?;
        let channel = crate::tls::peer_endpoint(&addr, self.inner.peer_tls.as_ref())
            .map_err(|e| LockError::Internal(format!("leader address {addr:?}: {e}")))?
            .connect_timeout(Duration::from_millis(500))
            .connect_lazy();
        let payload = RaftPayload { cluster_id: self.inner.cluster.to_text(), from: me, to: leader_id, data };
        let mut client = RaftClient::new(channel);
        let call = client.register_signing_key(payload);
        let reply = match tokio::time::timeout(self.policy().write_timeout, call).await {
            Err(_) => return Err(LockError::Unknown(format!("the leader {addr} did not answer in time"))),
            Ok(Err(status)) => return Err(LockError::Unknown(format!("the leader {addr}: {}", status.message()))),
            Ok(Ok(r)) => r.into_inner(),
        };
        let result: Result<KeyChange, String> =
            decode(&reply.data, "key registration reply").map_err(|e| LockError::Internal(e.to_string()))?;
        match result.map_err(LockError::Unknown)? {
            KeyChange::Refused(r) => Err(key_refused(&registration.kid, &r)),
            c => Ok(c),
        }
    }

    /// On the leader: proposes the registration of `node`'s key.
    pub(crate) async fn propose_registration(
        &self,
        node: NodeId,
        kid: KeyId,
        public_key: [u8; 32],
        not_before_unix_ms: u64,
    ) -> Result<KeyChange, LockError> {
        match self.registration_outcome(node, kid.clone(), public_key, not_before_unix_ms).await? {
            KeyChange::Refused(r) => Err(key_refused(&kid, &r)),
            c => Ok(c),
        }
    }

    /// On the leader: proposes the registration of `node`'s key and returns
    /// what applying it did, a refusal included (the raft transport sends
    /// it back to the member as it is).
    pub(crate) async fn registration_outcome(
        &self,
        node: NodeId,
        kid: KeyId,
        public_key: [u8; 32],
        not_before_unix_ms: u64,
    ) -> Result<KeyChange, LockError> {
        let cmd = Command::RegisterSigningKey { kid: kid.clone(), node_id: node, public_key, not_before_unix_ms };
        match self.propose(cmd).await? {
            Outcome::SigningKey(c) => {
                if c == KeyChange::Registered {
                    tracing::info!(%kid, node, "registered a token-signing key");
                }
                Ok(c)
            }
            other => Err(LockError::Internal(format!("unexpected outcome {other:?}"))),
        }
    }

    /// Whether `node` is a member (voter or learner) of the cluster.
    pub(crate) fn is_member(&self, node: NodeId) -> bool {
        let m = self.inner.raft.metrics();
        let m = openraft::rt::watch::WatchReceiver::borrow_watched(&m);
        m.membership_config.membership().get_node(&node).is_some()
    }

    /// Every registered signing key (a linearizable read on the leader).
    pub async fn signing_keys(&self) -> Result<(Vec<SigningKeyView>, u64), LockError> {
        self.linearize().await?;
        let now_ms = self.inner.clock.wall_ms();
        let state = self.inner.sm.read();
        let registry = state.signing_keys();
        Ok((registry.iter().map(|(kid, k)| key_view(kid, k, registry, now_ms)).collect(), now_ms))
    }

    /// Makes a new key on this node, valid from `activate_in` after now,
    /// and registers it. `expected_node` (when not 0) must be this node.
    pub async fn rotate_signing_key(
        &self,
        expected_node: NodeId,
        activate_in: Duration,
    ) -> Result<SigningKeyView, LockError> {
        let me = *self.inner.raft.node_id();
        if expected_node != 0 && expected_node != me {
            return Err(LockError::SigningKeyRefused(format!(
                "this is node {me}, not node {expected_node}: a key is made on the node that keeps it"
            )));
        }
        let now_ms = self.inner.clock.wall_ms();
        let not_before = now_ms.saturating_add(activate_in.as_millis() as u64);
        let mut changed = self.keys().subscribe();
        let taken: Vec<KeyId> = self.inner.sm.read().signing_keys().keys().cloned().collect();
        let svc = self.clone();
        let (kid, public) =
            tokio::task::spawn_blocking(move || svc.keys().generate(now_ms, not_before, |k| taken.contains(k)))
                .await
                .map_err(|e| LockError::Internal(format!("key task: {e}")))?
                .map_err(|e| LockError::Internal(e.to_string()))?;
        tracing::info!(%kid, not_before_unix_ms = not_before, "made a new token-signing key");
        if let Err(e) = self.register_own_key(kid.clone(), public.to_bytes(), not_before).await {
            return Err(LockError::Unknown(format!(
                "key {kid} was made and saved on node {me}, but its registration did not complete ({e}); \
                 the node retries it in the background"
            )));
        }
        // Committed on the leader; on a follower, wait until applied here too.
        let deadline = self.inner.clock.after(self.policy().write_timeout);
        while !self.inner.sm.read().signing_keys().contains_key(&kid) {
            tokio::select! {
                r = changed.changed() => if r.is_err() { break },
                () = tokio::time::sleep_until(deadline) => break,
            }
        }
        let state = self.inner.sm.read();
        let registry = state.signing_keys();
        let k = registry.get(&kid).ok_or_else(|| LockError::Internal(format!("key {kid} is not in the registry")))?;
        Ok(key_view(&kid, k, registry, now_ms))
    }

    /// Ends key `kid`'s validity `after` from now. Refused when it would
    /// leave a member without a valid key at that time, unless `force`.
    pub async fn retire_signing_key(
        &self,
        kid: &str,
        after: Duration,
        force: bool,
    ) -> Result<SigningKeyView, LockError> {
        let kid = KeyId::new(kid).map_err(|e| LockError::SigningKeyRefused(format!("kid: {e}")))?;
        self.linearize().await?;
        let now_ms = self.inner.clock.wall_ms();
        let not_after = now_ms.saturating_add(after.as_millis() as u64);
        {
            let state = self.inner.sm.read();
            let registry = state.signing_keys();
            let key = registry.get(&kid).ok_or_else(|| LockError::UnknownSigningKey(kid.to_string()))?;
            let successor =
                registry.iter().any(|(other, k)| *other != kid && k.node_id == key.node_id && k.valid_at(not_after));
            if !force && !successor && self.is_member(key.node_id) {
                return Err(LockError::SigningKeyRefused(format!(
                    "retiring {kid} leaves node {} without a valid signing key from {not_after} (Unix ms) on; \
                     rotate it first (fencer keys rotate --node {}) or pass --force",
                    key.node_id, key.node_id
                )));
            }
        }
        let cmd = Command::RetireSigningKey { kid: kid.clone(), not_after_unix_ms: not_after };
        match self.propose(cmd).await? {
            Outcome::SigningKey(KeyChange::Retired { not_after_unix_ms }) => {
                tracing::warn!(%kid, not_after_unix_ms, "retired a token-signing key");
            }
            Outcome::SigningKey(KeyChange::Refused(r)) => return Err(key_refused(&kid, &r)),
            other => return Err(LockError::Internal(format!("unexpected outcome {other:?}"))),
        }
        let state = self.inner.sm.read();
        let registry = state.signing_keys();
        let k = registry.get(&kid).ok_or_else(|| LockError::UnknownSigningKey(kid.to_string()))?;
        Ok(key_view(&kid, k, registry, now_ms))
    }
}

/// Whether this node has a local key the registry lacks (and did not refuse).
fn kid_pending(keys: &NodeKeys, registry: &BTreeMap<KeyId, SigningKeyRecord>) -> bool {
    !keys.unregistered(registry).is_empty()
}

/// Registers this node's unregistered keys until `shutdown`: at once when
/// one is pending, checking again every [`REGISTER_IDLE`].
pub(crate) async fn register_keys(svc: LockService, mut shutdown: watch::Receiver<bool>) {
    let mut changed = svc.keys().subscribe();
    let mut failures = 0u32;
    loop {
        let pending = {
            let state = svc.inner.sm.read();
            svc.keys().unregistered(state.signing_keys())
        };
        for (kid, public_key, not_before) in &pending {
            match svc.register_own_key(kid.clone(), *public_key, *not_before).await {
                Ok(_) => failures = 0,
                Err(LockError::NotLeader { .. } | LockError::NoQuorum) => {
                    tracing::debug!(%kid, "no leader to register the signing key with yet")
                }
                Err(e @ (LockError::SigningKeyRefused(_) | LockError::Invalid(_))) => {
                    tracing::error!(%kid, error = %e, "the cluster refused this node's signing key; it will not sign with it");
                    svc.keys().refuse(kid);
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    // A leader of an older version (a rolling upgrade) answers
                    // this at every try: say so once in a while, not each time.
                    if failures.is_power_of_two() {
                        tracing::warn!(%kid, error = %e, failures, "could not register this node's signing key; retrying");
                    }
                }
            }
        }
        // 300 ms doubling to at most 10 s while registrations keep failing.
        let backoff = REGISTER_RETRY.saturating_mul(1 << failures.min(5)).min(Duration::from_secs(10));
        let pause = if pending.is_empty() { REGISTER_IDLE } else { backoff };
        tokio::select! {
            _ = shutdown.changed() => return,
            r = changed.changed(), if pending.is_empty() => if r.is_err() { return },
            () = tokio::time::sleep(pause) => {}
        }
    }
}
