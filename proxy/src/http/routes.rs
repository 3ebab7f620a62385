//! Route classification (P5, P6): which configured route a request matches,
//! whether that route is on the read allow-list, and which resource it names.
//!
//! The first route in configuration order that matches wins. A request that
//! matches no route is refused: the proxy cannot tell which resource it
//! touches, and default deny means it is not a read.

use std::collections::HashMap;
use std::fmt;

use http::{HeaderMap, HeaderName, Method, Uri};
use serde::{Deserialize, Serialize};

use crate::core::names::{ResourceName, ResourceNameError};

/// Whether a route is on the read allow-list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RouteKind {
    /// Forwarded without a token (P5 allow-list). Never fenced.
    Read,
    /// Needs a fencing token and goes through the fence (the default).
    Write,
}

/// One configured route: what it matches and which resource it names.
#[derive(Debug, Clone)]
pub struct Route {
    pub(crate) name: String,
    pub(crate) methods: Option<Vec<Method>>,
    pub(crate) path: PathPattern,
    pub(crate) query: Vec<(String, ValuePattern)>,
    pub(crate) headers: Vec<(HeaderName, ValuePattern)>,
    pub(crate) resource: Option<ResourceTemplate>,
    pub(crate) kind: RouteKind,
}

impl Route {
    /// The route's name (from the config, or derived from method and path).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The path template, e.g. `/db/{name}/*`. This, never the raw request
    /// path, is what the rejection log records.
    pub fn path_template(&self) -> &str {
        &self.path.raw
    }

