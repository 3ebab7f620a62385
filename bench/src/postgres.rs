//! The PostgreSQL sidecar's cost (issue 14): `pgbench` straight to a
//! throwaway PostgreSQL and through a `fencer proxy --protocol postgres`
//! process in front of the same server, in the same run.
//!
//! - **Throughput**, closed loop, for each client count: select-only
//!   (`pgbench -S`, the token declared at connection start through
//!   `PGOPTIONS`) and a write script that declares its token in every
//!   transaction (`SET fencer.token = 1; UPDATE pgbench_accounts …`). Both
//!   paths run the very same script; PostgreSQL takes `fencer.token` as a
//!   placeholder setting when it is reached directly.
//! - **Added latency** at a fixed rate (`pgbench -S -R`), from pgbench's
//!   per-transaction log, p50 and p99 of both paths.
//! - **Memory** of the sidecar process at N idle connections (RSS and its
//!   peak from `/proc`), and its CPU time per transaction in each run.
//!
//! The server runs with `fsync = off` and `synchronous_commit = off`: the
//! database is as fast as it gets, so the sidecar's share of each
//! transaction is as large as it gets (the figures are a bound, not a
//! flattering case).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};
use fencer_testkit::Proc;
use fencer_testkit::postgres::TestPostgres;
use serde::Serialize;

use super::probe;
use super::report::Latency;
use super::workload::new_histogram;

/// What to measure.
#[derive(Debug, Clone)]
pub(crate) struct PgBenchPlan {
    /// Client counts of the throughput runs.
    pub(crate) clients: Vec<usize>,
    /// Length of each pgbench run.
    pub(crate) duration: Duration,
    /// Transactions (one statement each) per second of the latency run.
    pub(crate) rate: u64,
    /// Idle connections held open for the memory figure.
    pub(crate) idle_connections: usize,
    /// pgbench's scale factor (100,000 accounts each).
    pub(crate) scale: u32,
}

/// One pgbench run.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct PgRun {
    pub(crate) tps: f64,
    pub(crate) latency_avg_ms: f64,
    pub(crate) transactions: u64,
    pub(crate) failed: u64,
    /// The sidecar's CPU time per transaction (µs), through the sidecar only.
    pub(crate) sidecar_cpu_us_per_tx: Option<f64>,
}

/// One script at one client count, both paths.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct PgThroughput {
    pub(crate) script: String,
    pub(crate) clients: usize,
    pub(crate) direct: PgRun,
    pub(crate) sidecar: PgRun,
}

/// The fixed-rate run, both paths.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct PgLatency {
    pub(crate) rate: u64,
    pub(crate) clients: usize,
    pub(crate) direct: Latency,
    pub(crate) sidecar: Latency,
    pub(crate) direct_tps: f64,
    pub(crate) sidecar_tps: f64,
}

/// The sidecar's memory with idle connections open.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct PgMemory {
    pub(crate) connections: usize,
    pub(crate) rss_before_mb: f64,
    pub(crate) rss_mb: f64,
    pub(crate) peak_rss_mb: f64,
}

/// The PostgreSQL part of the report.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct PgReport {
    pub(crate) postgres_version: String,
    pub(crate) scale: u32,
    pub(crate) seconds_per_run: f64,
    pub(crate) throughput: Vec<PgThroughput>,
    pub(crate) latency: Option<PgLatency>,
    pub(crate) memory: Option<PgMemory>,
    pub(crate) notes: Vec<String>,
}

/// The write script: the token declared in every transaction, then one
/// update of a random account.
const WRITE_SCRIPT: &str = "\\set aid random(1, 100000 * :scale)\n\
                            \\set delta random(-5000, 5000)\n\
                            SET fencer.token = 1;\n\
                            UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid;\n";

/// The token every sidecar connection declares at startup.
const PGOPTIONS: &str = "-c fencer.token=1";

/// A pgbench target: where it connects, and the environment it needs.
struct Target {
    addr: SocketAddr,
    sidecar_pid: Option<u32>,
}

