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
//!   key but a registration of its own is pending waits up to two seconds
//!   for it; after that (or with no pending key) the grant carries no
//!   signed token.
//!
//! This module holds the keys ([`NodeKeys`]) and their views; the
//! operations on them (signing a grant, registering, rotating, retiring)
//! are the service's (`service::keys`).

use std::collections::BTreeMap;
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::sync::RwLock;

use fencer_token::{KeyId, PublicKey, SecretKeyFile, Signer};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::state_machine::{SigningKeyRecord, current_signing_key};
use crate::types::NodeId;

/// Name of the dir of secret keys inside a data dir.
pub const SIGNING_DIR: &str = "signing";
/// Suffix of a secret-key file; the name before it is the key id.
const SECRET_SUFFIX: &str = ".secret.json";

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

pub(crate) fn key_view(
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
