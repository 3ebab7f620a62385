//! Process-level tests of `fencer proxy`: the real binary, started and
//! stopped by PID on loopback ports. They protect P2 (persist before
//! forward, across kill -9), P10 (an empty store refuses to serve without a
//! floor), config validation, and the operator CLI.

use std::process::Command;
use std::time::Duration;

use fencer_proxy::testing::{Status, TestClient, TestUpstream};
use fencer_testkit::{Proc, fencer_bin, free_addr, run_fencer, spawn_http_proxy, wait_http};

const SOON: Duration = Duration::from_secs(30);

/// P10: a proxy whose store is empty refuses to serve unless given a floor,
/// and says how to fix it; it does not create a store it then refuses.
#[test]
fn t70_empty_store_refuses_to_serve_without_a_floor() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = run_fencer(
        &[
            "proxy",
            "--listen",
            &free_addr().to_string(),
            "--admin",
            &free_addr().to_string(),
            "--upstream",
            "http://127.0.0.1:9",
            "--resource",
            "main",
            "--data-dir",
            data.to_str().unwrap(),
        ],
        SOON,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started without a floor: {stderr}");
    assert!(stderr.contains("--floor") && stderr.contains("P10"), "{stderr}");
    assert!(!data.join(fencer_proxy::STORE_FILE).exists());
}

/// P2: E is durable before any byte of the higher-token request goes
/// upstream. The proxy is killed with SIGKILL while 42 is at the upstream;
/// restarted on the same data dir (no floor needed), it refuses 41. The
/// unclean stop also leaves every known resource indeterminate for the
/// quarantine (P4). The CLI shows both.
#[tokio::test]
async fn t71_kill9_after_forwarding_42_then_41_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let log = dir.path().join("proxy.log");
    let upstream = TestUpstream::start().await.unwrap();
    let client = TestClient::new();

    let (listen, admin) = (free_addr(), free_addr());
    let mut proxy = spawn_http_proxy(listen, admin, &upstream.url(), &data, Some(1), &log).await;
    upstream.hold(42);
    let c = client.clone();
    let in_flight = tokio::spawn(async move { c.write(listen, "/write", 42).await });
    assert!(upstream.wait_arrived(42, SOON).await, "42 never reached the upstream");
    proxy.kill9(); // right after it forwarded 42
    assert!(in_flight.await.unwrap().is_err(), "the killed proxy cannot have answered");
    upstream.release(42);

    let (listen, admin) = (free_addr(), free_addr());
    let log2 = dir.path().join("proxy2.log");
    let mut proxy = spawn_http_proxy(listen, admin, &upstream.url(), &data, None, &log2).await;
    let stale = client.write(listen, "/write", 41).await.unwrap();
    assert_eq!(stale.status, Status::CONFLICT, "{:?}", stale.body);
    assert_eq!(stale.json()["current_epoch"], 42);
    assert!(!upstream.has_arrived(41));
    let higher = client.write(listen, "/write", 43).await.unwrap();
    assert_eq!(
        higher.status,
        Status::SERVICE_UNAVAILABLE,
        "after an unclean stop the resource is quarantined: {:?}",
        higher.body
    );

    let admin_s = admin.to_string();
    let out = run_fencer(&["proxy-status", "--admin", &admin_s, "-o", "json", "main"], SOON);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["resources"][0]["epoch"], 42);
    assert!(status["resources"][0]["indeterminate"].is_object(), "{status}");

    let mut records = serde_json::Value::Null;
    for _ in 0..100 {
        let out = run_fencer(&["rejections", "--admin", &admin_s, "-o", "json"], SOON);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        records = serde_json::from_slice(&out.stdout).unwrap();
        if records["rejections"].as_array().is_some_and(|a| a.len() >= 2) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let reasons: Vec<&str> =
        records["rejections"].as_array().unwrap().iter().filter_map(|r| r["reason"].as_str()).collect();
    assert_eq!(reasons, ["indeterminate", "stale_token"], "{records}");
    let table = run_fencer(&["rejections", "--admin", &admin_s], SOON);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.starts_with("SEQ") && table.contains("stale_token"), "{table}");

    let code = proxy.terminate(SOON).expect("the proxy stops on SIGTERM");
    assert!(code.success(), "graceful stop exits 0: {code:?}");
}

/// Config errors name the line and the reason; `--check-config` validates
/// without serving.
#[test]
fn t72_check_config_names_line_and_reason() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("proxy.toml");
    let good = "listen = \"127.0.0.1:18087\"\nupstream = \"http://127.0.0.1:18086\"\ndata_dir = \"d\"\n\n[[route]]\nmethods = [\"GET\"]\npath = \"/ping\"\nkind = \"read\"\n\n[[route]]\npath = \"/write\"\nquery = { db = \"{db}\" }\nresource = \"influx/{db}\"\n";
    std::fs::write(&path, good).unwrap();
    let out = run_fencer(&["proxy", "--config", path.to_str().unwrap(), "--check-config"], SOON);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("configuration OK") && stdout.contains("/write"), "{stdout}");

    std::fs::write(&path, good.replace("influx/{db}", "influx/{database}")).unwrap();
    let out = run_fencer(&["proxy", "--config", path.to_str().unwrap(), "--check-config"], SOON);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("line 13") && stderr.contains("{database}"), "{stderr}");
}

/// Issue 15 item 11: `fencer proxy --admin-token-file` guards its admin API,
/// and the operator commands send the token from the file named by
/// `FENCER_PROXY_ADMIN_TOKEN_FILE` (never from the command line).
#[tokio::test]
async fn t73_the_cli_sends_the_admin_token_from_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("admin.token");
    std::fs::write(&token, "cli-admin-token-0123456789abcdef\n").unwrap();
    let upstream = TestUpstream::start().await.unwrap();
    let (listen, admin) = (free_addr(), free_addr());
    let mut cmd = Command::new(fencer_bin());
    cmd.args(["proxy", "--listen", &listen.to_string(), "--admin", &admin.to_string()])
        .args(["--upstream", &upstream.url(), "--resource", "main", "--floor", "1"])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--admin-token-file")
        .arg(&token);
    let mut proxy = Proc::spawn("fencer proxy", &mut cmd, &dir.path().join("proxy.log"));
    wait_http(admin, "/livez", 200, &mut proxy, SOON).await;

    let admin_s = admin.to_string();
    let cli = |args: &[&str], with_token: bool| {
        let mut c = Command::new(fencer_bin());
        c.args(args).env_remove("FENCER_PROXY_ADMIN").env_remove("FENCER_PROXY_ADMIN_TOKEN_FILE");
        if with_token {
            c.env("FENCER_PROXY_ADMIN_TOKEN_FILE", &token);
        }
        c.output().unwrap()
    };
    for args in [
        &["rejections", "--admin", &admin_s, "-o", "json"][..],
        &["proxy-status", "--admin", &admin_s, "-o", "json"],
        &["log-level", "--proxy-admin", &admin_s, "-o", "json"],
    ] {
        let refused = cli(args, false);
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success(), "{args:?} without the token: {stderr}");
        assert!(stderr.contains("401"), "{args:?}: {stderr}");
        let ok = cli(args, true);
        assert!(ok.status.success(), "{args:?} with the token: {}", String::from_utf8_lossy(&ok.stderr));
    }
    let code = proxy.terminate(SOON).expect("the proxy stops on SIGTERM");
    assert!(code.success(), "{code:?}");
}
