//! Forwarding to the upstream: a pooled HTTP/1.1 client, timeouts on every
//! call, bodies streamed both ways, and the distinction P4 needs between
//! "nothing was sent" (connect failed: 502, safe) and "bytes went upstream,
//! then timeout or reset" (outcome unknown: 504, never retried).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderMap, HeaderName, Request, Response, Uri, header};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{CaptureConnection, Connected, Connection, HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::body::{BoxError, IdleTimeoutBody, ProxyBody};
use crate::clock;
use crate::config::ProxyConfig;

/// The connection a request went out on, once hyper has picked one.
pub(crate) fn captured_connection(capture: &CaptureConnection) -> Option<ConnectionClosed> {
    let meta = capture.connection_metadata();
    let mut ext = http::Extensions::new();
    if let Some(c) = meta.as_ref() {
        c.get_extras(&mut ext);
    }
    ext.remove::<ConnectionClosed>()
}

/// Resolves when the upstream connection that carried a request has closed
/// (P4: the quarantine starts only then).
#[derive(Debug, Clone)]
pub(crate) struct ConnectionClosed(watch::Receiver<()>);

impl ConnectionClosed {
    /// Waits for the connection to close.
    pub(crate) async fn wait(mut self) {
        // The sender lives inside the connection's I/O object; `changed`
        // fails exactly when it is dropped, i.e. when the socket is closed.
        while self.0.changed().await.is_ok() {}
    }
}

/// A TCP stream that signals [`ConnectionClosed`] when it is dropped.
pub(crate) struct TrackedStream {
    inner: TokioIo<TcpStream>,
    /// Dropped with the stream, which wakes every `ConnectionClosed::wait`.
    _closed_tx: watch::Sender<()>,
    closed_rx: watch::Receiver<()>,
}

impl Connection for TrackedStream {
    fn connected(&self) -> Connected {
        self.inner.inner().connected().extra(ConnectionClosed(self.closed_rx.clone()))
    }
}

impl Read for TrackedStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: ReadBufCursor<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl Write for TrackedStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
}

/// Connector that wraps hyper-util's `HttpConnector` streams in
/// [`TrackedStream`].
#[derive(Clone)]
pub(crate) struct TrackingConnector {
    http: HttpConnector,
}

impl tower::Service<Uri> for TrackingConnector {
    type Response = TrackedStream;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<TrackedStream, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.http.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.http.call(uri);
        Box::pin(async move {
            let io = connecting.await?;
            let (closed_tx, closed_rx) = watch::channel(());
            Ok(TrackedStream { inner: io, _closed_tx: closed_tx, closed_rx })
        })
    }
}

/// How an upstream call failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ForwardError {
    /// Connecting failed or timed out; no byte of the request was sent.
    #[error("cannot connect to the upstream: {0}")]
    Connect(String),
    /// The request may have reached the upstream (P4).
    #[error("outcome unknown: {0}")]
    OutcomeUnknown(String),
}

/// The request body sent upstream: the client's body, streamed, with the
/// size limit and the idle timeout.
type UpstreamRequestBody = ProxyBody;

/// The forwarding service at the bottom of the stack.
#[derive(Clone)]
pub struct Forward {
    client: Client<TrackingConnector, UpstreamRequestBody>,
    upstream: Uri,
    response_timeout: Duration,
    body_idle: Duration,
    max_body: u64,
}

impl std::fmt::Debug for Forward {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forward").field("upstream", &self.upstream).finish_non_exhaustive()
    }
}

/// Hop-by-hop headers (RFC 9110 §7.6.1) never cross the proxy.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
];

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in HOP_BY_HOP.iter().chain(listed.iter()) {
        headers.remove(name);
    }
    // hyper frames the body itself.
    headers.remove(header::TRANSFER_ENCODING);
}

impl Forward {
    /// Builds the pooled client from the config's upstream, timeouts and
    /// limits.
    pub fn new(config: &ProxyConfig) -> Self {
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(config.timeouts.connect));
        http.set_nodelay(true);
        http.enforce_http(true);
        let client = Client::builder(TokioExecutor::new())
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(config.limits.upstream_max_idle_connections)
            .build(TrackingConnector { http });
        Self {
            client,
            upstream: config.upstream.clone(),
            response_timeout: config.timeouts.response,
            body_idle: config.timeouts.body_idle,
            max_body: config.limits.max_request_body_bytes,
        }
    }

    /// The upstream, `http://host:port/`.
    pub fn upstream(&self) -> &Uri {
        &self.upstream
    }

    /// Forwards one request; resolves at the upstream's response headers.
    /// The response body streams afterwards, with the idle timeout.
    pub(crate) async fn call(
        &self,
        req: Request<Incoming>,
    ) -> Result<(Response<IdleTimeoutBody<Incoming>>, Duration), ForwardError> {
        let (mut parts, body) = req.into_parts();
        let path_and_query = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let mut uri = self.upstream.clone().into_parts();
        uri.path_and_query = Some(path_and_query.parse().map_err(|e| ForwardError::Connect(format!("bad path: {e}")))?);
        parts.uri = Uri::from_parts(uri).map_err(|e| ForwardError::Connect(format!("bad uri: {e}")))?;
        strip_hop_by_hop(&mut parts.headers);
        parts.headers.remove(header::HOST);
        parts.version = http::Version::HTTP_11;
        let max = usize::try_from(self.max_body).unwrap_or(usize::MAX);
        let body = IdleTimeoutBody::new(Limited::new(body, max), self.body_idle).boxed();
        // Extensions survive `into_parts`/`from_parts`, so a connection
        // capture the fence installed still sees this request's connection.
        let req = Request::from_parts(parts, body);

        let started = clock::now();
        let outcome = tokio::time::timeout(self.response_timeout, self.client.request(req)).await;
        let elapsed = clock::now() - started;
        match outcome {
            Ok(Ok(resp)) => {
                let (mut parts, body) = resp.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                Ok((Response::from_parts(parts, IdleTimeoutBody::new(body, self.body_idle)), elapsed))
            }
            Ok(Err(e)) if e.is_connect() => Err(ForwardError::Connect(error_chain(&e))),
            Ok(Err(e)) => Err(ForwardError::OutcomeUnknown(error_chain(&e))),
            Err(_) => {
                Err(ForwardError::OutcomeUnknown(format!("no response headers within {:?}", self.response_timeout)))
            }
        }
    }

    /// A connection-level readiness probe: can we open a TCP connection?
    pub(crate) async fn probe(&self, timeout: Duration) -> Result<(), String> {
        let authority = self.upstream.authority().map(|a| a.to_string()).unwrap_or_default();
        let addr = if authority.contains(':') { authority } else { format!("{authority}:80") };
        match tokio::time::timeout(timeout, TcpStream::connect(&addr)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(format!("cannot connect to {addr}: {e}")),
            Err(_) => Err(format!("connecting to {addr} took longer than {timeout:?}")),
        }
    }
}

fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}
