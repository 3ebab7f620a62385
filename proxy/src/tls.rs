//! TLS (rustls with the ring provider): the listener's server config, with
//! client certificates required when a client CA is configured (mTLS); the
//! upstream client config; PEM loading with errors that name the file; and
//! the caller identity a client certificate names, for the rejection log.
//!
//! PEM loading and certificate identities come from `fencer-tls`, shared
//! with the coordinator.

use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::ServerName;

use crate::config::{ListenerTls, UpstreamTls};

use fencer_tls::load_roots as roots;
pub(crate) use fencer_tls::provider;
pub use fencer_tls::{TlsError, certificate_identity, load_certs, load_key};

fn config_err(what: &'static str) -> impl Fn(rustls::Error) -> TlsError {
    move |e| TlsError::Config { what, reason: e.to_string() }
}

/// The listener's config: TLS 1.2 and 1.3, ALPN h2 and http/1.1, and client
/// certificates required (and verified against `client_ca_file`) when set.
pub(crate) fn server_config(tls: &ListenerTls) -> Result<Arc<ServerConfig>, TlsError> {
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
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The upstream client's config: the server must chain to `ca_file`; the
/// proxy presents `cert_file`/`key_file` when set (mTLS to the upstream).
/// ALPN is left to the HTTP connector.
pub(crate) fn client_config(tls: &UpstreamTls) -> Result<ClientConfig, TlsError> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(config_err("upstream TLS"))?
        .with_root_certificates(roots(&tls.ca_file)?);
    match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => builder
            .with_client_auth_cert(load_certs(cert)?, load_key(key)?)
            .map_err(config_err("upstream client certificate and key")),
        _ => Ok(builder.with_no_client_auth()),
    }
}

/// A client config that trusts no server: for a plain `http://` upstream,
/// whose connector never starts TLS, so it is never used.
pub(crate) fn client_config_without_roots() -> ClientConfig {
    ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("the ring provider supports the default protocol versions")
        .with_root_certificates(RootCertStore::empty())
        .with_no_client_auth()
}

/// Checks a configured upstream server name.
pub(crate) fn parse_server_name(name: &str) -> Result<ServerName<'static>, String> {
    ServerName::try_from(name.to_owned())
        .map_err(|e| format!("server_name {name:?} is not a DNS name or IP address: {e}"))
}