    /// Read (allow-listed) or write.
    pub fn kind(&self) -> RouteKind {
        self.kind
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Segment {
    Literal(String),
    Capture(String),
    /// Trailing `*`: zero or more further segments.
    Rest,
}

/// A path template: `/literal/{capture}/*`.
#[derive(Debug, Clone)]
pub(crate) struct PathPattern {
    pub(crate) raw: String,
    segments: Vec<Segment>,
}

/// How a query parameter or header value must look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ValuePattern {
    /// `{name}`: present, any value, captured for the resource template.
    Capture(String),
    /// `*`: present with any value.
    Any,
    /// Anything else: exactly this value (query values after decoding).
    Exact(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum TemplatePart {
    Literal(String),
    Var(String),
}

/// A resource template such as `db/{name}`.
#[derive(Debug, Clone)]
pub(crate) struct ResourceTemplate {
    raw: String,
    parts: Vec<TemplatePart>,
}

/// Why a pattern or template in the configuration is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    /// A path template must start with `/`.
    #[error("path template must start with '/'")]
    NoLeadingSlash,
    /// `*` may only be the last segment.
    #[error("'*' may only appear as the whole last segment of a path template")]
    MisplacedRest,
    /// A capture name is not an identifier.
    #[error("capture name {0:?} must match [A-Za-z_][A-Za-z0-9_]*")]
    BadCaptureName(String),
    /// The same capture appears twice in one route.
    #[error("capture {{{0}}} appears more than once in this route")]
    DuplicateCapture(String),
    /// A literal segment contains `{`, `}` or `*`.
    #[error("literal {0:?} contains '{{', '}}' or '*'; a capture is a whole segment like {{name}}")]
    BadLiteral(String),
    /// The resource template uses a variable no pattern captures.
    #[error("resource template uses {{{0}}}, which this route's path, query or headers do not capture")]
    UnboundVariable(String),
    /// The resource template cannot produce a valid name.
    #[error("resource template {template:?} cannot produce a valid resource name: {source}")]
    InvalidTemplate {
        /// The template.
        template: String,
        /// The rule it breaks.
        source: ResourceNameError,
    },
    /// An unbalanced brace in a resource template.
    #[error("unbalanced '{{' or '}}' in resource template")]
    UnbalancedBrace,
}

fn is_ident(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn capture_name(s: &str) -> Option<&str> {
    s.strip_prefix('{').and_then(|s| s.strip_suffix('}'))
}

impl PathPattern {
    pub(crate) fn parse(raw: &str) -> Result<Self, PatternError> {
        let rest = raw.strip_prefix('/').ok_or(PatternError::NoLeadingSlash)?;
        let pieces: Vec<&str> = rest.split('/').collect();
        let mut segments = Vec::with_capacity(pieces.len());
        for (i, piece) in pieces.iter().enumerate() {
            if *piece == "*" {
                if i + 1 != pieces.len() {
                    return Err(PatternError::MisplacedRest);
                }
                segments.push(Segment::Rest);
            } else if let Some(name) = capture_name(piece) {
                if !is_ident(name) {
                    return Err(PatternError::BadCaptureName(name.to_owned()));
                }
                segments.push(Segment::Capture(name.to_owned()));
            } else if piece.contains(['{', '}', '*']) {
                return Err(PatternError::BadLiteral((*piece).to_owned()));
            } else {
                segments.push(Segment::Literal((*piece).to_owned()));
            }
        }
        Ok(Self { raw: raw.to_owned(), segments })
    }

    fn captures(&self) -> impl Iterator<Item = &str> {
        self.segments.iter().filter_map(|s| match s {
            Segment::Capture(n) => Some(n.as_str()),
            _ => None,
        })
    }

    fn matches<'p>(&self, path_segments: &[&'p str], caps: &mut Vec<(String, &'p str)>) -> bool {
        let mut i = 0;
        for seg in &self.segments {
            match seg {
                Segment::Rest => return true,
                Segment::Literal(lit) => {
                    if path_segments.get(i) != Some(&lit.as_str()) {
                        return false;
                    }
                }
                Segment::Capture(name) => match path_segments.get(i) {
                    Some(v) if !v.is_empty() => caps.push((name.clone(), v)),
                    _ => return false,
                },
            }
            i += 1;
        }
        i == path_segments.len()
    }
}

impl ValuePattern {
    pub(crate) fn parse(raw: &str) -> Result<Self, PatternError> {
        if raw == "*" {
            return Ok(Self::Any);
        }
        if let Some(name) = capture_name(raw) {
            if !is_ident(name) {
                return Err(PatternError::BadCaptureName(name.to_owned()));
            }
            return Ok(Self::Capture(name.to_owned()));
        }
        Ok(Self::Exact(raw.to_owned()))
    }
}

impl ResourceTemplate {
    pub(crate) fn parse(raw: &str) -> Result<Self, PatternError> {
        let mut parts = Vec::new();
        let mut rest = raw;
        while !rest.is_empty() {
            match rest.find(['{', '}']) {
                None => {
                    parts.push(TemplatePart::Literal(rest.to_owned()));
                    break;
                }
                Some(at) if rest.as_bytes()[at] == b'}' => {
                    return Err(PatternError::UnbalancedBrace);
                }
                Some(at) => {
                    if at > 0 {
                        parts.push(TemplatePart::Literal(rest[..at].to_owned()));
                    }
                    let close = rest[at..].find('}').ok_or(PatternError::UnbalancedBrace)? + at;
                    let name = &rest[at + 1..close];
                    if !is_ident(name) {
                        return Err(PatternError::BadCaptureName(name.to_owned()));
                    }
                    parts.push(TemplatePart::Var(name.to_owned()));
                    rest = &rest[close + 1..];
                }
            }
        }
        let template = Self { raw: raw.to_owned(), parts };
        // A template must be able to produce a valid name: try it with a
        // harmless value for every variable.
        let probe: HashMap<&str, &str> = template.vars().map(|v| (v, "x")).collect();
        template.render(&probe).map_err(|source| PatternError::InvalidTemplate { template: raw.to_owned(), source })?;
        Ok(template)
    }

    fn vars(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter_map(|p| match p {
            TemplatePart::Var(v) => Some(v.as_str()),
            TemplatePart::Literal(_) => None,
        })
    }

    fn render(&self, values: &HashMap<&str, &str>) -> Result<ResourceName, ResourceNameError> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                TemplatePart::Literal(l) => out.push_str(l),
                TemplatePart::Var(v) => out.push_str(values.get(v.as_str()).copied().unwrap_or("")),
            }
        }
        ResourceName::new(out)
    }

    /// A template without variables: the simple `--resource NAME` case.
    pub(crate) fn fixed(name: &ResourceName) -> Self {
        Self { raw: name.to_string(), parts: vec![TemplatePart::Literal(name.to_string())] }
    }
}

impl fmt::Display for ResourceTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.raw)
    }
}

impl Route {
    /// Builds and checks a route: captures unique, every template variable
    /// bound, read routes need explicit methods (checked by the config).
    pub(crate) fn new(
        name: String,
        methods: Option<Vec<Method>>,
        path: PathPattern,
        query: Vec<(String, ValuePattern)>,
        headers: Vec<(HeaderName, ValuePattern)>,
        resource: Option<ResourceTemplate>,
        kind: RouteKind,
    ) -> Result<Self, PatternError> {
        let mut seen: Vec<&str> = Vec::new();
        let value_caps = query.iter().map(|(_, p)| p).chain(headers.iter().map(|(_, p)| p)).filter_map(|p| match p {
            ValuePattern::Capture(n) => Some(n.as_str()),
            _ => None,
        });
        for cap in path.captures().chain(value_caps) {
            if seen.contains(&cap) {
                return Err(PatternError::DuplicateCapture(cap.to_owned()));
            }
            seen.push(cap);
        }
        if let Some(t) = &resource
            && let Some(v) = t.vars().find(|v| !seen.contains(v))
        {
            return Err(PatternError::UnboundVariable(v.to_owned()));
        }
        Ok(Self { name, methods, path, query, headers, resource, kind })
    }
}

