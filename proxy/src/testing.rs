//! Test support (feature `test-support`): an in-process upstream that can
//! hold requests at a gate and records the order in which writes were
//! applied, and a small HTTP client. Used by the workspace's integration
//! tests and the overhead benchmark; not part of the proxy.

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::Notify;

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
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let inner = Arc::new(Mutex::new(Inner::default()));
        let changed = Arc::new(Notify::new());
        let (i, c) = (inner.clone(), changed.clone());
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (i, c) = (i.clone(), c.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| handle(i.clone(), c.clone(), req));
                    let _ =
                        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
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
    {
        let mut g = lock(&inner);
        g.events.push(UpstreamEvent::Applied(token));
        if let Some(t) = token {
            g.bodies.entry(t).or_default().push(body.clone());
        }
    }
    changed.notify_waiters();
    Ok(Response::new(Full::new(Bytes::from(format!("applied {token:?}\n")))))
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

/// A pooled HTTP/1.1 client for tests.
#[derive(Debug, Clone)]
pub struct TestClient {
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Default for TestClient {
    fn default() -> Self {
        Self::new()
    }
}

impl TestClient {
    /// A new client.
    pub fn new() -> Self {
        Self { client: Client::builder(TokioExecutor::new()).build_http() }
    }

    /// Sends one request to `http://{addr}{path}`; `headers` are
    /// `(name, value)` pairs. Errors are transport errors as strings.
    pub async fn send(
        &self,
        addr: SocketAddr,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Result<TestResponse, String> {
        let mut req = Request::builder().method(method).uri(format!("http://{addr}{path}"));
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
