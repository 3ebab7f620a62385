//! TLS (rustls with the ring provider) on the client-facing listener of
//! either front end: the server config, with client certificates required
//! when a client CA is configured (mTLS); PEM loading with errors that name
//! the file; and the caller identity a client certificate names, for the
//! rejection log.
//!
//! PEM loading and certificate identities come from `fencer-tls`, shared
//! with the coordinator.

use std::sync::Arc;

use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;

use crate::config::ListenerTls;

pub(crate) use fencer_tls::load_roots as roots;
pub(crate) use fencer_tls::provider;
pub use fencer_tls::{TlsError, certificate_identity, load_certs, load_key};

pub(crate) fn config_err(what: &'static str) -> impl Fn(rustls::Error) -> TlsError {
    move |e| TlsError::Config { what, reason: e.to_string() }
}

/// The listener's config: TLS 1.2 and 1.3, the front end's ALPN protocols
/// (HTTP: `h2`, `http/1.1`; PostgreSQL: `postgresql`), and client
/// certificates required (and verified against `client_ca_file`) when set.
pub(crate) fn server_config(tls: &ListenerTls, alpn: &[&[u8]]) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = provider();
    let certs = load_certs(&tls.cert_file)?;
    let key = load_key(&tls.key_file)?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(config_err("listener TLS"))?;
    let builder = match &tls.client_ca_file {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca)?), provider)
                .build()
                .map_err(|e| TlsError::Config { what: "client CA", reason: e.to_string() })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(certs, key).map_err(config_err("listener certificate and key"))?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// The identity a client's verified certificate names (mTLS listeners), the
/// rejection log's caller; `None` without a client certificate.
pub(crate) fn peer_identity(conn: &rustls::ServerConnection) -> Option<Arc<str>> {
    conn.peer_certificates().and_then(|chain| chain.first()).map(|leaf| {
        Arc::from(certificate_identity(leaf).unwrap_or_else(|| fencer_tls::UNNAMED_CLIENT_CERTIFICATE.to_owned()))
    })
}
