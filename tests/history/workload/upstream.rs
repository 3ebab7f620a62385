//! The upstreams behind the proxy, each recording the order in which writes
//! reached it and were applied (I3 is checked against that record):
//! - [`TestUpstream`] (`fencer_proxy::testing`), in process;
//! - a real InfluxDB 1.x (the kit's throwaway `influxd`) behind an
//!   in-process recording relay that notes each write's arrival and, once
//!   InfluxDB answered 2xx, its application;
//! - a real PostgreSQL (the kit's throwaway server) behind the PostgreSQL
//!   sidecar: one database per resource, each with a `writes` table; what
//!   was applied, and in which order, is read from PostgreSQL itself after
//!   the run, in commit order (`track_commit_timestamp`).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use fencer_proxy::testing::{Method, TestClient, TestUpstream, UpstreamEvent as TestEvent};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};

use fencer_testkit::history::UpstreamEvent;
use fencer_testkit::influxdb::Influxd;

pub enum Recording {
    Test(TestUpstream),
    Influx(InfluxRecorder),
    Postgres(PgRecorder),
}

impl Recording {
    pub fn url(&self) -> String {
        match self {
            Recording::Test(u) => u.url(),
            Recording::Influx(r) => format!("http://{}", r.addr),
            Recording::Postgres(r) => r.pg.addr().to_string(),
        }
    }

    /// The record, in order, with each applied write named by its body
    /// (the test upstream) or its `X-Request-Id` (the InfluxDB relay).
    pub async fn events(&self) -> Vec<UpstreamEvent> {
        match self {
            Recording::Test(u) => {
                let mut taken: BTreeMap<u64, usize> = BTreeMap::new();
                let mut bodies: BTreeMap<u64, Vec<Bytes>> = BTreeMap::new();
                let mut out = Vec::new();
                for e in u.events() {
                    match e {
                        TestEvent::Arrived(Some(token)) => out.push(UpstreamEvent::Arrived { token, resource: None }),
                        TestEvent::Applied(Some(token)) => {
                            let all = bodies.entry(token).or_insert_with(|| u.bodies(token));
                            let k = taken.entry(token).or_default();
                            let write_id = all.get(*k).map(|b| String::from_utf8_lossy(b).into_owned());
                            *k += 1;
                            out.push(UpstreamEvent::Applied { token, resource: None, write_id });
                        }
                        _ => {}
                    }
                }
                out
            }
            Recording::Influx(r) => r.events.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            Recording::Postgres(r) => r.applied().await,
        }
    }
}

/// A real PostgreSQL with one database per resource (`h0`, `c3`, …, the
/// resource `res/{database}`), each with
/// `writes (seq, token, write_id)`; commit timestamps are tracked.
pub struct PgRecorder {
    pub pg: fencer_testkit::postgres::TestPostgres,
    pub databases: Vec<String>,
    /// The admin role's password, for the sidecar's `[postgres.admin]`.
    pub admin_password_file: std::path::PathBuf,
}

impl PgRecorder {
    pub async fn start(dir: &Path, databases: &[String]) -> Self {
        let bin = fencer_testkit::postgres::installed("the PostgreSQL history run").expect("PostgreSQL is installed");
        let pg = fencer_testkit::postgres::TestPostgres::start(bin);
        let su = pg.setup().await;
        for db in databases {
            su.batch_execute(&format!("CREATE DATABASE {db} OWNER app")).await.unwrap();
            let mut config = tokio_postgres::Config::new();
            config.host("127.0.0.1").port(pg.port()).user("app").dbname(db);
            let (client, conn) = config.connect(tokio_postgres::NoTls).await.unwrap();
            let task = tokio::spawn(conn);
            client
                .batch_execute(
                    "CREATE TABLE writes (seq bigserial PRIMARY KEY, token bigint NOT NULL, write_id text NOT NULL)",
                )
                .await
                .unwrap();
            drop(client);
            let _ = task.await;
        }
        let admin_password_file = dir.join("pg-admin-password");
        std::fs::write(&admin_password_file, fencer_testkit::postgres::SCRAM_PASSWORD).unwrap();
        Self { pg, databases: databases.to_vec(), admin_password_file }
    }

    /// Every committed write, per resource in commit order. PostgreSQL keeps
    /// no record of statements it refused or rolled back, so a write
    /// "reaches" it (I3's arrival) when it commits: each row is an arrival
    /// and an application, at its commit.
    async fn applied(&self) -> Vec<UpstreamEvent> {
        let mut out = Vec::new();
        for db in &self.databases {
            let mut config = tokio_postgres::Config::new();
            config.host("127.0.0.1").port(self.pg.port()).user("postgres").dbname(db);
            let (client, conn) = config.connect(tokio_postgres::NoTls).await.unwrap();
            tokio::spawn(conn);
            let rows = client
                .query("SELECT token, write_id FROM writes ORDER BY pg_xact_commit_timestamp(xmin), seq", &[])
                .await
                .unwrap();
            for r in rows {
                let token = u64::try_from(r.get::<_, i64>(0)).unwrap_or_default();
                let resource = Some(format!("res/{db}"));
                out.push(UpstreamEvent::Arrived { token, resource: resource.clone() });
                out.push(UpstreamEvent::Applied { token, resource, write_id: Some(r.get(1)) });
            }
        }
        out
    }
}

