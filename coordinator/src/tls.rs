//! TLS for the node's port (rustls, ring provider): the server config, the
//! classification of a connection's client certificate (a peer of the
//! cluster, a client identity, or none), the client config for raft traffic
//! to peers, and the local certificate authority of `fencer dev --tls`.
//!
//! One port carries the lock API and raft traffic, so client certificates
//! are *optional* in the handshake and checked per request: raft calls need
//! a certificate that chains to the peer CA, lock calls need an identity the
//! tenants file knows (module `tenants`). PEM loading and certificate identities
//! come from `fencer-tls`, shared with the proxy.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::{CertificateDer, UnixTime};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

/// Default bound on one TLS handshake.
pub const DEFAULT_TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// TLS settings of a node (`fencer coordinator --tls-cert …`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeTls {
    /// The node's certificate chain (PEM, leaf first). It is presented to
    /// clients and peers, and as the client certificate when this node calls
    /// a peer: give it both the serverAuth and clientAuth extended key
    /// usages (or none), and a subject alternative name for the address
    /// clients and peers dial.
    pub cert_file: PathBuf,
    /// Its private key (PEM PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// The CA client certificates are verified against; a verified client
    /// certificate names a client identity (module `tenants`).
    pub client_ca_file: Option<PathBuf>,
    /// The CA of the cluster's nodes: raft traffic is accepted only from a
    /// connection whose client certificate chains to it, and a peer's server
    /// certificate must chain to it. Required for a cluster of more than one
    /// node with TLS. Use a CA of its own: every certificate it issued can
    /// act as a node of the cluster.
    pub peer_ca_file: Option<PathBuf>,
    /// Bound on one TLS handshake.
    pub handshake_timeout: Duration,
}

pub(crate) use fencer_tls::provider;
pub use fencer_tls::{TlsError, certificate_identity};
use fencer_tls::{add_roots, load_certs, load_key, read_bounded};

fn verifier(paths: &[&Path], optional: bool) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let mut roots = RootCertStore::empty();
    for p in paths {
        add_roots(&mut roots, p)?;
    }
    let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider());
    let builder = if optional { builder.allow_unauthenticated() } else { builder };
    builder.build().map_err(|e| TlsError::Config { what: "client CA", reason: e.to_string() })
}

/// Who is at the other end of a connection, as its TLS handshake showed.
/// Every request carries it as an extension; requests on a plaintext port
/// carry the default (no TLS, no certificate).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnInfo {
    /// The connection is TLS.
    pub tls: bool,
    /// The client certificate chains to the peer CA: another node.
    pub peer: bool,
    /// The client certificate chains to the client CA: its identity (first
    /// URI SAN, else first DNS SAN, else subject common name).
    pub client_identity: Option<Arc<str>>,
}

/// The node's TLS acceptor side: the rustls server config and the
/// verifiers that classify a handshake's client certificate.
#[derive(Clone)]
pub(crate) struct ServerTls {
    pub(crate) config: Arc<ServerConfig>,
    pub(crate) handshake_timeout: Duration,
    peer: Option<Arc<dyn ClientCertVerifier>>,
    client: Option<Arc<dyn ClientCertVerifier>>,
}

impl ServerTls {
    /// Loads the node's certificate and key and the CAs. TLS 1.2 and 1.3;
    /// ALPN h2 (gRPC) and http/1.1 (JSON, metrics).
    pub(crate) fn new(tls: &NodeTls) -> Result<Self, TlsError> {
        let certs = load_certs(&tls.cert_file)?;
        let key = load_key(&tls.key_file)?;
        let cas: Vec<&Path> = tls.client_ca_file.iter().chain(tls.peer_ca_file.iter()).map(PathBuf::as_path).collect();
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config { what: "node TLS", reason: e.to_string() })?;
        let builder = if cas.is_empty() {
            builder.with_no_client_auth()
        } else {
            builder.with_client_cert_verifier(verifier(&cas, true)?)
        };
        let mut config = builder
            .with_single_cert(certs, key)
            .map_err(|e| TlsError::Config { what: "node certificate and key", reason: e.to_string() })?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Self {
            config: Arc::new(config),
            handshake_timeout: tls.handshake_timeout,
            peer: tls.peer_ca_file.as_deref().map(|p| verifier(&[p], false)).transpose()?,
            client: tls.client_ca_file.as_deref().map(|p| verifier(&[p], false)).transpose()?,
        })
    }

    /// Classifies the certificate chain a client presented (already
    /// verified against the union of the CAs by the handshake).
    pub(crate) fn classify(&self, chain: Option<&[CertificateDer<'static>]>) -> ConnInfo {
        let mut info = ConnInfo { tls: true, ..ConnInfo::default() };
        let Some((leaf, intermediates)) = chain.and_then(|c| c.split_first()) else {
            return info;
        };
        let verified = |v: &Option<Arc<dyn ClientCertVerifier>>| {
            v.as_ref().is_some_and(|v| v.verify_client_cert(leaf, intermediates, UnixTime::now()).is_ok())
        };
        info.peer = verified(&self.peer);
        if verified(&self.client) {
            info.client_identity = Some(Arc::from(
                certificate_identity(leaf).unwrap_or_else(|| fencer_tls::UNNAMED_CLIENT_CERTIFICATE.into()),
            ));
        }
        info
    }
}

