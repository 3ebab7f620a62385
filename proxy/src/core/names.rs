//! The newtypes that cross the proxy's edges: [`ResourceName`] (DESIGN §2
//! rules) and [`FencingToken`] (a `u64` carried in a header).

use std::fmt;

use serde::{Deserialize, Serialize};

/// Longest resource name, in bytes (DESIGN §2).
pub const MAX_RESOURCE_NAME_BYTES: usize = 256;

/// A normalised lock resource name: 1–256 bytes of `[A-Za-z0-9._:/-]`, no
/// leading or trailing `/`, no `//`, no `..`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct ResourceName(String);

/// Why a string is not a valid [`ResourceName`]; each variant names the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourceNameError {
    /// The name is empty.
    #[error("resource name is empty")]
    Empty,
    /// The name is longer than [`MAX_RESOURCE_NAME_BYTES`].
    #[error("resource name is {len} bytes; at most {MAX_RESOURCE_NAME_BYTES} are allowed")]
    TooLong {
        /// Length of the rejected name in bytes.
        len: usize,
    },
    /// A character outside `[A-Za-z0-9._:/-]`.
    #[error("resource name contains {ch:?} at byte {at}; only [A-Za-z0-9._:/-] is allowed")]
    BadChar {
        /// The offending character.
        ch: char,
        /// Its byte offset.
        at: usize,
    },
    /// Starts or ends with `/`.
    #[error("resource name must not start or end with '/'")]
    EdgeSlash,
    /// Contains `//`.
    #[error("resource name must not contain '//'")]
    DoubleSlash,
    /// Contains `..`.
    #[error("resource name must not contain '..'")]
    DotDot,
}

impl ResourceName {
    /// Validates `name` against the DESIGN §2 rules.
    pub fn new(name: impl Into<String>) -> Result<Self, ResourceNameError> {
        let name = name.into();
        validate_resource_name(&name)?;
        Ok(Self(name))
    }

    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for ResourceName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::new(s).map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for ResourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn validate_resource_name(name: &str) -> Result<(), ResourceNameError> {
    if name.is_empty() {
        return Err(ResourceNameError::Empty);
    }
    if name.len() > MAX_RESOURCE_NAME_BYTES {
        return Err(ResourceNameError::TooLong { len: name.len() });
    }
    if let Some((at, ch)) =
        name.char_indices().find(|&(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '/' | '-')))
    {
        return Err(ResourceNameError::BadChar { ch, at });
    }
    if name.starts_with('/') || name.ends_with('/') {
        return Err(ResourceNameError::EdgeSlash);
    }
    if name.contains("//") {
        return Err(ResourceNameError::DoubleSlash);
    }
    if name.contains("..") {
        return Err(ResourceNameError::DotDot);
    }
    Ok(())
}

/// A fencing token as issued by the coordinator: the raft log index of the
/// grant (DESIGN I2). Carried as a decimal `u64` in a header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct FencingToken(u64);

/// Why a header value is not a [`FencingToken`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenParseError {
    /// The value is empty.
    #[error("the token is empty")]
    Empty,
    /// The value has something other than ASCII digits.
    #[error("the token must be a decimal number (ASCII digits only)")]
    NotDecimal,
    /// The value does not fit in 64 bits.
    #[error("the token does not fit in an unsigned 64-bit integer")]
    TooLarge,
}

impl FencingToken {
    /// Wraps a raw token.
    pub const fn new(value: u64) -> Self {
        Self(value)
    }

    /// The raw value.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// Parses a header value: ASCII digits only, no sign, no whitespace.
    pub fn parse(value: &[u8]) -> Result<Self, TokenParseError> {
        if value.is_empty() {
            return Err(TokenParseError::Empty);
        }
        if !value.iter().all(u8::is_ascii_digit) {
            return Err(TokenParseError::NotDecimal);
        }
        let mut n: u64 = 0;
        for &b in value {
            n = n.checked_mul(10).and_then(|n| n.checked_add(u64::from(b - b'0'))).ok_or(TokenParseError::TooLarge)?;
        }
        Ok(Self(n))
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_names_follow_design_rules() {
        for ok in ["db/metrics", "a", "x.y:z_w-1/2", &"a".repeat(256)] {
            assert!(ResourceName::new(ok).is_ok(), "{ok}");
        }
        assert_eq!(ResourceName::new(""), Err(ResourceNameError::Empty));
        assert_eq!(ResourceName::new("a".repeat(257)), Err(ResourceNameError::TooLong { len: 257 }));
        assert_eq!(ResourceName::new("a b"), Err(ResourceNameError::BadChar { ch: ' ', at: 1 }));
        assert_eq!(ResourceName::new("/a"), Err(ResourceNameError::EdgeSlash));
        assert_eq!(ResourceName::new("a/"), Err(ResourceNameError::EdgeSlash));
        assert_eq!(ResourceName::new("a//b"), Err(ResourceNameError::DoubleSlash));
        assert_eq!(ResourceName::new("a/../b"), Err(ResourceNameError::DotDot));
        assert!(matches!(ResourceName::new("é"), Err(ResourceNameError::BadChar { .. })));
    }

    #[test]
    fn tokens_are_strict_decimal_u64() {
        assert_eq!(FencingToken::parse(b"42"), Ok(FencingToken::new(42)));
        assert_eq!(FencingToken::parse(b"18446744073709551615"), Ok(FencingToken::new(u64::MAX)));
        assert_eq!(FencingToken::parse(b"18446744073709551616"), Err(TokenParseError::TooLarge));
        assert_eq!(FencingToken::parse(b""), Err(TokenParseError::Empty));
        for bad in [&b" 42"[..], b"+42", b"-1", b"4 2", b"0x2a", b"42\n"] {
            assert_eq!(FencingToken::parse(bad), Err(TokenParseError::NotDecimal), "{bad:?}");
        }
    }
}
