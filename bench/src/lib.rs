//! `fencer bench`: the seed workload on a local 3-node cluster, open loop,
//! side by side with etcd and Redis, plus the raw commit ceiling, the disk's
//! fsync rate, the proxy's overhead and a rate search (issue 8, DESIGN §9).
//! `docs/performance.md` describes the method and how to reproduce.
//!
//! A library, not part of the product: the `fencer` binary keeps a thin
//! `bench` subcommand that parses [`BenchArgs`] and calls [`run`], so
//! `fencer bench …` is what users run, and the product's own code holds
//! only product commands. The etcd and Redis drivers are behind this
//! crate's `bench-peers` feature (the root package forwards its own).
//! Two small closed-loop tools are its examples: `lock_bench` (acquire →
//! release round trips) and `proxy_bench` (the proxy's overhead against a
//! direct upstream).
//!
//! ```
//! use clap::{Args, Command, FromArgMatches};
//!
//! // The flags as `fencer bench` takes them.
//! let cmd = fencer_bench::BenchArgs::augment_args(Command::new("bench"));
//! let m = cmd.try_get_matches_from(["bench", "--scenarios", "steady,leader-kill", "--scale", "0.1"]).unwrap();
//! assert!(fencer_bench::BenchArgs::from_arg_matches(&m).is_ok());
//! let bad = fencer_bench::BenchArgs::augment_args(Command::new("bench"))
//!     .try_get_matches_from(["bench", "--duration", "soon"]);
//! assert!(bad.unwrap_err().to_string().contains("not a duration"));
//! ```
//!
//! # Layout
//! - `workload` — the open-loop scheduler, the bench's lease table, recording.
//! - `drivers` — fencer, etcd and Redis behind one acquire/renew/release.
//! - `servers` — local clusters started and stopped by PID.
//! - `ceiling` — no-op commit ceiling (in-process cluster) and fsync rate.
//! - `proxy` — proxy added latency and maximum throughput.
//! - `postgres` — pgbench direct and through the PostgreSQL sidecar.
//! - `probe` — `/metrics`, `/proc` and the machine description.
//! - `search` — the highest rate with p99 acquire under a bound.
//! - `report` — JSON and markdown.

mod ceiling;
mod drivers;
mod postgres;
mod probe;
mod proxy;
mod report;
mod search;
mod servers;
mod workload;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::sync::oneshot;
use tokio::time::Instant;

use self::drivers::{Driver, FencerDriver};
use self::probe::Machine;
use self::report::{CeilingReport, Failover, NodeReport, Report, RunReport, SearchReport, SearchStep, ServerFigures};
use self::servers::FencerCluster;
use self::workload::{Op, WorkloadConfig};

/// Parses `500ms`, `30s`, `5m`, `1h` (humantime syntax), with the message
/// of the `fencer` binary's own duration flags.
fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim()).map_err(|e| format!("{s:?} is not a duration like 500ms, 30s or 5m: {e}"))
}

