//! [`Signer`] (a secret key and its id) and the secret-key file
//! ([`SecretKeyFile`]) it is kept in, written with mode 0600.

use std::fmt;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ed25519_dalek::SigningKey;
use serde::{Deserialize, Serialize};
use zeroize::Zeroize as _;

use crate::claims::{Claims, ClaimsError, KeyId};
use crate::files;
use crate::format::SignedToken;
use crate::key_set::{PublicKey, PublicKeyEntry};

/// Signs tokens with one Ed25519 key. `Debug` never shows the secret; the
/// key is wiped from memory when the signer is dropped.
#[derive(Clone)]
pub struct Signer {
    kid: KeyId,
    key: SigningKey,
}

impl fmt::Debug for Signer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Signer").field("kid", &self.kid).field("public_key", &self.public_key()).finish()
    }
}

/// The OS random generator failed, so no key could be made.
#[derive(Debug, thiserror::Error)]
#[error("cannot draw a new signing key from the OS random generator: {0}")]
pub struct GenerateError(String);

impl Signer {
    /// A new key from the OS CSPRNG.
    pub fn generate(kid: KeyId) -> Result<Self, GenerateError> {
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed).map_err(|e| GenerateError(e.to_string()))?;
        let signer = Self::from_secret_bytes(kid, &seed);
        seed.zeroize();
        Ok(signer)
    }

    /// From the 32-byte secret (the Ed25519 seed).
    pub fn from_secret_bytes(kid: KeyId, secret: &[u8; 32]) -> Self {
        Self { kid, key: SigningKey::from_bytes(secret) }
    }

    /// The key id put in every token's `kid`.
    pub fn key_id(&self) -> &KeyId {
        &self.kid
    }

    /// The public half, for key sets.
    pub fn public_key(&self) -> PublicKey {
        PublicKey(self.key.verifying_key())
    }

    /// The key-set entry for this key with the given window.
    pub fn public_entry(&self, not_before_unix_ms: u64, not_after_unix_ms: Option<u64>) -> PublicKeyEntry {
        PublicKeyEntry { kid: self.kid.clone(), public_key: self.public_key(), not_before_unix_ms, not_after_unix_ms }
    }

    /// Signs the grant of `token` for `resource` to lease `lease_id` at
    /// `issued_at_unix_ms`. Fails only when `resource` breaks the claim
    /// rules.
    pub fn sign(
        &self,
        resource: &str,
        token: u64,
        lease_id: u128,
        issued_at_unix_ms: u64,
    ) -> Result<SignedToken, ClaimsError> {
        let claims = Claims::new(self.kid.clone(), resource, token, lease_id, issued_at_unix_ms)?;
        Ok(SignedToken::sign(claims, &self.key))
    }
}

/// Largest secret-key file, in bytes.
const MAX_SECRET_FILE_BYTES: u64 = 64 * 1024;

/// A secret-key file: `{"kid","secret_key","not_before_unix_ms","not_after_unix_ms"}`
/// with the secret as base64url (no padding) of its 32 bytes.
///
/// [`write`](Self::write) creates it with mode 0600; [`load`](Self::load)
/// refuses a file that group or others can read or write.
#[derive(Debug, Clone)]
pub struct SecretKeyFile {
    signer: Signer,
    not_before_unix_ms: u64,
    not_after_unix_ms: Option<u64>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireSecret {
    kid: KeyId,
    secret_key: String,
    not_before_unix_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    not_after_unix_ms: Option<u64>,
}

impl Drop for WireSecret {
    fn drop(&mut self) {
        // The encoded secret does not outlive its use.
        self.secret_key.zeroize();
    }
}

/// Why a secret-key file was refused.
#[derive(Debug, thiserror::Error)]
pub enum SecretKeyError {
    /// The file could not be read.
    #[error("cannot read secret key {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Group or others may read or write the file.
    #[error("secret key {path} has mode {mode:o}; it must not be accessible by group or others (chmod 600)")]
    Permissions {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// Not a secret-key file (the message names the line and column).
    #[error("the secret key file is not valid: {0}")]
    Invalid(String),
}

impl SecretKeyFile {
    /// A file for `signer` with its window (`not_after` exclusive).
    pub fn new(signer: Signer, not_before_unix_ms: u64, not_after_unix_ms: Option<u64>) -> Self {
        Self { signer, not_before_unix_ms, not_after_unix_ms }
    }

    /// The signer.
    pub fn signer(&self) -> &Signer {
        &self.signer
    }

    /// Start of validity, Unix milliseconds.
    pub fn not_before_unix_ms(&self) -> u64 {
        self.not_before_unix_ms
    }

