//! The coordinator's console with tenants: each sees only what it may
//! read; actions need `admin` (a tenant with `read` gets no button and
//! its POST is refused) and the page token; the console's
//! force-release is audited like `fencer force-release`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use fencer_coordinator::bearer_token_sha256;
use fencer_testkit::browser::Browser;
use fencer_testkit::{free_port, run_json, spawn_fencer, wait_ready};
use serde_json::{Value, json};

use crate::fixture::{SOON, assert_clean, open, shot};

const ALPHA: &str = "alpha-token-0123456789abcdef";
const BETA: &str = "beta-token-0123456789abcdef";
const OPS: &str = "ops-token-0123456789abcdef";

fn tenants_file() -> String {
    format!(
        r#"
[[tenant]]
name = "alpha"
bearer_token_sha256 = ["{alpha}"]
[[tenant.permission]]
prefix = "alpha/"
allow = ["acquire", "read"]

[[tenant]]
name = "beta"
bearer_token_sha256 = ["{beta}"]

[[tenant]]
name = "ops"
namespace = ""
bearer_token_sha256 = ["{ops}"]
[[tenant.permission]]
prefix = ""
allow = ["read", "admin"]
"#,
        alpha = bearer_token_sha256(ALPHA),
        beta = bearer_token_sha256(BETA),
        ops = bearer_token_sha256(OPS),
    )
}

/// The resources of the locks table.
const LISTED: &str =
    "return [...document.querySelectorAll('#locks tbody tr[data-resource]')].map(r => r.dataset.resource)";

/// Sends a console action from inside the page, as a script of another
/// origin could not (it has the page token): `[status, reason]`.
const POST_ACTION: &str = "
const [path, body, bearer, withPageToken, done] = arguments;
const headers = { 'content-type': 'application/json', authorization: `Bearer ${bearer}` };
if (withPageToken) headers['x-fencer-page-token'] = document.querySelector('meta[name=\"fencer-page-token\"]').content;
fetch(`/ui/api/${path}`, { method: 'POST', headers, body: JSON.stringify(body) })
  .then(async r => done([r.status, ((await r.json()).error || {}).reason || null]))
  .catch(e => done([0, String(e)]));";

/// Every line of the audit files under `dir`.
fn audit_lines(dir: &Path) -> Vec<Value> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("audit.jsonl")) {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    walk(dir, &mut files);
    files
        .iter()
        .flat_map(|f| std::fs::read_to_string(f).unwrap_or_default().lines().map(str::to_string).collect::<Vec<_>>())
        .filter_map(|l| serde_json::from_str(&l).ok())
        .collect()
}