/// Arguments of `fencer bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Scenarios to run against fencer: steady, follower-down, leader-kill,
    /// snapshot (comma separated), or `all`. Each starts its own cluster.
    #[arg(long, value_delimiter = ',', default_value = "steady")]
    scenarios: Vec<String>,

    /// Peers to run the steady workload against in the same run: etcd, redis,
    /// `all` or `none`. Needs a build with `--features bench-peers`.
    /// Default: all with that feature, none without.
    #[arg(long, value_delimiter = ',')]
    peers: Vec<String>,

    /// Also measure the raw ceiling: no-op commits on an in-process 3-node
    /// cluster, and the disk's fsync rate.
    #[arg(long)]
    ceiling: bool,

    /// Also measure the proxy's added latency and maximum throughput.
    #[arg(long)]
    proxy: bool,

    /// Also measure the PostgreSQL sidecar: pgbench straight to a
    /// throwaway PostgreSQL and through `fencer proxy --protocol postgres`
    /// (needs PostgreSQL's binaries; `--scenarios none --postgres` runs
    /// only this).
    #[arg(long)]
    postgres: bool,

    /// Search for the highest rate (a multiple of the configured workload)
    /// that keeps p99 acquire under --search-p99 with no errors.
    #[arg(long)]
    search: bool,

    /// Everything: all scenarios, all peers (with the feature), ceiling, proxy.
    #[arg(long)]
    full: bool,

    /// Use an existing fencer cluster instead of starting one (only the
    /// steady scenario; nothing is killed). Deliberately not read from
    /// FENCER_ENDPOINTS: a shell set up for the CLI must not aim a load test
    /// at a real cluster by accident.
    #[arg(long, value_delimiter = ',')]
    endpoints: Vec<String>,

    /// Lockable resources.
    #[arg(long, default_value_t = 100_000)]
    resources: u32,

    /// Leases held at once (filled during the warm-up, then kept there).
    #[arg(long, default_value_t = 20_000)]
    active: u32,

    /// Acquires per second (uncontended: always a free resource).
    #[arg(long, default_value_t = 2000.0)]
    acquire_rate: f64,

    /// Releases per second (default: the acquire rate, so the active set stays put).
    #[arg(long)]
    release_rate: Option<f64>,

    /// Acquires per second while filling the active set (default: --acquire-rate).
    #[arg(long)]
    fill_rate: Option<f64>,

    /// Renewal period of every held lease.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    renew_every: Duration,

    /// Lease ttl.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    ttl: Duration,

    /// Length of each measured phase.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    duration: Duration,

    /// Longest warm-up (filling the active set) before measuring anyway.
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    warmup_max: Duration,

    /// Multiply rates, active set and resources by this (e.g. 0.25 for a quick look).
    #[arg(long, default_value_t = 1.0)]
    scale: f64,

    /// Operations in flight at once; more are shed and counted as errors.
    #[arg(long, default_value_t = 10_000)]
    max_in_flight: usize,

    /// One operation's time limit, client retries included.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    op_timeout: Duration,

    /// Client connections (each multiplexes HTTP/2 streams).
    #[arg(long, default_value_t = 4)]
    connections: usize,

    /// fencer's client batching: RPCs in flight on one connection before
    /// the calls made meanwhile leave as one Batch request (the client
    /// library's default); 0 sends every call alone.
    #[arg(long, default_value_t = fencer_client::DEFAULT_BATCHING)]
    client_batching: usize,

    /// When the leader is killed in the leader-kill scenario (default: half of --duration).
    #[arg(long, value_parser = parse_duration)]
    kill_at: Option<Duration>,

    /// --snapshot-every of the cluster's nodes (default of `fencer coordinator`).
    #[arg(long, default_value_t = fencer_coordinator::DEFAULT_SNAPSHOT_EVERY)]
    snapshot_every: u64,

    /// --snapshot-every in the snapshot scenario (the coordinator's minimum is 100).
    #[arg(long, default_value_t = 10_000)]
    snapshot_scenario_every: u64,

    /// Concurrent no-op writers for the ceiling.
    #[arg(long, default_value_t = 256)]
    ceiling_writers: usize,

    /// Length of the ceiling and fsync measurements.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    ceiling_duration: Duration,

    /// Request rates of the proxy comparison.
    #[arg(long, value_delimiter = ',', default_value = "1000,5000")]
    proxy_rates: Vec<u64>,

    /// Length of each proxy run.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    proxy_duration: Duration,

    /// Concurrent writers for the proxy's maximum throughput.
    #[arg(long, default_value_t = 64)]
    proxy_concurrency: usize,

    /// pgbench client counts of the PostgreSQL throughput runs.
    #[arg(long, value_delimiter = ',', default_value = "8,32")]
    pg_clients: Vec<usize>,

    /// Length of each pgbench run.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pg_duration: Duration,

    /// Statements per second of the PostgreSQL added-latency run.
    #[arg(long, default_value_t = 5000)]
    pg_rate: u64,

    /// Idle connections through the sidecar for its memory figure.
    #[arg(long, default_value_t = 500)]
    pg_idle_connections: usize,

    /// pgbench's scale factor (100,000 accounts each).
    #[arg(long, default_value_t = 5)]
    pg_scale: u32,

    /// The system the rate search runs against: fencer, or (with
    /// `bench-peers`) etcd or redis.
    #[arg(long, default_value = "fencer")]
    search_system: String,

    /// Bound on p99 acquire for the rate search.
    #[arg(long, default_value = "200ms", value_parser = parse_duration)]
    search_p99: Duration,

    /// Highest multiple of the workload the search tries.
    #[arg(long, default_value_t = 8.0)]
    search_max_scale: f64,

    /// Bisection steps after the first failure.
    #[arg(long, default_value_t = 3)]
    search_steps: u32,

    /// Measured phase of each search step (default: --duration).
    #[arg(long, value_parser = parse_duration)]
    search_duration: Option<Duration>,

    /// Where report.json and report.md go.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,

    /// Where the servers' data dirs go (default: the system temp dir). The
    /// fsync figure is measured there too.
    #[arg(long)]
    data_dir: Option<PathBuf>,

    /// A line printed at the top of the report, e.g. "development run on a
    /// busy shared machine".
    #[arg(long, default_value = "")]
    label: String,

    /// The `fencer` binary to start nodes from (default: this one).
    #[arg(long)]
    fencer_bin: Option<PathBuf>,

    /// The `etcd` binary.
    #[arg(long, default_value = "etcd")]
    etcd_bin: PathBuf,

    /// The `redis-server` binary.
    #[arg(long, default_value = "redis-server")]
    redis_bin: PathBuf,

    /// Seed of the resource picker (default: random).
    #[arg(long)]
    seed: Option<u64>,
}

