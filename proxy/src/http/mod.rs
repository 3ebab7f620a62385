//! The HTTP front end (DESIGN §4): HTTP/1.1 and HTTP/2 clients, an HTTP/1.1
//! upstream, routes classified by configuration (P5, P6), the token in a
//! header, refusals as `application/problem+json`.
//!
//! - `config`: the upstream URL and TLS, headers, routes, the flag form.
//! - `routes`: route classification: read allow-list (P5), resource (P6).
//! - `fence`: the tower layer in front of `forward` (P1–P6, P8 through the
//!   core fence).
//! - `forward`: the pooled upstream client (plain or TLS) and its timeouts.
//! - `body`: streaming body wrappers (the client's body limit and timeouts,
//!   read-ahead, idle timeout, guard until the end).
//! - `conn`: the connection timeouts hyper does not enforce (head, idle,
//!   a client that stops reading).
//! - `problem`: the one place refusals become HTTP statuses.
//!
//! This module serves one connection: TLS (when configured), then hyper
//! with the layer stack below.

pub(crate) mod body;
pub(crate) mod config;
pub(crate) mod conn;
pub(crate) mod fence;
pub(crate) mod forward;
pub(crate) mod problem;
pub(crate) mod routes;

use std::convert::Infallible;
use std::sync::Arc;

use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio_rustls::TlsAcceptor;
use tower::{ServiceBuilder, ServiceExt};

pub use self::config::{HttpConfig, SimpleConfig, UpstreamTls};

use self::body::{BoxError, GuardedBody, ProxyBody};
use self::conn::{ConnTimeouts, ConnWatch, Watched};
use self::fence::{ClientIdentity, FenceLayer, PeerAddr};
use self::forward::Forward;
use self::problem::respond_to_layer_error;
use crate::config::ProxyConfig;
use crate::core::fence::FenceCore;
use crate::core::listener::Accepted;
use crate::core::metrics::TimeoutStage;
use crate::core::tls::{self, TlsError};

