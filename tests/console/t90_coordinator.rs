//! The coordinator's console on a real `fencer dev`: locks, queue, lock
//! detail, audit trail, hot resources, cluster, charts, the status port.

use std::process::{Command, Stdio};
use std::time::Duration;

use fencer_testkit::browser::Browser;
use fencer_testkit::{fencer_bin, free_addr, free_port, run_json, spawn_fencer, wait_ready};
use serde_json::{Value, json};

use crate::fixture::{SOON, assert_clean, open, shot};

/// One row of the locks table, or `null`.
const LOCK_ROW: &str = "
const tr = [...document.querySelectorAll('#locks tbody tr')].find(r => r.dataset.resource === arguments[0]);
if (!tr) return null;
return {
  holder: tr.cells[1].textContent,
  token: tr.cells[2].textContent,
  remaining: tr.cells[3].textContent,
  waiters: [...tr.querySelectorAll('ol.waiters li[data-holder]')].map(li => li.dataset.holder),
};";

/// A chart legend's highest value of `key`, once it is above zero.
const CHART_MAX: &str = "
const li = document.querySelector(`#${arguments[0]} li[data-key=\"${arguments[1]}\"]`);
const max = li ? Number(li.dataset.max) : 0;
return max > 0 ? max : null;";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t90_locks_queue_audit_and_charts() {
    let dir = tempfile::tempdir().unwrap();
    let Some(browser) = Browser::start("t90_locks_queue_audit_and_charts", dir.path()).await else { return };
    let port = free_port();
    let status = free_addr();
    let (listen, status_s) = (format!("127.0.0.1:{port}"), status.to_string());
    let data = dir.path().join("data");
    let args = ["dev", "--data-dir", data.to_str().unwrap(), "--listen", &listen, "--status-listen", &status_s];
    let mut dev = spawn_fencer(&args, &dir.path().join("dev.log"));
    wait_ready(port, Duration::from_secs(20), &mut dev);
    let base = format!("http://{listen}");
    let banner = dev.log_text();
    assert!(banner.contains(&format!("{base}/ui/")), "fencer dev prints the console's URL:\n{banner}");
    assert!(banner.contains(&format!("read only: http://{status_s}/ui/")), "and the status port's:\n{banner}");

    // A lock taken with the CLI shows within 2 s, with its token.
    open(&browser, &base, "locks", "#locks").await;
    let cli = |extra: &[&str]| {
        let mut a = extra.to_vec();
        a.extend(["-o", "json", "--endpoints", &listen]);
        run_json(&a)
    };
    let (code, alice) = cli(&["acquire", "orders/42", "--ttl", "60s", "--holder", "alice"]);
    assert_eq!(code, 0, "{alice}");
    let token = alice["fencing_token"].as_u64().unwrap();
    let row = browser
        .wait_for("orders/42 on the locks page", Duration::from_secs(2), LOCK_ROW, vec![json!("orders/42")])
        .await;
    assert_eq!(row["holder"], "alice", "{row}");
    assert_eq!(row["token"], token.to_string(), "{row}");
    // The remaining ttl counts down in the page between refreshes.
    let first = row["remaining"].as_str().unwrap().to_string();
    assert!(first.ends_with('s'), "a remaining time on the leader: {row}");
    let later = browser
        .wait_for(
            "the remaining ttl to change",
            SOON,
            "const r = document.querySelector('#locks tbody tr[data-resource=\"orders/42\"] .countdown');
             return r && r.textContent !== arguments[0] ? r.textContent : null;",
            vec![json!(first)],
        )
        .await;
    assert_ne!(later, Value::String(first));

    // A queued waiter shows behind the holder, in FIFO order.
    let bob = Command::new(fencer_bin())
        .args(["acquire", "orders/42", "--ttl", "60s", "--wait", "30s", "--holder", "bob", "-o", "json"])
        .args(["--endpoints", &listen])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let bob_pid = bob.id();
    let bob_out = std::thread::spawn(move || bob.wait_with_output());
    browser
        .wait_for(
            "bob in the waiters column",
            SOON,
            "return [...document.querySelectorAll('#locks tbody tr[data-resource=\"orders/42\"] ol.waiters li')]
                .map(li => li.dataset.holder).join(',') === 'bob'",
            vec![],
        )
        .await;
    shot(&browser, "locks").await;

    // The lock's own page: lease, queue, its audit lines.
    open(&browser, &base, "lock/orders%2F42", "#lease").await;
    browser
        .wait_for(
            "alice's lease and bob's place on the lock page",
            SOON,
            "const h = document.querySelector('#lease-holder');
             const q = [...document.querySelectorAll('#queue tbody tr')].map(r => r.cells[1].textContent);
             const a = document.querySelectorAll('#lock-audit tbody tr[data-op=\"acquire\"]').length;
             return h && h.textContent === 'alice' && q.join(',') === 'bob' && a > 0;",
            vec![],
        )
        .await;
    let shown_token = browser.eval("return document.querySelector('#lease-token').textContent", vec![]).await;
    assert_eq!(shown_token, token.to_string());
    shot(&browser, "lock").await;

    // Released: bob is granted; released too: the lock leaves the page.
    open(&browser, &base, "locks", "#locks").await;
    let (code, out) = cli(&["release", "orders/42", "--lease", alice["lease_id"].as_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    let bob_out = bob_out.join().unwrap().unwrap_or_else(|e| panic!("bob's acquire (pid {bob_pid}): {e}"));
    assert!(bob_out.status.success(), "bob: {}", String::from_utf8_lossy(&bob_out.stderr));
    let bob: Value = serde_json::from_slice(&bob_out.stdout).unwrap();
    browser
        .wait_for(
            "bob as the holder",
            SOON,
            "const tr = document.querySelector('#locks tbody tr[data-resource=\"orders/42\"]');
             return tr && tr.cells[1].textContent === 'bob' && tr.querySelectorAll('ol.waiters li').length === 0;",
            vec![],
        )
        .await;
    let (code, out) = cli(&["release", "orders/42", "--lease", bob["lease_id"].as_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    browser
        .wait_for(
            "orders/42 to leave the locks page",
            Duration::from_secs(2),
            "return document.querySelector('#locks tbody tr[data-resource=\"orders/42\"]') === null
                && document.querySelector('#locks tbody td.empty') !== null",
            vec![],
        )
        .await;

    // A short bounded load: the charts show non-zero rates and latencies.
    let client = fencer_client::Client::new([listen.clone()]).unwrap();
    let until = tokio::time::Instant::now() + Duration::from_secs(3);
    let mut n = 0;
    while tokio::time::Instant::now() < until && n < 2000 {
        let resource = format!("load/{}", n % 8);
        let g = client.acquire(resource.clone()).ttl(Duration::from_secs(10)).holder("load").grant().await.unwrap();
        client.release(&resource, &g.lease_id.to_string()).await.unwrap();
        n += 1;
    }
    assert!(n > 10, "only {n} acquire/release pairs in 3 s");
    open(&browser, &base, "charts", "#chart-rates").await;
    for (chart, key) in [
        ("chart-rates", "grants"),
        ("chart-rates", "releases"),
        ("chart-latency", "acquire_p50_ms"),
        ("chart-latency", "acquire_p99_ms"),
    ] {
        browser
            .wait_for(&format!("{key} above zero on {chart}"), SOON, CHART_MAX, vec![json!(chart), json!(key)])
            .await;
    }
    shot(&browser, "charts").await;

    // Hot resources, the audit trail filtered, the cluster.
    open(&browser, &base, "hot", "#hot").await;
    browser
        .wait_for(
            "load/ among the hot resources",
            SOON,
            "return document.querySelector('#hot').textContent.includes('load/')",
            vec![],
        )
        .await;
    shot(&browser, "hot").await;
    open(&browser, &base, "audit?resource=orders%2F42", "#audit").await;
    let ops = browser
        .wait_for(
            "orders/42's acquires and releases in the audit trail",
            SOON,
            "const rows = [...document.querySelectorAll('#audit tbody tr[data-op]')];
             const ops = rows.map(r => r.dataset.op);
             return ops.includes('release') && ops.includes('acquire') ? rows.map(r => [r.dataset.op, r.dataset.resource]) : null;",
            vec![],
        )
        .await;
    for r in ops.as_array().unwrap() {
        assert_eq!(r[1], "orders/42", "the filter keeps orders/42 only: {ops}");
    }
    shot(&browser, "audit").await;
    open(&browser, &base, "cluster", "#cluster-facts").await;
    browser
        .wait_for("the node ready and leading", SOON, "const r = document.querySelector('#ready'); return r && r.textContent === 'ready' && document.querySelector('#members').textContent.includes('leader');", vec![])
        .await;
    shot(&browser, "cluster").await;
    assert_clean(&browser, &base, &[]).await;

    // The status port: the same pages, read only (no actions served).
    let status_base = format!("http://{status_s}");
    open(&browser, &status_base, "locks", "#locks").await;
    let label = browser.eval("return document.querySelector('#server').textContent", vec![]).await;
    assert!(label.as_str().unwrap().contains("read only"), "{label}");
    assert_clean(&browser, &status_base, &[]).await;
    browser.close().await;
}
