//! Proxy configuration: the `proxy.toml` file of both front ends, every
//! limit with its default, and validation that names the line and the
//! reason. What only the HTTP proxy reads (upstream URL, headers, routes,
//! the simple flag form) is in `http/config.rs`; the `[postgres]` table is
//! in `postgres/config.rs`. Nothing here opens a file or builds a runtime
//! object: `server::check_files` loads what the configuration names.

use std::net::SocketAddr;
use std::ops::Range;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::core::log_level::LogControlHandle;
use crate::http::config::{HttpConfig, RawRoute, RawUpstreamTls};
use crate::postgres::config::{PostgresConfig, RawPostgres};

/// Default admin listen address (loopback: without `admin_token_file` the
/// admin API has no authentication).
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
    /// Directory of the epoch store (`epochs.redb`), the rejection log
    /// (`rejections.jsonl`) and the admin audit log (`audit.jsonl`).
    pub data_dir: PathBuf,
    /// Admin API listen address.
    pub admin: SocketAddr,
    /// File holding the admin API's bearer token; `None`: no
    /// authentication (keep `admin` on loopback).
    pub admin_token_file: Option<PathBuf>,
    /// Largest amount one request may raise a resource's epoch by. With
    /// signed tokens it is the second line of defence (a leaked signing key
    /// still cannot jump an epoch arbitrarily far); without them, the first.
    /// Admin raise-epoch is not capped.
    pub max_epoch_jump: u64,
    /// Signed tokens (P7): the public keys and how strictly to check.
    /// `None`: tokens are plain numbers and nothing vouches for them.
    pub signing: Option<SigningConfig>,
    /// TLS on the client-facing listener; `None`: plaintext.
    pub tls: Option<ListenerTls>,
    /// Timeouts.
    pub timeouts: Timeouts,
    /// Size and count limits.
    pub limits: Limits,
    /// The protocol spoken to clients and the upstream, with what only it
    /// needs.
    pub frontend: Frontend,
    /// Run-time log filter changes through the admin API (`/v1/log-level`),
    /// when the process owns a reloadable subscriber; never read from a file.
    pub log_control: Option<LogControlHandle>,
}

/// The front end: what clients and the upstream speak (`protocol` in
/// `proxy.toml`, `--protocol` on the command line).
#[derive(Debug, Clone)]
pub enum Frontend {
    /// HTTP/1.1 and HTTP/2 to an HTTP upstream (DESIGN §4).
    Http(HttpConfig),
    /// The PostgreSQL wire protocol to an unmodified PostgreSQL (§4a).
    Postgres(PostgresConfig),
}

impl ProxyConfig {
    /// The flag forms' configuration: `frontend` with every other setting
    /// at its default.
    pub(crate) fn with_defaults(listen: SocketAddr, data_dir: PathBuf, admin: SocketAddr, frontend: Frontend) -> Self {
        Self {
            listen,
            data_dir,
            admin,
            admin_token_file: None,
            max_epoch_jump: DEFAULT_MAX_EPOCH_JUMP,
            signing: None,
            tls: None,
            timeouts: Timeouts::default(),
            limits: Limits::default(),
            frontend,
            log_control: None,
        }
    }

    /// The HTTP front end's settings, when this is an HTTP proxy.
    pub fn http(&self) -> Option<&HttpConfig> {
        match &self.frontend {
            Frontend::Http(h) => Some(h),
            Frontend::Postgres(_) => None,
        }
    }

    /// The PostgreSQL front end's settings, when this is a PostgreSQL
    /// sidecar.
    pub fn postgres(&self) -> Option<&PostgresConfig> {
        match &self.frontend {
            Frontend::Postgres(p) => Some(p),
            Frontend::Http(_) => None,
        }
    }

    /// Mutable [`ProxyConfig::postgres`].
    pub fn postgres_mut(&mut self) -> Option<&mut PostgresConfig> {
        match &mut self.frontend {
            Frontend::Postgres(p) => Some(p),
            Frontend::Http(_) => None,
        }
    }

