//! The nemesis: injects one named fault at a time into the running cluster
//! and proxy, holds it, repairs it, and lets the system settle before the
//! next. Every fault is noted (with the history's clock) for the report.

use std::time::Duration;

use super::proxy::ProxyProc;
use super::{Ctx, Rng};
use fencer_testkit::ProcCluster;

/// The faults the nemesis knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// kill -9 the leader; restart it after the hold.
    KillLeader,
    /// Every raft message to or from the leader is lost.
    IsolateLeader,
    /// The leader's raft messages to one follower are lost, and so are its
    /// replies to that follower's requests; everything else passes.
    OneWayFromLeader,
    /// kill -9 both followers: the leader alone must refuse everything.
    MajorityLoss,
    /// SIGSTOP the leader past the election timeout, then SIGCONT.
    PauseLeader,
    /// Every node loses the answers of its next acquires after answering.
    DropAcquireAnswers,
    /// kill -9 the proxy; restart it on its data dir.
    KillProxy,
    /// One client stops renewing past its ttl, then writes and releases.
    PauseClient,
    /// kill -9 every node at once, then restart them all.
    RestartAll,
}

impl Fault {
    pub const ALL: [Fault; 9] = [
        Fault::KillLeader,
        Fault::IsolateLeader,
        Fault::DropAcquireAnswers,
        Fault::OneWayFromLeader,
        Fault::PauseClient,
        Fault::MajorityLoss,
        Fault::KillProxy,
        Fault::PauseLeader,
        Fault::RestartAll,
    ];
}