/// A fault scenario against fencer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scenario {
    Steady,
    FollowerDown,
    LeaderKill,
    Snapshot,
}

impl Scenario {
    const ALL: [Scenario; 4] = [Scenario::Steady, Scenario::FollowerDown, Scenario::LeaderKill, Scenario::Snapshot];

    fn parse(s: &str) -> Result<Self, String> {
        Ok(match s.trim() {
            "steady" => Self::Steady,
            "follower-down" => Self::FollowerDown,
            "leader-kill" => Self::LeaderKill,
            "snapshot" => Self::Snapshot,
            other => {
                return Err(format!("unknown scenario {other:?}: steady, follower-down, leader-kill, snapshot or all"));
            }
        })
    }

    fn name(self) -> &'static str {
        match self {
            Self::Steady => "steady",
            Self::FollowerDown => "follower-down",
            Self::LeaderKill => "leader-kill",
            Self::Snapshot => "snapshot",
        }
    }
}

/// Peers known to the bench.
const PEERS: [&str; 2] = ["etcd", "redis"];

struct Plan {
    scenarios: Vec<Scenario>,
    peers: Vec<&'static str>,
    notes: Vec<String>,
}

fn plan(args: &BenchArgs) -> anyhow::Result<Plan> {
    let mut notes = Vec::new();
    let mut scenarios = Vec::new();
    let names: Vec<&str> = if args.full { vec!["all"] } else { args.scenarios.iter().map(String::as_str).collect() };
    for s in names {
        match s.trim() {
            "all" => scenarios.extend(Scenario::ALL),
            "none" | "" => {}
            s => scenarios.push(Scenario::parse(s).map_err(anyhow::Error::msg)?),
        }
    }
    scenarios.dedup();
    if !args.endpoints.is_empty() && scenarios.iter().any(|s| *s != Scenario::Steady) {
        anyhow::bail!("with --endpoints only the steady scenario runs: the bench never kills nodes it did not start");
    }
    let asked: Vec<&str> = if args.full || args.peers.is_empty() {
        if cfg!(feature = "bench-peers") { PEERS.to_vec() } else { vec![] }
    } else {
        args.peers.iter().map(String::as_str).collect()
    };
    let mut peers = Vec::new();
    for p in asked {
        match p.trim() {
            "all" => peers.extend(PEERS),
            "none" | "" => {}
            p => peers
                .push(*PEERS.iter().find(|k| **k == p).with_context(|| format!("unknown peer {p:?}: etcd or redis"))?),
        }
    }
    peers.dedup();
    if !cfg!(feature = "bench-peers") {
        if !peers.is_empty() {
            anyhow::bail!(
                "etcd and Redis need a build with the peers: cargo build --release --features bench-peers \
                 (it needs protoc at build time, and etcd and redis-server to run)"
            );
        }
        let note = "etcd and Redis were not measured: this binary was built without --features bench-peers";
        eprintln!("fencer bench: {note}");
        notes.push(note.to_string());
    }
    if args.search && !["fencer", "etcd", "redis"].contains(&args.search_system.as_str()) {
        anyhow::bail!("--search-system {:?}: fencer, etcd or redis", args.search_system);
    }
    if args.search && args.search_system != "fencer" && !cfg!(feature = "bench-peers") {
        anyhow::bail!("--search-system {} needs a build with --features bench-peers", args.search_system);
    }
    Ok(Plan { scenarios, peers, notes })
}

