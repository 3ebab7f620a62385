//! TLS on both sides of the proxy (DESIGN §7): the client-facing listener
//! (TLS, and mTLS with the client's certificate identity in the rejection
//! log) and proxy → upstream (https verified against a configured CA, with
//! an optional client certificate). Where TLS is required, plaintext is
//! refused and nothing reaches the upstream. Certificates are made in the
//! test with rcgen; everything runs on loopback.

use std::io::{Read as _, Write as _};
use std::path::Path;
use std::time::Duration;

use fencer_proxy::testing::{CertUse, Status, TestCert, TestClient, TestPki, TestUpstream};
use fencer_proxy::{AdminClient, ProxyConfig, ProxyHandle, RejectReason};
use fencer_testkit::ProxyConfigBuilder;

const SOON: Duration = Duration::from_secs(20);

async fn start_proxy(upstream: &str, data: &Path, tables: &str) -> ProxyHandle {
    let config = ProxyConfigBuilder::new(upstream, data).raw(tables).write(&[], "/db/{name}/*", "db/{name}").build();
    fencer_proxy::start(config, Some(1)).await.unwrap()
}

fn listener_tls(cert: &TestCert, client_ca: Option<&TestPki>) -> String {
    let mut t = format!("[tls]\ncert_file = {:?}\nkey_file = {:?}\n", cert.cert_file, cert.key_file);
    if let Some(ca) = client_ca {
        t.push_str(&format!("client_ca_file = {:?}\n", ca.ca_file()));
    }
    t
}

fn upstream_tls(ca: &TestPki, client: Option<&TestCert>) -> String {
    let mut t = format!("[upstream_tls]\nca_file = {:?}\n", ca.ca_file());
    if let Some(c) = client {
        t.push_str(&format!("cert_file = {:?}\nkey_file = {:?}\n", c.cert_file, c.key_file));
    }
    t
}

/// A raw plaintext HTTP request on a TCP connection: what comes back.
fn raw_plaintext(addr: std::net::SocketAddr) -> Vec<u8> {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(SOON)).unwrap();
    s.write_all(b"POST /db/a/rows HTTP/1.1\r\nhost: x\r\nfencing-token: 5\r\ncontent-length: 1\r\n\r\nv").unwrap();
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    answer
}

/// §7: a TLS listener serves TLS clients that trust its CA and refuses
/// plaintext: the connection is closed without an HTTP answer and nothing
/// reaches the upstream.
#[tokio::test]
async fn t90_plaintext_is_refused_on_a_tls_listener() {
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::new(dir.path(), "proxy");
    let cert = pki.issue("proxy", &["127.0.0.1", "localhost"], CertUse::Server);
    let upstream = TestUpstream::start().await.unwrap();
    let proxy = start_proxy(&upstream.url(), &dir.path().join("data"), &listener_tls(&cert, None)).await;

    let plain = TestClient::new().write(proxy.local_addr(), "/db/a/rows", 5).await;
    assert!(plain.is_err(), "plaintext got an answer: {plain:?}");
    let raw = tokio::task::spawn_blocking({
        let addr = proxy.local_addr();
        move || raw_plaintext(addr)
    })
    .await
    .unwrap();
    assert!(!raw.starts_with(b"HTTP/"), "plaintext got an HTTP answer: {:?}", String::from_utf8_lossy(&raw));
    assert!(upstream.events().is_empty(), "a plaintext request reached the upstream");

    let tls = TestClient::with_tls(pki.client_config(None));
    let ok = tls.write(proxy.local_addr(), "/db/a/rows", 5).await.unwrap();
    assert_eq!(ok.status, Status::OK, "{:?}", ok.body);
    assert_eq!(upstream.applied(), [Some(5)]);
    // A client that does not trust the proxy's CA does not talk to it.
    let other = TestPki::new(dir.path(), "other");
    assert!(TestClient::with_tls(other.client_config(None)).write(proxy.local_addr(), "/db/a/rows", 6).await.is_err());
    proxy.shutdown().await;
}

