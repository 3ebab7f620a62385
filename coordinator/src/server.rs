//! The accept loop of the node's port. Unlike `axum::serve`, it owns
//! every connection task: a graceful stop lets in-flight calls finish for a
//! bounded time, and aborting the server task (a crash, in tests) drops every
//! connection at once, as a killed process would.
//!
//! With TLS, every connection passes the handshake (bounded in time) before
//! any byte of HTTP is read, so a plaintext client is refused there; what the
//! handshake showed ([`ConnInfo`]) travels with each request as an
//! extension. Connections are bounded in number and idle HTTP/1 connections
//! are closed.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tower::ServiceExt as _;

use crate::tls::{ConnInfo, ServerTls};

/// Connections open at once on one port (TLS handshakes included); more
/// wait in the kernel's backlog.
pub(crate) const MAX_CONNECTIONS: usize = 4096;
/// Time to send a request's head on HTTP/1 (also closes idle keep-alive
/// connections).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest HTTP/1 request head; the HTTP/2 header list bound.
const MAX_HEADER_BYTES: usize = 64 * 1024;
/// Concurrent HTTP/2 streams per connection.
const MAX_STREAMS_PER_CONNECTION: u32 = 1024;
/// HTTP/2 connections are pinged this often when idle, and closed when a
/// ping is not answered within [`KEEP_ALIVE_TIMEOUT`]: a vanished client
/// does not hold a connection slot for ever.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Serves `app` on `listener` until `shutdown` turns true, then stops
/// accepting, asks every connection to finish (HTTP/2 GOAWAY) and waits at
/// most `grace` before dropping the rest.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    tls: Option<ServerTls>,
    mut shutdown: watch::Receiver<bool>,
    grace: Duration,
) {
    let graceful = GracefulShutdown::new();
    let mut connections = JoinSet::new();
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut builder = Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT).max_buf_size(MAX_HEADER_BYTES);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        .keep_alive_interval(KEEP_ALIVE_INTERVAL)
        .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
        .max_header_list_size(MAX_HEADER_BYTES as u32);
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => p.expect("the connection semaphore is never closed"),
            changed = shutdown.changed() => {
                if changed.is_err() || *shutdown.borrow() {
                    break;
                }
                continue;
            }
        };
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of file descriptors and the like: back off, keep serving.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let (tls, app, builder, watcher) = (tls.clone(), app.clone(), builder.clone(), graceful.watcher());
                connections.spawn(async move {
                    let _permit = permit;
                    let (stream, info) = match tls {
                        None => (tokio_util::either::Either::Left(stream), ConnInfo::default()),
                        Some(tls) => {
                            let acceptor = tokio_rustls::TlsAcceptor::from(tls.config.clone());
                            match tokio::time::timeout(tls.handshake_timeout, acceptor.accept(stream)).await {
                                Ok(Ok(s)) => {
                                    let info = tls.classify(s.get_ref().1.peer_certificates());
                                    (tokio_util::either::Either::Right(s), info)
                                }
                                Ok(Err(e)) => {
                                    tracing::debug!(%peer, error = %e, "TLS handshake failed; connection closed");
                                    return;
                                }
                                Err(_) => {
                                    tracing::debug!(%peer, "TLS handshake timed out; connection closed");
                                    return;
                                }
                            }
                        }
                    };
                    let service = TowerToHyperService::new(app.map_request(move |mut req: http::Request<hyper::body::Incoming>| {
                        req.extensions_mut().insert(info.clone());
                        req
                    }));
                    let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
                    if let Err(e) = watcher.watch(conn.into_owned()).await {
                        tracing::trace!(error = %e, "connection ended with an error");
                    }
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            changed = shutdown.changed() => {
                if changed.is_err() || *shutdown.borrow() {
                    break;
                }
            }
        }
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(grace) => {
            tracing::warn!(open = connections.len(), "connections still busy after {grace:?}; closing them");
        }
    }
    connections.shutdown().await;
}