/// Written to a client beyond `limits.max_connections`.
pub(crate) const CONNECTION_LIMIT_REFUSAL: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
content-type: application/problem+json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: 183\r\n\r\n\
{\"type\":\"urn:fencer:proxy:too-many-connections\",\"title\":\"The proxy is at its connection limit\",\"status\":503,\"detail\":\"limits.max_connections client connections are open\"}";

/// Everything one HTTP connection needs, built once at start.
#[derive(Clone)]
pub(crate) struct HttpServer {
    core: Arc<FenceCore>,
    stack: tower::util::BoxCloneSyncService<Request<Incoming>, Response<ProxyBody>, BoxError>,
    builder: auto::Builder<TokioExecutor>,
    tls: Option<TlsAcceptor>,
    tls_handshake: std::time::Duration,
    timeouts: ConnTimeouts,
}

impl HttpServer {
    /// The upstream client and, with `[tls]`, the listener's TLS config:
    /// built (and their files loaded) before anything else starts.
    pub(crate) fn prepare(config: &ProxyConfig, http: &HttpConfig) -> Result<(Forward, Option<TlsAcceptor>), TlsError> {
        let forward = Forward::new(config, http)?;
        let alpn: &[&[u8]] = &[b"h2", b"http/1.1"];
        let tls = config.tls.as_ref().map(|t| tls::server_config(t, alpn)).transpose()?.map(TlsAcceptor::from);
        Ok((forward, tls))
    }

    pub(crate) fn new(core: Arc<FenceCore>, http: Arc<HttpConfig>, forward: Forward, tls: Option<TlsAcceptor>) -> Self {
        let config = &core.config;
        // The layer stack, outermost first:
        // - (per connection, below) the peer address is attached and errors
        //   from the layers (load shed) become problem responses, so hyper
        //   never closes a connection over them;
        // - load_shed: when the concurrency limit is reached, answer 503 at
        //   once instead of queueing; queued writes would hold sockets and
        //   pile up old-token traffic in front of the fence;
        // - concurrency_limit: bounds requests in flight (and so memory and
        //   upstream connections) to limits.max_concurrent_requests;
        // - fence: classification and the token check; it sits below the
        //   limit so a refused request is cheap, and above forward because
        //   nothing may reach the upstream without passing it;
        // - forward: the pooled upstream client with its timeouts.
        let stack = ServiceBuilder::new()
            .load_shed()
            .concurrency_limit(config.limits.max_concurrent_requests)
            .layer(FenceLayer::new(core.clone(), http))
            .service(forward);
        let stack = tower::util::BoxCloneSyncService::new(stack.map_err(Into::<BoxError>::into));

        // hyper's own head limits are twice the configured ones: the fence
        // checks the configured ones and answers problem+json, and only a
        // head beyond twice them gets hyper's bare 431 (the buffer must
        // stop somewhere).
        let hard_header_bytes = config.limits.max_header_bytes.saturating_mul(2);
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            // `conn` times heads and idle keep-alive itself (hyper's timer
            // is both in one, and misses the protocol detection before it).
            .header_read_timeout(None)
            // A client that half-closes after its request (`nc -N`,
            // shutdown(SHUT_WR)) still gets its answer, and its write is not
            // abandoned mid-call (which would make the resource
            // indeterminate, P4).
            .half_close(true)
            .max_buf_size(hard_header_bytes)
            .max_headers(config.limits.max_headers.saturating_mul(2));
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(config.limits.max_streams_per_connection)
            .max_header_list_size(u32::try_from(hard_header_bytes).unwrap_or(u32::MAX));
        let tls_handshake = config.timeouts.tls_handshake;
        let timeouts = ConnTimeouts {
            header_read: config.timeouts.header_read,
            idle: config.timeouts.idle,
            write_stall: config.timeouts.body_idle,
        };
        Self { core, stack, builder, tls, tls_handshake, timeouts }
    }

    /// Serves one accepted connection until it ends, the proxy drains (the
    /// request in progress finishes, keep-alive ends) or aborts.
    pub(crate) async fn serve(self, conn: Accepted) {
        let Accepted { stream, peer, drain, abort, .. } = conn;
        let metrics = self.core.metrics.clone();
        // TLS (if configured) before HTTP.
        let (io, identity) = match &self.tls {
            None => (tokio_util::either::Either::Left(stream), None),
            Some(acceptor) => match tokio::time::timeout(self.tls_handshake, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => {
                    let identity = tls::peer_identity(tls.get_ref().1);
                    (tokio_util::either::Either::Right(tls), identity)
                }
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "client connection refused during the TLS handshake");
                    return;
                }
                Err(_) => {
                    metrics.timed_out(TimeoutStage::TlsHandshake);
                    tracing::debug!(%peer, "client TLS handshake timed out (timeouts.tls_handshake)");
                    return;
                }
            },
        };
        let watch = ConnWatch::new(self.timeouts, metrics.clone());
        let io = Watched::new(io, watch.clone());
        let stack = self.stack.clone();
        let requests = watch.clone();
        let svc = tower::service_fn(move |mut req: Request<Incoming>| {
            // Ends when hyper drops the answer's body (written or abandoned).
            let active = requests.request_started(req.version() == http::Version::HTTP_2);
            req.extensions_mut().insert(PeerAddr(peer));
            if let Some(id) = &identity {
                req.extensions_mut().insert(ClientIdentity(id.clone()));
            }
            let call = stack.clone().oneshot(req);
            let metrics = metrics.clone();
            async move {
                let result: Result<Response<ProxyBody>, BoxError> = call.await;
                let resp = result.unwrap_or_else(|e| {
                    if e.is::<tower::load_shed::error::Overloaded>() {
                        metrics.overloaded.inc();
                    }
                    respond_to_layer_error(e)
                });
                Ok::<_, Infallible>(resp.map(|body| GuardedBody::new(body, active).boxed()))
            }
        });
        let conn = self.builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(svc));
        tokio::pin!(conn);
        let idle = watch.idle_expired().clone();
        let result = tokio::select! {
            result = conn.as_mut() => result,
            () = idle.cancelled() => {
                // Idle for timeouts.idle: close politely (HTTP/2: GOAWAY),
                // and for good if the client does not let it finish.
                tracing::debug!(%peer, "closing an idle client connection (timeouts.idle)");
                conn.as_mut().graceful_shutdown();
                let bound = watch.timeouts().header_read;
                tokio::select! {
                    result = conn.as_mut() => result,
                    () = tokio::time::sleep(bound) => return,
                    () = abort.cancelled() => return,
                }
            }
            () = drain.cancelled() => {
                conn.as_mut().graceful_shutdown();
                tokio::select! {
                    result = conn.as_mut() => result,
                    () = abort.cancelled() => return,
                }
            }
        };
        if let Err(e) = result {
            tracing::debug!(%peer, error = %e, "client connection ended with an error");
        }
    }
}
