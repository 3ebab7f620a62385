//! A minimal HTTP/1.1 client for loopback status pages (`/readyz`,
//! `/v1/status`, `/metrics`, `/ping`, chromedriver's `/status`): one
//! request per connection (`Connection: close`), the body read up to its
//! `Content-Length` or else to the end (bounded; a server may keep the
//! connection open after a sized answer, as chromedriver does), chunked
//! bodies decoded. Enough for the servers we start; not a general client
//! (tests that exercise HTTP itself use `fencer_proxy::testing::TestClient`).

use std::io;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::process::Proc;

/// Largest response read, in bytes (metrics pages are far smaller).
pub const MAX_RESPONSE_BYTES: u64 = 16 << 20;

/// `METHOD path` on `addr` with `body`, bounded by `timeout`: the status
/// code and the body.
pub async fn http_request(
    addr: impl tokio::net::ToSocketAddrs,
    method: &str,
    path: &str,
    body: &str,
    timeout: Duration,
) -> io::Result<(u16, String)> {
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        let host = s.peer_addr()?;
        s.write_all(request(method, path, &host.to_string(), body).as_bytes()).await?;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 8192];
        while !is_whole(&buf) && (buf.len() as u64) < MAX_RESPONSE_BYTES {
            let n = s.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        parse(&buf)
    };
    tokio::time::timeout(timeout, exchange).await.map_err(|_| {
        io::Error::new(io::ErrorKind::TimedOut, format!("{method} {path}: no answer within {timeout:?}"))
    })?
}

/// `GET path` on `addr` within `timeout`: (status, body).
pub async fn http_get(
    addr: impl tokio::net::ToSocketAddrs,
    path: &str,
    timeout: Duration,
) -> io::Result<(u16, String)> {
    http_request(addr, "GET", path, "", timeout).await
}

/// `GET path` for synchronous tests: (status, body), `None` when nothing
/// answered within 5 s.
pub fn http_get_blocking(addr: impl std::net::ToSocketAddrs, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let host = s.peer_addr().ok()?;
    s.write_all(request("GET", path, &host.to_string(), "").as_bytes()).ok()?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    while !is_whole(&buf) && (buf.len() as u64) < MAX_RESPONSE_BYTES {
        match s.read(&mut chunk).ok()? {
            0 => break,
            n => buf.extend_from_slice(&chunk[..n]),
        }
    }
    parse(&buf).ok()
}

/// Whether `raw` holds a whole response by its `Content-Length` (without
/// one, the body ends with the connection).
fn is_whole(raw: &[u8]) -> bool {
    let Some((head, body)) = split_head(raw) else { return false };
    header(&head, "content-length").and_then(|v| v.parse::<usize>().ok()).is_some_and(|n| body.len() >= n)
}

/// A response's head (up to the blank line) and the bytes after it.
fn split_head(raw: &[u8]) -> Option<(std::borrow::Cow<'_, str>, &[u8])> {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    Some((String::from_utf8_lossy(&raw[..split]), &raw[split + 4..]))
}

/// The trimmed value of header `name` (any case) in a response's head.
fn header<'h>(head: &'h str, name: &str) -> Option<&'h str> {
    head.lines()
        .find_map(|l| l.split_once(':').filter(|(k, _)| k.trim().eq_ignore_ascii_case(name)).map(|(_, v)| v.trim()))
}

/// Polls `GET path` until it answers `want`; panics with the process's log
/// when `timeout` passes or the process exited first.
pub async fn wait_http(addr: std::net::SocketAddr, path: &str, want: u16, proc: &mut Proc, timeout: Duration) {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let got = http_get(addr, path, Duration::from_secs(2)).await;
        if got.as_ref().is_ok_and(|(code, _)| *code == want) {
            return;
        }
        if let Some(status) = proc.exited() {
            panic!(
                "{} exited ({status}) before {addr}{path} answered {want}; its log:\n{}",
                proc.name(),
                proc.log_text()
            );
        }
        if tokio::time::Instant::now() > deadline {
            panic!(
                "{} did not answer {path} with {want} within {timeout:?} (last: {got:?}); its log:\n{}",
                proc.name(),
                proc.log_text()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn request(method: &str, path: &str, host: &str, body: &str) -> String {
    format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

fn parse(raw: &[u8]) -> io::Result<(u16, String)> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("not an HTTP response: {what}"));
    let (head, body) = split_head(raw).ok_or_else(|| bad("no end of the head"))?;
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).ok_or_else(|| bad("no status code"))?;
    let chunked = header(&head, "transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
    let body = if chunked { dechunk(body).ok_or_else(|| bad("a broken chunked body"))? } else { body.to_vec() };
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

fn dechunk(mut rest: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = rest.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&rest[..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(rest.get(..size)?);
        rest = rest.get(size + 2..)?;
    }
}

/// Starts `fencer proxy` with the simple flags for resource `main` (`GET
/// /ping` a read route) in front of `upstream`, with `--floor` when given,
/// and waits (30 s at most) until its admin API answers `/livez`.
pub async fn spawn_http_proxy(
    listen: std::net::SocketAddr,
    admin: std::net::SocketAddr,
    upstream: &str,
    data_dir: &std::path::Path,
    floor: Option<u64>,
    log: &std::path::Path,
) -> Proc {
    let mut cmd = std::process::Command::new(crate::process::fencer_bin());
    cmd.args(["proxy", "--listen", &listen.to_string(), "--admin", &admin.to_string()])
        .args(["--upstream", upstream, "--resource", "main", "--read-route", "GET:/ping"])
        .arg("--data-dir")
        .arg(data_dir);
    if let Some(f) = floor {
        cmd.args(["--floor", &f.to_string()]);
    }
    let mut proxy = Proc::spawn("fencer proxy", &mut cmd, log);
    wait_http(admin, "/livez", 200, &mut proxy, Duration::from_secs(30)).await;
    proxy
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_chunked_bodies_are_read() {
        let plain = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";
        assert_eq!(parse(plain).unwrap(), (200, "hello".to_string()));
        let chunked = b"HTTP/1.1 503 Service Unavailable\r\ntransfer-encoding: chunked\r\n\r\n4\r\nno q\r\n6\r\nuorum\n\r\n0\r\n\r\n";
        assert_eq!(parse(chunked).unwrap(), (503, "no quorum\n".to_string()));
        assert!(parse(b"garbage").is_err());
    }

    #[test]
    fn a_response_is_whole_at_its_content_length() {
        assert!(!is_whole(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhell"));
        assert!(is_whole(b"HTTP/1.1 200 OK\r\ncontent-length:5\r\n\r\nhello"));
        assert!(!is_whole(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n"));
        // No length: only the end of the connection ends it.
        assert!(!is_whole(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n"));
    }

    #[tokio::test]
    async fn a_sized_answer_is_read_without_waiting_for_the_close() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let _ = conn.read(&mut buf).await;
            conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").await.unwrap();
            // Kept open, as chromedriver keeps it, until the test ends.
            tokio::time::sleep(Duration::from_secs(30)).await;
        });
        assert_eq!(http_get(addr, "/", Duration::from_secs(5)).await.unwrap(), (200, "ok".to_string()));
        server.abort();
    }

    #[tokio::test]
    async fn a_silent_server_times_out() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let err = http_get(addr, "/", Duration::from_millis(100)).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        drop(listener);
    }
}
