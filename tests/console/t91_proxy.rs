//! The proxy's console on a real `fencer proxy` (HTTP front end) in front
//! of a test upstream: resources, quarantine, the rejection log, actions,
//! the traffic chart.

use fencer_proxy::testing::{Status, TestClient, TestUpstream};
use fencer_testkit::browser::Browser;
use fencer_testkit::{free_addr, run_fencer, spawn_http_proxy};
use serde_json::{Value, json};

use crate::fixture::{SOON, assert_clean, open, shot};

/// The cells of `main`'s row on the resources page, or `null`.
const MAIN_ROW: &str = "
const tr = document.querySelector('#resources tbody tr[data-resource=\"main\"]');
return tr ? [...tr.cells].map(c => c.textContent) : null;";

/// Confirms the open action dialog with `reason`.
async fn confirm(browser: &Browser, reason: &str) {
    browser
        .wait_for("the confirmation dialog", SOON, "return document.querySelector('#confirm-dialog').open", vec![])
        .await;
    browser.type_into("#confirm-fields input[name=reason]", reason).await;
    browser.click("#confirm-ok").await;
    browser
        .wait_for(
            "the dialog to close once done",
            SOON,
            "return !document.querySelector('#confirm-dialog').open",
            vec![],
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t91_quarantine_rejections_and_epochs() {
    let dir = tempfile::tempdir().unwrap();
    let Some(browser) = Browser::start("t91_quarantine_rejections_and_epochs", dir.path()).await else { return };
    let upstream = TestUpstream::start().await.unwrap();
    let client = TestClient::new();
    let data = dir.path().join("data");

    // Killed after a write: restarted, `main` is indeterminate (P4).
    let (listen, admin) = (free_addr(), free_addr());
    let mut first =
        spawn_http_proxy(listen, admin, &upstream.url(), &data, Some(1), &dir.path().join("proxy1.log")).await;
    assert_eq!(client.write(listen, "/write", 5).await.unwrap().status, Status::OK);
    first.kill9();
    let (listen, admin) = (free_addr(), free_addr());
    let _proxy = spawn_http_proxy(listen, admin, &upstream.url(), &data, None, &dir.path().join("proxy2.log")).await;
    let base = format!("http://{admin}");

    open(&browser, &base, "resources", "#resources").await;
    let row = browser.wait_for("main, quarantined", SOON, MAIN_ROW, vec![]).await;
    assert_eq!(row[1], "5", "its epoch: {row}");
    let state = row[4].as_str().unwrap();
    assert!(state.contains("indeterminate") && state.contains("quarantine ends in"), "{row}");
    let label = browser.eval("return document.querySelector('#server').textContent", vec![]).await;
    assert!(label.as_str().unwrap().starts_with("HTTP proxy"), "{label}");
    shot(&browser, "proxy-resources").await;

    // Cleared in the page: determinate at once, higher tokens admitted.
    browser.click("button[data-action=\"clear-indeterminate\"][data-resource=\"main\"]").await;
    confirm(&browser, "console test: nothing in flight").await;
    browser
        .wait_for("main determinate", SOON, "const r = document.querySelector('#resources tbody tr[data-resource=\"main\"]'); return r && r.cells[4].textContent === 'determinate';", vec![])
        .await;

    // A stale write shows in the rejection log with its reason.
    let stale = client.write(listen, "/write", 3).await.unwrap();
    assert_eq!(stale.status, Status::CONFLICT, "{:?}", stale.body);
    assert_eq!(client.write(listen, "/write", 6).await.unwrap().status, Status::OK);
    open(&browser, &base, "rejections", "#rejections").await;
    let rejected = browser
        .wait_for(
            "the stale write in the rejection log",
            SOON,
            "const tr = document.querySelector('#rejections tbody tr[data-reason=\"stale_token\"][data-resource=\"main\"]');
             return tr ? [...tr.cells].map(c => c.textContent) : null;",
            vec![],
        )
        .await;
    assert_eq!(rejected[4], "3", "the presented token: {rejected}");
    assert_eq!(rejected[5], "5", "the epoch it was below: {rejected}");
    shot(&browser, "proxy-rejections").await;
    // The filters: another reason finds nothing.
    open(&browser, &base, "rejections?reason=missing_token", "#rejections").await;
    browser
        .wait_for(
            "no missing_token rejection",
            SOON,
            "return document.querySelector('#rejections tbody td.empty') !== null",
            vec![],
        )
        .await;

    // The epoch raised in the page, as POST /v1/raise-epoch would.
    open(&browser, &base, "resources", "#resources").await;
    browser.wait_for("main at epoch 6", SOON, "const r = document.querySelector('#resources tbody tr[data-resource=\"main\"]'); return r && r.cells[1].textContent === '6';", vec![]).await;
    browser.click("button[data-action=\"raise-epoch\"][data-resource=\"main\"]").await;
    let proposed =
        browser.eval("return document.querySelector('#confirm-fields input[name=epoch]').value", vec![]).await;
    assert_eq!(proposed, "7", "the dialog proposes the next epoch");
    confirm(&browser, "console test: fence off 6").await;
    browser.wait_for("main at epoch 7", SOON, "const r = document.querySelector('#resources tbody tr[data-resource=\"main\"]'); return r && r.cells[1].textContent === '7';", vec![]).await;
    let out = run_fencer(&["proxy-status", "--admin", &admin.to_string(), "-o", "json", "main"], SOON);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["resources"][0]["epoch"], 7, "{status}");
    assert_eq!(client.write(listen, "/write", 6).await.unwrap().status, Status::CONFLICT);

    // The chart: accepted and rejected per second.
    open(&browser, &base, "charts", "#chart-traffic").await;
    for key in ["accepted", "rejected"] {
        browser
            .wait_for(
                &format!("{key} above zero"),
                SOON,
                "const li = document.querySelector(`#chart-traffic li[data-key=\"${arguments[0]}\"]`); return li && Number(li.dataset.max) > 0;",
                vec![json!(key)],
            )
            .await;
    }
    shot(&browser, "proxy-charts").await;
    assert_clean(&browser, &base, &[]).await;
    browser.close().await;
}
