//! Startup and shutdown of a proxy of either protocol: load every file the
//! configuration names, bind every socket, open the epoch store, then run
//! the front end's accept loop and the admin API until the shutdown signal.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::{Frontend, ProxyConfig};
use crate::core::admin::{self, UpstreamProbe};
use crate::core::epoch_store::{EpochStore, OpenError};
use crate::core::fence::FenceCore;
use crate::core::listener::Accepted;
use crate::core::listener::{Listener, ListenerSettings};
use crate::core::metrics::Metrics;
use crate::core::signing::{KeyReloader, KeysError, TokenVerifier};
use crate::core::state::Resources;
use crate::core::tls::TlsError;
use crate::http::{CONNECTION_LIMIT_REFUSAL, HttpServer};
use crate::postgres::PgFrontend;

/// A front end's connection handler.
type Serve = Arc<dyn Fn(Accepted) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send + Sync>;

/// Why the proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The epoch store refused to open (including P10: empty, no floor).
    #[error(transparent)]
    Store(#[from] OpenError),
    /// A listen address could not be bound. Nothing was written to the
    /// data directory: every socket is bound before the store is opened.
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
    /// The PostgreSQL front end could not be set up.
    #[error(transparent)]
    Postgres(#[from] crate::postgres::PostgresStartError),
    /// The admin token file is unusable.
    #[error(transparent)]
    AdminToken(#[from] admin::AdminTokenError),
    /// The console's page token could not be drawn (no OS randomness).
    #[error("the console's page token: {0}")]
    Console(std::io::Error),
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

/// Loads every file the configuration names besides the data dir (the
/// signing keys, the TLS certificates, keys and CAs) and reports the first
/// that cannot be used. `--check-config` runs it; [`start`] loads the same
/// files and refuses to start on the same errors.
pub fn check_files(config: &ProxyConfig) -> Result<(), StartError> {
    Prepared::load(config)?;
    Ok(())
}

/// What [`start`] builds from the configuration before it touches the
/// network or the data directory.
struct Prepared {
    tokens: Arc<TokenVerifier>,
    admin_token: Option<admin::AdminToken>,
    frontend: PreparedFrontend,
}

enum PreparedFrontend {
    Http { forward: Box<crate::http::forward::Forward>, tls: Option<tokio_rustls::TlsAcceptor> },
    Postgres(crate::postgres::Prepared),
}

impl Prepared {
    fn load(config: &ProxyConfig) -> Result<Self, StartError> {
        let tokens = Arc::new(TokenVerifier::new(config.signing.clone())?);
        let admin_token = config.admin_token_file.as_deref().map(admin::AdminToken::load).transpose()?;
        let frontend = match &config.frontend {
            Frontend::Http(http) => {
                let (forward, tls) = HttpServer::prepare(config, http)?;
                PreparedFrontend::Http { forward: Box::new(forward), tls }
            }
            Frontend::Postgres(pg) => PreparedFrontend::Postgres(crate::postgres::Prepared::load(config, pg)?),
        };
        Ok(Self { tokens, admin_token, frontend })
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
    let prepared = Prepared::load(&config)?;
    // Then every socket, so a busy port fails the start before anything is
    // written to the data directory (a floor, the unclean-stop marker).
    let bind = |what: &'static str, addr: SocketAddr| async move {
        TcpListener::bind(addr).await.map_err(|source| StartError::Bind { what, addr, source })
    };
    let listener = bind("proxy", config.listen).await?;
    let admin_listener = bind("admin", config.admin).await?;
    let listen =
        listener.local_addr().map_err(|source| StartError::Bind { what: "proxy", addr: config.listen, source })?;
    let admin_addr =
        admin_listener.local_addr().map_err(|source| StartError::Bind { what: "admin", addr: config.admin, source })?;
    let (store, snapshot) = {
        let dir = config.data_dir.clone();
        let max = config.limits.rejection_table_max;
        tokio::task::spawn_blocking(move || EpochStore::open(&dir, floor, max))
            .await
            .map_err(|e| StartError::Internal(e.to_string()))??
    };

    let metrics = Arc::new(Metrics::new());
    let resources = Resources::new(
        snapshot.epochs,
        snapshot.floor,
        config.limits.max_resources,
        config.timeouts.quarantine,
        !snapshot.clean_shutdown,
        metrics.clone(),
    );
    let tokens = prepared.tokens;
    let admin_token = prepared.admin_token;
    let core =
        Arc::new(FenceCore::new(config.clone(), store.clone(), resources.clone(), metrics.clone(), tokens.clone()));

    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        signal.await;
        stop.cancel();
    });
    let grace = config.timeouts.shutdown_grace;
    let mut first_byte = config.timeouts.first_byte;
    let (what, refusal, probe, serve): (_, &'static [u8], Arc<dyn UpstreamProbe>, _) =
        match (&config.frontend, prepared.frontend) {
            (Frontend::Http(http), PreparedFrontend::Http { forward, tls }) => {
                // A TLS client's first byte starts its handshake, so the
                // handshake timeout bounds the wait for it too; and a
                // plaintext 503 would be garbage to it, so it is just closed.
                let refusal = if tls.is_some() {
                    first_byte = first_byte.min(config.timeouts.tls_handshake);
                    b"".as_slice()
                } else {
                    CONNECTION_LIMIT_REFUSAL
                };
                tracing::info!(upstream = %http.upstream, "HTTP proxy");
                let forward = *forward;
                let server = HttpServer::new(core.clone(), Arc::new(http.clone()), forward.clone(), tls);
                let serve: Serve = Arc::new(move |conn| Box::pin(server.clone().serve(conn)));
                ("proxy", refusal, Arc::new(forward), serve)
            }
            (Frontend::Postgres(pg), PreparedFrontend::Postgres(prepared)) => {
                tracing::info!(upstream = %pg.upstream, resource = %pg.resource, "PostgreSQL sidecar");
                let frontend = PgFrontend::new(core.clone(), Arc::new(pg.clone()), prepared);
                let serving = frontend.clone();
                let serve: Serve = Arc::new(move |conn| Box::pin(serving.clone().serve(conn)));
                ("postgres", crate::postgres::CONNECTION_LIMIT_REFUSAL, frontend as Arc<dyn UpstreamProbe>, serve)
            }
            _ => unreachable!("prepared from the same configuration"),
        };
    if admin_token.is_none() && !admin_addr.ip().is_loopback() {
        tracing::warn!(admin = %admin_addr, "the admin API listens beyond loopback without authentication; set admin_token_file");
    }
    let console =
        admin::Console::new(core.clone(), probe.clone(), admin_token.is_some()).map_err(StartError::Console)?;
    let admin_app = admin::router(core.clone(), probe, admin_token, &console);
    let console_task = tokio::spawn(console.sample(shutdown.clone()));
    let admin_shutdown = shutdown.clone();
    let admin_task = tokio::spawn(async move {
        let served = axum::serve(admin_listener, admin_app.into_make_service_with_connect_info::<SocketAddr>())
            .with_graceful_shutdown(async move { admin_shutdown.cancelled().await })
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "admin server stopped");
        }
    });

    let settings = ListenerSettings { what, max_connections: config.limits.max_connections, first_byte, refusal };
    let accept_loop = Listener::new(listener, settings, metrics.clone());
    let accept_shutdown = shutdown.clone();
    let task = tokio::spawn(async move {
        let drained = accept_loop.run(accept_shutdown, grace, move |conn| serve(conn)).await;
        let _ = admin_task.await;
        let _ = console_task.await;
        // A stop is clean only if nothing could still land upstream: every
        // connection finished and no resource is indeterminate.
        let clean = drained && !resources.any_indeterminate();
        resources.shutdown().await;
        store.close(clean).await;
        tracing::info!(clean, "proxy stopped");
    });
    tracing::info!(%listen, admin = %admin_addr, floor = snapshot.floor, "proxy listening");
    Ok(ProxyHandle { listen, admin: admin_addr, shutdown, task, keys: KeyReloader(tokens) })
}
