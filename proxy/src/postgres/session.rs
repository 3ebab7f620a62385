//! One relayed PostgreSQL connection after authentication: two pumps, one
//! per direction, and what they share (G1–G8).
//!
//! The **client pump** reads the client's messages in order. It forwards
//! the original bytes, batched, except where a rule refuses one: then it
//! sends PostgreSQL a statement that fails with a syntax error in its
//! place, and the upstream pump replaces that error with the sidecar's own
//! (`FN…`). PostgreSQL's own state machine stays authoritative: a refusal
//! inside a transaction aborts it, an extended-protocol refusal skips to
//! the next Sync, exactly as if PostgreSQL had refused the statement.
//!
//! The **upstream pump** relays PostgreSQL's messages and reads the few it
//! needs: ReadyForQuery (the transaction status, and the end of a unit of
//! work), ErrorResponse (the injected refusals, a COPY that failed),
//! CopyInResponse and ParameterStatus (`standard_conforming_strings`).
//!
//! **G5, the transaction as the unit in flight.** The first fenced message
//! takes the resource's shared guard; it is released at a ReadyForQuery
//! reporting idle (`I`) once PostgreSQL has answered every Sync, Query and
//! FunctionCall forwarded and no fenced message followed the last of them.
//! The count is exact for well-behaved clients; where PostgreSQL may drop
//! a Sync (a Sync sent inside COPY-in mode), the Sync is counted as "maybe"
//! and the guard is kept until every maybe has been answered too: a
//! misbehaving client can only keep its guard longer (until a higher token
//! ends it), never lose it early.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::{Mutex as AsyncMutex, Notify, OwnedRwLockWriteGuard};
use tokio_util::sync::CancellationToken;

use crate::core::clock;
use crate::core::fence::{AdmitError, FenceCore, Rejection, RejectionContext};
use crate::core::metrics::{TimeoutStage, UpstreamError};
use crate::core::names::{FencingToken, ResourceName};
use crate::core::rejections::RejectReason;
use crate::core::state::{InFlight, ResourceState, Settled};
use crate::postgres::backends::{AdminConn, Backends};
use crate::postgres::config::PostgresConfig;
use crate::postgres::protocol::{
    self, BIND_PREFIX_LIMIT, FrontendKind, Header, ProtocolError, Severity, bind_names, error_fields, execute_portal,
    frontend_kind, parse_message, query_message, target,
};
use crate::postgres::sql::{self, StatementKind};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The `FN` SQLSTATEs of DESIGN §4a.
pub(crate) mod sqlstate {
    /// Stale token (G4).
    pub(crate) const STALE: &str = "FN001";
    /// No (valid) token on a fenced connection (G3).
    pub(crate) const NO_TOKEN: &str = "FN002";
    /// Outcome unknown (G7).
    pub(crate) const OUTCOME_UNKNOWN: &str = "FN003";
    /// Busy or indeterminate: retry later.
    pub(crate) const RETRY: &str = "FN004";
    /// Token change inside a transaction (G2).
    pub(crate) const TOKEN_CHANGE: &str = "FN005";
    /// Refused statement (G8 and other policy refusals).
    pub(crate) const REFUSED: &str = "FN006";
}

/// The `FN` code a rejection answers with.
pub(crate) fn sqlstate_of(reason: RejectReason) -> &'static str {
    use RejectReason as R;
    match reason {
        R::StaleToken => sqlstate::STALE,
        R::MissingToken
        | R::MalformedToken
        | R::UnsignedToken
        | R::BadSignature
        | R::UnknownKey
        | R::ExpiredKey
        | R::KeyNotYetValid
        | R::WrongResource => sqlstate::NO_TOKEN,
        R::Indeterminate | R::Busy | R::TooManyResources => sqlstate::RETRY,
        R::TokenChangeInTransaction => sqlstate::TOKEN_CHANGE,
        R::RefusedStatement
        | R::UnsupportedStatement
        | R::ResourceMismatch
        | R::TokenJumpTooLarge
        | R::NoRoute
        | R::AmbiguousRequest
        | R::InvalidResource
        | R::BodyTooLarge => sqlstate::REFUSED,
    }
}

/// The HTTP status the rejection log records for a PostgreSQL refusal, so
/// `fencer rejections` reads the same for both protocols.
fn status_of(reason: RejectReason) -> u16 {
    match reason {
        RejectReason::StaleToken | RejectReason::TokenChangeInTransaction => 409,
        RejectReason::MissingToken => 428,
        RejectReason::Indeterminate | RejectReason::Busy | RejectReason::TooManyResources => 503,
        RejectReason::MalformedToken | RejectReason::UnsupportedStatement | RejectReason::ResourceMismatch => 400,
        RejectReason::TokenJumpTooLarge => 422,
        _ => 403,
    }
}

/// Everything one session needs from the sidecar.
pub(crate) struct SessionEnv {
    pub(crate) core: Arc<FenceCore>,
    pub(crate) config: Arc<PostgresConfig>,
    pub(crate) backends: Arc<Backends>,
    pub(crate) admin: Option<Arc<AdminConn>>,
    pub(crate) next_marker: AtomicU64,
}

/// Who the session is, for the rejection log and the guard registry.
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    pub(crate) connection: u64,
    pub(crate) peer: SocketAddr,
    /// `user@peer`, or the client certificate's identity.
    pub(crate) caller: String,
    pub(crate) user: String,
    pub(crate) database: String,
    pub(crate) resource: ResourceName,
    pub(crate) read_only: bool,
    /// The backend's process id and cancel key, from BackendKeyData.
    pub(crate) backend_pid: Option<u32>,
}

/// The token a connection declared (G2), already verified (P7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Declared(pub(crate) FencingToken);

/// The held shared guard, registered so a higher token can end its
/// backend (G5).
struct Held {
    in_flight: Option<InFlight>,
    state: Arc<ResourceState>,
    backends: Arc<Backends>,
    connection: u64,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.backends.release(&self.state.name, self.connection);
        drop(self.in_flight.take());
    }
}

/// A refusal sent to PostgreSQL as a failing statement; its error is
/// replaced with `error` (G1: PostgreSQL's state stays authoritative).
struct Pending {
    marker: String,
    error: Bytes,
    /// Producers forwarded before it: it belongs to the unit answered by
    /// ReadyForQuery number `producers_before + 1`.
    producers_before: u64,
}

