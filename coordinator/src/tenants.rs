//! Tenants (docs/security.md, "Tenants"): who a caller is, what it may do,
//! and how much.
//!
//! The tenants file (TOML, `--tenants`) names each tenant's identities — the
//! identities of verified client certificates and the SHA-256 of bearer
//! tokens (never the tokens) — its namespace, its permissions per prefix
//! (`acquire`, `read`, `admin`) and its limits. [`Tenants::authenticate`]
//! turns a request's credentials into a [`Caller`]; [`Caller::check`] says
//! whether it may touch a resource. Without a tenants file every caller is
//! [`Caller::Anyone`], allowed everything (the insecure default).

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};

use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use toml::Spanned;

use crate::clock::{Clock, Instant};
use crate::service::LockError;
use crate::state_machine::Quota;
use crate::tls::ConnInfo;
use crate::types::check_resource_chars;

/// Largest tenants file read, in bytes.
const MAX_FILE_BYTES: u64 = 4 << 20;
/// Most tenants in one file.
const MAX_TENANTS: usize = 10_000;
/// Longest certificate identity, in bytes (as `tls::certificate_identity`).
const MAX_IDENTITY_LEN: usize = fencer_tls::MAX_IDENTITY_BYTES;

/// What a permission allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Permission {
    /// Acquire, renew and release locks.
    Acquire,
    /// Get and list locks.
    Read,
    /// Force-release; on the empty prefix also membership changes, the
    /// log level and the hot-resources view.
    Admin,
}

impl Permission {
    /// The name in the tenants file and in errors.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Acquire => "acquire",
            Self::Read => "read",
            Self::Admin => "admin",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "acquire" => Some(Self::Acquire),
            "read" => Some(Self::Read),
            "admin" => Some(Self::Admin),
            _ => None,
        }
    }
}

/// One tenant, as loaded.
#[derive(Debug)]
pub struct Tenant {
    name: String,
    namespace: String,
    permissions: Vec<(String, BTreeSet<Permission>)>,
    max_active_locks: Option<u64>,
    max_waiters: Option<u64>,
    rate: Option<Mutex<Bucket>>,
    max_requests_per_sec: Option<u32>,
}

impl Tenant {
    /// The tenant's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The tenant's namespace (a resource-name prefix; empty: every resource).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    fn may(&self, permission: Permission, resource: &str) -> bool {
        self.permissions.iter().any(|(prefix, allow)| allow.contains(&permission) && resource.starts_with(prefix))
    }

    /// The quota an Acquire of this tenant carries, if it has limits.
    fn quota(&self) -> Option<Quota> {
        (self.max_active_locks.is_some() || self.max_waiters.is_some()).then(|| Quota {
            prefix: self.namespace.clone(),
            max_active_locks: self.max_active_locks,
            max_waiters: self.max_waiters,
        })
    }
}

/// A token bucket: `rate` requests per second, bursts up to `rate`.
#[derive(Debug)]
struct Bucket {
    tokens: f64,
    last: Instant,
}

/// Who made a request.
#[derive(Debug, Clone)]
pub enum Caller {
    /// No tenants file: every caller may do everything.
    Anyone,
    /// A tenant of the tenants file.
    Tenant(Arc<Tenant>),
}

impl Caller {
    /// The tenant's name, or `-` without tenants (for logs).
    pub fn name(&self) -> &str {
        match self {
            Self::Anyone => "-",
            Self::Tenant(t) => &t.name,
        }
    }

    /// Whether the caller may do `permission` on `resource`.
    pub fn may(&self, permission: Permission, resource: &str) -> bool {
        match self {
            Self::Anyone => true,
            Self::Tenant(t) => t.may(permission, resource),
        }
    }

    /// [`may`](Self::may), as PERMISSION_DENIED naming the tenant, the
    /// permission and the resource.
    pub fn check(&self, permission: Permission, resource: &str) -> Result<(), LockError> {
        if self.may(permission, resource) {
            return Ok(());
        }
        Err(LockError::PermissionDenied {
            tenant: self.name().to_string(),
            permission: permission.as_str(),
            resource: resource.to_string(),
        })
    }