/// The client side of raft traffic to peers: https, the peer's server
/// certificate must chain to the peer CA, and this node presents its own
/// certificate.
pub(crate) fn peer_client_tls(tls: &NodeTls) -> Result<Option<ClientTlsConfig>, TlsError> {
    let Some(peer_ca) = &tls.peer_ca_file else {
        return Ok(None);
    };
    // Loaded here only to report a bad file at start; tonic parses the PEM again.
    load_certs(peer_ca)?;
    load_certs(&tls.cert_file)?;
    load_key(&tls.key_file)?;
    Ok(Some(
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(read_bounded(peer_ca)?))
            .identity(Identity::from_pem(read_bounded(&tls.cert_file)?, read_bounded(&tls.key_file)?))
            .timeout(tls.handshake_timeout),
    ))
}

/// The endpoint of a peer (`host:port`): https with `tls`, else http.
pub(crate) fn peer_endpoint(addr: &str, tls: Option<&ClientTlsConfig>) -> Result<Endpoint, String> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let endpoint =
        Endpoint::from_shared(format!("{scheme}://{addr}")).map_err(|e| format!("bad address {addr:?}: {e}"))?;
    match tls {
        None => Ok(endpoint),
        Some(t) => endpoint.tls_config(t.clone()).map_err(|e| format!("TLS for {addr}: {e}")),
    }
}

/// What a certificate issued by [`DevCa`] is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CertUse {
    /// A node: serverAuth and clientAuth (it calls its peers too).
    Node,
    /// A client (mTLS): clientAuth.
    Client,
}

/// A certificate and its key as PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFiles {
    /// The certificate.
    pub cert_file: PathBuf,
    /// The private key (PKCS#8, mode 0600).
    pub key_file: PathBuf,
}

/// A local certificate authority (rcgen, ECDSA P-256) writing PEM files
/// into one directory: what `fencer dev --tls` creates, and what tests use.
/// Not for production: the CA key sits next to the certificates.
pub struct DevCa {
    dir: PathBuf,
    name: String,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl std::fmt::Debug for DevCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevCa").field("dir", &self.dir).field("name", &self.name).finish_non_exhaustive()
    }
}

fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

fn rcgen_error(e: rcgen::Error) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

impl DevCa {
    /// A new CA named `name`: writes `{dir}/{name}.pem` and `{dir}/{name}.key` (0600).
    pub fn create(dir: &Path, name: &str) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let key = rcgen::KeyPair::generate().map_err(rcgen_error)?;
        let mut params = rcgen::CertificateParams::default();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, format!("fencer {name}"));
        params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key).map_err(rcgen_error)?;
        std::fs::write(dir.join(format!("{name}.pem")), cert.pem())?;
        write_private(&dir.join(format!("{name}.key")), &key.serialize_pem())?;
        Ok(Self { dir: dir.to_owned(), name: name.to_owned(), issuer: rcgen::Issuer::new(params, key) })
    }

    /// The CA certificate's PEM file.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join(format!("{}.pem", self.name))
    }

    /// Issues a certificate with common name `cn` and subject alternative
    /// names `sans` (IP addresses or DNS names; a `spiffe://` or other URI
    /// is a URI SAN); writes `{dir}/{file}.pem` and `{dir}/{file}.key` (0600).
    pub fn issue(&self, file: &str, cn: &str, sans: &[&str], usage: CertUse) -> std::io::Result<CertFiles> {
        let key = rcgen::KeyPair::generate().map_err(rcgen_error)?;
        let mut params = rcgen::CertificateParams::default();
        for san in sans {
            let san = if let Ok(ip) = san.parse::<std::net::IpAddr>() {
                rcgen::SanType::IpAddress(ip)
            } else if san.contains("://") {
                rcgen::SanType::URI((*san).try_into().map_err(rcgen_error)?)
            } else {
                rcgen::SanType::DnsName((*san).try_into().map_err(rcgen_error)?)
            };
            params.subject_alt_names.push(san);
        }
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        params.extended_key_usages = match usage {
            CertUse::Node => {
                vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth, rcgen::ExtendedKeyUsagePurpose::ClientAuth]
            }
            CertUse::Client => vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth],
        };
        let cert = params.signed_by(&key, &self.issuer).map_err(rcgen_error)?;
        let files = CertFiles {
            cert_file: self.dir.join(format!("{file}.pem")),
            key_file: self.dir.join(format!("{file}.key")),
        };
        std::fs::write(&files.cert_file, cert.pem())?;
        write_private(&files.key_file, &key.serialize_pem())?;
        Ok(files)
    }
}