struct Bench<'a> {
    pg: &'a TestPostgres,
    dir: PathBuf,
    plan: &'a PgBenchPlan,
}

impl Bench<'_> {
    fn pgbench(&self, target: &Target, args: &[String]) -> anyhow::Result<String> {
        let mut cmd = self.pg.tool("pgbench");
        cmd.args(["-h", &target.addr.ip().to_string(), "-p", &target.addr.port().to_string(), "-U", "postgres"])
            .args(args)
            .arg("postgres")
            .env("PGOPTIONS", PGOPTIONS)
            .env("PGCONNECT_TIMEOUT", "10");
        run(&mut cmd)
    }

    /// One closed-loop run of `script` (`-S` or a script file).
    fn throughput(&self, target: &Target, script: &[String], clients: usize) -> anyhow::Result<PgRun> {
        let before = target.sidecar_pid.and_then(|p| probe::proc_stats(&p.to_string()));
        let mut args = vec![
            "-n".into(),
            "-M".into(),
            "prepared".into(),
            "-c".into(),
            clients.to_string(),
            "-j".into(),
            "2".into(),
            "-T".into(),
            self.plan.duration.as_secs().max(1).to_string(),
        ];
        args.extend_from_slice(script);
        let out = self.pgbench(target, &args)?;
        let after = target.sidecar_pid.and_then(|p| probe::proc_stats(&p.to_string()));
        let mut run = parse_summary(&out)?;
        if let (Some(b), Some(a)) = (before, after)
            && run.transactions > 0
        {
            run.sidecar_cpu_us_per_tx = Some((a.cpu_seconds - b.cpu_seconds) * 1e6 / run.transactions as f64);
        }
        Ok(run)
    }

    /// The fixed-rate select-only run; latency from the per-transaction log.
    fn latency(&self, target: &Target, name: &str, clients: usize) -> anyhow::Result<(Latency, f64)> {
        let prefix = self.dir.join(format!("latency-{name}"));
        let args = vec![
            "-n".into(),
            "-M".into(),
            "prepared".into(),
            "-S".into(),
            "-c".into(),
            clients.to_string(),
            "-j".into(),
            "2".into(),
            "-R".into(),
            self.plan.rate.to_string(),
            "-T".into(),
            self.plan.duration.as_secs().max(1).to_string(),
            "-l".into(),
            format!("--log-prefix={}", prefix.display()),
        ];
        let out = self.pgbench(target, &args)?;
        let tps = parse_summary(&out)?.tps;
        let mut hist = new_histogram();
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let file = entry.file_name();
            let Some(file) = file.to_str() else { continue };
            if !file.starts_with(&format!("latency-{name}.")) {
                continue;
            }
            // client_id transaction_no time script_no epoch epoch_us [lag]:
            // `time` is the transaction's latency in microseconds.
            for line in std::fs::read_to_string(entry.path())?.lines() {
                let fields: Vec<&str> = line.split_whitespace().collect();
                if let Some(us) = fields.get(2).and_then(|t| t.parse::<u64>().ok()) {
                    let _ = hist.record(us.max(1));
                }
            }
        }
        if hist.is_empty() {
            bail!("pgbench wrote no per-transaction log under {}", self.dir.display());
        }
        Ok((Latency::of(&hist), tps))
    }
}

