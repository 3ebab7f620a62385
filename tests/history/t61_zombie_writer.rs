//! The zombie writer, end to end with real processes (DESIGN §8, the
//! promise of the whole product):
//!
//! 1. client A (its own process) acquires `res/zombie` with token t1 and
//!    checks that its lease is held, about to write;
//! 2. A is SIGSTOPped (by PID) for longer than its ttl — a GC pause, a
//!    stalled VM — so its lease expires on the cluster;
//! 3. client B (another process) acquires the lock with t2 > t1 and writes
//!    through `fencer proxy`;
//! 4. A is resumed (SIGCONT) and performs the write it had checked for.
//!
//! A gets 409, the database holds B's value only, and the proxy's rejection
//! log (`fencer rejections`) names A's write by its request id. The cluster
//! is three `fencer coordinator` processes, the proxy is `fencer proxy`,
//! A and B are this test binary started again as small client processes
//! (`zombie_client_process`, driven over stdin/stdout).
//!
//! Run against the in-process recording test upstream always, and against a
//! real InfluxDB 1.x when `influxd` is installed (loud SKIPPED otherwise).

use std::io::{BufRead, BufReader, Write};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

use crate::workload::proxy::{ProxyProc, Routes};
use crate::workload::upstream::InfluxRecorder;
use fencer_proxy::testing::{Method, TestClient, TestUpstream};
use fencer_testkit::{Proc, ProcCluster, Signal, run, signal};
use serde_json::{Value, json};

/// Lease ttl of both clients.
const TTL: Duration = Duration::from_millis(1500);
/// Generous bound for one step on a loaded machine.
const SOON: Duration = Duration::from_secs(30);
/// Prefix of the protocol lines a client process prints.
const TAG: &str = "ZOMBIE-CLIENT ";

/// A client process: this test binary running `zombie_client_process`
/// (its stderr is the test's; killed by PID when dropped).
struct ClientProc {
    name: &'static str,
    proc: Proc,
    stdin: ChildStdin,
    lines: Receiver<String>,
}

impl ClientProc {
    /// Starts client `name`, which acquires `resource` (waiting up to
    /// `wait`) and writes to `path` with `body` (`{value}` replaced).
    fn start(
        name: &'static str,
        endpoints: &str,
        resource: &str,
        wait: Duration,
        proxy: &str,
        path: &str,
        body: &str,
    ) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "t61_zombie_writer::zombie_client_process",
                "--ignored",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env("FENCER_ZOMBIE_CHILD", name)
            .env("FENCER_ZOMBIE_ENDPOINTS", endpoints)
            .env("FENCER_ZOMBIE_RESOURCE", resource)
            .env("FENCER_ZOMBIE_TTL_MS", TTL.as_millis().to_string())
            .env("FENCER_ZOMBIE_WAIT_MS", wait.as_millis().to_string())
            .env("FENCER_ZOMBIE_PROXY", proxy)
            .env("FENCER_ZOMBIE_PATH", path)
            .env("FENCER_ZOMBIE_BODY", body)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start a client process");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                // libtest may have printed on the same line first.
                if let Some(at) = line.find(TAG)
                    && tx.send(line[at + TAG.len()..].to_string()).is_err()
                {
                    break;
                }
            }
        });
        let proc = Proc::adopt(&format!("client {name}"), child, std::path::Path::new("/dev/null"));
        Self { name, proc, stdin, lines }
    }

    fn pid(&self) -> u32 {
        self.proc.pid()
    }

    fn send(&mut self, command: &str) {
        writeln!(self.stdin, "{command}").expect("the client process reads its stdin");
    }

    /// The next protocol message (`WORD {json}`), within `SOON`.
    async fn expect(&mut self, word: &str) -> Value {
        let lines = &self.lines;
        let msg = tokio::task::block_in_place(|| lines.recv_timeout(SOON))
            .unwrap_or_else(|_| panic!("client {} said nothing within {SOON:?} (waiting for {word})", self.name));
        let (w, rest) = msg.split_once(' ').unwrap_or((&msg, "null"));
        assert_eq!(w, word, "client {}: {msg}", self.name);
        serde_json::from_str(rest).unwrap()
    }
}