    /// Mutable [`ProxyConfig::http`].
    pub fn http_mut(&mut self) -> Option<&mut HttpConfig> {
        match &mut self.frontend {
            Frontend::Http(h) => Some(h),
            Frontend::Postgres(_) => None,
        }
    }
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

/// Default clock-skew allowance for signing-key windows.
pub const DEFAULT_CLOCK_SKEW: Duration = fencer_token::DEFAULT_CLOCK_SKEW;

/// Every timeout of the `[timeouts]` table, with its default. `connect`,
/// `response`, `body_idle`, `request_body`, `header_read` and `idle` are
/// the HTTP proxy's; the
/// PostgreSQL sidecar's own are in its `[postgres]` table.
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
    /// Longest pause between two body frames, either direction (default
    /// 60 s): an upstream that pauses its answer, a client that pauses its
    /// request body, and a client that stops reading its answer (which would
    /// otherwise hold the resource's shared guard, P3) are cut after it.
    pub body_idle: Duration,
    /// Total time the proxy may spend waiting for one request body's data
    /// from the client (default 30 s). Time the proxy or the upstream take
    /// does not count. A slower client is cut: 408 when nothing was
    /// forwarded yet, else 504 outcome unknown (P4).
    pub request_body: Duration,
    /// How long a resource stays indeterminate after the upstream connection
    /// of an unknown outcome closed (default 30 s, P4).
    pub quarantine: Duration,
    /// Time a client has to send a request head (default 10 s): from the
    /// connection's first byte (or the end of its TLS handshake) to its first
    /// complete request, and on an HTTP/1 keep-alive connection from the
    /// first byte of each further request to its complete head.
    pub header_read: Duration,
    /// How long a client connection may stay open with no request in
    /// progress and, for HTTP/1, no byte of a next request (default 60 s);
    /// then it is closed (HTTP/2: GOAWAY).
    pub idle: Duration,
    /// Time a client has to complete the TLS handshake (default 10 s).
    pub tls_handshake: Duration,
    /// Time a new connection has to send its first byte; one that sends
    /// nothing is closed and counted (default 10 s).
    pub first_byte: Duration,
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
            request_body: Duration::from_secs(30),
            quarantine: Duration::from_secs(30),
            header_read: Duration::from_secs(10),
            idle: Duration::from_secs(60),
            tls_handshake: Duration::from_secs(10),
            first_byte: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(30),
        }
    }
}

