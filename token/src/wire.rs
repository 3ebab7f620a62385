//! The nouns every fencer crate shares, defined once: [`ResourceName`]
//! (with the one rule of DESIGN §2), [`FencingToken`] and [`LeaseId`]. The
//! coordinator, the proxy, the client and the token format all use these,
//! so a rule or an encoding cannot drift between them.
//!
//! They live in `fencer-token` because it is the one crate every other
//! already depends on and that depends on none of them: a signed token's
//! claims are exactly these three nouns.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Longest resource name, in bytes (DESIGN §2).
pub const MAX_RESOURCE_BYTES: usize = 256;
/// A lease id is 128 bits, written as this many hex digits.
pub const LEASE_ID_HEX_DIGITS: usize = 32;

/// A normalised business name of a lockable resource (DESIGN §2): 1–256
/// bytes of `[A-Za-z0-9._:/-]`, no leading or trailing `/`, no `//`, no
/// `..`. Deserializing checks the rule too, so no invalid name gets in
/// through a config file, a request or a log entry.
///
/// ```
/// use fencer_token::{ResourceName, ResourceNameError};
///
/// assert_eq!(ResourceName::new("orders/42")?.as_str(), "orders/42");
/// assert_eq!(ResourceName::new("/orders"), Err(ResourceNameError::EdgeSlash));
/// assert_eq!(ResourceName::new("a//b"), Err(ResourceNameError::DoubleSlash));
/// # Ok::<(), ResourceNameError>(())
/// ```
///
/// A name of up to 24 bytes is held inline, in the value itself (most are:
/// `orders/42`, `bench/r0001234`); a longer one on the heap. Comparing two
/// such names in a table reads the table's own memory, and cloning one does
/// not allocate: while every name was a heap string, the lock table's
/// lookups were two thirds of the time of `LockState::apply` (issue 18).
/// Orders, compares and hashes exactly as the name's `str`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceName(compact_str::CompactString);

/// Why a string is not a valid [`ResourceName`]; each variant names the
/// rule broken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourceNameError {
    /// The name is empty.
    #[error("resource name is empty")]
    Empty,
    /// The name is longer than [`MAX_RESOURCE_BYTES`].
    #[error("resource name is {len} bytes; at most {MAX_RESOURCE_BYTES} are allowed")]
    TooLong {
        /// Length of the refused name in bytes.
        len: usize,
    },
    /// A character outside `[A-Za-z0-9._:/-]`.
    #[error("resource name contains {ch:?} at byte {at}; only [A-Za-z0-9._:/-] is allowed")]
    BadChar {
        /// The refused character.
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
    /// Checks `name` against the rule of DESIGN §2. The error names the
    /// first rule broken, in this order: length, alphabet, `//`, `..`,
    /// empty, leading or trailing `/`.
    pub fn new(name: impl Into<String>) -> Result<Self, ResourceNameError> {
        let name = name.into();
        Self::check_prefix(&name)?;
        if name.is_empty() {
            return Err(ResourceNameError::Empty);
        }
        if name.starts_with('/') || name.ends_with('/') {
            return Err(ResourceNameError::EdgeSlash);
        }
        Ok(Self(name.into()))
    }

    /// Checks the rules a prefix of resource names must follow too (a
    /// listing's prefix, a tenant's namespace): length, alphabet, no `//`,
    /// no `..`. A prefix may be empty and may end with `/`.
    pub fn check_prefix(prefix: &str) -> Result<(), ResourceNameError> {
        if prefix.len() > MAX_RESOURCE_BYTES {
            return Err(ResourceNameError::TooLong { len: prefix.len() });
        }
        if let Some((at, ch)) = prefix
            .char_indices()
            .find(|&(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '/' | '-')))
        {
            return Err(ResourceNameError::BadChar { ch, at });
        }
        if prefix.contains("//") {
            return Err(ResourceNameError::DoubleSlash);
        }
        if prefix.contains("..") {
            return Err(ResourceNameError::DotDot);
        }
        Ok(())
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name as an owned string.
    pub fn into_string(self) -> String {
        self.0.into_string()
    }
}

