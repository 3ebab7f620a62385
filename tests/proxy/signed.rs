//! Signed fencing tokens at the proxy (DESIGN P7): the token is verified
//! before the epoch can move, so a forged huge token cannot lock every
//! genuine holder out (E never decreases, P8). Each test names the rule it
//! protects; none asserts on timing. Keys are Ed25519, made in the test.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use fencer_proxy::testing::{Method, Status, TestClient, TestResponse, TestUpstream};
use fencer_proxy::{AdminClient, ProxyHandle, RejectReason, RejectionRecord};
use fencer_testkit::{Proc, ProxyConfigBuilder, Signal, fencer_bin, free_addr, wait_http};
use fencer_token::{KeyId, KeySet, PublicKeyEntry, Signer};

const SOON: Duration = Duration::from_secs(20);
const HOUR: u64 = 3_600_000;
const FLOOR: u64 = 100;
const LID: u128 = 0x6cf4_a1b2_c3d4_e5f6_0718_293a_4b5c_6d7e;

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

fn signer(kid: &str, seed: u8) -> Signer {
    Signer::from_secret_bytes(KeyId::new(kid).unwrap(), &[seed; 32])
}

fn write_keys(path: &Path, keys: Vec<PublicKeyEntry>) {
    KeySet { keys }.write(path).unwrap();
}

/// A proxy in front of `upstream` with `signing` (a `[signing]` table) and
/// one route: `/db/{name}/*` writes `db/{name}`.
fn config(upstream: &str, data: &Path, signing: &str) -> ProxyConfigBuilder {
    ProxyConfigBuilder::new(upstream, data).setting("max_epoch_jump = 1000").raw(signing).write(
        &[],
        "/db/{name}/*",
        "db/{name}",
    )
}

struct Harness {
    upstream: TestUpstream,
    proxy: ProxyHandle,
    client: TestClient,
    admin: AdminClient,
    keys_file: PathBuf,
    _dir: tempfile::TempDir,
}

impl Harness {
    /// A proxy with `[signing]` over a key set holding `keys`; `extra` goes
    /// into the `[signing]` table.
    async fn start(keys: Vec<PublicKeyEntry>, extra: &str) -> Self {
        let upstream = TestUpstream::start().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let keys_file = dir.path().join("keys.json");
        write_keys(&keys_file, keys);
        let signing = format!("[signing]\nkeys_file = \"{}\"\n{extra}", keys_file.display());
        let config = config(&upstream.url(), &dir.path().join("data"), &signing).build();
        let proxy = fencer_proxy::start(config, Some(FLOOR)).await.unwrap();
        let admin = AdminClient::new(&proxy.admin_addr().to_string(), SOON).unwrap();
        Self { upstream, proxy, client: TestClient::new(), admin, keys_file, _dir: dir }
    }

    async fn write(&self, resource: &str, token: &str) -> TestResponse {
        let path = format!("/{resource}/rows");
        self.client.send(self.proxy.local_addr(), Method::POST, &path, &[("fencing-token", token)], "v").await.unwrap()
    }

    async fn epoch(&self, resource: &str) -> u64 {
        self.admin.resource(resource).await.unwrap().epoch
    }