/// For `hold`: a client that can reach only the minority node at `addr`
/// (it sits on that side of the partition) keeps asking it for cold
/// resources. A correct node refuses (NO_QUORUM, NOT_LEADER); a grant it
/// acknowledged without a quorum shows up in the history. Bounded by `hold`
/// and by a count.
async fn minority_clients(ctx: &Ctx, addr: &str, hold: Duration) {
    use fencer_testkit::history::{Answer, Call, Op};
    let until = ctx.history.now() + hold;
    let client = fencer_client::Client::new([addr]).unwrap().with_call_timeout(Duration::from_secs(1));
    let mut rng = Rng::new(ctx.config.seed ^ until.as_nanos() as u64);
    for i in 0..200 {
        if ctx.history.now() >= until {
            break;
        }
        let resource = format!("res/c{}", rng.below(ctx.config.cold_resources as u64));
        let request_id = format!("hist-{}-minority-{}-{i:04}", ctx.config.run_id, until.as_millis());
        let sent = ctx.history.now();
        let r = client
            .acquire(resource.as_str())
            .ttl(ctx.config.ttl)
            .holder("minority")
            .request_id(request_id.as_str())
            .retry_budget(Duration::ZERO)
            .grant()
            .await;
        let answer = match r {
            Ok(g) => Answer::Granted {
                lease_id: g.lease_id.to_string(),
                token: g.token.get(),
                ttl_ms: g.ttl.as_millis() as u64,
            },
            Err(e) => fencer_testkit::grpc::client_answer(e.client_error()),
        };
        let call = Call::Acquire { resource, request_id, ttl_ms: ctx.config.ttl.as_millis() as u64 };
        ctx.history.record(Op { client: "minority".into(), call, sent, answered: ctx.history.now(), answer });
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    tokio::time::sleep(until.saturating_sub(ctx.history.now())).await;
}

/// The node that calls itself leader in the highest term, if any answers.
async fn leader_now(c: &ProcCluster) -> Option<u64> {
    let mut best: Option<(u64, u64)> = None;
    for n in c.running() {
        if let Some(s) = c.status(n).await
            && s["state"] == "leader"
        {
            let term = s["term"].as_u64().unwrap_or_default();
            if best.is_none_or(|(t, _)| term > t) {
                best = Some((term, n));
            }
        }
    }
    best.map(|(_, n)| n)
}

/// A leader, or failing that any running node.
async fn victim(c: &ProcCluster, rng: &mut Rng) -> u64 {
    for _ in 0..20 {
        if let Some(l) = leader_now(c).await {
            return l;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let running = c.running();
    running[rng.below(running.len() as u64) as usize]
}

/// Injects faults until the run's deadline: the faults of `schedule` in
/// order, then (for a long run) random ones.
pub async fn run(ctx: &Ctx, c: &mut ProcCluster, proxy: &mut ProxyProc, schedule: &[Fault]) {
    let cfg = &ctx.config;
    let mut rng = Rng::new(cfg.seed ^ 0xFA17);
    tokio::time::sleep(cfg.quiet).await;
    // Bounded: one fault per turn, each at least `quiet` long.
    for i in 0..10_000usize {
        if ctx.history.now() + cfg.hold >= cfg.duration {
            break;
        }
        let fault = match schedule.get(i) {
            Some(f) => *f,
            None if cfg.random_after_schedule => Fault::ALL[rng.below(Fault::ALL.len() as u64) as usize],
            None => break,
        };
        inject(ctx, c, proxy, fault, &mut rng).await;
        tokio::time::sleep(cfg.quiet).await;
    }
}

async fn inject(ctx: &Ctx, c: &mut ProcCluster, proxy: &mut ProxyProc, fault: Fault, rng: &mut Rng) {
    let hold = ctx.config.hold;
    // A minority side must be asked while it knows it has no quorum: after
    // the calls it received at the start time out (the client gives up
    // after 2 s), clients come back to it with fresh requests.
    let minority_hold = hold * 2;
    match fault {
        Fault::KillLeader => {
            let n = victim(c, rng).await;
            ctx.fault(format!("kill -9 leader n{n}"));
            c.kill9(n);
            tokio::time::sleep(hold).await;
            c.restart(n);
            ctx.fault(format!("restart n{n}"));
        }
        Fault::IsolateLeader => {
            let n = victim(c, rng).await;
            ctx.fault(format!("isolate leader n{n}"));
            c.isolate(n);
            minority_clients(ctx, &c.advertised[&n], minority_hold).await;
            c.heal();
            ctx.fault("heal".into());
        }
        Fault::OneWayFromLeader => {
            let n = victim(c, rng).await;
            let others: Vec<u64> = c.ids().into_iter().filter(|o| *o != n).collect();
            let f = others[rng.below(others.len() as u64) as usize];
            ctx.fault(format!("drop raft messages n{n} -> n{f} (one way)"));
            c.drop_one_way(n, f);
            tokio::time::sleep(hold).await;
            c.heal();
            ctx.fault("heal".into());
        }
        Fault::MajorityLoss => {
            let n = victim(c, rng).await;
            let others: Vec<u64> = c.ids().into_iter().filter(|o| *o != n).collect();
            ctx.fault(format!("majority loss: kill -9 n{} and n{}, n{n} alone", others[0], others[1]));
            for o in &others {
                c.kill9(*o);
            }
            minority_clients(ctx, &c.advertised[&n], minority_hold).await;
            for o in &others {
                c.restart(*o);
            }
            ctx.fault(format!("restart n{} and n{}", others[0], others[1]));
        }
        Fault::PauseLeader => {
            let n = victim(c, rng).await;
            ctx.fault(format!("SIGSTOP leader n{n}"));
            c.pause(n);
            tokio::time::sleep(hold).await;
            c.resume(n);
            ctx.fault(format!("SIGCONT n{n}"));
        }
        Fault::DropAcquireAnswers => {
            ctx.fault("every node loses its next 3 acquire answers after answering".into());
            for n in c.running() {
                c.drop_acquire_answers(n, 3);
            }
            tokio::time::sleep(hold).await;
            c.heal();
            ctx.fault("heal".into());
        }
        Fault::KillProxy => {
            ctx.fault("kill -9 the proxy".into());
            proxy.kill9();
            tokio::time::sleep(hold / 4).await;
            proxy.restart().await;
            ctx.fault("restart the proxy on its data dir".into());
        }
        Fault::PauseClient => {
            let w = rng.below(ctx.config.workers as u64) as usize;
            ctx.request_pause(w);
            tokio::time::sleep(hold).await;
        }
        Fault::RestartAll => {
            ctx.fault("kill -9 every node".into());
            for n in c.ids() {
                c.kill9(n);
            }
            tokio::time::sleep(hold / 4).await;
            for n in c.ids() {
                c.restart(n);
            }
            ctx.fault("restart every node".into());
        }
    }
}
