//! Streaming body wrappers. Bodies are never buffered whole: frames pass
//! through as they arrive, with an idle timeout between frames and, for
//! fenced writes, the per-resource guard held until the last frame.

use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::BoxBody;
use tokio::time::Sleep;

/// The error type of every body the proxy handles.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The response body the proxy returns to clients.
pub type ProxyBody = BoxBody<Bytes, BoxError>;

/// A body made an idle pause longer than allowed.
#[derive(Debug, thiserror::Error)]
#[error("no body data for {0:?}; giving up on the stream")]
pub(crate) struct BodyIdleTimeout(Duration);

/// Fails the stream when no frame arrives for `timeout`.
pub(crate) struct IdleTimeoutBody<B> {
    inner: B,
    timeout: Duration,
    sleep: Pin<Box<Sleep>>,
}

impl<B> IdleTimeoutBody<B> {
    pub(crate) fn new(inner: B, timeout: Duration) -> Self {
        Self { inner, timeout, sleep: Box::pin(tokio::time::sleep(timeout)) }
    }
}

impl<B> Body for IdleTimeoutBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                let deadline = tokio::time::Instant::now() + this.timeout;
                this.sleep.as_mut().reset(deadline);
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => {
                ready!(this.sleep.as_mut().poll(cx));
                Poll::Ready(Some(Err(Box::new(BodyIdleTimeout(this.timeout)))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Holds `guard` until the body ends, fails, or is dropped (client gone).
pub(crate) struct GuardedBody<B, G> {
    inner: B,
    guard: Option<G>,
}

impl<B, G> GuardedBody<B, G> {
    pub(crate) fn new(inner: B, guard: G) -> Self {
        Self { inner, guard: Some(guard) }
    }
}

impl<B, G> Body for GuardedBody<B, G>
where
    B: Body<Data = Bytes, Error = BoxError> + Unpin,
    G: Unpin,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            this.guard = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
