//! This node's token-signing keys (DESIGN P7) and the operations on the
//! cluster's key registry.
//!
//! - **Secrets stay home.** Each node keeps its secret keys in
//!   `DATA_DIR/signing/<kid>.secret.json` (`fencer_token::SecretKeyFile`:
//!   mode 0600, refused when group or others can access it; the dir is
//!   0700). A node that has none makes one at start, with the key id
//!   `n<node id>-<UTC yyyymmddHHMMSS>`.
//! - **Public halves go through the log.** A background task registers
//!   every local key the replicated state does not know yet: the leader
//!   proposes `RegisterSigningKey` itself, a follower asks the leader over
//!   the raft transport (`Raft.RegisterSigningKey`, `from` = the node that
//!   holds the secret). So every member's key is registered before that
//!   member ever leads, and tokens keep verifying across failovers.
//! - **Signing.** A grant is signed on the leader when it is answered, with
//!   the leader's current key: registered (committed), valid now, the newest
//!   such key of this node (`state_machine::current_signing_key`). Hence
//!   every key that ever signed is in the registry, and `fencer keys export`
//!   gives proxies all of them. A grant answered while this node has no such
//!   key but a registration of its own is pending waits up to
//!   [`KEY_WAIT`] for it; after that (or with no pending key) the grant
//!   carries no signed token.

use std::collections::BTreeMap;
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::sync::RwLock;
use std::time::Duration;

use fencer_proto::raft::RaftPayload;
use fencer_proto::raft::raft_client::RaftClient;
use fencer_token::{KeyId, PublicKey, SecretKeyFile, Signer};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::service::{LockError, LockService};
use crate::state_machine::{Command, KeyChange, KeyRefusal, Outcome, SigningKeyRecord, current_signing_key};
use crate::store::{decode, encode};
use crate::types::NodeId;

/// Name of the dir of secret keys inside a data dir.
pub const SIGNING_DIR: &str = "signing";
/// Suffix of a secret-key file; the name before it is the key id.
const SECRET_SUFFIX: &str = ".secret.json";
/// How long a grant waits for this node's own key registration to commit.
pub(crate) const KEY_WAIT: Duration = Duration::from_secs(2);
/// Pause between registration attempts while a local key is unregistered.
const REGISTER_RETRY: Duration = Duration::from_millis(300);
/// Pause between checks once every local key is registered.
const REGISTER_IDLE: Duration = Duration::from_secs(2);

