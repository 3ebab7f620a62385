//! Test support (feature `test-support`): an in-process upstream that can
//! hold requests at a gate and records the order in which writes were
//! applied (over plain HTTP or TLS), a small HTTP(S) client, and a test
//! certificate authority (rcgen). Used by the workspace's integration tests
//! and the overhead benchmark; not part of the proxy.

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_rustls::TlsAcceptor;

pub use http::{Method, StatusCode as Status};

/// What the test upstream saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamEvent {
    /// A request with this token (from `Fencing-Token`) reached the upstream.
    Arrived(Option<u64>),
    /// The upstream applied it (after its gate, if any, opened).
    Applied(Option<u64>),
}

#[derive(Default)]
struct Inner {
    events: Vec<UpstreamEvent>,
    held: HashSet<u64>,
    hanging: HashSet<u64>,
    delays: HashMap<u64, Duration>,
    answer_sizes: HashMap<u64, usize>,
    bodies: HashMap<u64, Vec<Bytes>>,
}

/// An in-process HTTP/1.1 upstream on a loopback port.
#[derive(Clone)]
pub struct TestUpstream {
    addr: SocketAddr,
    inner: Arc<Mutex<Inner>>,
    changed: Arc<Notify>,
    task: Arc<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for TestUpstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestUpstream").field("addr", &self.addr).finish_non_exhaustive()
    }
}

fn lock(m: &Mutex<Inner>) -> std::sync::MutexGuard<'_, Inner> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl TestUpstream {
    /// Starts the upstream on `127.0.0.1:0`.
    pub async fn start() -> std::io::Result<Self> {
        Self::start_with(None).await
    }

    /// Starts the upstream on `127.0.0.1:0`, speaking only TLS with
    /// `config` (e.g. [`TestPki::server_config`]). A connection whose
    /// handshake fails never reaches the recorder.
    pub async fn start_tls(config: Arc<rustls::ServerConfig>) -> std::io::Result<Self> {
        Self::start_with(Some(TlsAcceptor::from(config))).await
    }

    async fn start_with(tls: Option<TlsAcceptor>) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let inner = Arc::new(Mutex::new(Inner::default()));
        let changed = Arc::new(Notify::new());
        let (i, c) = (inner.clone(), changed.clone());
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (i, c, tls) = (i.clone(), c.clone(), tls.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| handle(i.clone(), c.clone(), req));
                    let http = hyper::server::conn::http1::Builder::new();
                    let _ = match tls {
                        None => http.serve_connection(TokioIo::new(stream), svc).await,
                        Some(tls) => match tls.accept(stream).await {
                            Ok(stream) => http.serve_connection(TokioIo::new(stream), svc).await,
                            Err(_) => return,
                        },
                    };
                });
            }
        });
        Ok(Self { addr, inner, changed, task: Arc::new(task) })
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://addr`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Requests carrying `token` wait at the gate until [`release`](Self::release).
    pub fn hold(&self, token: u64) {
        lock(&self.inner).held.insert(token);
    }

    /// Opens the gate for `token`.
    pub fn release(&self, token: u64) {
        lock(&self.inner).held.remove(&token);
        self.changed.notify_waiters();
    }

    /// Requests carrying `token` never get an answer (the upstream hangs).
    pub fn hang(&self, token: u64) {
        lock(&self.inner).hanging.insert(token);
    }

    /// Requests carrying `token` are applied only after `delay`.
    pub fn delay(&self, token: u64, delay: Duration) {
        lock(&self.inner).delays.insert(token, delay);
    }

    /// Requests carrying `token` are answered with a body of `bytes` bytes
    /// (instead of a line naming the token).
    pub fn answer_size(&self, token: u64, bytes: usize) {
        lock(&self.inner).answer_sizes.insert(token, bytes);
    }

    /// How many requests with `token` have arrived.
    pub fn arrivals(&self, token: u64) -> usize {
        lock(&self.inner).events.iter().filter(|e| **e == UpstreamEvent::Arrived(Some(token))).count()
    }

    /// Waits until `n` requests with `token` arrived; `false` after `timeout`.
    pub async fn wait_arrivals(&self, token: u64, n: usize, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.changed.notified();
            if self.arrivals(token) >= n {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.arrivals(token) >= n;
            }
        }
    }

    /// Everything seen so far, in order.
    pub fn events(&self) -> Vec<UpstreamEvent> {
        lock(&self.inner).events.clone()
    }

    /// Tokens of applied writes, in the order they were applied.
    pub fn applied(&self) -> Vec<Option<u64>> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                UpstreamEvent::Applied(t) => Some(t),
                UpstreamEvent::Arrived(_) => None,
            })
            .collect()
    }

    /// Whether a request with `token` has arrived.
    pub fn has_arrived(&self, token: u64) -> bool {
        lock(&self.inner).events.contains(&UpstreamEvent::Arrived(Some(token)))
    }

    /// Bodies received with `token`, in order.
    pub fn bodies(&self, token: u64) -> Vec<Bytes> {
        lock(&self.inner).bodies.get(&token).cloned().unwrap_or_default()
    }

    /// Waits until a request with `token` arrived; `false` after `timeout`.
    pub async fn wait_arrived(&self, token: u64, timeout: Duration) -> bool {
        self.wait_arrivals(token, 1, timeout).await
    }
}

