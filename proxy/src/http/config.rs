//! What only the HTTP proxy reads from `proxy.toml` (DESIGN §4): the
//! upstream URL and its TLS, the token, resource and request-id headers,
//! the ordered route table (P5, P6), and the simple flag form.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use http::{HeaderName, Method, Uri};
use serde::Deserialize;
use toml::Spanned;

use crate::config::{ConfigError, Frontend, Locator, ProxyConfig, RawConfig, non_empty_path};
use crate::core::names::ResourceName;
use crate::http::routes::{PathPattern, ResourceTemplate, Route, RouteKind, Router, ValuePattern};

/// The HTTP front end's settings.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// The protected service, `http://host:port` or `https://host:port`
    /// (HTTP/1.1 only).
    pub upstream: Uri,
    /// Header carrying the fencing token (default `Fencing-Token`).
    pub token_header: HeaderName,
    /// Optional client header naming the resource; when present it must
    /// equal the route's resource (P6). Default `Fencing-Resource`.
    pub resource_header: HeaderName,
    /// Header whose value is logged as the request id (default
    /// `X-Request-Id`); one is generated when it is absent.
    pub request_id_header: HeaderName,
    /// TLS to the upstream; set exactly when the upstream is `https://`.
    pub upstream_tls: Option<UpstreamTls>,
    /// The ordered route table.
    pub router: Router,
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
pub(crate) struct RawUpstreamTls {
    ca_file: Spanned<String>,
    cert_file: Option<Spanned<String>>,
    key_file: Option<Spanned<String>>,
    server_name: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRoute {
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

impl RawRoute {
    pub(crate) fn path_span(&self) -> &Spanned<String> {
        &self.path
    }
}

impl HttpConfig {
    /// The HTTP parts of a parsed `proxy.toml`.
    pub(crate) fn from_raw(loc: &Locator<'_>, raw: &RawConfig, listen: SocketAddr) -> Result<Self, ConfigError> {
        let Some(raw_upstream) = &raw.upstream else {
            return Err(loc.at(
                &raw.listen,
                "upstream is missing: the protected service, e.g. upstream = \"http://127.0.0.1:8086\"",
            ));
        };
        let upstream = parse_upstream(raw_upstream.get_ref()).map_err(|r| loc.at(raw_upstream, r))?;
        check_listen_vs_upstream(listen, &upstream).map_err(|r| loc.at(raw_upstream, r))?;
        let upstream_tls = match &raw.upstream_tls {
            Some(t) => Some(build_upstream_tls(loc, t, &upstream)?),
            None if upstream.scheme_str() == Some("https") => {
                return Err(loc.at(raw_upstream, "an https:// upstream needs [upstream_tls] with at least ca_file"));
            }
            None => None,
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
        if raw.routes.is_empty() {
            return Err(loc.err(0..0, "no [[route]] is configured; every request would be refused"));
        }
        let mut routes = Vec::with_capacity(raw.routes.len());
        for r in &raw.routes {
            routes.push(build_route(loc, r)?);
        }
        Ok(Self {
            upstream,
            token_header,
            resource_header,
            request_id_header,
            upstream_tls,
            router: Router::new(routes),
        })
    }
}

impl ProxyConfig {
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
        let frontend = Frontend::Http(HttpConfig {
            upstream,
            token_header: HeaderName::from_static("fencing-token"),
            resource_header: HeaderName::from_static("fencing-resource"),
            request_id_header: HeaderName::from_static("x-request-id"),
            upstream_tls: None,
            router: Router::new(routes),
        });
        Ok(Self::with_defaults(args.listen, args.data_dir, args.admin, frontend))
    }
}

pub(crate) fn parse_upstream(raw: &str) -> Result<Uri, String> {
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

pub(crate) fn build_upstream_tls(
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
            crate::http::forward::parse_server_name(n.get_ref()).map_err(|reason| loc.at(n, reason))?;
            Some(n.get_ref().clone())
        }
    };
    Ok(UpstreamTls { ca_file: non_empty_path(loc, &r.ca_file, "ca_file")?, cert_file, key_file, server_name })
}

pub(crate) fn parse_header_name(raw: &str) -> Result<HeaderName, String> {
    HeaderName::from_bytes(raw.as_bytes()).map_err(|_| format!("{raw:?} is not a valid HTTP header name"))
}

pub(crate) fn parse_method(raw: &str) -> Result<Method, String> {
    if raw.is_empty() || !raw.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(format!("method {raw:?} must be an upper-case HTTP method such as GET"));
    }
    Method::from_bytes(raw.as_bytes()).map_err(|_| format!("{raw:?} is not an HTTP method"))
}

/// Parses a `methods` list; `["*"]` means any method.
pub(crate) fn parse_methods(raw: &[String]) -> Result<Option<Vec<Method>>, String> {
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

/// Refuses an upstream that is the listener itself (a loop).
pub(crate) fn check_listen_vs_upstream(listen: SocketAddr, upstream: &Uri) -> Result<(), String> {
    let authority = upstream.authority().map(|a| a.as_str()).unwrap_or("");
    let port_listen = listen.port();
    if let Ok(up) = authority.parse::<SocketAddr>()
        && (up == listen || (up.port() == port_listen && (up.ip().is_unspecified() || listen.ip().is_unspecified())))
    {
        return Err(format!("upstream {authority} is the proxy's own listen address; that would loop"));
    }
    Ok(())
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
