//! End to end against a real InfluxDB 1.x (DESIGN §8, the zombie writer):
//! B's write with token 42 lands through `fencer proxy`; A's later write
//! with token 41 gets 409; InfluxDB still returns B's value; the rejection
//! log (through `fencer rejections`) names A's write. A write hidden in a
//! `GET /query` needs a token too (P5).
//!
//! The test starts the kit's throwaway `influxd` (free loopback ports, a
//! temporary directory, stopped by PID). Without `influxd` (Debian package
//! `influxdb`) it prints a loud skip message and returns.

use std::process::Command;
use std::time::Duration;

use fencer_proxy::testing::{Method, Status, TestClient};
use fencer_testkit::influxdb::{self, Influxd};
use fencer_testkit::{Proc, ProxyConfigBuilder, fencer_bin, free_addr, run_fencer, wait_http};

const SOON: Duration = Duration::from_secs(60);
const DB: &str = "fencer_e2e";

#[tokio::test]
async fn t90_influxdb_zombie_writer_is_fenced() {
    if !influxdb::installed("t90_influxdb_zombie_writer_is_fenced") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let mut influxd = Influxd::start(root).await;
    let influx_http = influxd.http;

    influxd.create_database(DB).await;
    let client = TestClient::new();

    // The sidecar: reads allow-listed explicitly, everything else a write.
    let (listen, admin) = (free_addr(), free_addr());
    let proxy_conf = ProxyConfigBuilder::new(&format!("http://{influx_http}"), root.join("proxy"))
        .listen(listen)
        .admin(admin)
        .read(&["GET", "HEAD"], "/ping")
        .write_if(&["POST"], "/write", ("db", "{db}"), "influx/{db}")
        .write_if(&[], "/query", ("db", "{db}"), "influx/{db}")
        .write_to(&root.join("proxy.toml"));
    let proxy_log = root.join("proxy.log");
    let mut cmd = Command::new(fencer_bin());
    cmd.args(["proxy", "--config"]).arg(&proxy_conf).args(["--floor", "1"]);
    let mut proxy = Proc::spawn("fencer proxy", &mut cmd, &proxy_log);
    wait_http(admin, "/readyz", 200, &mut proxy, SOON).await;

    let write = |token: u64, value: u64| {
        let client = client.clone();
        async move {
            let t = token.to_string();
            client
                .send(
                    listen,
                    Method::POST,
                    &format!("/write?db={DB}&precision=s"),
                    &[("fencing-token", &t)],
                    format!("balance,account=alice value={value} 1700000000"),
                )
                .await
                .unwrap()
        }
    };
    // B holds the lock now (token 42) and writes.
    let b = write(42, 42).await;
    assert_eq!(b.status, Status::NO_CONTENT, "B's write: {:?}", b.body);
    // A was paused past its lease (token 41) and wakes up: fenced.
    let a = write(41, 41).await;
    assert_eq!(a.status, Status::CONFLICT, "A's write: {:?}", a.body);
    assert_eq!(a.json()["resource"], format!("influx/{DB}"));
    assert_eq!(a.json()["current_epoch"], 42);

    // P5: a write hidden in a GET needs a token.
    let hidden =
        client.send(listen, Method::GET, &format!("/query?db={DB}&q=DROP+DATABASE+{DB}"), &[], "").await.unwrap();
    assert_eq!(hidden.status, Status::PRECONDITION_REQUIRED);

    // InfluxDB (asked directly) still has B's value, and the database.
    let q = client
        .send(influx_http, Method::GET, &format!("/query?db={DB}&q=SELECT+value+FROM+balance"), &[], "")
        .await
        .unwrap();
    assert_eq!(q.status, Status::OK);
    let values = &q.json()["results"][0]["series"][0]["values"];
    assert_eq!(values.as_array().map(Vec::len), Some(1), "{}", q.json());
    assert_eq!(values[0][1], 42, "{}", q.json());

    // The rejection log names A's write.
    let admin_s = admin.to_string();
    let mut stale = None;
    for _ in 0..100 {
        let out = run_fencer(&["rejections", "--admin", &admin_s, "-o", "json"], SOON);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let page: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        stale = page["rejections"].as_array().and_then(|a| a.iter().find(|r| r["reason"] == "stale_token").cloned());
        if stale.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stale = stale.expect("A's write is in the rejection log");
    assert_eq!(stale["resource"], format!("influx/{DB}"));
    assert_eq!(stale["presented_token"], 41);
    assert_eq!(stale["current_epoch"], 42);
    assert_eq!(stale["method"], "POST");
    assert_eq!(stale["route"], "/write");

    assert!(proxy.terminate(SOON).is_some_and(|s| s.success()), "proxy stops cleanly on SIGTERM");
    influxd.proc().terminate(SOON);
}
