//! G6/P2: the epoch is durable before any byte of a higher-token statement
//! goes upstream, so a sidecar killed right after forwarding 42 refuses 41
//! after its restart; and after the unclean stop every known resource
//! starts indeterminate. G7: when PostgreSQL stops answering with a commit
//! outstanding, the client gets FN003 and its connection is closed, and the
//! resource is indeterminate (FN004 for a higher token) until that backend
//! is confirmed gone and the quarantine has passed.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::fixture::{admin_table, connect, connect_as, free_addr, require_postgres, sidecar, sidecar_config};
use crate::{SOON, expect_code};

const FENCER: &str = env!("CARGO_BIN_EXE_fencer");

/// A `fencer proxy` process, killed by PID when dropped.
struct Process(Option<Child>);

impl Process {
    fn start(config: &std::path::Path, log: &std::path::Path) -> Self {
        let out = std::fs::File::create(log).unwrap();
        let child = Command::new(FENCER)
            .args(["proxy", "--config"])
            .arg(config)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("start fencer proxy");
        Self(Some(child))
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill9();
    }
}

async fn wait_connectable(addr: std::net::SocketAddr, user: &str) -> tokio_postgres::Client {
    let started = std::time::SystemTime::now();
    loop {
        match connect(addr, user, None).await {
            Ok(c) => return c,
            Err(e) => {
                assert!(started.elapsed().unwrap() < SOON, "the sidecar never accepted a connection: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// G6/P2 across kill -9, with a real `fencer proxy` process.
#[tokio::test]
async fn t30_kill9_right_after_forwarding_42_then_41_is_refused() {
    let Some(pg) = require_postgres("t30_kill9_right_after_forwarding_42_then_41_is_refused") else { return };
    let su = pg.setup().await;
    let dir = tempfile::tempdir().unwrap();
    let listen = free_addr();
    let config = dir.path().join("proxy.toml");
    let text = sidecar_config(&pg, &dir.path().join("data"), "", "", listen)
        .replace("quarantine = \"1s\"", "quarantine = \"2s\"");
    std::fs::write(&config, text).unwrap();
    // A new data dir needs a floor (P10): the first start passes one.
    let log = dir.path().join("proxy.log");
    let mut proxy = {
        let out = std::fs::File::create(&log).unwrap();
        Process(Some(
            Command::new(FENCER)
                .args(["proxy", "--floor", "1", "--config"])
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(out.try_clone().unwrap())
                .stderr(out)
                .spawn()
                .unwrap(),
        ))
    };
    let b = wait_connectable(listen, "app").await;
    b.batch_execute("SET fencer.token = 42; INSERT INTO fenced (writer, token) VALUES ('B', 42)").await.unwrap();
    proxy.kill9();
    drop(b);

    let mut proxy = Process::start(&config, &dir.path().join("proxy2.log"));
    let a = wait_connectable(listen, "app").await;
    // The epoch survived: 41 is stale at once, and the connection keeps
    // no token.
    expect_code(a.batch_execute("SET fencer.token = 41").await, "FN001");
    expect_code(a.batch_execute("INSERT INTO fenced (writer, token) VALUES ('A', 41)").await, "FN002");
    let a2 = connect_as(listen, "app", None, "a2", Some("-c fencer.token=41")).await.unwrap_err();
    assert_eq!(crate::fixture::code_of(&a2).0, "FN001", "{a2}");
    // After the unclean stop the resource is indeterminate for the
    // quarantine: a higher token waits (FN004), then passes.
    let c = connect(listen, "app", None).await.unwrap();
    c.batch_execute("SET fencer.token = 43").await.unwrap();
    let first = c.batch_execute("INSERT INTO fenced (writer, token) VALUES ('C', 43)").await;
    if let Err(e) = &first {
        assert_eq!(crate::fixture::code_of(e).0, "FN004", "{e}");
        let started = std::time::SystemTime::now();
        loop {
            match c.batch_execute("INSERT INTO fenced (writer, token) VALUES ('C', 43)").await {
                Ok(()) => break,
                Err(e) => {
                    assert_eq!(crate::fixture::code_of(&e).0, "FN004", "{e}");
                    assert!(started.elapsed().unwrap() < SOON, "still indeterminate");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }
    assert_eq!(pg.rows(&su).await, [("B".to_owned(), 42), ("C".to_owned(), 43)]);
    proxy.kill9();
}

/// G7: PostgreSQL stops answering mid-COMMIT (its backend is SIGSTOPped):
/// after `statement_timeout` the client gets FN003 and its connection is
/// closed; a higher token gets FN004 while the backend lives; once it is
/// gone (SIGCONT lets it act on the termination) and the quarantine has
/// passed, the higher token writes.
#[tokio::test]
async fn t31_postgres_stops_answering_mid_commit() {
    let Some(pg) = require_postgres("t31_postgres_stops_answering_mid_commit") else { return };
    let su = pg.setup().await;
    let dir = tempfile::tempdir().unwrap();
    let proxy =
        sidecar(&pg, dir.path(), "statement_timeout = \"1s\"\nterminate_timeout = \"1s\"", &admin_table(dir.path()))
            .await;
    let addr = proxy.local_addr();
    let a = connect_as(addr, "app", None, "stopped-a", None).await.unwrap();
    a.batch_execute("SET fencer.token = 41; BEGIN; INSERT INTO fenced (writer, token) VALUES ('A', 41)").await.unwrap();
    let pid = pg.backend_pid(&su, "stopped-a").await.unwrap();
    let signal = |sig: &str| {
        let ok = Command::new("kill").args([sig, &pid.to_string()]).status().is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {pid}");
    };
    signal("-STOP");
    let commit = a.batch_execute("COMMIT").await;
    let message = expect_code(commit, "FN003");
    assert!(message.contains("unknown"), "{message}");
    assert!(a.is_closed() || a.batch_execute("SELECT 1").await.is_err(), "the connection stays open after FN003");

    let b = connect(addr, "app", None).await.unwrap();
    b.batch_execute("SET fencer.token = 42").await.unwrap();
    for _ in 0..3 {
        expect_code(b.batch_execute("INSERT INTO fenced (writer, token) VALUES ('B', 42)").await, "FN004");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let admin = fencer_proxy::AdminClient::new(&proxy.admin_addr().to_string(), SOON).unwrap();
    let status = admin.resource("pg/postgres").await.unwrap();
    let ind = status.indeterminate.expect("indeterminate while the backend lives");
    assert_eq!(ind.open_connections, 1, "{ind:?}");

    signal("-CONT");
    let started = std::time::SystemTime::now();
    loop {
        match b.batch_execute("INSERT INTO fenced (writer, token) VALUES ('B', 42)").await {
            Ok(()) => break,
            Err(e) => {
                assert_eq!(crate::fixture::code_of(&e).0, "FN004", "{e}");
                assert!(started.elapsed().unwrap() < SOON, "never settled");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    assert!(!pg.backend_alive(&su, pid).await, "B wrote while A's backend was alive");
    let rows = pg.rows(&su).await;
    assert!(rows.ends_with(&[("B".to_owned(), 42)]), "{rows:?}");
    proxy.shutdown().await;
}
