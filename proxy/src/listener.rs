//! Client connections before HTTP: the connection limit, the TLS handshake
//! (bounded by `timeouts.tls_handshake`) and the identity a client's
//! verified certificate names (mTLS).

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::either::Either;

use crate::config::ProxyConfig;
use crate::tls::{self, TlsError};

/// A client connection, plaintext or TLS.
pub(crate) type ClientStream = Either<TcpStream, TlsStream<TcpStream>>;

/// Admits client connections: at most `limits.max_connections` at once,
/// each through the TLS handshake when the listener has TLS.
#[derive(Clone)]
pub(crate) struct ClientAcceptor {
    tls: Option<TlsAcceptor>,
    handshake_timeout: Duration,
    permits: Arc<Semaphore>,
}

impl ClientAcceptor {
    pub(crate) fn new(config: &ProxyConfig) -> Result<Self, TlsError> {
        let tls = config.tls.as_ref().map(tls::server_config).transpose()?.map(TlsAcceptor::from);
        Ok(Self {
            tls,
            handshake_timeout: config.timeouts.tls_handshake,
            permits: Arc::new(Semaphore::new(config.limits.max_connections)),
        })
    }

    /// Waits for a free connection slot; the permit is held by the
    /// connection until it closes. Waiting here (instead of accepting and
    /// closing) leaves excess connections in the kernel's backlog.
    pub(crate) async fn permit(&self) -> OwnedSemaphorePermit {
        self.permits.clone().acquire_owned().await.expect("the connection semaphore is never closed")
    }

    /// Runs the TLS handshake, if any, and returns the stream and the
    /// client's certificate identity (mTLS only). A plaintext client on a
    /// TLS listener fails here: its bytes are not a TLS record.
    pub(crate) async fn handshake(&self, stream: TcpStream) -> io::Result<(ClientStream, Option<Arc<str>>)> {
        let Some(acceptor) = &self.tls else {
            return Ok((Either::Left(stream), None));
        };
        let tls = tokio::time::timeout(self.handshake_timeout, acceptor.accept(stream))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"))??;
        let identity = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
            .map(|leaf| {
                tls::certificate_identity(leaf).unwrap_or_else(|| fencer_tls::UNNAMED_CLIENT_CERTIFICATE.to_owned())
            })
            .map(Arc::from);
        Ok((Either::Right(tls), identity))
    }
}
