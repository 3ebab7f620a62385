//! Validated newtypes used at every API edge: [`ResourceName`], [`RequestId`],
//! [`LeaseId`], [`FencingToken`], [`Holder`], [`AuditText`], and [`NodeId`].

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Longest resource name, in bytes (DESIGN §2).
pub const MAX_RESOURCE_LEN: usize = 256;
/// Shortest request id, in bytes (DESIGN §2).
pub const MIN_REQUEST_ID_LEN: usize = 8;
/// Longest request id, in bytes (DESIGN §2).
pub const MAX_REQUEST_ID_LEN: usize = 128;
/// Longest holder description, in bytes.
pub const MAX_HOLDER_LEN: usize = 256;
/// Longest caller or reason an operator attaches to an audited action, in bytes.
pub const MAX_AUDIT_TEXT_LEN: usize = 1024;

/// Why a field was refused. The `Display` text names the field and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidField {
    /// The resource name is empty.
    #[error("resource: must not be empty")]
    EmptyResource,
    /// The resource name is longer than [`MAX_RESOURCE_LEN`].
    #[error("resource: {len} bytes is longer than the limit of {MAX_RESOURCE_LEN}")]
    ResourceTooLong {
        /// Length of the refused name.
        len: usize,
    },
    /// The resource name contains a byte outside `[A-Za-z0-9._:/-]`.
    #[error("resource: character {ch:?} at byte {at} is not allowed (allowed: A-Z a-z 0-9 . _ : / -)")]
    ResourceBadChar {
        /// The refused character.
        ch: char,
        /// Its byte offset.
        at: usize,
    },
    /// The resource name starts or ends with `/`.
    #[error("resource: must not start or end with '/'")]
    ResourceEdgeSlash,
    /// The resource name contains `//`.
    #[error("resource: must not contain '//'")]
    ResourceDoubleSlash,
    /// The resource name contains `..`.
    #[error("resource: must not contain '..'")]
    ResourceDotDot,
    /// The request id is shorter or longer than allowed.
    #[error("request_id: {len} bytes is outside {MIN_REQUEST_ID_LEN}..={MAX_REQUEST_ID_LEN} bytes")]
    RequestIdLength {
        /// Length of the refused id.
        len: usize,
    },
    /// The request id contains a character that is not printable ASCII.
    #[error("request_id: character at byte {at} is not printable ASCII (0x21..=0x7e)")]
    RequestIdBadChar {
        /// Byte offset of the first refused character.
        at: usize,
    },
    /// The lease id is not 32 lowercase or uppercase hex digits.
    #[error("lease_id: must be 32 hex digits, got {len} characters")]
    LeaseIdFormat {
        /// Length of the refused text.
        len: usize,
    },
    /// The holder text is too long or contains control characters.
    #[error("holder: must be at most {MAX_HOLDER_LEN} bytes without control characters")]
    Holder,
    /// A caller or reason of an operator action is too long or contains
    /// control characters.
    #[error("{field}: must be at most {MAX_AUDIT_TEXT_LEN} bytes without control characters")]
    AuditText {
        /// `caller` or `reason`.
        field: &'static str,
    },
    /// The ttl is outside the policy bounds.
    #[error("ttl_ms: {value} ms is outside the allowed range {min}..={max} ms")]
    Ttl {
        /// The refused value.
        value: u64,
        /// Policy minimum.
        min: u64,
        /// Policy maximum.
        max: u64,
    },
    /// The wait timeout is above the policy maximum.
    #[error("wait_timeout_ms: {value} ms is above the maximum of {max} ms")]
    WaitTimeout {
        /// The refused value.
        value: u64,
        /// Policy maximum.
        max: u64,
    },
    /// The page size of a listing is above the maximum.
    #[error("page_size: {value} is above the maximum of {max}")]
    PageSize {
        /// The refused value.
        value: u32,
        /// The maximum.
        max: u32,
    },
    /// The page token is not one this server issued.
    #[error("page_token: not a token returned by ListLocks")]
    PageToken,
    /// The prefix of a listing is not a valid resource prefix.
    #[error("prefix: {0}")]
    Prefix(String),
}

impl InvalidField {
    /// The name of the request field that was refused.
    pub fn field(&self) -> &'static str {
        match self {
            Self::EmptyResource
            | Self::ResourceTooLong { .. }
            | Self::ResourceBadChar { .. }
            | Self::ResourceEdgeSlash
            | Self::ResourceDoubleSlash
            | Self::ResourceDotDot => "resource",
            Self::RequestIdLength { .. } | Self::RequestIdBadChar { .. } => "request_id",
            Self::LeaseIdFormat { .. } => "lease_id",
            Self::Holder => "holder",
            Self::AuditText { field } => field,
            Self::Ttl { .. } => "ttl_ms",
            Self::WaitTimeout { .. } => "wait_timeout_ms",
            Self::PageSize { .. } => "page_size",
            Self::PageToken => "page_token",
            Self::Prefix(_) => "prefix",
        }
    }
}

