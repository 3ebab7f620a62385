//! The client connection's timeouts that hyper does not enforce itself.
//!
//! What hyper 1.x and hyper-util's auto builder enforce, read in their
//! source: HTTP/1's `header_read_timeout` runs while hyper waits for a
//! request head, which on a keep-alive connection starts as soon as the
//! previous answer is written, so it is the head timeout and the keep-alive
//! idle timeout in one; the auto builder's protocol detection (reading up to
//! the 24 bytes of the HTTP/2 preface) has no timeout at all, so a client
//! that sends `PRI` and stops, or a TLS client silent after its handshake,
//! is held forever; HTTP/2 has neither a head nor an idle timeout; and
//! nothing bounds a client that stops reading its answer, whose unread
//! response holds the resource's shared guard (P3) for as long as it likes.
//!
//! So the proxy turns hyper's head timer off and watches the connection
//! itself, with one shared [`ConnWatch`]:
//! - the service marks each request's start and end ([`ActiveRequest`],
//!   carried by the response body until hyper drops it);
//! - [`Watched`], the client I/O, fails a pending read when the connection
//!   has no request in progress and a request head is overdue: the first
//!   request's (`header_read` from the connection's start) or, on HTTP/1, a
//!   further request's (`header_read` from its first byte);
//! - with no request in progress and no head begun for `idle`, it tells the
//!   connection's owner ([`ConnWatch::idle_expired`]), which closes the
//!   connection gracefully (HTTP/2: GOAWAY);
//! - it fails a write that has made no progress for `body_idle`: the
//!   client has stopped reading its answer.
//!
//! A failed read or write ends the connection (hyper drops it), so its
//! requests' guards are released; each closure is counted by stage.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;
use tokio_util::sync::CancellationToken;

use crate::core::clock::{self, Instant};
use crate::core::metrics::{Metrics, TimeoutStage};

/// The connection timeouts, from `[timeouts]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnTimeouts {
    pub(crate) header_read: Duration,
    pub(crate) idle: Duration,
    /// The longest a write may make no progress.
    pub(crate) write_stall: Duration,
}

#[derive(Debug)]
struct Phase {
    /// Requests whose answer has not been fully written (or dropped).
    active: usize,
    /// Whether a request has been seen on this connection.
    seen_request: bool,
    /// The connection speaks HTTP/2 (known from its first request).
    http2: bool,
    /// When the connection was handed to HTTP (its first byte arrived, or
    /// its TLS handshake finished).
    started: Instant,
    /// When the last request in progress ended.
    idle_since: Instant,
    /// HTTP/1: when the first byte after the last request arrived.
    head_started: Option<Instant>,
}

/// What one client connection is doing, shared by its I/O and its
/// service.
#[derive(Debug)]
pub(crate) struct ConnWatch {
    phase: Mutex<Phase>,
    timeouts: ConnTimeouts,
    metrics: Arc<Metrics>,
    idle: CancellationToken,
}

impl ConnWatch {
    pub(crate) fn new(timeouts: ConnTimeouts, metrics: Arc<Metrics>) -> Arc<Self> {
        let now = clock::now();
        let phase =
            Phase { active: 0, seen_request: false, http2: false, started: now, idle_since: now, head_started: None };
        Arc::new(Self { phase: Mutex::new(phase), timeouts, metrics, idle: CancellationToken::new() })
    }

    /// Cancelled when the connection has been idle for `timeouts.idle`.
    pub(crate) fn idle_expired(&self) -> &CancellationToken {
        &self.idle
    }

    /// The connection timeouts.
    pub(crate) fn timeouts(&self) -> ConnTimeouts {
        self.timeouts
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A request's head has arrived; the returned guard marks its end when
    /// dropped (put it in the response body).
    pub(crate) fn request_started(self: &Arc<Self>, http2: bool) -> ActiveRequest {
        let mut p = self.lock();
        p.active += 1;
        p.seen_request = true;
        p.http2 = http2;
        p.head_started = None;
        ActiveRequest(self.clone())
    }

    fn bytes_read(&self) {
        let mut p = self.lock();
        if p.active == 0 && p.seen_request && !p.http2 && p.head_started.is_none() {
            p.head_started = Some(clock::now());
        }
    }

    /// When a read that is waiting must give up, and which timeout that is;
    /// `None` while a request is in progress (its body has its own
    /// timeouts, and an answer may take `timeouts.response`).
    fn read_deadline(&self) -> Option<(Instant, TimeoutStage)> {
        let p = self.lock();
        let t = &self.timeouts;
        if p.active > 0 {
            None
        } else if !p.seen_request {
            Some((p.started + t.header_read, TimeoutStage::HeaderRead))
        } else if let Some(head) = p.head_started {
            Some((head + t.header_read, TimeoutStage::HeaderRead))
        } else {
            Some((p.idle_since + t.idle, TimeoutStage::Idle))
        }
    }
}

/// One request in progress on a connection; dropping it ends it.
#[derive(Debug)]
pub(crate) struct ActiveRequest(Arc<ConnWatch>);

impl Drop for ActiveRequest {
    fn drop(&mut self) {
        let mut p = self.0.lock();
        p.active = p.active.saturating_sub(1);
        if p.active == 0 {
            p.idle_since = clock::now();
            p.head_started = None;
        }
    }
}

/// A deadline whose timer is registered with the task that waits on it.
struct Deadline {
    sleep: Pin<Box<Sleep>>,
    at: Option<Instant>,
}

impl Deadline {
    fn new() -> Self {
        Self { sleep: Box::pin(tokio::time::sleep(Duration::ZERO)), at: None }
    }