fn workload_config(args: &BenchArgs, scale: f64) -> anyhow::Result<WorkloadConfig> {
    let s = args.scale * scale;
    let release = args.release_rate.unwrap_or(args.acquire_rate);
    let fill = args.fill_rate.unwrap_or(args.acquire_rate);
    let cfg = WorkloadConfig {
        resources: ((f64::from(args.resources) * s).round() as u32).max(1),
        active: ((f64::from(args.active) * s).round() as u32).max(1),
        acquire_rate: args.acquire_rate * s,
        release_rate: release * s,
        fill_rate: fill * s,
        renew_every: args.renew_every,
        ttl: args.ttl,
        duration: args.duration,
        warmup_max: args.warmup_max,
        max_in_flight: args.max_in_flight,
        op_timeout: args.op_timeout,
        seed: args.seed.unwrap_or_else(random_seed),
    };
    cfg.validate().map_err(anyhow::Error::msg)?;
    Ok(cfg)
}

fn random_seed() -> u64 {
    u64::from_str_radix(&fencer_client::new_request_id()[..16], 16).unwrap_or(1)
}

/// Runs the bench as `args` ask, until done or until `interrupted`
/// resolves (the binary passes its SIGINT/SIGTERM future). Exit code 130
/// for an interrupted run.
pub async fn run(args: BenchArgs, interrupted: impl std::future::Future<Output = ()>) -> anyhow::Result<ExitCode> {
    // On interruption the bench future is dropped: every server process it
    // started is killed by its PID (the process guard's drop), in-process
    // nodes and temp dirs go with it. No report is written for an
    // interrupted run.
    tokio::select! {
        r = run_bench(args) => r,
        () = interrupted => {
            eprintln!("fencer bench: interrupted; servers stopped, no report written");
            Ok(ExitCode::from(130))
        }
    }
}

async fn run_bench(args: BenchArgs) -> anyhow::Result<ExitCode> {
    let plan = plan(&args)?;
    let base_cfg = workload_config(&args, 1.0)?;
    let data_base = args.data_dir.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&data_base).with_context(|| format!("create {}", data_base.display()))?;
    let bin = match &args.fencer_bin {
        Some(b) => b.clone(),
        None => std::env::current_exe().context("find this binary to start nodes from")?,
    };
    let mut report = Report {
        title: "fencer bench".into(),
        label: args.label.clone(),
        fencer_version: env!("CARGO_PKG_VERSION").into(),
        started_unix_s: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        machine: Machine::describe(&data_base),
        workload: base_cfg.clone(),
        runs: Vec::new(),
        ceiling: None,
        proxy: None,
        postgres: None,
        search: None,
        notes: plan.notes.clone(),
    };
    report.notes.push(match args.client_batching {
        0 => format!("fencer client: {} connections, batching off (every call its own RPC)", args.connections),
        n => format!(
            "fencer client: {} connections; once {n} RPCs are in flight on one, the calls made meanwhile leave as one Batch request",
            args.connections
        ),
    });
    let env = Env { args: &args, bin, data_base };

    for scenario in &plan.scenarios {
        match env.fencer_run(*scenario, &base_cfg, 1.0).await {
            Ok(r) => report.runs.push(r),
            Err(e) => {
                eprintln!("fencer bench: fencer {} failed: {e:#}", scenario.name());
                report.notes.push(format!("fencer {} did not complete: {e:#}", scenario.name()));
            }
        }
    }
    for peer in &plan.peers {
        match env.peer_run(peer, &base_cfg, 1.0).await {
            Ok(r) => report.runs.push(r),
            Err(e) => {
                eprintln!("fencer bench: {peer} failed: {e:#}");
                report.notes.push(format!("{peer} did not complete: {e:#}"));
            }
        }
    }
    if args.search {
        report.search = Some(env.search().await);
    }
    if args.ceiling || args.full {
        report.ceiling = Some(env.ceiling().await);
    }
    if args.proxy || args.full {
        match proxy::run(&env.data_base, &args.proxy_rates, args.proxy_duration, args.proxy_concurrency).await {
            Ok(p) => report.proxy = Some(p),
            Err(e) => report.notes.push(format!("the proxy measurement failed: {e:#}")),
        }
    }
    if args.postgres || args.full {
        let pg_plan = postgres::PgBenchPlan {
            clients: args.pg_clients.clone(),
            duration: args.pg_duration,
            rate: args.pg_rate,
            idle_connections: args.pg_idle_connections,
            scale: args.pg_scale,
        };
        match postgres::run_postgres(&env.bin, &env.data_base, &pg_plan).await {
            Ok(p) => report.postgres = Some(p),
            Err(e) => report.notes.push(format!("the PostgreSQL measurement failed: {e:#}")),
        }
    }
    report.machine.finish();
    report.write(&args.out).with_context(|| format!("write the report to {}", args.out.display()))?;
    println!("{}", report.markdown());
    eprintln!(
        "fencer bench: wrote {} and {}",
        args.out.join("report.json").display(),
        args.out.join("report.md").display()
    );
    Ok(ExitCode::SUCCESS)
}

