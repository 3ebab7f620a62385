//! Child processes, driven by PID: [`Proc`] owns one and kills it when
//! dropped (a panicking test leaves nothing running), signals go to its PID
//! only (never `pkill`/`killall`), and its output goes to a log file that
//! every failure message quotes. Plus the `fencer` binary under test:
//! [`fencer_bin`], [`spawn_fencer`], [`run`], [`run_json`], [`spawn_dev`].

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

pub use rustix::process::Signal;
use tokio::time::Instant;

/// How often a stopping process is asked whether it has exited.
const REAP_EVERY: Duration = Duration::from_millis(10);
/// How long `run` lets one `fencer` command take.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(120);
/// The log filter of `fencer` processes the kit starts.
pub const FENCER_LOG: &str = "info,openraft=warn";

/// Sends `sig` to the process `pid` (only that PID). A process that is
/// already gone is not an error.
pub fn signal(pid: u32, sig: Signal) {
    if let Some(pid) = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw) {
        let _ = rustix::process::kill_process(pid, sig);
    }
}

/// Sends `sig` to every process of group `pgid` (a command that runs in a
/// group of its own, as `fencer exec` starts them).
pub fn signal_group(pgid: u32, sig: Signal) {
    if let Some(pgid) = i32::try_from(pgid).ok().and_then(rustix::process::Pid::from_raw) {
        let _ = rustix::process::kill_process_group(pgid, sig);
    }
}

/// A child process that is killed (SIGKILL, by PID) and reaped when dropped.
#[derive(Debug)]
pub struct Proc {
    name: String,
    child: Child,
    pid: u32,
    log: PathBuf,
    exit: Option<ExitStatus>,
}

impl Proc {
    /// Starts `cmd` with stdin closed and stdout and stderr to `log`.
    /// Panics naming `name` when it cannot start.
    pub fn spawn(name: &str, cmd: &mut Command, log: &Path) -> Self {
        Self::try_spawn(name, cmd, log).unwrap_or_else(|e| panic!("cannot start {name}: {e}"))
    }

    /// [`spawn`](Self::spawn), returning the error instead of panicking.
    pub fn try_spawn(name: &str, cmd: &mut Command, log: &Path) -> std::io::Result<Self> {
        let out = std::fs::File::create(log)?;
        let err = out.try_clone()?;
        let child = cmd.stdin(Stdio::null()).stdout(out).stderr(err).spawn()?;
        Ok(Self::adopt(name, child, log))
    }

    /// Takes ownership of a child started elsewhere (its stdio set up by the
    /// caller); `log` is where its output went, if anywhere.
    pub fn adopt(name: &str, child: Child, log: &Path) -> Self {
        let pid = child.id();
        Self { name: name.to_string(), child, pid, log: log.to_path_buf(), exit: None }
    }

    /// What the process is called in messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its PID.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Its log file.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// The whole log ("" when it cannot be read).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = self.log_text();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// The exit status, once it has exited (never blocks).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().ok().flatten();
        }
        self.exit
    }

    /// Whether it is still running.
    pub fn alive(&mut self) -> bool {
        self.exited().is_none()
    }

    /// Sends `sig` to its PID (nothing once it has exited and been reaped).
    pub fn signal(&mut self, sig: Signal) {
        if self.alive() {
            signal(self.pid, sig);
        }
    }

    /// SIGSTOP: the process keeps its sockets but runs no code.
    pub fn pause(&mut self) {
        self.signal(Signal::STOP);
    }

    /// SIGCONT.
    pub fn resume(&mut self) {
        self.signal(Signal::CONT);
    }

    /// kill -9, and reap it (a stopped process dies of SIGKILL too).
    pub fn kill9(&mut self) {
        if self.alive() {
            let _ = self.child.kill();
            self.exit = self.child.wait().ok();
        }
    }

    /// SIGTERM, then waits up to `grace` for the exit; kill -9 after that
    /// (and `None`).
    pub fn terminate(&mut self, grace: Duration) -> Option<ExitStatus> {
        self.signal(Signal::TERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Some(status) = self.exited() {
                return Some(status);
            }
            std::thread::sleep(REAP_EVERY);
        }
        self.kill9();
        None
    }

    /// kill -9 without blocking the runtime: returns once it has been
    /// reaped (or after 5 s, when the kernel is that slow to end it).
    pub async fn kill(&mut self) {
        if !self.alive() {
            return;
        }
        let _ = self.child.kill();
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.alive() && Instant::now() < deadline {
            tokio::time::sleep(REAP_EVERY).await;
        }
    }

    /// [`terminate`](Self::terminate) without blocking the runtime.
    pub async fn stop(&mut self, grace: Duration) -> Option<ExitStatus> {
        self.signal(Signal::TERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Some(status) = self.exited() {
                return Some(status);
            }
            tokio::time::sleep(REAP_EVERY).await;
        }
        self.kill().await;
        None
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// The `fencer` binary under test: `FENCER_BIN` if set, else the binary
/// cargo built next to this test executable (`target/<profile>/fencer`,
/// what `CARGO_BIN_EXE_fencer` names in the root package's tests).
pub fn fencer_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(bin) = std::env::var_os("FENCER_BIN") {
            return PathBuf::from(bin);
        }
        let exe = std::env::current_exe().expect("the test executable's path");
        let mut dir = exe.parent().expect("the test executable's dir").to_path_buf();
        if dir.ends_with("deps") || dir.ends_with("examples") {
            dir.pop();
        }
        let bin = dir.join(format!("fencer{}", std::env::consts::EXE_SUFFIX));
        assert!(
            bin.exists(),
            "no fencer binary at {}: cargo builds it for the root package's tests (or set FENCER_BIN)",
            bin.display()
        );
        bin
    })
}