/// Runs `cmd` and returns its stdout, or an error with both outputs.
fn run(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd.output().with_context(|| format!("start {cmd:?}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!("{cmd:?} failed ({}):\n{stdout}{}", out.status, String::from_utf8_lossy(&out.stderr));
    }
    Ok(stdout)
}

/// The figures of a pgbench summary.
fn parse_summary(out: &str) -> anyhow::Result<PgRun> {
    let value = |prefix: &str| {
        out.lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    let tps = value("tps = ").with_context(|| format!("no `tps =` line in pgbench's output:\n{out}"))?;
    Ok(PgRun {
        tps,
        latency_avg_ms: value("latency average = ").unwrap_or(0.0),
        transactions: value("number of transactions actually processed: ").unwrap_or(0.0) as u64,
        failed: value("number of failed transactions: ").unwrap_or(0.0) as u64,
        sidecar_cpu_us_per_tx: None,
    })
}

/// Waits until `addr` accepts a TCP connection.
async fn wait_listening(addr: SocketAddr, sidecar: &mut Proc) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Ok(());
        }
        if !sidecar.alive() || tokio::time::Instant::now() > deadline {
            bail!("the sidecar did not listen on {addr}:\n{}", sidecar.log_tail(30));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs the whole PostgreSQL measurement.
pub(crate) async fn run_postgres(fencer_bin: &Path, base: &Path, plan: &PgBenchPlan) -> anyhow::Result<PgReport> {
    let bin = fencer_testkit::postgres::bin_dir().context(
        "PostgreSQL was not found (apt-get install -y postgresql, or set FENCER_TEST_PG_BIN to its bin directory)",
    )?;
    let pg = tokio::task::spawn_blocking(move || TestPostgres::try_start(bin))
        .await?
        .map_err(anyhow::Error::msg)
        .context("start a throwaway PostgreSQL")?;
    std::fs::create_dir_all(base)?;
    let dir = tempfile::Builder::new().prefix("pg-bench-").tempdir_in(base)?;
    let mut report =
        PgReport { scale: plan.scale, seconds_per_run: plan.duration.as_secs_f64(), ..PgReport::default() };
    report.postgres_version =
        run(pg.tool("postgres").arg("--version")).map(|v| v.trim().to_owned()).unwrap_or_default();
    eprintln!("[postgres] {} on {}; pgbench -i -s {}", report.postgres_version, pg.addr(), plan.scale);
    let direct = Target { addr: pg.addr(), sidecar_pid: None };
    let bench = Bench { pg: &pg, dir: dir.path().to_owned(), plan };
    bench.pgbench(&direct, &["-i".into(), "-q".into(), "-s".into(), plan.scale.to_string()])?;
    let script = dir.path().join("write.sql");
    std::fs::write(&script, WRITE_SCRIPT)?;

    let listen = fencer_testkit::free_addr();
    let admin = fencer_testkit::free_addr();
    let mut sidecar = Proc::try_spawn(
        "fencer proxy --protocol postgres",
        Command::new(fencer_bin)
            // A new data dir needs a floor (P10); the bench's tokens are 1.
            .args(["proxy", "--protocol", "postgres", "--resource", "pg/bench", "--floor", "1"])
            .arg("--listen")
            .arg(listen.to_string())
            .arg("--upstream")
            .arg(pg.addr().to_string())
            .arg("--admin")
            .arg(admin.to_string())
            .arg("--data-dir")
            .arg(dir.path().join("sidecar"))
            .env("RUST_LOG", "warn"),
        &dir.path().join("sidecar.log"),
    )
    .context("start the sidecar")?;
    let result = async {
        wait_listening(listen, &mut sidecar).await?;
        let through = Target { addr: listen, sidecar_pid: Some(sidecar.pid()) };
        let scripts: [(&str, Vec<String>); 2] = [
            ("select-only (-S)", vec!["-S".into()]),
            ("write, token declared", vec!["-f".into(), script.display().to_string()]),
        ];
        // Warm both paths (caches, the sidecar's first epoch write).
        let warm = PgBenchPlan { duration: Duration::from_secs(2), ..plan.clone() };
        let warm_bench = Bench { pg: &pg, dir: dir.path().to_owned(), plan: &warm };
        warm_bench.throughput(&direct, &scripts[1].1, 4)?;
        warm_bench.throughput(&through, &scripts[1].1, 4)?;
        for (name, args) in &scripts {
            for &clients in &plan.clients {
                let d = bench.throughput(&direct, args, clients)?;
                let s = bench.throughput(&through, args, clients)?;
                eprintln!(
                    "[postgres] {name}, {clients} clients: direct {:.0} tps, through the sidecar {:.0} tps ({:.0} %)",
                    d.tps,
                    s.tps,
                    100.0 * s.tps / d.tps.max(1e-9)
                );
                report.throughput.push(PgThroughput { script: (*name).into(), clients, direct: d, sidecar: s });
            }
        }
        let clients = 8;
        let (direct_latency, direct_tps) = bench.latency(&direct, "direct", clients)?;
        let (sidecar_latency, sidecar_tps) = bench.latency(&through, "sidecar", clients)?;
        eprintln!(
            "[postgres] -S at {}/s: p99 direct {:.3} ms, through the sidecar {:.3} ms",
            plan.rate, direct_latency.p99_ms, sidecar_latency.p99_ms
        );
        report.latency = Some(PgLatency {
            rate: plan.rate,
            clients,
            direct: direct_latency,
            sidecar: sidecar_latency,
            direct_tps,
            sidecar_tps,
        });
        report.memory = Some(idle_memory(listen, &sidecar, plan.idle_connections).await?);
        anyhow::Ok(())
    }
    .await;
    sidecar.stop(Duration::from_secs(10)).await;
    if let Err(e) = result {
        report.notes.push(format!("the PostgreSQL measurement stopped early: {e:#}"));
        eprintln!("[postgres] stopped early: {e:#}");
    }
    drop(pg);
    Ok(report)
}

/// Opens `n` idle connections through the sidecar (each with its token
/// declared) and reads the sidecar's memory.
async fn idle_memory(listen: SocketAddr, sidecar: &Proc, n: usize) -> anyhow::Result<PgMemory> {
    let mb = |b: u64| b as f64 / (1024.0 * 1024.0);
    let pid = sidecar.pid().to_string();
    let before = probe::proc_stats(&pid).context("read the sidecar's /proc status")?;
    let mut clients = Vec::with_capacity(n);
    for i in 0..n {
        let mut config = tokio_postgres::Config::new();
        config
            .host(listen.ip().to_string())
            .port(listen.port())
            .user("postgres")
            .dbname("postgres")
            .options(PGOPTIONS)
            .application_name(format!("idle-{i}"))
            .connect_timeout(Duration::from_secs(10));
        let (client, connection) = config
            .connect(tokio_postgres::NoTls)
            .await
            .with_context(|| format!("idle connection {i} of {n} through the sidecar"))?;
        let task = tokio::spawn(connection);
        clients.push((client, task));
    }
    // Every connection is authenticated and idle; one round trip each
    // proves they are live.
    for (client, _) in &clients {
        client.simple_query("SELECT 1").await.context("a query on an idle connection")?;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = probe::proc_stats(&pid).context("read the sidecar's /proc status")?;
    eprintln!(
        "[postgres] sidecar RSS with {n} connections: {:.1} MB (peak {:.1} MB; {:.1} MB idle)",
        mb(after.rss_bytes),
        mb(after.peak_rss_bytes),
        mb(before.rss_bytes)
    );
    for (client, task) in clients {
        drop(client);
        let _ = task.await;
    }
    Ok(PgMemory {
        connections: n,
        rss_before_mb: mb(before.rss_bytes),
        rss_mb: mb(after.rss_bytes),
        peak_rss_mb: mb(after.peak_rss_bytes),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pgbench_summaries_parse() {
        let out = "transaction type: <builtin: select only>\nscaling factor: 5\nquery mode: prepared\n\
                   number of clients: 8\nnumber of threads: 2\nmaximum number of tries: 1\nduration: 10 s\n\
                   number of transactions actually processed: 251234\nnumber of failed transactions: 0 (0.000%)\n\
                   latency average = 0.412 ms\ninitial connection time = 9.120 ms\n\
                   tps = 25123.400000 (without initial connection time)\n";
        let run = parse_summary(out).unwrap();
        assert_eq!((run.tps, run.latency_avg_ms, run.transactions, run.failed), (25123.4, 0.412, 251234, 0));
        assert!(parse_summary("pgbench: error: connection refused").is_err());
    }
}