/// Where the writes go and how to read back what the database holds.
enum Database {
    Recording(TestUpstream),
    Influx(InfluxRecorder),
}

/// The scenario; `db` is behind the proxy.
async fn zombie_scenario(db: Database, dir: &std::path::Path) {
    let (upstream_url, routes, path, body) = match &db {
        Database::Recording(u) => (u.url(), Routes::Paths, "/w/zombie", "value={value}"),
        // Straight to influxd: nothing between the proxy and the database.
        Database::Influx(r) => (
            format!("http://{}", r.influx),
            Routes::Influx,
            "/write?db=zombie&precision=s",
            "balance,account=alice value={value} 1700000000",
        ),
    };
    let resource = "res/zombie";
    let proxy = ProxyProc::start(dir.join("proxy"), &upstream_url, routes).await;
    let cluster = ProcCluster::start(3).await;
    let endpoints = cluster.endpoints();
    let proxy_addr = proxy.listen.to_string();

    // 1. A holds the lock and has checked its lease, about to write.
    let mut a = ClientProc::start("A", &endpoints, resource, Duration::ZERO, &proxy_addr, path, body);
    let t1 = a.expect("GRANTED").await["token"].as_u64().unwrap();
    a.send("check-then-write 1");
    assert_eq!(a.expect("CHECKED").await["held"], true, "A's lease is held before the pause");

    // 2. A stops (SIGSTOP by PID) with the write pending.
    signal(a.pid(), Signal::STOP);

    // 3. B waits for the lock, gets it once A's lease expired, and writes.
    let mut b = ClientProc::start("B", &endpoints, resource, SOON, &proxy_addr, path, body);
    let t2 = b.expect("GRANTED").await["token"].as_u64().unwrap();
    assert!(t2 > t1, "B's token {t2} must be above A's {t1}");
    b.send("write 2");
    let wrote = b.expect("WROTE").await;
    assert!(wrote["status"].as_u64().is_some_and(|s| (200..300).contains(&s)), "B's write: {wrote}");

    // 4. A resumes and writes with t1: fenced.
    signal(a.pid(), Signal::CONT);
    a.send("go");
    let zombie = a.expect("WROTE").await;
    assert_eq!(zombie["status"], 409, "A's write after the pause: {zombie}");
    assert_eq!(zombie["body"]["presented_token"], t1, "{zombie}");
    assert_eq!(zombie["body"]["current_epoch"], t2, "{zombie}");
    assert_eq!(zombie["body"]["resource"], resource, "{zombie}");
    // A's own client library knows it lost the lock (too late to stop the
    // write it had already decided on: that is what the proxy is for).
    a.send("state");
    let state = a.expect("STATE").await;
    assert!(state["state"].as_str().is_some_and(|s| s.starts_with("Lost")), "A after the pause: {state}");

    // The database holds B's value only.
    match &db {
        Database::Recording(u) => {
            assert!(!u.has_arrived(t1), "A's write reached the database: {:?}", u.events());
            assert_eq!(u.bodies(t2), ["value=2"], "the database holds B's write only: {:?}", u.events());
        }
        Database::Influx(r) => {
            let q = TestClient::new()
                .send(r.influx, Method::GET, "/query?db=zombie&q=SELECT+value+FROM+balance", &[], "")
                .await
                .unwrap();
            let values = &q.json()["results"][0]["series"][0]["values"];
            assert_eq!(values.as_array().map(Vec::len), Some(1), "{}", q.json());
            assert_eq!(values[0][1], 2, "InfluxDB holds B's value: {}", q.json());
        }
    }

    // The rejection log names A's write.
    let admin = proxy.admin.to_string();
    let mut named = None;
    for _ in 0..100 {
        let out = run(&["rejections", "--admin", &admin, "-o", "json"]);
        assert_eq!(out.0, 0, "fencer rejections: {}", out.2);
        let page: Value = serde_json::from_str(&out.1).unwrap();
        named = page["rejections"]
            .as_array()
            .and_then(|a| a.iter().find(|r| r["request_id"] == "zombie-A-write-1").cloned());
        if named.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let named = named.expect("the rejection log names A's write");
    assert_eq!(named["reason"], "stale_token", "{named}");
    assert_eq!(named["resource"], resource, "{named}");
    assert_eq!(named["presented_token"], t1, "{named}");
    assert_eq!(named["current_epoch"], t2, "{named}");
    assert_eq!(named["method"], "POST", "{named}");

    eprintln!(
        "zombie writer: A (token {t1}) was paused past its ttl; B (token {t2}) wrote; A's late write got 409; \
         rejection log: {named}"
    );
    b.send("release");
    b.expect("RELEASED").await;
    drop(cluster);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t61_zombie_writer_is_fenced_by_the_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = TestUpstream::start().await.unwrap();
    zombie_scenario(Database::Recording(upstream), dir.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t61_zombie_writer_is_fenced_in_front_of_influxdb() {
    if !fencer_testkit::influxdb::installed("t61_zombie_writer_is_fenced_in_front_of_influxdb") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let influx = InfluxRecorder::start(dir.path(), &["zombie".to_string()]).await;
    zombie_scenario(Database::Influx(influx), dir.path()).await;
}

// ---- the client process --------------------------------------------------

fn say(word: &str, value: Value) {
    println!("{TAG}{word} {value}");
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is set by the parent test"))
}

/// Not a test: the client process the zombie tests start (this binary with
/// `FENCER_ZOMBIE_CHILD` set). It acquires a lease that renews itself,
/// prints `GRANTED`, then obeys stdin, one command a line:
/// `check-then-write V` (check the lease, print `CHECKED`, wait for `go`,
/// then write V with the token it checked), `write V`, `state`, `release`.
#[tokio::test]
#[ignore = "helper process of the t61 tests; does nothing unless FENCER_ZOMBIE_CHILD is set"]
async fn zombie_client_process() {
    use tokio::io::AsyncBufReadExt;
    let Ok(name) = std::env::var("FENCER_ZOMBIE_CHILD") else { return };
    let endpoints = env("FENCER_ZOMBIE_ENDPOINTS");
    let client = fencer_client::Client::new(endpoints.split(',')).unwrap();
    let ms = |v: &str| Duration::from_millis(env(v).parse().unwrap());
    let lease = client
        .acquire(env("FENCER_ZOMBIE_RESOURCE"))
        .ttl(ms("FENCER_ZOMBIE_TTL_MS"))
        .wait(ms("FENCER_ZOMBIE_WAIT_MS"))
        .holder(format!("zombie-test-{name}"))
        .await
        .expect("the client process acquires its lock");
    say("GRANTED", json!({ "token": lease.token().get(), "lease_id": lease.lease_id().to_string() }));
    let proxy: std::net::SocketAddr = env("FENCER_ZOMBIE_PROXY").parse().unwrap();
    let (path, body) = (env("FENCER_ZOMBIE_PATH"), env("FENCER_ZOMBIE_BODY"));
    let http = TestClient::new();
    let write = |token: u64, value: String| {
        let (http, path) = (http.clone(), path.clone());
        let body = body.replace("{value}", &value);
        let (t, id) = (token.to_string(), format!("zombie-{name}-write-{value}"));
        async move {
            let r = http.send(proxy, Method::POST, &path, &[("fencing-token", &t), ("x-request-id", &id)], body).await;
            let r = r.expect("the proxy answers");
            say("WROTE", json!({ "status": r.status.as_u16(), "body": r.json() }));
        }
    };
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    // Bounded: the parent sends a handful of commands, then stops it.
    for _ in 0..100 {
        let Ok(Some(line)) = lines.next_line().await else { return };
        let (command, arg) = line.split_once(' ').unwrap_or((line.as_str(), ""));
        match command {
            "check-then-write" => {
                // The check a careful client makes before each write…
                let token = lease.token().get();
                say("CHECKED", json!({ "held": lease.is_held(), "token": token }));
                // …then the pause hits between the check and the write.
                if lines.next_line().await.ok().flatten().as_deref() != Some("go") {
                    return;
                }
                write(token, arg.to_string()).await;
            }
            "write" => write(lease.token().get(), arg.to_string()).await,
            "state" => say("STATE", json!({ "state": format!("{:?}", lease.check()) })),
            "release" => {
                let r = lease.release().await;
                say("RELEASED", json!({ "ok": r.is_ok() }));
                return;
            }
            _ => return,
        }
    }
}
