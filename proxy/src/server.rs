//! Startup, the layer stack, the accept loop and graceful shutdown.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tower::{ServiceBuilder, ServiceExt};

use crate::admin;
use crate::body::{BoxError, ProxyBody};
use crate::config::ProxyConfig;
use crate::epoch_store::{EpochStore, OpenError};
use crate::fence::{ClientIdentity, FenceLayer, FenceShared, PeerAddr};
use crate::forward::Forward;
use crate::listener::ClientAcceptor;
use crate::metrics::Metrics;
use crate::problem::respond_to_layer_error;
use crate::signing::{KeyReloader, KeysError, TokenVerifier};
use crate::state::Resources;
use crate::tls::TlsError;

/// Why the proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The epoch store refused to open (including P10: empty, no floor).
    #[error(transparent)]
    Store(#[from] OpenError),
    /// A listen address could not be bound.
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        /// `proxy` or `admin`.
        what: &'static str,
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The signing keys (P7) could not be loaded.
    #[error(transparent)]
    Keys(#[from] KeysError),
    /// A TLS certificate, key or CA file could not be used.
    #[error("TLS: {0}")]
    Tls(#[from] TlsError),
    /// Opening the store panicked or was cancelled.
    #[error("the epoch store could not be opened: {0}")]
    Internal(String),
}

/// A running proxy: its addresses and its shutdown.
#[derive(Debug)]
pub struct ProxyHandle {
    listen: SocketAddr,
    admin: SocketAddr,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
    keys: KeyReloader,
}

impl ProxyHandle {
    /// The address clients connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.listen
    }

    /// The admin API's address.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
    }

    /// Reloads the signing keys from their file (the binary calls it on
    /// SIGHUP; the admin API's `POST /v1/reload-keys` does the same).
    pub fn key_reloader(&self) -> KeyReloader {
        self.keys.clone()
    }

    /// Stops accepting, lets in-flight requests finish (up to
    /// `timeouts.shutdown_grace`), closes the store, and returns when done.
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
    }

    /// Waits until the proxy has stopped (after [`ProxyHandle::shutdown`]
    /// from another task, or the given signal in [`start_with_shutdown`]).
    pub async fn wait(self) {
        let _ = self.task.await;
    }
}

/// Starts the proxy; stop it with [`ProxyHandle::shutdown`].
pub async fn start(config: ProxyConfig, floor: Option<u64>) -> Result<ProxyHandle, StartError> {
    start_with_shutdown(config, floor, std::future::pending()).await
}