    /// Waits until the rejection log holds `n` records; returns them oldest
    /// first (the log is written asynchronously).
    async fn rejections(&self, n: usize) -> Vec<RejectionRecord> {
        for _ in 0..400 {
            let page = self.admin.rejections(None, 100).await.unwrap();
            if page.rejections.len() >= n {
                let mut all = page.rejections;
                all.reverse();
                return all;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("the rejection log never reached {n} records");
    }

    async fn metrics(&self) -> String {
        let r = self.client.send(self.proxy.admin_addr(), Method::GET, "/metrics", &[], "").await.unwrap();
        String::from_utf8_lossy(&r.body).into_owned()
    }
}

fn assert_refused(resp: &TestResponse, status: Status, slug: &str) {
    assert_eq!(resp.status, status, "{:?}", resp.body);
    assert_eq!(resp.json()["type"], format!("urn:fencer:proxy:{slug}"), "{:?}", resp.body);
}

/// The claims part of a genuine token replaced by other JSON, its genuine
/// signature kept.
fn with_claims(token: &str, json: &str) -> String {
    let sig = token.rsplit('.').next().unwrap();
    format!("v1.{}.{sig}", URL_SAFE_NO_PAD.encode(json))
}

/// P7: a forged huge token does not move the epoch, whatever its form —
/// plain, signed by another key under the genuine key id, a genuine token
/// with its claims altered, or naming a key the proxy does not have. The
/// upstream sees none of them, each is logged and counted with its own
/// reason, and the genuine holder's next token still goes through.
#[tokio::test]
async fn t80_a_forged_huge_token_does_not_move_the_epoch() {
    let genuine = signer("k1", 1);
    let h = Harness::start(vec![genuine.public_entry(now_ms() - HOUR, None)], "").await;
    let t150 = genuine.sign("db/a", FLOOR + 50, LID, now_ms()).unwrap();
    assert_eq!(h.write("db/a", t150.as_str()).await.status, Status::OK);
    assert_eq!(h.epoch("db/a").await, 150);
    let seen = h.upstream.events().len();

    let huge = u64::MAX;
    let claims = format!(r#"{{"kid":"k1","res":"db/a","tok":{huge},"lid":"{LID:032x}","iat":{}}}"#, now_ms());
    let forgeries = [
        (huge.to_string(), "unsigned-token"),
        (signer("k1", 66).sign("db/a", huge, LID, now_ms()).unwrap().into_string(), "bad-signature"),
        (with_claims(t150.as_str(), &claims), "bad-signature"),
        (signer("k-attacker", 66).sign("db/a", huge, LID, now_ms()).unwrap().into_string(), "unknown-key"),
        // Within max_epoch_jump: only the signature check stands in the way.
        (signer("k1", 66).sign("db/a", 150 + 999, LID, now_ms()).unwrap().into_string(), "bad-signature"),
    ];
    for (token, slug) in &forgeries {
        let resp = h.write("db/a", token).await;
        assert_refused(&resp, Status::FORBIDDEN, slug);
        assert_eq!(resp.json()["resource"], "db/a");
    }
    assert_eq!(h.epoch("db/a").await, 150, "a forged token moved the epoch");
    assert_eq!(h.upstream.events().len(), seen, "a forged token reached the upstream");

    let log = h.rejections(forgeries.len()).await;
    let reasons: Vec<RejectReason> = log.iter().map(|r| r.reason).collect();
    use RejectReason::{BadSignature, UnknownKey, UnsignedToken};
    assert_eq!(reasons, [UnsignedToken, BadSignature, BadSignature, UnknownKey, BadSignature]);
    assert!(log[..4].iter().all(|r| r.presented_token == Some(huge) && r.current_epoch.is_none()));
    assert!(log.iter().all(|r| r.status == 403 && r.route.as_deref() == Some("/db/{name}/*")));
    let metrics = h.metrics().await;
    for line in [
        "fencer_proxy_rejected_total{reason=\"unsigned_token\"} 1",
        "fencer_proxy_rejected_total{reason=\"bad_signature\"} 3",
        "fencer_proxy_rejected_total{reason=\"unknown_key\"} 1",
    ] {
        assert!(metrics.contains(line), "missing {line:?} in\n{metrics}");
    }

    // Not locked out: the genuine next holder's token is accepted.
    let t151 = genuine.sign("db/a", 151, LID + 1, now_ms()).unwrap();
    assert_eq!(h.write("db/a", t151.as_str()).await.status, Status::OK);
    assert_eq!(h.epoch("db/a").await, 151);
    h.proxy.shutdown().await;
}

/// P7 (and P6): a genuine token signed for resource X is refused on
/// resource Y, which keeps its epoch; on X it is accepted.
#[tokio::test]
async fn t81_a_token_signed_for_x_is_refused_on_y() {
    let s = signer("k1", 1);
    let h = Harness::start(vec![s.public_entry(now_ms() - HOUR, None)], "").await;
    let for_x = s.sign("db/x", FLOOR + 10, LID, now_ms()).unwrap();
    let on_y = h.write("db/y", for_x.as_str()).await;
    assert_refused(&on_y, Status::FORBIDDEN, "wrong-resource");
    assert_eq!(on_y.json()["resource"], "db/y");
    assert_eq!(h.epoch("db/y").await, FLOOR);
    assert!(h.upstream.events().is_empty());
    assert_eq!(h.rejections(1).await[0].reason, RejectReason::WrongResource);

    assert_eq!(h.write("db/x", for_x.as_str()).await.status, Status::OK);
    assert_eq!(h.epoch("db/x").await, FLOOR + 10);
    assert_eq!(h.epoch("db/y").await, FLOOR);
    h.proxy.shutdown().await;
}

/// P7: a token whose key has expired, whose key's window had not opened
/// when it was issued, or whose key id is unknown, is refused and does not
/// move the epoch; a token from a current key does.
#[tokio::test]
async fn t82_expired_not_yet_valid_and_unknown_keys_are_refused() {
    let now = now_ms();
    let (old, future, current) = (signer("k-old", 1), signer("k-future", 2), signer("k-now", 3));
    let h = Harness::start(
        vec![
            old.public_entry(now - 10 * HOUR, Some(now - HOUR)),
            future.public_entry(now + HOUR, None),
            current.public_entry(now - HOUR, None),
        ],
        "clock_skew = \"1s\"\n",
    )
    .await;
    let cases = [
        // Issued while the key was valid, presented after it expired.
        (old.sign("db/a", 200, LID, now - 2 * HOUR).unwrap(), "expired-key", RejectReason::ExpiredKey),
        (future.sign("db/a", 200, LID, now).unwrap(), "key-not-yet-valid", RejectReason::KeyNotYetValid),
        (signer("k-gone", 4).sign("db/a", 200, LID, now).unwrap(), "unknown-key", RejectReason::UnknownKey),
    ];
    for (token, slug, _) in &cases {
        assert_refused(&h.write("db/a", token.as_str()).await, Status::FORBIDDEN, slug);
    }
    assert_eq!(h.epoch("db/a").await, FLOOR);
    assert!(h.upstream.events().is_empty());
    let reasons: Vec<_> = h.rejections(3).await.iter().map(|r| r.reason).collect();
    assert_eq!(reasons, cases.iter().map(|c| c.2).collect::<Vec<_>>());

    let ok = current.sign("db/a", 200, LID, now).unwrap();
    assert_eq!(h.write("db/a", ok.as_str()).await.status, Status::OK);
    assert_eq!(h.epoch("db/a").await, 200);
    h.proxy.shutdown().await;
}

/// P7: with keys configured, unsigned tokens are refused by default
/// (`unsigned_token`) and never reach the upstream; malformed signed tokens
/// are 400 `malformed_token`.
#[tokio::test]
async fn t83_unsigned_tokens_are_refused_when_signing_is_required() {
    let s = signer("k1", 1);
    let h = Harness::start(vec![s.public_entry(now_ms() - HOUR, None)], "").await;
    let plain = h.write("db/a", "150").await;
    assert_refused(&plain, Status::FORBIDDEN, "unsigned-token");
    assert_eq!(plain.json()["presented_token"], serde_json::Value::Null, "no epoch was consulted");
    let garbled = h.write("db/a", "v1.not-base64!.x").await;
    assert_refused(&garbled, Status::BAD_REQUEST, "malformed-token");
    let too_long = h.write("db/a", &format!("v1.{}", "A".repeat(2000))).await;
    assert_refused(&too_long, Status::BAD_REQUEST, "malformed-token");
    assert!(h.upstream.events().is_empty());
    assert_eq!(h.epoch("db/a").await, FLOOR);
    let log = h.rejections(3).await;
    assert_eq!(log[0].reason, RejectReason::UnsignedToken);
    assert_eq!(log[0].presented_token, Some(150));
    assert!(log[0].caller.starts_with("127.0.0.1:"), "{}", log[0].caller);
    assert_eq!(log[1].reason, RejectReason::MalformedToken);
    assert!(h.metrics().await.contains("fencer_proxy_rejected_total{reason=\"unsigned_token\"} 1"));
    h.proxy.shutdown().await;
}

/// P7 migration and the second line of defence: with `require_signed =
/// false`, plain tokens are accepted (capped by `max_epoch_jump`) and
/// signed ones are still verified; a genuine signed token is capped too,
/// so even a leaked key cannot jump an epoch arbitrarily far at once.
#[tokio::test]
async fn t84_migration_mode_verifies_signed_tokens_and_keeps_the_jump_cap() {
    let s = signer("k1", 1);
    let h = Harness::start(vec![s.public_entry(now_ms() - HOUR, None)], "require_signed = false\n").await;
    assert_eq!(h.write("db/a", "150").await.status, Status::OK);
    assert_refused(
        &h.write("db/a", &(150 + 1001).to_string()).await,
        Status::UNPROCESSABLE_ENTITY,
        "token-jump-too-large",
    );
    let forged = signer("k1", 9).sign("db/a", 160, LID, now_ms()).unwrap();
    assert_refused(&h.write("db/a", forged.as_str()).await, Status::FORBIDDEN, "bad-signature");
    let far = s.sign("db/a", 150 + 1001, LID, now_ms()).unwrap();
    assert_refused(&h.write("db/a", far.as_str()).await, Status::UNPROCESSABLE_ENTITY, "token-jump-too-large");
    let near = s.sign("db/a", 160, LID, now_ms()).unwrap();
    assert_eq!(h.write("db/a", near.as_str()).await.status, Status::OK);
    assert_eq!(h.epoch("db/a").await, 160);
    h.proxy.shutdown().await;
}

/// Key rotation through `POST /v1/reload-keys`: a new key is refused until
/// the key set that lists it is reloaded; a broken file is refused and the
/// keys in force stay; the reload is audited.
#[tokio::test]
async fn t85_keys_reload_through_the_admin_api() {
    let (k1, k2) = (signer("k1", 1), signer("k2", 2));
    let h = Harness::start(vec![k1.public_entry(now_ms() - HOUR, None)], "").await;
    let by_k2 = k2.sign("db/a", 150, LID, now_ms()).unwrap();
    assert_refused(&h.write("db/a", by_k2.as_str()).await, Status::FORBIDDEN, "unknown-key");

    write_keys(&h.keys_file, vec![k1.public_entry(now_ms() - HOUR, None), k2.public_entry(now_ms() - HOUR, None)]);
    let loaded = h.admin.reload_keys().await.unwrap();
    assert_eq!(loaded.key_ids, ["k1", "k2"]);
    assert_eq!(h.write("db/a", by_k2.as_str()).await.status, Status::OK);

    std::fs::write(&h.keys_file, "{\"keys\": [").unwrap();
    let err = h.admin.reload_keys().await.unwrap_err().to_string();
    assert!(err.contains("keys.json") && err.contains("not valid"), "{err}");
    let next = k2.sign("db/a", 151, LID, now_ms()).unwrap();
    assert_eq!(h.write("db/a", next.as_str()).await.status, Status::OK, "the previous keys stay in force");
    let audit = std::fs::read_to_string(h._dir.path().join("data").join(fencer_proxy::AUDIT_LOG_FILE)).unwrap();
    assert!(audit.contains("\"op\":\"reload_keys\"") && audit.contains("\"k2\""), "{audit}");
    h.proxy.shutdown().await;
}

/// The binary: `--check-config` loads the key set and names a bad one;
/// SIGHUP reloads the keys of a running `fencer proxy`.
#[tokio::test]
async fn t86_the_binary_checks_keys_and_reloads_them_on_sighup() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = TestUpstream::start().await.unwrap();
    let keys_file = dir.path().join("keys.json");
    let (k1, k2) = (signer("k1", 1), signer("k2", 2));
    write_keys(&keys_file, vec![k1.public_entry(now_ms() - HOUR, None)]);
    let (listen, admin) = (free_addr(), free_addr());
    let config = config(&upstream.url(), &dir.path().join("data"), &format!("[signing]\nkeys_file = {keys_file:?}"))
        .listen(listen)
        .admin(admin)
        .write_to(&dir.path().join("proxy.toml"));

    let check = Command::new(fencer_bin()).args(["proxy", "--check-config", "--config"]).arg(&config).output().unwrap();
    let stdout = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success() && stdout.contains("unsigned refused"), "{stdout}{:?}", check.stderr);
    let broken = dir.path().join("broken.toml");
    std::fs::write(&broken, std::fs::read_to_string(&config).unwrap().replace("keys.json", "missing.json")).unwrap();
    let check = Command::new(fencer_bin()).args(["proxy", "--check-config", "--config"]).arg(&broken).output().unwrap();
    let stderr = String::from_utf8_lossy(&check.stderr);
    assert!(!check.status.success() && stderr.contains("missing.json"), "{stderr}");

    let log = dir.path().join("proxy.log");
    let mut cmd = Command::new(fencer_bin());
    cmd.args(["proxy", "--floor", "100", "--config"]).arg(&config);
    let mut proxy = Proc::spawn("fencer proxy", &mut cmd, &log);
    wait_http(admin, "/livez", 200, &mut proxy, SOON).await;
    let client = TestClient::new();
    let by_k2 = k2.sign("db/a", 150, LID, now_ms()).unwrap();
    let headers = [("fencing-token", by_k2.as_str())];
    let write = || client.send(listen, Method::POST, "/db/a/rows", &headers, "v");
    assert_refused(&write().await.unwrap(), Status::FORBIDDEN, "unknown-key");

    write_keys(&keys_file, vec![k1.public_entry(now_ms() - HOUR, None), k2.public_entry(now_ms() - HOUR, None)]);
    proxy.signal(Signal::HUP);
    let mut status = Status::FORBIDDEN;
    for _ in 0..400 {
        status = write().await.unwrap().status;
        if status == Status::OK {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(status, Status::OK, "SIGHUP did not reload the keys; log:\n{}", std::fs::read_to_string(&log).unwrap());
    assert!(proxy.alive(), "SIGHUP must not stop the proxy");
    proxy.terminate(SOON);
}