/// Why the signing keys of a data dir could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SigningKeyError {
    /// The signing dir or a key file could not be read or written.
    #[error("signing keys in {path}: {source}")]
    Io {
        /// The dir or file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A secret-key file is refused (permissions, content).
    #[error(transparent)]
    Secret(#[from] fencer_token::SecretKeyError),
    /// A secret-key file's name does not match the key id inside it.
    #[error("{path} holds key {kid}; a secret-key file must be named <kid>{SECRET_SUFFIX}")]
    Misnamed {
        /// The file.
        path: PathBuf,
        /// The key id inside.
        kid: KeyId,
    },
    /// No randomness for a new key.
    #[error(transparent)]
    Generate(#[from] fencer_token::GenerateError),
}

struct LocalKey {
    signer: Signer,
    not_before_unix_ms: u64,
}

/// The secret keys of this node, loaded from its data dir.
pub(crate) struct NodeKeys {
    node_id: NodeId,
    dir: PathBuf,
    keys: RwLock<BTreeMap<KeyId, LocalKey>>,
    /// Local keys whose registration the cluster refused (e.g. the registry
    /// is full): no longer pending, so grants do not wait for them.
    refused: std::sync::Mutex<std::collections::BTreeSet<KeyId>>,
    /// Bumped when the registry or the local keys change; grants waiting for
    /// a registration watch it.
    changed: watch::Sender<u64>,
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> SigningKeyError + '_ {
    move |source| SigningKeyError::Io { path: path.to_path_buf(), source }
}

/// `n<node>-<yyyymmddHHMMSS>` for `unix_ms` (UTC).
fn key_id_for(node_id: NodeId, unix_ms: u64) -> String {
    let time = crate::audit::rfc3339_ms(unix_ms);
    let digits: String = time.chars().take(19).filter(char::is_ascii_digit).collect();
    format!("n{node_id}-{digits}")
}

impl NodeKeys {
    /// Loads the secret keys in `data_dir/signing`, making the dir (0700)
    /// and, if it holds none, a first key valid from `now_ms`. Blocking:
    /// call it at start or from `spawn_blocking`.
    pub(crate) fn open(data_dir: &Path, node_id: NodeId, now_ms: u64) -> Result<Self, SigningKeyError> {
        let dir = data_dir.join(SIGNING_DIR);
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir).map_err(io_error(&dir))?;
        let mut keys = BTreeMap::new();
        for entry in std::fs::read_dir(&dir).map_err(io_error(&dir))? {
            let path = entry.map_err(io_error(&dir))?.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else { continue };
            let Some(stem) = name.strip_suffix(SECRET_SUFFIX) else { continue };
            let file = SecretKeyFile::load(&path)?;
            let kid = file.signer().key_id().clone();
            if kid.as_str() != stem {
                return Err(SigningKeyError::Misnamed { path, kid });
            }
            keys.insert(kid, LocalKey { signer: file.signer().clone(), not_before_unix_ms: file.not_before_unix_ms() });
        }
        let (changed, _) = watch::channel(0);
        let this = Self { node_id, dir, keys: RwLock::new(keys), refused: Default::default(), changed };
        if this.read().is_empty() {
            let entry = this.generate(now_ms, now_ms, |_| false)?;
            tracing::info!(kid = %entry.0, "made this node's first token-signing key");
        }
        Ok(this)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<KeyId, LocalKey>> {
        self.keys.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes a new key valid from `not_before_unix_ms`, saves its secret and
    /// returns its id and public key. `taken` says which ids the registry
    /// already has. Blocking.
    pub(crate) fn generate(
        &self,
        now_ms: u64,
        not_before_unix_ms: u64,
        taken: impl Fn(&KeyId) -> bool,
    ) -> Result<(KeyId, PublicKey), SigningKeyError> {
        let base = key_id_for(self.node_id, now_ms);
        let kid = (1..)
            .map(|n| if n == 1 { base.clone() } else { format!("{base}-{n}") })
            .filter_map(|id| KeyId::new(id).ok())
            .find(|id| !taken(id) && !self.read().contains_key(id))
            .expect("an unbounded sequence of ids has a free one");
        let signer = Signer::generate(kid.clone())?;
        let path = self.dir.join(format!("{kid}{SECRET_SUFFIX}"));
        SecretKeyFile::new(signer.clone(), not_before_unix_ms, None).write(&path).map_err(io_error(&path))?;
        let public = signer.public_key();
        self.keys
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(kid.clone(), LocalKey { signer, not_before_unix_ms });
        self.notify();
        Ok((kid, public))
    }

    /// Local keys the registry does not hold yet: (id, public key, not-before).
    pub(crate) fn unregistered(&self, registry: &BTreeMap<KeyId, SigningKeyRecord>) -> Vec<(KeyId, [u8; 32], u64)> {
        let refused = self.refused.lock().unwrap_or_else(|p| p.into_inner());
        self.read()
            .iter()
            .filter(|(kid, _)| !registry.contains_key(*kid) && !refused.contains(*kid))
            .map(|(kid, k)| (kid.clone(), k.signer.public_key().to_bytes(), k.not_before_unix_ms))
            .collect()
    }

    /// The key this node signs with at `now_ms`, if any.
    pub(crate) fn choose(&self, registry: &BTreeMap<KeyId, SigningKeyRecord>, now_ms: u64) -> Option<KeyId> {
        let local = self.read();
        current_signing_key(registry, self.node_id, now_ms, |kid| {
            // Registered under this id with the public half of our secret.
            local
                .get(kid)
                .is_some_and(|k| Some(k.signer.public_key().to_bytes()) == registry.get(kid).map(|r| r.public_key))
        })
        .map(|(kid, _)| kid.clone())
    }

    /// Signs a grant with the local key `kid`.
    pub(crate) fn sign(&self, kid: &KeyId, resource: &str, token: u64, lease_id: u128, now_ms: u64) -> Option<String> {
        let local = self.read();
        let key = local.get(kid)?;
        match key.signer.sign(resource, token, lease_id, now_ms) {
            Ok(t) => Some(t.into_string()),
            Err(e) => {
                tracing::error!(error = %e, "cannot sign a grant");
                None
            }
        }
    }

    /// Marks a local key whose registration the cluster refused.
    pub(crate) fn refuse(&self, kid: &KeyId) {
        self.refused.lock().unwrap_or_else(|p| p.into_inner()).insert(kid.clone());
        self.notify();
    }

    /// Tells grants waiting for a key that something changed.
    pub(crate) fn notify(&self) {
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }
}

/// What a follower sends the leader to register its key.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct KeyRegistration {
    pub(crate) kid: KeyId,
    pub(crate) public_key: [u8; 32],
    pub(crate) not_before_unix_ms: u64,
}

/// A registered key as the admin API shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SigningKeyView {
    /// The key id.
    pub kid: String,
    /// The node holding the secret.
    pub node_id: NodeId,
    /// base64url of the public key.
    pub public_key: String,
    /// Start of validity, Unix ms.
    pub not_before_unix_ms: u64,
    /// End of validity (exclusive), Unix ms.
    pub not_after_unix_ms: Option<u64>,
    /// The log index that registered it.
    pub registered_index: u64,
    /// Its node signs with it now.
    pub current: bool,
}

/// The admin API's wire form of a key (no end of validity is 0).
impl From<SigningKeyView> for fencer_proto::v1::SigningKey {
    fn from(k: SigningKeyView) -> Self {
        Self {
            kid: k.kid,
            node_id: k.node_id,
            public_key: k.public_key,
            not_before_unix_ms: k.not_before_unix_ms,
            not_after_unix_ms: k.not_after_unix_ms.unwrap_or(0),
            registered_index: k.registered_index,
            current: k.current,
        }
    }
}

/// A key as the admin API sent it (the CLI's and tests' side).
impl From<&fencer_proto::v1::SigningKey> for SigningKeyView {
    fn from(k: &fencer_proto::v1::SigningKey) -> Self {
        Self {
            kid: k.kid.clone(),
            node_id: k.node_id,
            public_key: k.public_key.clone(),
            not_before_unix_ms: k.not_before_unix_ms,
            not_after_unix_ms: (k.not_after_unix_ms != 0).then_some(k.not_after_unix_ms),
            registered_index: k.registered_index,
            current: k.current,
        }
    }
}

fn view(
    kid: &KeyId,
    k: &SigningKeyRecord,
    registry: &BTreeMap<KeyId, SigningKeyRecord>,
    now_ms: u64,
) -> SigningKeyView {
    let current = current_signing_key(registry, k.node_id, now_ms, |_| true).is_some_and(|(c, _)| c == kid);
    SigningKeyView {
        kid: kid.to_string(),
        node_id: k.node_id,
        public_key: PublicKey::from_bytes(&k.public_key).map(|p| p.to_base64url()).unwrap_or_default(),
        not_before_unix_ms: k.not_before_unix_ms,
        not_after_unix_ms: k.not_after_unix_ms,
        registered_index: k.registered_index,
        current,
    }
}

/// The proxy key-set file for `keys` (every registered key, so every key
/// that ever signed), validated as proxies validate it.
pub fn key_set(keys: &[SigningKeyView]) -> Result<fencer_token::KeySet, String> {
    let mut set = fencer_token::KeySet::default();
    for k in keys {
        set.keys.push(fencer_token::PublicKeyEntry {
            kid: KeyId::new(k.kid.as_str()).map_err(|e| format!("key {}: {e}", k.kid))?,
            public_key: PublicKey::from_base64url(&k.public_key).map_err(|e| format!("key {}: {e}", k.kid))?,
            not_before_unix_ms: k.not_before_unix_ms,
            not_after_unix_ms: k.not_after_unix_ms,
        });
    }
    set.validate().map_err(|e| e.to_string())?;
    Ok(set)
}

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
            m.current_leader.and_then(|l| m.membership_config.membership().get_node(&l).map(|n| n.addr.clone()))
        };
        let Some(addr) = leader else {
            return Err(LockError::NotLeader { leader_id: None, leader_addr: None });
        };
        let registration = KeyRegistration { kid, public_key, not_before_unix_ms };
        let data = encode(&registration).map_err(|e| LockError::Internal(e.to_string()))?;
        let channel = crate::tls::peer_endpoint(&addr, self.inner.peer_tls.as_ref())
            .map_err(|e| LockError::Internal(format!("leader address {addr:?}: {e}")))?
            .connect_timeout(Duration::from_millis(500))
            .connect_lazy();
        let payload = RaftPayload { cluster_id: self.inner.cluster.to_text(), from: me, data };
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
        Ok((registry.iter().map(|(kid, k)| view(kid, k, registry, now_ms)).collect(), now_ms))
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
        Ok(view(&kid, k, registry, now_ms))
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
        Ok(view(&kid, k, registry, now_ms))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_ids_name_the_node_and_the_time() {
        // 2026-11-30T10:50:50.123Z
        assert_eq!(key_id_for(3, 1_796_035_850_123), "n3-20261130105050");
        assert!(KeyId::new(key_id_for(u64::MAX, u64::MAX / 1_000_000)).is_ok());
    }

    #[test]
    fn secrets_are_made_once_kept_private_and_reloaded() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let keys = NodeKeys::open(dir.path(), 2, 1_000).unwrap();
        let first = keys.unregistered(&BTreeMap::new());
        assert_eq!(first.len(), 1);
        let signing = dir.path().join(SIGNING_DIR);
        assert_eq!(std::fs::metadata(&signing).unwrap().permissions().mode() & 0o777, 0o700);
        let file = signing.join(format!("{}{SECRET_SUFFIX}", first[0].0));
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
        // The same second: a second key gets a suffix, never the same id.
        let (second, _) = keys.generate(1_000, 5_000, |_| false).unwrap();
        assert_eq!(second.as_str(), format!("{}-2", first[0].0));
        drop(keys);

        let again = NodeKeys::open(dir.path(), 2, 9_000).unwrap();
        let mut reloaded = again.unregistered(&BTreeMap::new());
        reloaded.sort_by_key(|k| k.2);
        assert_eq!(reloaded.len(), 2, "nothing new is made when keys exist");
        assert_eq!((reloaded[0].1, reloaded[1].2), (first[0].1, 5_000));

        // A secret others can read is refused at start.
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(NodeKeys::open(dir.path(), 2, 9_000), Err(SigningKeyError::Secret(_))));
    }

    #[test]
    fn only_a_registered_valid_key_of_this_node_signs() {
        let dir = tempfile::tempdir().unwrap();
        let keys = NodeKeys::open(dir.path(), 1, 1_000).unwrap();
        let (kid, public, _) = keys.unregistered(&BTreeMap::new()).remove(0);
        let record = |node, public_key, not_after| SigningKeyRecord {
            node_id: node,
            public_key,
            not_before_unix_ms: 1_000,
            not_after_unix_ms: not_after,
            registered_index: 1,
            registered_at_ms: 1_000,
        };
        let mut registry = BTreeMap::new();
        assert_eq!(keys.choose(&registry, 2_000), None, "not registered yet");
        registry.insert(kid.clone(), record(1, public, Some(3_000)));
        assert_eq!(keys.choose(&registry, 999), None, "not valid yet");
        assert_eq!(keys.choose(&registry, 2_000), Some(kid.clone()));
        assert_eq!(keys.choose(&registry, 3_000), None, "retired");
        registry.insert(kid.clone(), record(2, public, None));
        assert_eq!(keys.choose(&registry, 2_000), None, "registered for another node");
        registry.insert(kid.clone(), record(1, [9; 32], None));
        assert_eq!(keys.choose(&registry, 2_000), None, "registered with another public key");
    }
}