/// Starts the proxy; it stops gracefully when `signal` resolves (the binary
/// passes SIGTERM/SIGINT) or on [`ProxyHandle::shutdown`].
pub async fn start_with_shutdown(
    config: ProxyConfig,
    floor: Option<u64>,
    signal: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<ProxyHandle, StartError> {
    let config = Arc::new(config);
    // Keys and TLS files first: a proxy that cannot check signatures or
    // speak TLS as configured must not start at all.
    let tokens = Arc::new(TokenVerifier::new(config.signing.clone())?);
    let acceptor = ClientAcceptor::new(&config)?;
    let forward = Forward::new(&config)?;
    let (store, snapshot) = {
        let dir = config.data_dir.clone();
        let max = config.limits.rejection_table_max;
        tokio::task::spawn_blocking(move || EpochStore::open(&dir, floor, max))
            .await
            .map_err(|e| StartError::Internal(e.to_string()))??
    };
    let bind = |what: &'static str, addr: SocketAddr| async move {
        TcpListener::bind(addr).await.map_err(|source| StartError::Bind { what, addr, source })
    };
    let listener = bind("proxy", config.listen).await?;
    let admin_listener = bind("admin", config.admin).await?;
    let listen =
        listener.local_addr().map_err(|source| StartError::Bind { what: "proxy", addr: config.listen, source })?;
    let admin_addr =
        admin_listener.local_addr().map_err(|source| StartError::Bind { what: "admin", addr: config.admin, source })?;

    let metrics = Arc::new(Metrics::new());
    let resources = Resources::new(
        snapshot.epochs,
        snapshot.floor,
        config.limits.max_resources,
        config.timeouts.quarantine,
        !snapshot.clean_shutdown,
        metrics.clone(),
    );
    let shared =
        Arc::new(FenceShared::new(config.clone(), store.clone(), resources.clone(), metrics.clone(), tokens.clone()));

    // The layer stack, outermost first:
    // - (per connection, below) the peer address is attached and errors
    //   from the layers (load shed) become problem responses, so hyper
    //   never closes a connection over them;
    // - load_shed: when the concurrency limit is reached, answer 503 at
    //   once instead of queueing; queued writes would hold sockets and
    //   pile up old-token traffic in front of the fence;
    // - concurrency_limit: bounds requests in flight (and so memory and
    //   upstream connections) to limits.max_concurrent_requests;
    // - fence: classification and the token check; it sits below the limit
    //   so a refused request is cheap, and above forward because nothing
    //   may reach the upstream without passing it;
    // - forward: the pooled upstream client with its timeouts.
    let stack = ServiceBuilder::new()
        .load_shed()
        .concurrency_limit(config.limits.max_concurrent_requests)
        .layer(FenceLayer::new(shared.clone()))
        .service(forward.clone());

    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(config.timeouts.header_read)
        .max_buf_size(config.limits.max_header_bytes)
        .max_headers(config.limits.max_headers);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(config.limits.max_streams_per_connection)
        .max_header_list_size(u32::try_from(config.limits.max_header_bytes).unwrap_or(u32::MAX));

    let shutdown = CancellationToken::new();
    let admin_app = admin::router(shared.clone(), forward);
    let admin_shutdown = shutdown.clone();
    let admin_task = tokio::spawn(async move {
        let served = axum::serve(admin_listener, admin_app.into_make_service_with_connect_info::<SocketAddr>())
            .with_graceful_shutdown(async move { admin_shutdown.cancelled().await })
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "admin server stopped");
        }
    });

    let stop = shutdown.clone();
    tokio::spawn(async move {
        signal.await;
        stop.cancel();
    });
    let grace = config.timeouts.shutdown_grace;
    let accept_shutdown = shutdown.clone();
    let task = tokio::spawn(async move {
        let graceful = GracefulShutdown::new();
        loop {
            // limits.max_connections: wait for a slot before accepting.
            let permit = tokio::select! {
                permit = acceptor.permit() => permit,
                () = accept_shutdown.cancelled() => break,
            };
            tokio::select! {
                accepted = listener.accept() => {
                    let (stream, peer) = match accepted {
                        Ok(v) => v,
                        Err(e) => {
                            // Out of file descriptors and the like: back off
                            // instead of spinning.
                            tracing::warn!(error = %e, "accept failed");
                            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                            continue;
                        }
                    };
                    let _ = stream.set_nodelay(true);
                    let stack = stack.clone();
                    let metrics = metrics.clone();
                    let (acceptor, builder, watcher) = (acceptor.clone(), builder.clone(), graceful.watcher());
                    tokio::spawn(async move {
                        let _permit = permit;
                        // TLS (if configured) before HTTP, off the accept loop.
                        let (io, identity) = match acceptor.handshake(stream).await {
                            Ok(v) => v,
                            Err(e) => {
                                tracing::debug!(%peer, error = %e, "client connection refused during the TLS handshake");
                                return;
                            }
                        };
                        let svc = tower::service_fn(move |mut req: Request<Incoming>| {
                            req.extensions_mut().insert(PeerAddr(peer));
                            if let Some(id) = &identity {
                                req.extensions_mut().insert(ClientIdentity(id.clone()));
                            }
                            let call = stack.clone().oneshot(req);
                            let metrics = metrics.clone();
                            async move {
                                let result: Result<Response<ProxyBody>, BoxError> = call.await;
                                Ok::<_, Infallible>(result.unwrap_or_else(|e| {
                                    if e.is::<tower::load_shed::error::Overloaded>() {
                                        metrics.overloaded.inc();
                                    }
                                    respond_to_layer_error(e)
                                }))
                            }
                        });
                        let conn = builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(svc));
                        if let Err(e) = watcher.watch(conn.into_owned()).await {
                            tracing::debug!(%peer, error = %e, "client connection ended with an error");
                        }
                    });
                }
                () = accept_shutdown.cancelled() => break,
            }
        }
        drop(listener);
        tracing::info!(?grace, "shutting down: no new connections; waiting for in-flight requests");
        let drained = tokio::select! {
            () = graceful.shutdown() => true,
            () = tokio::time::sleep(grace) => {
                tracing::warn!("shutdown grace period passed with requests still in flight");
                false
            }
        };
        let _ = admin_task.await;
        // A stop is clean only if nothing could still land upstream: every
        // request finished and no resource is indeterminate.
        let clean = drained && !resources.any_indeterminate();
        resources.shutdown().await;
        store.close(clean).await;
        tracing::info!("proxy stopped");
    });
    tracing::info!(%listen, admin = %admin_addr, upstream = %config.upstream, floor = snapshot.floor, "proxy listening");
    Ok(ProxyHandle { listen, admin: admin_addr, shutdown, task, keys: KeyReloader(tokens) })
}
