//! [`KeyRing`]: the verifier a proxy holds. It checks, in this order: the
//! key id is known, the key was valid when the token was issued and has not
//! expired now, the signature, and the resource.

use std::collections::HashMap;
use std::time::Duration;

use crate::claims::{Claims, KeyId};
use crate::format::SignedToken;
use crate::key_set::{KeySet, KeySetError, PublicKey};

/// Default allowance for clocks that disagree (the coordinator's that set
/// `iat` and the key windows, the verifier's that reads "now").
pub const DEFAULT_CLOCK_SKEW: Duration = Duration::from_secs(30);

/// Why a well-formed signed token is not accepted. Each variant has a
/// stable snake_case [`reason`](VerifyError::reason) for logs and metrics.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// No key with this id is configured.
    #[error("signing key {kid:?} is not in the key set")]
    UnknownKey {
        /// The id the token names.
        kid: KeyId,
    },
    /// The token was issued before its key's window opened.
    #[error(
        "signing key {kid} is valid from {not_before_unix_ms} (Unix ms); the token was issued at {issued_at_unix_ms}"
    )]
    KeyNotYetValid {
        /// The key.
        kid: KeyId,
        /// The key's start.
        not_before_unix_ms: u64,
        /// The token's `iat`.
        issued_at_unix_ms: u64,
    },
    /// The key's window closed before the token was issued, or before now.
    #[error("signing key {kid} expired at {not_after_unix_ms} (Unix ms); checked at {at_unix_ms}")]
    ExpiredKey {
        /// The key.
        kid: KeyId,
        /// The key's end.
        not_after_unix_ms: u64,
        /// The time that is past it: the token's `iat` or now.
        at_unix_ms: u64,
    },
    /// The signature does not verify under the named key: forged or altered.
    #[error("the signature does not verify under key {kid}: the token was forged or altered")]
    BadSignature {
        /// The key.
        kid: KeyId,
    },
    /// Genuine, but for another resource.
    #[error("the token was issued for resource {token_resource:?}, not {expected:?}")]
    WrongResource {
        /// The token's `res`.
        token_resource: String,
        /// The resource it was presented for.
        expected: String,
    },
}

impl VerifyError {
    /// `unknown_key`, `key_not_yet_valid`, `expired_key`, `bad_signature` or
    /// `wrong_resource`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::UnknownKey { .. } => "unknown_key",
            Self::KeyNotYetValid { .. } => "key_not_yet_valid",
            Self::ExpiredKey { .. } => "expired_key",
            Self::BadSignature { .. } => "bad_signature",
            Self::WrongResource { .. } => "wrong_resource",
        }
    }
}

#[derive(Debug, Clone)]
struct RingKey {
    key: PublicKey,
    not_before_unix_ms: u64,
    not_after_unix_ms: Option<u64>,
}

/// Public keys by id, ready to verify tokens.
#[derive(Debug, Clone)]
pub struct KeyRing {
    keys: HashMap<KeyId, RingKey>,
    skew_ms: u64,
}

impl KeyRing {
    /// Builds a ring from a key set (validated again), with
    /// [`DEFAULT_CLOCK_SKEW`].
    pub fn new(set: &KeySet) -> Result<Self, KeySetError> {
        set.validate()?;
        let keys = set
            .keys
            .iter()
            .map(|k| {
                let ring_key = RingKey {
                    key: k.public_key,
                    not_before_unix_ms: k.not_before_unix_ms,
                    not_after_unix_ms: k.not_after_unix_ms,
                };
                (k.kid.clone(), ring_key)
            })
            .collect();
        Ok(Self { keys, skew_ms: 0 }.with_clock_skew(DEFAULT_CLOCK_SKEW))
    }

    /// Sets the clock-skew allowance applied to every window check.
    pub fn with_clock_skew(mut self, skew: Duration) -> Self {
        self.skew_ms = u64::try_from(skew.as_millis()).unwrap_or(u64::MAX);
        self
    }

    /// The clock-skew allowance.
    pub fn clock_skew(&self) -> Duration {
        Duration::from_millis(self.skew_ms)
    }

    /// How many keys the ring holds.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the ring holds no key (it then refuses every token).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The key ids, sorted.
    pub fn key_ids(&self) -> Vec<&KeyId> {
        let mut ids: Vec<_> = self.keys.keys().collect();
        ids.sort();
        ids
    }

    /// Verifies `token` for `resource` at wall time `now_unix_ms` and
    /// returns its claims, which may then be believed.
    ///
    /// Order: known key id → key valid at `iat` and not expired at
    /// `now_unix_ms` (each with the skew allowance) → signature (strict
    /// Ed25519: no malleable or small-order signatures) → `res == resource`.
    pub fn verify<'t>(
        &self,
        token: &'t SignedToken,
        resource: &str,
        now_unix_ms: u64,
    ) -> Result<&'t Claims, VerifyError> {
        let claims = token.unverified_claims();
        let kid = claims.key_id();
        let key = self.keys.get(kid).ok_or_else(|| VerifyError::UnknownKey { kid: kid.clone() })?;
        let iat = claims.issued_at_unix_ms();
        if iat.saturating_add(self.skew_ms) < key.not_before_unix_ms {
            return Err(VerifyError::KeyNotYetValid {
                kid: kid.clone(),
                not_before_unix_ms: key.not_before_unix_ms,
                issued_at_unix_ms: iat,
            });
        }
        if let Some(end) = key.not_after_unix_ms {
            let end_with_skew = end.saturating_add(self.skew_ms);
            for at in [iat, now_unix_ms] {
                if at >= end_with_skew {
                    return Err(VerifyError::ExpiredKey { kid: kid.clone(), not_after_unix_ms: end, at_unix_ms: at });
                }
            }
        }
        key.key
            .0
            .verify_strict(&token.signed_bytes(), token.signature())
            .map_err(|_| VerifyError::BadSignature { kid: kid.clone() })?;
        if claims.resource() != resource {
            return Err(VerifyError::WrongResource {
                token_resource: claims.resource().to_owned(),
                expected: resource.to_owned(),
            });
        }
        Ok(claims)
    }
}
