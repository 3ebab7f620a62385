//! `fencer dev` as a real process: the CLI contract, and kill -9 then restart
//! on the same data dir keeps every lock and never reuses a token (I2).

use fencer_testkit::{free_port, http_get_blocking, run, run_json, spawn_dev};

#[test]
fn t30_kill_9_and_restart_keeps_locks_and_tokens_grow() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let port = free_port();
    let ep = format!("127.0.0.1:{port}");
    let mut node = spawn_dev(&data, port, &dir.path().join("dev1.log"));

    let mut tokens = Vec::new();
    let mut leases = Vec::new();
    for i in 0..20 {
        let (code, v) =
            run_json(&["acquire", &format!("restart/{i}"), "--ttl", "10m", "--endpoints", &ep, "-o", "json"]);
        assert_eq!(code, 0, "{v}");
        tokens.push(v["fencing_token"].as_u64().unwrap());
        leases.push(v["lease_id"].as_str().unwrap().to_string());
    }
    // Release a few so the state is not just grants.
    for (i, lease) in leases.iter().enumerate().take(5) {
        let (code, v) =
            run_json(&["release", &format!("restart/{i}"), "--lease", lease, "--endpoints", &ep, "-o", "json"]);
        assert_eq!((code, v["was_holder"].as_bool()), (0, Some(true)));
    }
    let max_before = *tokens.iter().max().unwrap();

    node.kill9();
    let mut node = spawn_dev(&data, port, &dir.path().join("dev2.log"));

    // Every held lock is still held by the same lease with the same token.
    for i in 5..20 {
        let (code, v) = run_json(&["get", &format!("restart/{i}"), "--endpoints", &ep, "-o", "json"]);
        assert_eq!(code, 0);
        assert_eq!(v["held"], true, "restart/{i} lost after restart: {v}");
        assert_eq!(v["fencing_token"].as_u64(), Some(tokens[i]));
        let (code, r) =
            run_json(&["renew", &format!("restart/{i}"), "--lease", &leases[i], "--endpoints", &ep, "-o", "json"]);
        assert_eq!(code, 0, "the old lease must still renew: {r}");
    }
    for i in 0..5 {
        let (_, v) = run_json(&["get", &format!("restart/{i}"), "--endpoints", &ep, "-o", "json"]);
        assert_eq!(v["held"], false);
    }
    // The next token is larger than every token before the crash.
    let (code, v) = run_json(&["acquire", "restart/new", "--endpoints", &ep, "-o", "json"]);
    assert_eq!(code, 0);
    assert!(v["fencing_token"].as_u64().unwrap() > max_before, "token reused after restart: {v}");
    assert!(
        node.terminate(std::time::Duration::from_secs(10)).is_some_and(|s| s.success()),
        "clean shutdown on SIGTERM"
    );
}

#[test]
fn t31_cli_contract_exit_codes_and_json_errors() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let ep = format!("127.0.0.1:{port}");
    let _node = spawn_dev(&dir.path().join("data"), port, &dir.path().join("dev.log"));

    let (code, a) = run_json(&["acquire", "cli/x", "--ttl", "30s", "--endpoints", &ep, "-o", "json"]);
    assert_eq!(code, 0);
    for key in ["resource", "lease_id", "fencing_token", "ttl_ms", "expires_at_unix_ms"] {
        assert!(a.get(key).is_some(), "acquire output lacks {key}: {a}");
    }
    assert_eq!(a["ttl_ms"], 30_000);
    // Not acquired: a distinct exit code and a JSON error with the reason.
    let (code, e) = run_json(&["acquire", "cli/x", "--endpoints", &ep, "-o", "json"]);
    assert_eq!((code, e["error"]["reason"].as_str()), (3, Some("LOCK_HELD")));
    let (code, e) = run_json(&["acquire", "cli/x", "--wait", "500ms", "--endpoints", &ep, "-o", "json"]);
    assert_eq!((code, e["error"]["reason"].as_str()), (3, Some("WAIT_TIMEOUT")));
    // Not holder.
    let (code, e) = run_json(&["renew", "cli/x", "--lease", &"0".repeat(32), "--endpoints", &ep, "-o", "json"]);
    assert_eq!((code, e["error"]["reason"].as_str()), (4, Some("NOT_HOLDER")));
    // Invalid input is refused by the server with the rule named.
    let (code, e) = run_json(&["acquire", "bad//name", "--endpoints", &ep, "-o", "json"]);
    assert_eq!((code, e["error"]["reason"].as_str()), (6, Some("INVALID_ARGUMENT")));
    assert!(e["error"]["message"].as_str().unwrap().contains("'//'"));
    // Bad durations are usage errors.
    let (code, _, err) = run(&["acquire", "cli/y", "--ttl", "soon", "--endpoints", &ep]);
    assert_eq!(code, 2);
    assert!(err.contains("not a duration"), "{err}");
    // Nothing listening: unavailable.
    let dead = format!("127.0.0.1:{}", free_port());
    let (code, e) = run_json(&["get", "cli/x", "--endpoints", &dead, "-o", "json"]);
    assert_eq!(code, 5, "{e}");
    // The lock is still A's, and release says so.
    let (code, r) =
        run_json(&["release", "cli/x", "--lease", a["lease_id"].as_str().unwrap(), "--endpoints", &ep, "-o", "json"]);
    assert_eq!((code, r["released"].as_bool(), r["was_holder"].as_bool()), (0, Some(true), Some(true)));
    // JSON over HTTP for curl users.
    let (status, body) = http_get_blocking(("127.0.0.1", port), "/v1/locks/cli/x").unwrap();
    assert_eq!(status, 200);
    assert!(body.contains("\"held\":false"), "{body}");
}
