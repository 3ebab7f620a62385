//! One system call for what a connection writes in one pass of the
//! runtime (issue 18).
//!
//! HTTP/2 flushes a connection more often than it has to: h2 writes a gRPC
//! answer whose message is 256 bytes or more as two writes (the headers and
//! the message, then the trailers), and hyper's client sends a request in
//! up to three (the headers, the message, an empty end-of-stream frame),
//! because the frames are queued by different tasks. On loopback each write
//! also runs the receiver's TCP path and wakes it, in the sender's time: at
//! the seed rate the leader made ~4,100 `writev` calls a second, ~8 % of its
//! CPU (docs/performance.md, "One write per pass").
//!
//! [`Coalesced`] takes a connection's writes into a buffer and leaves the
//! system call to a writer task of its own, which first lets the worker run
//! every task already queued, so the frames those tasks queue meanwhile go
//! out in the same write. Reads pass through.
//!
//! The limits: at most [`LIMIT`] bytes wait (a write beyond waits for the
//! writer, as a full socket would make it wait); a write error is kept and
//! returned by every later write, flush or shutdown; a shutdown first
//! writes what waits. When the connection is dropped, the writer writes
//! what is left only while the socket takes it, and ends: a peer that
//! stopped reading holds neither the task nor the socket.
//!
//! `poll_flush` returns at once: the bytes are the writer's to send, and
//! it is woken when they arrive. Waiting there for the write would split a
//! pass's frames into several writes again.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf, ReadHalf, WriteHalf};

/// Bytes that may wait for the writer; a write beyond waits until the
/// writer has taken them.
pub(crate) const LIMIT: usize = 256 * 1024;
/// A buffer larger than this after a write is given back, so an idle
/// connection keeps at most two of this size (a snapshot chunk must not pin
/// its size on it).
const KEEP_CAPACITY: usize = 16 * 1024;

/// A connection whose writes are gathered for one system call per pass.
pub(crate) struct Coalesced<S> {
    read: ReadHalf<S>,
    shared: Arc<Shared>,
}

struct Shared(Mutex<State>);

#[derive(Default)]
struct State {
    /// Bytes written by the connection, not yet taken by the writer.
    waiting: Vec<u8>,
    /// The writer, parked until there are bytes, a shutdown or a drop.
    writer: Option<Waker>,
    /// The connection's task, parked for room or for the shutdown.
    conn: Option<Waker>,
    /// The first write error, returned to every later call.
    failed: Option<(io::ErrorKind, String)>,
    shutdown: Shutdown,
    /// The connection side is gone.
    dropped: bool,
}

#[derive(Default, Clone, Copy, PartialEq, Eq)]
enum Shutdown {
    #[default]
    No,
    Asked,
    Done,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves only plain data behind.
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl State {
    fn error(&self) -> Option<io::Error> {
        self.failed.as_ref().map(|(kind, msg)| io::Error::new(*kind, format!("an earlier write failed: {msg}")))
    }
}

impl<S> Coalesced<S>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    /// Wraps `stream`, spawning its writer on the current runtime.
    pub(crate) fn new(stream: S) -> Self {
        let (read, write) = tokio::io::split(stream);
        let shared = Arc::new(Shared(Mutex::new(State::default())));
        tokio::spawn(writer(write, shared.clone()));
        Self { read, shared }
    }
}

impl<S> Coalesced<S> {
    fn accept(&self, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let wake = {
            let mut s = self.shared.lock();
            if let Some(e) = s.error() {
                return Poll::Ready(Err(e));
            }
            if s.shutdown != Shutdown::No {
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::BrokenPipe, "write after shutdown")));
            }
            if s.waiting.len() >= LIMIT {
                s.conn = Some(cx.waker().clone());
                return Poll::Pending;
            }
            let mut n = 0;
            for b in bufs {
                s.waiting.extend_from_slice(b);
                n += b.len();
            }
            if n == 0 {
                return Poll::Ready(Ok(0));
            }
            (s.writer.take(), n)
        };
        if let Some(w) = wake.0 {
            w.wake();
        }
        Poll::Ready(Ok(wake.1))
    }
}

