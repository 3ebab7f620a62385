//! The `Fencing-Token` header: a plain decimal token or `v1.<claims>.<sig>`,
//! parsed strictly with every length bounded before anything is decoded.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ed25519_dalek::Signature;

use crate::claims::{Claims, ClaimsError, WireClaims};
use crate::wire::{FencingToken, TokenParseError};

/// Longest `Fencing-Token` value accepted, in bytes. The largest genuine
/// token (64-byte kid, 256-byte resource) is 773 bytes.
pub const MAX_TOKEN_BYTES: usize = 1024;
/// Longest claims JSON object, in bytes (the largest genuine one is 434).
pub const MAX_CLAIMS_JSON_BYTES: usize = 512;
/// Longest base64url encoding of the claims: `ceil(512 * 4 / 3)`.
pub const MAX_ENCODED_CLAIMS_BYTES: usize = 683;
/// Length of the base64url (no padding) encoding of a 64-byte signature.
pub const ENCODED_SIGNATURE_BYTES: usize = 86;
/// What every signed token starts with.
pub const SIGNED_TOKEN_PREFIX: &str = "v1.";
/// The signature covers these bytes followed by the encoded claims (domain
/// separation: a fencer token signature cannot be replayed as anything else).
pub const SIGNING_CONTEXT: &str = "fencer-token-v1.";

/// Why a header value is not a token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// The value is empty.
    #[error("the token is empty")]
    Empty,
    /// The value is longer than [`MAX_TOKEN_BYTES`].
    #[error("the token is {len} bytes; at most {MAX_TOKEN_BYTES} are allowed")]
    TooLong {
        /// Its length.
        len: usize,
    },
    /// Starts with a digit but is not all ASCII digits.
    #[error("a plain token must be a decimal number (ASCII digits only, no sign or spaces)")]
    NotDecimal,
    /// A plain token above `u64::MAX`.
    #[error("the token does not fit in an unsigned 64-bit integer")]
    Overflow,
    /// Neither a digit nor `v` first.
    #[error("the token is neither a decimal number nor a signed token (v1.<claims>.<signature>)")]
    Unrecognised,
    /// Starts with `v` but not with `v1.`.
    #[error("unsupported signed-token version; this version understands only \"v1.\" tokens")]
    UnsupportedVersion,
    /// Not exactly three dot-separated parts.
    #[error("a signed token has exactly three parts: v1.<claims>.<signature>")]
    Parts,
    /// The claims part is empty or longer than [`MAX_ENCODED_CLAIMS_BYTES`].
    #[error("the claims part is {len} bytes; it must be 1 to {MAX_ENCODED_CLAIMS_BYTES}")]
    ClaimsLength {
        /// Its length.
        len: usize,
    },
    /// The claims part is not canonical base64url without padding.
    #[error("the claims part is not base64url without padding")]
    ClaimsEncoding,
    /// The decoded claims are not the JSON object of a v1 token.
    #[error("the claims are not a v1 claims object: {0}")]
    ClaimsJson(String),
    /// A claim breaks its rule.
    #[error(transparent)]
    Claims(#[from] ClaimsError),
    /// The signature part is not [`ENCODED_SIGNATURE_BYTES`] long.
    #[error("the signature part is {len} bytes; an Ed25519 signature is {ENCODED_SIGNATURE_BYTES}")]
    SignatureLength {
        /// Its length.
        len: usize,
    },
    /// The signature part is not canonical base64url without padding.
    #[error("the signature part is not base64url without padding")]
    SignatureEncoding,
}

/// A `Fencing-Token` value, parsed but not verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PresentedToken {
    /// A legacy decimal token. Nothing vouches for it.
    Plain(u64),
    /// A signed token; check it with [`KeyRing::verify`](crate::KeyRing::verify)
    /// before believing anything it says.
    Signed(SignedToken),
}

impl PresentedToken {
    /// Parses a header value. Lengths are checked before anything is
    /// decoded; anything that is not exactly a decimal `u64` or a well-formed
    /// v1 token is refused with the rule it breaks.
    pub fn parse(value: &[u8]) -> Result<Self, TokenError> {
        if value.is_empty() {
            return Err(TokenError::Empty);
        }
        if value.len() > MAX_TOKEN_BYTES {
            return Err(TokenError::TooLong { len: value.len() });
        }
        match value[0] {
            b'0'..=b'9' => parse_plain(value).map(Self::Plain),
            b'v' => SignedToken::parse(value).map(Self::Signed),
            _ => Err(TokenError::Unrecognised),
        }
    }

    /// The fencing token the value claims (unverified for signed tokens).
    pub fn claimed_token(&self) -> u64 {
        match self {
            Self::Plain(t) => *t,
            Self::Signed(s) => s.unverified_claims().token(),
        }
    }
}

