//! Proxy configuration: the `proxy.toml` file, the simple flag form, every
//! limit with its default, and validation that names the line and the reason.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::PathBuf;
use std::time::Duration;

use http::{HeaderName, Method, Uri};
use serde::Deserialize;
use toml::Spanned;

use crate::log_level::LogControlHandle;
use crate::names::ResourceName;
use crate::routes::{PathPattern, ResourceTemplate, Route, RouteKind, Router, ValuePattern};

/// Default admin listen address (loopback: the admin API has no
/// authentication until mTLS lands, DESIGN §7).
pub const DEFAULT_ADMIN_ADDR: &str = "127.0.0.1:7421";

/// Default cap on how far one request may raise an epoch (P7 stand-in):
/// 10^10, about 19 days of coordinator log growth at the seed peak of
/// 6,000 entries/s.
pub const DEFAULT_MAX_EPOCH_JUMP: u64 = 10_000_000_000;

/// Everything the proxy needs to run.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// Where clients connect.
    pub listen: SocketAddr,
    /// The protected service, `http://host:port` or `https://host:port`
    /// (HTTP/1.1 only).
    pub upstream: Uri,
    /// Directory of the epoch store (`epochs.redb`), the rejection log
    /// (`rejections.jsonl`) and the admin audit log (`audit.jsonl`).
    pub data_dir: PathBuf,
    /// Admin API listen address.
    pub admin: SocketAddr,
    /// Header carrying the fencing token (default `Fencing-Token`).
    pub token_header: HeaderName,
    /// Optional client header naming the resource; when present it must
    /// equal the route's resource (P6). Default `Fencing-Resource`.
    pub resource_header: HeaderName,
    /// Header whose value is logged as the request id (default
    /// `X-Request-Id`); one is generated when it is absent.
    pub request_id_header: HeaderName,
    /// Largest amount one request may raise a resource's epoch by. With
    /// signed tokens it is the second line of defence (a leaked signing key
    /// still cannot jump an epoch arbitrarily far); without them, the first.
    /// Admin raise-epoch is not capped.
    pub max_epoch_jump: u64,
    /// Signed tokens (P7): the public keys and how strictly to check.
    /// `None`: tokens are plain numbers and nothing vouches for them.
    pub signing: Option<SigningConfig>,
    /// TLS on the client-facing listener; `None`: plaintext HTTP.
    pub tls: Option<ListenerTls>,
    /// TLS to the upstream; set exactly when the upstream is `https://`.
    pub upstream_tls: Option<UpstreamTls>,
    /// Timeouts.
    pub timeouts: Timeouts,
    /// Size and count limits.
    pub limits: Limits,
    /// The ordered route table.
    pub router: Router,
    /// Run-time log filter changes through the admin API (`/v1/log-level`),
    /// when the process owns a reloadable subscriber; never read from a file.
    pub log_control: Option<LogControlHandle>,
}

/// Signed-token verification (P7), the `[signing]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SigningConfig {
    /// The key-set file, `{"keys":[…]}` as the coordinator exports it. Read
    /// at start and again on SIGHUP or `POST /v1/reload-keys`.
    pub keys_file: PathBuf,
    /// Refuse plain (unsigned) tokens with `unsigned_token` (default true).
    /// Turn it off only while clients migrate to signed tokens.
    pub require_signed: bool,
    /// Allowance for clocks that disagree, applied to key windows (default
    /// 30 s).
    pub clock_skew: Duration,
}

/// TLS on the client-facing listener, the `[tls]` table. Plaintext
/// connections to a TLS listener fail the handshake and are closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerTls {
    /// PEM certificate chain, leaf first.
    pub cert_file: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// PEM CA certificates. When set, every client must present a
    /// certificate that chains to one of them (mTLS), and the rejection
    /// log's `caller` is the identity it names.
    pub client_ca_file: Option<PathBuf>,
}

/// TLS from the proxy to an `https://` upstream, the `[upstream_tls]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamTls {
    /// PEM CA certificates the upstream's certificate must chain to (no
    /// system roots are used).
    pub ca_file: PathBuf,
    /// PEM client certificate chain the proxy presents (mTLS upstream);
    /// set together with `key_file`.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<PathBuf>,
    /// Name the upstream's certificate must carry, when it is not the
    /// upstream URL's host.
    pub server_name: Option<String>,
}

/// Default clock-skew allowance for signing-key windows.
pub const DEFAULT_CLOCK_SKEW: Duration = fencer_token::DEFAULT_CLOCK_SKEW;

