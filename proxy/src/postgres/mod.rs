//! The PostgreSQL front end (DESIGN §4a, rules G1–G10): the fence core in
//! front of an unmodified PostgreSQL, over its own wire protocol.
//!
//! - `config`: the `[postgres]` table and the flag form.
//! - `protocol`: the v3 wire protocol: startup, framing, the inspected
//!   message bodies, the messages the sidecar writes.
//! - `sql`: the statement shapes the sidecar recognises (token declarations,
//!   `BEGIN`, two-phase commands, `COPY … FROM STDIN`); never read vs write.
//! - `options`: the startup packet's `options` (`-c fencer.token=N`).
//! - `session`: one relayed connection after authentication: the two pumps,
//!   token declarations (G2), fencing (G3–G5), refusals, unknown outcomes (G7).
//! - `backends`: cancel keys, the backends holding a resource's guard, and
//!   the admin connection that ends older transactions (G5) and confirms
//!   they exited (G7).
//!
//! This module runs a connection up to the end of its authentication:
//! SSLRequest (TLS with rustls when `[tls]` is set, else `N`), GSSENCRequest
//! (`N`), direct TLS (only with `[tls]`), CancelRequest (relayed to the
//! backend it names), then the StartupMessage, the resource (G10) and any
//! token in its options (G2), and authentication relayed end to end.

pub(crate) mod backends;
pub(crate) mod config;
pub(crate) mod options;
pub(crate) mod protocol;
pub(crate) mod session;
pub(crate) mod sql;

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::TlsAcceptor;
use tokio_util::either::Either;

use self::backends::{AdminConn, Backends, read_secret};
use self::config::{PgAddress, PostgresConfig};
use self::protocol::{Header, ProtocolError, Severity, Startup};
use self::session::{Declared, Identity, Session, SessionEnv, sqlstate};
use crate::config::ProxyConfig;
use crate::core::admin::UpstreamProbe;
use crate::core::fence::{FenceCore, Rejection, RejectionContext};
use crate::core::listener::Accepted;
use crate::core::metrics::TimeoutStage;
use crate::core::rejections::RejectReason;
use crate::core::tls;

/// Written to a client beyond `limits.max_connections`: what PostgreSQL
/// itself answers (`53300`).
pub(crate) const CONNECTION_LIMIT_REFUSAL: &[u8] = b"E\x00\x00\x00\x6cSFATAL\x00VFATAL\x00C53300\x00Msorry, too many clients already: the fencer sidecar is at limits.max_connections\x00\x00";

/// The TLS ALPN name PostgreSQL uses (required for direct TLS).
const ALPN: &[u8] = b"postgresql";

/// A client connection, plaintext or TLS.
type ClientStream = Either<TcpStream, tokio_rustls::server::TlsStream<TcpStream>>;
/// The connection to PostgreSQL, TCP or a unix socket.
type UpstreamStream = Either<TcpStream, UnixStream>;

/// What starting the PostgreSQL front end loads before anything else.
pub(crate) struct Prepared {
    tls: Option<TlsAcceptor>,
    admin_password: Option<String>,
}

/// Why the PostgreSQL front end cannot start.
#[derive(Debug, thiserror::Error)]
pub enum PostgresStartError {
    /// The admin password could not be read.
    #[error("[postgres.admin]: {0}")]
    AdminSecret(String),
}

impl Prepared {
    /// Loads the listener's TLS files and the admin password.
    pub(crate) fn load(config: &ProxyConfig, pg: &PostgresConfig) -> Result<Self, crate::server::StartError> {
        let tls = config.tls.as_ref().map(|t| tls::server_config(t, &[ALPN])).transpose()?.map(TlsAcceptor::from);
        let admin_password = match &pg.admin {
            Some(admin) => read_secret(&admin.password).map_err(PostgresStartError::AdminSecret)?,
            None => None,
        };
        Ok(Self { tls, admin_password })
    }
}

/// The PostgreSQL front end: every connection's startup, then its session.
pub(crate) struct PgFrontend {
    env: Arc<SessionEnv>,
    tls: Option<TlsAcceptor>,
    tls_handshake: Duration,
    next_connection: AtomicU64,
}

