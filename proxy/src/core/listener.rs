//! The one accept loop of both front ends (STYLE: "a listener owns its
//! connections"): it bounds open connections (a client beyond
//! `limits.max_connections` is refused at once, logged and counted, never
//! left waiting), closes connections that send nothing within
//! `timeouts.first_byte`, owns every connection task, and shuts down in two
//! steps: `drain` asks connections to finish what they are doing, `abort`
//! (after the grace period) drops them.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::core::clock;
use crate::core::metrics::{Metrics, TimeoutStage};

/// Connections answered and closed at once beyond `max_connections`; more
/// are closed without an answer.
const REFUSING_MAX: usize = 64;

/// One accepted client connection, handed to the front end after its first
/// byte arrived.
pub(crate) struct Accepted {
    pub(crate) stream: TcpStream,
    pub(crate) peer: SocketAddr,
    /// Cancelled when the proxy starts shutting down: finish the request or
    /// transaction in progress, then close.
    pub(crate) drain: CancellationToken,
    /// Cancelled when the grace period is over: close now.
    pub(crate) abort: CancellationToken,
    /// Holds the connection's slot until dropped.
    _permit: OwnedSemaphorePermit,
}

/// What the listener needs to know besides its socket.
#[derive(Debug, Clone)]
pub(crate) struct ListenerSettings {
    /// `proxy` or `postgres`, for logs.
    pub(crate) what: &'static str,
    pub(crate) max_connections: usize,
    pub(crate) first_byte: Duration,
    /// Written to a client refused at the connection limit, in the front
    /// end's protocol (an HTTP 503, a PostgreSQL `FATAL 53300`).
    pub(crate) refusal: &'static [u8],
}

/// The accept loop.
pub(crate) struct Listener {
    tcp: TcpListener,
    settings: ListenerSettings,
    permits: Arc<Semaphore>,
    /// Bounds the connections being refused at once.
    refusing: Arc<Semaphore>,
    metrics: Arc<Metrics>,
    tasks: TaskTracker,
    drain: CancellationToken,
    abort: CancellationToken,
    last_refusal_log_ms: Arc<AtomicU64>,
    refusals_not_logged: Arc<AtomicU64>,
}

impl Listener {
    pub(crate) fn new(tcp: TcpListener, settings: ListenerSettings, metrics: Arc<Metrics>) -> Self {
        Self {
            tcp,
            permits: Arc::new(Semaphore::new(settings.max_connections)),
            refusing: Arc::new(Semaphore::new(REFUSING_MAX)),
            settings,
            metrics,
            tasks: TaskTracker::new(),
            drain: CancellationToken::new(),
            abort: CancellationToken::new(),
            last_refusal_log_ms: Arc::new(AtomicU64::new(0)),
            refusals_not_logged: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Accepts until `shutdown` is cancelled, handing every connection to
    /// `handler` on its own task. Then asks every connection to drain,
    /// waits up to `grace`, aborts what is left, and returns whether every
    /// connection ended within the grace period.
    pub(crate) async fn run<H, Fut>(self, shutdown: CancellationToken, grace: Duration, handler: H) -> bool
    where
        H: Fn(Accepted) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let handler = Arc::new(handler);
        loop {
            let accepted = tokio::select! {
                accepted = self.tcp.accept() => accepted,
                () = shutdown.cancelled() => break,
            };
            let (stream, peer) = match accepted {
                Ok(v) => v,
                Err(e) => {
                    // Out of file descriptors and the like: back off
                    // instead of spinning.
                    tracing::warn!(what = self.settings.what, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let Ok(permit) = self.permits.clone().try_acquire_owned() else {
                self.refuse(stream, peer);
                continue;
            };
            self.metrics.connections.inc();
            let metrics = self.metrics.clone();
            let first_byte = self.settings.first_byte;
            let (drain, abort) = (self.drain.clone(), self.abort.clone());
            let handler = handler.clone();
            self.tasks.spawn(async move {
                let _open = OpenConnection(metrics.clone());
                let mut byte = [0u8; 1];
                tokio::select! {
                    waited = tokio::time::timeout(first_byte, stream.peek(&mut byte)) => match waited {
                        Ok(Ok(n)) if n > 0 => {}
                        Ok(_) => return, // closed (or failed) before sending anything
                        Err(_) => {
                            metrics.timed_out(TimeoutStage::FirstByte);
                            tracing::debug!(%peer, ?first_byte, "closing a connection that sent nothing (timeouts.first_byte)");
                            return;
                        }
                    },
                    () = abort.cancelled() => return,
                    () = drain.cancelled() => return,
                }
                handler(Accepted { stream, peer, drain, abort, _permit: permit }).await;
            });
        }
        // Close the socket now, so new clients are refused (not left in the
        // backlog) while open connections drain.
        drop(self.tcp);
        self.tasks.close();
        let open = self.tasks.len();
        tracing::info!(what = self.settings.what, open, ?grace, "no new connections; letting open ones finish");
        self.drain.cancel();
        let drained = tokio::time::timeout(grace, self.tasks.wait()).await.is_ok();
        if !drained {
            tracing::warn!(
                what = self.settings.what,
                open = self.tasks.len(),
                "shutdown grace period passed with connections still busy; closing them"
            );
            self.abort.cancel();
            // Aborted connections only need to drop their sockets.
            let _ = tokio::time::timeout(Duration::from_secs(5), self.tasks.wait()).await;
        }
        drained
    }

    /// A client beyond `max_connections`: answered in its protocol, closed,
    /// counted, and logged (at most once a second, with how many were not).
    fn refuse(&self, stream: TcpStream, peer: SocketAddr) {
        self.metrics.connections_refused.inc();
        let now = clock::unix_ms();
        let last = self.last_refusal_log_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= 1000
            && self.last_refusal_log_ms.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
        {
            let also = self.refusals_not_logged.swap(0, Ordering::Relaxed);
            tracing::warn!(
                what = self.settings.what,
                %peer,
                max_connections = self.settings.max_connections,
                also_refused_since_last_log = also,
                "connection refused: limits.max_connections are open"
            );
        } else {
            self.refusals_not_logged.fetch_add(1, Ordering::Relaxed);
        }
        // Answered on a small, bounded number of tasks: the answer is
        // written, the write side shut, and what the client already sent is
        // read and dropped for a moment, so closing does not reset the
        // connection before the client has read the answer. Beyond the
        // bound the socket is just closed.
        let Ok(slot) = self.refusing.clone().try_acquire_owned() else {
            return;
        };
        let refusal = self.settings.refusal;
        let mut stream = stream;
        self.tasks.spawn(async move {
            let _slot = slot;
            let _ = tokio::time::timeout(Duration::from_secs(1), async {
                stream.write_all(refusal).await?;
                stream.shutdown().await?;
                let mut sink = [0u8; 1024];
                while stream.read(&mut sink).await? > 0 {}
                Ok::<_, std::io::Error>(())
            })
            .await;
        });
    }
}

struct OpenConnection(Arc<Metrics>);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.connections.dec();
    }
}