/// Every timeout, with its default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timeouts {
    /// TCP connect to the upstream, and the TLS handshake for an `https://`
    /// upstream (default 2 s). A connect failure sent no bytes, so it is a
    /// plain 502, never "outcome unknown".
    pub connect: Duration,
    /// From the start of the upstream call to the upstream's response
    /// headers, including sending the request body (default 30 s). Past it:
    /// 504 outcome unknown (P4).
    pub response: Duration,
    /// Longest pause between two body frames, either direction (default 60 s).
    pub body_idle: Duration,
    /// How long a resource stays indeterminate after the upstream connection
    /// of an unknown outcome closed (default 30 s, P4).
    pub quarantine: Duration,
    /// Time a client has to send its request headers (default 10 s). It also
    /// closes idle HTTP/1 keep-alive connections.
    pub header_read: Duration,
    /// Time a client has to complete the TLS handshake (default 10 s).
    pub tls_handshake: Duration,
    /// On SIGTERM/SIGINT, how long in-flight requests may take to finish
    /// (default 30 s).
    pub shutdown_grace: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(2),
            response: Duration::from_secs(30),
            body_idle: Duration::from_secs(60),
            quarantine: Duration::from_secs(30),
            header_read: Duration::from_secs(10),
            tls_handshake: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(30),
        }
    }
}

/// Every size and count limit, with its default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Requests handled at once; beyond it the proxy answers 503 at once
    /// rather than queueing (default 1,024).
    pub max_concurrent_requests: usize,
    /// Client connections open at once, TLS handshakes included; beyond it
    /// the proxy stops accepting until one closes (default 4,096).
    pub max_connections: usize,
    /// Concurrent streams on one HTTP/2 connection (default 100).
    pub max_streams_per_connection: u32,
    /// Read buffer for a request head, so the largest request line plus
    /// headers, in bytes (default 65,536; at least 8,192).
    pub max_header_bytes: usize,
    /// Most headers in one request (default 100).
    pub max_headers: usize,
    /// Largest request body, in bytes (default 64 MiB). A declared
    /// `Content-Length` above it is refused with 413 before anything is
    /// forwarded; a chunked body that grows past it is cut, which the
    /// upstream sees as a reset (so the answer is 504 outcome unknown).
    pub max_request_body_bytes: u64,
    /// Rejections kept in the redb table served by the admin API; the oldest
    /// are dropped beyond it (default 10,000). The JSON-lines file keeps all.
    pub rejection_table_max: u64,
    /// Distinct resources tracked in memory; a write for a new resource
    /// beyond it gets 503 (default 100,000, the seed scale).
    pub max_resources: usize,
    /// Idle pooled connections kept to the upstream (default 64).
    pub upstream_max_idle_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_concurrent_requests: 1024,
            max_connections: 4096,
            max_streams_per_connection: 100,
            max_header_bytes: 64 * 1024,
            max_headers: 100,
            max_request_body_bytes: 64 * 1024 * 1024,
            rejection_table_max: 10_000,
            max_resources: 100_000,
            upstream_max_idle_connections: 64,
        }
    }
}

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid: where and why.
    #[error("line {line}, column {column}: {reason}")]
    Invalid {
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What is wrong.
        reason: String,
    },
    /// A command-line flag is not valid.
    #[error("{flag}: {reason}")]
    Flag {
        /// The flag, e.g. `--read-route`.
        flag: &'static str,
        /// What is wrong.
        reason: String,
    },
}