struct Env<'a> {
    args: &'a BenchArgs,
    bin: PathBuf,
    data_base: PathBuf,
}

/// Figures taken from the servers when the measured phase starts.
struct Before {
    at: Instant,
    procs: Vec<(u64, u32, Option<probe::ProcStats>)>,
    metrics: Vec<(u64, probe::Scrape)>,
    bench: Option<probe::ProcStats>,
}

async fn snapshot_before(pids: &[(u64, u32)], nodes: &[(u64, std::net::SocketAddr)]) -> Before {
    let procs = pids.iter().map(|(id, pid)| (*id, *pid, probe::proc_stats(&pid.to_string()))).collect();
    let mut metrics = Vec::new();
    for (id, addr) in nodes {
        if let Some(m) = probe::scrape(*addr).await {
            metrics.push((*id, m));
        }
    }
    Before { at: Instant::now(), procs, metrics, bench: probe::proc_stats("self") }
}

/// Samples every process's RSS every 5 s from `start` until told to stop
/// (or for an hour at most): growth over a run shows what a short run hides.
fn sample_memory(
    pids: Vec<(u64, u32)>,
    start: Instant,
) -> (oneshot::Sender<()>, tokio::task::JoinHandle<Vec<report::MemorySample>>) {
    let (stop, mut stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let mut samples = Vec::new();
        let mut tick = tokio::time::interval_at(start, Duration::from_secs(5));
        for _ in 0..720 {
            tokio::select! {
                _ = &mut stopped => break,
                at = tick.tick() => {
                    let rss_mb = pids
                        .iter()
                        .map(|(id, pid)| {
                            let rss = probe::proc_stats(&pid.to_string()).map_or(0, |s| s.rss_bytes);
                            (*id, (rss as f64 / (1024.0 * 1024.0) * 10.0).round() / 10.0)
                        })
                        .collect();
                    samples.push(report::MemorySample { second: (at - start).as_secs(), rss_mb });
                }
            }
        }
        samples
    });
    (stop, task)
}

/// Fills in memory, CPU and server figures from `before` to now.
async fn finish_run(run: &mut RunReport, before: &Before, nodes: &[(u64, std::net::SocketAddr)]) {
    let seconds = (Instant::now() - before.at).as_secs_f64().max(1e-3);
    run.nodes = before
        .procs
        .iter()
        .map(|(id, pid, b)| NodeReport::new(*id, *pid, *b, probe::proc_stats(&pid.to_string()), seconds))
        .filter(|n| n.rss_mb > 0.0)
        .collect();
    if let (Some(b), Some(a)) = (before.bench, probe::proc_stats("self")) {
        run.bench_cpu_cores = (a.cpu_seconds - b.cpu_seconds) / seconds;
    }
    for (id, addr) in nodes {
        let Some(b) = before.metrics.iter().find(|(n, _)| n == id).map(|(_, m)| m) else { continue };
        let Some(a) = probe::scrape(*addr).await else { continue };
        let mut fig = ServerFigures { node: *id, ..ServerFigures::default() };
        for (name, after) in &a.histograms {
            let prior = b.histograms.get(name).copied().unwrap_or_default();
            if let Some(mean) = after.mean_since(&prior) {
                fig.means.insert(name.clone(), mean);
            }
            fig.counts.insert(name.clone(), after.count - prior.count);
        }
        run.server.push(fig);
        if let Some(n) = run.nodes.iter_mut().find(|n| n.node == *id) {
            n.leader_changes = a.leader_changes.zip(b.leader_changes).map(|(a, b)| (a - b).max(0.0) as u64);
            n.leader = a.is_leader;
        }
    }
    let ok_per_s = run.ok_per_s;
    for n in &mut run.nodes {
        n.cpu_us_per_op = (ok_per_s > 0.0).then(|| n.cpu_cores * 1e6 / ok_per_s);
    }
}