impl Serialize for ResourceName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for ResourceName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::new(String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

impl TryFrom<String> for ResourceName {
    type Error = ResourceNameError;

    fn try_from(name: String) -> Result<Self, ResourceNameError> {
        Self::new(name)
    }
}

impl FromStr for ResourceName {
    type Err = ResourceNameError;

    fn from_str(name: &str) -> Result<Self, ResourceNameError> {
        Self::new(name)
    }
}

/// Lets a table of names be searched by a prefix (`str` orders as the name does).
impl std::borrow::Borrow<str> for ResourceName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for ResourceName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ResourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A fencing token: the raft log index of the entry that granted the lock
/// (DESIGN I2), strictly larger than every token granted before, for any
/// resource. Carried as a decimal `u64` (the `Fencing-Token` header, plain
/// form) and encoded as a `u64`.
///
/// ```
/// use fencer_token::FencingToken;
///
/// assert_eq!(FencingToken::parse(b"42"), Ok(FencingToken(42)));
/// assert_eq!(FencingToken(42).to_string(), "42");
/// assert!(FencingToken::parse(b"+42").is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct FencingToken(pub u64);

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

    /// The token as a number.
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
        value
            .iter()
            .try_fold(0u64, |n, &b| n.checked_mul(10).and_then(|n| n.checked_add(u64::from(b - b'0'))))
            .map(Self)
            .ok_or(TokenParseError::TooLarge)
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// 128 random bits naming one lease: the capability to renew and release
/// it. Shown (`Display`) and parsed as 32 hex digits; `Debug` shows only
/// the first six, so a lease id does not end up in logs by accident.
///
/// Held as two `u64` halves (high, low) rather than a `u128`: a `u128` is
/// 16-byte aligned, which pads every record that holds a lease id (the
/// coordinator's dedup table keeps ~240,000 of them at the seed rate). The
/// order, the text form and the encoding (a `u128`) are those of the
/// numeric value.
///
/// ```
/// use fencer_token::LeaseId;
///
/// let id: LeaseId = "6cf4a1b2c3d4e5f60718293a4b5c6d7e".parse()?;
/// assert_eq!(id.to_u128(), 0x6cf4a1b2c3d4e5f60718293a4b5c6d7e);
/// assert_eq!(id.to_string(), "6cf4a1b2c3d4e5f60718293a4b5c6d7e");
/// assert_eq!(format!("{id:?}"), "LeaseId(6cf4a1…)");
/// # Ok::<(), fencer_token::LeaseIdError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseId([u64; 2]);

/// Why a string is not a [`LeaseId`]: it must be exactly
/// [`LEASE_ID_HEX_DIGITS`] hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a lease id is {LEASE_ID_HEX_DIGITS} hex digits; got {len} characters")]
pub struct LeaseIdError {
    len: usize,
}

impl LeaseIdError {
    /// Length of the refused text, in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the refused text was empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The system's random generator, read [`OsRandomPool::SIZE`] bytes at a
/// time. Every byte is handed out once and wiped as it is; what has not
/// been handed out is as secret as what has (a lease id is a capability),
/// and lives in the same process. Not for a process that forks without
/// exec: parent and child would share the unread bytes.
struct OsRandomPool(std::sync::Mutex<PoolBytes>);

struct PoolBytes {
    bytes: [u8; OsRandomPool::SIZE],
    at: usize,
}

static POOL: OsRandomPool = OsRandomPool::new();

impl OsRandomPool {
    /// Bytes read from the system at a time.
    const SIZE: usize = 4096;

    /// An empty pool; its first use reads from the system.
    const fn new() -> Self {
        Self(std::sync::Mutex::new(PoolBytes { bytes: [0; Self::SIZE], at: Self::SIZE }))
    }

    /// Fills `out` (at most [`Self::SIZE`] bytes) with bytes never handed
    /// out before.
    fn fill(&self, out: &mut [u8]) -> Result<(), getrandom::Error> {
        if out.len() > Self::SIZE {
            return getrandom::fill(out);
        }
        // The bytes are plain data: a panic elsewhere cannot leave them torn.
        let mut p = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if Self::SIZE - p.at < out.len() {
            getrandom::fill(&mut p.bytes)?;
            p.at = 0;
        }
        let (from, to) = (p.at, p.at + out.len());
        out.copy_from_slice(&p.bytes[from..to]);
        p.bytes[from..to].fill(0);
        p.at = to;
        Ok(())
    }
}

impl LeaseId {
    /// Draws a lease id from the OS CSPRNG. Only the coordinator's leader
    /// does this, before proposing, so that applying the log stays
    /// deterministic.
    ///
    /// The bytes come from a pool: the system's generator read
    /// 4 KiB at a time, each byte handed out once and then wiped, instead
    /// of one `getrandom` system call per lease (2,000 a second at the seed
    /// rate).
    pub fn random() -> Result<Self, getrandom::Error> {
        let mut bytes = [0u8; 16];
        POOL.fill(&mut bytes)?;
        Ok(Self::from_u128(u128::from_le_bytes(bytes)))
    }

    /// A lease id from its numeric value.
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
        let text = self.to_string();
        write!(f, "LeaseId({}…)", &text[..6])
    }
}

/// 32 hex digits, lowercase or uppercase.
impl FromStr for LeaseId {
    type Err = LeaseIdError;

    fn from_str(s: &str) -> Result<Self, LeaseIdError> {
        let err = LeaseIdError { len: s.len() };
        if s.len() != LEASE_ID_HEX_DIGITS || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(err);
        }
        u128::from_str_radix(s, 16).map(Self::from_u128).map_err(|_| err)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// DESIGN §2 written as plainly as possible, independently of
    /// [`ResourceName::new`]: every `/`-separated segment is non-empty
    /// (so no leading, trailing or double `/`).
    fn follows_design(name: &str) -> bool {
        (1..=MAX_RESOURCE_BYTES).contains(&name.len())
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._:/-".contains(&b))
            && name.split('/').all(|segment| !segment.is_empty())
            && !name.contains("..")
    }

    /// Whether `name` breaks the rule `e` names.
    fn breaks(name: &str, e: &ResourceNameError) -> bool {
        match e {
            ResourceNameError::Empty => name.is_empty(),
            ResourceNameError::TooLong { len } => *len == name.len() && name.len() > MAX_RESOURCE_BYTES,
            ResourceNameError::BadChar { ch, at } => {
                name[*at..].starts_with(*ch) && !(ch.is_ascii_alphanumeric() || "._:/-".contains(*ch))
            }
            ResourceNameError::EdgeSlash => name.starts_with('/') || name.ends_with('/'),
            ResourceNameError::DoubleSlash => name.contains("//"),
            ResourceNameError::DotDot => name.contains(".."),
        }
    }

    /// Names near the rule's edges: few characters, mostly the ones the
    /// rule treats specially, some just outside the alphabet, and lengths
    /// around the limit.
    fn near_miss_names() -> impl Strategy<Value = String> {
        prop_oneof!["[a/.:_-]{0,8}", "[A-Za-z0-9./é ~-]{0,12}", "[a-z/]{250,260}", any::<String>(),]
    }

    #[test]
    fn each_rule_is_named_when_broken() {
        assert_eq!(ResourceName::new(""), Err(ResourceNameError::Empty));
        assert_eq!(ResourceName::new("a".repeat(257)), Err(ResourceNameError::TooLong { len: 257 }));
        assert!(ResourceName::new("a".repeat(256)).is_ok());
        assert_eq!(ResourceName::new("a b"), Err(ResourceNameError::BadChar { ch: ' ', at: 1 }));
        assert_eq!(ResourceName::new("é"), Err(ResourceNameError::BadChar { ch: 'é', at: 0 }));
        assert_eq!(ResourceName::new("/a"), Err(ResourceNameError::EdgeSlash));
        assert_eq!(ResourceName::new("a/"), Err(ResourceNameError::EdgeSlash));
        assert_eq!(ResourceName::new("a//b"), Err(ResourceNameError::DoubleSlash));
        assert_eq!(ResourceName::new("a/../b"), Err(ResourceNameError::DotDot));
        assert!(ResourceName::new("db/orders:42.v1_x-y").is_ok());
        assert_eq!(ResourceName::check_prefix(""), Ok(()));
        assert_eq!(ResourceName::check_prefix("tenant-a/"), Ok(()));
        assert_eq!(ResourceName::check_prefix("a//"), Err(ResourceNameError::DoubleSlash));
    }

    #[test]
    fn deserializing_checks_the_rule() {
        assert_eq!(serde_json::from_str::<ResourceName>("\"db/a\"").unwrap().as_str(), "db/a");
        let e = serde_json::from_str::<ResourceName>("\"db//a\"").unwrap_err();
        assert!(e.to_string().contains("must not contain '//'"), "{e}");
    }

    #[test]
    fn tokens_are_strict_decimal_u64() {
        assert_eq!(FencingToken::parse(b"42"), Ok(FencingToken::new(42)));
        assert_eq!(FencingToken::parse(b"18446744073709551615"), Ok(FencingToken(u64::MAX)));
        assert_eq!(FencingToken::parse(b"18446744073709551616"), Err(TokenParseError::TooLarge));
        assert_eq!(FencingToken::parse(b""), Err(TokenParseError::Empty));
        for bad in [&b" 42"[..], b"+42", b"-1", b"4 2", b"0x2a", b"42\n"] {
            assert_eq!(FencingToken::parse(bad), Err(TokenParseError::NotDecimal), "{bad:?}");
        }
    }

    #[test]
    fn the_random_pool_hands_each_byte_out_once_and_refills() {
        let pool = super::OsRandomPool::new();
        let mut seen = std::collections::HashSet::new();
        // Three refills' worth of lease ids: no id twice, none all zero.
        for _ in 0..3 * super::OsRandomPool::SIZE / 16 + 5 {
            let mut id = [0u8; 16];
            pool.fill(&mut id).unwrap();
            assert_ne!(id, [0u8; 16], "a handed-out id is never the wiped bytes");
            assert!(seen.insert(id), "an id handed out twice");
        }
        let p = pool.0.lock().unwrap();
        assert!(p.bytes[..p.at].iter().all(|&b| b == 0), "what was handed out is wiped");
        // A request larger than the pool goes to the system directly.
        let mut big = vec![0u8; super::OsRandomPool::SIZE + 1];
        drop(p);
        pool.fill(&mut big).unwrap();
        assert!(big.iter().any(|&b| b != 0));
    }

    #[test]
    fn lease_ids_parse_32_hex_digits_and_hide_in_debug() {
        let id = LeaseId::random().unwrap();
        assert_eq!(id.to_string().parse::<LeaseId>(), Ok(id));
        assert_eq!(id.to_string().to_uppercase().parse::<LeaseId>(), Ok(id));
        assert_eq!("xyz".parse::<LeaseId>().unwrap_err().len(), 3);
        assert!("0".repeat(33).parse::<LeaseId>().is_err());
        assert!("g".repeat(32).parse::<LeaseId>().is_err());
        assert!(format!("+{}", "0".repeat(31)).parse::<LeaseId>().is_err());
        let id = LeaseId::from_u128(0x6cf4a1b2c3d4e5f60718293a4b5c6d7e);
        assert_eq!(format!("{id:?}"), "LeaseId(6cf4a1…)");
        assert!(!format!("{:?}", Some(id)).contains("c3d4e5"), "Debug leaks the lease id");
    }

    proptest! {
        /// The one rule is DESIGN §2, and every refusal names a rule the
        /// name really breaks.
        #[test]
        fn the_rule_is_design_2(name in near_miss_names()) {
            match ResourceName::new(name.as_str()) {
                Ok(n) => {
                    prop_assert!(follows_design(&name), "{name:?} was accepted");
                    prop_assert_eq!(n.as_str(), name.as_str());
                }
                Err(e) => {
                    prop_assert!(!follows_design(&name), "{name:?} was refused: {e}");
                    prop_assert!(breaks(&name, &e), "{name:?} does not break the rule of {e:?}");
                }
            }
            // A prefix follows the same rule but for the empty and edge ones.
            let prefix_rule = name.len() <= MAX_RESOURCE_BYTES
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._:/-".contains(&b))
                && !name.contains("//")
                && !name.contains("..");
            prop_assert_eq!(ResourceName::check_prefix(&name).is_ok(), prefix_rule, "prefix {:?}", name);
        }

        /// Decoding (configs, requests, log entries) follows the same rule.
        #[test]
        fn decoding_follows_the_rule(name in near_miss_names()) {
            let json = serde_json::to_string(&name).unwrap();
            prop_assert_eq!(serde_json::from_str::<ResourceName>(&json).is_ok(), ResourceName::new(name).is_ok());
        }

        /// A name held inline (up to 24 bytes) or on the heap orders,
        /// compares, hashes, encodes and converts exactly as its text:
        /// the lock table's order, the snapshots' bytes and every hash of
        /// a name are what they were with a `String` inside.
        ///
        /// Names of 1–38 bytes, so both forms and the boundary come up;
        /// `b` often extends `a`, so pairs share long prefixes.
        #[test]
        fn a_name_behaves_as_its_text(
            a in "[a-c0-9]{1,12}(/[a-c0-9]{1,12}){0,2}",
            tail in "[a-c0-9]{0,14}",
            extends: bool,
        ) {
            use std::hash::BuildHasher as _;
            let b = if extends { format!("{a}{tail}") } else { format!("{tail}x") };
            let (x, y) = (ResourceName::new(a.as_str()).unwrap(), ResourceName::new(b.as_str()).unwrap());
            prop_assert_eq!(x.cmp(&y), a.cmp(&b));
            prop_assert_eq!(x == y, a == b);
            let hasher = std::hash::RandomState::new();
            prop_assert_eq!(hasher.hash_one(&x), hasher.hash_one(a.as_str()));
            let borrowed: &str = std::borrow::Borrow::borrow(&x);
            prop_assert_eq!(borrowed, a.as_str());
            prop_assert_eq!(serde_json::to_string(&x).unwrap(), serde_json::to_string(&a).unwrap());
            prop_assert_eq!(x.clone().into_string(), a.clone());
            prop_assert_eq!(format!("{x}"), a.clone());
            prop_assert_eq!(format!("{x:?}"), format!("ResourceName({a:?})"));
        }

        /// The two-halves form keeps the numeric value's order, text and
        /// encoding, so state files and snapshots written with the `u128`
        /// form read the same.
        #[test]
        fn lease_id_keeps_the_u128_order_and_text(a: u128, b: u128) {
            let (x, y) = (LeaseId::from_u128(a), LeaseId::from_u128(b));
            prop_assert_eq!(x.to_u128(), a);
            prop_assert_eq!(x.cmp(&y), a.cmp(&b));
            prop_assert_eq!(x.to_string(), format!("{a:032x}"));
            prop_assert_eq!(x.to_string().parse::<LeaseId>(), Ok(x));
        }
    }
}