/// The simple, flag-only form: one resource for every path, all writes except
/// the listed read routes.
#[derive(Debug, Clone)]
pub struct SimpleConfig {
    /// `--listen`.
    pub listen: SocketAddr,
    /// `--upstream`.
    pub upstream: String,
    /// `--resource`.
    pub resource: String,
    /// `--data-dir`.
    pub data_dir: PathBuf,
    /// `--admin`.
    pub admin: SocketAddr,
    /// `--read-route METHOD:PATH`, repeatable.
    pub read_routes: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    listen: Spanned<String>,
    upstream: Spanned<String>,
    data_dir: Spanned<String>,
    admin: Option<Spanned<String>>,
    token_header: Option<Spanned<String>>,
    resource_header: Option<Spanned<String>>,
    request_id_header: Option<Spanned<String>>,
    max_epoch_jump: Option<Spanned<u64>>,
    signing: Option<Spanned<RawSigning>>,
    tls: Option<Spanned<RawListenerTls>>,
    upstream_tls: Option<Spanned<RawUpstreamTls>>,
    #[serde(default)]
    timeouts: RawTimeouts,
    #[serde(default)]
    limits: RawLimits,
    #[serde(default, rename = "route")]
    routes: Vec<RawRoute>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawTimeouts {
    connect: Option<Spanned<String>>,
    response: Option<Spanned<String>>,
    body_idle: Option<Spanned<String>>,
    quarantine: Option<Spanned<String>>,
    header_read: Option<Spanned<String>>,
    tls_handshake: Option<Spanned<String>>,
    shutdown_grace: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSigning {
    keys_file: Spanned<String>,
    require_signed: Option<bool>,
    clock_skew: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawListenerTls {
    cert_file: Spanned<String>,
    key_file: Spanned<String>,
    client_ca_file: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUpstreamTls {
    ca_file: Spanned<String>,
    cert_file: Option<Spanned<String>>,
    key_file: Option<Spanned<String>>,
    server_name: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    max_concurrent_requests: Option<Spanned<u64>>,
    max_connections: Option<Spanned<u64>>,
    max_streams_per_connection: Option<Spanned<u64>>,
    max_header_bytes: Option<Spanned<u64>>,
    max_headers: Option<Spanned<u64>>,
    max_request_body_bytes: Option<Spanned<u64>>,
    rejection_table_max: Option<Spanned<u64>>,
    max_resources: Option<Spanned<u64>>,
    upstream_max_idle_connections: Option<Spanned<u64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    name: Option<String>,
    methods: Option<Spanned<Vec<String>>>,
    path: Spanned<String>,
    #[serde(default)]
    query: BTreeMap<String, Spanned<String>>,
    #[serde(default)]
    headers: BTreeMap<String, Spanned<String>>,
    resource: Option<Spanned<String>>,
    kind: Option<Spanned<String>>,
}

/// Turns byte spans into line/column errors.
struct Locator<'a> {
    text: &'a str,
}

impl Locator<'_> {
    fn err(&self, span: Range<usize>, reason: impl Into<String>) -> ConfigError {
        let start = span.start.min(self.text.len());
        let before = &self.text[..start];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        ConfigError::Invalid { line, column, reason: reason.into() }
    }

    fn at<T>(&self, s: &Spanned<T>, reason: impl Into<String>) -> ConfigError {
        self.err(s.span(), reason)
    }
}

fn parse_upstream(raw: &str) -> Result<Uri, String> {
    let uri: Uri = raw.parse().map_err(|e| format!("upstream {raw:?} is not a URL: {e}"))?;
    let scheme = match uri.scheme_str() {
        Some(s @ ("http" | "https")) => s.to_owned(),
        _ => return Err(format!("upstream {raw:?} must start with http:// or https://")),
    };
    let Some(authority) = uri.authority() else {
        return Err(format!("upstream {raw:?} has no host"));
    };
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(format!("upstream {raw:?} must be {scheme}://host:port with no path or query"));
    }
    Uri::builder()
        .scheme(scheme.as_str())
        .authority(authority.as_str())
        .path_and_query("/")
        .build()
        .map_err(|e| format!("upstream {raw:?}: {e}"))
}

fn non_empty_path(loc: &Locator<'_>, s: &Spanned<String>, key: &str) -> Result<PathBuf, ConfigError> {
    if s.get_ref().is_empty() {
        return Err(loc.at(s, format!("{key} must not be empty")));
    }
    Ok(PathBuf::from(s.get_ref()))
}

fn build_signing(loc: &Locator<'_>, raw: &RawSigning) -> Result<SigningConfig, ConfigError> {
    let clock_skew = match &raw.clock_skew {
        None => DEFAULT_CLOCK_SKEW,
        Some(v) => humantime::parse_duration(v.get_ref())
            .map_err(|e| loc.at(v, format!("{:?} is not a duration like \"30s\": {e}", v.get_ref())))?,
    };
    if clock_skew > Duration::from_secs(3600) {
        return Err(loc.at(raw.clock_skew.as_ref().expect("set when not the default"), "clock_skew must be at most 1h"));
    }
    Ok(SigningConfig {
        keys_file: non_empty_path(loc, &raw.keys_file, "keys_file")?,
        require_signed: raw.require_signed.unwrap_or(true),
        clock_skew,
    })
}

fn build_listener_tls(loc: &Locator<'_>, raw: &RawListenerTls) -> Result<ListenerTls, ConfigError> {
    Ok(ListenerTls {
        cert_file: non_empty_path(loc, &raw.cert_file, "cert_file")?,
        key_file: non_empty_path(loc, &raw.key_file, "key_file")?,
        client_ca_file: raw.client_ca_file.as_ref().map(|c| non_empty_path(loc, c, "client_ca_file")).transpose()?,
    })
}

fn build_upstream_tls(
    loc: &Locator<'_>,
    raw: &Spanned<RawUpstreamTls>,
    upstream: &Uri,
) -> Result<UpstreamTls, ConfigError> {
    if upstream.scheme_str() != Some("https") {
        return Err(loc.at(raw, "[upstream_tls] is set but the upstream is http://; use https:// or remove it"));
    }
    let r = raw.get_ref();
    let cert_file = r.cert_file.as_ref().map(|c| non_empty_path(loc, c, "cert_file")).transpose()?;
    let key_file = r.key_file.as_ref().map(|k| non_empty_path(loc, k, "key_file")).transpose()?;
    if cert_file.is_some() != key_file.is_some() {
        return Err(
            loc.at(raw, "cert_file and key_file (the proxy's client certificate) are set together or not at all")
        );
    }
    let server_name = match &r.server_name {
        None => None,
        Some(n) => {
            crate::tls::parse_server_name(n.get_ref()).map_err(|reason| loc.at(n, reason))?;
            Some(n.get_ref().clone())
        }
    };
    Ok(UpstreamTls { ca_file: non_empty_path(loc, &r.ca_file, "ca_file")?, cert_file, key_file, server_name })
}

fn parse_header_name(raw: &str) -> Result<HeaderName, String> {
    HeaderName::from_bytes(raw.as_bytes()).map_err(|_| format!("{raw:?} is not a valid HTTP header name"))
}

fn parse_duration(raw: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(raw)
        .map_err(|e| format!("{raw:?} is not a duration like \"500ms\" or \"30s\": {e}"))?;
    if d.is_zero() {
        return Err("a timeout of zero is not allowed".into());
    }
    Ok(d)
}

fn parse_method(raw: &str) -> Result<Method, String> {
    if raw.is_empty() || !raw.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(format!("method {raw:?} must be an upper-case HTTP method such as GET"));
    }
    Method::from_bytes(raw.as_bytes()).map_err(|_| format!("{raw:?} is not an HTTP method"))
}

