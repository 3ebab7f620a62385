//! TLS (rustls with the ring provider): the listener's server config, with
//! client certificates required when a client CA is configured (mTLS); the
//! upstream client config; PEM loading with errors that name the file; and
//! the caller identity a client certificate names, for the rejection log.
//!
//! Nothing here knows about fencing: the coordinator's TLS (issue 9, part B)
//! can move this module into a shared crate as it is.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::config::{ListenerTls, UpstreamTls};

/// Largest PEM file read, in bytes.
const MAX_PEM_BYTES: u64 = 1024 * 1024;
/// Longest caller identity taken from a certificate, in characters.
const MAX_IDENTITY_CHARS: usize = 256;

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file is not the PEM it should be.
    #[error("{path}: {reason}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// rustls refused the certificates or key.
    #[error("{what}: {reason}")]
    Config {
        /// Which part, e.g. "listener certificate".
        what: &'static str,
        /// rustls' reason.
        reason: String,
    },
}

/// The one crypto provider used for every TLS config (explicit, so nothing
/// depends on a process-wide default).
pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read_bounded(path: &Path) -> Result<Vec<u8>, TlsError> {
    let read = |source| TlsError::Read { path: path.to_owned(), source };
    let file = std::fs::File::open(path).map_err(read)?;
    let mut bytes = Vec::new();
    file.take(MAX_PEM_BYTES + 1).read_to_end(&mut bytes).map_err(read)?;
    if bytes.len() as u64 > MAX_PEM_BYTES {
        return Err(TlsError::Pem { path: path.to_owned(), reason: format!("larger than {MAX_PEM_BYTES} bytes") });
    }
    Ok(bytes)
}

/// Reads every certificate of a PEM file; at least one is required.
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read_bounded(path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem { path: path.to_owned(), reason: e.to_string() })?;
    if certs.is_empty() {
        return Err(TlsError::Pem { path: path.to_owned(), reason: "no CERTIFICATE section".into() });
    }
    Ok(certs)
}

/// Reads the first private key (PKCS#8, PKCS#1 or SEC1) of a PEM file.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = read_bounded(path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| TlsError::Pem {
        path: path.to_owned(),
        reason: format!("no usable private key (PKCS#8, PKCS#1 or SEC1 PEM): {e}"),
    })
}

fn roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(path)? {
        roots
            .add(cert)
            .map_err(|e| TlsError::Pem { path: path.to_owned(), reason: format!("not a CA certificate: {e}") })?;
    }
    Ok(roots)
}

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

/// The caller a verified client certificate names: its first URI SAN (e.g.
/// a SPIFFE id), else its first DNS SAN, else its subject's common name.
/// Control characters are dropped and the result is bounded.
pub fn certificate_identity(cert: &CertificateDer<'_>) -> Option<String> {
    let parsed = webpki::EndEntityCert::try_from(cert).ok()?;
    let name = parsed
        .valid_uri_names()
        .next()
        .map(str::to_owned)
        .or_else(|| parsed.valid_dns_names().next().map(str::to_owned))
        .or_else(|| common_name(cert))?;
    let clean: String = name.chars().filter(|c| !c.is_control()).take(MAX_IDENTITY_CHARS).collect();
    (!clean.is_empty()).then_some(clean)
}

/// The first common name (OID 2.5.4.3) of the certificate's subject, read
/// with x509-parser rather than by hand.
fn common_name(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    parsed.subject().iter_common_name().next()?.as_str().ok().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_come_from_uri_then_dns_then_cn() {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = |sans: Vec<rcgen::SanType>, cn: &str| {
            let mut p = rcgen::CertificateParams::default();
            p.subject_alt_names = sans;
            p.distinguished_name.push(rcgen::DnType::CommonName, cn);
            p.self_signed(&key).unwrap().der().clone()
        };
        let uri = rcgen::SanType::URI("spiffe://fencer/client-a".try_into().unwrap());
        let dns = rcgen::SanType::DnsName("client-a.example".try_into().unwrap());
        assert_eq!(
            certificate_identity(&cert(vec![dns.clone(), uri], "cn-a")).as_deref(),
            Some("spiffe://fencer/client-a")
        );
        assert_eq!(certificate_identity(&cert(vec![dns], "cn-a")).as_deref(), Some("client-a.example"));
        assert_eq!(certificate_identity(&cert(vec![], "cn-a")).as_deref(), Some("cn-a"));
        assert_eq!(certificate_identity(&CertificateDer::from(vec![1, 2, 3])), None);
    }
}