/// A normalised business name of a lockable resource: 1–256 bytes of
/// `[A-Za-z0-9._:/-]`, no leading or trailing `/`, no `//`, no `..`.
///
/// ```
/// use fencer_coordinator::ResourceName;
///
/// assert!(ResourceName::new("orders/42").is_ok());
/// assert!(ResourceName::new("/orders").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ResourceName(String);

impl ResourceName {
    /// Validates `name` against the rules of DESIGN §2.
    pub fn new(name: impl Into<String>) -> Result<Self, InvalidField> {
        let name = name.into();
        check_resource_chars(&name)?;
        if name.is_empty() {
            return Err(InvalidField::EmptyResource);
        }
        if name.starts_with('/') || name.ends_with('/') {
            return Err(InvalidField::ResourceEdgeSlash);
        }
        Ok(Self(name))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Checks length, alphabet, `//` and `..` — the rules a prefix must follow too.
pub(crate) fn check_resource_chars(name: &str) -> Result<(), InvalidField> {
    if name.len() > MAX_RESOURCE_LEN {
        return Err(InvalidField::ResourceTooLong { len: name.len() });
    }
    if let Some((at, ch)) =
        name.char_indices().find(|(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '/' | '-')))
    {
        return Err(InvalidField::ResourceBadChar { ch, at });
    }
    if name.contains("//") {
        return Err(InvalidField::ResourceDoubleSlash);
    }
    if name.contains("..") {
        return Err(InvalidField::ResourceDotDot);
    }
    Ok(())
}

/// Lets the lock table be searched by a prefix (`str` orders as the name does).
impl std::borrow::Borrow<str> for ResourceName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ResourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A caller-chosen id for one logical acquire attempt, reused on every retry
/// (I7): 8–128 bytes of printable ASCII.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RequestId(String);

impl RequestId {
    /// Validates a caller-supplied request id.
    pub fn new(id: impl Into<String>) -> Result<Self, InvalidField> {
        let id = id.into();
        if !(MIN_REQUEST_ID_LEN..=MAX_REQUEST_ID_LEN).contains(&id.len()) {
            return Err(InvalidField::RequestIdLength { len: id.len() });
        }
        if let Some(at) = id.bytes().position(|b| !(0x21..=0x7e).contains(&b)) {
            return Err(InvalidField::RequestIdBadChar { at });
        }
        Ok(Self(id))
    }

    /// A fresh random request id (32 hex digits) from the OS CSPRNG.
    pub fn random() -> Result<Self, getrandom::Error> {
        Ok(Self(LeaseId::random()?.to_string()))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// 128 random bits naming one lease; the capability to renew and release it.
/// Shown as 32 lowercase hex digits.
///
/// Held as two `u64` halves (high, low) rather than a `u128`: a `u128` is
/// 16-byte aligned, which pads every record that holds a lease id (the dedup
/// table keeps ~240,000 of them at the seed rate). The order, the text form
/// and the encoding (a `u128`) are those of the numeric value.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseId([u64; 2]);

impl LeaseId {
    /// Draws a lease id from the OS CSPRNG. Only the leader does this, before
    /// proposing, so that applying the log stays deterministic.
    pub fn random() -> Result<Self, getrandom::Error> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes)?;
        Ok(Self::from_u128(u128::from_le_bytes(bytes)))
    }

    /// Builds a lease id from its numeric value (tests and decoding).
    pub const fn from_u128(v: u128) -> Self {
        Self([(v >> 64) as u64, v as u64])
    }

    /// The numeric value.
    pub const fn to_u128(self) -> u128 {
        ((self.0[0] as u128) << 64) | self.0[1] as u128
    }
}

impl Serialize for LeaseId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u128(self.to_u128())
    }
}

impl<'de> Deserialize<'de> for LeaseId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        u128::deserialize(d).map(Self::from_u128)
    }
}

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.to_u128())
    }
}

impl fmt::Debug for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LeaseId({:032x})", self.to_u128())
    }
}

impl FromStr for LeaseId {
    type Err = InvalidField;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(InvalidField::LeaseIdFormat { len: s.len() });
        }
        u128::from_str_radix(s, 16).map(Self::from_u128).map_err(|_| InvalidField::LeaseIdFormat { len: s.len() })
    }
}

/// A fencing token: the raft log index of the entry that granted the lock (I2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct FencingToken(pub u64);

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Free-text identity of a holder (host/pid/job), for humans and the audit log.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Holder(String);