/// What both pumps share; locked briefly, never across an await.
struct Shared {
    /// Sync, Query and FunctionCall messages forwarded (each answered by
    /// one ReadyForQuery) and those PostgreSQL may ignore (see module doc).
    producers: u64,
    /// When PostgreSQL last went from owing nothing to owing an answer.
    outstanding_since: clock::Instant,
    maybe_producers: u64,
    ready_for_query: u64,
    /// A fenced message was forwarded after the last producer.
    fenced_since_producer: bool,
    /// The unit (ReadyForQuery number) that ends the last fenced unit.
    last_fenced_unit: u64,
    last_status: u8,
    guard: Option<Held>,
    pending: VecDeque<Pending>,
    /// An Execute of `COPY … FROM STDIN` was forwarded and PostgreSQL has
    /// not said yet whether it entered COPY-in mode: producers forwarded
    /// before it, and whether only Flush followed it.
    copy_pending: Option<(u64, bool)>,
    /// PostgreSQL is (or may be) in COPY-in mode.
    in_copy_in: bool,
    standard_conforming_strings: bool,
}

impl Shared {
    fn units(&self) -> u64 {
        self.producers + self.maybe_producers
    }

    /// PostgreSQL owes an answer (a ReadyForQuery).
    fn outstanding(&self) -> bool {
        self.ready_for_query < self.units()
    }

    /// Every fenced message forwarded has been answered.
    fn fenced_answered(&self) -> bool {
        !self.fenced_since_producer && self.ready_for_query >= self.last_fenced_unit
    }

    /// Nothing in flight, no transaction open: the session may close.
    fn idle(&self) -> bool {
        !self.outstanding()
            && !self.fenced_since_producer
            && self.guard.is_none()
            && self.last_status == b'I'
            && !self.in_copy_in
    }

    /// Fenced work may have reached PostgreSQL without its outcome known.
    /// A transaction whose statements were all answered is not: PostgreSQL
    /// rolls it back when the connection closes.
    fn work_in_doubt(&self) -> bool {
        self.guard.is_some() && !self.fenced_answered()
    }
}

/// Why a session ended.
#[derive(Debug)]
pub(crate) enum End {
    /// The client closed (Terminate or EOF).
    ClientClosed,
    /// The client sent bytes the protocol does not allow.
    ClientProtocol(ProtocolError),
    /// The client's socket failed.
    ClientIo(std::io::Error),
    /// The client sent nothing for `idle_timeout`.
    Idle,
    /// PostgreSQL closed the connection.
    UpstreamClosed,
    /// PostgreSQL's socket failed.
    UpstreamIo(std::io::Error),
    /// PostgreSQL said nothing for `statement_timeout` while a statement was
    /// outstanding.
    UpstreamTimeout(Duration),
    /// PostgreSQL's bytes do not parse.
    UpstreamProtocol(ProtocolError),
    /// A session limit (prepared statements) was passed.
    Limit(String),

    /// The sidecar is shutting down and the session was idle.
    Drained,
    /// The grace period is over.
    Aborted,
}

/// Per statement or portal: what executing it means.
#[derive(Debug, Clone)]
enum Class {
    /// A declaration (SET/RESET fencer.token, RESET ALL, DISCARD ALL, SET
    /// fencer.resource): applied when executed.
    Declaration(StatementKind),
    /// BEGIN / START TRANSACTION: needs a token, takes no guard.
    Begin,
    /// ROLLBACK / ABORT (not ROLLBACK PREPARED): it can only undo, so it
    /// needs no token and takes no guard; a fenced-out client can always
    /// leave its transaction.
    Rollback,
    /// COPY … FROM STDIN: fenced, and COPY-in may follow.
    CopyFromStdin,
    /// Everything else: fenced.
    Fenced(&'static str),
}

/// ROLLBACK / ABORT (not ROLLBACK PREPARED, a two-phase statement): it can
/// only undo, so it needs no token and takes no guard, and a fenced-out
/// client can always leave its transaction. COMMIT is not among them: it
/// makes the transaction's writes durable, so it is fenced like a write.
fn only_undoes(kind: &StatementKind, keyword: &str) -> bool {
    matches!(kind, StatementKind::Other) && matches!(keyword, "ROLLBACK" | "ABORT")
}

impl Class {
    fn of(kind: StatementKind, keyword: &'static str) -> Self {
        match kind {
            k @ (StatementKind::SetToken(_)
            | StatementKind::ResetToken
            | StatementKind::SetResource(_)
            | StatementKind::ResetResource
            | StatementKind::ResetAll
            | StatementKind::DiscardAll) => Self::Declaration(k),
            StatementKind::Begin => Self::Begin,
            StatementKind::CopyFromStdin => Self::CopyFromStdin,
            ref k if only_undoes(k, keyword) => Self::Rollback,
            _ => Self::Fenced(keyword),
        }
    }

    fn keyword(&self) -> &'static str {
        match self {
            Self::Declaration(StatementKind::DiscardAll) => "DISCARD",
            Self::Declaration(StatementKind::ResetAll | StatementKind::ResetToken | StatementKind::ResetResource) => {
                "RESET"
            }
            Self::Declaration(_) => "SET",
            Self::Begin => "BEGIN",
            Self::Rollback => "ROLLBACK",
            Self::CopyFromStdin => "COPY",
            Self::Fenced(k) => k,
        }
    }
}

type ClientWriter<C> = Arc<AsyncMutex<WriteHalf<C>>>;

/// One session: its environment, identity and the state both pumps share.
pub(crate) struct Session {
    env: Arc<SessionEnv>,
    id: Identity,
    shared: Mutex<Shared>,
    changed: Notify,
}

impl Session {
    pub(crate) fn new(env: Arc<SessionEnv>, id: Identity, standard_conforming_strings: bool) -> Arc<Self> {
        Arc::new(Self {
            env,
            id,
            shared: Mutex::new(Shared {
                producers: 0,
                outstanding_since: clock::now(),
                maybe_producers: 0,
                ready_for_query: 0,
                fenced_since_producer: false,
                last_fenced_unit: 0,
                last_status: b'I',
                guard: None,
                pending: VecDeque::new(),
                copy_pending: None,
                in_copy_in: false,
                standard_conforming_strings,
            }),
            changed: Notify::new(),
        })
    }

