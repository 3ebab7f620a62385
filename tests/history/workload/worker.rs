//! One workload client: a task sharing a `fencer_client::Client` (its
//! connections and their batching) with a few other workers. It
//! acquires a resource, mostly from the hot set (sometimes waiting), writes through
//! the proxy with its token, renews, releases (sometimes twice), and now and
//! then stops renewing for longer than its ttl — the task's stand-in for a
//! SIGSTOPped process — and then writes and releases with its old lease as
//! a zombie would. Every call is recorded with its send and answer time.

use std::sync::Arc;
use std::time::Duration;

use fencer_client::Client;
use fencer_proxy::testing::{Method, Status};
use fencer_testkit::grpc::client_answer;
use fencer_testkit::history::{Answer, Call, Op};

use super::proxy::Routes;
use super::{Ctx, Rng};

/// Acquire attempts per request id while the outcome stays unknown.
const ACQUIRE_ATTEMPTS: usize = 4;

struct Worker {
    ctx: Arc<Ctx>,
    name: String,
    client: Client,
    rng: Rng,
    writes: u64,
    /// The round's connection through the PostgreSQL sidecar, its token
    /// declared.
    pg: Option<tokio_postgres::Client>,
}

pub async fn run(ctx: Arc<Ctx>, w: usize) {
    let client = ctx.clients[w / super::WORKERS_PER_CLIENT].clone();
    let rng = Rng::new(ctx.config.seed ^ (w as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut me = Worker { ctx, name: format!("w{w:02}"), client, rng, writes: 0, pg: None };
    for round in 0..me.ctx.config.max_rounds_per_worker {
        if me.ctx.stopping() {
            break;
        }
        me.round(w, round).await;
    }
}

impl Worker {
    fn record(&self, call: Call, sent: Duration, answer: Answer) -> Answer {
        let h = &self.ctx.history;
        h.record(Op { client: self.name.clone(), call, sent, answered: h.now(), answer: answer.clone() });
        answer
    }

    async fn round(&mut self, w: usize, round: usize) {
        let ctx = self.ctx.clone();
        let cfg = &ctx.config;
        // Mostly the contended hot set; sometimes a cold resource, which is
        // usually free: a grant there needs no one to let go first.
        let resource = if self.rng.chance(cfg.cold_probability) {
            format!("res/c{}", self.rng.below(cfg.cold_resources as u64))
        } else {
            format!("res/h{}", self.rng.below(cfg.resources as u64))
        };
        let request_id = format!("hist-{}-w{w:02}-{round:06}", cfg.run_id);
        let wait = if self.rng.chance(0.5) { Duration::ZERO } else { Duration::from_millis(self.rng.range(200, 1500)) };
        let Some((lease_id, token)) = self.acquire(&resource, &request_id, wait).await else {
            tokio::time::sleep(Duration::from_millis(self.rng.range(20, 120))).await;
            return;
        };
        let ttl = cfg.ttl;
        if self.ctx.routes == Routes::Postgres {
            self.pg = self.declare(&resource, token).await;
        }
        for _ in 0..self.rng.range(1, 5) {
            self.write(&resource, token).await;
            if self.ctx.take_pause(w) || self.rng.chance(cfg.pause_probability) {
                let pause = ttl + Duration::from_millis(self.rng.range(300, 1200));
                // Through PostgreSQL, half the zombies pause inside an open
                // transaction: the sidecar must end it (G5).
                let in_transaction = self.ctx.routes == Routes::Postgres && self.rng.chance(0.5);
                self.ctx.fault(format!(
                    "client {} stops renewing for {pause:?} holding {resource} token {token}{}",
                    self.name,
                    if in_transaction { " inside a transaction" } else { "" }
                ));
                if in_transaction {
                    // The zombie wakes up and commits as if nothing happened.
                    self.write_pg(&resource, token, Some(pause)).await;
                } else {
                    tokio::time::sleep(pause).await;
                    // The zombie wakes up and writes as if nothing happened.
                    self.write(&resource, token).await;
                }
            }
            if let Answer::Refused { .. } = self.renew(&resource, &lease_id).await {
                break; // lost: release anyway, as a careless client would
            }
            tokio::time::sleep(ttl / 4).await;
        }
        self.release(&resource, &lease_id).await;
        // DISCARD ALL before a connection could be reused; here it is closed.
        self.pg = None;
        if self.rng.chance(0.2) {
            // A retried (or stale) release: must never end a newer holder's lease.
            tokio::time::sleep(Duration::from_millis(self.rng.range(0, 300))).await;
            self.release(&resource, &lease_id).await;
        }
    }

    /// Acquire with one request id, resent while the outcome is unknown.
    async fn acquire(&mut self, resource: &str, request_id: &str, wait: Duration) -> Option<(String, u64)> {
        let ttl = self.ctx.config.ttl;
        for _ in 0..ACQUIRE_ATTEMPTS {
            let sent = self.ctx.history.now();
            let attempt = self
                .client
                .acquire(resource)
                .ttl(ttl)
                .wait(wait)
                .holder(self.name.as_str())
                .request_id(request_id)
                .retry_budget(Duration::ZERO)
                .grant()
                .await;
            let answer = match attempt {
                Ok(g) => Answer::Granted {
                    lease_id: g.lease_id.to_string(),
                    token: g.token.get(),
                    ttl_ms: g.ttl.as_millis() as u64,
                },
                Err(e) => client_answer(e.client_error()),
            };
            let call = Call::Acquire {
                resource: resource.into(),
                request_id: request_id.into(),
                ttl_ms: ttl.as_millis() as u64,
            };
            match self.record(call, sent, answer) {
                Answer::Granted { lease_id, token, .. } => return Some((lease_id, token)),
                Answer::Unavailable { .. } if !self.ctx.stopping() => {
                    tokio::time::sleep(Duration::from_millis(self.rng.range(50, 250))).await;
                }
                _ => return None,
            }
        }
        None
    }

    async fn renew(&mut self, resource: &str, lease_id: &str) -> Answer {
        let sent = self.ctx.history.now();
        let answer = match self.client.renew(resource, lease_id).await {
            Ok(r) => Answer::Renewed { token: r.fencing_token },
            Err(e) => client_answer(&e),
        };
        self.record(Call::Renew { resource: resource.into(), lease_id: lease_id.into() }, sent, answer)
    }

    async fn release(&mut self, resource: &str, lease_id: &str) -> Answer {
        let sent = self.ctx.history.now();
        let answer = match self.client.release(resource, lease_id).await {
            Ok(r) if r.was_holder => Answer::Released,
            Ok(_) => Answer::AlreadyReleased,
            Err(e) => client_answer(&e),
        };
        self.record(Call::Release { resource: resource.into(), lease_id: lease_id.into() }, sent, answer)
    }

    /// A connection to the resource's database through the sidecar, with
    /// `token` declared; `None` when that failed (the round writes nothing).
    async fn declare(&mut self, resource: &str, token: u64) -> Option<tokio_postgres::Client> {
        let db = resource.strip_prefix("res/").unwrap_or(resource);
        let mut config = tokio_postgres::Config::new();
        config
            .host(self.ctx.proxy_addr.ip().to_string())
            .port(self.ctx.proxy_addr.port())
            .user(self.ctx.pg_user)
            .dbname(db)
            .application_name(&self.name)
            .connect_timeout(Duration::from_secs(5));
        let (client, conn) =
            tokio::time::timeout(Duration::from_secs(10), config.connect(tokio_postgres::NoTls)).await.ok()?.ok()?;
        tokio::spawn(conn);
        let declared =
            tokio::time::timeout(Duration::from_secs(10), client.batch_execute(&format!("SET fencer.token = {token}")))
                .await;
        matches!(declared, Ok(Ok(()))).then_some(client)
    }

    /// One write through the PostgreSQL sidecar: `BEGIN; INSERT; COMMIT` on
    /// the round's connection, paused for `pause` before the COMMIT when
    /// given (a zombie inside its transaction). Answered by the COMMIT.
    async fn write_pg(&mut self, resource: &str, token: u64, pause: Option<Duration>) -> Answer {
        self.writes += 1;
        let write_id = format!("{}-{}", self.name, self.writes);
        let sent = self.ctx.history.now();
        let answer = match &self.pg {
            None => Answer::Unavailable { reason: "no connection through the sidecar".into() },
            Some(db) => {
                let work = async {
                    db.batch_execute("BEGIN").await?;
                    db.execute("INSERT INTO writes (token, write_id) VALUES ($1, $2)", &[&(token as i64), &write_id])
                        .await?;
                    if let Some(p) = pause {
                        tokio::time::sleep(p).await;
                    }
                    db.batch_execute("COMMIT").await
                };
                let limit = Duration::from_secs(10) + pause.unwrap_or_default();
                match tokio::time::timeout(limit, work).await {
                    Ok(Ok(())) => Answer::Written { status: 200 },
                    Ok(Err(e)) => pg_answer(&e),
                    Err(_) => Answer::Unavailable { reason: format!("no answer within {limit:?}") },
                }
            }
        };
        if !matches!(answer, Answer::Written { .. }) {
            // The connection's transaction is over or the connection gone:
            // the round's next writes need a fresh one.
            if let Some(db) = &self.pg {
                let _ = tokio::time::timeout(Duration::from_secs(2), db.batch_execute("ROLLBACK")).await;
            }
        }
        self.record(Call::Write { resource: resource.into(), token, write_id }, sent, answer)
    }

    /// One write through the proxy with `token`; its id travels in the body
    /// and in `X-Request-Id`.
    async fn write(&mut self, resource: &str, token: u64) -> Answer {
        if self.ctx.routes == Routes::Postgres {
            return self.write_pg(resource, token, None).await;
        }
        self.writes += 1;
        let write_id = format!("{}-{}", self.name, self.writes);
        let name = resource.strip_prefix("res/").unwrap_or(resource);
        let (path, body) = match self.ctx.routes {
            Routes::Paths => (format!("/w/{name}"), write_id.clone()),
            Routes::Influx => {
                (format!("/write?db={name}"), format!("w,resource={name},writer={write_id} token={token}i"))
            }
            Routes::Postgres => unreachable!("written by write_pg"),
        };
        let t = token.to_string();
        let headers = [("fencing-token", t.as_str()), ("x-request-id", write_id.as_str())];
        let sent = self.ctx.history.now();
        let r = tokio::time::timeout(
            Duration::from_secs(10),
            self.ctx.http.send(self.ctx.proxy_addr, Method::POST, &path, &headers, body),
        )
        .await;
        let answer = match r {
            Ok(Ok(resp)) if resp.status.is_success() => Answer::Written { status: resp.status.as_u16() },
            Ok(Ok(resp)) if resp.status == Status::CONFLICT => {
                Answer::Fenced { epoch: resp.json()["current_epoch"].as_u64().unwrap_or_default() }
            }
            Ok(Ok(resp)) if resp.status.is_server_error() => {
                Answer::Unavailable { reason: format!("{} {}", resp.status.as_u16(), resp.json()["type"]) }
            }
            Ok(Ok(resp)) => Answer::Refused { reason: format!("{} {}", resp.status.as_u16(), resp.json()["type"]) },
            Ok(Err(e)) => Answer::Unavailable { reason: e },
            Err(_) => Answer::Unavailable { reason: "no answer within 10 s".into() },
        };
        self.record(Call::Write { resource: resource.into(), token, write_id }, sent, answer)
    }
}

/// A history answer for a PostgreSQL error: FN001 is fenced (with the epoch
/// the sidecar named), FN004 and a closed connection are unavailable (the
/// outcome may be unknown), anything else a refusal.
fn pg_answer(e: &tokio_postgres::Error) -> Answer {
    let Some(db) = e.as_db_error() else {
        return Answer::Unavailable { reason: format!("connection: {e}") };
    };
    match db.code().code() {
        "FN001" => {
            let epoch = db
                .detail()
                .and_then(|d| d.split("current epoch ").nth(1))
                .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_default();
            Answer::Fenced { epoch }
        }
        code @ ("FN003" | "FN004" | "57P01" | "08006" | "08P01") => {
            Answer::Unavailable { reason: format!("{code} {}", db.message()) }
        }
        code => Answer::Refused { reason: format!("{code} {}", db.message()) },
    }
}