/// Parses a `methods` list; `["*"]` means any method.
fn parse_methods(raw: &[String]) -> Result<Option<Vec<Method>>, String> {
    if raw.is_empty() {
        return Err("methods must not be empty; use [\"*\"] for any method".into());
    }
    if raw.iter().any(|m| m == "*") {
        if raw.len() > 1 {
            return Err("\"*\" already means any method; list nothing else with it".into());
        }
        return Ok(None);
    }
    raw.iter().map(|m| parse_method(m)).collect::<Result<Vec<_>, _>>().map(Some)
}

fn check_listen_vs_upstream(listen: SocketAddr, upstream: &Uri) -> Result<(), String> {
    let authority = upstream.authority().map(|a| a.as_str()).unwrap_or("");
    let port_listen = listen.port();
    if let Ok(up) = authority.parse::<SocketAddr>()
        && (up == listen || (up.port() == port_listen && (up.ip().is_unspecified() || listen.ip().is_unspecified())))
    {
        return Err(format!("upstream {authority} is the proxy's own listen address; that would loop"));
    }
    Ok(())
}

impl ProxyConfig {
    /// Reads and validates a `proxy.toml`.
    pub fn load(path: impl Into<PathBuf>) -> Result<Self, ConfigError> {
        let path = path.into();
        let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read { path: path.clone(), source })?;
        Self::from_toml_str(&text)
    }

    /// Parses and validates configuration text. Errors carry the line and
    /// column of the offending value.
    pub fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        let loc = Locator { text };
        let raw: RawConfig =
            toml::from_str(text).map_err(|e| loc.err(e.span().unwrap_or(0..0), e.message().to_owned()))?;

        let listen: SocketAddr =
            raw.listen.get_ref().parse().map_err(|_| {
                loc.at(&raw.listen, format!("listen {:?} is not an IP:port address", raw.listen.get_ref()))
            })?;
        let upstream = parse_upstream(raw.upstream.get_ref()).map_err(|r| loc.at(&raw.upstream, r))?;
        check_listen_vs_upstream(listen, &upstream).map_err(|r| loc.at(&raw.upstream, r))?;
        let upstream_tls = match &raw.upstream_tls {
            Some(t) => Some(build_upstream_tls(&loc, t, &upstream)?),
            None if upstream.scheme_str() == Some("https") => {
                return Err(loc.at(&raw.upstream, "an https:// upstream needs [upstream_tls] with at least ca_file"));
            }
            None => None,
        };
        let signing = raw.signing.as_ref().map(|s| build_signing(&loc, s.get_ref())).transpose()?;
        let tls = raw.tls.as_ref().map(|t| build_listener_tls(&loc, t.get_ref())).transpose()?;
        if raw.data_dir.get_ref().is_empty() {
            return Err(loc.at(&raw.data_dir, "data_dir must not be empty"));
        }
        let admin = match &raw.admin {
            None => DEFAULT_ADMIN_ADDR.parse().expect("constant is a valid address"),
            Some(a) => a
                .get_ref()
                .parse()
                .map_err(|_| loc.at(a, format!("admin {:?} is not an IP:port address", a.get_ref())))?,
        };
        let header = |h: &Option<Spanned<String>>, default: &'static str| -> Result<HeaderName, ConfigError> {
            match h {
                None => Ok(HeaderName::from_static(default)),
                Some(h) => parse_header_name(h.get_ref()).map_err(|r| loc.at(h, r)),
            }
        };
        let token_header = header(&raw.token_header, "fencing-token")?;
        let resource_header = header(&raw.resource_header, "fencing-resource")?;
        let request_id_header = header(&raw.request_id_header, "x-request-id")?;
        if token_header == resource_header {
            return Err(loc.at(
                raw.resource_header.as_ref().or(raw.token_header.as_ref()).expect("one is set when they collide"),
                "token_header and resource_header must differ",
            ));
        }
        let max_epoch_jump = match &raw.max_epoch_jump {
            None => DEFAULT_MAX_EPOCH_JUMP,
            Some(j) if *j.get_ref() == 0 => {
                return Err(loc.at(j, "max_epoch_jump must be at least 1 (no token could ever advance the epoch)"));
            }
            Some(j) => *j.get_ref(),
        };

        let mut timeouts = Timeouts::default();
        for (field, slot) in [
            (&raw.timeouts.connect, &mut timeouts.connect),
            (&raw.timeouts.response, &mut timeouts.response),
            (&raw.timeouts.body_idle, &mut timeouts.body_idle),
            (&raw.timeouts.quarantine, &mut timeouts.quarantine),
            (&raw.timeouts.header_read, &mut timeouts.header_read),
            (&raw.timeouts.tls_handshake, &mut timeouts.tls_handshake),
            (&raw.timeouts.shutdown_grace, &mut timeouts.shutdown_grace),
        ] {
            if let Some(v) = field {
                *slot = parse_duration(v.get_ref()).map_err(|r| loc.at(v, r))?;
            }
        }

        let mut limits = Limits::default();
        let lim = |v: &Option<Spanned<u64>>, min: u64, max: u64, name: &str| -> Result<Option<u64>, ConfigError> {
            match v {
                None => Ok(None),
                Some(s) if (min..=max).contains(s.get_ref()) => Ok(Some(*s.get_ref())),
                Some(s) => Err(loc.at(s, format!("{name} must be between {min} and {max}"))),
            }
        };
        let to_usize = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        if let Some(v) = lim(&raw.limits.max_concurrent_requests, 1, 1_000_000, "max_concurrent_requests")? {
            limits.max_concurrent_requests = to_usize(v);
        }
        if let Some(v) = lim(&raw.limits.max_connections, 1, 1_000_000, "max_connections")? {
            limits.max_connections = to_usize(v);
        }
        if let Some(v) = lim(&raw.limits.max_streams_per_connection, 1, 10_000, "max_streams_per_connection")? {
            limits.max_streams_per_connection = u32::try_from(v).unwrap_or(u32::MAX);
        }
        if let Some(v) = lim(&raw.limits.max_header_bytes, 8192, 16 * 1024 * 1024, "max_header_bytes")? {
            limits.max_header_bytes = to_usize(v);
        }
        if let Some(v) = lim(&raw.limits.max_headers, 1, 10_000, "max_headers")? {
            limits.max_headers = to_usize(v);
        }
        if let Some(v) = lim(&raw.limits.max_request_body_bytes, 0, u64::MAX, "max_request_body_bytes")? {
            limits.max_request_body_bytes = v;
        }
        if let Some(v) = lim(&raw.limits.rejection_table_max, 1, 10_000_000, "rejection_table_max")? {
            limits.rejection_table_max = v;
        }
        if let Some(v) = lim(&raw.limits.max_resources, 1, 100_000_000, "max_resources")? {
            limits.max_resources = to_usize(v);
        }
        if let Some(v) = lim(&raw.limits.upstream_max_idle_connections, 0, 100_000, "upstream_max_idle_connections")? {
            limits.upstream_max_idle_connections = to_usize(v);
        }

        if raw.routes.is_empty() {
            return Err(loc.err(0..0, "no [[route]] is configured; every request would be refused"));
        }
        let mut routes = Vec::with_capacity(raw.routes.len());
        for r in &raw.routes {
            routes.push(build_route(&loc, r)?);
        }

        Ok(Self {
            listen,
            upstream,
            data_dir: PathBuf::from(raw.data_dir.get_ref()),
            admin,
            token_header,
            resource_header,
            request_id_header,
            max_epoch_jump,
            signing,
            tls,
            upstream_tls,
            timeouts,
            limits,
            router: Router::new(routes),
            log_control: None,
        })
    }

    /// Loads every file the configuration names besides the data dir — the
    /// signing keys, the TLS certificates, keys and CAs — and reports the
    /// first that cannot be used. `--check-config` runs it; `start` loads the
    /// same files and refuses to start on the same errors.
    pub fn check_files(&self) -> Result<(), crate::server::StartError> {
        crate::signing::TokenVerifier::new(self.signing.clone())?;
        crate::listener::ClientAcceptor::new(self)?;
        crate::forward::Forward::new(self)?;
        Ok(())
    }

    /// The flag form: `--resource NAME` for every path, writes by default,
    /// `--read-route METHOD:PATH` allow-listed.
    pub fn simple(args: SimpleConfig) -> Result<Self, ConfigError> {
        let flag = |flag: &'static str| move |reason: String| ConfigError::Flag { flag, reason };
        let upstream = parse_upstream(&args.upstream).map_err(flag("--upstream"))?;
        if upstream.scheme_str() == Some("https") {
            return Err(flag("--upstream")(
                "an https:// upstream needs its CA: use --config with an [upstream_tls] table".into(),
            ));
        }
        check_listen_vs_upstream(args.listen, &upstream).map_err(flag("--upstream"))?;
        let resource = ResourceName::new(args.resource).map_err(|e| flag("--resource")(e.to_string()))?;
        let fixed = ResourceTemplate::fixed(&resource);
        let mut routes = Vec::new();
        for spec in &args.read_routes {
            let (method, path) = spec
                .split_once(':')
                .ok_or_else(|| flag("--read-route")(format!("{spec:?} must look like METHOD:PATH, e.g. GET:/ping")))?;
            let methods = parse_methods(&[method.to_owned()]).map_err(flag("--read-route"))?;
            let pattern = PathPattern::parse(path).map_err(|e| flag("--read-route")(format!("{spec:?}: {e}")))?;
            let route =
                Route::new(spec.clone(), methods, pattern, vec![], vec![], Some(fixed.clone()), RouteKind::Read)
                    .map_err(|e| flag("--read-route")(format!("{spec:?}: {e}")))?;
            routes.push(route);
        }
        let all = PathPattern::parse("/*").expect("constant pattern");
        routes.push(
            Route::new("all".into(), None, all, vec![], vec![], Some(fixed), RouteKind::Write).expect("constant route"),
        );
        Ok(Self {
            listen: args.listen,
            upstream,
            data_dir: args.data_dir,
            admin: args.admin,
            token_header: HeaderName::from_static("fencing-token"),
            resource_header: HeaderName::from_static("fencing-resource"),
            request_id_header: HeaderName::from_static("x-request-id"),
            max_epoch_jump: DEFAULT_MAX_EPOCH_JUMP,
            signing: None,
            tls: None,
            upstream_tls: None,
            timeouts: Timeouts::default(),
            limits: Limits::default(),
            router: Router::new(routes),
            log_control: None,
        })
    }
}

