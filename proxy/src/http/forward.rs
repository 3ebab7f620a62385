//! Forwarding to the upstream: a pooled HTTP/1.1 client (plain or TLS),
//! timeouts on every call, bodies streamed both ways, and the distinction P4
//! needs between "nothing was sent" (connect or TLS handshake failed: 502,
//! safe) and "bytes went upstream, then timeout or reset" (outcome unknown:
//! 504, never retried).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderMap, HeaderName, Request, Response, Uri, header};
use hyper::body::Incoming;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_rustls::{FixedServerNameResolver, HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{CaptureConnection, Connected, Connection, HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio::sync::watch;

use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::ServerName;

use crate::config::ProxyConfig;
use crate::core::admin::UpstreamProbe;
use crate::core::clock;
use crate::core::state::Settled;
use crate::core::tls::{TlsError, config_err, load_certs, load_key, provider, roots};
use crate::http::body::{BodyFailure, BoxError, ClientBodyTimeout, IdleTimeoutBody, ProxyBody};
use crate::http::config::{HttpConfig, UpstreamTls};

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

    /// The close, as the core's "nothing more can land" future.
    pub(crate) fn settled(self) -> Settled {
        Box::pin(self.wait())
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

/// Bounds the whole connect, TCP and TLS handshake together, by
/// `timeouts.connect`; an overrun is a connect error (nothing was sent).
#[derive(Clone)]
pub(crate) struct ConnectTimeout<C> {
    inner: C,
    timeout: Duration,
}

impl<C> tower::Service<Uri> for ConnectTimeout<C>
where
    C: tower::Service<Uri>,
    C::Future: Send + 'static,
    C::Error: Into<BoxError>,
{
    type Response = C::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<C::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.inner.call(uri);
        let timeout = self.timeout;
        Box::pin(async move {
            match tokio::time::timeout(timeout, connecting).await {
                Ok(result) => result.map_err(Into::into),
                Err(_) => Err(format!("connecting (TCP and any TLS handshake) took longer than {timeout:?}").into()),
            }
        })
    }
}

/// The upstream connector: connect timeout around TLS (for `https://`)
/// around TCP, whose stream reports when it closes.
type UpstreamConnector = ConnectTimeout<HttpsConnector<TrackingConnector>>;

/// How an upstream call failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ForwardError {
    /// Connecting failed or timed out; no byte of the request was sent.
    #[error("cannot connect to the upstream: {0}")]
    Connect(String),
    /// The request may have reached the upstream (P4).
    #[error("outcome unknown: {reason}")]
    OutcomeUnknown {
        /// What happened.
        reason: String,
        /// Whether the client's body failed (too large, too slow), rather
        /// than the upstream.
        body: Option<BodyFailure>,
    },
}

/// The request body sent upstream: the client's body, streamed, with the
/// size limit and the idle timeout.
type UpstreamRequestBody = ProxyBody;

/// The forwarding service at the bottom of the stack.
#[derive(Clone)]
pub struct Forward {
    client: Client<UpstreamConnector, UpstreamRequestBody>,
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
    /// Builds the pooled client from the config's upstream, TLS, timeouts
    /// and limits. Fails when the upstream TLS files cannot be used.
    pub(crate) fn new(config: &ProxyConfig, http_config: &HttpConfig) -> Result<Self, TlsError> {
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(config.timeouts.connect));
        http.set_nodelay(true);
        // The scheme is checked below: https needs `upstream_tls`, and then
        // the TLS layer, not this connector, owns the https scheme.
        http.enforce_http(false);
        let tracking = TrackingConnector { http };
        let https = match &http_config.upstream_tls {
            // Plain upstream: the TLS layer passes http:// through.
            None => HttpsConnectorBuilder::new()
                .with_tls_config(client_config_without_roots())
                .https_or_http()
                .enable_http1()
                .wrap_connector(tracking),
            // TLS upstream: never plaintext, whatever the URI says.
            Some(upstream_tls) => {
                let builder = HttpsConnectorBuilder::new().with_tls_config(client_config(upstream_tls)?).https_only();
                let builder = match &upstream_tls.server_name {
                    Some(name) => builder.with_server_name_resolver(FixedServerNameResolver::new(
                        parse_server_name(name)
                            .map_err(|reason| TlsError::Config { what: "upstream_tls.server_name", reason })?,
                    )),
                    None => builder,
                };
                builder.enable_http1().wrap_connector(tracking)
            }
        };
        let connector = ConnectTimeout { inner: https, timeout: config.timeouts.connect };
        let client = Client::builder(TokioExecutor::new())
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(config.limits.upstream_max_idle_connections)
            .build(connector);
        Ok(Self {
            client,
            upstream: http_config.upstream.clone(),
            response_timeout: config.timeouts.response,
            body_idle: config.timeouts.body_idle,
            max_body: config.limits.max_request_body_bytes,
        })
    }

    /// The upstream, `http://host:port/` or `https://host:port/`.
    pub fn upstream(&self) -> &Uri {
        &self.upstream
    }

    /// Forwards one request; resolves at the upstream's response headers.
    /// The response body streams afterwards, with the idle timeout.
    /// The request body comes prepared by the fence: size-limited, with the
    /// client's timeouts, read ahead ([`crate::http::body`]).
    pub(crate) async fn call(
        &self,
        req: Request<ProxyBody>,
    ) -> Result<(Response<IdleTimeoutBody<Incoming>>, Duration), ForwardError> {
        let (mut parts, body) = req.into_parts();
        let path_and_query = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let mut uri = self.upstream.clone().into_parts();
        uri.path_and_query = Some(path_and_query.parse().map_err(|e| ForwardError::Connect(format!("bad path: {e}")))?);
        parts.uri = Uri::from_parts(uri).map_err(|e| ForwardError::Connect(format!("bad uri: {e}")))?;
        strip_hop_by_hop(&mut parts.headers);
        parts.headers.remove(header::HOST);
        parts.version = http::Version::HTTP_11;
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
            Ok(Err(e)) if e.is_connect() || refused_in_handshake(&e) => Err(ForwardError::Connect(error_chain(&e))),
            Ok(Err(e)) => {
                let body = BodyFailure::of(&e);
                let reason = match body {
                    Some(BodyFailure::TooLarge) => format!(
                        "the request body grew past limits.max_request_body_bytes ({} bytes) while it was being forwarded, so the upstream saw it cut",
                        self.max_body
                    ),
                    Some(BodyFailure::TooSlow) => format!("{}, so the upstream saw it cut", client_body_error(&e)),
                    None => error_chain(&e),
                };
                Err(ForwardError::OutcomeUnknown { reason, body })
            }
            Err(_) => Err(ForwardError::OutcomeUnknown {
                reason: format!("no response headers within {:?}", self.response_timeout),
                body: None,
            }),
        }
    }

    /// A connection-level readiness probe: can we open a TCP connection?
    async fn probe_connect(&self, timeout: Duration) -> Result<(), String> {
        let authority = self.upstream.authority().map(|a| a.to_string()).unwrap_or_default();
        let addr = if authority.contains(':') { authority } else { format!("{authority}:80") };
        match tokio::time::timeout(timeout, TcpStream::connect(&addr)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(format!("cannot connect to {addr}: {e}")),
            Err(_) => Err(format!("connecting to {addr} took longer than {timeout:?}")),
        }
    }
}

