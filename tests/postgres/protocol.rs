//! G1, the transparent relay: what drivers do passes unchanged. The
//! extended protocol with pipelining, simple multi-statement Queries, COPY
//! in both directions, CancelRequest routed to the right backend, NOTIFY,
//! TLS on the client leg (SCRAM-SHA-256-PLUS withdrawn), SCRAM through the
//! relay, a 100 MB COPY streamed without the sidecar holding it, and 500
//! idle connections.

use std::process::{Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use fencer_proxy::testing::{CertUse, TestPki};
use futures::{SinkExt, StreamExt};
use tokio_postgres::AsyncMessage;

use crate::fixture::{SCRAM_PASSWORD, connect, connect_as, free_addr, require_postgres, sidecar, sidecar_config};
use crate::{SOON, expect_code};

/// Pipelined extended-protocol statements and a multi-statement simple
/// Query, on a fenced connection.
#[tokio::test]
async fn t40_pipelining_and_multi_statement_queries() {
    let Some(pg) = require_postgres("t40_pipelining_and_multi_statement_queries") else { return };
    let su = pg.setup().await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = sidecar(&pg, dir.path(), "", "").await;
    let c = connect(proxy.local_addr(), "app", None).await.unwrap();
    c.batch_execute("SET fencer.token = 5").await.unwrap();
    let insert = c.prepare("INSERT INTO fenced (writer, token) VALUES ($1, $2) RETURNING id").await.unwrap();
    let calls = (0..200).map(|i| {
        let (c, insert) = (&c, &insert);
        async move { c.query_one(insert, &[&format!("p{i}"), &5i64]).await.map(|r| r.get::<_, i64>(0)) }
    });
    let ids: Vec<i64> = futures::future::join_all(calls).await.into_iter().map(Result::unwrap).collect();
    assert_eq!(ids.len(), 200);
    let results = c
        .simple_query("INSERT INTO fenced (writer, token) VALUES ('m1', 5); SELECT count(*) FROM fenced; INSERT INTO fenced (writer, token) VALUES ('m2', 5)")
        .await
        .unwrap();
    let counts: Vec<&str> = results
        .iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0),
            _ => None,
        })
        .collect();
    assert_eq!(counts, ["201"]);
    assert_eq!(pg.rows(&su).await.len(), 202);
    proxy.shutdown().await;
}

/// COPY FROM STDIN and COPY TO STDOUT through the sidecar.
#[tokio::test]
async fn t41_copy_in_and_out() {
    let Some(pg) = require_postgres("t41_copy_in_and_out") else { return };
    let su = pg.setup().await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = sidecar(&pg, dir.path(), "", "").await;
    let c = connect(proxy.local_addr(), "app", None).await.unwrap();
    c.batch_execute("SET fencer.token = 6").await.unwrap();
    let sink = c.copy_in("COPY fenced (writer, token) FROM STDIN").await.unwrap();
    futures::pin_mut!(sink);
    for i in 0..1000 {
        sink.send(Bytes::from(format!("c{i}\t6\n"))).await.unwrap();
    }
    assert_eq!(sink.finish().await.unwrap(), 1000);
    // And the same again, the statement run through the simple protocol's
    // error path: a bad row fails the COPY and the connection goes on.
    let sink = c.copy_in("COPY fenced (writer, token) FROM STDIN").await.unwrap();
    futures::pin_mut!(sink);
    sink.send(Bytes::from_static(b"bad\tnot-a-number\n")).await.unwrap();
    assert!(sink.finish().await.is_err());
    c.batch_execute("INSERT INTO fenced (writer, token) VALUES ('after', 6)").await.unwrap();

    let out = c.copy_out("COPY (SELECT writer FROM fenced ORDER BY id) TO STDOUT").await.unwrap();
    let chunks: Vec<Bytes> = out.map(Result::unwrap).collect().await;
    let text: Vec<u8> = chunks.concat();
    assert_eq!(text.split(|&b| b == b'\n').filter(|l| !l.is_empty()).count(), 1001);
    assert_eq!(pg.rows(&su).await.len(), 1001);
    proxy.shutdown().await;
}