/// Uses `token` in this tab (session storage) and opens the locks page.
async fn sign_in(browser: &Browser, base: &str, token: &str) {
    browser.eval("sessionStorage.setItem('fencer.bearer', arguments[0])", vec![json!(token)]).await;
    open(browser, base, "locks", "#locks").await;
    browser.client().refresh().await.unwrap();
    open(browser, base, "locks", "#locks").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t92_tenants_see_their_own_and_actions_need_admin() {
    let dir = tempfile::tempdir().unwrap();
    let Some(browser) = Browser::start("t92_tenants_see_their_own_and_actions_need_admin", dir.path()).await else {
        return;
    };
    let tenants = dir.path().join("tenants.toml");
    std::fs::write(&tenants, tenants_file()).unwrap();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let data = dir.path().join("data");
    let args =
        ["dev", "--data-dir", data.to_str().unwrap(), "--listen", &listen, "--tenants", tenants.to_str().unwrap()];
    let mut dev = spawn_fencer(&args, &dir.path().join("dev.log"));
    wait_ready(port, Duration::from_secs(20), &mut dev);
    let base = format!("http://{listen}");
    assert!(dev.log_text().contains("enter a tenant's bearer token in the page"), "{}", dev.log_text());
    let acquire = |resource: &str, token: &str| {
        let (code, v) = run_json(&[
            "acquire",
            resource,
            "--ttl",
            "120s",
            "--holder",
            "worker",
            "--bearer-token",
            token,
            "-o",
            "json",
            "--endpoints",
            &listen,
        ]);
        assert_eq!(code, 0, "{resource}: {v}");
        v
    };
    acquire("alpha/job", ALPHA);
    acquire("beta/job", BETA);

    // No token: the page asks for one; alpha enters its own in the dialog.
    browser.goto(&format!("{base}/ui/#/locks")).await;
    browser
        .wait_for("the bearer token dialog", SOON, "return document.querySelector('#auth-dialog').open", vec![])
        .await;
    browser.type_into("#auth-token", ALPHA).await;
    browser.click("#auth-save").await;
    let listed = browser
        .wait_for(
            "alpha/job listed",
            SOON,
            &format!("const l = (() => {{ {LISTED} }})(); return l.length ? l : null;"),
            vec![],
        )
        .await;
    assert_eq!(listed, json!(["alpha/job"]), "alpha sees its own lock only");
    let stored = browser
        .eval("return [sessionStorage.getItem('fencer.bearer'), localStorage.length, document.cookie]", vec![])
        .await;
    assert_eq!(stored, json!([ALPHA, 0, ""]), "the token lives in session storage only; no cookie");
    // Nor in the audit trail, nor on the hot page.
    open(&browser, &base, "audit", "#audit").await;
    let resources = browser
        .wait_for(
            "alpha's audit lines",
            SOON,
            "const r = [...document.querySelectorAll('#audit tbody tr[data-op]')].map(r => r.dataset.resource); return r.length ? r : null;",
            vec![],
        )
        .await;
    assert!(resources.as_array().unwrap().iter().all(|r| r == "alpha/job"), "{resources}");
    open(&browser, &base, "lock/beta%2Fjob", "#main").await;
    browser
        .wait_for(
            "beta/job refused to alpha",
            SOON,
            "return document.querySelector('#banner').textContent.includes('PERMISSION_DENIED')",
            vec![],
        )
        .await;
    shot(&browser, "tenant-refused").await;

    // Alpha may read, not admin: no button, and the POST is refused.
    open(&browser, &base, "locks", "#locks").await;
    browser
        .wait_for(
            "alpha/job for alpha",
            SOON,
            "return document.querySelector('#locks tbody tr[data-resource=\"alpha/job\"]') !== null",
            vec![],
        )
        .await;
    let buttons =
        browser.eval("return document.querySelectorAll('button[data-action=\"force-release\"]').length", vec![]).await;
    assert_eq!(buttons, 0, "no force-release button without admin");
    let refused = browser
        .client()
        .execute_async(
            POST_ACTION,
            vec![json!("force-release"), json!({"resource": "alpha/job", "reason": "x"}), json!(ALPHA), json!(true)],
        )
        .await
        .unwrap();
    assert_eq!(refused, json!([403, "PERMISSION_DENIED"]), "a read tenant's POST");

    // An admin: without the page token the action is refused (CSRF) ...
    sign_in(&browser, &base, OPS).await;
    let listed = browser
        .wait_for(
            "both locks for ops",
            SOON,
            &format!("const l = (() => {{ {LISTED} }})(); return l.length === 2 ? l : null;"),
            vec![],
        )
        .await;
    assert_eq!(listed, json!(["alpha/job", "beta/job"]));
    let no_token = browser
        .client()
        .execute_async(
            POST_ACTION,
            vec![json!("force-release"), json!({"resource": "alpha/job", "reason": "x"}), json!(OPS), json!(false)],
        )
        .await
        .unwrap();
    assert_eq!(no_token, json!([403, "PAGE_TOKEN"]), "an action without the page token");
    // ... and with it, confirmed in the page, it is done and audited.
    shot(&browser, "locks-admin").await;
    browser.click("button[data-action=\"force-release\"][data-resource=\"alpha/job\"]").await;
    browser
        .wait_for("the confirmation dialog", SOON, "return document.querySelector('#confirm-dialog').open", vec![])
        .await;
    shot(&browser, "force-release").await;
    browser.type_into("#confirm-fields input[name=caller]", "oncall").await;
    browser.type_into("#confirm-fields input[name=reason]", "console test").await;
    browser.click("#confirm-ok").await;
    browser
        .wait_for(
            "alpha/job released",
            SOON,
            "return document.querySelector('#locks tbody tr[data-resource=\"alpha/job\"]') === null",
            vec![],
        )
        .await;
    // Its CLI twin, for the comparison.
    let (code, v) = run_json(&[
        "force-release",
        "beta/job",
        "--reason",
        "console test",
        "--caller",
        "oncall",
        "--bearer-token",
        OPS,
        "-o",
        "json",
        "--endpoints",
        &listen,
    ]);
    assert_eq!(code, 0, "{v}");
    let lines = fencer_testkit::eventually("both force-releases in the audit log", SOON, || {
        let lines: Vec<Value> = audit_lines(&data).into_iter().filter(|l| l["op"] == "force_release").collect();
        async move { (lines.len() == 2).then_some(lines) }
    })
    .await;
    let (console, cli) = (&lines[0], &lines[1]);
    assert_eq!(console["resource"], "alpha/job");
    assert_eq!(cli["resource"], "beta/job");
    for field in ["caller", "reason", "outcome"] {
        assert_eq!(console[field], cli[field], "{field}: console {console} vs CLI {cli}");
    }
    assert_eq!(console["caller"], "[tenant ops] oncall");
    let keys = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(console), keys(cli), "the same audit record");
    assert_clean(&browser, &base, &["401", "403"]).await;
    browser.close().await;
}
