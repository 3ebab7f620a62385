//! The node's port against connections that send nothing, or too slowly
//! (issue 15 item 4): at a limit of N connections, N+1 silent sockets get
//! one refused at once (logged and counted) and the others closed at the
//! first-byte timeout, after which a normal request is answered; a head
//! sent too slowly, an idle keep-alive connection and a body sent too
//! slowly are cut at their timeouts.

use std::net::SocketAddr;
use std::time::Duration;

use fencer_coordinator::ConnectionLimits;
use fencer_testkit::node::{fast_config, start_with};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

const LIMIT: usize = 4;
const FIRST_BYTE: Duration = Duration::from_secs(2);
const HEADER: Duration = Duration::from_secs(2);
const BODY: Duration = Duration::from_secs(2);
/// Scheduling slack on a shared machine.
const SLACK: Duration = Duration::from_secs(3);

/// Reads until the server closes `s` (or resets it); the bytes it sent.
async fn until_closed(s: &mut TcpStream, within: Duration) -> Vec<u8> {
    let mut got = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(within, read).await.expect("the server closed the connection in time");
    got
}

async fn readyz(addr: SocketAddr) -> Option<String> {
    let mut s = TcpStream::connect(addr).await.ok()?;
    s.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.ok()?;
    let got = until_closed(&mut s, SLACK).await;
    let text = String::from_utf8_lossy(&got).to_string();
    text.starts_with("HTTP/1.1 200").then_some(text)
}

#[tokio::test]
async fn t37_silent_slow_and_idle_connections_are_cut_and_a_normal_request_gets_through() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = fast_config(dir.path());
    config.connections = ConnectionLimits {
        max_connections: LIMIT,
        first_byte_timeout: FIRST_BYTE,
        header_timeout: HEADER,
        body_timeout: BODY,
    };
    let node = start_with(config).await;
    let addr = node.local_addr();

    // N+1 silent sockets: one is refused at once, N wait for the timeout.
    let opened = Instant::now();
    let mut silent = Vec::new();
    for _ in 0..=LIMIT {
        silent.push(TcpStream::connect(addr).await.unwrap());
    }
    let closes = futures::future::join_all(silent.iter_mut().map(|s| async {
        until_closed(s, FIRST_BYTE + SLACK).await;
        opened.elapsed()
    }))
    .await;
    let early = closes.iter().filter(|t| **t < FIRST_BYTE).count();
    assert_eq!(early, 1, "exactly the connection above the limit is closed before the timeout: {closes:?}");
    assert_eq!(node.metrics().connections_refused.get(), 1, "the refusal is counted");
    // A normal request is answered within the first-byte timeout of the
    // silent sockets (plus slack), without waiting for them to go away.
    let answered = readyz(addr).await;
    assert!(answered.is_some(), "a normal request after the silent ones");
    assert!(opened.elapsed() < FIRST_BYTE + SLACK, "{:?}", opened.elapsed());
    let metrics = fencer_testkit::http_get(addr, "/metrics", SLACK).await.unwrap().1;
    assert!(metrics.contains("fencer_connections_refused_total 1"), "the metric is exported");

    // A head that never ends is cut at the header timeout.
    let mut slow_head = TcpStream::connect(addr).await.unwrap();
    let sent = Instant::now();
    slow_head.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    until_closed(&mut slow_head, HEADER + SLACK).await;
    assert!(sent.elapsed() >= HEADER - Duration::from_millis(100), "not before the header timeout");

    // An idle keep-alive connection is closed after the header timeout.
    let mut idle = TcpStream::connect(addr).await.unwrap();
    idle.write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let mut first = [0u8; 12];
    idle.read_exact(&mut first).await.unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    let answered = Instant::now();
    until_closed(&mut idle, HEADER + SLACK).await;
    assert!(answered.elapsed() >= HEADER - Duration::from_millis(500), "{:?}", answered.elapsed());

    // A JSON body that never arrives in full: 408 with the error body.
    let mut slow_body = TcpStream::connect(addr).await.unwrap();
    slow_body
        .write_all(
            b"POST /v1/acquire HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
        )
        .await
        .unwrap();
    let got = String::from_utf8_lossy(&until_closed(&mut slow_body, BODY + SLACK).await).to_string();
    assert!(got.starts_with("HTTP/1.1 408"), "{got}");
    assert!(got.contains(r#""reason":"BODY_TIMEOUT""#), "{got}");
    node.shutdown().await;
}

/// A node binds its ports before it opens its stores and listens only once
/// it serves (`server::Reserved`): ports that cannot both listen are refused
/// before the data dir is used, with errors that name them.
#[tokio::test]
async fn t37_ports_that_cannot_listen_are_refused_before_the_stores_open() {
    let dir = tempfile::tempdir().unwrap();

    // Another process listens on the port: the bind already fails.
    let taken = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = taken.local_addr().unwrap();
    let mut config = fast_config(&dir.path().join("taken"));
    config.listen = addr;
    let err = fencer_coordinator::Node::start(config).await.err().expect("a port in use is refused");
    assert!(matches!(err, fencer_coordinator::StartError::Bind { .. }), "{err}");
    assert!(err.to_string().contains(&addr.to_string()), "the error names the port: {err}");
    assert!(!dir.path().join("taken").join("raft-log").exists(), "the stores were not opened");

    // Both ports of the node on one address: both would bind (neither
    // listens yet), so the start checks them first.
    let mut config = fast_config(&dir.path().join("same"));
    let free = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    config.listen = free;
    config.status_listen = Some(SocketAddr::new("0.0.0.0".parse().unwrap(), free.port()));
    let err = fencer_coordinator::Node::start(config).await.err().expect("one port for both is refused");
    assert!(matches!(err, fencer_coordinator::StartError::Config(_)), "{err}");
    assert!(err.to_string().contains("same port"), "{err}");
    assert!(!dir.path().join("same").join("raft-log").exists(), "the stores were not opened");
}