    /// Relays until the session ends; then settles what it leaves behind
    /// (G7) and closes both sides.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn run<C, U>(
        self: Arc<Self>,
        client: C,
        client_buf: BytesMut,
        upstream: U,
        token: Option<Declared>,
        drain: CancellationToken,
        abort: CancellationToken,
    ) where
        C: AsyncRead + AsyncWrite + Send + 'static,
        U: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (client_read, client_write) = tokio::io::split(client);
        let (upstream_read, upstream_write) = tokio::io::split(upstream);
        let client_write: ClientWriter<C> = Arc::new(AsyncMutex::new(client_write));
        let mut pump = ClientPump {
            session: self.clone(),
            reader: client_read,
            buf: client_buf,
            out: BytesMut::new(),
            upstream: upstream_write,
            token,
            statements: HashMap::new(),
            portals: HashMap::new(),
            state: None,
        };
        let mut back = UpstreamPump {
            session: self.clone(),
            reader: upstream_read,
            buf: BytesMut::with_capacity(8192),
            client: client_write.clone(),
        };
        let end = tokio::select! {
            end = pump.run(&drain) => end,
            end = back.run() => end,
            () = abort.cancelled() => End::Aborted,
        };
        self.finish(end, pump.upstream, client_write).await;
    }

    /// After the session: an unknown outcome leaves the resource
    /// indeterminate (G7) before the guard goes; the client hears why.
    async fn finish<C, W>(&self, end: End, mut upstream: W, client: ClientWriter<C>)
    where
        C: AsyncWrite + Send,
        W: AsyncWrite + Unpin,
    {
        let id = &self.id;
        let (in_doubt, held) = {
            let mut s = lock(&self.shared);
            (s.work_in_doubt(), s.guard.take())
        };
        let core = &self.env.core;
        let message: Option<Bytes> = match &end {
            End::ClientClosed | End::UpstreamClosed => None,
            End::ClientIo(e) => {
                tracing::debug!(peer = %id.peer, error = %e, "client connection failed");
                None
            }
            End::ClientProtocol(e) => {
                tracing::warn!(peer = %id.peer, error = %e, "closing a PostgreSQL connection: malformed client message");
                // What PostgreSQL answers: program_limit_exceeded for a
                // message above a limit, protocol_violation otherwise.
                let code = if matches!(e, ProtocolError::TooLarge { .. }) { "54000" } else { "08P01" };
                Some(protocol::error_response(Severity::Fatal, code, &e.to_string(), None, None))
            }
            End::UpstreamProtocol(e) => {
                tracing::error!(peer = %id.peer, error = %e, "closing a PostgreSQL connection: malformed upstream message");
                None
            }
            End::Limit(why) => {
                tracing::warn!(peer = %id.peer, %why, "closing a PostgreSQL connection at a limit");
                Some(protocol::error_response(Severity::Fatal, "54000", why, None, None))
            }
            End::Idle => {
                core.metrics.timed_out(TimeoutStage::Idle);
                Some(protocol::error_response(
                    Severity::Fatal,
                    "57P05",
                    "terminating connection due to the fencer sidecar's idle_timeout",
                    None,
                    None,
                ))
            }
            End::Drained | End::Aborted => Some(protocol::error_response(
                Severity::Fatal,
                "57P01",
                "terminating connection: the fencer sidecar is shutting down",
                None,
                Some("reconnect; another sidecar instance or this one after its restart will serve you"),
            )),
            End::UpstreamIo(_) | End::UpstreamTimeout(_) => None,
        };
        if matches!(end, End::Drained) {
            // A polite goodbye to PostgreSQL; nothing was in flight.
            let _ = upstream.write_all(&protocol::message(b'X', &[])).await;
        }
        let _ = upstream.shutdown().await;
        drop(upstream);

        let mut message = message;
        if in_doubt && let Some(held) = &held {
            let reason = match &end {
                End::UpstreamTimeout(t) => {
                    format!("PostgreSQL said nothing for {t:?} (statement_timeout) with a statement outstanding")
                }
                End::UpstreamIo(e) => format!("the connection to PostgreSQL failed with a statement outstanding: {e}"),
                End::UpstreamClosed => "PostgreSQL closed the connection with a statement outstanding".to_owned(),
                End::Aborted => "the sidecar shut down with a statement outstanding".to_owned(),
                _ => "the client went away with a statement outstanding".to_owned(),
            };
            core.metrics.upstream_error(UpstreamError::OutcomeUnknown);
            tracing::warn!(resource = %held.state.name, backend = ?id.backend_pid, %reason, "outcome unknown (G7)");
            let settled: Option<Settled> = match (&self.env.admin, id.backend_pid) {
                // Confirmed gone through the admin connection.
                (Some(admin), Some(pid)) => Some(Box::pin(admin.clone().until_gone(pid))),
                // Without it, the quarantine starts now: the socket is closed.
                _ => None,
            };
            core.resources.mark_unknown(&held.state, reason.clone(), settled);
            if !matches!(end, End::ClientClosed | End::ClientIo(_)) {
                message = Some(protocol::error_response(
                    Severity::Fatal,
                    sqlstate::OUTCOME_UNKNOWN,
                    &format!("the outcome of the last statement on resource {} is unknown: {reason}", held.state.name),
                    Some("the transaction may or may not have committed; the connection is closed"),
                    Some("check the data before retrying; higher tokens get FN004 until the resource is settled"),
                ));
            }
        }
        // Marked indeterminate (if it was) before the guard goes.
        drop(held);
        if let Some(pid) = id.backend_pid {
            self.env.backends.forget_key(pid);
        }
        let mut w = client.lock().await;
        if let Some(m) = message {
            let _ = tokio::time::timeout(Duration::from_secs(1), w.write_all(&m)).await;
        }
        let _ = w.shutdown().await;
    }

    /// Waits until `cond` holds on the shared state.
    async fn wait_until(&self, cond: impl Fn(&Shared) -> bool) {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if cond(&lock(&self.shared)) {
                return;
            }
            notified.await;
        }
    }

    fn context(&self, keyword: &str, token: Option<u64>) -> RejectionContext {
        RejectionContext {
            method: keyword.to_owned(),
            caller: self.id.caller.clone(),
            request_id: self.env.core.next_request_id(),
            route: Some(format!("database {}", self.id.database)),
            resource: Some(self.id.resource.to_string()),
            token,
        }
    }
}

/// The statement PostgreSQL is sent in place of a refused one: it fails
/// with a syntax error naming `marker`, which the upstream pump replaces.
fn refusal_marker(env: &SessionEnv, code: &str) -> String {
    let n = env.next_marker.fetch_add(1, Ordering::Relaxed);
    format!("fencer_refused_{code}_{n}")
}

/// How a refused message is replaced: as a simple Query (a refused Query or
/// FunctionCall: one ReadyForQuery follows) or as a Parse of a named
/// statement that fails (an extended-protocol message: PostgreSQL then
/// skips to the next Sync).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Replace {
    Query,
    Parse,
}

