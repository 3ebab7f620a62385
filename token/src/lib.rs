//! fencer-token: signed fencing tokens (DESIGN P7).
//!
//! A fencing token is only as good as the proxy's belief in it: a forged
//! `Fencing-Token: 18446744073709551615` accepted once would raise a
//! resource's epoch past every genuine token forever (P8). The coordinator
//! therefore signs what it granted, and proxies verify before an epoch moves.
//!
//! # The format
//!
//! The `Fencing-Token` header carries either a plain decimal `u64` (legacy,
//! unsigned) or `v1.<claims>.<sig>`:
//!
//! - `claims`: base64url without padding of the JSON object
//!   `{"kid": key id, "res": resource, "tok": token, "lid": lease id (32
//!   lowercase hex), "iat": issued-at Unix ms}` — exactly these fields;
//! - `sig`: base64url without padding of the Ed25519 signature over the
//!   ASCII bytes `"fencer-token-v1." + claims` (the encoded claims as sent,
//!   so nothing is canonicalised).
//!
//! Every length is bounded before anything is decoded: the whole value
//! ([`MAX_TOKEN_BYTES`]), the encoded claims ([`MAX_ENCODED_CLAIMS_BYTES`]),
//! the signature ([`ENCODED_SIGNATURE_BYTES`]), the key id
//! ([`MAX_KEY_ID_BYTES`]) and the resource ([`MAX_RESOURCE_BYTES`]).
//! Base64 is decoded strictly, so each token has exactly one encoding.
//!
//! # Keys
//!
//! A [`Signer`] holds a secret key and its [`KeyId`]; it is kept in a
//! [`SecretKeyFile`] (mode 0600). Verifiers get a [`KeySet`] file,
//! `{"keys":[{"kid","public_key","not_before_unix_ms","not_after_unix_ms"}]}`,
//! and build a [`KeyRing`], which checks: known key id → key valid at `iat`
//! and not expired now (with a clock-skew allowance) → signature → resource.
//!
//! # Layout
//! - `wire`: the nouns every fencer crate shares — [`ResourceName`] with
//!   the one rule of DESIGN §2, [`FencingToken`], [`LeaseId`].
//! - `claims`: [`Claims`], [`KeyId`] and their rules.
//! - `format`: [`PresentedToken`] (plain or signed), [`SignedToken`], the
//!   length bounds.
//! - `key_set`: [`KeySet`], [`PublicKeyEntry`], [`PublicKey`]: the public
//!   key file.
//! - `key_ring`: [`KeyRing`] and [`VerifyError`].
//! - `signer`: [`Signer`] and [`SecretKeyFile`].
//! - `files`: atomic writes with a fixed mode.
//!
//! # Example
//! ```
//! use fencer_token::{KeyId, KeyRing, KeySet, PresentedToken, Signer, VerifyError};
//!
//! // The coordinator's side.
//! let signer = Signer::generate(KeyId::new("k1")?)?;
//! let now_ms = 1_770_000_000_000;
//! let token = signer.sign("db/orders", 42, 0x6cf4a1b2c3d4e5f60718293a4b5c6d7e, now_ms)?;
//! let key_set = KeySet { keys: vec![signer.public_entry(now_ms - 1000, None)] };
//!
//! // The proxy's side: the header value, parsed, then verified.
//! let ring = KeyRing::new(&KeySet::from_json(key_set.to_json().as_bytes())?)?;
//! let PresentedToken::Signed(presented) = PresentedToken::parse(token.as_str().as_bytes())? else {
//!     unreachable!("a signed token parses as one");
//! };
//! assert_eq!(ring.verify(&presented, "db/orders", now_ms)?.token(), 42);
//! assert!(matches!(ring.verify(&presented, "db/other", now_ms), Err(VerifyError::WrongResource { .. })));
//! assert_eq!(PresentedToken::parse(b"42")?, PresentedToken::Plain(42));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod claims;
mod files;
mod format;
mod key_ring;
mod key_set;
mod signer;
mod wire;

pub use self::{
    claims::{Claims, ClaimsError, KeyId, KeyIdError, MAX_KEY_ID_BYTES},
    format::{
        ENCODED_SIGNATURE_BYTES, MAX_CLAIMS_JSON_BYTES, MAX_ENCODED_CLAIMS_BYTES, MAX_TOKEN_BYTES, PresentedToken,
        SIGNED_TOKEN_PREFIX, SIGNING_CONTEXT, SignedToken, TokenError,
    },
    key_ring::{DEFAULT_CLOCK_SKEW, KeyRing, VerifyError},
    key_set::{KeySet, KeySetError, MAX_KEY_SET_BYTES, MAX_KEYS, PublicKey, PublicKeyEntry, PublicKeyError},
    signer::{GenerateError, SecretKeyError, SecretKeyFile, Signer},
    wire::{
        FencingToken, LEASE_ID_HEX_DIGITS, LeaseId, LeaseIdError, MAX_RESOURCE_BYTES, ResourceName, ResourceNameError,
        TokenParseError,
    },
};