impl Env<'_> {
    async fn fencer_run(&self, scenario: Scenario, cfg: &WorkloadConfig, scale: f64) -> anyhow::Result<RunReport> {
        let args = self.args;
        eprintln!("fencer bench: fencer, scenario {} (offered {:.0} ops/s)", scenario.name(), cfg.offered_rate());
        let mut cluster = if args.endpoints.is_empty() {
            let every = if scenario == Scenario::Snapshot { args.snapshot_scenario_every } else { args.snapshot_every };
            let logs = args.out.join("logs").join(run_name("fencer", scenario.name(), scale));
            FencerCluster::start(&self.bin, &self.data_base, every, &logs).await?
        } else {
            FencerCluster::external(&args.endpoints)?
        };
        let result = self.fencer_scenario(&mut cluster, scenario, cfg, scale).await;
        cluster.stop().await;
        result
    }

    async fn fencer_scenario(
        &self,
        cluster: &mut FencerCluster,
        scenario: Scenario,
        cfg: &WorkloadConfig,
        scale: f64,
    ) -> anyhow::Result<RunReport> {
        let args = self.args;
        let leader = cluster.wait_for_leader(Duration::from_secs(30)).await?;
        let mut notes = Vec::new();
        if scenario == Scenario::FollowerDown {
            let f = cluster.follower_of(leader).context("no follower to stop")?;
            cluster.kill(f).await?;
            notes.push(format!("node {f} (a follower) was killed before the warm-up; the run had 2 of 3 nodes"));
        }
        let driver = Arc::new(Driver::Fencer(FencerDriver::new(
            &cluster.endpoints(),
            args.connections,
            args.client_batching,
            args.op_timeout,
        )?));
        let (tx, rx) = oneshot::channel();
        let label = format!("fencer {}", scenario.name());
        let workload = tokio::spawn(workload::run(driver, cfg.clone(), label, Some(tx)));
        let measure_start = rx.await.context("the workload ended before measuring")?;
        let live = cluster.live_addrs();
        let before = snapshot_before(&cluster.pids(), &live).await;
        let (stop_sampling, sampler) = sample_memory(cluster.pids(), measure_start);
        let mut failover = None;
        if scenario == Scenario::LeaderKill {
            let kill_at = args.kill_at.unwrap_or(cfg.duration / 2).min(cfg.duration);
            tokio::time::sleep_until(measure_start + kill_at).await;
            let victim = cluster.wait_for_leader(Duration::from_secs(5)).await?;
            let at = cluster.kill(victim).await?;
            eprintln!("\nfencer bench: killed the leader, node {victim}");
            let new_leader = cluster.wait_for_leader(Duration::from_secs(30)).await.ok();
            let known = Instant::now() - at;
            failover = Some((victim, at, new_leader, known));
        }
        let mut result = workload.await.context("the workload task failed")?;
        let _ = stop_sampling.send(());
        let live = cluster.live_addrs();
        let mut run = RunReport::new("fencer", scenario.name(), scale, cfg, &result);
        finish_run(&mut run, &before, &live).await;
        run.memory = sampler.await.unwrap_or_default();
        if let Some((victim, at, new_leader, known)) = failover {
            let mut f = failover_figures(&mut result, victim, at, new_leader);
            f.leader_known_after_ms = new_leader.map(|_| known.as_secs_f64() * 1000.0);
            run.failover = Some(f);
        }
        run.notes.extend(notes);
        Ok(run)
    }

    #[cfg(feature = "bench-peers")]
    async fn peer_run(&self, peer: &str, cfg: &WorkloadConfig, scale: f64) -> anyhow::Result<RunReport> {
        use self::drivers::peers::{EtcdDriver, RedisDriver};
        use self::servers::{EtcdCluster, RedisServer};
        let args = self.args;
        eprintln!("fencer bench: {peer}, steady (offered {:.0} ops/s)", cfg.offered_rate());
        match peer {
            "etcd" => {
                let logs = args.out.join("logs").join(run_name("etcd", "steady", scale));
                let cluster = EtcdCluster::start(&args.etcd_bin, &self.data_base, &logs).await?;
                let result = async {
                    let driver =
                        Arc::new(Driver::Etcd(EtcdDriver::connect(&cluster.client_urls, args.connections).await?));
                    self.peer_workload("etcd", driver, &cluster.pids(), cfg, scale).await
                }
                .await;
                cluster.stop().await;
                result.map(|mut r| {
                    r.notes.push("etcd renewals are leader-local keep-alives, not replicated log entries".into());
                    r
                })
            }
            "redis" => {
                let logs = args.out.join("logs").join(run_name("redis", "steady", scale));
                let server = RedisServer::start(&args.redis_bin, &self.data_base, &logs).await?;
                let result = async {
                    let driver = Arc::new(Driver::Redis(
                        RedisDriver::connect(&server.addr.to_string(), args.connections).await?,
                    ));
                    self.peer_workload("redis", driver, &[(1, server.proc.pid())], cfg, scale).await
                }
                .await;
                server.stop().await;
                result.map(|mut r| {
                    r.notes.push(
                        "Redis: one process, no replication, no persistence, no fencing (unsafe reference)".into(),
                    );
                    r
                })
            }
            other => anyhow::bail!("unknown peer {other}"),
        }
    }

    #[cfg(feature = "bench-peers")]
    async fn peer_workload(
        &self,
        name: &str,
        driver: Arc<Driver>,
        pids: &[(u64, u32)],
        cfg: &WorkloadConfig,
        scale: f64,
    ) -> anyhow::Result<RunReport> {
        let (tx, rx) = oneshot::channel();
        let label = format!("{name} steady");
        let workload = tokio::spawn(workload::run(driver, cfg.clone(), label, Some(tx)));
        let start = rx.await.context("the workload ended before measuring")?;
        let before = snapshot_before(pids, &[]).await;
        let (stop_sampling, sampler) = sample_memory(pids.to_vec(), start);
        let result = workload.await.context("the workload task failed")?;
        let _ = stop_sampling.send(());
        let mut run = RunReport::new(name, "steady", scale, cfg, &result);
        finish_run(&mut run, &before, &[]).await;
        run.memory = sampler.await.unwrap_or_default();
        Ok(run)
    }

    #[cfg(not(feature = "bench-peers"))]
    async fn peer_run(&self, peer: &str, _cfg: &WorkloadConfig, _scale: f64) -> anyhow::Result<RunReport> {
        anyhow::bail!("{peer} needs a build with --features bench-peers")
    }

    async fn search(&self) -> SearchReport {
        let args = self.args;
        let bound_ms = args.search_p99.as_secs_f64() * 1000.0;
        let mut search = search::Search::new(args.search_max_scale, args.search_steps);
        let step_seconds = args.search_duration.unwrap_or(args.duration).as_secs_f64();
        let mut report = SearchReport {
            system: args.search_system.clone(),
            p99_bound_ms: bound_ms,
            step_seconds,
            ..SearchReport::default()
        };
        while let Some(scale) = search.next() {
            let step = async {
                let mut cfg = workload_config(args, scale)?;
                if let Some(d) = args.search_duration {
                    cfg.duration = d;
                }
                let run = match args.search_system.as_str() {
                    "fencer" => self.fencer_run(Scenario::Steady, &cfg, scale).await?,
                    peer => self.peer_run(peer, &cfg, scale).await?,
                };
                anyhow::Ok((cfg, run))
            }
            .await;
            let (pass, st) = match step {
                Ok((cfg, run)) => {
                    let p99 = run.acquire().map_or(f64::INFINITY, |a| a.latency.p99_ms);
                    let mut why = Vec::new();
                    if run.errors > 0 {
                        why.push(format!("{} errors", run.errors));
                    }
                    if p99 >= bound_ms {
                        why.push(format!("p99 acquire {p99:.0} ms"));
                    }
                    if !run.warmup_reached {
                        why.push("warm-up did not fill the active set".into());
                    }
                    let pass = why.is_empty();
                    let st = SearchStep {
                        scale,
                        offered_per_s: cfg.offered_rate(),
                        ok_per_s: run.ok_per_s,
                        acquire_p99_ms: p99,
                        errors: run.errors,
                        pass,
                        why: if pass { "—".into() } else { why.join(", ") },
                    };
                    (pass, st)
                }
                Err(e) => (
                    false,
                    SearchStep {
                        scale,
                        offered_per_s: 0.0,
                        ok_per_s: 0.0,
                        acquire_p99_ms: 0.0,
                        errors: 0,
                        pass: false,
                        why: format!("failed: {e:#}"),
                    },
                ),
            };
            eprintln!("fencer bench: search ×{scale:.2}: {} ({})", if pass { "pass" } else { "fail" }, st.why);
            search.record(scale, pass);
            if pass {
                report.highest_pass = Some((scale, st.offered_per_s));
            }
            report.steps.push(st);
        }
        report.highest_pass = search
            .highest_pass()
            .and_then(|s| report.steps.iter().find(|st| st.scale == s).map(|st| (s, st.offered_per_s)));
        report
    }

    async fn ceiling(&self) -> CeilingReport {
        let args = self.args;
        let mut c = CeilingReport { writers: args.ceiling_writers, ..CeilingReport::default() };
        eprintln!("fencer bench: raw ceiling ({} no-op writers, {:?})", args.ceiling_writers, args.ceiling_duration);
        match ceiling::commit_ceiling(&self.data_base, args.ceiling_writers, args.ceiling_duration, args.snapshot_every)
            .await
        {
            Ok(r) => c.commits = Some(r),
            Err(e) => c.notes.push(format!("the commit ceiling failed: {e:#}")),
        }
        eprintln!("fencer bench: fsync rate in {}", self.data_base.display());
        match ceiling::fsync_rate(&self.data_base, args.ceiling_duration.min(Duration::from_secs(10))).await {
            Ok(r) => c.fsync = Some(r),
            Err(e) => c.notes.push(format!("the fsync measurement failed: {e:#}")),
        }
        c
    }
}

