//! The accept loop of the node's port. Unlike `axum::serve`, it owns
//! every connection task: a graceful stop lets in-flight calls finish for a
//! bounded time, and aborting the server task (a crash, in tests) drops every
//! connection at once, as a killed process would.
//!
//! Its port is bound first and listened on only when the loop starts
//! ([`Reserved`]): a starting node refuses connections until it serves.
//!
//! With TLS, every connection passes the handshake (bounded in time) before
//! any byte of HTTP is read, so a plaintext client is refused there; what the
//! handshake showed ([`ConnInfo`]) travels with each request as an
//! extension. Every connection is bounded ([`ConnectionLimits`]): in
//! number (above the limit a connection is closed at once, logged and
//! counted in `fencer_connections_refused_total`), in the time to its first
//! byte, to the end of each request head (which on HTTP/1 also bounds an
//! idle keep-alive connection) and of each JSON body; idle HTTP/2
//! connections are pinged and closed when the pings go unanswered.

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

use crate::coalesce::Coalesced;
use crate::tls::{ConnInfo, ServerTls};

/// Largest HTTP/1 request head; the HTTP/2 header list bound.
const MAX_HEADER_BYTES: usize = 64 * 1024;
/// Concurrent HTTP/2 streams per connection.
const MAX_STREAMS_PER_CONNECTION: u32 = 1024;
/// HTTP/2 connections are pinged this often when idle, and closed when a
/// ping is not answered within [`KEEP_ALIVE_TIMEOUT`]: a vanished client
/// does not hold a connection slot for ever.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// The bounds of every connection to a node's ports (docs/coordinator.md
/// "Connections"), in the node's config (`NodeConfig::connections`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections open at once on one port (TLS handshakes included); one
    /// more is closed as soon as it is accepted. Default 4096.
    pub max_connections: usize,
    /// Time from accept to the connection's first byte (a TLS hello or a
    /// request); a silent connection is closed. Default 10 s.
    pub first_byte_timeout: Duration,
    /// Time to send an HTTP/1 request head, counted from the connection's
    /// first byte or, on a keep-alive connection, from the end of the
    /// previous answer: so also the idle keep-alive timeout. Default 10 s.
    pub header_timeout: Duration,
    /// Time to send a JSON request body, counted from the end of its head
    /// (408 `BODY_TIMEOUT` after it). gRPC bodies are bounded by their
    /// message size and the HTTP/2 keep-alive instead. Default 10 s.
    pub body_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_connections: 4096,
            first_byte_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(10),
        }
    }
}

/// The body timeout of a connection's requests, as a request extension
/// (read by the JSON body extractor).
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyTimeout(pub(crate) Duration);

/// Connections the kernel completes before the accept loop takes them: 128,
/// what `tokio::net::TcpListener::bind` asks for (through mio), which the
/// node used before it bound and listened in two steps.
const BACKLOG: u32 = 128;

/// A port bound but not yet listened on. A node binds its ports first, so
/// that a port another process listens on, or a bad address, fails the
/// start before its stores are opened, and the bound address (port 0) is
/// known; it listens only when its accept loop starts
/// ([`Reserved::listen`]), after its stores are open.
/// Until then a connection to the port is refused at once, instead of being
/// completed by the kernel and left unanswered for as long as the stores
/// take to open (a second or more with a large snapshot). A peer or a client
/// then moves on at once: a leader's snapshot transfer started in that
/// window would otherwise wait in the backlog and send a snapshot that a
/// newer one had already replaced by the time the node served (a second
/// install of the newer one followed).
///
/// On Linux, two sockets with `SO_REUSEADDR` may both bind one port while
/// neither listens: a second node given the same port then fails at
/// [`listen`](Self::listen), with the same error, after its stores opened.
#[derive(Debug)]
pub(crate) struct Reserved {
    socket: tokio::net::TcpSocket,
    addr: std::net::SocketAddr,
}

impl Reserved {
    /// Binds `addr` without listening (`SO_REUSEADDR` set, as
    /// `TcpListener::bind` sets it, so that a restart is not refused by
    /// connections of the previous process in `TIME_WAIT`).
    pub(crate) fn bind(addr: std::net::SocketAddr) -> std::io::Result<Self> {
        let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
        #[cfg(unix)]
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        let addr = socket.local_addr()?;
        Ok(Self { socket, addr })
    }

    /// The bound address (with the port the system chose for port 0).
    pub(crate) fn local_addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// Starts listening: from now on connections are completed and wait for
    /// the accept loop.
    pub(crate) fn listen(self) -> std::io::Result<TcpListener> {
        self.socket.listen(BACKLOG)
    }
}