impl Drop for TestUpstream {
    fn drop(&mut self) {
        if Arc::strong_count(&self.task) == 1 {
            self.task.abort();
        }
    }
}

fn token_of(headers: &HeaderMap) -> Option<u64> {
    headers.get("fencing-token")?.to_str().ok()?.parse().ok()
}

async fn handle(
    inner: Arc<Mutex<Inner>>,
    changed: Arc<Notify>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let token = token_of(req.headers());
    lock(&inner).events.push(UpstreamEvent::Arrived(token));
    changed.notify_waiters();
    let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    if let Some(t) = token {
        if lock(&inner).hanging.contains(&t) {
            std::future::pending::<()>().await;
        }
        let delay = lock(&inner).delays.get(&t).copied();
        if let Some(d) = delay {
            tokio::time::sleep(d).await;
        }
        loop {
            let notified = changed.notified();
            if !lock(&inner).held.contains(&t) {
                break;
            }
            notified.await;
        }
    }
    let answer = {
        let mut g = lock(&inner);
        g.events.push(UpstreamEvent::Applied(token));
        if let Some(t) = token {
            g.bodies.entry(t).or_default().push(body.clone());
        }
        match token.and_then(|t| g.answer_sizes.get(&t).copied()) {
            Some(n) => Bytes::from(vec![b'a'; n]),
            None => Bytes::from(format!("applied {token:?}\n")),
        }
    };
    changed.notify_waiters();
    Ok(Response::new(Full::new(answer)))
}

/// A response as the tests see it.
#[derive(Debug, Clone)]
pub struct TestResponse {
    /// Status.
    pub status: StatusCode,
    /// Headers.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
}

impl TestResponse {
    /// The body parsed as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// A pooled HTTP/1.1 client for tests, plain or TLS.
#[derive(Debug, Clone)]
pub struct TestClient {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    scheme: &'static str,
}

impl Default for TestClient {
    fn default() -> Self {
        Self::new()
    }
}

impl TestClient {
    /// A new plain-HTTP client.
    pub fn new() -> Self {
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(TestPki::client_config_trusting(&[], None))
            .https_or_http()
            .enable_http1()
            .build();
        Self { client: Client::builder(TokioExecutor::new()).build(connector), scheme: "http" }
    }

    /// A client that speaks only TLS with `config` (e.g.
    /// [`TestPki::client_config`]), to `https://addr`.
    pub fn with_tls(config: rustls::ClientConfig) -> Self {
        let connector = HttpsConnectorBuilder::new().with_tls_config(config).https_only().enable_http1().build();
        Self { client: Client::builder(TokioExecutor::new()).build(connector), scheme: "https" }
    }

    /// Sends one request to `http(s)://{addr}{path}`; `headers` are
    /// `(name, value)` pairs. Errors are transport errors as strings.
    pub async fn send(
        &self,
        addr: SocketAddr,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Result<TestResponse, String> {
        let mut req = Request::builder().method(method).uri(format!("{}://{addr}{path}", self.scheme));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Full::new(body.into())).map_err(|e| e.to_string())?;
        let resp = self.client.request(req).await.map_err(|e| e.to_string())?;
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok(TestResponse { status: parts.status, headers: parts.headers, body })
    }