/// The files of `fencer dev --tls` under `DATA_DIR/tls`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevPki {
    /// The CA certificate (clients trust it with `--ca`).
    pub ca_file: PathBuf,
    /// The node's certificate (127.0.0.1, ::1, localhost).
    pub server: CertFiles,
    /// A client certificate (CN `dev-client`) for mTLS.
    pub client: CertFiles,
    /// Whether this call created them (else they were reused).
    pub created: bool,
}

impl DevPki {
    /// Reuses the files in `dir` when all are there, else creates a CA, a
    /// server certificate for loopback and a client certificate.
    pub fn load_or_create(dir: &Path) -> std::io::Result<Self> {
        let server = CertFiles { cert_file: dir.join("node.pem"), key_file: dir.join("node.key") };
        let client = CertFiles { cert_file: dir.join("client.pem"), key_file: dir.join("client.key") };
        let ca_file = dir.join("ca.pem");
        let all = [&ca_file, &server.cert_file, &server.key_file, &client.cert_file, &client.key_file];
        if all.iter().all(|p| p.is_file()) {
            return Ok(Self { ca_file, server, client, created: false });
        }
        let ca = DevCa::create(dir, "ca")?;
        let server = ca.issue("node", "fencer-dev-node", &["127.0.0.1", "::1", "localhost"], CertUse::Node)?;
        let client = ca.issue("client", "dev-client", &[], CertUse::Client)?;
        Ok(Self { ca_file: ca.ca_file(), server, client, created: true })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_pki_is_created_once_with_private_keys() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let first = DevPki::load_or_create(dir.path()).unwrap();
        assert!(first.created);
        let mode = std::fs::metadata(&first.client.key_file).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "keys are private");
        let again = DevPki::load_or_create(dir.path()).unwrap();
        assert!(!again.created);
        assert_eq!(again.ca_file, first.ca_file);
        let cert = &load_certs(&first.client.cert_file).unwrap()[0];
        assert_eq!(certificate_identity(cert).as_deref(), Some("dev-client"));
    }

    #[test]
    fn client_certificates_are_classified_by_their_ca() {
        let dir = tempfile::tempdir().unwrap();
        let clients = DevCa::create(dir.path(), "clients").unwrap();
        let peers = DevCa::create(dir.path(), "peers").unwrap();
        let node = peers.issue("n1", "node-1", &["127.0.0.1"], CertUse::Node).unwrap();
        let alice = clients.issue("alice", "alice", &[], CertUse::Client).unwrap();
        let tls = NodeTls {
            cert_file: node.cert_file.clone(),
            key_file: node.key_file.clone(),
            client_ca_file: Some(clients.ca_file()),
            peer_ca_file: Some(peers.ca_file()),
            handshake_timeout: DEFAULT_TLS_HANDSHAKE_TIMEOUT,
        };
        let server = ServerTls::new(&tls).unwrap();
        let a = server.classify(Some(&load_certs(&alice.cert_file).unwrap()));
        assert_eq!((a.peer, a.client_identity.as_deref()), (false, Some("alice")));
        let n = server.classify(Some(&load_certs(&node.cert_file).unwrap()));
        assert_eq!((n.peer, n.client_identity), (true, None));
        assert_eq!(server.classify(None), ConnInfo { tls: true, ..ConnInfo::default() });
        let err = ServerTls::new(&NodeTls { key_file: dir.path().join("missing.key"), ..tls }).err().unwrap();
        assert!(err.to_string().contains("missing.key"), "{err}");
    }
}