/// §7 mTLS: with `client_ca_file`, clients without a certificate or with one
/// from another CA are refused before HTTP; a client with a certificate
/// from the configured CA is served, and the rejection log names it by its
/// certificate's identity instead of its address.
#[tokio::test]
async fn t91_mtls_requires_a_client_certificate_and_logs_its_identity() {
    let dir = tempfile::tempdir().unwrap();
    let server_pki = TestPki::new(dir.path(), "proxy");
    let clients = TestPki::new(dir.path(), "clients");
    let strangers = TestPki::new(dir.path(), "strangers");
    let cert = server_pki.issue("proxy", &["127.0.0.1"], CertUse::Server);
    let writer = clients.issue("writer-a", &["writer-a.clients.test"], CertUse::Client);
    let stranger = strangers.issue("mallory", &["mallory.test"], CertUse::Client);
    let upstream = TestUpstream::start().await.unwrap();
    let proxy = start_proxy(&upstream.url(), &dir.path().join("data"), &listener_tls(&cert, Some(&clients))).await;
    let addr = proxy.local_addr();

    let anonymous = TestClient::with_tls(server_pki.client_config(None)).write(addr, "/db/a/rows", 5).await;
    assert!(anonymous.is_err(), "a client without a certificate was served: {anonymous:?}");
    let foreign = TestClient::with_tls(server_pki.client_config(Some(&stranger))).write(addr, "/db/a/rows", 5).await;
    assert!(foreign.is_err(), "a certificate from another CA was accepted: {foreign:?}");
    assert!(upstream.events().is_empty());

    let client = TestClient::with_tls(server_pki.client_config(Some(&writer)));
    assert_eq!(client.write(addr, "/db/a/rows", 5).await.unwrap().status, Status::OK);
    assert_eq!(client.write(addr, "/db/a/rows", 4).await.unwrap().status, Status::CONFLICT);
    let admin = AdminClient::new(&proxy.admin_addr().to_string(), SOON).unwrap();
    let mut caller = None;
    for _ in 0..400 {
        let page = admin.rejections(None, 10).await.unwrap();
        if let Some(r) = page.rejections.into_iter().find(|r| r.reason == RejectReason::StaleToken) {
            caller = Some(r.caller);
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(caller.as_deref(), Some("writer-a.clients.test"));
    proxy.shutdown().await;
}

/// §7 proxy → upstream: an https upstream is verified against `ca_file`
/// and the proxy presents its client certificate when configured. Where
/// the upstream is https, the proxy never falls back to plaintext: a
/// plaintext server, or one whose certificate does not chain to the CA,
/// gets no request (502, nothing sent, safe to retry).
#[tokio::test]
async fn t92_https_upstream_is_verified_and_never_spoken_to_in_plaintext() {
    let dir = tempfile::tempdir().unwrap();
    let db_pki = TestPki::new(dir.path(), "db");
    let db_cert = db_pki.issue("db", &["127.0.0.1"], CertUse::Server);
    let tls_upstream = TestUpstream::start_tls(db_pki.server_config(&db_cert, None)).await.unwrap();
    let https = format!("https://{}", tls_upstream.addr());
    let client = TestClient::new();

    let proxy = start_proxy(&https, &dir.path().join("d1"), &upstream_tls(&db_pki, None)).await;
    assert_eq!(client.write(proxy.local_addr(), "/db/a/rows", 5).await.unwrap().status, Status::OK);
    assert_eq!(tls_upstream.applied(), [Some(5)]);
    proxy.shutdown().await;

    // The same config in front of a plaintext server: refused, never sent.
    let plain_upstream = TestUpstream::start().await.unwrap();
    let proxy = start_proxy(
        &format!("https://{}", plain_upstream.addr()),
        &dir.path().join("d2"),
        &upstream_tls(&db_pki, None),
    )
    .await;
    let resp = client.write(proxy.local_addr(), "/db/a/rows", 6).await.unwrap();
    assert_eq!(resp.status, Status::BAD_GATEWAY, "{:?}", resp.body);
    assert_eq!(resp.json()["type"], "urn:fencer:proxy:upstream-unreachable");
    assert!(plain_upstream.events().is_empty(), "plaintext reached an upstream configured as https");
    proxy.shutdown().await;

    // An upstream whose certificate does not chain to the configured CA.
    let other = TestPki::new(dir.path(), "other");
    let proxy = start_proxy(&https, &dir.path().join("d3"), &upstream_tls(&other, None)).await;
    let resp = client.write(proxy.local_addr(), "/db/a/rows", 7).await.unwrap();
    assert_eq!(resp.status, Status::BAD_GATEWAY, "{:?}", resp.body);
    assert_eq!(tls_upstream.applied(), [Some(5)], "an unverified upstream got the request");
    proxy.shutdown().await;
}

/// §7 mTLS to the upstream: an upstream that requires client certificates
/// serves the proxy configured with one issued by its client CA, and
/// applies nothing from a proxy without one.
#[tokio::test]
async fn t93_the_proxy_presents_its_client_certificate_to_the_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let db_pki = TestPki::new(dir.path(), "db");
    let proxies = TestPki::new(dir.path(), "proxies");
    let db_cert = db_pki.issue("db", &["127.0.0.1"], CertUse::Server);
    let proxy_cert = proxies.issue("proxy-1", &["proxy-1.test"], CertUse::Client);
    let upstream = TestUpstream::start_tls(db_pki.server_config(&db_cert, Some(&proxies))).await.unwrap();
    let https = format!("https://{}", upstream.addr());
    let client = TestClient::new();

    let without = start_proxy(&https, &dir.path().join("d1"), &upstream_tls(&db_pki, None)).await;
    let resp = client.write(without.local_addr(), "/db/a/rows", 5).await.unwrap();
    // With TLS 1.3 the refusal arrives after the request was written, but a
    // refused handshake means nothing was read: 502, not outcome unknown.
    assert_eq!(resp.status, Status::BAD_GATEWAY, "{:?}", resp.body);
    assert!(upstream.applied().is_empty(), "a proxy without a client certificate was served");
    without.shutdown().await;

    let with = start_proxy(&https, &dir.path().join("d2"), &upstream_tls(&db_pki, Some(&proxy_cert))).await;
    assert_eq!(client.write(with.local_addr(), "/db/a/rows", 6).await.unwrap().status, Status::OK);
    assert_eq!(upstream.applied(), [Some(6)]);
    with.shutdown().await;
}

/// Bad TLS files stop the proxy from starting, naming the file.
#[tokio::test]
async fn t94_unusable_tls_files_are_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::new(dir.path(), "proxy");
    let cert = pki.issue("proxy", &["127.0.0.1"], CertUse::Server);
    std::fs::write(dir.path().join("empty.pem"), "").unwrap();
    let text = |tables: &str| {
        format!(
            "listen = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\nupstream = \"http://127.0.0.1:9\"\ndata_dir = {:?}\n{tables}\n[[route]]\npath = \"/*\"\nresource = \"r\"\n",
            dir.path().join("data")
        )
    };
    for (tables, needle) in [
        (
            format!("[tls]\ncert_file = {:?}\nkey_file = {:?}\n", dir.path().join("empty.pem"), cert.key_file),
            "empty.pem",
        ),
        (
            format!("[tls]\ncert_file = {:?}\nkey_file = {:?}\n", cert.cert_file, dir.path().join("nope.key")),
            "nope.key",
        ),
        (format!("[tls]\ncert_file = {:?}\nkey_file = {:?}\n", cert.cert_file, cert.cert_file), "private key"),
    ] {
        let config = ProxyConfig::from_toml_str(&text(&tables)).unwrap();
        let err = fencer_proxy::start(config, Some(1)).await.unwrap_err().to_string();
        assert!(err.contains(needle), "{err}");
    }
}