impl PgFrontend {
    pub(crate) fn new(core: Arc<FenceCore>, pg: Arc<PostgresConfig>, prepared: Prepared) -> Arc<Self> {
        let admin = pg.admin.as_ref().map(|a| Arc::new(AdminConn::new(&pg, a, prepared.admin_password)));
        match &pg.admin {
            None => tracing::warn!(
                "no [postgres.admin] connection: a higher token gets FN004 while an older transaction is open (G5), \
                 and an unknown outcome is settled by the quarantine alone (G7)"
            ),
            Some(a) => {
                tracing::info!(user = %a.user, database = %a.database, "older transactions are ended through the admin connection (G5)")
            }
        }
        let tls_handshake = core.config.timeouts.tls_handshake;
        Arc::new(Self {
            env: Arc::new(SessionEnv {
                core,
                config: pg,
                backends: Arc::new(Backends::default()),
                admin,
                next_marker: AtomicU64::new(1),
            }),
            tls: prepared.tls,
            tls_handshake,
            next_connection: AtomicU64::new(1),
        })
    }

    /// Serves one accepted connection to its end.
    pub(crate) async fn serve(self: Arc<Self>, conn: Accepted) {
        let Accepted { stream, peer, drain, abort, .. } = conn;
        let config = &self.env.config;
        let started = tokio::time::timeout(config.startup_timeout, self.startup(stream, peer));
        let ready = tokio::select! {
            r = started => r,
            () = abort.cancelled() => return,
        };
        let ready = match ready {
            Err(_) => {
                self.env.core.metrics.timed_out(TimeoutStage::Startup);
                tracing::debug!(%peer, timeout = ?config.startup_timeout, "PostgreSQL startup did not finish in time (startup_timeout)");
                return;
            }
            Ok(Err(why)) => {
                tracing::info!(%peer, %why, "PostgreSQL connection closed during startup");
                return;
            }
            Ok(Ok(None)) => return,
            Ok(Ok(Some(ready))) => ready,
        };
        let Ready { client, client_buf, upstream, identity, token, standard_conforming_strings } = ready;
        tracing::debug!(%peer, user = %identity.user, database = %identity.database, resource = %identity.resource, read_only = identity.read_only, "PostgreSQL session started");
        let session = Session::new(self.env.clone(), identity, standard_conforming_strings);
        session.run(client, client_buf, upstream, token, drain, abort).await;
    }

    /// The connection up to its first ReadyForQuery. `Ok(None)`: it was a
    /// CancelRequest, or the client left; `Err`: closed with this reason
    /// (the client was told where it could be).
    async fn startup(&self, tcp: TcpStream, peer: SocketAddr) -> Result<Option<Ready>, String> {
        let mut client: ClientStream = Either::Left(tcp);
        let mut identity_name: Option<Arc<str>> = None;
        let mut first = true;
        let startup = loop {
            if first && self.starts_with_tls(&client).await {
                // Direct TLS (PostgreSQL 17): only with [tls], and only
                // with PostgreSQL's ALPN, as PostgreSQL requires.
                let Some(acceptor) = &self.tls else {
                    return Err("direct TLS from a client, but the sidecar has no [tls]".into());
                };
                let Either::Left(tcp) = client else { unreachable!("first packet") };
                let tls = self.handshake(acceptor, tcp).await?;
                if tls.get_ref().1.alpn_protocol() != Some(ALPN) {
                    return Err("direct TLS without the \"postgresql\" ALPN protocol".into());
                }
                identity_name = tls::peer_identity(tls.get_ref().1);
                client = Either::Right(tls);
            }
            first = false;
            let packet = match read_startup(&mut client).await {
                Ok(p) => p,
                Err(StartupReadError::Closed) => return Ok(None),
                Err(StartupReadError::Io(e)) => return Err(format!("reading the startup packet: {e}")),
                Err(StartupReadError::Protocol(e)) => {
                    let _ = fatal(&mut client, "08P01", &e.to_string(), None).await;
                    return Err(e.to_string());
                }
            };
            match packet {
                Startup::Ssl => match (&self.tls, client) {
                    (Some(acceptor), Either::Left(mut tcp)) => {
                        tcp.write_all(b"S").await.map_err(|e| e.to_string())?;
                        let tls = self.handshake(acceptor, tcp).await?;
                        identity_name = tls::peer_identity(tls.get_ref().1);
                        client = Either::Right(tls);
                    }
                    (_, mut c) => {
                        c.write_all(b"N").await.map_err(|e| e.to_string())?;
                        client = c;
                    }
                },
                Startup::GssEnc => client.write_all(b"N").await.map_err(|e| e.to_string())?,
                Startup::Cancel { raw, pid, key } => {
                    self.cancel(raw, pid, &key).await;
                    return Ok(None);
                }
                message @ Startup::Message { .. } => break message,
            }
        };
        if self.tls.is_some() && matches!(client, Either::Left(_)) {
            // Like the HTTP proxy's TLS listener: with [tls], no plaintext.
            let msg = "the fencer sidecar accepts only TLS connections (use sslmode=require or stronger)";
            let _ = fatal(&mut client, "28000", msg, None).await;
            return Err(msg.into());
        }
        self.begin(client, startup, peer, identity_name).await
    }

