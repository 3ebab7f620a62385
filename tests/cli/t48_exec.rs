//! `fencer exec` as real processes against `fencer dev` (DESIGN §5): the
//! command sees the lock in its environment; when the lock is lost it gets
//! SIGTERM and then SIGKILL before the local deadline; exit codes are the
//! documented ones (`src/exit.rs`, `docs/client.md`).
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fencer_testkit::{Proc, Signal, fencer_bin, free_port, run, run_json, signal_group, spawn_dev};
use tokio::time::Instant;

/// Runs `fencer exec …` to completion: (exit code, stdout, stderr).
fn exec(ep: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(fencer_bin())
        .arg("exec")
        .args(args)
        .env("FENCER_ENDPOINTS", ep)
        .env("FENCER_LOG", "info")
        .stdin(Stdio::null())
        .output()
        .expect("run fencer exec");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn held(ep: &str, resource: &str) -> bool {
    let (code, v) = run_json(&["get", resource, "--endpoints", ep, "-o", "json"]);
    assert_eq!(code, 0, "{v}");
    v["held"].as_bool().unwrap()
}

#[test]
fn t48_exec_passes_the_lock_to_the_command_and_its_exit_codes_are_as_documented() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let ep = format!("127.0.0.1:{port}");
    let _dev = spawn_dev(&dir.path().join("data"), port, &dir.path().join("dev.log"));

    // The command sees the lock; its status is passed through.
    let (code, out, err) = exec(
        &ep,
        &[
            "t48/env",
            "--ttl",
            "5s",
            "--",
            "sh",
            "-c",
            r#"echo "$FENCER_RESOURCE $FENCER_TOKEN $FENCER_LEASE_ID"; exit 7"#,
        ],
    );
    assert_eq!(code, 7, "the command's status: {err}");
    let fields: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(fields.len(), 3, "{out:?}");
    assert_eq!(fields[0], "t48/env");
    assert!(fields[1].parse::<u64>().unwrap() > 0);
    assert!(fields[2].len() == 32 && fields[2].chars().all(|c| c.is_ascii_hexdigit()), "{out:?}");
    assert!(!held(&ep, "t48/env"), "released when the command ended");

    // While the command runs the lock is held with the token it was given.
    let (code, out, _) = exec(
        &ep,
        &[
            "t48/held",
            "--",
            "sh",
            "-c",
            r#"fencer_token="$FENCER_TOKEN"; "$0" get t48/held -o json; echo "$fencer_token""#,
            fencer_bin().to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0);
    let mut lines = out.lines();
    let view: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    assert_eq!(view["held"], true);
    assert_eq!(view["fencing_token"].to_string(), lines.next().unwrap());

    // Success, and death by a signal as a shell reports it (128 + N).
    assert_eq!(exec(&ep, &["t48/ok", "--", "true"]).0, 0);
    assert_eq!(exec(&ep, &["t48/sig", "--", "sh", "-c", "kill -9 $$"]).0, 128 + 9);

    // fencer's own outcomes: 200 + the usual code, and 207.
    let (code, hold) = run_json(&["acquire", "t48/busy", "--ttl", "30s", "--endpoints", &ep, "-o", "json"]);
    assert_eq!(code, 0, "{hold}");
    let marker = dir.path().join("ran");
    let touch = format!("touch {}", marker.display());
    let (code, out, _) = exec(&ep, &["t48/busy", "-o", "json", "--", "sh", "-c", &touch]);
    assert_eq!(code, 203, "not acquired");
    assert!(out.contains("LOCK_HELD"), "{out}");
    let (code, _, _) = exec(&ep, &["t48/busy", "--wait", "300ms", "--", "sh", "-c", &touch]);
    assert_eq!(code, 203, "not acquired after waiting");
    assert!(!marker.exists(), "the command never ran without the lock");
    assert_eq!(exec(&ep, &["bad//name", "--", "true"]).0, 206, "invalid");
    assert_eq!(exec(&ep, &["t48/nocmd", "--", "/nonexistent/command"]).0, 207, "cannot start");
    assert!(!held(&ep, "t48/nocmd"), "released when the command could not start");
    assert_eq!(exec(&ep, &["t48/usage", "--no-such-flag", "--", "true"]).0, 202, "usage");
    assert_eq!(exec(&ep, &["t48/usage", "--ttl", "soon", "--", "true"]).0, 202, "usage");
    let dead = format!("127.0.0.1:{}", free_port());
    assert_eq!(exec(&dead, &["t48/x", "--retry-budget", "300ms", "--", "true"]).0, 205, "unavailable");
    // The other commands keep their codes.
    assert_eq!(run(&["acquire", "t48/usage", "--no-such-flag"]).0, 2);
}

/// The wall clock in nanoseconds, as `date +%s%N` prints it.
fn wall_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[test]
fn t48_exec_stops_the_command_with_sigterm_then_sigkill_before_the_deadline() {
    let ttl = Duration::from_secs(3);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let ep = format!("127.0.0.1:{port}");
    let mut dev = spawn_dev(&dir.path().join("data"), port, &dir.path().join("dev.log"));
    let work = dir.path();
    // A command that ignores SIGTERM (it only notes it) and writes a
    // heartbeat every 50 ms; `sleep` is in its process group too.
    let script = r#"
        trap 'echo TERM >> "$W/signals"' TERM
        echo $$ > "$W/pid"
        while :; do date +%s%N > "$W/hb.tmp"; mv "$W/hb.tmp" "$W/heartbeat"; sleep 0.05; done
    "#;
    let log = std::fs::File::create(work.join("exec.log")).unwrap();
    let exec = Command::new(fencer_bin())
        .args(["exec", "t48/loss", "--ttl", "3s", "--term-grace", "0s", "--kill-before", "800ms"])
        .args(["--endpoints", &ep, "--", "sh", "-c", script])
        .env("W", work)
        .env("FENCER_LOG", "info")
        .env("FENCER_LOG_FORMAT", "json")
        .stdin(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut exec = Proc::adopt("fencer exec", exec, &work.join("exec.log"));
    // Running with the lock for a while (a few renewals).
    let started = Instant::now();
    while read(&work.join("heartbeat")).is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the command never started: {}",
            read(&work.join("exec.log"))
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(1500));
    assert!(exec.alive());
    let child_pid: u32 = read(&work.join("pid")).trim().parse().unwrap();

    // The coordinator stops answering: no renewal can succeed after this.
    let stopped_ns = wall_ns();
    dev.pause();
    let status = loop {
        if let Some(status) = exec.exited() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(30) {
            exec.kill9();
            // The command runs in a process group of its own: end all of it.
            signal_group(child_pid, Signal::KILL);
            dev.resume();
            panic!("fencer exec did not end; its log:\n{}", read(&work.join("exec.log")));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    dev.resume();
    let log = read(&work.join("exec.log"));
    assert_eq!(status.code(), Some(204), "lock lost: {log}");
    assert!(read(&work.join("signals")).contains("TERM"), "SIGTERM first: {log}");
    // The command is gone (SIGKILL: it ignored SIGTERM) …
    assert!(!Path::new(&format!("/proc/{child_pid}")).exists(), "the command still runs");
    // … and did no work past the deadline. The last successful renewal was
    // sent before the stop, so the local deadline is at most stop + ttl −
    // margin (ttl/10), and the command must be dead `--kill-before` (800 ms)
    // ahead of it.
    let kill = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["fields"]["signal"].as_str().is_some_and(|s| s.contains("KILL")))
        .unwrap_or_else(|| panic!("no SIGKILL logged: {log}"));
    let deadline_ms = kill["fields"]["deadline_unix_ms"].as_u64().unwrap() as u128;
    let stopped_ms = stopped_ns / 1_000_000;
    assert!(
        deadline_ms <= stopped_ms + (ttl - ttl / 10).as_millis() + 50,
        "the deadline counts from a renewal sent before the stop: {} ms after it",
        deadline_ms - stopped_ms
    );
    let last_beat_ms = read(&work.join("heartbeat")).trim().parse::<u128>().unwrap() / 1_000_000;
    assert!(
        last_beat_ms + 300 < deadline_ms,
        "the command ran until {} ms before its deadline; it must be killed 800 ms ahead: {log}",
        deadline_ms as i128 - last_beat_ms as i128
    );
    let term = log.find("SIGTERM to the command").expect("SIGTERM logged");
    assert!(term < log.find("SIGKILL to the command").unwrap(), "SIGTERM before SIGKILL");
    dev.terminate(Duration::from_secs(10));
}
