//! The operator's tools on real processes (issue 7): `fencer top` finds the
//! busiest resource and its queue, `fencer status` shows readiness, the
//! status port serves health and metrics but not the lock API, and
//! `fencer log-level` changes a running coordinator's and proxy's log
//! filter — after which a call's JSON log lines carry its op, resource,
//! request id and log index from arrival to apply.

use std::process::Command;
use std::time::Duration;

use fencer_testkit::{
    Proc, eventually_blocking, fencer_bin, free_port, http_get_blocking, run, run_json, spawn_fencer, wait_ready,
};
use serde_json::Value;

#[test]
fn t73_top_finds_the_busiest_resource_status_shows_readiness_and_the_status_port_serves_health() {
    let tmp = tempfile::tempdir().unwrap();
    let (port, status_port) = (free_port(), free_port());
    let ep = format!("127.0.0.1:{port}");
    let status_addr = format!("127.0.0.1:{status_port}");
    let data = tmp.path().join("data");
    let mut node = spawn_fencer(
        &["dev", "--data-dir", data.to_str().unwrap(), "--listen", &ep, "--status-listen", &status_addr],
        &tmp.path().join("dev.log"),
    );
    wait_ready(port, Duration::from_secs(20), &mut node);
    let cli = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend_from_slice(&["--endpoints", &ep, "-o", "json"]);
        let (code, v) = run_json(&all);
        assert_eq!(code, 0, "fencer {all:?}: {v}");
        v
    };

    // hot/1 is held and has a waiter; cold/1 was taken once.
    let held = cli(&["acquire", "hot/1", "--holder", "hot-holder"]);
    let refused = run(&["acquire", "hot/1", "--endpoints", &ep]);
    assert_eq!(refused.0, 3, "LOCK_HELD: {}", refused.2);
    cli(&["acquire", "cold/1"]);
    let mut waiter = Command::new(fencer_bin());
    waiter.args(["acquire", "hot/1", "--wait", "60s", "--endpoints", &ep]);
    let mut waiter = Proc::spawn("fencer acquire --wait", &mut waiter, &tmp.path().join("waiter.log"));
    eventually_blocking("the waiter queued", Duration::from_secs(10), || {
        (cli(&["get", "hot/1"])["waiters"].as_u64() == Some(1)).then_some(())
    });

    let top = cli(&["top", "--by", "waiters", "--limit", "5"]);
    assert_eq!((top["by"].as_str(), top["capacity"].as_u64()), (Some("waiters"), Some(1024)));
    let first = &top["resources"][0];
    assert_eq!(first["resource"], "hot/1", "{top}");
    assert_eq!((first["waiters"].as_u64(), first["holder"].as_str()), (Some(1), Some("hot-holder")));
    assert_eq!(first["token"], held["fencing_token"]);
    assert!(first["acquires_per_sec"].as_f64().unwrap() > 0.0);
    let by_rate = cli(&["top", "--limit", "1"]);
    assert_eq!(by_rate["resources"][0]["resource"], "hot/1", "three acquires beat one: {by_rate}");
    let (code, table, err) = run(&["top", "--endpoints", &ep]);
    assert_eq!(code, 0, "{err}");
    assert!(table.contains("RESOURCE") && table.contains("hot/1") && table.contains("cold/1"), "{table}");
    waiter.kill9();

    // Readiness in `fencer status`, as a column and in JSON.
    let (code, table, err) = run(&["status", "--endpoints", &ep]);
    assert_eq!(code, 0, "{err}");
    let header = table.lines().nth(1).unwrap_or_default();
    assert!(header.contains("READY"), "{table}");
    assert!(table.lines().nth(2).unwrap_or_default().contains("yes"), "{table}");
    let status = cli(&["status"]);
    assert_eq!(status["members"][0]["ready"], true, "{status}");
    assert_eq!(status["nodes"][0]["status"]["ready"], true, "{status}");

    // The status port: health, metrics, status, operator endpoints; no lock API.
    assert_eq!(http_get_blocking(("127.0.0.1", status_port), "/readyz").map(|r| r.0), Some(200));
    assert_eq!(http_get_blocking(("127.0.0.1", status_port), "/livez").map(|r| r.0), Some(200));
    let metrics = http_get_blocking(("127.0.0.1", status_port), "/metrics").unwrap().1;
    assert!(metrics.lines().any(|l| l == "fencer_ready 1"), "{metrics}");
    assert_eq!(http_get_blocking(("127.0.0.1", status_port), "/v1/admin/hot?by=hold").map(|r| r.0), Some(200));
    assert_eq!(
        http_get_blocking(("127.0.0.1", status_port), "/v1/locks/hot/1").map(|r| r.0),
        Some(404),
        "the lock API is not on the status port"
    );
    assert_eq!(http_get_blocking(("127.0.0.1", port), "/v1/admin/hot?limit=0").map(|r| r.0), Some(400));
    node.terminate(Duration::from_secs(10));
}

