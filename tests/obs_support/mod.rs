//! Helpers of the observability tests: a coordinator node and a proxy in
//! one process (the proxy in front of a test upstream), both scraped over
//! HTTP, and a small parser of the Prometheus text exposition.

#![allow(dead_code, unreachable_pub, missing_docs)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use fencer_coordinator::{Node, NodeConfig};
use fencer_proxy::ProxyConfig;
use fencer_proxy::ProxyHandle;
use fencer_proxy::testing::{Method, TestClient, TestUpstream};

/// The resource the proxy protects (every write goes to `/write`).
pub const PROXY_RESOURCE: &str = "db/main";

/// A node with fast timings (election 150–300 ms: the shortest ttl is
/// 500 ms) and a proxy in front of a test upstream.
pub struct Stack {
    pub node: Node,
    pub proxy: ProxyHandle,
    pub upstream: TestUpstream,
    pub http: TestClient,
    _dirs: (tempfile::TempDir, tempfile::TempDir),
}

impl Stack {
    pub async fn start() -> Self {
        let node_dir = tempfile::tempdir().unwrap();
        let mut config = NodeConfig::single(node_dir.path(), "127.0.0.1:0".parse::<SocketAddr>().unwrap());
        config.heartbeat = Duration::from_millis(50);
        config.election_timeout = (Duration::from_millis(150), Duration::from_millis(300));
        let node = Node::start(config).await.expect("node starts");
        node.wait_for_leader(Duration::from_secs(10)).await.expect("leader elected");
        for _ in 0..500 {
            if node.service().health().ready {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Its signing key registered (an audited entry), so tests measure
        // from a quiet node.
        for _ in 0..500 {
            if !node.state().signing_keys().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let upstream = TestUpstream::start().await.unwrap();
        let proxy_dir = tempfile::tempdir().unwrap();
        let text = format!(
            r#"
listen = "127.0.0.1:0"
admin = "127.0.0.1:0"
upstream = "{up}"
data_dir = "{data}"

[[route]]
methods = ["GET"]
path = "/ping"
kind = "read"

[[route]]
path = "/write"
resource = "{PROXY_RESOURCE}"
"#,
            up = upstream.url(),
            data = proxy_dir.path().display(),
        );
        let proxy = fencer_proxy::start(ProxyConfig::from_toml_str(&text).unwrap(), Some(1)).await.unwrap();
        Self { node, proxy, upstream, http: TestClient::new(), _dirs: (node_dir, proxy_dir) }
    }

    async fn scrape(&self, addr: SocketAddr) -> Exposition {
        let r = self.http.send(addr, Method::GET, "/metrics", &[], "").await.expect("scrape");
        assert!(r.status.is_success(), "{addr}/metrics answered {}", r.status);
        Exposition::parse(&String::from_utf8_lossy(&r.body))
    }

    /// The coordinator's `/metrics`.
    pub async fn scrape_node(&self) -> Exposition {
        self.scrape(self.node.local_addr()).await
    }

    /// The proxy's `/metrics` (admin port).
    pub async fn scrape_proxy(&self) -> Exposition {
        self.scrape(self.proxy.admin_addr()).await
    }

    pub async fn stop(self) {
        self.proxy.shutdown().await;
        self.node.shutdown().await;
    }
}

/// One scrape: every sample by its series (`name{labels}` exactly as
/// exposed), the family of every `# TYPE` line, and the label pairs seen
/// per sample name.
#[derive(Debug, Clone)]
pub struct Exposition {
    pub text: String,
    pub samples: BTreeMap<String, f64>,
    pub families: BTreeMap<String, String>,
    pub labels: BTreeMap<String, BTreeSet<(String, String)>>,
}

impl Exposition {
    pub fn parse(text: &str) -> Self {
        let mut samples = BTreeMap::new();
        let mut families = BTreeMap::new();
        let mut labels: BTreeMap<String, BTreeSet<(String, String)>> = BTreeMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut parts = rest.split_whitespace();
                if let (Some(name), Some(kind)) = (parts.next(), parts.next()) {
                    families.insert(name.to_string(), kind.to_string());
                }
                continue;
            }
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let Some((series, value)) = line.rsplit_once(' ') else { continue };
            let Ok(value) = value.trim().parse::<f64>() else { continue };
            let name = series.split('{').next().unwrap_or(series).to_string();
            if let Some(set) = series.strip_prefix(name.as_str()).and_then(|s| s.strip_prefix('{')) {
                for pair in set.trim_end_matches('}').split(',').filter(|p| !p.is_empty()) {
                    if let Some((k, v)) = pair.split_once('=') {
                        labels
                            .entry(name.clone())
                            .or_default()
                            .insert((k.to_string(), v.trim_matches('"').to_string()));
                    }
                }
            }
            labels.entry(name).or_default();
            samples.insert(series.to_string(), value);
        }
        Self { text: text.to_string(), samples, families, labels }
    }

    /// The value of one series; panics (showing the scrape) when it does not exist.
    pub fn get(&self, series: &str) -> f64 {
        *self.samples.get(series).unwrap_or_else(|| panic!("{series} is not exposed:\n{}", self.text))
    }

    /// Every sample name exposed (`fencer_requests_total`, `…_bucket`, …).
    pub fn names(&self) -> BTreeSet<&str> {
        self.labels.keys().map(String::as_str).collect()
    }
}