impl UpstreamProbe for Forward {
    fn probe(&self, timeout: Duration) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + '_>> {
        Box::pin(self.probe_connect(timeout))
    }
}

/// Whether the upstream's TLS server refused the handshake with an alert
/// about the proxy's certificate. With TLS 1.3 the client finishes its side
/// of the handshake and sends the request before the server's verdict
/// arrives, so hyper reports this after the request "was sent"; but a
/// server that refused the handshake never read any application data, so
/// nothing was applied: a plain 502, not an unknown outcome (P4).
fn refused_in_handshake(e: &(dyn std::error::Error + 'static)) -> bool {
    use rustls::AlertDescription as A;
    let mut next = Some(e);
    while let Some(err) = next {
        // io::Error::source skips the error it wraps, so look inside too.
        let inner = err
            .downcast_ref::<io::Error>()
            .and_then(|io| io.get_ref())
            .map(|i| i as &(dyn std::error::Error + 'static));
        for candidate in [Some(err), inner].into_iter().flatten() {
            if let Some(rustls::Error::AlertReceived(
                A::CertificateRequired
                | A::BadCertificate
                | A::UnsupportedCertificate
                | A::CertificateRevoked
                | A::CertificateExpired
                | A::CertificateUnknown
                | A::UnknownCA
                | A::AccessDenied
                | A::HandshakeFailure,
            )) = candidate.downcast_ref::<rustls::Error>()
            {
                return true;
            }
        }
        next = err.source();
    }
    false
}

/// The [`ClientBodyTimeout`] in `e`'s source chain, as text.
fn client_body_error(e: &(dyn std::error::Error + 'static)) -> String {
    let mut next = Some(e);
    while let Some(err) = next {
        if let Some(t) = err.downcast_ref::<ClientBodyTimeout>() {
            return t.to_string();
        }
        next = err.source();
    }
    error_chain(e)
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

/// The upstream client's config: the server must chain to `ca_file`; the
/// proxy presents `cert_file`/`key_file` when set (mTLS to the upstream).
/// ALPN is left to the HTTP connector.
pub(crate) fn client_config(tls: &UpstreamTls) -> Result<ClientConfig, TlsError> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(config_err("upstream TLS"))?
        .with_root_certificates(roots(&tls.ca_file)?);
    match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => builder
            .with_client_auth_cert(load_certs(cert)?, load_key(key)?)
            .map_err(config_err("upstream client certificate and key")),
        _ => Ok(builder.with_no_client_auth()),
    }
}

/// A client config that trusts no server: for a plain `http://` upstream,
/// whose connector never starts TLS, so it is never used.
pub(crate) fn client_config_without_roots() -> ClientConfig {
    ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("the ring provider supports the default protocol versions")
        .with_root_certificates(RootCertStore::empty())
        .with_no_client_auth()
}

/// Checks a configured upstream server name.
pub(crate) fn parse_server_name(name: &str) -> Result<ServerName<'static>, String> {
    ServerName::try_from(name.to_owned())
        .map_err(|e| format!("server_name {name:?} is not a DNS name or IP address: {e}"))
}