/// Limits before HTTP: a client beyond `limits.max_connections` is refused
/// at once (503 on a plaintext listener, a closed socket on a TLS one) and
/// counted; a connection that sends nothing is closed after
/// `timeouts.first_byte` and counted, so N silent sockets at a limit of N
/// lock clients out for no longer than that; and `timeouts.tls_handshake`
/// bounds a connection that never starts its handshake (slowloris).
#[tokio::test]
async fn t95_connection_limit_and_handshake_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::new(dir.path(), "proxy");
    let cert = pki.issue("proxy", &["127.0.0.1"], CertUse::Server);
    let upstream = TestUpstream::start().await.unwrap();

    // Two slots, both taken by silent connections; the third is refused.
    let first_byte = Duration::from_millis(1500);
    let tables = format!("[limits]\nmax_connections = 2\n[timeouts]\nfirst_byte = \"{}ms\"\n", first_byte.as_millis());
    let proxy = start_proxy(&upstream.url(), &dir.path().join("d1"), &tables).await;
    let addr = proxy.local_addr();
    let opened = std::time::SystemTime::now();
    let silent: Vec<_> = (0..2).map(|_| std::net::TcpStream::connect(addr).unwrap()).collect();
    // The accept loop takes them in order; give it a moment to.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let refused = tokio::task::spawn_blocking(move || raw_plaintext(addr)).await.unwrap();
    let refused = String::from_utf8_lossy(&refused);
    assert!(refused.starts_with("HTTP/1.1 503"), "the third connection was not refused: {refused:?}");
    assert!(refused.contains("too-many-connections"), "{refused}");
    assert!(upstream.events().is_empty(), "served beyond max_connections");
    // A real client is served once the first-byte timeout closed the
    // silent ones: retried until then, never later.
    let client = TestClient::new();
    let served = loop {
        match client.write(addr, "/db/a/rows", 5).await {
            Ok(resp) if resp.status == Status::OK => break opened.elapsed().unwrap(),
            _ if opened.elapsed().unwrap() > first_byte + SOON => panic!("still locked out by silent sockets"),
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    assert!(served >= first_byte, "served after {served:?}, before the silent sockets timed out");
    let metrics = reqwest_metrics(proxy.admin_addr()).await;
    assert!(metric(&metrics, "fencer_proxy_connections_refused_total") >= 1.0, "{metrics}");
    assert!(metric(&metrics, "fencer_proxy_connections_timed_out_total{stage=\"first_byte\"}") >= 2.0, "{metrics}");
    drop(silent);
    proxy.shutdown().await;

    // A connection that never starts its handshake is closed by the server.
    let tables = format!("{}\n[timeouts]\ntls_handshake = \"200ms\"\n", listener_tls(&cert, None));
    let proxy = start_proxy(&upstream.url(), &dir.path().join("d2"), &tables).await;
    let addr = proxy.local_addr();
    let closed = tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(SOON)).unwrap();
        let started = std::time::SystemTime::now();
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).map(|_| (buf.len(), started.elapsed().unwrap()))
    })
    .await
    .unwrap();
    let (len, after) = closed.expect("the silent connection was not closed");
    assert_eq!(len, 0);
    assert!(after < Duration::from_secs(5), "closed only after {after:?}, not by the 200 ms handshake timeout");
    proxy.shutdown().await;
}

/// The admin API's `/metrics` text.
async fn reqwest_metrics(admin: std::net::SocketAddr) -> String {
    tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(admin).unwrap();
        s.set_read_timeout(Some(SOON)).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    })
    .await
    .unwrap()
}

/// The value of one metric series in a Prometheus text exposition.
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.trim().parse().ok()))
        .unwrap_or_else(|| panic!("no series {series} in {text}"))
}
