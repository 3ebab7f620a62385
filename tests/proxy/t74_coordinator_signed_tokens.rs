//! Signed fencing tokens end to end (DESIGN P7, issue 9 part B): a real
//! `fencer dev` coordinator signs its grants, `fencer keys export` writes
//! the key set a proxy loads, and the proxy accepts the coordinator's token
//! for the resource it was granted on and refuses it anywhere else; it
//! refuses forged and unsigned tokens, a token whose key it does not know
//! (a rotated key before the proxy reloaded), and a token whose key was
//! retired. Each refusal is in the rejection log with its reason. `fencer
//! exec` hands the signed token to its command.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use fencer_proxy::testing::{Method, Status, TestClient, TestResponse, TestUpstream};
use fencer_proxy::{AdminClient, ProxyHandle, RejectReason};
use fencer_testkit::{Proc, ProxyConfigBuilder, fencer_bin, free_addr, run_fencer, wait_http};
use serde_json::Value;

const SOON: Duration = Duration::from_secs(20);

/// `fencer ARGS… --endpoints ADDR`, which must succeed; its stdout.
fn fencer(endpoint: &str, args: &[&str]) -> String {
    let mut all = args.to_vec();
    all.extend(["--endpoints", endpoint]);
    let out = run_fencer(&all, SOON);
    assert!(
        out.status.success(),
        "fencer {all:?}: {:?}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `fencer acquire RESOURCE -o json`: (fencing token, signed token).
fn acquire(endpoint: &str, resource: &str) -> (u64, String) {
    let v: Value =
        serde_json::from_str(&fencer(endpoint, &["acquire", resource, "--ttl", "30s", "-o", "json"])).unwrap();
    let signed = v["signed_token"].as_str().expect("the grant carries a signed token").to_string();
    (v["fencing_token"].as_u64().unwrap(), signed)
}

fn export(endpoint: &str, file: &Path) {
    fencer(endpoint, &["keys", "export", "--out", file.to_str().unwrap()]);
}

async fn start_proxy(upstream: &TestUpstream, dir: &Path, keys_file: &Path) -> ProxyHandle {
    start_proxy_with(upstream, dir, keys_file, "").await
}

/// A proxy that never tolerates clock skew, so a retired key is refused the
/// moment its window ends.
async fn start_strict_proxy(upstream: &TestUpstream, dir: &Path, keys_file: &Path) -> ProxyHandle {
    start_proxy_with(upstream, dir, keys_file, r#"clock_skew = "0s""#).await
}

/// A proxy verifying tokens against `keys_file`; `signing_extra` goes into
/// its `[signing]` table.
async fn start_proxy_with(upstream: &TestUpstream, dir: &Path, keys_file: &Path, signing_extra: &str) -> ProxyHandle {
    let config = ProxyConfigBuilder::new(&upstream.url(), dir.join("proxy-data"))
        .table("signing", &format!("keys_file = {keys_file:?}\n{signing_extra}"))
        .write(&[], "/db/{name}/*", "db/{name}")
        .build();
    fencer_proxy::start(config, Some(0)).await.unwrap()
}

async fn write(proxy: &ProxyHandle, resource: &str, token: &str) -> TestResponse {
    let path = format!("/{resource}/rows");
    TestClient::new().send(proxy.local_addr(), Method::POST, &path, &[("fencing-token", token)], "v").await.unwrap()
}

fn refused(resp: &TestResponse, slug: &str) {
    assert_eq!(resp.status, Status::FORBIDDEN, "{:?}", resp.body);
    assert_eq!(resp.json()["type"], format!("urn:fencer:proxy:{slug}"), "{:?}", resp.body);
}

/// The whole path: coordinator → `fencer keys export` → proxy `[signing]`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t74_the_proxy_verifies_the_coordinators_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let addr = free_addr();
    let endpoint = addr.to_string();
    let log = dir.path().join("dev.log");
    let mut cmd = Command::new(fencer_bin());
    cmd.args(["dev", "--listen", &endpoint, "--data-dir"]).arg(dir.path().join("data"));
    let mut dev = Proc::spawn("fencer dev", &mut cmd, &log);
    wait_http(addr, "/readyz", 200, &mut dev, SOON).await;

    let (token_x, signed_x) = acquire(&endpoint, "db/x");
    let keys_file = dir.path().join("keys.json");
    export(&endpoint, &keys_file);
    // The simple form of `fencer proxy` takes the exported file as it is.
    let listen = free_addr().to_string();
    let data = dir.path().join("check-data");
    let check = run_fencer(
        &[
            "proxy",
            "--listen",
            &listen,
            "--upstream",
            "http://127.0.0.1:9",
            "--resource",
            "db/x",
            "--data-dir",
            data.to_str().unwrap(),
            "--signing-keys",
            keys_file.to_str().unwrap(),
            "--check-config",
        ],
        SOON,
    );
    let stdout = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success() && stdout.contains("unsigned refused"), "{stdout}{:?}", check.stderr);
    let upstream = TestUpstream::start().await.unwrap();
    let proxy = start_proxy(&upstream, dir.path(), &keys_file).await;
    let admin = AdminClient::new(&proxy.admin_addr().to_string(), SOON).unwrap();

    // Genuine, on its own resource: accepted, the epoch moves to its token.
    assert_eq!(write(&proxy, "db/x", &signed_x).await.status, Status::OK);
    assert_eq!(admin.resource("db/x").await.unwrap().epoch, token_x);
    // The same token on another resource.
    refused(&write(&proxy, "db/y", &signed_x).await, "wrong-resource");
    // Forged: the claims raised to a huge token, the genuine signature kept.
    let (claims, sig) = {
        let mut parts = signed_x.split('.').skip(1);
        (parts.next().unwrap().to_string(), parts.next().unwrap().to_string())
    };
    let json = String::from_utf8(URL_SAFE_NO_PAD.decode(&claims).unwrap()).unwrap();
    let forged_claims = json.replace(&format!("\"tok\":{token_x}"), &format!("\"tok\":{}", u64::MAX));
    assert_ne!(forged_claims, json);
    let forged = format!("v1.{}.{sig}", URL_SAFE_NO_PAD.encode(forged_claims));
    refused(&write(&proxy, "db/x", &forged).await, "bad-signature");
    // Unsigned: the plain number the same grant carries.
    refused(&write(&proxy, "db/x", &token_x.to_string()).await, "unsigned-token");
    assert_eq!(admin.resource("db/x").await.unwrap().epoch, token_x, "no refusal moved the epoch");

    // Rotation: the new key signs at once (--activate-in 0s), the proxy does
    // not know it until the key set is exported again and reloaded.
    let old_kid = {
        let v: Value = serde_json::from_str(&fencer(&endpoint, &["keys", "list", "-o", "json"])).unwrap();
        v["keys"][0]["kid"].as_str().unwrap().to_string()
    };
    fencer(&endpoint, &["keys", "rotate", "--activate-in", "0s"]);
    let (_, signed_z) = acquire(&endpoint, "db/z");
    refused(&write(&proxy, "db/z", &signed_z).await, "unknown-key");
    export(&endpoint, &keys_file);
    assert_eq!(admin.reload_keys().await.unwrap().key_ids.len(), 2);
    assert_eq!(write(&proxy, "db/z", &signed_z).await.status, Status::OK);
    // `fencer exec` hands the signed token to its command.
    let script = "printf %s \"$FENCER_SIGNED_TOKEN\"";
    let out = run_fencer(&["exec", "db/e", "--endpoints", &endpoint, "--ttl", "30s", "--", "sh", "-c", script], SOON);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let from_exec = String::from_utf8(out.stdout).unwrap();
    assert!(from_exec.starts_with("v1."), "{from_exec:?}");
    assert_eq!(write(&proxy, "db/e", &from_exec).await.status, Status::OK);

    // Retiring the old key: its tokens are refused once the proxy reloads.
    assert_eq!(write(&proxy, "db/x", &signed_x).await.status, Status::OK, "still valid before the retirement");
    fencer(&endpoint, &["keys", "retire", &old_kid, "--after", "0s"]);
    export(&endpoint, &keys_file);
    admin.reload_keys().await.unwrap();
    // The proxy's default clock-skew allowance is 30 s: the retirement
    // takes effect at not_after + skew. Shown here with a proxy allowing
    // no skew, loading the same file.
    let strict_dir = dir.path().join("strict");
    std::fs::create_dir_all(&strict_dir).unwrap();
    let strict_text = std::fs::read_to_string(&keys_file).unwrap();
    let strict_keys = strict_dir.join("keys.json");
    std::fs::write(&strict_keys, strict_text).unwrap();
    let strict = start_strict_proxy(&upstream, &strict_dir, &strict_keys).await;
    refused(&write(&strict, "db/x", &signed_x).await, "expired-key");
    assert_eq!(write(&strict, "db/z", &signed_z).await.status, Status::OK, "the new key's tokens still pass");

    // Every refusal is in the rejection log, with its reason.
    let page = admin.rejections(None, 100).await.unwrap();
    let mut reasons: Vec<RejectReason> = page.rejections.iter().map(|r| r.reason).collect();
    reasons.reverse();
    use RejectReason::*;
    assert_eq!(reasons, [WrongResource, BadSignature, UnsignedToken, UnknownKey]);
    let strict_admin = AdminClient::new(&strict.admin_addr().to_string(), SOON).unwrap();
    let strict_log = strict_admin.rejections(None, 100).await.unwrap();
    assert_eq!(strict_log.rejections.iter().map(|r| r.reason).collect::<Vec<_>>(), [ExpiredKey]);

    strict.shutdown().await;
    proxy.shutdown().await;
    assert!(dev.terminate(SOON).is_some_and(|s| s.success()), "fencer dev stops cleanly");
}
