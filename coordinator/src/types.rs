//! Validated newtypes used at every API edge: [`RequestId`], [`Holder`],
//! [`AuditText`], [`NodeId`], and the shared nouns of every fencer crate —
//! [`ResourceName`], [`LeaseId`], [`FencingToken`] — defined once in
//! `fencer_token` and re-exported here. [`InvalidField`] names the request
//! field a refusal is about.

use std::fmt;

use serde::{Deserialize, Serialize};

pub use fencer_token::{FencingToken, LeaseId, ResourceName};
use fencer_token::{LeaseIdError, ResourceNameError};

/// Longest resource name, in bytes (DESIGN §2).
pub const MAX_RESOURCE_LEN: usize = fencer_token::MAX_RESOURCE_BYTES;
/// Shortest request id, in bytes (DESIGN §2).
pub const MIN_REQUEST_ID_LEN: usize = 8;
/// Longest request id, in bytes (DESIGN §2).
pub const MAX_REQUEST_ID_LEN: usize = 128;
/// Longest holder description, in bytes.
pub const MAX_HOLDER_LEN: usize = 256;
/// Longest caller or reason an operator attaches to an audited action, in bytes.
pub const MAX_AUDIT_TEXT_LEN: usize = 1024;
/// Most items in one Batch call.
pub(crate) const MAX_BATCH_ITEMS: usize = 256;

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
    /// A Batch call with no items or more than [`MAX_BATCH_ITEMS`].
    #[error("items: {count} items is outside 1..={MAX_BATCH_ITEMS}")]
    BatchItems {
        /// The number of items sent.
        count: usize,
    },
    /// A batch item that names no call.
    #[error("call: a batch item must be an acquire, a renew or a release")]
    BatchItemEmpty,
    /// An acquire in a batch that asks to wait.
    #[error("wait_timeout_ms: an acquire in a batch cannot wait ({value} ms asked); send it alone")]
    BatchedWait {
        /// The refused value.
        value: u64,
    },
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
            Self::WaitTimeout { .. } | Self::BatchedWait { .. } => "wait_timeout_ms",
            Self::PageSize { .. } => "page_size",
            Self::PageToken => "page_token",
            Self::Prefix(_) => "prefix",
            Self::BatchItems { .. } => "items",
            Self::BatchItemEmpty => "call",
        }
    }
}

/// A refused resource name, as the request field `resource`.
impl From<ResourceNameError> for InvalidField {
    fn from(e: ResourceNameError) -> Self {
        match e {
            ResourceNameError::Empty => Self::EmptyResource,
            ResourceNameError::TooLong { len } => Self::ResourceTooLong { len },
            ResourceNameError::BadChar { ch, at } => Self::ResourceBadChar { ch, at },
            ResourceNameError::EdgeSlash => Self::ResourceEdgeSlash,
            ResourceNameError::DoubleSlash => Self::ResourceDoubleSlash,
            ResourceNameError::DotDot => Self::ResourceDotDot,
        }
    }
}

/// A refused lease id, as the request field `lease_id`.
impl From<LeaseIdError> for InvalidField {
    fn from(e: LeaseIdError) -> Self {
        Self::LeaseIdFormat { len: e.len() }
    }
}

/// Checks the rules a prefix of resource names must follow too (a listing's
/// prefix, a tenant's namespace): length, alphabet, `//` and `..`.
pub(crate) fn check_resource_chars(name: &str) -> Result<(), InvalidField> {
    ResourceName::check_prefix(name).map_err(InvalidField::from)
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

    fn resource(name: impl Into<String>) -> Result<ResourceName, InvalidField> {
        ResourceName::new(name).map_err(InvalidField::from)
    }

    #[test]
    fn resource_rules_each_name_the_broken_rule() {
        assert_eq!(resource(""), Err(InvalidField::EmptyResource));
        assert_eq!(resource("a".repeat(257)), Err(InvalidField::ResourceTooLong { len: 257 }));
        assert!(resource("a".repeat(256)).is_ok());
        assert_eq!(resource("a b"), Err(InvalidField::ResourceBadChar { ch: ' ', at: 1 }));
        assert_eq!(resource("/a"), Err(InvalidField::ResourceEdgeSlash));
        assert_eq!(resource("a/"), Err(InvalidField::ResourceEdgeSlash));
        assert_eq!(resource("a//b"), Err(InvalidField::ResourceDoubleSlash));
        assert_eq!(resource("a/../b"), Err(InvalidField::ResourceDotDot));
        assert!(resource("db/orders:42.v1_x-y").is_ok());
        assert_eq!(resource("é"), Err(InvalidField::ResourceBadChar { ch: 'é', at: 0 }));
        assert_eq!(
            resource("a//b").unwrap_err().to_string(),
            "resource: must not contain '//'",
            "the refusal names the field and the rule"
        );
    }

    proptest::proptest! {
        /// Every place the coordinator checks a resource name uses the one
        /// rule of `fencer_token::ResourceName`: requests (with the field
        /// named), listing prefixes and tenant namespaces, and decoding a
        /// name from a log entry or a snapshot.
        #[test]
        fn the_coordinator_checks_names_by_the_shared_rule(name in "[a/.:_ é-]{0,8}|[A-Za-z0-9./~-]{0,12}|[a-z/]{250,260}|.{0,6}") {
            let shared = fencer_token::ResourceName::new(name.as_str());
            let here = resource(name.as_str());
            proptest::prop_assert_eq!(here.is_ok(), shared.is_ok(), "{:?}", name);
            if let (Err(here), Err(shared)) = (&here, &shared) {
                proptest::prop_assert_eq!(here.field(), "resource");
                proptest::prop_assert_eq!(here, &InvalidField::from(shared.clone()));
            }
            proptest::prop_assert_eq!(
                check_resource_chars(&name).is_ok(),
                fencer_token::ResourceName::check_prefix(&name).is_ok()
            );
            let encoded = postcard::to_stdvec(&name).unwrap();
            proptest::prop_assert_eq!(postcard::from_bytes::<ResourceName>(&encoded).is_ok(), shared.is_ok());
        }
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
        assert_eq!("xyz".parse::<LeaseId>().map_err(InvalidField::from), Err(InvalidField::LeaseIdFormat { len: 3 }));
    }

    proptest::proptest! {
        /// The two-halves form keeps the numeric value's encoding, so state
        /// files and snapshots written with the `u128` form read the same.
        #[test]
        fn lease_id_keeps_the_u128_encoding(a: u128) {
            let x = LeaseId::from_u128(a);
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