/// Every size and count limit of the `[limits]` table, with its default.
/// `max_connections`, `rejection_table_max` and `max_resources` apply to
/// both front ends; the others are the HTTP proxy's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Requests handled at once; beyond it the proxy answers 503 at once
    /// rather than queueing (default 1,024).
    pub max_concurrent_requests: usize,
    /// Client connections open at once, TLS handshakes included; a client
    /// beyond it is refused at once (HTTP 503, PostgreSQL `53300`), logged
    /// and counted in `fencer_proxy_connections_refused_total` (default
    /// 4,096).
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConfig {
    pub(crate) protocol: Option<Spanned<String>>,
    pub(crate) listen: Spanned<String>,
    pub(crate) data_dir: Spanned<String>,
    pub(crate) admin: Option<Spanned<String>>,
    pub(crate) admin_token_file: Option<Spanned<String>>,
    pub(crate) max_epoch_jump: Option<Spanned<u64>>,
    pub(crate) signing: Option<Spanned<RawSigning>>,
    pub(crate) tls: Option<Spanned<RawListenerTls>>,
    #[serde(default)]
    pub(crate) timeouts: RawTimeouts,
    #[serde(default)]
    pub(crate) limits: RawLimits,
    // HTTP only.
    pub(crate) upstream: Option<Spanned<String>>,
    pub(crate) token_header: Option<Spanned<String>>,
    pub(crate) resource_header: Option<Spanned<String>>,
    pub(crate) request_id_header: Option<Spanned<String>>,
    pub(crate) upstream_tls: Option<Spanned<RawUpstreamTls>>,
    #[serde(default, rename = "route")]
    pub(crate) routes: Vec<RawRoute>,
    // PostgreSQL only.
    pub(crate) postgres: Option<Spanned<RawPostgres>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTimeouts {
    pub(crate) connect: Option<Spanned<String>>,
    pub(crate) response: Option<Spanned<String>>,
    pub(crate) body_idle: Option<Spanned<String>>,
    pub(crate) request_body: Option<Spanned<String>>,
    pub(crate) quarantine: Option<Spanned<String>>,
    pub(crate) header_read: Option<Spanned<String>>,
    pub(crate) idle: Option<Spanned<String>>,
    pub(crate) tls_handshake: Option<Spanned<String>>,
    pub(crate) first_byte: Option<Spanned<String>>,
    pub(crate) shutdown_grace: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSigning {
    keys_file: Spanned<String>,
    require_signed: Option<bool>,
    clock_skew: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawListenerTls {
    cert_file: Spanned<String>,
    key_file: Spanned<String>,
    client_ca_file: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLimits {
    pub(crate) max_concurrent_requests: Option<Spanned<u64>>,
    pub(crate) max_connections: Option<Spanned<u64>>,
    pub(crate) max_streams_per_connection: Option<Spanned<u64>>,
    pub(crate) max_header_bytes: Option<Spanned<u64>>,
    pub(crate) max_headers: Option<Spanned<u64>>,
    pub(crate) max_request_body_bytes: Option<Spanned<u64>>,
    pub(crate) rejection_table_max: Option<Spanned<u64>>,
    pub(crate) max_resources: Option<Spanned<u64>>,
    pub(crate) upstream_max_idle_connections: Option<Spanned<u64>>,
}

/// Turns byte spans into line/column errors.
pub(crate) struct Locator<'a> {
    pub(crate) text: &'a str,
}

impl Locator<'_> {
    pub(crate) fn err(&self, span: Range<usize>, reason: impl Into<String>) -> ConfigError {
        let start = span.start.min(self.text.len());
        let before = &self.text[..start];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        ConfigError::Invalid { line, column, reason: reason.into() }
    }

    pub(crate) fn at<T>(&self, s: &Spanned<T>, reason: impl Into<String>) -> ConfigError {
        self.err(s.span(), reason)
    }
}

pub(crate) fn non_empty_path(loc: &Locator<'_>, s: &Spanned<String>, key: &str) -> Result<PathBuf, ConfigError> {
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

pub(crate) fn parse_duration(raw: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(raw)
        .map_err(|e| format!("{raw:?} is not a duration like \"500ms\" or \"30s\": {e}"))?;
    if d.is_zero() {
        return Err("a timeout of zero is not allowed".into());
    }
    Ok(d)
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
        let admin_token_file = match &raw.admin_token_file {
            Some(f) if f.get_ref().is_empty() => return Err(loc.at(f, "admin_token_file must not be empty")),
            f => f.as_ref().map(|f| PathBuf::from(f.get_ref())),
        };
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
            (&raw.timeouts.request_body, &mut timeouts.request_body),
            (&raw.timeouts.quarantine, &mut timeouts.quarantine),
            (&raw.timeouts.header_read, &mut timeouts.header_read),
            (&raw.timeouts.idle, &mut timeouts.idle),
            (&raw.timeouts.tls_handshake, &mut timeouts.tls_handshake),
            (&raw.timeouts.first_byte, &mut timeouts.first_byte),
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

        let frontend = match raw.protocol.as_ref().map(|p| p.get_ref().as_str()) {
            None | Some("http") => {
                if let Some(pg) = &raw.postgres {
                    return Err(loc.at(pg, "[postgres] needs protocol = \"postgres\""));
                }
                Frontend::Http(HttpConfig::from_raw(&loc, &raw, listen)?)
            }
            Some("postgres") => {
                // HTTP-only timeouts the PostgreSQL front end would otherwise
                // ignore silently (its own are in [postgres]).
                for (key, value) in
                    [("timeouts.idle", &raw.timeouts.idle), ("timeouts.request_body", &raw.timeouts.request_body)]
                {
                    if let Some(v) = value {
                        return Err(loc.at(v, format!("{key} applies to protocol = \"http\" only; the PostgreSQL sidecar's settings are in [postgres]")));
                    }
                }
                Frontend::Postgres(PostgresConfig::from_raw(&loc, &raw, raw.postgres.as_ref(), listen)?)
            }
            Some(other) => {
                let span = raw.protocol.as_ref().expect("set when not the default");
                return Err(loc.at(span, format!("protocol {other:?} must be \"http\" or \"postgres\"")));
            }
        };

        Ok(Self {
            listen,
            data_dir: PathBuf::from(raw.data_dir.get_ref()),
            admin,
            admin_token_file,
            max_epoch_jump,
            signing,
            tls,
            timeouts,
            limits,
            frontend,
            log_control: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::SimpleConfig;
    use crate::http::routes::{Route, RouteKind};

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
        assert_eq!(c.http().unwrap().router.routes().len(), 3);
        assert_eq!(c.http().unwrap().token_header, "fencing-token");
        assert_eq!(c.http().unwrap().upstream, "http://127.0.0.1:8086/");
    }

    #[test]
    fn the_connection_timeouts_have_defaults_and_are_http_only() {
        let c = ProxyConfig::from_toml_str(GOOD).unwrap();
        assert_eq!(c.timeouts.header_read, Duration::from_secs(10));
        assert_eq!(c.timeouts.idle, Duration::from_secs(60));
        assert_eq!(c.timeouts.request_body, Duration::from_secs(30));
        assert_eq!(c.timeouts.body_idle, Duration::from_secs(60));
        assert_eq!(c.admin_token_file, None);
        let set = GOOD.replace(
            "quarantine = \"5s\"",
            "quarantine = \"5s\"\nidle = \"2m\"\nrequest_body = \"500ms\"\nheader_read = \"1s\"",
        );
        let c = ProxyConfig::from_toml_str(
            &set.replace("data_dir = \"/tmp/x\"", "data_dir = \"/tmp/x\"\nadmin_token_file = \"/etc/t\""),
        )
        .unwrap();
        assert_eq!(c.timeouts.idle, Duration::from_secs(120));
        assert_eq!(c.timeouts.request_body, Duration::from_millis(500));
        assert_eq!(c.timeouts.header_read, Duration::from_secs(1));
        assert_eq!(c.admin_token_file.as_deref(), Some(std::path::Path::new("/etc/t")));
        let (line, reason) = err_of(&GOOD.replace("quarantine = \"5s\"", "idle = \"0s\""));
        assert_eq!(line, 7, "{reason}");
        assert!(reason.contains("zero"), "{reason}");
        let (_, reason) =
            err_of(&GOOD.replace("data_dir = \"/tmp/x\"", "data_dir = \"/tmp/x\"\nadmin_token_file = \"\""));
        assert!(reason.contains("admin_token_file must not be empty"), "{reason}");
        let pg = "protocol = \"postgres\"\nlisten = \"127.0.0.1:6432\"\ndata_dir = \"d\"\n[timeouts]\nidle = \"5s\"\n[postgres]\nupstream = \"127.0.0.1:5432\"\nresource = \"pg/x\"\n";
        let (line, reason) = err_of(pg);
        assert_eq!(line, 5, "{reason}");
        assert!(reason.contains("timeouts.idle applies to protocol = \"http\" only"), "{reason}");
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
        let signing = c.signing.clone().unwrap();
        assert_eq!(signing.keys_file, PathBuf::from("keys.json"));
        assert!(signing.require_signed, "keys configured: unsigned tokens are refused by default");
        assert_eq!(signing.clock_skew, DEFAULT_CLOCK_SKEW);
        assert_eq!(c.tls.clone().unwrap().client_ca_file, None);
        assert_eq!(c.http().unwrap().upstream_tls, None);
        assert_eq!(c.timeouts.tls_handshake, Duration::from_secs(10));
        assert_eq!((c.limits.max_connections, c.limits.max_streams_per_connection), (4096, 100));

        let https = GOOD
            .replace("http://127.0.0.1:8086", "https://db.internal:8443")
            .replace("[timeouts]", "[upstream_tls]\nca_file = \"ca.pem\"\nserver_name = \"db\"\n\n[timeouts]");
        let c = ProxyConfig::from_toml_str(&https).unwrap();
        assert_eq!(c.http().unwrap().upstream, "https://db.internal:8443/");
        assert_eq!(c.http().unwrap().upstream_tls.clone().unwrap().server_name.as_deref(), Some("db"));
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
        let kinds: Vec<_> = c.http().unwrap().router.routes().iter().map(Route::kind).collect();
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
