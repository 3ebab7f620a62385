//! Streaming body wrappers. Bodies are never buffered whole: frames pass
//! through as they arrive, with an idle timeout between frames and, for
//! fenced writes, the per-resource guard held until the last frame. A
//! request body of unknown length is read ahead up to [`READ_AHEAD_BYTES`]
//! before anything is forwarded, so a small body too large for the limit,
//! or one the client is too slow to send, is refused while nothing has gone
//! upstream.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use http_body_util::combinators::BoxBody;
use tokio::time::Sleep;

use crate::core::clock::{self, Instant};

/// How much of a request body of unknown length (chunked HTTP/1, HTTP/2
/// without `content-length`) is read before anything is forwarded.
pub(crate) const READ_AHEAD_BYTES: usize = 64 * 1024;

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

/// The client was too slow sending its request body.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClientBodyTimeout {
    /// One pause was longer than `timeouts.body_idle`.
    #[error("the client paused its request body for longer than timeouts.body_idle ({0:?})")]
    Idle(Duration),
    /// The waits for its data added up to more than `timeouts.request_body`.
    #[error("the client took longer than timeouts.request_body ({0:?}) to send its request body")]
    Total(Duration),
}

/// The client's request body: fails when one pause is longer than `idle`
/// or when the time spent waiting for its data adds up to more than
/// `total`. Time during which the body is not polled (the proxy waiting for
/// the guard, an upstream reading slowly) does not count against the client.
pub(crate) struct ClientBody<B> {
    inner: B,
    idle: Duration,
    total: Duration,
    waited: Duration,
    waiting_since: Option<Instant>,
    sleep: Pin<Box<Sleep>>,
    deadline: Option<Instant>,
}

impl<B> ClientBody<B> {
    pub(crate) fn new(inner: B, idle: Duration, total: Duration) -> Self {
        Self {
            inner,
            idle,
            total,
            waited: Duration::ZERO,
            waiting_since: None,
            sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
            deadline: None,
        }
    }
}

impl<B> Body for ClientBody<B>
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
                if let Some(since) = this.waiting_since.take() {
                    this.waited += clock::now().saturating_duration_since(since);
                }
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => {
                let since = *this.waiting_since.get_or_insert_with(clock::now);
                let left = this.total.saturating_sub(this.waited);
                let (at, err) = if left < this.idle {
                    (since + left, ClientBodyTimeout::Total(this.total))
                } else {
                    (since + this.idle, ClientBodyTimeout::Idle(this.idle))
                };
                if this.deadline != Some(at) {
                    this.sleep.as_mut().reset(at);
                    this.deadline = Some(at);
                }
                ready!(this.sleep.as_mut().poll(cx));
                Poll::Ready(Some(Err(Box::new(err))))
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

/// A body whose first frames were read ahead: those, then the rest.
pub(crate) struct ReadAhead<B> {
    frames: VecDeque<Frame<Bytes>>,
    buffered: u64,
    rest: Option<B>,
}

impl<B> ReadAhead<B>
where
    B: Body<Data = Bytes, Error = BoxError> + Unpin,
{
    /// Reads `body` until it ends or at least `up_to` bytes are buffered.
    /// An error (the limit crossed, the client too slow or gone) is
    /// returned as it is: nothing has been forwarded.
    pub(crate) async fn read(mut body: B, up_to: usize) -> Result<Self, BoxError> {
        let mut frames = VecDeque::new();
        let mut buffered = 0u64;
        let up_to = u64::try_from(up_to).unwrap_or(u64::MAX);
        while buffered < up_to && !body.is_end_stream() {
            match body.frame().await {
                None => return Ok(Self { frames, buffered, rest: None }),
                Some(frame) => {
                    let frame = frame?;
                    if let Some(data) = frame.data_ref() {
                        buffered += data.len() as u64;
                    }
                    frames.push_back(frame);
                }
            }
        }
        let rest = if body.is_end_stream() { None } else { Some(body) };
        Ok(Self { frames, buffered, rest })
    }
}

impl<B> Body for ReadAhead<B>
where
    B: Body<Data = Bytes, Error = BoxError> + Unpin,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(frame) = self.frames.pop_front() {
            return Poll::Ready(Some(Ok(frame)));
        }
        match self.rest.as_mut() {
            None => Poll::Ready(None),
            Some(rest) => Pin::new(rest).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty() && self.rest.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        match &self.rest {
            // Read whole: the upstream gets a content-length.
            None => SizeHint::with_exact(self.buffered),
            Some(rest) => {
                let mut hint = rest.size_hint();
                let buffered: u64 = self.frames.iter().filter_map(|f| f.data_ref()).map(|d| d.len() as u64).sum();
                hint.set_lower(hint.lower().saturating_add(buffered));
                if let Some(upper) = hint.upper() {
                    hint.set_upper(upper.saturating_add(buffered));
                }
                hint
            }
        }
    }
}

