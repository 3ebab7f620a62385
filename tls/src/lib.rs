//! TLS building blocks shared by the coordinator and the proxy (rustls with
//! the ring provider): PEM files read with a size bound and errors that name
//! the file, CA root stores, and the identity a client certificate names.
//! The server and client configs stay with their users, which differ.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Largest PEM file read, in bytes.
pub const MAX_PEM_BYTES: u64 = 1024 * 1024;
/// What a verified client certificate that names nobody is called (logs,
/// audit). Never a tenant's identity: the tenants file refuses it.
pub const UNNAMED_CLIENT_CERTIFICATE: &str = "unnamed-client-certificate";
/// Longest caller identity taken from a certificate, in bytes (the tenants
/// file's limit on identities too).
pub const MAX_IDENTITY_BYTES: usize = 256;

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
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A whole file, refused beyond [`MAX_PEM_BYTES`].
pub fn read_bounded(path: &Path) -> Result<Vec<u8>, TlsError> {
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

/// Adds every certificate of a PEM file to `roots` as a trust anchor.
pub fn add_roots(roots: &mut RootCertStore, path: &Path) -> Result<(), TlsError> {
    for cert in load_certs(path)? {
        roots
            .add(cert)
            .map_err(|e| TlsError::Pem { path: path.to_owned(), reason: format!("not a CA certificate: {e}") })?;
    }
    Ok(())
}

/// The trust anchors of one PEM file.
pub fn load_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    add_roots(&mut roots, path)?;
    Ok(roots)
}

/// The caller a verified client certificate names: its first URI SAN (e.g.
/// a SPIFFE id), else its first DNS SAN, else its subject's common name.
/// A name with a control character or longer than [`MAX_IDENTITY_BYTES`]
/// names nobody (`None`): identities authenticate tenants, so two different
/// names must never be made equal by cleaning or cutting them.
pub fn certificate_identity(cert: &CertificateDer<'_>) -> Option<String> {
    let parsed = webpki::EndEntityCert::try_from(cert).ok()?;
    let name = parsed
        .valid_uri_names()
        .next()
        .map(str::to_owned)
        .or_else(|| parsed.valid_dns_names().next().map(str::to_owned))
        .or_else(|| common_name(cert))?;
    let usable = !name.is_empty() && name.len() <= MAX_IDENTITY_BYTES && !name.chars().any(char::is_control);
    usable.then_some(name)
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
        // Never cleaned or cut into another name.
        assert_eq!(certificate_identity(&cert(vec![], "ad\u{7}min")), None, "control character");
        assert_eq!(certificate_identity(&cert(vec![], &"a".repeat(257))), None, "too long");
        assert_eq!(certificate_identity(&cert(vec![], &"a".repeat(256))).map(|n| n.len()), Some(256));
    }
}