    async fn starts_with_tls(&self, client: &ClientStream) -> bool {
        let Either::Left(tcp) = client else { return false };
        let mut b = [0u8; 1];
        matches!(tcp.peek(&mut b).await, Ok(1) if b[0] == 0x16)
    }

    async fn handshake(
        &self,
        acceptor: &TlsAcceptor,
        tcp: TcpStream,
    ) -> Result<tokio_rustls::server::TlsStream<TcpStream>, String> {
        match tokio::time::timeout(self.tls_handshake, acceptor.accept(tcp)).await {
            Ok(Ok(tls)) => Ok(tls),
            Ok(Err(e)) => Err(format!("TLS handshake failed: {e}")),
            Err(_) => {
                self.env.core.metrics.timed_out(TimeoutStage::TlsHandshake);
                Err("TLS handshake timed out (timeouts.tls_handshake)".into())
            }
        }
    }

    /// G1: a CancelRequest reaches the backend it names, and only when the
    /// key is the one PostgreSQL gave that backend.
    async fn cancel(&self, raw: Bytes, pid: u32, key: &[u8]) {
        if !self.env.backends.cancel_key_matches(pid, key) {
            tracing::debug!(pid, "CancelRequest with an unknown backend key ignored");
            return;
        }
        match tokio::time::timeout(Duration::from_secs(5), connect(&self.env.config.upstream)).await {
            Ok(Ok(mut up)) => {
                let _ = up.write_all(&raw).await;
                let _ = up.shutdown().await;
                self.env.core.metrics.pg_cancels.inc();
                tracing::info!(pid, "CancelRequest relayed");
            }
            Ok(Err(e)) => tracing::warn!(pid, error = %e, "cannot relay a CancelRequest"),
            Err(_) => tracing::warn!(pid, "cannot relay a CancelRequest: connecting timed out"),
        }
    }