/// What went wrong with a request body, found in an error's source chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyFailure {
    /// It grew past `limits.max_request_body_bytes`.
    TooLarge,
    /// The client was too slow ([`ClientBodyTimeout`]).
    TooSlow,
}

impl BodyFailure {
    /// Looks through `err` and its sources.
    pub(crate) fn of(err: &(dyn std::error::Error + 'static)) -> Option<Self> {
        let mut next = Some(err);
        while let Some(e) = next {
            if e.is::<http_body_util::LengthLimitError>() {
                return Some(Self::TooLarge);
            }
            if e.is::<ClientBodyTimeout>() {
                return Some(Self::TooSlow);
            }
            next = e.source();
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::{Full, Limited, StreamBody};

    use super::*;

    fn chunks(n: usize, size: usize) -> impl Body<Data = Bytes, Error = BoxError> + Unpin {
        let frames = (0..n).map(move |_| Ok::<_, BoxError>(Frame::data(Bytes::from(vec![b'x'; size]))));
        StreamBody::new(futures::stream::iter(frames))
    }

    #[tokio::test]
    async fn a_small_body_is_read_whole_and_gets_an_exact_length() {
        let body = ReadAhead::read(chunks(3, 100), READ_AHEAD_BYTES).await.unwrap();
        assert_eq!(body.size_hint().exact(), Some(300));
        assert_eq!(body.collect().await.unwrap().to_bytes().len(), 300);
    }

    #[tokio::test]
    async fn a_large_body_is_read_ahead_then_streamed() {
        let body = ReadAhead::read(chunks(100, 1024), 4096).await.unwrap();
        assert_eq!(body.buffered, 4096);
        assert!(body.rest.is_some());
        assert_eq!(body.collect().await.unwrap().to_bytes().len(), 100 * 1024);
    }

    #[tokio::test]
    async fn crossing_the_limit_in_the_read_ahead_is_an_error_that_says_so() {
        let limited = Limited::new(chunks(10, 1000), 5000).map_err(BoxError::from);
        let err = ReadAhead::read(limited, READ_AHEAD_BYTES).await.err().expect("over the limit");
        assert_eq!(BodyFailure::of(&*err), Some(BodyFailure::TooLarge));
        let empty = ReadAhead::read(Full::new(Bytes::new()).map_err(|n| match n {}), 10).await.unwrap();
        assert!(empty.is_end_stream());
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_body_fails_when_its_waits_add_up_past_the_total() {
        // One byte every 400 ms: never idle for 1 s, but 10 waits > 2 s.
        let frames = futures::stream::unfold(0, |n| async move {
            tokio::time::sleep(Duration::from_millis(400)).await;
            Some((Ok::<_, BoxError>(Frame::data(Bytes::from_static(b"x"))), n + 1))
        });
        let body = ClientBody::new(StreamBody::new(Box::pin(frames)), Duration::from_secs(1), Duration::from_secs(2));
        let started = clock::now();
        let err = body.collect().await.expect_err("too slow");
        assert_eq!(BodyFailure::of(&*err), Some(BodyFailure::TooSlow));
        assert!(err.to_string().contains("timeouts.request_body"), "{err}");
        assert_eq!(clock::now() - started, Duration::from_secs(2));
    }
}