/// What classification decided for a request.
#[derive(Debug)]
pub(crate) struct Classified<'r> {
    pub(crate) route: &'r Route,
    /// `None` only for read routes configured without a resource.
    pub(crate) resource: Option<ResourceName>,
}

/// Why a request could not be classified; each is a refusal (default deny).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ClassifyError {
    #[error("no configured route matches this request")]
    NoRoute,
    #[error("the path contains a '.' or '..' segment or an encoded '.', '/' or '\\'; refusing an ambiguous path")]
    AmbiguousPath,
    #[error("the {0} {1:?} appears more than once and the route depends on it; refusing an ambiguous request")]
    Repeated(&'static str, String),
    #[error("the resource named by route {route:?} is invalid: {source}")]
    InvalidResource { route: String, route_template: String, source: ResourceNameError },
}

/// The ordered route table.
#[derive(Debug, Clone)]
pub struct Router {
    routes: Vec<Route>,
}

fn path_is_ambiguous(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    lower.contains("%2e")
        || lower.contains("%2f")
        || lower.contains("%5c")
        || path.contains('\\')
        || path.split('/').any(|s| s == "." || s == "..")
}

/// Decodes one `application/x-www-form-urlencoded` component.
fn form_decode(s: &str) -> String {
    let plus = s.replace('+', " ");
    percent_encoding::percent_decode_str(&plus).decode_utf8_lossy().into_owned()
}

impl Router {
    pub(crate) fn new(routes: Vec<Route>) -> Self {
        Self { routes }
    }

    /// The routes in match order.
    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    pub(crate) fn classify(
        &self,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
    ) -> Result<Classified<'_>, ClassifyError> {
        let path = uri.path();
        if path_is_ambiguous(path) {
            return Err(ClassifyError::AmbiguousPath);
        }
        let path_segments: Vec<&str> = path.strip_prefix('/').unwrap_or(path).split('/').collect();
        let query: Vec<(String, String)> = uri
            .query()
            .unwrap_or("")
            .split('&')
            .filter(|kv| !kv.is_empty())
            .map(|kv| {
                let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                (form_decode(k), form_decode(v))
            })
            .collect();

        'routes: for route in &self.routes {
            if let Some(methods) = &route.methods
                && !methods.contains(method)
            {
                continue;
            }
            let mut caps: Vec<(String, &str)> = Vec::new();
            if !route.path.matches(&path_segments, &mut caps) {
                continue;
            }
            let mut owned_caps: Vec<(String, String)> = caps.into_iter().map(|(k, v)| (k, v.to_owned())).collect();
            for (key, pattern) in &route.query {
                let mut values = query.iter().filter(|(k, _)| k == key).map(|(_, v)| v);
                let Some(value) = values.next() else {
                    continue 'routes;
                };
                if values.next().is_some() {
                    return Err(ClassifyError::Repeated("query parameter", key.clone()));
                }
                if !value_matches(pattern, value, &mut owned_caps) {
                    continue 'routes;
                }
            }
            for (name, pattern) in &route.headers {
                let mut values = headers.get_all(name).iter();
                let Some(value) = values.next() else {
                    continue 'routes;
                };
                if values.next().is_some() {
                    return Err(ClassifyError::Repeated("header", name.to_string()));
                }
                let Ok(value) = value.to_str() else {
                    continue 'routes;
                };
                if !value_matches(pattern, value, &mut owned_caps) {
                    continue 'routes;
                }
            }
            let resource = match &route.resource {
                None => None,
                Some(t) => {
                    let values: HashMap<&str, &str> =
                        owned_caps.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                    Some(t.render(&values).map_err(|source| ClassifyError::InvalidResource {
                        route: route.name.clone(),
                        route_template: route.path.raw.clone(),
                        source,
                    })?)
                }
            };
            return Ok(Classified { route, resource });
        }
        Err(ClassifyError::NoRoute)
    }
}