    /// From the StartupMessage to the first ReadyForQuery.
    async fn begin(
        &self,
        mut client: ClientStream,
        startup: Startup,
        peer: SocketAddr,
        cert_identity: Option<Arc<str>>,
    ) -> Result<Option<Ready>, String> {
        let env = &self.env;
        let Startup::Message { raw, .. } = &startup else { unreachable!("a StartupMessage") };
        let Some(user) = startup.param("user").map(str::to_owned) else {
            let msg = "no PostgreSQL user name specified in startup packet";
            let _ = fatal(&mut client, "28000", msg, None).await;
            return Err(msg.into());
        };
        let database = startup.param("database").unwrap_or(&user).to_owned();
        if let Some(r) = startup.param("replication")
            && !matches!(r.to_ascii_lowercase().as_str(), "false" | "off" | "no" | "0")
        {
            let msg = "replication connections are not relayed by the fencer sidecar";
            let _ = fatal(&mut client, "0A000", msg, Some("connect replication clients to PostgreSQL directly")).await;
            return Err(msg.into());
        }
        let resource = match env.config.resource.for_database(&database) {
            Ok(r) => r,
            Err(e) => {
                let _ = fatal(&mut client, "42602", &e, None).await;
                return Err(e);
            }
        };
        let read_only = env.config.read_only_users.contains(&user);
        let caller = match &cert_identity {
            Some(id) => format!("{user}@{id}"),
            None => format!("{user}@{peer}"),
        };
        let connection = self.next_connection.fetch_add(1, Ordering::Relaxed);

        // G2: a token (and a resource check) in the startup options, or as
        // startup parameters of their own (applied after the options).
        let mut settings = match startup.param("options").map(options::settings).transpose() {
            Ok(s) => s.unwrap_or_default(),
            Err(e) => {
                let _ = fatal(&mut client, "08P01", &e.to_string(), None).await;
                return Err(e.to_string());
            }
        };
        for name in ["fencer.token", "fencer.resource"] {
            if let Some(v) = startup.param(name) {
                settings.push((name.to_owned(), v.to_owned()));
            }
        }
        let mut token = None;
        let context = |keyword: &str| RejectionContext {
            method: keyword.to_owned(),
            caller: caller.clone(),
            request_id: env.core.next_request_id(),
            route: Some(format!("database {database}")),
            resource: Some(resource.to_string()),
            token: None,
        };
        for (name, value) in settings.iter().filter(|_| !read_only) {
            let refusal = match name.as_str() {
                "fencer.token" => match env.core.tokens.check(value.as_bytes(), &resource) {
                    Ok(t) => {
                        let epoch =
                            env.core.resources.get(&resource).map_or_else(|| env.core.resources.floor(), |s| s.epoch());
                        if t.get() < epoch {
                            Some((
                                sqlstate::STALE,
                                Rejection {
                                    resource: Some(resource.to_string()),
                                    presented_token: Some(t.get()),
                                    current_epoch: Some(epoch),
                                    ..Rejection::new(
                                        RejectReason::StaleToken,
                                        format!(
                                            "fencer.token {t} is older than resource {resource}'s epoch {epoch}; a newer lock holder exists"
                                        ),
                                    )
                                },
                            ))
                        } else {
                            token = Some(Declared(t));
                            None
                        }
                    }
                    Err(r) => Some((
                        sqlstate::NO_TOKEN,
                        Rejection {
                            presented_token: r.claimed,
                            ..Rejection::new(r.reason, format!("fencer.token refused: {}", r.detail))
                        },
                    )),
                },
                "fencer.resource" if value != resource.as_str() => Some((
                    sqlstate::REFUSED,
                    Rejection::new(
                        RejectReason::ResourceMismatch,
                        format!(
                            "fencer.resource {value:?} disagrees with this connection's resource {resource:?} (G10)"
                        ),
                    ),
                )),
                _ => None,
            };
            if let Some((code, rejection)) = refusal {
                let status = if code == sqlstate::STALE { 409 } else { 403 };
                env.core.record_rejection(&context("(startup)"), &rejection, status, Some(code));
                let _ = fatal(&mut client, code, &rejection.detail, None).await;
                return Err(rejection.detail);
            }
        }

        let mut upstream = match connect(&env.config.upstream).await {
            Ok(u) => u,
            Err(e) => {
                let msg = format!("the fencer sidecar cannot reach PostgreSQL at {}: {e}", env.config.upstream);
                tracing::warn!(%peer, error = %e, upstream = %env.config.upstream, "cannot connect to PostgreSQL");
                let _ = fatal(&mut client, "08006", &msg, None).await;
                return Err(msg);
            }
        };
        // G1: the client's own bytes.
        upstream.write_all(raw).await.map_err(|e| format!("writing the startup packet upstream: {e}"))?;
        let client_tls = matches!(client, Either::Right(_));
        let auth = authenticate(&mut client, &mut upstream, client_tls).await?;
        let Some(auth) = auth else { return Ok(None) };
        if let Some((pid, key)) = &auth.backend {
            env.backends.register_key(*pid, key.clone());
        }
        let identity = Identity {
            connection,
            peer,
            caller,
            user,
            database,
            resource,
            read_only,
            backend_pid: auth.backend.as_ref().map(|(pid, _)| *pid),
        };
        Ok(Some(Ready {
            client,
            client_buf: auth.client_buf,
            upstream: UpstreamWithBuffer { stream: upstream, buf: auth.upstream_buf },
            identity,
            token,
            standard_conforming_strings: auth.standard_conforming_strings,
        }))
    }
}

