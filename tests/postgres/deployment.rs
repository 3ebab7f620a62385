//! How the sidecar is deployed: signed tokens only (P7 with `[signing]`),
//! a unix-socket upstream and one resource per database (G10), the flag
//! form and `--check-config` of the `fencer` binary.

use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fencer_proxy::ProxyConfig;
use fencer_token::{KeyId, KeySet, Signer};

use crate::fixture::{connect, require_postgres, sidecar, sidecar_config};
use crate::{SOON, expect_code};

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// P7 through `SET fencer.token`: with `[signing]` only a token the
/// coordinator's key signed for this resource is taken (a quoted string);
/// a plain number, an altered token and one signed for another resource are
/// refused with FN002, each with its own reason in the rejection log, and
/// none moves the epoch.
#[tokio::test]
async fn t48_only_signed_tokens_with_signing_keys() {
    let Some(pg) = require_postgres("t48_only_signed_tokens_with_signing_keys") else { return };
    let su = pg.setup().await;
    let dir = tempfile::tempdir().unwrap();
    let signer = Signer::from_secret_bytes(KeyId::new("k1").unwrap(), &[9; 32]);
    let keys = dir.path().join("keys.json");
    KeySet { keys: vec![signer.public_entry(now_ms() - 3_600_000, Some(now_ms() + 3_600_000))] }.write(&keys).unwrap();
    let signing = format!("[signing]\nkeys_file = \"{}\"\n", keys.display());
    let proxy = sidecar(&pg, dir.path(), "", &signing).await;
    let c = connect(proxy.local_addr(), "app", None).await.unwrap();
    let sign = |resource: &str, token: u64| signer.sign(resource, token, 7, now_ms() - 1000).unwrap().into_string();

    let genuine = sign("pg/postgres", 50);
    c.batch_execute(&format!("SET fencer.token = '{genuine}'")).await.unwrap();
    c.batch_execute("INSERT INTO fenced (writer, token) VALUES ('signed', 50)").await.unwrap();

    let mut altered = sign("pg/postgres", 999_999).into_bytes();
    let last = altered.len() - 2;
    altered[last] = if altered[last] == b'A' { b'B' } else { b'A' };
    let altered = String::from_utf8(altered).unwrap();
    let cases = [
        ("SET fencer.token = 999999".to_owned(), "unsigned_token"),
        (format!("SET fencer.token = '{altered}'"), "bad_signature"),
        (format!("SET fencer.token = '{}'", sign("pg/other", 999_999)), "wrong_resource"),
    ];
    for (sql, _) in &cases {
        expect_code(c.batch_execute(sql).await, "FN002");
    }
    // The connection kept its genuine token.
    c.batch_execute("INSERT INTO fenced (writer, token) VALUES ('signed', 50)").await.unwrap();
    let admin = fencer_proxy::AdminClient::new(&proxy.admin_addr().to_string(), SOON).unwrap();
    assert_eq!(admin.resource("pg/postgres").await.unwrap().epoch, 50, "a refused token moved the epoch");
    let logged = fencer_testkit::eventually("three rejections logged", SOON, || async {
        let page = admin.rejections(None, 10).await.ok()?;
        (page.rejections.len() >= 3).then_some(page.rejections)
    })
    .await;
    let mut reasons: Vec<&str> = logged.iter().take(3).map(|r| r.reason.as_str()).collect();
    reasons.sort_unstable();
    assert_eq!(reasons, ["bad_signature", "unsigned_token", "wrong_resource"]);
    assert_eq!(pg.rows(&su).await.len(), 2);
    proxy.shutdown().await;
}