fn value_matches(pattern: &ValuePattern, value: &str, caps: &mut Vec<(String, String)>) -> bool {
    match pattern {
        ValuePattern::Any => true,
        ValuePattern::Exact(e) => e == value,
        ValuePattern::Capture(name) => {
            caps.push((name.clone(), value.to_owned()));
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(
        methods: Option<&[&str]>,
        path: &str,
        query: &[(&str, &str)],
        resource: Option<&str>,
        kind: RouteKind,
    ) -> Route {
        Route::new(
            path.to_owned(),
            methods.map(|m| m.iter().map(|m| m.parse().unwrap()).collect()),
            PathPattern::parse(path).unwrap(),
            query.iter().map(|(k, v)| ((*k).to_owned(), ValuePattern::parse(v).unwrap())).collect(),
            vec![],
            resource.map(|r| ResourceTemplate::parse(r).unwrap()),
            kind,
        )
        .unwrap()
    }

    fn classify<'r>(router: &'r Router, method: &str, uri: &str) -> Result<Classified<'r>, ClassifyError> {
        router.classify(&method.parse().unwrap(), &uri.parse().unwrap(), &HeaderMap::new())
    }

    #[test]
    fn templates_capture_path_and_query() {
        let router = Router::new(vec![
            route(Some(&["GET"]), "/ping", &[], None, RouteKind::Read),
            route(None, "/db/{name}/*", &[], Some("db/{name}"), RouteKind::Write),
            route(Some(&["POST"]), "/write", &[("db", "{db}")], Some("influx/{db}"), RouteKind::Write),
        ]);
        let c = classify(&router, "PUT", "/db/orders/rows/7").unwrap();
        assert_eq!(c.resource.unwrap().as_str(), "db/orders");
        assert_eq!(c.route.path_template(), "/db/{name}/*");
        let c = classify(&router, "GET", "/db/orders").unwrap();
        assert_eq!(c.resource.unwrap().as_str(), "db/orders");
        let c = classify(&router, "POST", "/write?precision=s&db=metrics").unwrap();
        assert_eq!(c.resource.unwrap().as_str(), "influx/metrics");
        assert_eq!(classify(&router, "GET", "/ping").unwrap().route.kind(), RouteKind::Read);
        // Default deny: nothing matches, nothing is forwarded.
        assert_eq!(classify(&router, "POST", "/ping").unwrap_err(), ClassifyError::NoRoute);
        assert_eq!(classify(&router, "POST", "/write").unwrap_err(), ClassifyError::NoRoute);
    }

    #[test]
    fn ambiguous_requests_are_refused() {
        let router = Router::new(vec![route(None, "/*", &[("db", "{db}")], Some("x/{db}"), RouteKind::Write)]);
        for p in ["/ping/../write", "/./write", "/p%2E/x", "/a%2fb", "/a\\b"] {
            assert_eq!(classify(&router, "GET", p).unwrap_err(), ClassifyError::AmbiguousPath, "{p}");
        }
        assert!(matches!(classify(&router, "GET", "/q?db=a&db=b"), Err(ClassifyError::Repeated(..))));
        assert!(matches!(classify(&router, "GET", "/q?db=a%20b"), Err(ClassifyError::InvalidResource { .. })));
    }

    #[test]
    fn query_values_are_decoded_before_exact_match() {
        let router =
            Router::new(vec![route(Some(&["GET"]), "/query", &[("q", "SHOW DATABASES")], None, RouteKind::Read)]);
        assert!(classify(&router, "GET", "/query?q=SHOW+DATABASES").is_ok());
        assert!(classify(&router, "GET", "/query?q=SHOW%20DATABASES").is_ok());
        assert_eq!(classify(&router, "GET", "/query?q=DROP+DATABASE+x").unwrap_err(), ClassifyError::NoRoute);
    }

    #[test]
    fn bad_patterns_are_refused() {
        assert_eq!(PathPattern::parse("x").unwrap_err(), PatternError::NoLeadingSlash);
        assert_eq!(PathPattern::parse("/*/x").unwrap_err(), PatternError::MisplacedRest);
        assert_eq!(PathPattern::parse("/a{b}").unwrap_err(), PatternError::BadLiteral("a{b}".into()));
        assert!(matches!(ResourceTemplate::parse("/db"), Err(PatternError::InvalidTemplate { .. })));
        assert_eq!(ResourceTemplate::parse("db/{x").unwrap_err(), PatternError::UnbalancedBrace);
        let err = Route::new(
            "r".into(),
            None,
            PathPattern::parse("/db/{name}").unwrap(),
            vec![],
            vec![],
            Some(ResourceTemplate::parse("db/{other}").unwrap()),
            RouteKind::Write,
        )
        .unwrap_err();
        assert_eq!(err, PatternError::UnboundVariable("other".into()));
    }
}