impl UpstreamProbe for PgFrontend {
    fn probe(&self, timeout: Duration) -> Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send + '_>> {
        Box::pin(async move {
            let address = &self.env.config.upstream;
            match tokio::time::timeout(timeout, connect(address)).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(format!("cannot connect to PostgreSQL at {address}: {e}")),
                Err(_) => return Err(format!("connecting to PostgreSQL at {address} took longer than {timeout:?}")),
            }
            if let Some(admin) = &self.env.admin {
                match tokio::time::timeout(timeout, admin.ping()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return Err(format!("[postgres.admin]: {e}")),
                    Err(_) => return Err(format!("the admin connection did not answer within {timeout:?}")),
                }
            }
            Ok(())
        })
    }
}

/// A session about to start.
struct Ready {
    client: ClientStream,
    client_buf: BytesMut,
    upstream: UpstreamWithBuffer,
    identity: Identity,
    token: Option<Declared>,
    standard_conforming_strings: bool,
}

/// PostgreSQL's stream with whatever was read past the first ReadyForQuery
/// (normally nothing).
struct UpstreamWithBuffer {
    stream: UpstreamStream,
    buf: BytesMut,
}

impl AsyncRead for UpstreamWithBuffer {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        out: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if !self.buf.is_empty() {
            let n = self.buf.len().min(out.remaining());
            out.put_slice(&self.buf.split_to(n));
            return std::task::Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.stream).poll_read(cx, out)
    }
}

impl AsyncWrite for UpstreamWithBuffer {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

async fn connect(address: &PgAddress) -> std::io::Result<UpstreamStream> {
    match address {
        PgAddress::Tcp(a) => {
            let s = TcpStream::connect(a).await?;
            let _ = s.set_nodelay(true);
            Ok(Either::Left(s))
        }
        PgAddress::Unix(p) => UnixStream::connect(p).await.map(Either::Right),
    }
}

enum StartupReadError {
    Closed,
    Io(std::io::Error),
    Protocol(ProtocolError),
}

async fn read_startup<R: AsyncRead + Unpin>(r: &mut R) -> Result<Startup, StartupReadError> {
    let mut head = [0u8; 4];
    match r.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(StartupReadError::Closed),
        Err(e) => return Err(StartupReadError::Io(e)),
    }
    let len = protocol::startup_length(head).map_err(StartupReadError::Protocol)?;
    let mut packet = vec![0u8; len];
    packet[..4].copy_from_slice(&head);
    r.read_exact(&mut packet[4..]).await.map_err(StartupReadError::Io)?;
    protocol::parse_startup(Bytes::from(packet)).map_err(StartupReadError::Protocol)
}

async fn fatal<W: AsyncWrite + Unpin>(w: &mut W, code: &str, message: &str, hint: Option<&str>) -> std::io::Result<()> {
    w.write_all(&protocol::error_response(Severity::Fatal, code, message, None, hint)).await?;
    w.shutdown().await
}

/// What authentication left behind.
struct Authenticated {
    backend: Option<(u32, Bytes)>,
    standard_conforming_strings: bool,
    client_buf: BytesMut,
    upstream_buf: BytesMut,
}

/// Largest message either side sends during authentication (GSSAPI tokens
/// are the largest, PostgreSQL bounds them at 64 KiB).
const MAX_AUTH_MESSAGE: usize = 65_536 + 5;