fn build_route(loc: &Locator<'_>, r: &RawRoute) -> Result<Route, ConfigError> {
    let kind = match &r.kind {
        None => RouteKind::Write,
        Some(k) => match k.get_ref().as_str() {
            "write" => RouteKind::Write,
            "read" => RouteKind::Read,
            other => return Err(loc.at(k, format!("kind {other:?} must be \"read\" or \"write\""))),
        },
    };
    let methods = match &r.methods {
        None if kind == RouteKind::Read => {
            return Err(loc.at(&r.path, "a read route must list its methods explicitly (default deny, P5)"));
        }
        None => None,
        Some(m) => parse_methods(m.get_ref()).map_err(|reason| loc.at(m, reason))?,
    };
    let path = PathPattern::parse(r.path.get_ref()).map_err(|e| loc.at(&r.path, e.to_string()))?;
    let mut query = Vec::new();
    for (k, v) in &r.query {
        if k.is_empty() {
            return Err(loc.at(v, "a query parameter name must not be empty"));
        }
        query.push((k.clone(), ValuePattern::parse(v.get_ref()).map_err(|e| loc.at(v, e.to_string()))?));
    }
    let mut headers = Vec::new();
    for (k, v) in &r.headers {
        let name = parse_header_name(k).map_err(|reason| loc.at(v, reason))?;
        headers.push((name, ValuePattern::parse(v.get_ref()).map_err(|e| loc.at(v, e.to_string()))?));
    }
    let resource = match &r.resource {
        None if kind == RouteKind::Write => {
            return Err(loc.at(&r.path, "a write route needs `resource` (the sidecar decides the resource, P6)"));
        }
        None => None,
        Some(t) => Some(ResourceTemplate::parse(t.get_ref()).map_err(|e| loc.at(t, e.to_string()))?),
    };
    let name = r.name.clone().unwrap_or_else(|| {
        let m = r.methods.as_ref().map_or_else(|| "*".to_owned(), |m| m.get_ref().join(","));
        format!("{m} {}", r.path.get_ref())
    });
    let span_for_route_errors = r.resource.as_ref().map_or_else(|| r.path.span(), |t| t.span());
    Route::new(name, methods, path, query, headers, resource, kind)
        .map_err(|e| loc.err(span_for_route_errors, e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
listen = "127.0.0.1:8087"
upstream = "http://127.0.0.1:8086"
data_dir = "/tmp/x"

[timeouts]
quarantine = "5s"

[limits]
rejection_table_max = 50

[[route]]
methods = ["GET", "HEAD"]
path = "/ping"
kind = "read"

[[route]]
methods = ["POST"]
path = "/write"
query = { db = "{db}" }
resource = "influx/{db}"

[[route]]
path = "/query"
query = { db = "{db}" }
resource = "influx/{db}"
"#;

    #[test]
    fn a_full_config_parses() {
        let c = ProxyConfig::from_toml_str(GOOD).unwrap();
        assert_eq!(c.timeouts.quarantine, Duration::from_secs(5));
        assert_eq!(c.timeouts.response, Duration::from_secs(30));
        assert_eq!(c.limits.rejection_table_max, 50);
        assert_eq!(c.router.routes().len(), 3);
        assert_eq!(c.token_header, "fencing-token");
        assert_eq!(c.upstream, "http://127.0.0.1:8086/");
    }

    fn err_of(text: &str) -> (usize, String) {
        match ProxyConfig::from_toml_str(text) {
            Err(ConfigError::Invalid { line, reason, .. }) => (line, reason),
            other => panic!("expected an Invalid error, got {other:?}"),
        }
    }

    #[test]
    fn errors_name_the_line_and_the_reason() {
        let bad = GOOD.replace("resource = \"influx/{db}\"\n\n[[route]]", "resource = \"influx/{nope}\"\n\n[[route]]");
        let (line, reason) = err_of(&bad);
        assert_eq!(line, 21, "{reason}");
        assert!(reason.contains("{nope}"), "{reason}");

        let (line, reason) = err_of(&GOOD.replace("\"5s\"", "\"soon\""));
        assert_eq!(line, 7);
        assert!(reason.contains("duration"), "{reason}");

        let (line, reason) = err_of(&GOOD.replace("rejection_table_max = 50", "rejection_tabel_max = 50"));
        assert_eq!(line, 10);
        assert!(reason.contains("rejection_tabel_max"), "{reason}");

        let (line, reason) = err_of(&GOOD.replace("methods = [\"GET\", \"HEAD\"]\n", ""));
        assert_eq!(line, 13);
        assert!(reason.contains("read route must list its methods"), "{reason}");

        let (_, reason) = err_of(&GOOD.replace("http://127.0.0.1:8086", "http://127.0.0.1:8087"));
        assert!(reason.contains("loop"), "{reason}");

        let (_, reason) = err_of(&GOOD.replace("\"/write\"", "\"write\""));
        assert!(reason.contains("start with '/'"), "{reason}");

        let (line, reason) = err_of("listen = \"127.0.0.1:1\"\nupstream = \"http://127.0.0.1:2\"\ndata_dir = \"d\"\n");
        assert_eq!(line, 1);
        assert!(reason.contains("no [[route]]"), "{reason}");

        let (line, reason) = err_of("listen = \"127.0.0.1:1\"\nupstream = 3\n");
        assert_eq!(line, 2, "{reason}");
    }

    #[test]
    fn signing_and_tls_tables_parse_with_their_defaults() {
        let text = GOOD.replace(
            "[timeouts]",
            "[signing]\nkeys_file = \"keys.json\"\n\n[tls]\ncert_file = \"c.pem\"\nkey_file = \"k.pem\"\n\n[timeouts]",
        );
        let c = ProxyConfig::from_toml_str(&text).unwrap();
        let signing = c.signing.unwrap();
        assert_eq!(signing.keys_file, PathBuf::from("keys.json"));
        assert!(signing.require_signed, "keys configured: unsigned tokens are refused by default");
        assert_eq!(signing.clock_skew, DEFAULT_CLOCK_SKEW);
        assert_eq!(c.tls.unwrap().client_ca_file, None);
        assert_eq!(c.upstream_tls, None);
        assert_eq!(c.timeouts.tls_handshake, Duration::from_secs(10));
        assert_eq!((c.limits.max_connections, c.limits.max_streams_per_connection), (4096, 100));

        let https = GOOD
            .replace("http://127.0.0.1:8086", "https://db.internal:8443")
            .replace("[timeouts]", "[upstream_tls]\nca_file = \"ca.pem\"\nserver_name = \"db\"\n\n[timeouts]");
        let c = ProxyConfig::from_toml_str(&https).unwrap();
        assert_eq!(c.upstream, "https://db.internal:8443/");
        assert_eq!(c.upstream_tls.unwrap().server_name.as_deref(), Some("db"));
    }

    #[test]
    fn tls_and_signing_mistakes_are_refused_with_their_line() {
        let https = GOOD.replace("http://127.0.0.1:8086", "https://127.0.0.1:8086");
        let (line, reason) = err_of(&https);
        assert_eq!(line, 3);
        assert!(reason.contains("[upstream_tls]"), "{reason}");

        let (_, reason) = err_of(&GOOD.replace("[timeouts]", "[upstream_tls]\nca_file = \"ca.pem\"\n[timeouts]"));
        assert!(reason.contains("upstream is http://"), "{reason}");

        let half =
            https.replace("[timeouts]", "[upstream_tls]\nca_file = \"ca.pem\"\ncert_file = \"c.pem\"\n[timeouts]");
        let (_, reason) = err_of(&half);
        assert!(reason.contains("set together"), "{reason}");

        let (_, reason) = err_of(&GOOD.replace("[timeouts]", "[signing]\nkeys_file = \"\"\n[timeouts]"));
        assert!(reason.contains("keys_file must not be empty"), "{reason}");

        let (line, reason) =
            err_of(&GOOD.replace("[timeouts]", "[signing]\nkeys_file = \"k\"\nrequire_signd = true\n[timeouts]"));
        assert_eq!(line, 8);
        assert!(reason.contains("require_signd"), "{reason}");

        let (_, reason) =
            err_of(&GOOD.replace("[timeouts]", "[signing]\nkeys_file = \"k\"\nclock_skew = \"2h\"\n[timeouts]"));
        assert!(reason.contains("at most 1h"), "{reason}");

        let bad = SimpleConfig {
            listen: "127.0.0.1:1".parse().unwrap(),
            upstream: "https://127.0.0.1:2".into(),
            resource: "orders".into(),
            data_dir: "d".into(),
            admin: "127.0.0.1:3".parse().unwrap(),
            read_routes: vec![],
        };
        assert!(ProxyConfig::simple(bad).unwrap_err().to_string().contains("[upstream_tls]"));
    }

    #[test]
    fn the_simple_form_makes_every_unlisted_route_a_write() {
        let c = ProxyConfig::simple(SimpleConfig {
            listen: "127.0.0.1:1".parse().unwrap(),
            upstream: "http://127.0.0.1:2".into(),
            resource: "orders".into(),
            data_dir: "d".into(),
            admin: "127.0.0.1:3".parse().unwrap(),
            read_routes: vec!["GET:/ping".into()],
        })
        .unwrap();
        let kinds: Vec<_> = c.router.routes().iter().map(Route::kind).collect();
        assert_eq!(kinds, [RouteKind::Read, RouteKind::Write]);
        let bad = ProxyConfig::simple(SimpleConfig {
            listen: "127.0.0.1:1".parse().unwrap(),
            upstream: "http://127.0.0.1:2".into(),
            resource: "/orders".into(),
            data_dir: "d".into(),
            admin: "127.0.0.1:3".parse().unwrap(),
            read_routes: vec![],
        })
        .unwrap_err();
        assert!(bad.to_string().starts_with("--resource:"), "{bad}");
    }
}