struct ClientPump<C, U> {
    session: Arc<Session>,
    reader: ReadHalf<C>,
    buf: BytesMut,
    /// Bytes for PostgreSQL not written yet.
    out: BytesMut,
    upstream: WriteHalf<U>,
    token: Option<Declared>,
    statements: HashMap<Bytes, Class>,
    portals: HashMap<Bytes, Class>,
    state: Option<Arc<ResourceState>>,
}

/// Flush to PostgreSQL once this much is buffered.
const FLUSH_AT: usize = 64 * 1024;

impl<C, U> ClientPump<C, U>
where
    C: AsyncRead + AsyncWrite,
    U: AsyncRead + AsyncWrite,
{
    async fn run(&mut self, drain: &CancellationToken) -> End {
        loop {
            match self.next(drain).await {
                Ok(()) => {}
                Err(end) => {
                    let _ = self.flush().await;
                    return end;
                }
            }
        }
    }

    async fn flush(&mut self) -> Result<(), End> {
        if !self.out.is_empty() {
            let out = self.out.split();
            self.upstream.write_all(&out).await.map_err(End::UpstreamIo)?;
        }
        Ok(())
    }

    fn send(&mut self, bytes: &[u8]) {
        self.out.extend_from_slice(bytes);
    }

    /// Reads more from the client, flushing what is buffered first. While
    /// PostgreSQL has answered everything the idle timeout applies, and a
    /// shutdown ends the session.
    async fn fill(&mut self, drain: &CancellationToken) -> Result<(), End> {
        self.flush().await?;
        let idle_timeout = self.session.env.config.idle_timeout;
        if self.buf.capacity() > 256 * 1024 && self.buf.is_empty() {
            self.buf = BytesMut::with_capacity(8192);
        }
        self.buf.reserve(8192);
        let session = self.session.clone();
        let read = loop {
            // A shutdown closes the session once it is idle, not before.
            let notified = session.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let idle = lock(&session.shared).idle();
            if idle && drain.is_cancelled() && self.buf.is_empty() {
                return Err(End::Drained);
            }
            let deadline = idle.then(|| tokio::time::sleep(idle_timeout));
            tokio::select! {
                r = self.reader.read_buf(&mut self.buf) => break r,
                () = async { match deadline { Some(d) => d.await, None => std::future::pending().await } } => {
                    return Err(End::Idle);
                }
                () = drain.cancelled(), if !drain.is_cancelled() => {}
                () = notified, if drain.is_cancelled() => {}
            }
        };
        match read {
            Ok(0) => Err(End::ClientClosed),
            Ok(_) => Ok(()),
            Err(e) => Err(End::ClientIo(e)),
        }
    }

    async fn fill_to(&mut self, n: usize, drain: &CancellationToken) -> Result<(), End> {
        while self.buf.len() < n {
            self.fill(drain).await?;
        }
        Ok(())
    }

    /// One message.
    async fn next(&mut self, drain: &CancellationToken) -> Result<(), End> {
        let header = loop {
            match Header::parse(&self.buf).map_err(End::ClientProtocol)? {
                Some(h) => break h,
                None => self.fill(drain).await?,
            }
        };
        let limits = &self.session.env.config;
        let kind = frontend_kind(header.tag, limits.max_statement_bytes).map_err(End::ClientProtocol)?;
        if !matches!(header.tag, b'H' | b'S')
            && let Some((_, only_flush)) = lock(&self.session.shared).copy_pending.as_mut()
        {
            // Anything but Flush or Sync after a COPY's Execute may end
            // COPY-in mode at PostgreSQL, so a later Sync is only "maybe".
            *only_flush = false;
        }
        match kind {
            FrontendKind::Whole { limit } => {
                if header.body_len > limit {
                    return Err(End::ClientProtocol(ProtocolError::TooLarge {
                        tag: char::from(header.tag),
                        len: header.body_len,
                        limit,
                    }));
                }
                self.fill_to(header.total(), drain).await?;
                let msg = self.buf.split_to(header.total()).freeze();
                self.whole(header.tag, msg).await
            }
            FrontendKind::Prefix => {
                if header.body_len > protocol::LARGE_MESSAGE_LIMIT {
                    return Err(End::ClientProtocol(ProtocolError::TooLarge {
                        tag: 'B',
                        len: header.body_len,
                        limit: protocol::LARGE_MESSAGE_LIMIT,
                    }));
                }
                let want = header.total().min(5 + BIND_PREFIX_LIMIT);
                self.fill_to(want, drain).await?;
                let (portal, statement) = match bind_names(&self.buf[5..want]) {
                    Some((p, s)) => (Bytes::copy_from_slice(p), Bytes::copy_from_slice(s)),
                    None => {
                        return Err(End::ClientProtocol(ProtocolError::Body {
                            tag: 'B',
                            what: "the portal and statement names are not terminated within 2 KiB",
                        }));
                    }
                };
                let forward = self.bind(portal, statement).await?;
                self.pass(header.total(), forward, drain).await
            }
            FrontendKind::Streamed => {
                // FunctionCall: fenced on its header alone.
                if header.body_len > protocol::LARGE_MESSAGE_LIMIT {
                    return Err(End::ClientProtocol(ProtocolError::TooLarge {
                        tag: 'F',
                        len: header.body_len,
                        limit: protocol::LARGE_MESSAGE_LIMIT,
                    }));
                }
                let forward = self.fenced_message(Class::Fenced("(FunctionCall)"), Replace::Query).await?;
                self.pass(header.total(), forward, drain).await?;
                if forward {
                    self.count_producer(false);
                }
                Ok(())
            }
            FrontendKind::Opaque => {
                // CopyData: part of a COPY a fenced statement started.
                self.pass(header.total(), true, drain).await
            }
        }
    }

    /// Forwards (or, when refused, drops) the next `total` bytes of the
    /// client's stream without holding them all.
    async fn pass(&mut self, mut total: usize, forward: bool, drain: &CancellationToken) -> Result<(), End> {
        loop {
            let n = total.min(self.buf.len());
            let chunk = self.buf.split_to(n);
            if forward {
                self.send(&chunk);
            }
            total -= n;
            if total == 0 {
                return Ok(());
            }
            if self.out.len() >= FLUSH_AT {
                self.flush().await?;
            }
            self.fill(drain).await?;
        }
    }

    async fn whole(&mut self, tag: u8, msg: Bytes) -> Result<(), End> {
        let body = &msg[5..];
        match tag {
            b'Q' => self.query(msg.clone()).await?,
            b'P' => {
                let (name, raw) = parse_message(body).map_err(End::ClientProtocol)?;
                let scs = lock(&self.session.shared).standard_conforming_strings;
                let mut st = sql::classify_one(&String::from_utf8_lossy(raw), scs);
                if protocol::ascii_prefix(raw) < raw.len() {
                    st.kind = outside_the_ascii_prefix(st.kind);
                }
                let name = Bytes::copy_from_slice(name);
                self.parse(name, st, &msg).await?;
            }
            b'E' => {
                let portal = execute_portal(body).map_err(End::ClientProtocol)?;
                let class = self.portals.get(portal).cloned().unwrap_or(Class::Fenced(sql::UNKNOWN_KEYWORD));
                self.execute(class, &msg).await?;
            }
            b'C' => {
                let (kind, name) = target(tag, body).map_err(End::ClientProtocol)?;
                if kind == b'S' {
                    self.statements.remove(name);
                } else {
                    self.portals.remove(name);
                }
                self.send(&msg);
            }
            b'D' | b'H' | b'p' => self.send(&msg),
            b'S' => self.sync(&msg).await?,
            b'c' | b'f' => {
                self.send(&msg);
                lock(&self.session.shared).in_copy_in = false;
            }
            b'X' => {
                self.send(&msg);
                return Err(End::ClientClosed);
            }
            _ => unreachable!("frontend_kind lists every whole message"),
        }
        Ok(())
    }

    fn count_producer(&mut self, maybe: bool) {
        let mut s = lock(&self.session.shared);
        if !s.outstanding() {
            s.outstanding_since = clock::now();
        }
        if maybe {
            s.maybe_producers += 1;
        } else {
            s.producers += 1;
        }
        if std::mem::take(&mut s.fenced_since_producer) {
            s.last_fenced_unit = s.units();
        }
        drop(s);
        if self.session.env.config.statement_timeout.is_some() {
            // The upstream pump re-arms its statement timeout.
            self.session.changed.notify_waiters();
        }
    }

    async fn sync(&mut self, msg: &[u8]) -> Result<(), End> {
        let pending = lock(&self.session.shared).copy_pending;
        let maybe = match pending {
            Some((_, true)) => {
                // libpq's pipelined Sync after a COPY's Execute: PostgreSQL
                // drops it if the COPY entered COPY-in mode. Hold it until
                // PostgreSQL has said which.
                self.flush().await?;
                self.session.wait_until(|s| s.copy_pending.is_none()).await;
                if lock(&self.session.shared).in_copy_in {
                    // Dropped by PostgreSQL: not a producer at all.
                    self.send(msg);
                    return Ok(());
                }
                false
            }
            Some((_, false)) => true,
            None => lock(&self.session.shared).in_copy_in,
        };
        self.count_producer(maybe);
        self.send(msg);
        Ok(())
    }

    /// The epoch of the connection's resource now.
    fn epoch(&self) -> u64 {
        let core = &self.session.env.core;
        core.resources.get(&self.session.id.resource).map_or_else(|| core.resources.floor(), |s| s.epoch())
    }

    fn resource_state(&mut self) -> Result<Arc<ResourceState>, Rejection> {
        if let Some(s) = &self.state {
            return Ok(s.clone());
        }
        let state = self
            .session
            .env
            .core
            .resources
            .get_or_create(&self.session.id.resource)
            .map_err(|e| Rejection::new(RejectReason::TooManyResources, e.to_string()))?;
        self.state = Some(state.clone());
        Ok(state)
    }

    /// Sends PostgreSQL a failing statement in place of a refused message,
    /// and records the refusal (its error replaces PostgreSQL's).
    fn refuse(&mut self, keyword: &str, rejection: Rejection, replace: Replace) {
        let token = rejection.presented_token.or(self.token.map(|t| t.0.get()));
        let code = sqlstate_of(rejection.reason);
        let env = &self.session.env;
        env.core.record_rejection(
            &self.session.context(keyword, token),
            &rejection,
            status_of(rejection.reason),
            Some(code),
        );
        let hint = match code {
            sqlstate::STALE => {
                Some("another client holds the lock with a newer token: stop writing, take the lock again")
            }
            sqlstate::NO_TOKEN => Some("declare the lock's token first: SET fencer.token = <token>"),
            sqlstate::RETRY => Some("retry later"),
            sqlstate::TOKEN_CHANGE => Some("change the token outside a transaction"),
            _ => None,
        };
        let mut detail = format!("resource {}", self.session.id.resource);
        if let Some(t) = rejection.presented_token {
            detail.push_str(&format!(", presented token {t}"));
        }
        if let Some(e) = rejection.current_epoch {
            detail.push_str(&format!(", current epoch {e}"));
        }
        let error = protocol::error_response(Severity::Error, code, &rejection.detail, Some(&detail), hint);
        let marker = refusal_marker(env, code);
        {
            let mut s = lock(&self.session.shared);
            if s.pending.len() >= 1024 {
                s.pending.pop_front();
            }
            let producers_before = s.producers + s.maybe_producers;
            s.pending.push_back(Pending { marker: marker.clone(), error, producers_before });
        }
        match replace {
            Replace::Query => {
                self.send(&protocol::query(&marker));
                self.count_producer(false);
            }
            Replace::Parse => self.send(&protocol::parse(&marker, &marker)),
        }
    }

    /// G3: a statement other than the declaration on a connection without
    /// a token.
    fn token_rejection(&self) -> Option<Rejection> {
        if self.session.id.read_only || self.token.is_some() {
            return None;
        }
        Some(Rejection::new(
            RejectReason::MissingToken,
            format!(
                "this connection has no fencing token: declare it with SET fencer.token before any statement on resource {} (G3)",
                self.session.id.resource
            ),
        ))
    }

    /// Takes the shared guard for a fenced message unless the session holds
    /// it; refuses on G3/G4/G5 grounds. Returns whether to forward.
    async fn fenced_message(&mut self, class: Class, replace: Replace) -> Result<bool, End> {
        let keyword = class.keyword();
        if self.session.id.read_only {
            self.session.env.core.metrics.accepted(false);
            return Ok(true);
        }
        let Some(Declared(token)) = self.token else {
            let r = self.token_rejection().expect("no token");
            self.refuse(keyword, r, replace);
            return Ok(false);
        };
        {
            let mut s = lock(&self.session.shared);
            if s.guard.is_some() {
                s.fenced_since_producer = true;
                drop(s);
                self.session.env.core.metrics.accepted(true);
                return Ok(true);
            }
        }
        // PostgreSQL must see what came before while we wait.
        self.flush().await?;
        let state = match self.resource_state() {
            Ok(s) => s,
            Err(r) => {
                self.refuse(keyword, r, replace);
                return Ok(false);
            }
        };
        let exclusive = || self.session.exclusive(state.clone());
        match self.session.env.core.admit(&state, token, exclusive).await {
            Ok(in_flight) => {
                let id = &self.session.id;
                if let Some(pid) = id.backend_pid {
                    self.session.env.backends.hold(&state.name, id.connection, pid);
                }
                let held = Held {
                    in_flight: Some(in_flight),
                    state,
                    backends: self.session.env.backends.clone(),
                    connection: id.connection,
                };
                let mut s = lock(&self.session.shared);
                s.guard = Some(held);
                s.fenced_since_producer = true;
                drop(s);
                self.session.env.core.metrics.accepted(true);
                Ok(true)
            }
            Err(AdmitError::Rejected(mut r)) => {
                r.presented_token = Some(token.get());
                self.refuse(keyword, r, replace);
                Ok(false)
            }
            Err(AdmitError::StoreUnavailable(e)) => {
                let r = Rejection {
                    retry_after_secs: Some(1),
                    ..Rejection::new(RejectReason::Busy, format!("the epoch store is unavailable: {e}"))
                };
                self.refuse(keyword, r, replace);
                Ok(false)
            }
        }
    }

    /// Applies a list of declarations (G2) and returns the token they leave,
    /// or the refusal. A token change while the session holds the guard
    /// waits for PostgreSQL to answer what is outstanding; inside a
    /// transaction that already ran a fenced statement it is refused.
    async fn declarations(&mut self, decls: &[StatementKind]) -> Result<Result<Option<Declared>, Rejection>, End> {
        let env = self.session.env.clone();
        let mut token = self.token;
        for d in decls {
            match d {
                StatementKind::SetToken(value) => {
                    match env.core.tokens.check(value.as_bytes(), &self.session.id.resource) {
                        Ok(t) => {
                            let epoch = self.epoch();
                            if t.get() < epoch {
                                let state = self.resource_state();
                                let mut r = match state {
                                    Ok(s) => Rejection::stale(&s, t, epoch),
                                    Err(r) => return Ok(Err(r)),
                                };
                                r.detail = format!("SET fencer.token = {t}: {}", r.detail);
                                return Ok(Err(r));
                            }
                            token = Some(Declared(t));
                        }
                        Err(refusal) => {
                            let mut r = Rejection::new(
                                refusal.reason,
                                format!(
                                    "fencer.token refused: {}; this connection keeps its previous token",
                                    refusal.detail
                                ),
                            );
                            r.presented_token = refusal.claimed;
                            return Ok(Err(r));
                        }
                    }
                }
                StatementKind::ResetToken | StatementKind::ResetAll | StatementKind::DiscardAll => token = None,
                StatementKind::SetResource(name) if name != self.session.id.resource.as_str() => {
                    return Ok(Err(Rejection::new(
                        RejectReason::ResourceMismatch,
                        format!(
                            "SET fencer.resource = {name:?}, but this connection writes resource {:?}; the sidecar decides the resource (G10)",
                            self.session.id.resource.as_str()
                        ),
                    )));
                }
                _ => {}
            }
        }
        if token != self.token {
            let (holds, fenced) = {
                let s = lock(&self.session.shared);
                (s.guard.is_some(), s.fenced_since_producer)
            };
            if holds {
                let change = || {
                    Rejection::new(
                        RejectReason::TokenChangeInTransaction,
                        "the fencing token may change only outside a transaction or before its first fenced statement (G2)",
                    )
                };
                if fenced {
                    return Ok(Err(change()));
                }
                if lock(&self.session.shared).maybe_producers > 0 {
                    // The sidecar cannot know whether a transaction is open.
                    return Ok(Err(change()));
                }
                // The fenced units may have ended in autocommit: wait for
                // PostgreSQL's answers. Still held then: a transaction is open.
                self.flush().await?;
                self.session.wait_until(|s| s.guard.is_none() || s.fenced_answered()).await;
                if lock(&self.session.shared).guard.is_some() {
                    return Ok(Err(change()));
                }
            }
        }
        Ok(Ok(token))
    }

    async fn query(&mut self, msg: Bytes) -> Result<(), End> {
        let raw = query_message(&msg[5..]).map_err(End::ClientProtocol)?;
        let scs = lock(&self.session.shared).standard_conforming_strings;
        let ascii = protocol::ascii_prefix(raw);
        let mut statements = sql::split_statements(&String::from_utf8_lossy(raw), scs);
        if ascii < raw.len() {
            // The lossy text's offsets equal the raw ones up to the first
            // non-ASCII byte.
            for st in statements.iter_mut().filter(|st| st.range.end > ascii) {
                st.kind = outside_the_ascii_prefix(std::mem::replace(&mut st.kind, StatementKind::Other));
            }
        }
        let mut decls = Vec::new();
        let mut fenced: Option<&'static str> = None;
        let mut needs_token = false;
        let read_only = self.session.id.read_only;
        let mut refusal: Option<(&'static str, Rejection)> = None;
        for st in statements {
            match st.kind {
                StatementKind::UnsupportedFencerSetting(u) if !read_only => {
                    refusal = Some(("SET", Rejection::new(RejectReason::UnsupportedStatement, u.to_string())));
                    break;
                }
                StatementKind::TwoPhase(_) if !read_only => {
                    refusal = Some((st.keyword, two_phase_refusal(st.keyword)));
                    break;
                }
                k @ (StatementKind::SetToken(_)
                | StatementKind::ResetToken
                | StatementKind::SetResource(_)
                | StatementKind::ResetResource
                | StatementKind::ResetAll
                | StatementKind::DiscardAll) => {
                    if let Some(kw) = fenced {
                        refusal = Some((
                            kw,
                            Rejection::new(
                                RejectReason::TokenChangeInTransaction,
                                "a token declaration follows a fenced statement in the same Query (one implicit transaction); declare the token first (G2)",
                            ),
                        ));
                        break;
                    }
                    decls.push(k);
                }
                StatementKind::Begin => needs_token = true,
                ref k if only_undoes(k, st.keyword) => {}
                _ => {
                    fenced.get_or_insert(st.keyword);
                }
            }
        }
        if let Some((kw, r)) = refusal {
            self.refuse(kw, r, Replace::Query);
            return Ok(());
        }
        if read_only {
            self.session.env.core.metrics.accepted(false);
            self.count_producer(false);
            self.send(&msg);
            return Ok(());
        }
        let token = match self.declarations(&decls).await? {
            Ok(t) => t,
            Err(r) => {
                self.refuse("SET", r, Replace::Query);
                return Ok(());
            }
        };
        let previous = std::mem::replace(&mut self.token, token);
        if let Some(kw) = fenced {
            if !self.fenced_message(Class::Fenced(kw), Replace::Query).await? {
                // Refused: none of the Query ran, its declarations neither.
                self.token = previous;
                return Ok(());
            }
        } else if needs_token && let Some(r) = self.token_rejection() {
            self.token = previous;
            self.refuse("BEGIN", r, Replace::Query);
            return Ok(());
        }
        self.count_producer(false);
        self.send(&msg);
        Ok(())
    }

    async fn parse(&mut self, name: Bytes, st: sql::Statement, msg: &[u8]) -> Result<(), End> {
        let read_only = self.session.id.read_only;
        let class = match st.kind {
            StatementKind::UnsupportedFencerSetting(u) if !read_only => {
                self.refuse("SET", Rejection::new(RejectReason::UnsupportedStatement, u.to_string()), Replace::Parse);
                return Ok(());
            }
            StatementKind::TwoPhase(_) if !read_only => {
                self.refuse(st.keyword, two_phase_refusal(st.keyword), Replace::Parse);
                return Ok(());
            }
            kind => Class::of(kind, st.keyword),
        };
        if !matches!(class, Class::Declaration(_) | Class::Rollback)
            && let Some(r) = self.token_rejection()
        {
            self.refuse(class.keyword(), r, Replace::Parse);
            return Ok(());
        }
        if self.statements.len() >= self.session.env.config.max_prepared_statements
            && !self.statements.contains_key(&name)
        {
            return Err(End::Limit(format!(
                "this connection prepared more than {} statements (max_prepared_statements)",
                self.session.env.config.max_prepared_statements
            )));
        }
        self.statements.insert(name, class);
        self.send(msg);
        Ok(())
    }

    /// Returns whether the Bind is forwarded.
    async fn bind(&mut self, portal: Bytes, statement: Bytes) -> Result<bool, End> {
        let class = self.statements.get(&statement).cloned().unwrap_or(Class::Fenced(sql::UNKNOWN_KEYWORD));
        if !matches!(class, Class::Declaration(_) | Class::Rollback)
            && let Some(r) = self.token_rejection()
        {
            self.refuse(class.keyword(), r, Replace::Parse);
            return Ok(false);
        }
        if self.portals.len() >= self.session.env.config.max_prepared_statements && !self.portals.contains_key(&portal)
        {
            return Err(End::Limit(format!(
                "this connection bound more than {} portals (max_prepared_statements)",
                self.session.env.config.max_prepared_statements
            )));
        }
        self.portals.insert(portal, class);
        Ok(true)
    }

    async fn execute(&mut self, class: Class, msg: &[u8]) -> Result<(), End> {
        match class {
            Class::Declaration(kind) => {
                if self.session.id.read_only {
                    self.send(msg);
                    return Ok(());
                }
                match self.declarations(std::slice::from_ref(&kind)).await? {
                    Ok(token) => {
                        self.token = token;
                        self.send(msg);
                    }
                    Err(r) => self.refuse(Class::Declaration(kind).keyword(), r, Replace::Parse),
                }
            }
            Class::Begin => match self.token_rejection() {
                Some(r) => self.refuse("BEGIN", r, Replace::Parse),
                None => self.send(msg),
            },
            Class::Rollback => self.send(msg),
            Class::CopyFromStdin => {
                if self.fenced_message(Class::CopyFromStdin, Replace::Parse).await? {
                    let mut s = lock(&self.session.shared);
                    let before = s.producers + s.maybe_producers;
                    s.copy_pending = Some((before, true));
                    drop(s);
                    self.send(msg);
                }
            }
            class @ Class::Fenced(_) => {
                if self.fenced_message(class, Replace::Parse).await? {
                    self.send(msg);
                }
            }
        }
        Ok(())
    }
}

/// What a statement that is not all ASCII counts as: never a statement
/// forwarded without fencing (see [`protocol::ascii_prefix`]); refusals
/// (two-phase commands, unsupported SETs) stay refusals.
fn outside_the_ascii_prefix(kind: StatementKind) -> StatementKind {
    match kind {
        k
        @ (StatementKind::TwoPhase(_) | StatementKind::UnsupportedFencerSetting(_) | StatementKind::CopyFromStdin) => k,
        _ => StatementKind::Other,
    }
}

fn two_phase_refusal(keyword: &str) -> Rejection {
    Rejection::new(
        RejectReason::RefusedStatement,
        format!(
            "{keyword} … (two-phase commit) is refused on a fenced connection: a prepared transaction outlives its connection and so would outlive the fence (G8)"
        ),
    )
}

impl Session {
    /// G5: the exclusive guard for a higher token. Waits `drain_timeout`
    /// for older transactions to end, then ends their backends through the
    /// admin connection and waits for their sessions to let go. The wait
    /// stays queued throughout, so no new older-token transaction can start.
    async fn exclusive(&self, state: Arc<ResourceState>) -> Result<OwnedRwLockWriteGuard<()>, Rejection> {
        let config = &self.env.config;
        let wait = state.exclusive();
        tokio::pin!(wait);
        if let Ok(g) = tokio::time::timeout(config.drain_timeout, &mut wait).await {
            return Ok(g);
        }
        let busy = |detail: String| Rejection {
            resource: Some(state.name.to_string()),
            retry_after_secs: Some(1),
            ..Rejection::new(RejectReason::Busy, detail)
        };
        let Some(admin) = &self.env.admin else {
            return Err(busy(format!(
                "resource {} has an older transaction open after drain_timeout ({:?}); the sidecar has no [postgres.admin] connection to end it, so retry later",
                state.name, config.drain_timeout
            )));
        };
        let pids = self.env.backends.holders(&state.name);
        tracing::warn!(resource = %state.name, ?pids, "older transactions still open after drain_timeout; ending them (G5)");
        let started = clock::now();
        let ends = pids.iter().map(|&pid| admin.terminate(pid));
        for (pid, result) in pids.iter().zip(futures::future::join_all(ends).await) {
            if let Err(e) = result {
                tracing::error!(resource = %state.name, pid, error = %e, "cannot end an older transaction's backend");
                return Err(busy(format!(
                    "resource {} has an older transaction (backend {pid}) that the sidecar could not end: {e}",
                    state.name
                )));
            }
        }
        self.env.core.metrics.pg_terminations.inc_by(pids.len() as u64);
        // Their sessions see PostgreSQL close and let go of the guard.
        match tokio::time::timeout(config.terminate_timeout, &mut wait).await {
            Ok(g) => {
                tracing::info!(resource = %state.name, took = ?(clock::now() - started), "older backends exited; the higher token proceeds");
                Ok(g)
            }
            Err(_) => Err(busy(format!(
                "resource {}: older transactions did not let go within terminate_timeout after their backends were ended",
                state.name
            ))),
        }
    }
}

struct UpstreamPump<C, U> {
    session: Arc<Session>,
    reader: ReadHalf<U>,
    buf: BytesMut,
    client: ClientWriter<C>,
}

/// Largest backend message the pump reads whole to inspect (ErrorResponse,
/// ParameterStatus); a larger one passes uninspected.
const MAX_INSPECTED_BACKEND: usize = 1024 * 1024;

impl<C, U> UpstreamPump<C, U>
where
    C: AsyncRead + AsyncWrite,
    U: AsyncRead + AsyncWrite,
{
    async fn run(&mut self) -> End {
        // Bytes of a message being relayed without inspection, still to come.
        let mut passing = 0usize;
        let mut last_byte = clock::now();
        let mut out = BytesMut::new();
        loop {
            let more = match self.relay_buffered(&mut out, &mut passing) {
                Ok(more) => more,
                Err(e) => return End::UpstreamProtocol(e),
            };
            if !out.is_empty() {
                let chunk = out.split();
                let mut w = self.client.lock().await;
                if let Err(e) = w.write_all(&chunk).await {
                    return End::ClientIo(e);
                }
            }
            if more {
                continue;
            }
            if self.buf.capacity() > 256 * 1024 && self.buf.is_empty() {
                self.buf = BytesMut::with_capacity(8192);
            }
            self.buf.reserve(8192);
            let result = loop {
                // G7: PostgreSQL may stay silent for statement_timeout while
                // it owes an answer; re-armed whenever the client pump
                // sends a Sync, Query or FunctionCall.
                let notified = self.session.changed.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                let deadline = match self.session.env.config.statement_timeout {
                    Some(t) => {
                        let s = lock(&self.session.shared);
                        s.outstanding().then(|| (s.outstanding_since.max(last_byte) + t, t))
                    }
                    None => None,
                };
                tokio::select! {
                    r = self.reader.read_buf(&mut self.buf) => break r,
                    () = async {
                        match deadline {
                            Some((at, _)) => tokio::time::sleep_until(at).await,
                            None => std::future::pending().await,
                        }
                    } => return End::UpstreamTimeout(deadline.map_or(Duration::ZERO, |(_, t)| t)),
                    () = notified => {}
                }
            };
            last_byte = clock::now();
            match result {
                Ok(0) => return End::UpstreamClosed,
                Ok(_) => {}
                Err(e) => return End::UpstreamIo(e),
            }
        }
    }

    /// Moves what is buffered to `out`, inspecting the messages the rules
    /// need whole. Returns whether it stopped early with more to relay
    /// (`out` reached [`FLUSH_AT`]).
    fn relay_buffered(&mut self, out: &mut BytesMut, passing: &mut usize) -> Result<bool, ProtocolError> {
        loop {
            if out.len() >= FLUSH_AT {
                return Ok(!self.buf.is_empty());
            }
            if *passing > 0 {
                let n = (*passing).min(self.buf.len());
                out.extend_from_slice(&self.buf.split_to(n));
                *passing -= n;
                if *passing > 0 {
                    return Ok(false);
                }
                continue;
            }
            let Some(header) = Header::parse(&self.buf)? else {
                return Ok(false);
            };
            let inspect = matches!(header.tag, b'Z' | b'E' | b'G' | b'S') && header.body_len <= MAX_INSPECTED_BACKEND;
            if !inspect {
                *passing = header.total();
                continue;
            }
            if self.buf.len() < header.total() {
                return Ok(false);
            }
            let msg = self.buf.split_to(header.total()).freeze();
            match self.inspect(header.tag, &msg) {
                Some(replacement) => out.extend_from_slice(&replacement),
                None => out.extend_from_slice(&msg),
            }
        }
    }

    /// Reads what the rules need from one backend message; returns what
    /// the client gets instead, if anything.
    fn inspect(&mut self, tag: u8, msg: &Bytes) -> Option<Bytes> {
        let body = &msg[5..];
        let session = &self.session;
        let mut s = lock(&session.shared);
        let in_copy_segment = |s: &Shared| s.copy_pending.is_some_and(|(before, _)| s.ready_for_query == before);
        let replacement = match tag {
            b'Z' => {
                let status = body.first().copied().unwrap_or(b'I');
                s.ready_for_query += 1;
                s.last_status = status;
                if s.copy_pending.is_some_and(|(before, _)| s.ready_for_query > before) {
                    s.copy_pending = None;
                }
                let answered = s.ready_for_query;
                while s.pending.front().is_some_and(|p| p.producers_before < answered) {
                    s.pending.pop_front();
                }
                if status == b'I' && s.fenced_answered() {
                    // G5: idle outside a transaction, and every fenced unit
                    // answered: the transaction in flight ended.
                    s.guard = None;
                }
                None
            }
            b'E' => {
                if in_copy_segment(&s) {
                    s.copy_pending = None;
                }
                s.in_copy_in = false;
                let (code, message) = error_fields(body);
                if code == Some(b"42601")
                    && let Some(message) = message
                {
                    let pos = s.pending.iter().position(|p| contains(message, p.marker.as_bytes()));
                    pos.and_then(|i| s.pending.remove(i)).map(|p| p.error)
                } else {
                    None
                }
            }
            b'G' => {
                // COPY-in: the pending COPY's (which is resolved), or an
                // earlier one's (a simple-Query COPY).
                s.in_copy_in = true;
                if in_copy_segment(&s) {
                    s.copy_pending = None;
                }
                None
            }
            b'S' => {
                if let Some((b"standard_conforming_strings", value)) = protocol::parameter_status(body) {
                    s.standard_conforming_strings = value == b"on";
                }
                None
            }
            _ => None,
        };
        drop(s);
        session.changed.notify_waiters();
        replacement
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}