    /// End of validity (exclusive), Unix milliseconds.
    pub fn not_after_unix_ms(&self) -> Option<u64> {
        self.not_after_unix_ms
    }

    /// The public entry for key sets, with this file's window.
    pub fn public_entry(&self) -> PublicKeyEntry {
        self.signer.public_entry(self.not_before_unix_ms, self.not_after_unix_ms)
    }

    /// Parses a secret-key file's contents.
    pub fn from_json(json: &[u8]) -> Result<Self, SecretKeyError> {
        let wire: WireSecret = serde_json::from_slice(json).map_err(|e| SecretKeyError::Invalid(e.to_string()))?;
        let mut secret = [0u8; 32];
        let decoded = URL_SAFE_NO_PAD.decode_slice(wire.secret_key.as_bytes(), &mut secret);
        if !matches!(decoded, Ok(32)) || wire.secret_key.len() != 43 {
            return Err(SecretKeyError::Invalid("secret_key must be base64url (no padding) of 32 bytes".into()));
        }
        if let Some(end) = wire.not_after_unix_ms
            && end <= wire.not_before_unix_ms
        {
            return Err(SecretKeyError::Invalid(format!(
                "not_after_unix_ms {end} is not after not_before_unix_ms {}",
                wire.not_before_unix_ms
            )));
        }
        let signer = Signer::from_secret_bytes(wire.kid.clone(), &secret);
        secret.zeroize();
        Ok(Self::new(signer, wire.not_before_unix_ms, wire.not_after_unix_ms))
    }

    /// The file's contents. They contain the secret key.
    pub fn to_secret_json(&self) -> String {
        let wire = WireSecret {
            kid: self.signer.kid.clone(),
            secret_key: URL_SAFE_NO_PAD.encode(self.signer.key.as_bytes()),
            not_before_unix_ms: self.not_before_unix_ms,
            not_after_unix_ms: self.not_after_unix_ms,
        };
        let mut s = serde_json::to_string_pretty(&wire).expect("a secret key serialises to JSON");
        // `wire` wipes its copy of the secret when dropped.
        s.push('\n');
        s
    }

    /// Reads a secret-key file; on Unix, refuses one that group or others
    /// can access.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, SecretKeyError> {
        let path = path.as_ref();
        let read = |source| SecretKeyError::Read { path: path.to_owned(), source };
        let file = std::fs::File::open(path).map_err(read)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = file.metadata().map_err(read)?.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                return Err(SecretKeyError::Permissions { path: path.to_owned(), mode });
            }
        }
        let mut bytes = Vec::new();
        file.take(MAX_SECRET_FILE_BYTES).read_to_end(&mut bytes).map_err(read)?;
        let parsed = Self::from_json(&bytes);
        bytes.zeroize();
        parsed
    }

    /// Writes the file atomically with mode 0600 (created so, never
    /// widened afterwards).
    pub fn write(&self, path: impl AsRef<Path>) -> std::io::Result<()> {
        let mut json = self.to_secret_json();
        let written = files::write_atomic(path.as_ref(), json.as_bytes(), 0o600);
        json.zeroize();
        written
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_files_are_private_and_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k1.secret.json");
        let signer = Signer::generate(KeyId::new("k1").unwrap()).unwrap();
        let file = SecretKeyFile::new(signer.clone(), 10, Some(20));
        file.write(&path).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        }
        let loaded = SecretKeyFile::load(&path).unwrap();
        assert_eq!(loaded.public_entry(), signer.public_entry(10, Some(20)));
        assert!(!format!("{loaded:?}").contains(&URL_SAFE_NO_PAD.encode(signer.key.as_bytes())));

        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
            assert!(matches!(SecretKeyFile::load(&path), Err(SecretKeyError::Permissions { mode: 0o640, .. })));
        }
    }

    #[test]
    fn malformed_secret_files_are_refused() {
        let good =
            SecretKeyFile::new(Signer::from_secret_bytes(KeyId::new("k").unwrap(), &[7; 32]), 1, None).to_secret_json();
        assert!(SecretKeyFile::from_json(good.as_bytes()).is_ok());
        for bad in [
            good.replace("\"kid\": \"k\"", "\"kid\": \"k/1\""),
            good.replace("\"not_before_unix_ms\": 1", "\"not_before_unix_ms\": 1, \"not_after_unix_ms\": 1"),
            good.replace("\"secret_key\": \"", "\"secret_key\": \"A"),
            good.replace("kid", "key_id"),
        ] {
            assert!(matches!(SecretKeyFile::from_json(bad.as_bytes()), Err(SecretKeyError::Invalid(_))), "{bad}");
        }
    }
}
