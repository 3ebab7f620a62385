//! The public key-set file proxies read, `{"keys":[…]}`: what the
//! coordinator exports (`fencer keys export`) and each proxy loads.

use std::collections::HashSet;
use std::fmt;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ed25519_dalek::VerifyingKey;
use serde::{Deserialize, Serialize};

use crate::claims::KeyId;
use crate::files;

/// Largest key-set file, in bytes.
pub const MAX_KEY_SET_BYTES: u64 = 1024 * 1024;
/// Most keys in one key set.
pub const MAX_KEYS: usize = 256;

/// An Ed25519 public key, written as base64url (no padding) of its 32
/// bytes. Keys that are not valid curve points, and weak (small-order)
/// keys, are refused.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PublicKey(pub(crate) VerifyingKey);

/// Why bytes or text are not a usable [`PublicKey`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublicKeyError {
    /// Not base64url of exactly 32 bytes.
    #[error("a public key is base64url (no padding) of exactly 32 bytes")]
    Encoding,
    /// Not a point on the curve.
    #[error("the public key is not a valid Ed25519 point")]
    NotAPoint,
    /// A small-order key, under which forgeries are trivial.
    #[error("the public key is a weak (small-order) Ed25519 key")]
    Weak,
}

impl PublicKey {
    /// From the 32 raw bytes.
    pub fn from_bytes(bytes: &[u8; 32]) -> Result<Self, PublicKeyError> {
        let key = VerifyingKey::from_bytes(bytes).map_err(|_| PublicKeyError::NotAPoint)?;
        if key.is_weak() {
            return Err(PublicKeyError::Weak);
        }
        Ok(Self(key))
    }

    /// From base64url without padding.
    pub fn from_base64url(text: &str) -> Result<Self, PublicKeyError> {
        let mut bytes = [0u8; 32];
        match URL_SAFE_NO_PAD.decode_slice(text.as_bytes(), &mut bytes) {
            Ok(32) if text.len() == 43 => Self::from_bytes(&bytes),
            _ => Err(PublicKeyError::Encoding),
        }
    }

    /// The 32 raw bytes.
    pub fn to_bytes(&self) -> [u8; 32] {
        self.0.to_bytes()
    }

    /// base64url without padding, as in key-set files.
    pub fn to_base64url(&self) -> String {
        URL_SAFE_NO_PAD.encode(self.0.as_bytes())
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.to_base64url())
    }
}

impl Serialize for PublicKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_base64url())
    }
}

impl<'de> Deserialize<'de> for PublicKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Self::from_base64url(&text).map_err(serde::de::Error::custom)
    }
}

/// One public key and the window in which it may vouch for tokens.
///
/// `not_after_unix_ms` is exclusive and optional (no end). A token is
/// accepted only if its key was valid when it was issued and has not
/// expired now, both with the verifier's clock-skew allowance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublicKeyEntry {
    /// The key id tokens name in `kid`.
    pub kid: KeyId,
    /// The public key.
    pub public_key: PublicKey,
    /// Start of validity, Unix milliseconds.
    pub not_before_unix_ms: u64,
    /// End of validity (exclusive), Unix milliseconds; `None`: no end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_after_unix_ms: Option<u64>,
}

/// The key-set file: `{"keys":[{"kid","public_key","not_before_unix_ms","not_after_unix_ms"}]}`.
///
/// Unknown fields are refused (a misspelt `not_after_unix_ms` must not
/// silently make a key eternal).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeySet {
    /// The keys, in any order.
    pub keys: Vec<PublicKeyEntry>,
}

/// Why a key set was refused.
#[derive(Debug, thiserror::Error)]
pub enum KeySetError {
    /// The file could not be read.
    #[error("cannot read key set {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is larger than [`MAX_KEY_SET_BYTES`].
    #[error("the key set is larger than {MAX_KEY_SET_BYTES} bytes")]
    TooLarge,
    /// Not the JSON of a key set (the message names the line and column).
    #[error("the key set is not valid: {0}")]
    Json(String),
    /// More than [`MAX_KEYS`] keys.
    #[error("the key set has {0} keys; at most {MAX_KEYS} are allowed")]
    TooManyKeys(usize),
    /// Two entries share a key id.
    #[error("key id {0} appears more than once")]
    DuplicateKeyId(KeyId),
    /// `not_after_unix_ms` is not after `not_before_unix_ms`.
    #[error("key {kid}: not_after_unix_ms {not_after} is not after not_before_unix_ms {not_before}")]
    EmptyWindow {
        /// The key.
        kid: KeyId,
        /// Its start.
        not_before: u64,
        /// Its end.
        not_after: u64,
    },
}