/// At most one "connection refused" warning per this long per port; the
/// counter counts every one.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);

/// Serves `app` on `listener` until `shutdown` turns true, then stops
/// accepting, asks every connection to finish (HTTP/2 GOAWAY) and waits at
/// most `grace` before dropping the rest.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    tls: Option<ServerTls>,
    limits: ConnectionLimits,
    refused: prometheus_client::metrics::counter::Counter,
    mut shutdown: watch::Receiver<bool>,
    grace: Duration,
) {
    let graceful = GracefulShutdown::new();
    let mut connections = JoinSet::new();
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let mut last_refusal_logged: Option<tokio::time::Instant> = None;
    let mut builder = Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(limits.header_timeout).max_buf_size(MAX_HEADER_BYTES);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        .keep_alive_interval(KEEP_ALIVE_INTERVAL)
        .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
        .max_header_list_size(MAX_HEADER_BYTES as u32);
    loop {
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
                let Ok(permit) = permits.clone().try_acquire_owned() else {
                    // Full: closed at once rather than left in the backlog,
                    // where it would wait unseen for a slot.
                    refused.inc();
                    let now = tokio::time::Instant::now();
                    if last_refusal_logged.is_none_or(|t| now.duration_since(t) >= REFUSAL_LOG_EVERY) {
                        last_refusal_logged = Some(now);
                        tracing::warn!(
                            %peer,
                            max_connections = limits.max_connections,
                            refused_total = refused.get(),
                            "connection refused: the port has its maximum of open connections"
                        );
                    }
                    drop(stream);
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let (tls, app, builder, watcher) = (tls.clone(), app.clone(), builder.clone(), graceful.watcher());
                let (first_byte_timeout, body_timeout) = (limits.first_byte_timeout, BodyTimeout(limits.body_timeout));
                connections.spawn(async move {
                    let _permit = permit;
                    // Nothing is read before the first byte, not even by the
                    // HTTP version detection, which has no timer of its own.
                    let mut first = [0u8; 1];
                    match tokio::time::timeout(first_byte_timeout, stream.peek(&mut first)).await {
                        Ok(Ok(n)) if n > 0 => {}
                        Ok(_) => return,
                        Err(_) => {
                            tracing::debug!(%peer, "no byte within {first_byte_timeout:?}; connection closed");
                            return;
                        }
                    }
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
                        req.extensions_mut().insert(body_timeout);
                        req
                    }));
                    let conn = builder.serve_connection_with_upgrades(TokioIo::new(Coalesced::new(stream)), service);
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

#[cfg(test)]
mod tests {
    use std::io::ErrorKind;
    use std::net::SocketAddr;

    use tokio::net::TcpStream;

    use super::Reserved;

    #[tokio::test]
    async fn a_reserved_port_refuses_connections_until_it_listens() {
        let reserved = Reserved::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = reserved.local_addr();
        assert_ne!(addr.port(), 0, "port 0 resolves to the port the system chose");
        let refused = TcpStream::connect(addr).await.expect_err("a bound port that does not listen completes nothing");
        assert_eq!(refused.kind(), ErrorKind::ConnectionRefused, "{refused}");

        let listener = reserved.listen().unwrap();
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let (client, (server, _)) = (client.unwrap(), accepted.unwrap());
        assert_eq!(server.local_addr().unwrap(), addr);
        assert_eq!(client.peer_addr().unwrap(), addr);
    }

    #[tokio::test]
    async fn a_port_in_use_fails_at_bind_or_at_listen() {
        // Its owner listens: the bind already fails.
        let first = Reserved::bind("127.0.0.1:0".parse().unwrap()).unwrap().listen().unwrap();
        let addr: SocketAddr = first.local_addr().unwrap();
        let e = Reserved::bind(addr).and_then(Reserved::listen).expect_err("a second listener on a port in use");
        assert_eq!(e.kind(), ErrorKind::AddrInUse, "{e}");

        // Two nodes given one port, both still opening their stores: Linux
        // lets both bind it (`SO_REUSEADDR`, neither listens); whichever
        // listens second is refused.
        let one = Reserved::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = one.local_addr();
        match Reserved::bind(addr) {
            Err(e) => assert_eq!(e.kind(), ErrorKind::AddrInUse, "{e}"),
            Ok(two) => {
                let _listening = one.listen().unwrap();
                let e = two.listen().expect_err("the second of two reservations cannot listen too");
                assert_eq!(e.kind(), ErrorKind::AddrInUse, "{e}");
            }
        }
    }
}