/// Starts `fencer ARGS…` with stderr to `log` (stdout discarded) and the
/// kit's log filter.
pub fn spawn_fencer(args: &[&str], log: &Path) -> Proc {
    let err = std::fs::File::create(log).unwrap_or_else(|e| panic!("create {}: {e}", log.display()));
    let child = Command::new(fencer_bin())
        .args(args)
        .env("FENCER_LOG", FENCER_LOG)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start fencer {args:?}: {e}"));
    Proc::adopt(&format!("fencer {}", args.first().unwrap_or(&"")), child, log)
}

/// Runs `fencer ARGS…` to completion within `timeout` (killed by PID and a
/// panic after it). Settings of the caller's shell that would change the
/// output (`FENCER_OUTPUT`, `FENCER_PROXY_ADMIN`) are removed.
pub fn run_fencer(args: &[&str], timeout: Duration) -> Output {
    let child = Command::new(fencer_bin())
        .args(args)
        .env_remove("FENCER_PROXY_ADMIN")
        .env_remove("FENCER_OUTPUT")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start fencer {args:?}: {e}"));
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(timeout) {
        Ok(out) => out.unwrap_or_else(|e| panic!("fencer {args:?}: {e}")),
        Err(_) => {
            signal(pid, Signal::KILL);
            panic!("fencer {args:?} did not finish within {timeout:?}");
        }
    }
}

/// Runs `fencer ARGS…` to completion (within [`RUN_TIMEOUT`]): (exit code,
/// stdout, stderr).
pub fn run(args: &[&str]) -> (i32, String, String) {
    let out = run_fencer(args, RUN_TIMEOUT);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs a `fencer` command that prints one JSON object: (exit code, it).
pub fn run_json(args: &[&str]) -> (i32, serde_json::Value) {
    let (code, out, err) = run(args);
    let v = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {out:?}; stderr: {err}"));
    (code, v)
}

/// Starts `fencer dev` on `127.0.0.1:port` with `data_dir` and waits until
/// it is ready.
pub fn spawn_dev(data_dir: &Path, port: u16, log: &Path) -> Proc {
    let listen = format!("127.0.0.1:{port}");
    let data = data_dir.to_str().expect("a UTF-8 data dir");
    let mut p = spawn_fencer(&["dev", "--data-dir", data, "--listen", &listen], log);
    wait_ready(port, Duration::from_secs(20), &mut p);
    p
}

/// Polls `GET /readyz` on `127.0.0.1:port` until it answers 200; panics
/// with the log when `timeout` passes or the process exited first.
pub fn wait_ready(port: u16, timeout: Duration, p: &mut Proc) {
    let deadline = Instant::now() + timeout;
    loop {
        if crate::http_get_blocking(("127.0.0.1", port), "/readyz").is_some_and(|(code, _)| code == 200) {
            return;
        }
        if let Some(status) = p.exited() {
            panic!("{} exited ({status}) before it was ready on port {port}; its log:\n{}", p.name(), p.log_text());
        }
        assert!(
            Instant::now() < deadline,
            "{} on port {port} did not become ready within {timeout:?}; its log:\n{}",
            p.name(),
            p.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_proc_is_killed_by_its_pid() {
        let dir = tempfile::tempdir().unwrap();
        let p = Proc::spawn("sleep", Command::new("sleep").arg("600"), &dir.path().join("sleep.log"));
        let pid = p.pid();
        drop(p);
        // Reaped by the drop: the PID no longer names a process of ours.
        assert!(!Path::new(&format!("/proc/{pid}")).exists() || !is_sleep(pid));
    }

    fn is_sleep(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "sleep")
    }

    #[test]
    fn terminate_reports_the_exit_and_pause_stops_the_process() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = Proc::spawn("sleep", Command::new("sleep").arg("600"), &dir.path().join("sleep.log"));
        p.pause();
        let state = || std::fs::read_to_string(format!("/proc/{}/stat", p.pid())).unwrap_or_default();
        crate::eventually_blocking("the process is stopped", Duration::from_secs(5), || {
            state().rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('T')).then_some(())
        });
        p.resume();
        let status = p.terminate(Duration::from_secs(5)).expect("sleep ends on SIGTERM");
        assert!(!status.success());
        assert!(!p.alive());
    }
}