impl KeySet {
    /// Checks the rules JSON cannot express: count, unique ids, windows.
    pub fn validate(&self) -> Result<(), KeySetError> {
        if self.keys.len() > MAX_KEYS {
            return Err(KeySetError::TooManyKeys(self.keys.len()));
        }
        let mut seen = HashSet::new();
        for k in &self.keys {
            if !seen.insert(&k.kid) {
                return Err(KeySetError::DuplicateKeyId(k.kid.clone()));
            }
            if let Some(end) = k.not_after_unix_ms
                && end <= k.not_before_unix_ms
            {
                return Err(KeySetError::EmptyWindow {
                    kid: k.kid.clone(),
                    not_before: k.not_before_unix_ms,
                    not_after: end,
                });
            }
        }
        Ok(())
    }

    /// Parses and validates a key set.
    pub fn from_json(json: &[u8]) -> Result<Self, KeySetError> {
        if json.len() as u64 > MAX_KEY_SET_BYTES {
            return Err(KeySetError::TooLarge);
        }
        let set: Self = serde_json::from_slice(json).map_err(|e| KeySetError::Json(e.to_string()))?;
        set.validate()?;
        Ok(set)
    }

    /// The file form: pretty JSON and a final newline.
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).expect("a key set serialises to JSON");
        s.push('\n');
        s
    }

    /// Reads, parses and validates a key-set file.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, KeySetError> {
        let path = path.as_ref();
        let read = |source| KeySetError::Read { path: path.to_owned(), source };
        let file = std::fs::File::open(path).map_err(read)?;
        let mut bytes = Vec::new();
        file.take(MAX_KEY_SET_BYTES + 1).read_to_end(&mut bytes).map_err(read)?;
        Self::from_json(&bytes)
    }

    /// Writes the file atomically (a temporary file, fsync, rename), mode
    /// 0644: public keys are not secret.
    pub fn write(&self, path: impl AsRef<Path>) -> std::io::Result<()> {
        files::write_atomic(path.as_ref(), self.to_json().as_bytes(), 0o644)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo";

    fn entry(kid: &str, nb: u64, na: Option<u64>) -> PublicKeyEntry {
        PublicKeyEntry {
            kid: KeyId::new(kid).unwrap(),
            public_key: PublicKey::from_base64url(KEY).unwrap(),
            not_before_unix_ms: nb,
            not_after_unix_ms: na,
        }
    }

    #[test]
    fn key_sets_round_trip_and_are_validated() {
        let set = KeySet { keys: vec![entry("a", 1, None), entry("b", 5, Some(9))] };
        let json = set.to_json();
        assert!(!json.contains("null"), "absent not_after is left out: {json}");
        assert_eq!(KeySet::from_json(json.as_bytes()).unwrap(), set);

        let dup = KeySet { keys: vec![entry("a", 1, None), entry("a", 2, None)] };
        assert!(matches!(KeySet::from_json(dup.to_json().as_bytes()), Err(KeySetError::DuplicateKeyId(_))));
        let empty = KeySet { keys: vec![entry("a", 5, Some(5))] };
        assert!(matches!(KeySet::from_json(empty.to_json().as_bytes()), Err(KeySetError::EmptyWindow { .. })));
        let typo = json.replace("not_after_unix_ms", "not_afer_unix_ms");
        assert!(matches!(KeySet::from_json(typo.as_bytes()), Err(KeySetError::Json(m)) if m.contains("not_afer")));
    }

    #[test]
    fn public_keys_must_be_strong_points() {
        assert_eq!(PublicKey::from_base64url(KEY).unwrap().to_base64url(), KEY);
        assert_eq!(PublicKey::from_base64url(&format!("{KEY}=")), Err(PublicKeyError::Encoding));
        assert_eq!(PublicKey::from_base64url(&KEY[1..]), Err(PublicKeyError::Encoding));
        // The identity point: small order.
        let mut identity = [0u8; 32];
        identity[0] = 1;
        assert_eq!(PublicKey::from_bytes(&identity), Err(PublicKeyError::Weak));
    }

    #[test]
    fn load_bounds_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.json");
        let set = KeySet { keys: vec![entry("a", 1, None)] };
        set.write(&path).unwrap();
        assert_eq!(KeySet::load(&path).unwrap(), set);
        std::fs::write(&path, vec![b' '; MAX_KEY_SET_BYTES as usize + 1]).unwrap();
        assert!(matches!(KeySet::load(&path), Err(KeySetError::TooLarge)));
        assert!(matches!(KeySet::load(dir.path().join("missing")), Err(KeySetError::Read { .. })));
    }
}