impl Holder {
    /// Validates a holder description: at most 256 bytes, no control characters.
    pub fn new(text: impl Into<String>) -> Result<Self, InvalidField> {
        let text = text.into();
        if text.len() > MAX_HOLDER_LEN || text.chars().any(char::is_control) {
            return Err(InvalidField::Holder);
        }
        Ok(Self(text))
    }

    /// The description.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Free text an operator attaches to an audited action — who asked, why:
/// at most [`MAX_AUDIT_TEXT_LEN`] bytes without control characters, so an
/// audit record stays one line.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct AuditText(String);

impl AuditText {
    /// Validates `text` for the request field `field` (named in the error).
    pub fn new(text: impl Into<String>, field: &'static str) -> Result<Self, InvalidField> {
        let text = text.into();
        if text.len() > MAX_AUDIT_TEXT_LEN || text.chars().any(char::is_control) {
            return Err(InvalidField::AuditText { field });
        }
        Ok(Self(text))
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for AuditText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A raft node id.
pub type NodeId = u64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_rules_each_name_the_broken_rule() {
        assert_eq!(ResourceName::new(""), Err(InvalidField::EmptyResource));
        assert_eq!(ResourceName::new("a".repeat(257)), Err(InvalidField::ResourceTooLong { len: 257 }));
        assert!(ResourceName::new("a".repeat(256)).is_ok());
        assert_eq!(ResourceName::new("a b"), Err(InvalidField::ResourceBadChar { ch: ' ', at: 1 }));
        assert_eq!(ResourceName::new("/a"), Err(InvalidField::ResourceEdgeSlash));
        assert_eq!(ResourceName::new("a/"), Err(InvalidField::ResourceEdgeSlash));
        assert_eq!(ResourceName::new("a//b"), Err(InvalidField::ResourceDoubleSlash));
        assert_eq!(ResourceName::new("a/../b"), Err(InvalidField::ResourceDotDot));
        assert!(ResourceName::new("db/orders:42.v1_x-y").is_ok());
        assert_eq!(ResourceName::new("é"), Err(InvalidField::ResourceBadChar { ch: 'é', at: 0 }));
    }

    #[test]
    fn request_id_bounds() {
        assert!(RequestId::new("1234567").is_err());
        assert!(RequestId::new("12345678").is_ok());
        assert!(RequestId::new("x".repeat(128)).is_ok());
        assert!(RequestId::new("x".repeat(129)).is_err());
        assert_eq!(RequestId::new("abcd efgh"), Err(InvalidField::RequestIdBadChar { at: 4 }));
        assert_eq!(RequestId::random().unwrap().as_str().len(), 32);
    }

    #[test]
    fn lease_id_round_trips_as_hex() {
        let id = LeaseId::random().unwrap();
        let text = id.to_string();
        assert_eq!(text.len(), 32);
        assert_eq!(text.parse::<LeaseId>().unwrap(), id);
        assert!("xyz".parse::<LeaseId>().is_err());
        assert!("0".repeat(33).parse::<LeaseId>().is_err());
        assert!("g".repeat(32).parse::<LeaseId>().is_err());
    }

    proptest::proptest! {
        /// The two-halves form keeps the numeric value's order, text and
        /// encoding, so state files and snapshots written with the `u128`
        /// form read the same.
        #[test]
        fn lease_id_keeps_the_u128_order_text_and_encoding(a: u128, b: u128) {
            let (x, y) = (LeaseId::from_u128(a), LeaseId::from_u128(b));
            proptest::prop_assert_eq!(x.to_u128(), a);
            proptest::prop_assert_eq!(x.cmp(&y), a.cmp(&b));
            proptest::prop_assert_eq!(x.to_string(), format!("{a:032x}"));
            let bytes = postcard::to_stdvec(&x).unwrap();
            proptest::prop_assert_eq!(&bytes, &postcard::to_stdvec(&a).unwrap());
            proptest::prop_assert_eq!(postcard::from_bytes::<LeaseId>(&bytes).unwrap(), x);
        }
    }

    #[test]
    fn audit_text_stays_one_bounded_line() {
        assert!(AuditText::new("alice: stuck job, ticket OPS-7", "reason").is_ok());
        assert_eq!(AuditText::new("a\nb", "reason"), Err(InvalidField::AuditText { field: "reason" }));
        assert_eq!(InvalidField::AuditText { field: "caller" }.field(), "caller");
        assert!(AuditText::new("x".repeat(MAX_AUDIT_TEXT_LEN + 1), "caller").is_err());
    }

    #[test]
    fn holder_refuses_control_characters() {
        assert!(Holder::new("host-1/pid 42").is_ok());
        assert!(Holder::new("a\nb").is_err());
        assert!(Holder::new("x".repeat(257)).is_err());
    }
}