    /// Whether `at` has passed; if not, the task is woken when it does.
    fn passed(&mut self, at: Instant, cx: &mut Context<'_>) -> bool {
        if self.at != Some(at) {
            self.sleep.as_mut().reset(at);
            self.at = Some(at);
        }
        self.sleep.as_mut().poll(cx).is_ready()
    }
}

/// The client connection's I/O, with the timeouts of [`ConnWatch`].
pub(crate) struct Watched<I> {
    io: I,
    watch: Arc<ConnWatch>,
    read: Deadline,
    write: Deadline,
    /// Since when writes have made no progress.
    write_stalled_since: Option<Instant>,
}

impl<I> Watched<I> {
    pub(crate) fn new(io: I, watch: Arc<ConnWatch>) -> Self {
        Self { io, watch, read: Deadline::new(), write: Deadline::new(), write_stalled_since: None }
    }

    fn timed_out(&self, stage: TimeoutStage, what: &str) -> io::Error {
        self.watch.metrics.timed_out(stage);
        io::Error::new(io::ErrorKind::TimedOut, what.to_owned())
    }

    /// A write returned `Pending`: fail it once writes have made no
    /// progress for the stall limit.
    fn write_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        let since = *self.write_stalled_since.get_or_insert_with(clock::now);
        if self.write.passed(since + self.watch.timeouts.write_stall, cx) {
            return Poll::Ready(self.timed_out(
                TimeoutStage::ClientNotReading,
                "the client stopped reading its answer (timeouts.body_idle)",
            ));
        }
        Poll::Pending
    }

    fn write_ready<T>(&mut self, result: io::Result<T>) -> Poll<io::Result<T>> {
        self.write_stalled_since = None;
        Poll::Ready(result)
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Watched<I> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(result) => {
                if buf.filled().len() > before {
                    this.watch.bytes_read();
                }
                Poll::Ready(result)
            }
            Poll::Pending => {
                let Some((at, stage)) = this.watch.read_deadline() else {
                    return Poll::Pending;
                };
                if !this.read.passed(at, cx) {
                    return Poll::Pending;
                }
                if stage != TimeoutStage::Idle {
                    let what = "no complete request head within timeouts.header_read";
                    tracing::debug!(what, "closing a client connection");
                    return Poll::Ready(Err(this.timed_out(stage, what)));
                }
                if !this.watch.idle.is_cancelled() {
                    this.watch.metrics.timed_out(TimeoutStage::Idle);
                    this.watch.idle.cancel();
                }
                Poll::Pending
            }
        }
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Watched<I> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.io).poll_write(cx, buf) {
            Poll::Ready(r) => self.write_ready(r),
            Poll::Pending => self.write_pending(cx).map(Err),
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.io).poll_write_vectored(cx, bufs) {
            Poll::Ready(r) => self.write_ready(r),
            Poll::Pending => self.write_pending(cx).map(Err),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.io).poll_flush(cx) {
            Poll::Ready(r) => self.write_ready(r),
            Poll::Pending => self.write_pending(cx).map(Err),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.io).poll_shutdown(cx) {
            Poll::Ready(r) => self.write_ready(r),
            Poll::Pending => self.write_pending(cx).map(Err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watch(header_read: u64, idle: u64) -> Arc<ConnWatch> {
        let t = ConnTimeouts {
            header_read: Duration::from_secs(header_read),
            idle: Duration::from_secs(idle),
            write_stall: Duration::from_secs(60),
        };
        ConnWatch::new(t, Arc::new(Metrics::new()))
    }

    #[tokio::test(start_paused = true)]
    async fn each_phase_has_its_deadline() {
        let w = watch(10, 60);
        let start = clock::now();
        // The first request's head: header_read from the start.
        assert_eq!(w.read_deadline(), Some((start + Duration::from_secs(10), TimeoutStage::HeaderRead)));
        let req = w.request_started(false);
        assert_eq!(w.read_deadline(), None, "no read deadline while a request is in progress");
        tokio::time::advance(Duration::from_secs(100)).await;
        drop(req);
        let ended = clock::now();
        // Idle after the answer: timeouts.idle from its end.
        assert_eq!(w.read_deadline(), Some((ended + Duration::from_secs(60), TimeoutStage::Idle)));
        // HTTP/1: a byte of the next request starts its head timer.
        tokio::time::advance(Duration::from_secs(5)).await;
        w.bytes_read();
        assert_eq!(w.read_deadline(), Some((clock::now() + Duration::from_secs(10), TimeoutStage::HeaderRead)));
        // HTTP/2: bytes on an idle connection (pings, settings) stay idle.
        let h2 = watch(10, 60);
        drop(h2.request_started(true));
        let ended = clock::now();
        h2.bytes_read();
        assert_eq!(h2.read_deadline(), Some((ended + Duration::from_secs(60), TimeoutStage::Idle)));
    }
}