impl<S: AsyncRead> AsyncRead for Coalesced<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.read).poll_read(cx, buf)
    }
}

impl<S> AsyncWrite for Coalesced<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.accept(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.accept(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // The writer was woken when the bytes arrived (see the module docs).
        match self.shared.lock().error() {
            Some(e) => Poll::Ready(Err(e)),
            None => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let writer = {
            let mut s = self.shared.lock();
            if let Some(e) = s.error() {
                return Poll::Ready(Err(e));
            }
            if s.shutdown == Shutdown::Done {
                return Poll::Ready(Ok(()));
            }
            s.shutdown = Shutdown::Asked;
            s.conn = Some(cx.waker().clone());
            s.writer.take()
        };
        if let Some(w) = writer {
            w.wake();
        }
        Poll::Pending
    }
}

impl<S> Drop for Coalesced<S> {
    fn drop(&mut self) {
        let writer = {
            let mut s = self.shared.lock();
            s.dropped = true;
            s.writer.take()
        };
        if let Some(w) = writer {
            w.wake();
        }
    }
}

/// What the writer does next.
enum Work {
    Write,
    Shutdown,
    End,
}

async fn writer<S: AsyncWrite>(mut write: WriteHalf<S>, shared: Arc<Shared>) {
    let mut out = Vec::new();
    loop {
        let work = std::future::poll_fn(|cx| {
            let mut s = shared.lock();
            if !s.waiting.is_empty() {
                Poll::Ready(Work::Write)
            } else if s.shutdown == Shutdown::Asked {
                Poll::Ready(Work::Shutdown)
            } else if s.dropped {
                Poll::Ready(Work::End)
            } else {
                s.writer = Some(cx.waker().clone());
                Poll::Pending
            }
        })
        .await;
        let result = match work {
            Work::End => return,
            Work::Shutdown => std::future::poll_fn(|cx| Pin::new(&mut write).poll_shutdown(cx)).await,
            Work::Write => {
                // Every task that is ready runs first: their frames join these.
                requeue().await;
                let conn = {
                    let mut s = shared.lock();
                    std::mem::swap(&mut s.waiting, &mut out);
                    s.conn.take()
                };
                if let Some(w) = conn {
                    w.wake();
                }
                let r = write_all(&mut write, &out, &shared).await;
                out.clear();
                if out.capacity() > KEEP_CAPACITY {
                    out = Vec::new();
                }
                r
            }
        };
        let (conn, end) = {
            let mut s = shared.lock();
            let end = match (&result, work) {
                (Err(e), _) => {
                    s.failed = Some((e.kind(), e.to_string()));
                    true
                }
                (Ok(()), Work::Shutdown) => {
                    s.shutdown = Shutdown::Done;
                    true
                }
                (Ok(()), _) => false,
            };
            (s.conn.take(), end)
        };
        if let Some(w) = conn {
            w.wake();
        }
        if end {
            return;
        }
    }
}

/// Lets every task already queued on this worker run once, then resumes.
///
/// A task that wakes itself is put at the back of the worker's queue (the
/// runtime treats it as a yield). `tokio::task::yield_now` would also wait
/// for a poll of the I/O driver, an extra `epoll_wait` per write here.
async fn requeue() {
    let mut queued = false;
    std::future::poll_fn(|cx| {
        if queued {
            return Poll::Ready(());
        }
        queued = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await;
}

/// Writes all of `bytes`; once the connection is dropped, gives up as soon
/// as the socket would make it wait.
async fn write_all<S: AsyncWrite>(write: &mut WriteHalf<S>, bytes: &[u8], shared: &Shared) -> io::Result<()> {
    let mut at = 0;
    std::future::poll_fn(|cx| {
        while at < bytes.len() {
            match Pin::new(&mut *write).poll_write(cx, &bytes[at..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => at += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {
                    let mut s = shared.lock();
                    if s.dropped {
                        return Poll::Ready(Err(io::Error::other(
                            "connection dropped before its last bytes were taken",
                        )));
                    }
                    s.writer = Some(cx.waker().clone());
                    return Poll::Pending;
                }
            }
        }
        Poll::Ready(Ok(()))
    })
    .await?;
    std::future::poll_fn(|cx| Pin::new(&mut *write).poll_flush(cx)).await
}

/// A lazily connected channel to `endpoint` whose connections are
/// [`Coalesced`] (TLS, when the endpoint has it, runs above them); the
/// endpoint's connect timeout applies.
pub(crate) fn channel(endpoint: &tonic::transport::Endpoint) -> tonic::transport::Channel {
    endpoint.connect_with_connector_lazy(tower::service_fn(connect))
}

async fn connect(uri: http::Uri) -> io::Result<hyper_util::rt::TokioIo<Coalesced<tokio::net::TcpStream>>> {
    let host = uri.host().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("no host in {uri}")))?;
    // An IPv6 literal keeps its brackets in the URI.
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = uri.port_u16().unwrap_or(if uri.scheme_str() == Some("https") { 443 } else { 80 });
    let tcp = tokio::net::TcpStream::connect((host, port)).await?;
    tcp.set_nodelay(true)?;
    Ok(hyper_util::rt::TokioIo::new(Coalesced::new(tcp)))
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::pin::Pin;
    use std::sync::{Arc, Mutex};
    use std::task::{Context, Poll};
    use std::time::Duration;

    use proptest::prelude::*;
    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

    use super::{Coalesced, LIMIT};

    /// A socket that records each write call and never has bytes to read.
    #[derive(Clone, Default)]
    struct Recorder(Arc<Mutex<Vec<Vec<u8>>>>);

    impl AsyncRead for Recorder {
        fn poll_read(self: Pin<&mut Self>, _: &mut Context<'_>, _: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
            Poll::Pending
        }
    }

    impl AsyncWrite for Recorder {
        fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
            self.0.lock().unwrap().push(buf.to_vec());
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn what_a_pass_writes_and_flushes_goes_out_in_one_write() {
        let socket = Recorder::default();
        let mut conn = Coalesced::new(socket.clone());
        // As h2 answers a call: headers and message, a flush, the trailers, a flush.
        conn.write_all(b"headers+message").await.unwrap();
        conn.flush().await.unwrap();
        conn.write_all(b"|trailers").await.unwrap();
        conn.flush().await.unwrap();
        settle().await;
        assert_eq!(*socket.0.lock().unwrap(), vec![b"headers+message|trailers".to_vec()]);

        // The next pass's bytes are a write of their own.
        conn.write_all(b"next").await.unwrap();
        conn.flush().await.unwrap();
        settle().await;
        assert_eq!(socket.0.lock().unwrap().len(), 2);
        assert_eq!(socket.0.lock().unwrap()[1], b"next");
    }

    #[tokio::test]
    async fn frames_a_task_queued_after_the_writer_was_woken_join_its_write() {
        let socket = Recorder::default();
        let conn = Arc::new(Mutex::new(Coalesced::new(socket.clone())));
        let write = |conn: &Mutex<Coalesced<Recorder>>, bytes: &'static [u8]| {
            let mut conn = conn.lock().unwrap();
            futures::FutureExt::now_or_never(conn.write_all(bytes)).expect("taken at once").unwrap();
        };
        // The request's headers wake the writer; the task with its message
        // is queued behind it (as hyper's body task is).
        write(&conn, b"headers");
        let body = tokio::spawn({
            let conn = conn.clone();
            async move { write(&conn, b"|message") }
        });
        body.await.unwrap();
        settle().await;
        assert_eq!(*socket.0.lock().unwrap(), vec![b"headers|message".to_vec()]);
    }

    #[tokio::test]
    async fn a_shutdown_writes_what_waits_then_ends_the_stream() {
        let (near, mut far) = tokio::io::duplex(1024);
        let mut conn = Coalesced::new(near);
        conn.write_all(b"last words").await.unwrap();
        conn.shutdown().await.unwrap();
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), far.read_to_end(&mut got)).await.unwrap().unwrap();
        assert_eq!(got, b"last words");
        let e = conn.write_all(b"more").await.expect_err("a write after the shutdown");
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe, "{e}");
    }

    #[tokio::test]
    async fn a_dropped_connection_whose_peer_stopped_reading_frees_its_writer() {
        let (near, mut far) = tokio::io::duplex(64);
        let mut conn = Coalesced::new(near);
        conn.write_all(&[7u8; 10_000]).await.unwrap();
        conn.flush().await.unwrap();
        settle().await;
        let shared = Arc::downgrade(&conn.shared);
        drop(conn);
        tokio::time::timeout(Duration::from_secs(10), async {
            while shared.strong_count() > 0 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the writer ends although its bytes were not all taken");
        // The socket is closed: the peer gets what fitted, then the end.
        let mut got = Vec::new();
        far.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, vec![7u8; 64]);
    }

    #[tokio::test]
    async fn a_write_error_is_returned_by_every_later_call() {
        let (near, far) = tokio::io::duplex(64);
        drop(far);
        let mut conn = Coalesced::new(near);
        conn.write_all(b"into the void").await.unwrap();
        let e = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if let Err(e) = conn.write_all(b"x").await {
                    return e;
                }
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the writer's error reaches the connection");
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe, "{e}");
        assert!(e.to_string().contains("an earlier write failed"), "{e}");
        assert!(conn.flush().await.is_err());
        assert!(conn.shutdown().await.is_err());
    }

    #[tokio::test]
    async fn more_than_the_limit_waits_for_the_writer() {
        let (near, mut far) = tokio::io::duplex(4096);
        let mut conn = Coalesced::new(near);
        let bytes: Vec<u8> = (0..3 * LIMIT).map(|i| i as u8).collect();
        let sent = bytes.clone();
        let writing = tokio::spawn(async move {
            conn.write_all(&sent).await.unwrap();
            conn.shutdown().await.unwrap();
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!writing.is_finished(), "the peer reads nothing, so the writes wait beyond the limit");
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(30), far.read_to_end(&mut got)).await.unwrap().unwrap();
        writing.await.unwrap();
        assert!(got == bytes, "the stream arrives whole and in order");
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        /// Any mix of writes, flushes and passes, through a socket that
        /// takes a few bytes at a time, arrives whole and in order.
        #[test]
        fn the_stream_arrives_whole_and_in_order(
            steps in proptest::collection::vec((1usize..3000, 0u8..4), 1..60),
            socket_room in 1usize..5000,
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let (near, mut far) = tokio::io::duplex(socket_room);
                let reader = tokio::spawn(async move {
                    let mut got = Vec::new();
                    far.read_to_end(&mut got).await.map(|_| got)
                });
                let mut conn = Coalesced::new(near);
                let mut sent = Vec::new();
                for (i, (len, then)) in steps.into_iter().enumerate() {
                    let chunk: Vec<u8> = (0..len).map(|j| (i * 31 + j) as u8).collect();
                    conn.write_all(&chunk).await.unwrap();
                    sent.extend_from_slice(&chunk);
                    match then {
                        0 => conn.flush().await.unwrap(),
                        1 => tokio::task::yield_now().await,
                        _ => {}
                    }
                }
                conn.shutdown().await.unwrap();
                let got = tokio::time::timeout(Duration::from_secs(30), reader).await.unwrap().unwrap().unwrap();
                prop_assert!(got == sent, "{} bytes sent, {} received", sent.len(), got.len());
                Ok(())
            })?;
        }
    }
}