/// The unavailability window and the latency spike around a leader kill.
fn failover_figures(
    result: &mut workload::WorkloadResult,
    victim: u64,
    at: Instant,
    new_leader: Option<u64>,
) -> Failover {
    let start = result.measure_start;
    let kill_us = workload::micros_between(start, at);
    let mut successes: Vec<u64> = result.ops.iter_mut().flat_map(|o| std::mem::take(&mut o.success_at_us)).collect();
    let (gap_start, gap_end) = report::outage(&mut successes, kill_us);
    let kill_second = usize::try_from(kill_us / 1_000_000).unwrap_or(usize::MAX);
    let after = |f: &dyn Fn(&workload::Second) -> u64| -> u64 {
        Op::ALL.iter().flat_map(|op| result.op(*op).timeline.iter().skip(kill_second).map(f)).max().unwrap_or(0)
    };
    let errors_after: u64 =
        Op::ALL.iter().flat_map(|op| result.op(*op).timeline.iter().skip(kill_second).map(|s| s.errors)).sum();
    Failover {
        killed_node: victim,
        kill_at_s: kill_us as f64 / 1e6,
        unavailable_ms: gap_end.map(|e| (e - gap_start) as f64 / 1000.0),
        gap_start_s: gap_start as f64 / 1e6,
        gap_end_s: gap_end.map(|e| e as f64 / 1e6),
        max_latency_after_kill_ms: after(&|s| s.max_us) as f64 / 1000.0,
        errors_after_kill: errors_after,
        new_leader,
        leader_known_after_ms: None,
    }
}

/// The name of a run's log folder: `fencer-steady`, `fencer-steady-x2.00`.
fn run_name(system: &str, scenario: &str, scale: f64) -> String {
    if (scale - 1.0).abs() < 1e-9 { format!("{system}-{scenario}") } else { format!("{system}-{scenario}-x{scale:.2}") }
}