    /// Cluster-wide operator actions (membership, log level, the
    /// hot-resources view): `admin` on the empty prefix.
    pub fn check_cluster_admin(&self) -> Result<(), LockError> {
        match self {
            Self::Anyone => Ok(()),
            Self::Tenant(t) if t.permissions.iter().any(|(p, a)| p.is_empty() && a.contains(&Permission::Admin)) => {
                Ok(())
            }
            Self::Tenant(t) => Err(LockError::PermissionDenied {
                tenant: t.name.clone(),
                permission: "admin",
                resource: "(the cluster: needs admin on the prefix \"\")".into(),
            }),
        }
    }

    /// The `caller` an operator action records in the audit log: what the
    /// client claims, prefixed with the authenticated tenant when there is
    /// one (the claim alone is self-reported).
    pub fn audit_caller(&self, claimed: &str) -> String {
        match self {
            Self::Anyone => claimed.to_string(),
            Self::Tenant(t) => format!("[tenant {}] {claimed}", t.name),
        }
    }

    /// The quota an Acquire of this caller carries, if any.
    pub fn quota(&self) -> Option<Quota> {
        match self {
            Self::Anyone => None,
            Self::Tenant(t) => t.quota(),
        }
    }

    /// Takes one request from the tenant's rate (per node), or refuses
    /// with RESOURCE_EXHAUSTED naming `max_requests_per_sec`.
    pub fn charge_request(&self, clock: &Clock) -> Result<(), LockError> {
        let Self::Tenant(t) = self else { return Ok(()) };
        let (Some(rate), Some(bucket)) = (t.max_requests_per_sec, &t.rate) else { return Ok(()) };
        let mut b = bucket.lock().unwrap_or_else(|p| p.into_inner());
        let now = clock.now();
        let rate = f64::from(rate);
        b.tokens = (b.tokens + now.saturating_duration_since(b.last).as_secs_f64() * rate).min(rate);
        b.last = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            return Ok(());
        }
        Err(LockError::TenantLimit {
            tenant: t.name.clone(),
            limit: "max_requests_per_sec",
            value: u64::from(t.max_requests_per_sec.unwrap_or(0)),
        })
    }
}

/// The loaded tenants file.
#[derive(Debug)]
pub struct Tenants {
    tenants: Vec<Arc<Tenant>>,
    by_certificate: HashMap<String, usize>,
    by_token_hash: HashMap<[u8; 32], usize>,
}

