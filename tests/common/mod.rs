//! Helpers shared by the process-level tests: start and stop real `fencer`
//! processes on loopback, by PID, with their stderr kept for diagnosis.
#![allow(dead_code, unreachable_pub, missing_docs)]
// These helpers drive OS processes from synchronous test code: wall-clock
// polling with std time is what they need (no tokio runtime here).
#![allow(clippy::disallowed_types)]

pub mod fault;
pub mod node;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The `fencer` binary under test.
pub fn fencer_bin() -> &'static str {
    env!("CARGO_BIN_EXE_fencer")
}

/// A free loopback port (bound then released; the race is acceptable in tests).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A child process that is killed (SIGKILL, by PID) when dropped.
pub struct Proc {
    pub child: Child,
    pub log: PathBuf,
}

impl Proc {
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// kill -9.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then wait up to `timeout` for a clean exit.
    pub fn terminate(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        signal(self.pid(), "TERM");
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill9();
        None
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill9();
        }
    }
}

/// Sends a signal to one PID with kill(1) (never pkill/killall).
pub fn signal(pid: i32, sig: &str) {
    let _ = Command::new("kill").arg(format!("-{sig}")).arg(pid.to_string()).status();
}

/// Starts `fencer <args>` with stderr to `log`.
pub fn spawn(args: &[&str], log: &Path) -> Proc {
    let err = std::fs::File::create(log).unwrap();
    let child = Command::new(fencer_bin())
        .args(args)
        .env("FENCER_LOG", "info,openraft=warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(err)
        .spawn()
        .expect("spawn fencer");
    Proc { child, log: log.to_path_buf() }
}

/// Starts `fencer dev` on `port` with `data_dir` and waits until it is ready.
pub fn spawn_dev(data_dir: &Path, port: u16, log: &Path) -> Proc {
    let listen = format!("127.0.0.1:{port}");
    let p = spawn(&["dev", "--data-dir", data_dir.to_str().unwrap(), "--listen", &listen], log);
    wait_ready(port, Duration::from_secs(20), &p);
    p
}

/// Polls `/readyz` until it answers 200.
pub fn wait_ready(port: u16, timeout: Duration, p: &Proc) {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if http_get(port, "/readyz").is_some_and(|(code, _)| code == 200) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("fencer on port {port} did not become ready; its log:\n{}", p.log_text());
}

/// A minimal HTTP/1.1 GET on loopback: (status, body).
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let code = buf.split_whitespace().nth(1)?.parse().ok()?;
    let body = buf.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
    Some((code, body))
}

/// Runs `fencer <args>` to completion: (exit code, stdout, stderr).
pub fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(fencer_bin()).args(args).output().expect("run fencer");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs a CLI command and parses its one JSON object.
pub fn run_json(args: &[&str]) -> (i32, serde_json::Value) {
    let (code, out, err) = run(args);
    let v = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {out:?}; stderr: {err}"));
    (code, v)
}