/// Reads one whole message into `buf` (bounded), or `None` at EOF.
async fn read_message<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut BytesMut,
    limit: usize,
) -> Result<Option<Bytes>, String> {
    loop {
        if let Some(h) = Header::parse(buf).map_err(|e| e.to_string())? {
            if h.total() > limit {
                return Err(format!("a message of {} bytes during authentication exceeds {limit}", h.total()));
            }
            if buf.len() >= h.total() {
                return Ok(Some(buf.split_to(h.total()).freeze()));
            }
        }
        buf.reserve(4096);
        if r.read_buf(buf).await.map_err(|e| e.to_string())? == 0 {
            return Ok(None);
        }
    }
}

/// G1: authentication relayed end to end (the sidecar never sees a
/// password: it forwards the client's messages and PostgreSQL's answers),
/// except that `SCRAM-SHA-256-PLUS` is withdrawn from the offer when the
/// client leg is TLS: channel binding cannot cross a relay.
async fn authenticate(
    client: &mut ClientStream,
    upstream: &mut UpstreamStream,
    client_tls: bool,
) -> Result<Option<Authenticated>, String> {
    let mut cbuf = BytesMut::with_capacity(1024);
    let mut ubuf = BytesMut::with_capacity(4096);
    let mut backend = None;
    let mut scs = true;
    let (mut cr, mut cw) = tokio::io::split(client);
    let (mut ur, mut uw) = tokio::io::split(upstream);
    loop {
        tokio::select! {
            m = read_message(&mut ur, &mut ubuf, 16 * 1024 * 1024) => {
                let Some(msg) = m? else { return Err("PostgreSQL closed the connection during authentication".into()) };
                let body = &msg[5..];
                let mut out = msg.clone();
                match msg[0] {
                    b'R' if client_tls && body.len() >= 4 && u32::from_be_bytes([body[0], body[1], body[2], body[3]]) == protocol::AUTH_SASL => {
                        let offered = protocol::sasl_mechanisms(body).map_err(|e| e.to_string())?;
                        let kept: Vec<&[u8]> = offered.iter().copied().filter(|m| *m != b"SCRAM-SHA-256-PLUS").collect();
                        if kept.is_empty() {
                            let msg = "PostgreSQL offers only SCRAM-SHA-256-PLUS, and channel binding cannot cross the sidecar";
                            let _ = fatal(&mut cw, "28000", msg, None).await;
                            return Err(msg.into());
                        }
                        out = protocol::sasl_offer(&kept);
                    }
                    b'K' => backend = Some(protocol::backend_key(body).map_err(|e| e.to_string())?),
                    b'S' => {
                        if let Some((b"standard_conforming_strings", value)) = protocol::parameter_status(body) {
                            scs = value == b"on";
                        }
                    }
                    _ => {}
                }
                cw.write_all(&out).await.map_err(|e| e.to_string())?;
                match msg[0] {
                    b'E' => return Err("PostgreSQL refused the connection (its error was relayed)".into()),
                    b'Z' => {
                        return Ok(Some(Authenticated {
                            backend,
                            standard_conforming_strings: scs,
                            client_buf: cbuf,
                            upstream_buf: ubuf,
                        }));
                    }
                    _ => {}
                }
            }
            m = read_message(&mut cr, &mut cbuf, MAX_AUTH_MESSAGE) => {
                let Some(msg) = m? else { return Ok(None) };
                match msg[0] {
                    b'p' => uw.write_all(&msg).await.map_err(|e| e.to_string())?,
                    b'X' => return Ok(None),
                    other => {
                        let why = format!("message type {:?} before authentication completed", char::from(other));
                        let _ = fatal(&mut cw, "08P01", &why, None).await;
                        return Err(why);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_limit_refusal_is_one_well_formed_fatal() {
        let h = Header::parse(CONNECTION_LIMIT_REFUSAL).unwrap().unwrap();
        assert_eq!((h.tag, h.total()), (b'E', CONNECTION_LIMIT_REFUSAL.len()));
        let (code, message) = protocol::error_fields(&CONNECTION_LIMIT_REFUSAL[5..]);
        assert_eq!(code, Some(&b"53300"[..]));
        assert!(message.is_some_and(|m| m.starts_with(b"sorry, too many clients")));
    }
}
