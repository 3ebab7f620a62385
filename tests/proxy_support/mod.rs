//! Helpers for the process-level proxy tests: free loopback ports, a child
//! process guard that stops its process by PID, and running the `fencer`
//! binary.

#![allow(dead_code, unreachable_pub)]

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use fencer_proxy::testing::{Method, Status, TestClient};

pub const FENCER: &str = env!("CARGO_BIN_EXE_fencer");

/// A loopback address with a port that was free a moment ago.
pub fn free_addr() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    l.local_addr().expect("local addr")
}

/// A child process that is stopped (SIGKILL, by PID) when dropped.
pub struct ChildGuard {
    pub child: Option<Child>,
    pub name: &'static str,
}

impl ChildGuard {
    pub fn spawn(name: &'static str, cmd: &mut Command, log: &Path) -> Self {
        let out = std::fs::File::create(log).expect("create log file");
        let err = out.try_clone().expect("clone log file");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        Self { child: Some(child), name }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// kill -9 by PID, and reap it.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM by PID; waits up to `timeout` for the exit status, then
    /// kill -9.
    pub fn terminate(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let mut c = self.child.take()?;
        let _ = Command::new("kill").arg("-TERM").arg(c.id().to_string()).status();
        let step = Duration::from_millis(50);
        for _ in 0..=(timeout.as_millis() / step.as_millis()) {
            if let Ok(Some(status)) = c.try_wait() {
                return Some(status);
            }
            std::thread::sleep(step);
        }
        let _ = c.kill();
        let _ = c.wait();
        None
    }

    pub fn has_exited(&mut self) -> bool {
        self.child.as_mut().is_none_or(|c| matches!(c.try_wait(), Ok(Some(_))))
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Polls `GET http://addr/path` until it answers `want`; panics with the
/// process log after `timeout` or if the process died.
pub async fn wait_http(
    addr: SocketAddr,
    path: &str,
    want: Status,
    guard: &mut ChildGuard,
    log: &Path,
    timeout: Duration,
) {
    let client = TestClient::new();
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Ok(r) = client.send(addr, Method::GET, path, &[], "").await
            && r.status == want
        {
            return;
        }
        if guard.has_exited() || tokio::time::Instant::now() > deadline {
            panic!(
                "{} did not answer {path} with {want}; its log:\n{}",
                guard.name,
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs `fencer ARGS…` to completion (bounded by `timeout`).
pub fn run_fencer(args: &[&str], timeout: Duration) -> Output {
    let child = Command::new(FENCER)
        .args(args)
        .env_remove("FENCER_PROXY_ADMIN")
        .env_remove("FENCER_OUTPUT")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start fencer");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(timeout) {
        Ok(out) => out.expect("fencer output"),
        Err(_) => {
            let _ = Command::new("kill").arg("-KILL").arg(pid.to_string()).status();
            panic!("fencer {args:?} did not finish within {timeout:?}");
        }
    }
}

/// Starts `fencer proxy` with the simple flags and waits until its admin
/// API is live.
pub async fn start_proxy(
    listen: SocketAddr,
    admin: SocketAddr,
    upstream: &str,
    data_dir: &Path,
    floor: Option<u64>,
    log: &Path,
) -> ChildGuard {
    let mut cmd = Command::new(FENCER);
    cmd.args([
        "proxy",
        "--listen",
        &listen.to_string(),
        "--admin",
        &admin.to_string(),
        "--upstream",
        upstream,
        "--resource",
        "main",
    ])
    .arg("--data-dir")
    .arg(data_dir)
    .args(["--read-route", "GET:/ping"]);
    if let Some(f) = floor {
        cmd.args(["--floor", &f.to_string()]);
    }
    let mut guard = ChildGuard::spawn("fencer proxy", &mut cmd, log);
    wait_http(admin, "/livez", Status::OK, &mut guard, log, Duration::from_secs(30)).await;
    guard
}
