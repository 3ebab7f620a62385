//! What a signed token says: [`Claims`] and the [`KeyId`] of the key that
//! signed it, with the rules each field must follow.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::wire::{LEASE_ID_HEX_DIGITS, LeaseId, ResourceName, ResourceNameError};

/// Longest key id, in bytes.
pub const MAX_KEY_ID_BYTES: usize = 64;

/// A signing key's id (`kid`): 1–64 bytes of `[A-Za-z0-9._-]`. It names the
/// key in tokens, key-set files and logs; it is not secret.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct KeyId(String);

/// Why a string is not a [`KeyId`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyIdError {
    /// The id is empty.
    #[error("key id is empty")]
    Empty,
    /// The id is longer than [`MAX_KEY_ID_BYTES`].
    #[error("key id is {len} bytes; at most {MAX_KEY_ID_BYTES} are allowed")]
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// A character outside `[A-Za-z0-9._-]`.
    #[error("key id contains {ch:?} at byte {at}; only [A-Za-z0-9._-] is allowed")]
    BadChar {
        /// The character.
        ch: char,
        /// Its byte offset.
        at: usize,
    },
}

impl KeyId {
    /// Validates `id`.
    pub fn new(id: impl Into<String>) -> Result<Self, KeyIdError> {
        let id = id.into();
        if id.is_empty() {
            return Err(KeyIdError::Empty);
        }
        if id.len() > MAX_KEY_ID_BYTES {
            return Err(KeyIdError::TooLong { len: id.len() });
        }
        if let Some((at, ch)) =
            id.char_indices().find(|&(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        {
            return Err(KeyIdError::BadChar { ch, at });
        }
        Ok(Self(id))
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for KeyId {
    type Error = KeyIdError;

    fn try_from(s: String) -> Result<Self, KeyIdError> {
        Self::new(s)
    }
}

impl From<KeyId> for String {
    fn from(id: KeyId) -> String {
        id.0
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why claims are not acceptable (when signing, or in a parsed token).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimsError {
    /// `kid` is not a valid [`KeyId`].
    #[error("kid: {0}")]
    KeyId(#[from] KeyIdError),
    /// `res` is not a valid [`ResourceName`] (DESIGN §2).
    #[error("res: {0}")]
    Resource(#[from] ResourceNameError),
    /// `lid` is not 32 lowercase hex digits.
    #[error("lid: the lease id must be {LEASE_ID_HEX_DIGITS} lowercase hex digits")]
    LeaseId,
}

/// The signed statement: "the coordinator granted `token` for `resource` to
/// lease `lease_id` at `issued_at_unix_ms`, and key `key_id` vouches for it".
///
/// Fields are checked when claims are made or parsed: the key id, the
/// resource ([`ResourceName`], the one rule of DESIGN §2) and the lease id
/// by their rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    key_id: KeyId,
    resource: ResourceName,
    token: u64,
    lease_id: LeaseId,
    issued_at_unix_ms: u64,
}

/// The JSON object inside a token, field names as on the wire.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WireClaims {
    kid: String,
    res: String,
    tok: u64,
    lid: String,
    iat: u64,
}

/// A `lid` as written in a token: [`LeaseId`]'s text, lowercase only, so
/// each token has exactly one encoding.
fn parse_lease_id(hex: &str) -> Result<LeaseId, ClaimsError> {
    if !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return Err(ClaimsError::LeaseId);
    }
    hex.parse().map_err(|_| ClaimsError::LeaseId)
}

impl Claims {
    /// Checks and builds claims.
    pub fn new(
        key_id: KeyId,
        resource: impl Into<String>,
        token: u64,
        lease_id: u128,
        issued_at_unix_ms: u64,
    ) -> Result<Self, ClaimsError> {
        let resource = ResourceName::new(resource)?;
        Ok(Self { key_id, resource, token, lease_id: LeaseId::from_u128(lease_id), issued_at_unix_ms })
    }

    /// `kid`: the key that signed the token.
    pub fn key_id(&self) -> &KeyId {
        &self.key_id
    }

    /// `res`: the resource the lock was granted for.
    pub fn resource(&self) -> &str {
        self.resource.as_str()
    }

    /// `tok`: the fencing token.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// `lid`: the lease id, as a number.
    pub fn lease_id(&self) -> u128 {
        self.lease_id.to_u128()
    }

    /// `lid` as written in the token: 32 lowercase hex digits.
    pub fn lease_id_hex(&self) -> String {
        self.lease_id.to_string()
    }

    /// `iat`: when the coordinator issued the token, Unix milliseconds.
    pub fn issued_at_unix_ms(&self) -> u64 {
        self.issued_at_unix_ms
    }

    pub(crate) fn to_wire(&self) -> WireClaims {
        WireClaims {
            kid: self.key_id.to_string(),
            res: self.resource.to_string(),
            tok: self.token,
            lid: self.lease_id_hex(),
            iat: self.issued_at_unix_ms,
        }
    }

    pub(crate) fn from_wire(w: WireClaims) -> Result<Self, ClaimsError> {
        let key_id = KeyId::new(w.kid)?;
        let lease_id = parse_lease_id(&w.lid)?;
        let resource = ResourceName::new(w.res)?;
        Ok(Self { key_id, resource, token: w.tok, lease_id, issued_at_unix_ms: w.iat })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_ids_are_short_and_plain() {
        assert!(KeyId::new("k1").is_ok());
        assert!(KeyId::new("2026-05.coordinator_a").is_ok());
        assert!(KeyId::new("k".repeat(64)).is_ok());
        assert_eq!(KeyId::new(""), Err(KeyIdError::Empty));
        assert_eq!(KeyId::new("k".repeat(65)), Err(KeyIdError::TooLong { len: 65 }));
        assert_eq!(KeyId::new("a/b"), Err(KeyIdError::BadChar { ch: '/', at: 1 }));
        assert!(matches!(KeyId::new("ké"), Err(KeyIdError::BadChar { .. })));
    }

    #[test]
    fn claims_check_resource_and_lease_id() {
        let k = KeyId::new("k1").unwrap();
        assert!(Claims::new(k.clone(), "db/orders", 1, 0, 0).is_ok());
        let refused = |res: String| Claims::new(k.clone(), res, 1, 0, 0).unwrap_err();
        assert_eq!(refused("".into()), ClaimsError::Resource(ResourceNameError::Empty));
        assert_eq!(refused("a".repeat(257)), ClaimsError::Resource(ResourceNameError::TooLong { len: 257 }));
        assert_eq!(refused("a b".into()), ClaimsError::Resource(ResourceNameError::BadChar { ch: ' ', at: 1 }));
        // The rules the old copy of the check lacked (issue 16).
        assert_eq!(refused("/db".into()), ClaimsError::Resource(ResourceNameError::EdgeSlash));
        assert_eq!(refused("db/".into()), ClaimsError::Resource(ResourceNameError::EdgeSlash));
        assert_eq!(refused("db//a".into()), ClaimsError::Resource(ResourceNameError::DoubleSlash));
        assert_eq!(refused("db/../a".into()), ClaimsError::Resource(ResourceNameError::DotDot));
        assert_eq!(
            parse_lease_id("6cf4a1b2c3d4e5f60718293a4b5c6d7e").map(LeaseId::to_u128),
            Ok(0x6cf4a1b2c3d4e5f60718293a4b5c6d7e)
        );
        for bad in [
            "",
            "6CF4A1B2C3D4E5F60718293A4B5C6D7E",
            "6cf4a1b2c3d4e5f60718293a4b5c6d7",
            "+cf4a1b2c3d4e5f60718293a4b5c6d7e",
        ] {
            assert_eq!(parse_lease_id(bad), Err(ClaimsError::LeaseId), "{bad}");
        }
        let c = Claims::new(k, "x", 1, 255, 0).unwrap();
        assert_eq!(c.lease_id_hex(), "000000000000000000000000000000ff");
    }
}
