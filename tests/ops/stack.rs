//! The fixture of the observability tests: a coordinator node and a proxy
//! in one process (the proxy in front of a test upstream), both scraped
//! over HTTP with the kit's exposition parser.

use std::net::SocketAddr;

use fencer_coordinator::Node;
use fencer_proxy::ProxyHandle;
use fencer_proxy::testing::{Method, TestClient, TestUpstream};
use fencer_testkit::ProxyConfigBuilder;
use fencer_testkit::metrics::Exposition;

/// The resource the proxy protects (every write goes to `/write`).
pub(crate) const PROXY_RESOURCE: &str = "db/main";

/// A ready node with the kit's fast timings (the shortest ttl is 500 ms)
/// and a proxy in front of a test upstream.
pub(crate) struct Stack {
    pub(crate) node: Node,
    pub(crate) proxy: ProxyHandle,
    pub(crate) http: TestClient,
    _upstream: TestUpstream,
    _dirs: (tempfile::TempDir, tempfile::TempDir),
}

impl Stack {
    pub(crate) async fn start() -> Self {
        let node_dir = tempfile::tempdir().unwrap();
        // Ready with its signing key registered (an audited entry), so
        // tests measure from a quiet node.
        let node = fencer_testkit::node::start(node_dir.path()).await;
        let upstream = TestUpstream::start().await.unwrap();
        let proxy_dir = tempfile::tempdir().unwrap();
        let config = ProxyConfigBuilder::new(&upstream.url(), proxy_dir.path())
            .read(&["GET"], "/ping")
            .write(&[], "/write", PROXY_RESOURCE)
            .build();
        let proxy = fencer_proxy::start(config, Some(1)).await.unwrap();
        Self { node, proxy, _upstream: upstream, http: TestClient::new(), _dirs: (node_dir, proxy_dir) }
    }

    async fn scrape(&self, addr: SocketAddr) -> Exposition {
        let r = self.http.send(addr, Method::GET, "/metrics", &[], "").await.expect("scrape");
        assert!(r.status.is_success(), "{addr}/metrics answered {}", r.status);
        Exposition::parse(&String::from_utf8_lossy(&r.body))
    }

    /// The coordinator's `/metrics`.
    pub(crate) async fn scrape_node(&self) -> Exposition {
        self.scrape(self.node.local_addr()).await
    }

    /// The proxy's `/metrics` (admin port).
    pub(crate) async fn scrape_proxy(&self) -> Exposition {
        self.scrape(self.proxy.admin_addr()).await
    }

    pub(crate) async fn stop(self) {
        self.proxy.shutdown().await;
        self.node.shutdown().await;
    }
}