/// A recording relay in front of a real `influxd`.
pub struct InfluxRecorder {
    pub addr: SocketAddr,
    /// influxd's own HTTP address (for queries that bypass the proxy).
    pub influx: SocketAddr,
    events: Arc<Mutex<Vec<UpstreamEvent>>>,
    _influxd: Influxd,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for InfluxRecorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn header<'a>(h: &'a http::HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

impl InfluxRecorder {
    /// Starts `influxd` under `dir`, creates the databases, and the relay.
    /// Check [`fencer_testkit::influxdb::installed`] first.
    pub async fn start(dir: &Path, databases: &[String]) -> Self {
        let influxd = Influxd::start(dir).await;
        for db in databases {
            influxd.create_database(db).await;
        }
        let influx = influxd.http;

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let events: Arc<Mutex<Vec<UpstreamEvent>>> = Arc::default();
        let forward: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
        let ev = events.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (ev, forward) = (ev.clone(), forward.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let (ev, forward) = (ev.clone(), forward.clone());
                        async move { Ok::<_, Infallible>(relay(ev, forward, influx, req).await) }
                    });
                    let _ =
                        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
                });
            }
        });
        Self { addr, influx, events, _influxd: influxd, task }
    }

    /// Every point of measurement `w` in `db`: (writer, token).
    pub async fn points(&self, db: &str) -> Vec<(String, u64)> {
        let r = TestClient::new()
            .send(self.influx, Method::GET, &format!("/query?db={db}&q=SELECT+token,writer+FROM+w"), &[], "")
            .await
            .expect("query influxd");
        let json = r.json();
        let mut out = Vec::new();
        for row in json["results"][0]["series"][0]["values"].as_array().into_iter().flatten() {
            let token = row[1].as_u64().unwrap_or_default();
            let writer = row[2].as_str().unwrap_or_default().to_string();
            out.push((writer, token));
        }
        out
    }
}

async fn relay(
    events: Arc<Mutex<Vec<UpstreamEvent>>>,
    forward: Client<HttpConnector, Full<Bytes>>,
    influx: SocketAddr,
    req: http::Request<hyper::body::Incoming>,
) -> http::Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    let token = header(&parts.headers, "fencing-token").and_then(|t| t.parse::<u64>().ok());
    let write_id = header(&parts.headers, "x-request-id").map(str::to_string);
    let resource = parts
        .uri
        .query()
        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("db=")))
        .map(|db| format!("res/{db}"));
    let record = |e: UpstreamEvent| events.lock().unwrap_or_else(|p| p.into_inner()).push(e);
    if let Some(token) = token {
        record(UpstreamEvent::Arrived { token, resource: resource.clone() });
    }
    // A body cut short (the proxy was killed mid-request) is not forwarded:
    // forwarding what arrived would apply a write nobody sent.
    let Ok(body) = body.collect().await.map(|b| b.to_bytes()) else {
        let mut r = http::Response::new(Full::new(Bytes::from_static(b"relay: request body cut short")));
        *r.status_mut() = http::StatusCode::BAD_REQUEST;
        return r;
    };
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut out = http::Request::builder().method(parts.method.clone()).uri(format!("http://{influx}{path}"));
    for (k, v) in &parts.headers {
        if k != http::header::HOST {
            out = out.header(k, v);
        }
    }
    let request = out.body(Full::new(body)).unwrap();
    // Forwarded and recorded in a task of its own: when the proxy is killed
    // while InfluxDB applies a write, hyper drops this handler's future with
    // the connection, and the write InfluxDB applied must still be recorded.
    let call = tokio::spawn(async move {
        match forward.request(request).await {
            Ok(resp) => {
                let (p, b) = resp.into_parts();
                let b = b.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                if p.status.is_success()
                    && let Some(token) = token
                {
                    events.lock().unwrap_or_else(|p| p.into_inner()).push(UpstreamEvent::Applied {
                        token,
                        resource,
                        write_id,
                    });
                }
                http::Response::from_parts(p, Full::new(b))
            }
            Err(e) => {
                let mut r = http::Response::new(Full::new(Bytes::from(format!("relay: influxd: {e}"))));
                *r.status_mut() = http::StatusCode::BAD_GATEWAY;
                r
            }
        }
    });
    call.await.unwrap_or_else(|e| {
        let mut r = http::Response::new(Full::new(Bytes::from(format!("relay: {e}"))));
        *r.status_mut() = http::StatusCode::BAD_GATEWAY;
        r
    })
}
