//! The CLI contract added with the client issue: every global flag has a
//! `FENCER_*` variable, lock flags too, and `fencer completions SHELL`
//! prints a script that knows the subcommands.

use std::process::Command;

use fencer_testkit::{fencer_bin, free_port, spawn_dev};

fn run_env(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(fencer_bin()).args(args).envs(env.iter().copied()).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn t49_completions_know_every_subcommand() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let (code, out, err) = run_env(&["completions", shell], &[]);
        assert_eq!(code, 0, "{shell}: {err}");
        for word in ["acquire", "exec", "completions", "endpoints"] {
            assert!(out.contains(word), "{shell} completions lack {word}");
        }
    }
    let (code, _, _) = run_env(&["completions", "tcsh"], &[]);
    assert_eq!(code, 2);
}

#[test]
fn t49_env_vars_stand_for_flags() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let ep = format!("127.0.0.1:{port}");
    let _dev = spawn_dev(&dir.path().join("data"), port, &dir.path().join("dev.log"));
    let env = [
        ("FENCER_ENDPOINTS", ep.as_str()),
        ("FENCER_OUTPUT", "json"),
        ("FENCER_TTL", "45s"),
        ("FENCER_HOLDER", "t49-holder"),
        ("FENCER_LOG", "warn"),
        ("FENCER_LOG_FORMAT", "json"),
    ];
    let (code, out, err) = run_env(&["acquire", "t49/env"], &env);
    assert_eq!(code, 0, "{err}");
    let a: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(a["ttl_ms"], 45_000);
    let (code, out, _) = run_env(&["get", "t49/env"], &env);
    assert_eq!(code, 0);
    let g: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(g["holder"], "t49-holder");
    // FENCER_LEASE_ID (what `fencer exec` gives its command) stands for --lease.
    let lease = a["lease_id"].as_str().unwrap();
    let mut with_lease = env.to_vec();
    with_lease.push(("FENCER_LEASE_ID", lease));
    let (code, out, _) = run_env(&["release", "t49/env"], &with_lease);
    assert_eq!(code, 0);
    assert!(out.contains("\"was_holder\":true"), "{out}");
    // Flags win over the environment.
    let (code, out, _) = run_env(&["get", "t49/env", "-o", "table"], &env);
    assert_eq!(code, 0);
    assert!(out.contains("held"), "{out}");
    assert!(serde_json::from_str::<serde_json::Value>(out.trim()).is_err(), "table, not JSON: {out}");
}

#[test]
fn t49_a_log_filter_that_does_not_parse_is_a_usage_error() {
    // Not a silent fallback to `info`: an operator who asked for a filter
    // must learn at start that it was not taken.
    let (code, _, err) = run_env(&["--log", "fencer=loudest", "completions", "bash"], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("bad --log filter") && err.contains("loudest"), "{err}");
    let (code, _, err) = run_env(&["completions", "bash"], &[("FENCER_LOG", "fencer=loudest")]);
    assert_eq!(code, 2, "{err}");
}

#[test]
fn t49_a_snapshot_interval_below_the_minimum_is_refused_not_raised() {
    let (code, _, err) = run_env(
        &["coordinator", "--id", "1", "--listen", "127.0.0.1:1", "--peers", "1=127.0.0.1:1", "--snapshot-every", "10"],
        &[],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--snapshot-every") && err.contains("not in 100.."), "{err}");
}

/// Issue 15 items 2, 3, 7 and 10 at the command line, on a real `fencer
/// dev`: an explicit `--ttl 0s` is refused with the bounds (never the
/// default in its place), a `--wait` above the maximum is refused in the
/// units it was typed in and the maximum itself is taken, `fencer
/// rejections` pointed at a coordinator says so, and output to a closed
/// pipe ends quietly.
#[test]
fn t49_refusals_speak_the_flags_units_and_a_closed_pipe_is_quiet() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let ep = format!("127.0.0.1:{port}");
    let mut node = spawn_dev(&tmp.path().join("data"), port, &tmp.path().join("dev.log"));

    let (code, _, err) = run_env(&["acquire", "cli/ttl", "--ttl", "0s", "--endpoints", &ep], &[]);
    assert_eq!(code, 6, "an explicit 0 ttl is refused as invalid: {err}");
    assert!(err.contains("--ttl 0s is outside the coordinator's bounds: at least "), "{err}");
    assert!(err.contains("at most 10m"), "{err}");

    let (code, _, err) = run_env(&["acquire", "cli/wait", "--wait", "10m", "--endpoints", &ep], &[]);
    assert_eq!(code, 6, "{err}");
    assert!(err.contains("--wait 10m is above the coordinator's maximum of 5m"), "{err}");
    assert!(!err.contains("599999"), "never the milliseconds left of the wait: {err}");
    let (code, out, err) = run_env(&["acquire", "cli/wait", "--wait", "5m", "--endpoints", &ep, "-o", "json"], &[]);
    assert_eq!(code, 0, "the documented maximum itself is taken: {out} {err}");

    let (code, _, err) = run_env(&["rejections", "--admin", &ep], &[]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains(&format!("{ep} is a fencer coordinator, not a proxy admin port")), "{err}");
    let (code, _, err) = run_env(&["proxy-status", "--admin", &ep], &[]);
    assert!(code != 0 && err.contains("is a fencer coordinator, not a proxy admin port"), "{err}");

    // `fencer get … | head -0`: the reader is gone before the first line.
    for args in [&["get", "cli/wait"][..], &["list"][..], &["get", "cli/wait", "-o", "json"][..]] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = Command::new(fencer_bin())
            .args(args)
            .args(["--endpoints", &ep])
            .env("RUST_BACKTRACE", "1")
            .stdout(writer)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(141), "fencer {args:?} to a closed pipe: {err}");
        assert!(err.is_empty(), "fencer {args:?} to a closed pipe says nothing: {err}");
    }
    node.terminate(std::time::Duration::from_secs(10));
}