/// Why a tenants file was refused: where, and what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}{}: {reason}", line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct TenantsError {
    /// The file, as given.
    pub file: String,
    /// The 1-based line, when the fault has one.
    pub line: Option<usize>,
    /// What is wrong.
    pub reason: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileDoc {
    #[serde(default)]
    tenant: Vec<Spanned<TenantDoc>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantDoc {
    name: Spanned<String>,
    namespace: Option<Spanned<String>>,
    #[serde(default)]
    certificate_identities: Vec<Spanned<String>>,
    #[serde(default)]
    bearer_token_sha256: Vec<Spanned<String>>,
    #[serde(default)]
    permission: Vec<Spanned<PermissionDoc>>,
    #[serde(default)]
    limits: LimitsDoc,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PermissionDoc {
    prefix: Spanned<String>,
    allow: Vec<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct LimitsDoc {
    max_active_locks: Option<Spanned<u64>>,
    max_waiters: Option<Spanned<u64>>,
    max_requests_per_sec: Option<Spanned<u32>>,
}

/// The SHA-256 of a bearer token as the tenants file writes it (lowercase hex).
pub fn bearer_token_sha256(token: &str) -> String {
    Sha256::digest(token.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

fn valid_tenant_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

fn parse_hex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 || !s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, chunk) in s.as_bytes().chunks(2).enumerate() {
        out[i] = u8::from_str_radix(std::str::from_utf8(chunk).ok()?, 16).ok()?;
    }
    Some(out)
}

impl Tenants {
    /// Reads and checks a tenants file (at most 4 MiB).
    pub fn load(path: &Path) -> Result<Self, TenantsError> {
        use std::io::Read as _;
        let file = path.display().to_string();
        let err = |reason: String| TenantsError { file: file.clone(), line: None, reason };
        let f = std::fs::File::open(path).map_err(|e| err(format!("cannot read: {e}")))?;
        let mut text = String::new();
        f.take(MAX_FILE_BYTES + 1).read_to_string(&mut text).map_err(|e| err(format!("cannot read: {e}")))?;
        if text.len() as u64 > MAX_FILE_BYTES {
            return Err(err(format!("larger than {MAX_FILE_BYTES} bytes")));
        }
        Self::parse(&file, &text)
    }

    /// Checks a tenants file's text; `file` names it in errors.
    pub fn parse(file: &str, text: &str) -> Result<Self, TenantsError> {
        let line_of =
            |offset: usize| text.as_bytes()[..offset.min(text.len())].iter().filter(|b| **b == b'\n').count() + 1;
        let at = |span: std::ops::Range<usize>, reason: String| TenantsError {
            file: file.to_string(),
            line: Some(line_of(span.start)),
            reason,
        };
        let doc: FileDoc = toml::from_str(text).map_err(|e| TenantsError {
            file: file.to_string(),
            line: e.span().map(|s| line_of(s.start)),
            reason: e.message().trim().to_string(),
        })?;
        if doc.tenant.is_empty() {
            return Err(TenantsError {
                file: file.to_string(),
                line: None,
                reason: "no [[tenant]] entries; without tenants, leave --tenants out".into(),
            });
        }
        if doc.tenant.len() > MAX_TENANTS {
            return Err(TenantsError {
                file: file.to_string(),
                line: None,
                reason: format!("more than {MAX_TENANTS} tenants"),
            });
        }
        let mut tenants = Vec::new();
        let mut names = HashMap::new();
        let mut by_certificate = HashMap::new();
        let mut by_token_hash = HashMap::new();
        let mut namespaces: Vec<(String, String)> = Vec::new();
        for t in doc.tenant {
            let span = t.span();
            let t = t.into_inner();
            let name = t.name.get_ref().clone();
            if !valid_tenant_name(&name) {
                return Err(at(t.name.span(), format!("tenant name {name:?}: 1–64 characters of A-Z a-z 0-9 . _ -")));
            }
            if names.insert(name.clone(), ()).is_some() {
                return Err(at(t.name.span(), format!("tenant {name:?} is defined twice")));
            }
            let (namespace, ns_span) = match &t.namespace {
                Some(ns) => (ns.get_ref().clone(), ns.span()),
                None => (format!("{name}/"), t.name.span()),
            };
            if let Err(e) = check_resource_chars(&namespace) {
                return Err(at(ns_span, format!("namespace {namespace:?}: {e}")));
            }
            if namespace.starts_with('/') {
                return Err(at(ns_span, format!("namespace {namespace:?}: must not start with '/'")));
            }
            if !namespace.is_empty() {
                if let Some((other, _)) =
                    namespaces.iter().find(|(_, ns)| ns.starts_with(&namespace) || namespace.starts_with(ns.as_str()))
                {
                    return Err(at(
                        ns_span,
                        format!("namespace {namespace:?} overlaps the namespace of tenant {other:?}"),
                    ));
                }
                namespaces.push((name.clone(), namespace.clone()));
            }
            if t.certificate_identities.is_empty() && t.bearer_token_sha256.is_empty() {
                return Err(at(
                    span,
                    format!("tenant {name:?} has no identity: give certificate_identities or bearer_token_sha256"),
                ));
            }
            let index = tenants.len();
            for id in &t.certificate_identities {
                let v = id.get_ref();
                if v.is_empty() || v.len() > MAX_IDENTITY_LEN || v.chars().any(char::is_control) {
                    return Err(at(
                        id.span(),
                        format!("certificate identity {v:?}: 1–{MAX_IDENTITY_LEN} bytes, no control characters"),
                    ));
                }
                if v == fencer_tls::UNNAMED_CLIENT_CERTIFICATE {
                    return Err(at(
                        id.span(),
                        format!(
                            "certificate identity {v:?} is what a certificate without a name is called; name the certificate"
                        ),
                    ));
                }
                if let Some(prev) = by_certificate.insert(v.clone(), index) {
                    let other: &Arc<Tenant> = &tenants[prev];
                    return Err(at(
                        id.span(),
                        format!("certificate identity {v:?} already names tenant {:?}", other.name),
                    ));
                }
            }
            for h in &t.bearer_token_sha256 {
                let Some(hash) = parse_hex32(h.get_ref()) else {
                    return Err(at(
                        h.span(),
                        "bearer_token_sha256: 64 lowercase hex digits (printf %s \"$TOKEN\" | sha256sum), never the token itself".into(),
                    ));
                };
                if by_token_hash.insert(hash, index).is_some() {
                    return Err(at(h.span(), "this bearer token hash appears twice".into()));
                }
            }
            let mut permissions = Vec::new();
            for p in &t.permission {
                let p = p.get_ref();
                let prefix = p.prefix.get_ref().clone();
                if let Err(e) = check_resource_chars(&prefix) {
                    return Err(at(p.prefix.span(), format!("permission prefix {prefix:?}: {e}")));
                }
                if !prefix.starts_with(&namespace) {
                    return Err(at(
                        p.prefix.span(),
                        format!("permission prefix {prefix:?} is outside the tenant's namespace {namespace:?}"),
                    ));
                }
                if p.allow.is_empty() {
                    return Err(at(p.prefix.span(), "allow is empty: list acquire, read and/or admin".into()));
                }
                let mut allow = BTreeSet::new();
                for a in &p.allow {
                    let Some(perm) = Permission::parse(a.get_ref()) else {
                        return Err(at(
                            a.span(),
                            format!("unknown permission {:?}: use acquire, read or admin", a.get_ref()),
                        ));
                    };
                    allow.insert(perm);
                }
                permissions.push((prefix, allow));
            }
            if permissions.is_empty() {
                permissions.push((namespace.clone(), BTreeSet::from([Permission::Acquire, Permission::Read])));
            }
            let limits = [
                ("max_active_locks", t.limits.max_active_locks.as_ref().map(|v| (*v.get_ref(), v.span()))),
                ("max_waiters", t.limits.max_waiters.as_ref().map(|v| (*v.get_ref(), v.span()))),
                (
                    "max_requests_per_sec",
                    t.limits.max_requests_per_sec.as_ref().map(|v| (u64::from(*v.get_ref()), v.span())),
                ),
            ];
            for (limit, value) in limits {
                if let Some((0, span)) = value {
                    return Err(at(span, format!("{limit} = 0 would refuse everything; leave it out for no limit")));
                }
            }
            let max_requests_per_sec = t.limits.max_requests_per_sec.map(Spanned::into_inner);
            tenants.push(Arc::new(Tenant {
                name,
                namespace,
                permissions,
                max_active_locks: t.limits.max_active_locks.map(Spanned::into_inner),
                max_waiters: t.limits.max_waiters.map(Spanned::into_inner),
                rate: max_requests_per_sec.map(|r| Mutex::new(Bucket { tokens: f64::from(r), last: Clock.now() })),
                max_requests_per_sec,
            }));
        }
        Ok(Self { tenants, by_certificate, by_token_hash })
    }

    /// The tenants, in file order.
    pub fn tenants(&self) -> &[Arc<Tenant>] {
        &self.tenants
    }

    /// The caller a request's credentials name: its verified client
    /// certificate (`conn`) and its `authorization: Bearer …` header. When
    /// both are given they must name the same tenant.
    pub fn authenticate(&self, conn: &ConnInfo, authorization: Option<&str>) -> Result<Caller, LockError> {
        let by_token = match authorization {
            None => None,
            Some(value) => {
                let token = value
                    .strip_prefix("Bearer ")
                    .or_else(|| value.strip_prefix("bearer "))
                    .map(str::trim)
                    .filter(|t| !t.is_empty())
                    .ok_or_else(|| {
                        LockError::Unauthenticated("the authorization header is not `Bearer <token>`".into())
                    })?;
                let hash: [u8; 32] = Sha256::digest(token.as_bytes()).into();
                Some(
                    *self
                        .by_token_hash
                        .get(&hash)
                        .ok_or_else(|| LockError::Unauthenticated("unknown bearer token".into()))?,
                )
            }
        };
        let by_cert = match &conn.client_identity {
            None => None,
            Some(id) => Some(
                *self
                    .by_certificate
                    .get(&**id)
                    .ok_or_else(|| LockError::Unauthenticated(format!("client certificate {id:?} names no tenant")))?,
            ),
        };
        let index = match (by_cert, by_token) {
            (Some(c), Some(t)) if c != t => {
                return Err(LockError::Unauthenticated(
                    "the client certificate and the bearer token name different tenants".into(),
                ));
            }
            (Some(i), _) | (None, Some(i)) => i,
            (None, None) => {
                return Err(LockError::Unauthenticated(
                    "no credentials: present a client certificate or a bearer token".into(),
                ));
            }
        };
        Ok(Caller::Tenant(self.tenants[index].clone()))
    }
}

/// How calls are authenticated on a node: by the tenants file; without
/// one, by a verified client certificate when a client CA is configured
/// (mTLS); else not at all.
#[derive(Debug, Clone, Default)]
pub struct Authenticator {
    tenants: Option<Arc<Tenants>>,
    require_client_certificate: bool,
}

impl Authenticator {
    /// Authenticates with `tenants`. Without tenants, every caller may do
    /// everything — only callers with a verified client certificate when
    /// `require_client_certificate` (a client CA without a tenants file).
    pub fn new(tenants: Option<Arc<Tenants>>, require_client_certificate: bool) -> Self {
        Self { tenants, require_client_certificate }
    }

    /// Whether a tenants file is in force.
    pub fn enabled(&self) -> bool {
        self.tenants.is_some()
    }

    /// The caller of a request with these credentials.
    pub fn caller(&self, conn: &ConnInfo, authorization: Option<&str>) -> Result<Caller, LockError> {
        match &self.tenants {
            None if self.require_client_certificate && conn.client_identity.is_none() => {
                Err(LockError::Unauthenticated(
                    "this node requires a client certificate issued by its client CA (mTLS)".into(),
                ))
            }
            None => Ok(Caller::Anyone),
            Some(t) => t.authenticate(conn, authorization),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALPHA_HASH: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"; // "test"

    fn parse(text: &str) -> Result<Tenants, TenantsError> {
        Tenants::parse("tenants.toml", text)
    }

    #[test]
    fn a_valid_file_loads_with_defaults() {
        assert_eq!(bearer_token_sha256("test"), ALPHA_HASH);
        let t = parse(&format!(
            r#"
[[tenant]]
name = "alpha"
bearer_token_sha256 = ["{ALPHA_HASH}"]
[tenant.limits]
max_active_locks = 2

[[tenant]]
name = "ops"
namespace = ""
certificate_identities = ["ops-client"]
[[tenant.permission]]
prefix = ""
allow = ["read", "admin"]
"#
        ))
        .unwrap();
        let alpha = t.authenticate(&ConnInfo::default(), Some("Bearer test")).unwrap();
        assert_eq!(alpha.name(), "alpha");
        assert!(alpha.may(Permission::Acquire, "alpha/x") && alpha.may(Permission::Read, "alpha/x"));
        assert!(!alpha.may(Permission::Admin, "alpha/x") && !alpha.may(Permission::Acquire, "beta/x"));
        assert!(!alpha.may(Permission::Acquire, "alphabet/x"), "namespaces end with '/'");
        assert_eq!(alpha.quota().unwrap().max_active_locks, Some(2));
        let conn = ConnInfo { tls: true, peer: false, client_identity: Some("ops-client".into()) };
        let ops = t.authenticate(&conn, None).unwrap();
        assert!(ops.check_cluster_admin().is_ok() && alpha.check_cluster_admin().is_err());
        assert!(ops.may(Permission::Read, "alpha/x") && !ops.may(Permission::Acquire, "alpha/x"));
        assert!(matches!(t.authenticate(&conn, Some("Bearer test")), Err(LockError::Unauthenticated(_))));
        assert!(matches!(t.authenticate(&ConnInfo::default(), None), Err(LockError::Unauthenticated(_))));
        assert!(matches!(
            t.authenticate(&ConnInfo::default(), Some("Bearer nope")),
            Err(LockError::Unauthenticated(_))
        ));
    }

    #[test]
    fn bad_files_are_refused_with_line_and_reason() {
        let tenant = |body: &str| format!("[[tenant]]\nname = \"alpha\"\n{body}\n");
        let token = format!("bearer_token_sha256 = [\"{ALPHA_HASH}\"]");
        let cases: Vec<(String, Option<usize>, &str)> = vec![
            ("".into(), None, "no [[tenant]]"),
            ("[[tenant]]\nname = \"a b\"\ncertificate_identities = [\"x\"]".into(), Some(2), "tenant name"),
            (tenant("certificate_identities = [\"x\"]\ncolour = \"red\""), Some(4), "unknown field"),
            (tenant(""), Some(1), "no identity"),
            (tenant("certificate_identities = [\"unnamed-client-certificate\"]"), Some(3), "without a name"),
            (tenant("certificate_identities = [\"a\\u0007b\"]"), Some(3), "no control characters"),
            ("# é\n[[tenant]]\nname = \"a b\"\ncertificate_identities = [\"x\"]".into(), Some(3), "tenant name"),
            (tenant("bearer_token_sha256 = [\"test\"]"), Some(3), "64 lowercase hex"),
            (
                tenant(&format!("{token}\n[[tenant.permission]]\nprefix = \"beta/\"\nallow = [\"read\"]")),
                Some(5),
                "outside the tenant's namespace",
            ),
            (
                tenant(&format!("{token}\n[[tenant.permission]]\nprefix = \"alpha/\"\nallow = [\"write\"]")),
                Some(6),
                "unknown permission",
            ),
            (tenant(&format!("{token}\n[tenant.limits]\nmax_waiters = 0")), Some(5), "max_waiters = 0"),
            (tenant(&format!("{token}\n[tenant.limits]\nmax_waiters = -1")), Some(5), ""),
            (tenant(&format!("{token}\nnamespace = \"a//b/\"")), Some(4), "namespace"),
            (format!("{}{}", tenant(&token), tenant("certificate_identities = [\"x\"]")), Some(5), "defined twice"),
            (
                format!(
                    "{}[[tenant]]\nname = \"alpha2\"\nnamespace = \"alpha/sub/\"\ncertificate_identities = [\"y\"]\n",
                    tenant(&token)
                ),
                Some(6),
                "overlaps",
            ),
            (
                format!("{}[[tenant]]\nname = \"beta\"\nbearer_token_sha256 = [\"{ALPHA_HASH}\"]\n", tenant(&token)),
                Some(6),
                "appears twice",
            ),
            ("[[tenant]\nname = 1".into(), Some(1), ""),
        ];
        for (text, line, reason) in cases {
            let e = parse(&text).err().unwrap_or_else(|| panic!("accepted:\n{text}"));
            assert_eq!(e.line, line, "{e}\n{text}");
            assert!(e.reason.contains(reason), "{e} does not say {reason:?}\n{text}");
            assert!(e.to_string().starts_with("tenants.toml"), "{e}");
        }
    }

    proptest::proptest! {
        /// Any text is refused or accepted, never a panic, and a refusal
        /// names a line inside the text.
        #[test]
        fn arbitrary_text_never_panics(text in "[\\[\\]a-z_=\"\\n 0-9/.]{0,200}") {
            if let Err(TenantsError { line: Some(line), .. }) = parse(&text) {
                proptest::prop_assert!(line >= 1 && line <= text.lines().count().max(1) + 1);
            }
        }
    }

    #[test]
    fn the_request_rate_is_a_token_bucket() {
        let t = parse(&format!(
            "[[tenant]]\nname = \"alpha\"\nbearer_token_sha256 = [\"{ALPHA_HASH}\"]\n[tenant.limits]\nmax_requests_per_sec = 3\n"
        ))
        .unwrap();
        let c = t.authenticate(&ConnInfo::default(), Some("Bearer test")).unwrap();
        for _ in 0..3 {
            c.charge_request(&Clock).unwrap();
        }
        match c.charge_request(&Clock) {
            Err(LockError::TenantLimit { limit: "max_requests_per_sec", value: 3, .. }) => {}
            other => panic!("{other:?}"),
        }
    }
}