/// A CancelRequest on a new connection reaches the backend it names: the
/// running `pg_sleep` is cancelled, the connection goes on.
#[tokio::test]
async fn t42_cancel_reaches_the_right_backend() {
    let Some(pg) = require_postgres("t42_cancel_reaches_the_right_backend") else { return };
    let _su = pg.setup().await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = sidecar(&pg, dir.path(), "", "").await;
    let c = connect(proxy.local_addr(), "app", None).await.unwrap();
    let other = connect(proxy.local_addr(), "app", None).await.unwrap();
    c.batch_execute("SET fencer.token = 7").await.unwrap();
    other.batch_execute("SET fencer.token = 7").await.unwrap();
    let cancel = c.cancel_token();
    let (slow, other_slow) = tokio::join!(
        async {
            let started = std::time::SystemTime::now();
            let r = c.batch_execute("SELECT pg_sleep(20)").await;
            (r, started.elapsed().unwrap())
        },
        async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            cancel.cancel_query(tokio_postgres::NoTls).await.unwrap();
            // The other connection's statement is not cancelled.
            other.batch_execute("SELECT pg_sleep(0.5)").await
        }
    );
    let (result, took) = slow;
    expect_code(result, "57014");
    assert!(took < Duration::from_secs(10), "cancelled only after {took:?}");
    other_slow.unwrap();
    c.batch_execute("SELECT 1").await.unwrap();
    // A cancel key the sidecar never relayed is ignored.
    let bogus = tokio::net::TcpStream::connect(proxy.local_addr()).await;
    if let Ok(mut s) = bogus {
        use tokio::io::AsyncWriteExt;
        let mut packet = vec![0, 0, 0, 16, 0x04, 0xd2, 0x16, 0x2e];
        packet.extend_from_slice(&1u32.to_be_bytes());
        packet.extend_from_slice(&2u32.to_be_bytes());
        s.write_all(&packet).await.unwrap();
    }
    proxy.shutdown().await;
}