/// A plain token: [`FencingToken::parse`], the one decimal rule.
fn parse_plain(value: &[u8]) -> Result<u64, TokenError> {
    match FencingToken::parse(value) {
        Ok(t) => Ok(t.get()),
        Err(TokenParseError::Empty) => Err(TokenError::Empty),
        Err(TokenParseError::NotDecimal) => Err(TokenError::NotDecimal),
        Err(TokenParseError::TooLarge) => Err(TokenError::Overflow),
    }
}

/// A signed token, `v1.<claims>.<signature>`: well-formed, not yet verified.
#[derive(Clone, PartialEq, Eq)]
pub struct SignedToken {
    /// The whole token; ASCII.
    text: String,
    /// `text[3..claims_end]` is the encoded claims.
    claims_end: usize,
    claims: Claims,
    signature: Signature,
}

impl fmt::Debug for SignedToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SignedToken").field("claims", &self.claims).finish_non_exhaustive()
    }
}

impl fmt::Display for SignedToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

fn decode_exact(part: &[u8], out: &mut [u8]) -> Option<()> {
    // The engine is strict: no padding, no non-zero trailing bits, so every
    // byte string has exactly one accepted encoding.
    match URL_SAFE_NO_PAD.decode_slice(part, out) {
        Ok(n) if n == out.len() => Some(()),
        _ => None,
    }
}

impl SignedToken {
    /// Parses `v1.<claims>.<signature>` (see [`PresentedToken::parse`]).
    pub fn parse(value: &[u8]) -> Result<Self, TokenError> {
        if value.len() > MAX_TOKEN_BYTES {
            return Err(TokenError::TooLong { len: value.len() });
        }
        let rest = value.strip_prefix(SIGNED_TOKEN_PREFIX.as_bytes()).ok_or(TokenError::UnsupportedVersion)?;
        let mut parts = rest.split(|&b| b == b'.');
        let (Some(claims_b64), Some(sig_b64), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(TokenError::Parts);
        };
        if claims_b64.is_empty() || claims_b64.len() > MAX_ENCODED_CLAIMS_BYTES {
            return Err(TokenError::ClaimsLength { len: claims_b64.len() });
        }
        if sig_b64.len() != ENCODED_SIGNATURE_BYTES {
            return Err(TokenError::SignatureLength { len: sig_b64.len() });
        }
        let json = URL_SAFE_NO_PAD.decode(claims_b64).map_err(|_| TokenError::ClaimsEncoding)?;
        let mut sig = [0u8; 64];
        decode_exact(sig_b64, &mut sig).ok_or(TokenError::SignatureEncoding)?;
        let wire: WireClaims = serde_json::from_slice(&json).map_err(|e| TokenError::ClaimsJson(e.to_string()))?;
        let claims = Claims::from_wire(wire)?;
        // Both parts decoded as base64url, so the whole value is ASCII.
        let text = String::from_utf8(value.to_vec()).map_err(|_| TokenError::ClaimsEncoding)?;
        Ok(Self {
            claims_end: SIGNED_TOKEN_PREFIX.len() + claims_b64.len(),
            text,
            claims,
            signature: Signature::from_bytes(&sig),
        })
    }

    /// Signs `claims` with `key` (used by [`Signer`](crate::Signer)).
    pub(crate) fn sign(claims: Claims, key: &ed25519_dalek::SigningKey) -> Self {
        use ed25519_dalek::Signer as _;
        let json = serde_json::to_vec(&claims.to_wire()).expect("claims serialise to JSON");
        debug_assert!(json.len() <= MAX_CLAIMS_JSON_BYTES, "checked claims fit the bound");
        let claims_b64 = URL_SAFE_NO_PAD.encode(&json);
        let signature = key.sign(&signing_input(claims_b64.as_bytes()));
        let text = format!("{SIGNED_TOKEN_PREFIX}{claims_b64}.{}", URL_SAFE_NO_PAD.encode(signature.to_bytes()));
        Self { claims_end: SIGNED_TOKEN_PREFIX.len() + claims_b64.len(), text, claims, signature }
    }

    /// What the token claims. **Not verified**: use
    /// [`KeyRing::verify`](crate::KeyRing::verify) before acting on it.
    pub fn unverified_claims(&self) -> &Claims {
        &self.claims
    }

    /// The token as sent in the header.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The token as sent in the header.
    pub fn into_string(self) -> String {
        self.text
    }

    /// The bytes the signature covers: [`SIGNING_CONTEXT`] + encoded claims.
    pub(crate) fn signed_bytes(&self) -> Vec<u8> {
        signing_input(&self.text.as_bytes()[SIGNED_TOKEN_PREFIX.len()..self.claims_end])
    }

    pub(crate) fn signature(&self) -> &Signature {
        &self.signature
    }
}

