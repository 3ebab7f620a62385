//! The relay against raw protocol bytes (G1, G3): a malformed or oversize
//! frame closes that connection with a FATAL naming the problem and never
//! affects another connection; a FunctionCall (which drivers rarely send)
//! is fenced like a statement.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::fixture::{connect, require_postgres, sidecar};
use crate::{SOON, expect_code};

/// A bare protocol 3.0 connection as `app`, authenticated (trust).
struct Raw {
    stream: TcpStream,
}

fn message(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![tag];
    m.extend_from_slice(&u32::try_from(body.len() + 4).unwrap().to_be_bytes());
    m.extend_from_slice(body);
    m
}

impl Raw {
    async fn connect(addr: SocketAddr) -> Self {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let mut body = 196_608u32.to_be_bytes().to_vec();
        for (k, v) in [("user", "app"), ("database", "postgres")] {
            body.extend_from_slice(k.as_bytes());
            body.push(0);
            body.extend_from_slice(v.as_bytes());
            body.push(0);
        }
        body.push(0);
        let mut packet = u32::try_from(body.len() + 4).unwrap().to_be_bytes().to_vec();
        packet.extend_from_slice(&body);
        stream.write_all(&packet).await.unwrap();
        let mut raw = Self { stream };
        loop {
            let (tag, _) = raw.read().await.expect("authentication");
            if tag == b'Z' {
                return raw;
            }
        }
    }

    /// The next message, or `None` when the connection closed.
    async fn read(&mut self) -> Option<(u8, Vec<u8>)> {
        let mut header = [0u8; 5];
        tokio::time::timeout(SOON, self.stream.read_exact(&mut header)).await.expect("an answer in time").ok()?;
        let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        let mut body = vec![0u8; len - 4];
        self.stream.read_exact(&mut body).await.ok()?;
        Some((header[0], body))
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.unwrap();
    }

    /// Messages up to and including ReadyForQuery (or the close).
    async fn until_ready(&mut self) -> Vec<(u8, Vec<u8>)> {
        let mut out = Vec::new();
        while let Some(m) = self.read().await {
            let ready = m.0 == b'Z';
            out.push(m);
            if ready {
                break;
            }
        }
        out
    }
}

/// The SQLSTATE and severity of an ErrorResponse body.
fn error_of(body: &[u8]) -> (String, String) {
    let mut code = String::new();
    let mut severity = String::new();
    for field in body.split(|&b| b == 0).filter(|f| !f.is_empty()) {
        match field[0] {
            b'C' => code = String::from_utf8_lossy(&field[1..]).into_owned(),
            b'V' => severity = String::from_utf8_lossy(&field[1..]).into_owned(),
            _ => {}
        }
    }
    (code, severity)
}

/// G1: a malformed frame (an unknown message type, an impossible length)
/// or one above `max_statement_bytes` closes only its own connection, with
/// a FATAL naming the problem; a healthy connection beside it goes on.
#[tokio::test]
async fn t46_a_malformed_frame_closes_only_its_connection() {
    let Some(pg) = require_postgres("t46_a_malformed_frame_closes_only_its_connection") else { return };
    let _su = pg.setup().await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = sidecar(&pg, dir.path(), "max_statement_bytes = 65536", "").await;
    let addr = proxy.local_addr();
    let healthy = connect(addr, "app", None).await.unwrap();
    healthy.batch_execute("SET fencer.token = 3").await.unwrap();

    let cases: [(&str, Vec<u8>, &str); 3] = [
        ("an unknown message type", message(b'z', b"x"), "08P01"),
        ("a length below 4", vec![b'Q', 0, 0, 0, 2], "08P01"),
        ("a Query above max_statement_bytes", message(b'Q', &[b' '; 70_000]), "54000"),
    ];
    for (what, bytes, code) in cases {
        let mut raw = Raw::connect(addr).await;
        raw.send(&bytes).await;
        let (tag, body) = raw.read().await.unwrap_or_else(|| panic!("{what}: closed without a FATAL"));
        assert_eq!(tag, b'E', "{what}");
        assert_eq!(error_of(&body), (code.to_owned(), "FATAL".to_owned()), "{what}");
        assert!(raw.read().await.is_none(), "{what}: the connection stayed open");
        healthy.batch_execute("SELECT 1").await.unwrap_or_else(|e| panic!("{what} affected another connection: {e}"));
    }
    // A bad startup packet too.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&[0, 0, 0, 8, 0, 2, 0, 0]).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(SOON, s.read_to_end(&mut answer)).await;
    assert_eq!(answer.first(), Some(&b'E'), "protocol 2 got no FATAL: {answer:?}");
    healthy.batch_execute("SELECT 1").await.unwrap();
    proxy.shutdown().await;
}

/// G3: a FunctionCall is fenced like any statement: refused (FN002) without
/// a token, run with one.
#[tokio::test]
async fn t47_a_function_call_is_fenced() {
    let Some(pg) = require_postgres("t47_a_function_call_is_fenced") else { return };
    let su = pg.setup().await;
    let oid: u32 = su.query_one("SELECT 'pg_backend_pid'::regproc::oid", &[]).await.unwrap().get(0);
    let dir = tempfile::tempdir().unwrap();
    let proxy = sidecar(&pg, dir.path(), "", "").await;
    let mut raw = Raw::connect(proxy.local_addr()).await;
    // FunctionCall: oid, 0 argument formats, 0 arguments, text result.
    let mut body = oid.to_be_bytes().to_vec();
    body.extend_from_slice(&0u16.to_be_bytes());
    body.extend_from_slice(&0u16.to_be_bytes());
    body.extend_from_slice(&0u16.to_be_bytes());
    let call = message(b'F', &body);
    raw.send(&call).await;
    let answer = raw.until_ready().await;
    let error = answer.iter().find(|(t, _)| *t == b'E').map(|(_, b)| error_of(b));
    assert_eq!(error, Some(("FN002".to_owned(), "ERROR".to_owned())), "{answer:?}");
    assert!(!answer.iter().any(|(t, _)| *t == b'V'), "the function ran without a token");

    let mut q = b"SET fencer.token = 4".to_vec();
    q.push(0);
    raw.send(&message(b'Q', &q)).await;
    raw.until_ready().await;
    raw.send(&call).await;
    let answer = raw.until_ready().await;
    assert!(answer.iter().any(|(t, _)| *t == b'V'), "{answer:?}");
    tokio::time::sleep(Duration::from_millis(10)).await;
    // And a stale token refuses it.
    let other = connect(proxy.local_addr(), "app", None).await.unwrap();
    other.batch_execute("SET fencer.token = 5; SELECT 1").await.unwrap();
    raw.send(&call).await;
    let answer = raw.until_ready().await;
    let error = answer.iter().find(|(t, _)| *t == b'E').map(|(_, b)| error_of(b));
    assert_eq!(error, Some(("FN001".to_owned(), "ERROR".to_owned())), "{answer:?}");
    expect_code(other.batch_execute("SET fencer.token = 4").await, "FN001");
    proxy.shutdown().await;
}