/// G10 and a unix-socket upstream: with `resource = "pg/{database}"` each
/// database is its own resource (a token for one never fences the other),
/// reached here over PostgreSQL's unix socket.
#[tokio::test]
async fn t49_one_resource_per_database_over_a_unix_socket() {
    let Some(pg) = require_postgres("t49_one_resource_per_database_over_a_unix_socket") else { return };
    let su = pg.setup().await;
    su.batch_execute("CREATE DATABASE shop OWNER app").await.unwrap();
    let shop_admin = {
        let mut config = tokio_postgres::Config::new();
        config.host("127.0.0.1").port(pg.port()).user("app").dbname("shop");
        let (client, conn) = config.connect(tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        client
    };
    shop_admin.batch_execute("CREATE TABLE orders (id int)").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let text = sidecar_config(&pg, &dir.path().join("data"), "", "", "127.0.0.1:0".parse().unwrap())
        .replace(&format!("upstream = \"{}\"", pg.addr()), &format!("upstream = \"{}\"", pg.socket().display()));
    assert!(text.contains(".s.PGSQL."), "{text}");
    let proxy = fencer_proxy::start(ProxyConfig::from_toml_str(&text).unwrap(), Some(1)).await.unwrap();
    let addr = proxy.local_addr();

    let to_db = |db: &'static str| async move {
        let mut config = tokio_postgres::Config::new();
        config.host("127.0.0.1").port(addr.port()).user("app").dbname(db).connect_timeout(Duration::from_secs(10));
        let (client, conn) = config.connect(tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        client
    };
    let postgres_db = to_db("postgres").await;
    let shop = to_db("shop").await;
    postgres_db
        .batch_execute("SET fencer.token = 100; INSERT INTO fenced (writer, token) VALUES ('p', 100)")
        .await
        .unwrap();
    // A lower token on the other database's resource is fine.
    shop.batch_execute("SET fencer.token = 10; INSERT INTO orders VALUES (1)").await.unwrap();
    expect_code(shop.batch_execute("SET fencer.resource = 'pg/postgres'").await, "FN006");
    shop.batch_execute("SET fencer.resource = 'pg/shop'").await.unwrap();
    let admin = fencer_proxy::AdminClient::new(&proxy.admin_addr().to_string(), SOON).unwrap();
    assert_eq!(admin.resource("pg/postgres").await.unwrap().epoch, 100);
    assert_eq!(admin.resource("pg/shop").await.unwrap().epoch, 10);
    // The unix socket path really was used: PostgreSQL saw a local client.
    let local: i64 = su
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = 'shop' AND client_addr IS NULL AND usename = 'app'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(local >= 1, "the sidecar did not connect over the unix socket");
    proxy.shutdown().await;
}

/// The `fencer` binary: `--protocol postgres` with flags, and
/// `--check-config` of a full file, which names a bad line.
#[tokio::test]
async fn t50_the_binary_flag_form_and_check_config() {
    let Some(pg) = require_postgres("t50_the_binary_flag_form_and_check_config") else { return };
    let _su = pg.setup().await;
    let dir = tempfile::tempdir().unwrap();
    let fencer = fencer_testkit::fencer_bin();
    let config = dir.path().join("proxy.toml");
    std::fs::write(
        &config,
        sidecar_config(&pg, &dir.path().join("data"), "drain_timeout = \"2s\"", "", fencer_testkit::free_addr()),
    )
    .unwrap();
    let check = || async {
        tokio::process::Command::new(fencer)
            .args(["proxy", "--check-config", "--config"])
            .arg(&config)
            .output()
            .await
            .unwrap()
    };
    let out = check().await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        stdout.contains("PostgreSQL sidecar")
            && stdout.contains("pg/{database}")
            && stdout.contains("drain_timeout 2s"),
        "{stdout}"
    );
    std::fs::write(
        &config,
        std::fs::read_to_string(&config).unwrap().replace("drain_timeout = \"2s\"", "drain_timeout = \"soon\""),
    )
    .unwrap();
    let out = check().await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("line") && stderr.contains("soon"), "{stderr}");

    let listen = fencer_testkit::free_addr();
    let admin = fencer_testkit::free_addr();
    let log = dir.path().join("proxy.log");
    let mut child = fencer_testkit::Proc::spawn(
        "fencer proxy --protocol postgres",
        std::process::Command::new(fencer)
            .args([
                "proxy",
                "--protocol",
                "postgres",
                "--listen",
                &listen.to_string(),
                "--upstream",
                &pg.addr().to_string(),
            ])
            .args(["--resource", "pg/app", "--data-dir"])
            .arg(dir.path().join("flags"))
            .args(["--admin", &admin.to_string(), "--floor", "1"])
            .stdin(Stdio::null()),
        &log,
    );
    let c =
        fencer_testkit::eventually("the sidecar accepts", SOON, || async { connect(listen, "app", None).await.ok() })
            .await;
    c.batch_execute("SET fencer.token = 7; INSERT INTO fenced (writer, token) VALUES ('flags', 7)").await.unwrap();
    let (code, status) =
        fencer_testkit::run_json(&["proxy-status", "pg/app", "--admin", &admin.to_string(), "-o", "json"]);
    assert_eq!((code, &status["resources"][0]["epoch"]), (0, &serde_json::json!(7)), "{status}");
    child.kill9();
}