/// NOTIFY from a fenced connection reaches a LISTENing one.
#[tokio::test]
async fn t43_notify_is_delivered() {
    let Some(pg) = require_postgres("t43_notify_is_delivered") else { return };
    let _su = pg.setup().await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = sidecar(&pg, dir.path(), "", "").await;
    let mut config = tokio_postgres::Config::new();
    config.host("127.0.0.1").port(proxy.local_addr().port()).user("reporting").dbname("postgres");
    let (listener, mut connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
    tokio::spawn(async move {
        while let Some(Ok(m)) = messages.next().await {
            if let AsyncMessage::Notification(n) = m {
                let _ = tx.send(n.payload().to_owned());
            }
        }
    });
    listener.batch_execute("LISTEN fencer_test").await.unwrap();
    let notifier = connect(proxy.local_addr(), "app", None).await.unwrap();
    notifier.batch_execute("SET fencer.token = 8; NOTIFY fencer_test, 'hello through the fence'").await.unwrap();
    let payload = tokio::time::timeout(SOON, rx.recv()).await.expect("notified").unwrap();
    assert_eq!(payload, "hello through the fence");
    proxy.shutdown().await;
}

/// Runs psql without blocking the runtime the in-process sidecar runs on.
async fn psql(pg: &crate::fixture::TestPostgres, conninfo: &str, sql: &str) -> std::process::Output {
    let cmd = pg.tool("psql");
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.args(["-X", "-At", "-v", "ON_ERROR_STOP=1", "-d", conninfo, "-c", sql]).stdin(Stdio::null());
    tokio::time::timeout(SOON, cmd.output()).await.expect("psql finished in time").expect("run psql")
}

/// TLS on the client leg with SCRAM through the relay: psql (libpq) over
/// TLS authenticates as a SCRAM role; channel binding cannot cross the
/// relay, so `SCRAM-SHA-256-PLUS` is not offered and `channel_binding=
/// require` fails while the default `prefer` works. SCRAM on a plaintext
/// client leg works too.
#[tokio::test]
async fn t44_tls_and_scram_through_the_relay() {
    let Some(pg) = require_postgres("t44_tls_and_scram_through_the_relay") else { return };
    let _su = pg.setup().await;
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::new(dir.path(), "sidecar");
    let cert = pki.issue("sidecar", &["127.0.0.1", "localhost"], CertUse::Server);
    let tls = format!("[tls]\ncert_file = {:?}\nkey_file = {:?}\n", cert.cert_file, cert.key_file);
    let proxy = sidecar(&pg, dir.path(), "", &tls).await;
    let port = proxy.local_addr().port();
    let base = format!(
        "host=127.0.0.1 port={port} dbname=postgres user=scram_user password='{SCRAM_PASSWORD}' options='-c fencer.token=9' sslrootcert={} ",
        pki.ca_file().display()
    );
    let ok =
        psql(&pg, &format!("{base} sslmode=verify-ca"), "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .await;
    assert!(ok.status.success(), "psql over TLS with SCRAM: {}", String::from_utf8_lossy(&ok.stderr));
    // The upstream leg is plaintext on loopback (G9); the client's is TLS.
    assert_eq!(String::from_utf8_lossy(&ok.stdout).trim(), "f");
    let bound = psql(&pg, &format!("{base} sslmode=verify-ca channel_binding=require"), "SELECT 1").await;
    assert!(!bound.status.success(), "channel binding cannot cross the relay, yet it was accepted");
    let plain = psql(&pg, &format!("{base} sslmode=disable"), "SELECT 1").await;
    assert!(!plain.status.success(), "a TLS listener accepted a plaintext connection");
    assert!(String::from_utf8_lossy(&plain.stderr).contains("only TLS"), "{}", String::from_utf8_lossy(&plain.stderr));
    // A wrong password is refused by PostgreSQL itself.
    let wrong = format!("host=127.0.0.1 port={port} dbname=postgres user=scram_user password=nope sslmode=require");
    assert!(!psql(&pg, &wrong, "SELECT 1").await.status.success());
    proxy.shutdown().await;

    // SCRAM on a plaintext client leg, with tokio-postgres.
    let proxy = sidecar(&pg, &dir.path().join("plain"), "", "").await;
    let c = connect(proxy.local_addr(), "scram_user", Some(SCRAM_PASSWORD)).await.unwrap();
    c.batch_execute("SET fencer.token = 9; INSERT INTO fenced (writer, token) VALUES ('scram', 9)").await.unwrap();
    assert!(connect(proxy.local_addr(), "scram_user", Some("wrong")).await.is_err());
    proxy.shutdown().await;
}

/// The sidecar's peak resident memory, from `/proc/PID/status`.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// A 100 MB COPY streams through a `fencer proxy` process whose peak memory
/// grows by far less than the COPY; then 500 idle connections are held and
/// each still answers.
#[tokio::test]
async fn t45_a_100mb_copy_streams_and_500_idle_connections() {
    let Some(pg) = require_postgres("t45_a_100mb_copy_streams_and_500_idle_connections") else { return };
    let su = pg.setup().await;
    su.batch_execute("CREATE UNLOGGED TABLE blob (line text); GRANT ALL ON blob TO app").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let listen = free_addr();
    let config = dir.path().join("proxy.toml");
    std::fs::write(&config, sidecar_config(&pg, &dir.path().join("data"), "", "", listen)).unwrap();
    let log = std::fs::File::create(dir.path().join("proxy.log")).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_fencer"))
        .args(["proxy", "--floor", "1", "--config"])
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let pid = child.id();
    let started = std::time::SystemTime::now();
    let c = loop {
        match connect(listen, "app", None).await {
            Ok(c) => break c,
            Err(_) if started.elapsed().unwrap() < SOON => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(e) => panic!("the sidecar never answered: {e}"),
        }
    };
    c.batch_execute("SET fencer.token = 10").await.unwrap();
    let before = peak_rss_kib(pid);
    let sink = c.copy_in("COPY blob FROM STDIN").await.unwrap();
    futures::pin_mut!(sink);
    let line = Bytes::from(format!("{}\n", "x".repeat(1023)));
    let total_mib = 100;
    for _ in 0..total_mib * 1024 {
        sink.feed(line.clone()).await.unwrap();
    }
    assert_eq!(sink.finish().await.unwrap(), (total_mib * 1024) as u64);
    let after = peak_rss_kib(pid);
    let grew_mib = after.saturating_sub(before) / 1024;
    assert!(grew_mib < 32, "the sidecar's peak memory grew by {grew_mib} MiB during a {total_mib} MiB COPY");

    // 500 idle connections, each still answering afterwards.
    let mut idle = Vec::new();
    for i in 0..500 {
        let c = connect_as(listen, "reporting", None, &format!("idle-{i}"), None).await.unwrap();
        idle.push(c);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for c in &idle {
        c.batch_execute("SELECT 1").await.unwrap();
    }
    let n: i64 = su
        .query_one("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'idle-%'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 500);
    eprintln!(
        "sidecar peak RSS: {before} KiB before the COPY, {after} KiB after, {} KiB with 500 connections",
        peak_rss_kib(pid)
    );
    drop(idle);
    let _ = child.kill();
    let _ = child.wait();
}