/// The JSON log lines of `log` that are JSON objects.
fn json_lines(log: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(log).unwrap_or_default().lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

#[test]
fn t73_log_level_changes_at_run_time_and_a_call_is_traced_from_arrival_to_apply() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let ep = format!("127.0.0.1:{port}");
    let log = tmp.path().join("dev.log");
    let data = tmp.path().join("data");
    let mut node =
        spawn_fencer(&["dev", "--data-dir", data.to_str().unwrap(), "--listen", &ep, "--log-format", "json"], &log);
    wait_ready(port, Duration::from_secs(20), &mut node);

    let (code, filter, err) = run(&["log-level", "--node", &ep]);
    assert_eq!((code, filter.trim()), (0, "info,openraft=warn"), "{err}");
    let (code, quiet, _) = run(&["acquire", "trace/0", "--request-id", "trace-req-0000", "--endpoints", &ep]);
    assert_eq!(code, 0, "{quiet}");

    let (code, filter, err) = run(&["log-level", "--node", &ep, "info,fencer_coordinator=debug"]);
    assert_eq!((code, filter.trim()), (0, "info,fencer_coordinator=debug"), "{err}");
    assert!(err.contains("was: info,openraft=warn"), "{err}");
    let (code, granted) =
        run_json(&["acquire", "trace/1", "--request-id", "trace-req-0001", "--endpoints", &ep, "-o", "json"]);
    assert_eq!(code, 0, "{granted}");
    let token = granted["fencing_token"].as_u64().unwrap();

    // The call's span carries op, resource, request id and log index; the
    // apply logs the same log index and request id.
    let (done, applied) = eventually_blocking("the call and its apply in the log", Duration::from_secs(10), || {
        let lines = json_lines(&log);
        let done = lines
            .iter()
            .find(|l| l["fields"]["message"] == "call done" && l["span"]["request_id"] == "trace-req-0001")?;
        let applied = lines
            .iter()
            .find(|l| l["fields"]["message"] == "applied" && l["fields"]["request_id"] == "trace-req-0001")?;
        Some((done.clone(), applied.clone()))
    });
    let span = &done["span"];
    assert_eq!((&span["op"], &span["resource"]), (&Value::from("acquire"), &Value::from("trace/1")), "{done}");
    assert_eq!(span["log_index"].as_u64(), Some(token), "{done}");
    assert_eq!(span["outcome"], "ok", "{done}");
    assert_eq!(applied["fields"]["log_index"].as_u64(), Some(token), "{applied}");
    assert!(
        !json_lines(&log).iter().any(|l| l["span"]["request_id"] == "trace-req-0000" && l["level"] == "DEBUG"),
        "nothing at debug level before the change"
    );

    // A filter that does not parse is refused and the old one stays.
    let (code, _, err) = run(&["log-level", "--node", &ep, "info,fencer=[[["]);
    assert_ne!(code, 0);
    assert!(err.contains("400"), "{err}");
    assert_eq!(run(&["log-level", "--node", &ep]).1.trim(), "info,fencer_coordinator=debug");
    node.terminate(Duration::from_secs(10));

    // The proxy's admin API offers the same.
    let (listen, admin, upstream) = (free_port(), free_port(), free_port());
    let admin_addr = format!("127.0.0.1:{admin}");
    let proxy_data = tmp.path().join("proxy");
    let mut proxy = spawn_fencer(
        &[
            "proxy",
            "--listen",
            &format!("127.0.0.1:{listen}"),
            "--admin",
            &admin_addr,
            "--upstream",
            &format!("http://127.0.0.1:{upstream}"),
            "--resource",
            "db/main",
            "--data-dir",
            proxy_data.to_str().unwrap(),
            "--floor",
            "1",
        ],
        &tmp.path().join("proxy.log"),
    );
    eventually_blocking("the proxy's admin API", Duration::from_secs(20), || {
        (http_get_blocking(("127.0.0.1", admin), "/livez").map(|r| r.0) == Some(200)).then_some(())
    });
    assert_eq!(run(&["log-level", "--proxy-admin", &admin_addr]).1.trim(), "info,openraft=warn");
    let (code, out, err) = run(&["log-level", "--proxy-admin", &admin_addr, "fencer_proxy=debug", "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let answer: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        (&answer["filter"], &answer["previous"]),
        (&Value::from("fencer_proxy=debug"), &Value::from("info,openraft=warn"))
    );
    assert_eq!(run(&["log-level", "--proxy-admin", &admin_addr]).1.trim(), "fencer_proxy=debug");
    assert!(proxy.log_text().contains("log filter changed"), "the change itself is logged");
    proxy.terminate(Duration::from_secs(10));
}
