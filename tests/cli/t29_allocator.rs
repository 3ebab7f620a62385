//! A coordinator runs with mimalloc's purge delay at 0 unless its
//! environment names one (module `allocator` of the binary); the CLI and
//! the proxy keep mimalloc's default.
//!
//! What mimalloc itself runs with is read from its own startup report
//! (`MIMALLOC_VERBOSE=1` prints every option as the process loads; the
//! format and the default of 1,000 ms are mimalloc v3's, the version the
//! binary links: another version fails here loudly rather than passing):
//! a coordinator started without the variable prints it twice, 1,000 and
//! then 0 after it replaced itself, keeps the process id the test started
//! and the name it was started by.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
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

/// The process's name (`/proc/PID/comm`: what `ps` and `pgrep` match).
fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).expect("read the process's name").trim_end().to_string()
}

/// The kernel's name for a process started from `file`: its first 15 bytes.
fn name_of(file: &Path) -> String {
    let name = file.file_name().unwrap().to_str().unwrap();
    name[..name.len().min(15)].to_string()
}

/// Starts `program ARGS… dev …` with `MIMALLOC_VERBOSE=1`, the purge-delay
/// variables removed and then `env` added, and waits until it is ready.
fn dev_via(dir: &Path, name: &str, program: &OsStr, args: &[&OsStr], env: &[(&str, &OsStr)]) -> Proc {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let data = dir.join(name);
    let mut cmd = Command::new(program);
    cmd.args(args)
        .args(["dev", "--data-dir", data.to_str().unwrap(), "--listen", &listen])
        .env("FENCER_LOG", "warn")
        .env("MIMALLOC_VERBOSE", "1")
        .env_remove("MIMALLOC_PURGE_DELAY")
        .env_remove("MIMALLOC_RESET_DELAY")
        .envs(env.iter().copied());
    let mut p = Proc::spawn(name, &mut cmd, &dir.join(format!("{name}.log")));
    wait_ready(port, Duration::from_secs(20), &mut p);
    p
}

fn dev(dir: &Path, name: &str, env: &[(&str, &OsStr)]) -> Proc {
    dev_via(dir, name, fencer_bin().as_os_str(), &[], env)
}

fn stop(mut node: Proc) {
    let log = node.log_text();
    assert!(node.terminate(Duration::from_secs(10)).is_some_and(|s| s.success()), "clean shutdown on SIGTERM:\n{log}");
}

#[test]
fn t29_a_coordinator_returns_freed_memory_at_once_unless_told_otherwise() {
    let dir = tempfile::tempdir().unwrap();

    // No variable: the process replaced itself with the delay at 0; it is
    // the process id the test started, still named after its binary, and
    // it serves.
    let node = dev(dir.path(), "default", &[]);
    assert_eq!(
        reported_purge_delays(&node.log_text()),
        ["1000", "0"],
        "mimalloc's default, then 0 after the restart in place; the log:\n{}",
        node.log_text()
    );
    assert_eq!(environ(node.pid(), "MIMALLOC_PURGE_DELAY").as_deref(), Some("0"));
    assert_eq!(comm(node.pid()), name_of(fencer_bin()), "the process's name");
    stop(node);

    // The operator's value is kept, and the process does not restart; so
    // is mimalloc's older name, and a name in another case (mimalloc
    // ignores case).
    for (i, (var, value)) in
        [("MIMALLOC_PURGE_DELAY", "250"), ("MIMALLOC_RESET_DELAY", "-1"), ("mimalloc_purge_delay", "40")]
            .into_iter()
            .enumerate()
    {
        let node = dev(dir.path(), &format!("operator{i}"), &[(var, OsStr::new(value))]);
        assert_eq!(reported_purge_delays(&node.log_text()), [value], "{var}; the log:\n{}", node.log_text());
        assert_eq!(environ(node.pid(), "MIMALLOC_PURGE_DELAY").as_deref(), (i == 0).then_some(value), "{var}");
        stop(node);
    }
}

#[test]
fn t29_a_coordinator_restarts_as_it_was_started_or_not_at_all() {
    let dir = tempfile::tempdir().unwrap();

    // Through a symlink of another name: executed again through the
    // symlink, so it keeps that name (versioned binaries behind a link).
    let link = dir.path().join("fencer-linked");
    std::os::unix::fs::symlink(fencer_bin(), &link).unwrap();
    let node = dev_via(dir.path(), "link", link.as_os_str(), &[], &[]);
    assert_eq!(reported_purge_delays(&node.log_text()), ["1000", "0"], "the log:\n{}", node.log_text());
    assert_eq!(comm(node.pid()), name_of(&link));
    stop(node);

    // By a bare name found in PATH, as a shell starts it.
    let bin_dir = fencer_bin().parent().unwrap().to_path_buf();
    let path = std::env::join_paths(
        std::iter::once(bin_dir).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
    )
    .unwrap();
    let name = fencer_bin().file_name().unwrap();
    let node = dev_via(dir.path(), "path", name, &[], &[("PATH", &path)]);
    assert_eq!(reported_purge_delays(&node.log_text()), ["1000", "0"], "the log:\n{}", node.log_text());
    assert_eq!(comm(node.pid()), name_of(fencer_bin()));
    stop(node);

    // Through the dynamic loader (`ld.so fencer dev …`): the file it runs
    // is the loader, which it cannot restart as it was started; it runs on
    // with mimalloc's default and says so.
    let loader = dynamic_loader();
    let node = dev_via(dir.path(), "loader", loader.as_os_str(), &[fencer_bin().as_os_str()], &[]);
    let log = node.log_text();
    assert_eq!(reported_purge_delays(&log), ["1000"], "the log:\n{log}");
    assert!(log.contains("allocator: not restarted with MIMALLOC_PURGE_DELAY=0"), "the log:\n{log}");
    stop(node);
}

/// The dynamic loader the binary names (its ELF interpreter), found where
/// Debian and most distributions keep it.
fn dynamic_loader() -> PathBuf {
    let candidates = ["/lib64", "/lib", "/usr/lib64", "/usr/lib"]
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flat_map(|entries| entries.filter_map(Result::ok).map(|e| e.path()))
        .find(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("ld-linux") && n.contains(".so"))
        });
    candidates.expect("no dynamic loader (ld-linux*.so*) in /lib64, /lib, /usr/lib64 or /usr/lib")
}

#[test]
fn t29_other_commands_keep_mimallocs_default() {
    // A command that is not a coordinator runs once, with mimalloc's
    // default: here `fencer status` against port 1, where nothing listens.
    let out = Command::new(fencer_bin())
        .args(["status", "--endpoints", "127.0.0.1:1"])
        .env("MIMALLOC_VERBOSE", "1")
        .env_remove("MIMALLOC_PURGE_DELAY")
        .env_remove("MIMALLOC_RESET_DELAY")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "no node there: {err}");
    assert!(err.contains("127.0.0.1:1"), "it ran and named the endpoint it could not reach: {err}");
    assert_eq!(reported_purge_delays(&err), ["1000"], "{err}");
}
