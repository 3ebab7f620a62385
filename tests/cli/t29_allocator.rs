//! A coordinator runs with mimalloc's purge delay at 0 unless its
//! environment names one (module `allocator` of the binary); the CLI and
//! the proxy keep mimalloc's default.
//!
//! What mimalloc itself runs with is read from its own startup report
//! (`MIMALLOC_VERBOSE=1` prints every option as the process loads): a
//! coordinator started without the variable prints it twice, 1,000 ms
//! (mimalloc's default) and then 0 after it replaced itself, and its process
//! id is the one the test started.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use fencer_testkit::{Proc, fencer_bin, free_port, wait_ready};

/// The values of mimalloc's `purge_delay` option in its startup reports, in
/// order (one report per program image the process ran).
fn reported_purge_delays(log: &str) -> Vec<String> {
    log.lines().filter_map(|l| l.trim().strip_prefix("option 'purge_delay':")).map(|v| v.trim().to_string()).collect()
}

/// The process's environment variable `name`, read from `/proc`.
fn environ(pid: u32, name: &str) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).expect("read the process's environment");
    raw.split(|&b| b == 0)
        .filter_map(|kv| std::str::from_utf8(kv).ok())
        .find_map(|kv| kv.strip_prefix(name).and_then(|rest| rest.strip_prefix('=')))
        .map(str::to_string)
}

/// Starts `fencer dev` with `MIMALLOC_VERBOSE=1`, the purge-delay variables
/// removed and then `env` added, and waits until it is ready.
fn dev(dir: &Path, name: &str, env: &[(&str, &str)]) -> (Proc, u16) {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let data = dir.join(name);
    let mut cmd = Command::new(fencer_bin());
    cmd.args(["dev", "--data-dir", data.to_str().unwrap(), "--listen", &listen])
        .env("FENCER_LOG", "warn")
        .env("MIMALLOC_VERBOSE", "1")
        .env_remove("MIMALLOC_PURGE_DELAY")
        .env_remove("MIMALLOC_RESET_DELAY")
        .envs(env.iter().copied());
    let mut p = Proc::spawn(name, &mut cmd, &dir.join(format!("{name}.log")));
    wait_ready(port, Duration::from_secs(20), &mut p);
    (p, port)
}

#[test]
fn t29_a_coordinator_returns_freed_memory_at_once_unless_told_otherwise() {
    let dir = tempfile::tempdir().unwrap();

    // No variable: the process replaced itself with the delay at 0, and it
    // is the same process id the test started and still serves.
    let (mut node, _) = dev(dir.path(), "default", &[]);
    assert_eq!(
        reported_purge_delays(&node.log_text()),
        ["1000", "0"],
        "mimalloc's default, then 0 after the restart in place; the log:\n{}",
        node.log_text()
    );
    assert_eq!(environ(node.pid(), "MIMALLOC_PURGE_DELAY").as_deref(), Some("0"));
    // Still named after the binary (`ps`, `pgrep fencer`), not after the
    // path it was executed by again.
    let comm = std::fs::read_to_string(format!("/proc/{}/comm", node.pid())).unwrap();
    let file_name = fencer_bin().file_name().unwrap().to_str().unwrap();
    assert_eq!(comm.trim_end(), &file_name[..file_name.len().min(15)], "the process's name");
    assert!(node.terminate(Duration::from_secs(10)).is_some_and(|s| s.success()), "clean shutdown on SIGTERM");

    // The operator's value is kept, and the process does not restart.
    let (mut node, _) = dev(dir.path(), "operator", &[("MIMALLOC_PURGE_DELAY", "250")]);
    assert_eq!(reported_purge_delays(&node.log_text()), ["250"], "the log:\n{}", node.log_text());
    assert!(node.terminate(Duration::from_secs(10)).is_some_and(|s| s.success()));

    // mimalloc's older name for it counts as naming one.
    let (mut node, _) = dev(dir.path(), "legacy", &[("MIMALLOC_RESET_DELAY", "-1")]);
    assert_eq!(reported_purge_delays(&node.log_text()), ["-1"], "the log:\n{}", node.log_text());
    assert_eq!(environ(node.pid(), "MIMALLOC_PURGE_DELAY"), None);
    assert!(node.terminate(Duration::from_secs(10)).is_some_and(|s| s.success()));
}

#[test]
fn t29_other_commands_keep_mimallocs_default() {
    // A command that is not a coordinator runs once, with mimalloc's
    // default: here `fencer status` against a port nothing listens on.
    let ep = format!("127.0.0.1:{}", free_port());
    let out = Command::new(fencer_bin())
        .args(["status", "--endpoints", &ep])
        .env("MIMALLOC_VERBOSE", "1")
        .env_remove("MIMALLOC_PURGE_DELAY")
        .env_remove("MIMALLOC_RESET_DELAY")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "no node there: {err}");
    assert!(err.contains("127.0.0.1"), "it ran and named the endpoint it could not reach: {err}");
    assert_eq!(reported_purge_delays(&err), ["1000"], "{err}");
}