    /// A write with a fencing token.
    pub async fn write(&self, addr: SocketAddr, path: &str, token: u64) -> Result<TestResponse, String> {
        let t = token.to_string();
        self.send(addr, Method::POST, path, &[("fencing-token", &t)], format!("value={token}")).await
    }
}

/// What a [`TestPki`] certificate is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CertUse {
    /// A TLS server (the proxy's listener, an upstream).
    Server,
    /// A TLS client (mTLS).
    Client,
}

/// A certificate and its key, as PEM files.
#[derive(Debug, Clone)]
pub struct TestCert {
    /// The PEM certificate.
    pub cert_file: PathBuf,
    /// The PEM private key (PKCS#8).
    pub key_file: PathBuf,
}

/// A test certificate authority (rcgen, ECDSA P-256): its CA certificate
/// and the certificates it issues are written as PEM files under `dir`.
pub struct TestPki {
    name: String,
    dir: PathBuf,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl std::fmt::Debug for TestPki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestPki").field("name", &self.name).field("dir", &self.dir).finish_non_exhaustive()
    }
}

impl TestPki {
    /// A new CA named `name`; writes `{dir}/{name}-ca.pem`.
    pub fn new(dir: &Path, name: &str) -> Self {
        let key = rcgen::KeyPair::generate().expect("generate a CA key");
        let mut params = rcgen::CertificateParams::default();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, format!("{name} test CA"));
        params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key).expect("self-sign the CA");
        std::fs::write(dir.join(format!("{name}-ca.pem")), cert.pem()).expect("write the CA certificate");
        Self { name: name.to_owned(), dir: dir.to_owned(), issuer: rcgen::Issuer::new(params, key) }
    }

    /// The CA certificate's PEM file.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join(format!("{}-ca.pem", self.name))
    }

    /// Issues a certificate with common name `cn` and the given subject
    /// alternative names (IP addresses or DNS names); writes
    /// `{dir}/{cn}.pem` and `{dir}/{cn}.key`.
    pub fn issue(&self, cn: &str, sans: &[&str], usage: CertUse) -> TestCert {
        let key = rcgen::KeyPair::generate().expect("generate a key");
        let mut params = rcgen::CertificateParams::new(sans.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
            .expect("valid SANs");
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        params.extended_key_usages = vec![match usage {
            CertUse::Server => rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            CertUse::Client => rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        }];
        let cert = params.signed_by(&key, &self.issuer).expect("issue a certificate");
        let cert_file = self.dir.join(format!("{cn}.pem"));
        let key_file = self.dir.join(format!("{cn}.key"));
        std::fs::write(&cert_file, cert.pem()).expect("write the certificate");
        std::fs::write(&key_file, key.serialize_pem()).expect("write the key");
        TestCert { cert_file, key_file }
    }

    fn client_config_trusting(cas: &[PathBuf], client: Option<&TestCert>) -> rustls::ClientConfig {
        let mut roots = rustls::RootCertStore::empty();
        for ca in cas {
            for cert in crate::core::tls::load_certs(ca).expect("read a CA") {
                roots.add(cert).expect("a CA certificate");
            }
        }
        let builder = rustls::ClientConfig::builder_with_provider(crate::core::tls::provider())
            .with_safe_default_protocol_versions()
            .expect("default versions")
            .with_root_certificates(roots);
        match client {
            None => builder.with_no_client_auth(),
            Some(c) => builder
                .with_client_auth_cert(
                    crate::core::tls::load_certs(&c.cert_file).expect("read a certificate"),
                    crate::core::tls::load_key(&c.key_file).expect("read a key"),
                )
                .expect("a client certificate"),
        }
    }

    /// A client config that trusts this CA and presents `client`, if any.
    pub fn client_config(&self, client: Option<&TestCert>) -> rustls::ClientConfig {
        Self::client_config_trusting(&[self.ca_file()], client)
    }

    /// A server config presenting `server`; when `client_ca` is given,
    /// clients must present a certificate it issued.
    pub fn server_config(&self, server: &TestCert, client_ca: Option<&TestPki>) -> Arc<rustls::ServerConfig> {
        crate::core::tls::server_config(
            &crate::config::ListenerTls {
                cert_file: server.cert_file.clone(),
                key_file: server.key_file.clone(),
                client_ca_file: client_ca.map(TestPki::ca_file),
            },
            &[b"h2", b"http/1.1"],
        )
        .expect("a server config")
    }
}
