//! The token check the fence runs before an epoch can move (P7): parse the
//! `Fencing-Token` value, refuse unsigned tokens when signing is required,
//! verify signed ones against the key ring, and only then hand the fence a
//! number. The key ring is reloaded from its file on SIGHUP or
//! `POST /v1/reload-keys`; a failed reload keeps the keys in force.

use std::path::PathBuf;
use std::sync::{Arc, PoisonError, RwLock};

use fencer_token::{KeyRing, KeySet, KeySetError, PresentedToken, TokenError, VerifyError};
use serde::{Deserialize, Serialize};

use crate::config::SigningConfig;
use crate::core::clock;
use crate::core::names::{FencingToken, ResourceName};
use crate::core::rejections::RejectReason;

/// Why the signing keys could not be (re)loaded.
#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    /// The proxy has no `[signing]` table.
    #[error("this proxy has no [signing] keys_file configured")]
    NotConfigured,
    /// The file could not be read or is not a valid key set.
    #[error("signing keys {path}: {source}")]
    Load {
        /// The key-set file.
        path: PathBuf,
        /// Why.
        source: KeySetError,
    },
    /// The file holds no key, so every signed token would be refused.
    #[error("signing keys {path}: the key set has no keys; every signed token would be refused")]
    Empty {
        /// The key-set file.
        path: PathBuf,
    },
}

/// The outcome of a successful key (re)load.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeysLoaded {
    /// The key-set file.
    pub keys_file: PathBuf,
    /// The key ids now in force, sorted.
    pub key_ids: Vec<String>,
}

/// A refused token: the reason for the rejection log, the detail for the
/// client, and the token number the value claimed, if it had one.
#[derive(Debug)]
pub(crate) struct TokenRefusal {
    pub(crate) reason: RejectReason,
    pub(crate) detail: String,
    pub(crate) claimed: Option<u64>,
}

fn load_ring(config: &SigningConfig) -> Result<KeyRing, KeysError> {
    let load = |source| KeysError::Load { path: config.keys_file.clone(), source };
    let set = KeySet::load(&config.keys_file).map_err(load)?;
    if set.keys.is_empty() {
        return Err(KeysError::Empty { path: config.keys_file.clone() });
    }
    Ok(KeyRing::new(&set).map_err(load)?.with_clock_skew(config.clock_skew))
}

/// The token policy and the key ring in force.
#[derive(Debug)]
pub(crate) struct TokenVerifier {
    config: Option<SigningConfig>,
    ring: RwLock<Option<Arc<KeyRing>>>,
}

impl TokenVerifier {
    /// Loads the keys (when configured); fails when they cannot be used.
    pub(crate) fn new(config: Option<SigningConfig>) -> Result<Self, KeysError> {
        let ring = config.as_ref().map(load_ring).transpose()?.map(Arc::new);
        match (&config, &ring) {
            (Some(c), Some(r)) => tracing::info!(
                file = %c.keys_file.display(),
                keys = ?r.key_ids(),
                require_signed = c.require_signed,
                "signed tokens are verified (P7)"
            ),
            _ => tracing::warn!("no [signing] keys: fencing tokens are plain numbers that nothing vouches for (P7)"),
        }
        Ok(Self { config, ring: RwLock::new(ring) })
    }

    /// A verifier over a ring built in memory (fuzzing and tests).
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn from_ring(ring: KeyRing, require_signed: bool) -> Self {
        let config =
            SigningConfig { keys_file: PathBuf::from("(in memory)"), require_signed, clock_skew: ring.clock_skew() };
        Self { config: Some(config), ring: RwLock::new(Some(Arc::new(ring))) }
    }

    fn ring(&self) -> Option<Arc<KeyRing>> {
        self.ring.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Re-reads the key-set file. On failure the keys in force stay.
    pub(crate) fn reload(&self) -> Result<KeysLoaded, KeysError> {
        let config = self.config.as_ref().ok_or(KeysError::NotConfigured)?;
        let ring = load_ring(config)?;
        let key_ids = ring.key_ids().into_iter().map(ToString::to_string).collect();
        *self.ring.write().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(ring));
        Ok(KeysLoaded { keys_file: config.keys_file.clone(), key_ids })
    }

    /// Checks one `Fencing-Token` value for a write to `resource` and
    /// returns the token the fence may use.
    pub(crate) fn check(&self, value: &[u8], resource: &ResourceName) -> Result<FencingToken, TokenRefusal> {
        self.check_at(value, resource, clock::unix_ms())
    }

    pub(crate) fn check_at(
        &self,
        value: &[u8],
        resource: &ResourceName,
        now_unix_ms: u64,
    ) -> Result<FencingToken, TokenRefusal> {
        let presented = PresentedToken::parse(value).map_err(|e: TokenError| TokenRefusal {
            reason: RejectReason::MalformedToken,
            detail: e.to_string(),
            claimed: None,
        })?;
        let claimed = Some(presented.claimed_token());
        match presented {
            PresentedToken::Plain(t) => {
                if self.config.as_ref().is_some_and(|c| c.require_signed) {
                    return Err(TokenRefusal {
                        reason: RejectReason::UnsignedToken,
                        detail:
                            "this proxy requires signed tokens (v1.<claims>.<signature>, P7); a plain number is refused"
                                .into(),
                        claimed,
                    });
                }
                Ok(FencingToken::new(t))
            }
            PresentedToken::Signed(signed) => {
                let Some(ring) = self.ring() else {
                    return Err(TokenRefusal {
                        reason: RejectReason::UnknownKey,
                        detail: "this proxy has no signing keys configured ([signing] keys_file), so it cannot verify a signed token".into(),
                        claimed,
                    });
                };
                match ring.verify(&signed, resource.as_str(), now_unix_ms) {
                    Ok(claims) => Ok(FencingToken::new(claims.token())),
                    Err(e) => Err(TokenRefusal { reason: reason_of(&e), detail: e.to_string(), claimed }),
                }
            }
        }
    }
}

fn reason_of(e: &VerifyError) -> RejectReason {
    match e {
        VerifyError::UnknownKey { .. } => RejectReason::UnknownKey,
        VerifyError::KeyNotYetValid { .. } => RejectReason::KeyNotYetValid,
        VerifyError::ExpiredKey { .. } => RejectReason::ExpiredKey,
        VerifyError::BadSignature { .. } => RejectReason::BadSignature,
        VerifyError::WrongResource { .. } => RejectReason::WrongResource,
    }
}

/// Reloads the proxy's signing keys from their file; a cheap clone of the
/// running proxy's verifier (see [`ProxyHandle::key_reloader`](crate::ProxyHandle::key_reloader)).
#[derive(Debug, Clone)]
pub struct KeyReloader(pub(crate) Arc<TokenVerifier>);

impl KeyReloader {
    /// Re-reads the key-set file; on failure the keys in force stay.
    pub fn reload(&self) -> Result<KeysLoaded, KeysError> {
        let result = self.0.reload();
        match &result {
            Ok(loaded) => {
                tracing::info!(file = %loaded.keys_file.display(), keys = ?loaded.key_ids, "signing keys reloaded")
            }
            Err(KeysError::NotConfigured) => tracing::warn!("no [signing] keys_file is configured; nothing to reload"),
            Err(e) => tracing::error!(error = %e, "signing keys not reloaded; the previous keys stay in force"),
        }
        result
    }
}