fn signing_input(claims_b64: &[u8]) -> Vec<u8> {
    let mut msg = Vec::with_capacity(SIGNING_CONTEXT.len() + claims_b64.len());
    msg.extend_from_slice(SIGNING_CONTEXT.as_bytes());
    msg.extend_from_slice(claims_b64);
    msg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_tokens_are_strict_decimal_u64() {
        assert_eq!(PresentedToken::parse(b"42"), Ok(PresentedToken::Plain(42)));
        assert_eq!(PresentedToken::parse(b"18446744073709551615"), Ok(PresentedToken::Plain(u64::MAX)));
        assert_eq!(PresentedToken::parse(b"18446744073709551616"), Err(TokenError::Overflow));
        assert_eq!(PresentedToken::parse(b""), Err(TokenError::Empty));
        for bad in [&b"4 2"[..], b"42\n", b"0x2a", b"1v1."] {
            assert_eq!(PresentedToken::parse(bad), Err(TokenError::NotDecimal), "{bad:?}");
        }
        for bad in [&b" 42"[..], b"+42", b"-1", b"V1.a.b", b"\xff"] {
            assert_eq!(PresentedToken::parse(bad), Err(TokenError::Unrecognised), "{bad:?}");
        }
    }

    #[test]
    fn the_shape_of_a_signed_token_is_checked_before_decoding() {
        let sig = "A".repeat(ENCODED_SIGNATURE_BYTES);
        let claims = URL_SAFE_NO_PAD
            .encode(br#"{"kid":"k1","res":"r","tok":1,"lid":"00000000000000000000000000000001","iat":5}"#);
        assert!(matches!(
            PresentedToken::parse(format!("v1.{claims}.{sig}").as_bytes()),
            Ok(PresentedToken::Signed(_))
        ));
        let cases: Vec<(String, TokenError)> = vec![
            ("v2.a.b".into(), TokenError::UnsupportedVersion),
            ("v1".into(), TokenError::UnsupportedVersion),
            ("v1.abc".into(), TokenError::Parts),
            (format!("v1.{claims}.{sig}.x"), TokenError::Parts),
            (format!("v1..{sig}"), TokenError::ClaimsLength { len: 0 }),
            (format!("v1.{}.{sig}", "A".repeat(684)), TokenError::ClaimsLength { len: 684 }),
            (format!("v1.{claims}.{}", &sig[1..]), TokenError::SignatureLength { len: 85 }),
            (format!("v1.{claims}=.{sig}"), TokenError::ClaimsEncoding),
            (format!("v1.{claims}.{}B", &sig[1..]), TokenError::SignatureEncoding),
            (format!("v1.{claims}.{}", "/".repeat(ENCODED_SIGNATURE_BYTES)), TokenError::SignatureEncoding),
            (format!("v{}", "1".repeat(MAX_TOKEN_BYTES)), TokenError::TooLong { len: MAX_TOKEN_BYTES + 1 }),
        ];
        for (text, want) in cases {
            assert_eq!(PresentedToken::parse(text.as_bytes()), Err(want), "{text}");
        }
    }

    #[test]
    fn claims_must_be_exactly_the_v1_object() {
        let sig = "A".repeat(ENCODED_SIGNATURE_BYTES);
        let token = |json: &str| format!("v1.{}.{sig}", URL_SAFE_NO_PAD.encode(json));
        let lid = "00000000000000000000000000000001";
        for json in [
            format!(r#"{{"kid":"k1","res":"r","tok":1,"lid":"{lid}"}}"#),
            format!(r#"{{"kid":"k1","res":"r","tok":1,"lid":"{lid}","iat":5,"admin":true}}"#),
            format!(r#"{{"kid":"k1","res":"r","tok":1,"tok":2,"lid":"{lid}","iat":5}}"#),
            format!(r#"{{"kid":"k1","res":"r","tok":-1,"lid":"{lid}","iat":5}}"#),
            format!(r#"{{"kid":"k1","res":"r","tok":1e3,"lid":"{lid}","iat":5}}"#),
            format!(r#"{{"kid":"k1","res":"r","tok":18446744073709551616,"lid":"{lid}","iat":5}}"#),
            "[]".to_owned(),
        ] {
            assert!(matches!(PresentedToken::parse(token(&json).as_bytes()), Err(TokenError::ClaimsJson(_))), "{json}");
        }
        let bad_res = format!(r#"{{"kid":"k1","res":"a b","tok":1,"lid":"{lid}","iat":5}}"#);
        assert!(matches!(
            PresentedToken::parse(token(&bad_res).as_bytes()),
            Err(TokenError::Claims(ClaimsError::Resource(crate::ResourceNameError::BadChar { .. })))
        ));
        let bad_kid = format!(r#"{{"kid":"","res":"a","tok":1,"lid":"{lid}","iat":5}}"#);
        assert!(matches!(
            PresentedToken::parse(token(&bad_kid).as_bytes()),
            Err(TokenError::Claims(ClaimsError::KeyId(_)))
        ));
    }
}
