//! The accept loop of the node's one port. Unlike `axum::serve`, it owns
//! every connection task: a graceful stop lets in-flight calls finish for a
//! bounded time, and aborting the server task (a crash, in tests) drops every
//! connection at once, as a killed process would.

use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

/// Serves `app` on `listener` until `shutdown` turns true, then stops
/// accepting, asks every connection to finish (HTTP/2 GOAWAY) and waits at
/// most `grace` before dropping the rest.
pub(crate) async fn serve(listener: TcpListener, app: Router, mut shutdown: watch::Receiver<bool>, grace: Duration) {
    let graceful = GracefulShutdown::new();
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of file descriptors and the like: back off, keep serving.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let service = TowerToHyperService::new(app.clone());
                let conn = Builder::new(TokioExecutor::new())
                    .serve_connection_with_upgrades(TokioIo::new(stream), service)
                    .into_owned();
                let conn = graceful.watch(conn);
                connections.spawn(async move {
                    if let Err(e) = conn.await {
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
