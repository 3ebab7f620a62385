//! The proxy's TOML configuration, built: listen and admin addresses, the
//! upstream, the data dir, routes, and any further table, in the order the
//! file format wants (top-level keys, tables, then `[[route]]`). Tests that
//! check the parser itself write their TOML by hand instead.
//!
//! ```
//! let text = fencer_testkit::ProxyConfigBuilder::new("http://127.0.0.1:9", "/tmp/proxy")
//!     .read(&["GET"], "/ping")
//!     .write(&[], "/write", "db/main")
//!     .table("timeouts", "quarantine = \"1s\"")
//!     .toml();
//! let config = fencer_proxy::ProxyConfig::from_toml_str(&text).unwrap();
//! assert_eq!(config.data_dir, std::path::Path::new("/tmp/proxy"));
//! ```

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use fencer_proxy::ProxyConfig;

#[derive(Debug, Clone)]
struct Route {
    methods: Vec<String>,
    path: String,
    query: Option<(String, String)>,
    /// `None`: a read route.
    resource: Option<String>,
}

/// A proxy configuration under construction; see the module docs.
#[derive(Debug, Clone)]
pub struct ProxyConfigBuilder {
    listen: String,
    admin: String,
    upstream: String,
    data_dir: PathBuf,
    top: Vec<String>,
    tables: Vec<(String, String)>,
    raw: Vec<String>,
    routes: Vec<Route>,
}

impl ProxyConfigBuilder {
    /// A proxy in front of `upstream` (`http://…` or `https://…`) keeping its
    /// store in `data_dir`, listening and serving its admin API on ports the
    /// OS picks (`127.0.0.1:0`), with no routes yet.
    pub fn new(upstream: &str, data_dir: impl AsRef<Path>) -> Self {
        Self {
            listen: "127.0.0.1:0".into(),
            admin: "127.0.0.1:0".into(),
            upstream: upstream.into(),
            data_dir: data_dir.as_ref().to_path_buf(),
            top: Vec::new(),
            tables: Vec::new(),
            raw: Vec::new(),
            routes: Vec::new(),
        }
    }

    /// Where clients connect.
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = addr.to_string();
        self
    }

    /// Where the admin API listens.
    pub fn admin(mut self, addr: SocketAddr) -> Self {
        self.admin = addr.to_string();
        self
    }

    /// A top-level setting, one TOML line (`max_epoch_jump = 1000`).
    pub fn setting(mut self, line: &str) -> Self {
        self.top.push(line.into());
        self
    }

    /// A table `[name]` with `body` (TOML lines). Tables of the same name
    /// are merged into one.
    pub fn table(mut self, name: &str, body: &str) -> Self {
        match self.tables.iter_mut().find(|(n, _)| n == name) {
            Some((_, b)) => {
                b.push('\n');
                b.push_str(body);
            }
            None => self.tables.push((name.into(), body.into())),
        }
        self
    }

    /// Tables written out whole (`[tls]\ncert_file = …`), after the
    /// tables of [`table`](Self::table) and before the routes.
    pub fn raw(mut self, tables: &str) -> Self {
        self.raw.push(tables.into());
        self
    }

    /// A read route (no token): `methods` (empty: any) on `path`.
    pub fn read(self, methods: &[&str], path: &str) -> Self {
        self.route(methods, path, None, None)
    }

    /// A read route that also needs query parameter `key = value`.
    pub fn read_if(self, methods: &[&str], path: &str, query: (&str, &str)) -> Self {
        self.route(methods, path, Some(query), None)
    }

    /// A write route: `methods` (empty: any) on `path` write `resource`
    /// (which may name path or query captures, `db/{name}`).
    pub fn write(self, methods: &[&str], path: &str, resource: &str) -> Self {
        self.route(methods, path, None, Some(resource))
    }

    /// A write route that matches query parameter `key = value` (a value
    /// `{capture}` captures it).
    pub fn write_if(self, methods: &[&str], path: &str, query: (&str, &str), resource: &str) -> Self {
        self.route(methods, path, Some(query), Some(resource))
    }

    fn route(mut self, methods: &[&str], path: &str, query: Option<(&str, &str)>, resource: Option<&str>) -> Self {
        self.routes.push(Route {
            methods: methods.iter().map(|m| m.to_string()).collect(),
            path: path.into(),
            query: query.map(|(k, v)| (k.into(), v.into())),
            resource: resource.map(Into::into),
        });
        self
    }

    /// The TOML text.
    pub fn toml(&self) -> String {
        let mut t = String::new();
        let _ = writeln!(t, "listen = {:?}", self.listen);
        let _ = writeln!(t, "admin = {:?}", self.admin);
        let _ = writeln!(t, "upstream = {:?}", self.upstream);
        let _ = writeln!(t, "data_dir = {:?}", self.data_dir.display().to_string());
        for line in &self.top {
            let _ = writeln!(t, "{line}");
        }
        for (name, body) in &self.tables {
            let _ = writeln!(t, "\n[{name}]\n{body}");
        }
        for tables in &self.raw {
            let _ = writeln!(t, "\n{tables}");
        }
        for r in &self.routes {
            t.push_str("\n[[route]]\n");
            if !r.methods.is_empty() {
                let _ = writeln!(t, "methods = {:?}", r.methods);
            }
            let _ = writeln!(t, "path = {:?}", r.path);
            if let Some((k, v)) = &r.query {
                let _ = writeln!(t, "query = {{ {k} = {v:?} }}");
            }
            match &r.resource {
                Some(resource) => {
                    let _ = writeln!(t, "resource = {resource:?}");
                }
                None => t.push_str("kind = \"read\"\n"),
            }
        }
        t
    }

    /// The parsed configuration; panics with the text when it does not parse.
    pub fn build(&self) -> ProxyConfig {
        let text = self.toml();
        ProxyConfig::from_toml_str(&text).unwrap_or_else(|e| panic!("the built config does not parse: {e}\n{text}"))
    }

    /// Writes the TOML to `path` (for `fencer proxy --config`) and returns it.
    pub fn write_to(&self, path: &Path) -> PathBuf {
        std::fs::write(path, self.toml()).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        path.to_path_buf()
    }
}
