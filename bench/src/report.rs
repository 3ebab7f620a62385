//! The report: plain data (serialised as `report.json`) and its markdown
//! rendering (`report.md`, also printed at the end of a run). Pure: no I/O
//! except [`Report::write`].

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use hdrhistogram::Histogram;
use serde::Serialize;

use super::probe::{Machine, ProcStats};
use super::workload::{Op, OpRecord, WorkloadConfig, WorkloadResult};

/// Percentiles of one latency histogram, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub(crate) struct Latency {
    pub(crate) count: u64,
    pub(crate) p50_ms: f64,
    pub(crate) p95_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) p999_ms: f64,
    pub(crate) max_ms: f64,
    pub(crate) mean_ms: f64,
}

impl Latency {
    /// Extracts the percentiles of a histogram recorded in microseconds.
    pub(crate) fn of(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Self::default();
        }
        let ms = |us: u64| us as f64 / 1000.0;
        Self {
            count: h.len(),
            p50_ms: ms(h.value_at_quantile(0.50)),
            p95_ms: ms(h.value_at_quantile(0.95)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            p999_ms: ms(h.value_at_quantile(0.999)),
            max_ms: ms(h.max()),
            mean_ms: h.mean() / 1000.0,
        }
    }
}

/// A rate measurement: how many, how fast, how long each took.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct RateResult {
    pub(crate) ops: u64,
    pub(crate) errors: u64,
    pub(crate) seconds: f64,
    pub(crate) per_s: f64,
    pub(crate) latency: Latency,
}

/// One operation kind of one run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct OpReport {
    /// Operations intended in the measured phase.
    pub(crate) intended: u64,
    pub(crate) ok: u64,
    /// Successes per second of the measured phase.
    pub(crate) ok_per_s: f64,
    pub(crate) errors: u64,
    pub(crate) errors_by_kind: BTreeMap<String, u64>,
    /// Operations of the warm-up (not measured): successes and errors.
    pub(crate) warmup_ok: u64,
    pub(crate) warmup_errors_by_kind: BTreeMap<String, u64>,
    /// One message per error kind.
    pub(crate) error_examples: BTreeMap<String, String>,
    /// Latency of successes, from the intended send time.
    pub(crate) latency: Latency,
}

impl OpReport {
    fn of(rec: &OpRecord, seconds: f64) -> Self {
        Self {
            intended: rec.intended,
            ok: rec.ok,
            ok_per_s: rec.ok as f64 / seconds,
            errors: rec.error_count(),
            errors_by_kind: rec.errors.clone(),
            warmup_ok: rec.warmup_ok,
            warmup_errors_by_kind: rec.warmup_errors.clone(),
            error_examples: rec.examples.clone(),
            latency: Latency::of(&rec.hist),
        }
    }
}

/// One second of the measured phase (by intended time), all operations.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct TimelineRow {
    pub(crate) second: usize,
    pub(crate) acquire_ok: u64,
    pub(crate) renew_ok: u64,
    pub(crate) release_ok: u64,
    pub(crate) errors: u64,
    pub(crate) max_ms: f64,
}

/// What a leader kill cost.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Failover {
    pub(crate) killed_node: u64,
    /// When the leader was killed, seconds into the measured phase.
    pub(crate) kill_at_s: f64,
    /// Last success before the outage to first success after it (the
    /// longest gap between successive successes around the kill), ms.
    /// `None`: nothing succeeded after the kill.
    pub(crate) unavailable_ms: Option<f64>,
    pub(crate) gap_start_s: f64,
    pub(crate) gap_end_s: Option<f64>,
    /// Highest latency of any operation intended from the kill on, ms.
    pub(crate) max_latency_after_kill_ms: f64,
    /// Errors of operations intended from the kill on.
    pub(crate) errors_after_kill: u64,
    /// Node id of the new leader.
    pub(crate) new_leader: Option<u64>,
    /// When a node first answered as the new leader (polled every 50 ms), ms after the kill.
    pub(crate) leader_known_after_ms: Option<f64>,
}

/// Longest gap between successive successes that ends after `kill_us`
/// (all times µs since the measured phase started): `(start, end)`, with
/// `end = None` when nothing succeeded after the kill.
pub(crate) fn outage(successes: &mut [u64], kill_us: u64) -> (u64, Option<u64>) {
    successes.sort_unstable();
    let split = successes.partition_point(|&t| t <= kill_us);
    let last_before = if split > 0 { successes[split - 1] } else { 0 };
    let mut best = (last_before, successes.get(split).copied());
    let Some(_) = best.1 else { return best };
    // The first success after the kill may be a reply that was already on
    // its way; the outage is the longest gap from the kill onwards.
    let mut prev = last_before;
    for &t in &successes[split..] {
        if t - prev > best.1.unwrap_or(u64::MAX) - best.0 {
            best = (prev, Some(t));
        }
        prev = t;
        if t > kill_us + 60_000_000 {
            break;
        }
    }
    best
}

/// One server process: memory at the end of the measured phase (the seed
/// state is in it) and CPU used during it.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct NodeReport {
    pub(crate) node: u64,
    pub(crate) pid: u32,
    pub(crate) rss_mb: f64,
    pub(crate) peak_rss_mb: f64,
    /// CPU seconds used during the measured phase ÷ its length.
    pub(crate) cpu_cores: f64,
    /// CPU microseconds per successful lock operation of the whole
    /// cluster (`cpu_cores` ÷ ok ops/s): what one operation costs this node.
    pub(crate) cpu_us_per_op: Option<f64>,
    /// Whether the node led at the end of the measured phase.
    pub(crate) leader: Option<bool>,
    /// Leader changes this node saw during the measured phase
    /// (`fencer_leader_changes_total`).
    pub(crate) leader_changes: Option<u64>,
}

impl NodeReport {
    pub(crate) fn new(node: u64, pid: u32, before: Option<ProcStats>, after: Option<ProcStats>, seconds: f64) -> Self {
        let mb = |b: u64| (b as f64 / (1024.0 * 1024.0) * 10.0).round() / 10.0;
        let after = after.unwrap_or_default();
        let cpu = before.map(|b| (after.cpu_seconds - b.cpu_seconds) / seconds).unwrap_or(0.0);
        Self {
            node,
            pid,
            rss_mb: mb(after.rss_bytes),
            peak_rss_mb: mb(after.peak_rss_bytes),
            cpu_cores: cpu,
            ..Self::default()
        }
    }
}

/// Means of the coordinator's own histograms over the measured phase.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct ServerFigures {
    pub(crate) node: u64,
    /// Metric name → mean over the measured phase (seconds or count).
    pub(crate) means: BTreeMap<String, f64>,
    /// Metric name → observations during the measured phase.
    pub(crate) counts: BTreeMap<String, f64>,
}

/// One workload run against one system.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RunReport {
    pub(crate) system: String,
    pub(crate) scenario: String,
    /// Multiple of the configured rates and sizes (1 except in a search).
    pub(crate) scale: f64,
    pub(crate) acquire_rate: f64,
    pub(crate) release_rate: f64,
    pub(crate) active: u32,
    /// Acquires + releases + renewals of the active set, per second.
    pub(crate) offered_per_s: f64,
    pub(crate) measured_s: f64,
    pub(crate) warmup_s: f64,
    pub(crate) warmup_reached: bool,
    pub(crate) ops: BTreeMap<Op, OpReport>,
    /// Successful state changes per second (all three operations).
    pub(crate) ok_per_s: f64,
    pub(crate) errors: u64,
    pub(crate) held_at_end: usize,
    /// Resources set aside for ttl + 5 s after an unknown or refused outcome.
    pub(crate) quarantined_resources: usize,
    pub(crate) abandoned_in_flight: usize,
    pub(crate) peak_in_flight: usize,
    /// CPU seconds of the load generator (this process) per second.
    pub(crate) bench_cpu_cores: f64,
    pub(crate) nodes: Vec<NodeReport>,
    pub(crate) server: Vec<ServerFigures>,
    pub(crate) failover: Option<Failover>,
    pub(crate) timeline: Vec<TimelineRow>,
    /// RSS of each server process every 5 s of the measured phase.
    pub(crate) memory: Vec<MemorySample>,
    pub(crate) notes: Vec<String>,
}

/// RSS of each server process at one moment.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct MemorySample {
    /// Seconds into the measured phase.
    pub(crate) second: u64,
    /// Node id → RSS in MB (0 once the process is gone).
    pub(crate) rss_mb: BTreeMap<u64, f64>,
}

impl RunReport {
    pub(crate) fn new(system: &str, scenario: &str, scale: f64, cfg: &WorkloadConfig, r: &WorkloadResult) -> Self {
        let seconds = r.measured.as_secs_f64().max(1e-3);
        let ops: BTreeMap<Op, OpReport> = Op::ALL.iter().map(|op| (*op, OpReport::of(r.op(*op), seconds))).collect();
        let ok: u64 = ops.values().map(|o| o.ok).sum();
        let errors = ops.values().map(|o| o.errors).sum();
        let seconds_run = r.op(Op::Acquire).timeline.len().min(seconds.floor().max(1.0) as usize);
        let timeline = (0..seconds_run)
            .map(|s| {
                let at = |op: Op| r.op(op).timeline[s];
                TimelineRow {
                    second: s,
                    acquire_ok: at(Op::Acquire).ok,
                    renew_ok: at(Op::Renew).ok,
                    release_ok: at(Op::Release).ok,
                    errors: Op::ALL.iter().map(|op| at(*op).errors).sum(),
                    max_ms: Op::ALL.iter().map(|op| at(*op).max_us).max().unwrap_or(0) as f64 / 1000.0,
                }
            })
            .collect();
        let mut notes = Vec::new();
        for op in Op::ALL {
            let e = &r.op(op).warmup_errors;
            if !e.is_empty() {
                notes.push(format!("warm-up {} errors: {}", op.as_str(), kinds(e)));
            }
        }
        if !r.warmup_reached {
            notes.push(format!(
                "the warm-up did not fill the active set ({} of {}) within --warmup-max",
                r.held_at_end, cfg.active
            ));
        }
        Self {
            system: system.to_string(),
            scenario: scenario.to_string(),
            scale,
            acquire_rate: cfg.acquire_rate,
            release_rate: cfg.release_rate,
            active: cfg.active,
            offered_per_s: cfg.offered_rate(),
            measured_s: seconds,
            warmup_s: r.warmup.as_secs_f64(),
            warmup_reached: r.warmup_reached,
            ops,
            ok_per_s: ok as f64 / seconds,
            errors,
            held_at_end: r.held_at_end,
            quarantined_resources: r.retired,
            abandoned_in_flight: r.abandoned,
            peak_in_flight: r.peak_in_flight,
            bench_cpu_cores: 0.0,
            nodes: Vec::new(),
            server: Vec::new(),
            failover: None,
            timeline,
            memory: Vec::new(),
            notes,
        }
    }

    fn retired_resources_note(&self) -> Option<String> {
        (self.quarantined_resources > 0 || self.abandoned_in_flight > 0).then(|| {
            format!(
                "{} resources quarantined after an unknown or refused outcome; {} operations still in flight after the drain",
                self.quarantined_resources, self.abandoned_in_flight
            )
        })
    }

    pub(crate) fn acquire(&self) -> Option<&OpReport> {
        self.ops.get(&Op::Acquire)
    }
}

/// The no-op commit ceiling and the disk's fsync rate.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct CeilingReport {
    pub(crate) writers: usize,
    pub(crate) commits: Option<RateResult>,
    pub(crate) fsync: Option<RateResult>,
    pub(crate) notes: Vec<String>,
}

/// One rate of the proxy comparison.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ProxyRate {
    pub(crate) rate: u64,
    pub(crate) direct: RateResult,
    pub(crate) proxy: RateResult,
    pub(crate) added_p50_ms: f64,
    pub(crate) added_p99_ms: f64,
    /// p99 of the unmeasured warm-up at the same rate, direct and through
    /// the proxy: the step to the rate's connections happens there.
    pub(crate) warm_up_p99_ms: [f64; 2],
}

/// Closed-loop maximum throughput, direct, through the proxy, through a
/// bare hyper forwarder and through a raw TCP relay.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ProxyThroughput {
    pub(crate) concurrency: usize,
    pub(crate) direct: ClosedRun,
    pub(crate) proxy: ClosedRun,
    /// The same writes through hyper's server and pooled client with no
    /// fence: what a forwarder on this HTTP stack costs at least.
    pub(crate) bare: ClosedRun,
    /// The same writes through a raw TCP relay (bytes copied both ways, one
    /// upstream connection per client connection, no HTTP): the least any
    /// proxy that reads the request costs, on any stack.
    pub(crate) relay: ClosedRun,
}

/// One closed-loop path, and the bench process's CPU per completed request
/// on it, µs: the generator, the upstream and (on the proxied paths) the
/// proxy all run in that process.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ClosedRun {
    #[serde(flatten)]
    pub(crate) result: RateResult,
    pub(crate) cpu_us_per_request: f64,
}

/// The proxy part.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct ProxyReport {
    pub(crate) seconds_per_run: f64,
    pub(crate) rates: Vec<ProxyRate>,
    pub(crate) throughput: Option<ProxyThroughput>,
}

/// One step of the rate search.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SearchStep {
    pub(crate) scale: f64,
    pub(crate) offered_per_s: f64,
    pub(crate) ok_per_s: f64,
    pub(crate) acquire_p99_ms: f64,
    pub(crate) errors: u64,
    pub(crate) pass: bool,
    pub(crate) why: String,
}

/// The rate search.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct SearchReport {
    /// The system searched.
    pub(crate) system: String,
    pub(crate) p99_bound_ms: f64,
    /// Measured phase of each step.
    pub(crate) step_seconds: f64,
    pub(crate) steps: Vec<SearchStep>,
    /// Highest passing scale and its offered rate.
    pub(crate) highest_pass: Option<(f64, f64)>,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Report {
    pub(crate) title: String,
    pub(crate) label: String,
    pub(crate) fencer_version: String,
    pub(crate) started_unix_s: u64,
    pub(crate) command: String,
    pub(crate) machine: Machine,
    pub(crate) workload: WorkloadConfig,
    pub(crate) runs: Vec<RunReport>,
    pub(crate) ceiling: Option<CeilingReport>,
    pub(crate) proxy: Option<ProxyReport>,
    pub(crate) postgres: Option<super::postgres::PgReport>,
    pub(crate) search: Option<SearchReport>,
    pub(crate) notes: Vec<String>,
}

fn ms(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn lat(l: &Latency) -> [String; 4] {
    if l.count == 0 {
        return ["—".into(), "—".into(), "—".into(), "—".into()];
    }
    [ms(l.p50_ms), ms(l.p95_ms), ms(l.p99_ms), ms(l.max_ms)]
}

fn kinds(m: &BTreeMap<String, u64>) -> String {
    if m.is_empty() {
        return "—".into();
    }
    m.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ")
}

fn ratio(ours: f64, theirs: f64) -> String {
    if theirs > 0.0 && ours > 0.0 { format!("{:.2}×", ours / theirs) } else { "—".into() }
}

impl Report {
    /// Writes `report.json` and `report.md` into `dir`.
    pub(crate) fn write(&self, dir: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("report.json"), serde_json::to_vec_pretty(self)?)?;
        std::fs::write(dir.join("report.md"), self.markdown())?;
        Ok(())
    }

    /// The steady-state fencer run the comparisons refer to.
    fn fencer_steady(&self) -> Option<&RunReport> {
        self.runs.iter().find(|r| r.system == "fencer" && r.scenario == "steady")
    }

    pub(crate) fn markdown(&self) -> String {
        let mut o = String::new();
        let w = &self.workload;
        let _ = writeln!(o, "# {}\n", self.title);
        if !self.label.is_empty() {
            let _ = writeln!(o, "> {}\n", self.label);
        }
        let _ = writeln!(o, "- command: `{}`", self.command);
        let _ = writeln!(o, "- fencer {}, started at unix time {}", self.fencer_version, self.started_unix_s);
        let m = &self.machine;
        let _ = writeln!(
            o,
            "- machine: {} × {}, {} GiB, Linux {}; data on {}",
            m.cpus, m.cpu_model, m.memory_gib, m.kernel, m.data_filesystem
        );
        let _ = writeln!(o, "- load average at start: {}; at end: {}", m.load_at_start, m.load_at_end);
        let _ = writeln!(
            o,
            "- workload: {} resources, {} active leases renewed every {} ms (ttl {} ms), {}/s acquires, {}/s releases; \
             {} s measured after a warm-up; open loop, latency from the intended send time; at most {} operations in flight \
             (beyond: shed, counted as errors); {} ms per operation",
            w.resources,
            w.active,
            w.renew_every.as_millis(),
            w.ttl.as_millis(),
            w.acquire_rate,
            w.release_rate,
            w.duration.as_secs(),
            w.max_in_flight,
            w.op_timeout.as_millis(),
        );
        for n in &self.notes {
            let _ = writeln!(o, "- note: {n}");
        }

        if !self.runs.is_empty() {
            let _ = writeln!(o, "\n## Runs\n");
            let _ = writeln!(
                o,
                "| system | scenario | offered ops/s | ok ops/s | acquire p50 | p95 | p99 | max (ms) | renew p99 | release p99 | errors |"
            );
            let _ = writeln!(o, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
            for r in &self.runs {
                let a = r.ops.get(&Op::Acquire).map(|o| lat(&o.latency)).unwrap_or_default();
                let p99 = |op: Op| r.ops.get(&op).map(|o| lat(&o.latency)[2].clone()).unwrap_or_default();
                let _ = writeln!(
                    o,
                    "| {} | {} | {:.0} | {:.0} | {} | {} | {} | {} | {} | {} | {} |",
                    r.system,
                    scenario_label(r),
                    r.offered_per_s,
                    r.ok_per_s,
                    a[0],
                    a[1],
                    a[2],
                    a[3],
                    p99(Op::Renew),
                    p99(Op::Release),
                    r.errors
                );
            }
            let _ = writeln!(o, "\n### Per operation\n");
            let _ = writeln!(
                o,
                "| system | scenario | op | intended | ok/s | p50 | p95 | p99 | p99.9 | max (ms) | errors by kind |"
            );
            let _ = writeln!(o, "|---|---|---|--:|--:|--:|--:|--:|--:|--:|---|");
            for r in &self.runs {
                for (op, x) in &r.ops {
                    let l = &x.latency;
                    let [p50, p95, p99, max] = lat(l);
                    let p999 = if l.count == 0 { "—".into() } else { ms(l.p999_ms) };
                    let _ = writeln!(
                        o,
                        "| {} | {} | {} | {} | {:.0} | {p50} | {p95} | {p99} | {p999} | {max} | {} |",
                        r.system,
                        scenario_label(r),
                        op.as_str(),
                        x.intended,
                        x.ok_per_s,
                        kinds(&x.errors_by_kind)
                    );
                }
            }
            let noted: Vec<&RunReport> =
                self.runs.iter().filter(|r| !r.notes.is_empty() || r.retired_resources_note().is_some()).collect();
            if !noted.is_empty() {
                let _ = writeln!(o, "\n### Notes on runs\n");
                for r in noted {
                    for n in r.notes.iter().cloned().chain(r.retired_resources_note()) {
                        let _ = writeln!(o, "- {} {}: {n}", r.system, scenario_label(r));
                    }
                }
            }
            self.comparison(&mut o);
            self.failovers(&mut o);
            self.resources(&mut o);
        }
        self.ceiling_section(&mut o);
        self.proxy_section(&mut o);
        self.postgres_section(&mut o);
        self.search_section(&mut o);
        o
    }

    fn comparison(&self, o: &mut String) {
        let Some(ours) = self.fencer_steady() else { return };
        let peers: Vec<&RunReport> =
            self.runs.iter().filter(|r| r.system != "fencer" && r.scenario == "steady").collect();
        if peers.is_empty() {
            return;
        }
        let _ = writeln!(o, "\n## fencer side by side (steady state, same workload, same machine, same run)\n");
        let _ = writeln!(
            o,
            "Ratios are fencer ÷ peer for throughput (> 1: fencer did more) and peer ÷ fencer for latency (> 1: fencer was faster).\n"
        );
        let _ = writeln!(
            o,
            "| peer | ok ops/s fencer / peer | ratio | acquire p99 ms fencer / peer | ratio | acquire p50 ratio | errors fencer / peer |"
        );
        let _ = writeln!(o, "|---|--:|--:|--:|--:|--:|--:|");
        let (oa, ol) = (ours.acquire().map(|a| a.latency).unwrap_or_default(), ours.ok_per_s);
        for p in peers {
            let pa = p.acquire().map(|a| a.latency).unwrap_or_default();
            let _ = writeln!(
                o,
                "| {} | {:.0} / {:.0} | {} | {} / {} | {} | {} | {} / {} |",
                p.system,
                ol,
                p.ok_per_s,
                ratio(ol, p.ok_per_s),
                ms(oa.p99_ms),
                ms(pa.p99_ms),
                ratio(pa.p99_ms, oa.p99_ms),
                ratio(pa.p50_ms, oa.p50_ms),
                ours.errors,
                p.errors
            );
        }
    }

    fn failovers(&self, o: &mut String) {
        let runs: Vec<&RunReport> = self.runs.iter().filter(|r| r.failover.is_some()).collect();
        if runs.is_empty() {
            return;
        }
        let _ = writeln!(o, "\n## Leader killed mid-run\n");
        for r in runs {
            let f = r.failover.as_ref().expect("filtered");
            let window = match f.unavailable_ms {
                Some(w) => format!("{w:.0} ms (from {:.3} s to {:.3} s)", f.gap_start_s, f.gap_end_s.unwrap_or(0.0)),
                None => "no success after the kill".into(),
            };
            let _ = writeln!(
                o,
                "- {}: node {} (the leader) killed with SIGKILL at {:.3} s; new leader: {} (answering as leader {} after the kill); \
                 unavailability window (last success before, first success after): {window}; highest latency of operations \
                 intended from the second of the kill on: {} ms; errors from the second of the kill on: {}",
                r.system,
                f.killed_node,
                f.kill_at_s,
                f.new_leader.map_or("unknown".into(), |n| format!("node {n}")),
                f.leader_known_after_ms.map_or("—".into(), |v| format!("{v:.0} ms")),
                ms(f.max_latency_after_kill_ms),
                f.errors_after_kill
            );
            let from = (f.kill_at_s as usize).saturating_sub(2);
            let _ = writeln!(o, "\n| second | acquire ok | renew ok | release ok | errors | max latency (ms) |");
            let _ = writeln!(o, "|--:|--:|--:|--:|--:|--:|");
            for t in r.timeline.iter().skip(from).take(10) {
                let _ = writeln!(
                    o,
                    "| {} | {} | {} | {} | {} | {} |",
                    t.second,
                    t.acquire_ok,
                    t.renew_ok,
                    t.release_ok,
                    t.errors,
                    ms(t.max_ms)
                );
            }
        }
    }

    fn resources(&self, o: &mut String) {
        let with_nodes: Vec<&RunReport> = self.runs.iter().filter(|r| !r.nodes.is_empty()).collect();
        if !with_nodes.is_empty() {
            self.memory_section(o, &with_nodes);
        }
        self.server_section(o);
    }

    fn memory_section(&self, o: &mut String, with_nodes: &[&RunReport]) {
        let _ = writeln!(o, "\n## Memory and CPU\n");
        let _ = writeln!(
            o,
            "RSS at the end of the measured phase (the active set is held), peak RSS, CPU cores used during it, \
             the node's CPU per successful operation of the whole cluster (µs/op), and the leader changes it saw.\n"
        );
        let _ = writeln!(
            o,
            "| system | scenario | node | role | RSS MB | peak RSS MB | CPU cores | CPU µs/op | leader changes | load generator CPU cores |"
        );
        let _ = writeln!(o, "|---|---|--:|---|--:|--:|--:|--:|--:|--:|");
        for r in with_nodes.iter().copied() {
            for n in &r.nodes {
                let role = match n.leader {
                    Some(true) => "leader",
                    Some(false) => "follower",
                    None => "—",
                };
                let _ = writeln!(
                    o,
                    "| {} | {} | {} | {} | {} | {} | {:.2} | {} | {} | {:.2} |",
                    r.system,
                    scenario_label(r),
                    n.node,
                    role,
                    n.rss_mb,
                    n.peak_rss_mb,
                    n.cpu_cores,
                    n.cpu_us_per_op.map_or("—".into(), |c| format!("{c:.1}")),
                    n.leader_changes.map_or("—".into(), |c| c.to_string()),
                    r.bench_cpu_cores
                );
            }
        }
        let grown: Vec<String> = self.runs.iter().filter_map(memory_growth).collect();
        if !grown.is_empty() {
            let _ = writeln!(o, "\nRSS growth during the measured phase (sampled every 5 s; first → last sample):\n");
            for g in grown {
                let _ = writeln!(o, "- {g}");
            }
        }
    }

    fn server_section(&self, o: &mut String) {
        let with_server: Vec<&RunReport> = self.runs.iter().filter(|r| !r.server.is_empty()).collect();
        if with_server.is_empty() {
            return;
        }
        let _ = writeln!(o, "\n## Where the time goes (coordinator histograms, means over the measured phase)\n");
        let _ = writeln!(
            o,
            "| scenario | node | log fsync ms (count) | appends per group commit | commit ms | apply batch ms | entries per apply batch | items per Batch call (calls) | snapshots built |"
        );
        let _ = writeln!(o, "|---|--:|--:|--:|--:|--:|--:|--:|--:|");
        for r in with_server {
            for s in &r.server {
                let mean = |k: &str, scale: f64| s.means.get(k).map_or("—".into(), |v| ms(v * scale));
                let count = |k: &str| s.counts.get(k).map_or("0".into(), |v| format!("{v:.0}"));
                let _ = writeln!(
                    o,
                    "| {} | {} | {} ({}) | {} | {} | {} | {} | {} ({}) | {} |",
                    scenario_label(r),
                    s.node,
                    mean("fencer_raft_log_fsync_duration_seconds", 1000.0),
                    count("fencer_raft_log_fsync_duration_seconds"),
                    mean("fencer_raft_log_group_ops", 1.0),
                    mean("fencer_raft_commit_duration_seconds", 1000.0),
                    mean("fencer_raft_apply_duration_seconds", 1000.0),
                    mean("fencer_raft_apply_batch_entries", 1.0),
                    mean("fencer_batch_items", 1.0),
                    count("fencer_batch_items"),
                    count("fencer_snapshot_build_duration_seconds"),
                );
            }
        }
    }

    fn ceiling_section(&self, o: &mut String) {
        let Some(c) = &self.ceiling else { return };
        let _ = writeln!(o, "\n## Raw ceiling\n");
        if let Some(x) = &c.commits {
            let _ = writeln!(
                o,
                "- no-op commits (`write_blank`) on an in-process 3-node cluster, {} writers: **{:.0}/s** over {:.1} s (p50 {} ms, p99 {} ms, errors {})",
                c.writers,
                x.per_s,
                x.seconds,
                ms(x.latency.p50_ms),
                ms(x.latency.p99_ms),
                x.errors
            );
            for r in self.runs.iter().filter(|r| r.system == "fencer") {
                let _ = writeln!(
                    o,
                    "- fencer {} at {:.0} offered ops/s committed {:.0} lock ops/s = **{:.1} %** of the ceiling",
                    scenario_label(r),
                    r.offered_per_s,
                    r.ok_per_s,
                    100.0 * r.ok_per_s / x.per_s
                );
            }
            if let Some((scale, rate)) =
                self.search.as_ref().filter(|s| s.system == "fencer").and_then(|s| s.highest_pass)
            {
                let _ = writeln!(
                    o,
                    "- highest rate found by the search (×{scale:.2} the configured workload, {rate:.0} ops/s) = **{:.1} %** of the ceiling",
                    100.0 * rate / x.per_s
                );
            }
        }
        if let Some(f) = &c.fsync {
            let _ = writeln!(
                o,
                "- disk: 4 KiB append + fdatasync in the data dir's filesystem: **{:.0}/s** (p50 {} ms, p99 {} ms, max {} ms)",
                f.per_s,
                ms(f.latency.p50_ms),
                ms(f.latency.p99_ms),
                ms(f.latency.max_ms)
            );
        }
        for n in &c.notes {
            let _ = writeln!(o, "- note: {n}");
        }
    }

    fn proxy_section(&self, o: &mut String) {
        let Some(p) = &self.proxy else { return };
        let _ = writeln!(o, "\n## Proxy overhead\n");
        let _ = writeln!(
            o,
            "Fenced writes to an upstream that answers 204 at once, directly and through an in-process `fencer proxy`; open loop, {:.0} s per run after an unmeasured warm-up of 2 s at the same rate on each path.\n",
            p.seconds_per_run
        );
        let _ = writeln!(
            o,
            "| rate/s | direct p50 | p99 | max (ms) | proxy p50 | p99 | max (ms) | added p50 | added p99 | errors direct / proxy | warm-up p99 direct / proxy (ms) |"
        );
        let _ = writeln!(o, "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
        for r in &p.rates {
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {} | {} | {:+.3} | {:+.3} | {} / {} | {} / {} |",
                r.rate,
                ms(r.direct.latency.p50_ms),
                ms(r.direct.latency.p99_ms),
                ms(r.direct.latency.max_ms),
                ms(r.proxy.latency.p50_ms),
                ms(r.proxy.latency.p99_ms),
                ms(r.proxy.latency.max_ms),
                r.added_p50_ms,
                r.added_p99_ms,
                r.direct.errors,
                r.proxy.errors,
                ms(r.warm_up_p99_ms[0]),
                ms(r.warm_up_p99_ms[1])
            );
        }
        if let Some(t) = &p.throughput {
            let cpu = |r: &ClosedRun| r.cpu_us_per_request;
            let _ = writeln!(
                o,
                "\nMaximum throughput, {} concurrent writers (closed loop), in this order; CPU is this process's (generator, upstream and proxy share it) per completed request:\n",
                t.concurrency
            );
            let _ = writeln!(
                o,
                "| path | requests/s | % of direct | p99 (ms) | errors | CPU µs/request | added CPU µs/request |"
            );
            let _ = writeln!(o, "|---|--:|--:|--:|--:|--:|--:|");
            let rows = [
                ("direct", &t.direct),
                ("through `fencer proxy`", &t.proxy),
                ("through a bare hyper forwarder (no fence)", &t.bare),
                ("through a raw TCP relay (no HTTP, no fence)", &t.relay),
            ];
            for (path, run) in rows {
                let r = &run.result;
                let _ = writeln!(
                    o,
                    "| {path} | **{:.0}** | {:.0} % | {} | {} | {:.1} | {:+.1} |",
                    r.per_s,
                    100.0 * r.per_s / t.direct.result.per_s.max(1e-9),
                    ms(r.latency.p99_ms),
                    r.errors,
                    cpu(run),
                    cpu(run) - cpu(&t.direct)
                );
            }
            let _ = writeln!(
                o,
                "\nThe fence's own CPU (proxy − bare forwarder): **{:+.1} µs/request** of the proxy's {:+.1}.",
                cpu(&t.proxy) - cpu(&t.bare),
                cpu(&t.proxy) - cpu(&t.direct)
            );
            let _ = writeln!(
                o,
                "The raw relay's share, **{:.0} %**, bounds any proxy that reads each request before forwarding it, measured this way on this machine.",
                100.0 * t.relay.result.per_s / t.direct.result.per_s.max(1e-9)
            );
        }
    }

    fn postgres_section(&self, o: &mut String) {
        let Some(p) = &self.postgres else { return };
        let _ = writeln!(o, "\n## PostgreSQL sidecar\n");
        let _ = writeln!(
            o,
            "pgbench (`-M prepared`, `-j 2`, scale {}) straight to {} and through a `fencer proxy --protocol postgres` process in front of it; {:.0} s per run, same server, same run. The server runs with fsync and synchronous_commit off.\n",
            p.scale, p.postgres_version, p.seconds_per_run
        );
        if !p.throughput.is_empty() {
            let _ = writeln!(
                o,
                "| script | clients | direct tps | sidecar tps | sidecar / direct | latency avg direct / sidecar (ms) | sidecar CPU µs/tx | failed |"
            );
            let _ = writeln!(o, "|---|--:|--:|--:|--:|--:|--:|--:|");
            for t in &p.throughput {
                let _ = writeln!(
                    o,
                    "| {} | {} | {:.0} | {:.0} | {:.0} % | {} / {} | {} | {} / {} |",
                    t.script,
                    t.clients,
                    t.direct.tps,
                    t.sidecar.tps,
                    100.0 * t.sidecar.tps / t.direct.tps.max(1e-9),
                    ms(t.direct.latency_avg_ms),
                    ms(t.sidecar.latency_avg_ms),
                    t.sidecar.sidecar_cpu_us_per_tx.map_or("—".into(), |c| format!("{c:.1}")),
                    t.direct.failed,
                    t.sidecar.failed
                );
            }
        }
        if let Some(l) = &p.latency {
            let _ = writeln!(
                o,
                "\nSelect-only at {}/s ({} clients, from pgbench's per-transaction log): direct p50 {} / p99 {} ms, through the sidecar p50 {} / p99 {} ms: added p50 **{:+.3} ms**, added p99 **{:+.3} ms** (achieved {:.0} / {:.0} tps).",
                l.rate,
                l.clients,
                ms(l.direct.p50_ms),
                ms(l.direct.p99_ms),
                ms(l.sidecar.p50_ms),
                ms(l.sidecar.p99_ms),
                l.sidecar.p50_ms - l.direct.p50_ms,
                l.sidecar.p99_ms - l.direct.p99_ms,
                l.direct_tps,
                l.sidecar_tps
            );
        }
        if let Some(m) = &p.memory {
            let _ = writeln!(
                o,
                "\nSidecar memory with {} idle connections: RSS **{:.1} MB** (peak {:.1} MB; {:.1} MB before they opened).",
                m.connections, m.rss_mb, m.peak_rss_mb, m.rss_before_mb
            );
        }
        for n in &p.notes {
            let _ = writeln!(o, "\n- {n}");
        }
    }

    fn search_section(&self, o: &mut String) {
        let Some(s) = &self.search else { return };
        let _ = writeln!(
            o,
            "\n## Rate search of {} (highest rate with p99 acquire < {} ms and no errors)\n",
            s.system, s.p99_bound_ms
        );
        let _ = writeln!(
            o,
            "Each step: a fresh 3-node cluster, a warm-up, then {:.0} s measured; rates, active set and resources scaled together.\n",
            s.step_seconds
        );
        let _ = writeln!(o, "| scale | offered ops/s | ok ops/s | acquire p99 ms | errors | pass | why |");
        let _ = writeln!(o, "|--:|--:|--:|--:|--:|---|---|");
        for st in &s.steps {
            let _ = writeln!(
                o,
                "| {:.2} | {:.0} | {:.0} | {} | {} | {} | {} |",
                st.scale,
                st.offered_per_s,
                st.ok_per_s,
                ms(st.acquire_p99_ms),
                st.errors,
                if st.pass { "yes" } else { "no" },
                st.why
            );
        }
        match s.highest_pass {
            Some((scale, rate)) => {
                let _ = writeln!(
                    o,
                    "\nHighest passing: ×{scale:.2} the configured workload = **{rate:.0} offered ops/s**."
                );
            }
            None => {
                let _ = writeln!(o, "\nNo step passed.");
            }
        }
    }
}

/// "fencer steady: node 1 110 → 130 MB (+40 MB/min), …" from the samples.
fn memory_growth(r: &RunReport) -> Option<String> {
    let (first, last) = (r.memory.first()?, r.memory.last()?);
    let minutes = (last.second.saturating_sub(first.second)) as f64 / 60.0;
    if minutes <= 0.0 {
        return None;
    }
    let nodes: Vec<String> = first
        .rss_mb
        .iter()
        .filter_map(|(id, a)| {
            let b = *last.rss_mb.get(id)?;
            (b > 0.0).then(|| format!("node {id} {a:.0} → {b:.0} MB ({:+.1} MB/min)", (b - a) / minutes))
        })
        .collect();
    Some(format!("{} {} over {:.0} s: {}", r.system, scenario_label(r), minutes * 60.0, nodes.join(", ")))
}

fn scenario_label(r: &RunReport) -> String {
    if (r.scale - 1.0).abs() < 1e-9 { r.scenario.clone() } else { format!("{} ×{:.2}", r.scenario, r.scale) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::new_histogram;

    #[test]
    fn percentiles_come_from_the_histogram_in_ms() {
        let mut h = new_histogram();
        for us in 1..=1000u64 {
            h.record(us * 100).unwrap();
        }
        let l = Latency::of(&h);
        assert_eq!(l.count, 1000);
        assert!((l.p50_ms - 50.0).abs() < 0.1, "{l:?}");
        assert!((l.p99_ms - 99.0).abs() < 0.1, "{l:?}");
        assert!((l.max_ms - 100.0).abs() < 0.1, "{l:?}");
        assert_eq!(Latency::of(&new_histogram()), Latency::default());
    }

    #[test]
    fn the_outage_is_the_longest_gap_around_the_kill() {
        // Successes every ms, a kill at 10 ms, nothing from 10.2 ms to 2 s,
        // but one reply that was already on its way lands at 10.1 ms.
        let mut s: Vec<u64> = (0..10).map(|i| i * 1000).collect();
        s.push(10_100);
        s.extend((0..100).map(|i| 2_000_000 + i * 1000));
        let (start, end) = outage(&mut s, 10_000);
        assert_eq!((start, end), (10_100, Some(2_000_000)));
        let mut none = vec![1, 2, 3];
        assert_eq!(outage(&mut none, 10), (3, None));
    }

    #[test]
    fn markdown_has_the_tables() {
        let report = sample_report();
        let md = report.markdown();
        assert!(md.contains("| fencer | steady | 6000 | 5990 |"), "{md}");
        assert!(md.contains("## fencer side by side"), "{md}");
        assert!(md.contains("| etcd | 5990 / 3000 | 2.00× | 4.00 / 40.0 | 10.00× |"), "{md}");
        assert!(md.contains("SHED 3"), "{md}");
        assert!(md.contains("= **10.0 %** of the ceiling"), "{md}");
        let json: serde_json::Value = serde_json::to_value(&report).unwrap();
        assert_eq!(json["runs"][0]["ops"]["acquire"]["latency"]["p99_ms"], 4.0);
    }

    #[test]
    fn the_proxy_section_splits_the_proxys_cpu_into_forwarding_and_fence() {
        let result = |per_s: f64| RateResult { ops: 1, errors: 0, seconds: 1.0, per_s, latency: Latency::default() };
        let mut report = sample_report();
        report.proxy = Some(ProxyReport {
            seconds_per_run: 10.0,
            rates: vec![ProxyRate {
                rate: 5000,
                direct: result(5000.0),
                proxy: result(5000.0),
                added_p50_ms: 0.1,
                added_p99_ms: 0.5,
                warm_up_p99_ms: [2.5, 180.0],
            }],
            throughput: Some(ProxyThroughput {
                concurrency: 64,
                direct: ClosedRun { result: result(60_000.0), cpu_us_per_request: 30.0 },
                proxy: ClosedRun { result: result(24_000.0), cpu_us_per_request: 80.0 },
                bare: ClosedRun { result: result(30_000.0), cpu_us_per_request: 65.0 },
                relay: ClosedRun { result: result(42_000.0), cpu_us_per_request: 43.0 },
            }),
        });
        let md = report.markdown();
        assert!(md.contains("| +0.100 | +0.500 | 0 / 0 | 2.50 / 180 |"), "{md}");
        assert!(md.contains("| through `fencer proxy` | **24000** | 40 % | 0.00 | 0 | 80.0 | +50.0 |"), "{md}");
        assert!(md.contains("| through a bare hyper forwarder (no fence) | **30000** | 50 % |"), "{md}");
        assert!(md.contains("(proxy − bare forwarder): **+15.0 µs/request** of the proxy's +50.0"), "{md}");
        assert!(md.contains("| through a raw TCP relay (no HTTP, no fence) | **42000** | 70 % |"), "{md}");
        assert!(md.contains("The raw relay's share, **70 %**, bounds"), "{md}");
        let json = serde_json::to_value(&report).unwrap();
        let proxied = &json["proxy"]["throughput"]["proxy"];
        assert_eq!((proxied["per_s"].as_f64(), proxied["cpu_us_per_request"].as_f64()), (Some(24_000.0), Some(80.0)));
    }

    fn sample_report() -> Report {
        let workload = WorkloadConfig {
            resources: 100_000,
            active: 20_000,
            acquire_rate: 2000.0,
            release_rate: 2000.0,
            fill_rate: 4000.0,
            renew_every: std::time::Duration::from_secs(10),
            ttl: std::time::Duration::from_secs(30),
            duration: std::time::Duration::from_secs(60),
            warmup_max: std::time::Duration::from_secs(60),
            max_in_flight: 10_000,
            op_timeout: std::time::Duration::from_secs(5),
            seed: 1,
        };
        let run = |system: &str, ok_per_s: f64, p99: f64| {
            let latency = Latency {
                count: 10,
                p50_ms: p99 / 2.0,
                p95_ms: p99,
                p99_ms: p99,
                p999_ms: p99,
                max_ms: p99,
                mean_ms: p99,
            };
            let mut errors_by_kind = BTreeMap::new();
            errors_by_kind.insert("SHED".to_string(), 3);
            let op = OpReport {
                intended: 10,
                ok: 10,
                ok_per_s: 2000.0,
                errors: 3,
                errors_by_kind,
                warmup_ok: 0,
                warmup_errors_by_kind: BTreeMap::new(),
                error_examples: BTreeMap::new(),
                latency,
            };
            RunReport {
                system: system.into(),
                scenario: "steady".into(),
                scale: 1.0,
                acquire_rate: 2000.0,
                release_rate: 2000.0,
                active: 20_000,
                offered_per_s: 6000.0,
                measured_s: 60.0,
                warmup_s: 5.0,
                warmup_reached: true,
                ops: Op::ALL.iter().map(|o| (*o, op.clone())).collect(),
                ok_per_s,
                errors: 9,
                held_at_end: 20_000,
                quarantined_resources: 0,
                abandoned_in_flight: 0,
                peak_in_flight: 40,
                bench_cpu_cores: 0.5,
                nodes: vec![],
                server: vec![],
                failover: None,
                timeline: vec![],
                memory: vec![],
                notes: vec![],
            }
        };
        Report {
            title: "fencer bench".into(),
            label: "test".into(),
            fencer_version: "0.1.0".into(),
            started_unix_s: 0,
            command: "fencer bench".into(),
            machine: Machine::default(),
            workload,
            runs: vec![run("fencer", 5990.0, 4.0), run("etcd", 3000.0, 40.0)],
            ceiling: Some(CeilingReport {
                writers: 256,
                commits: Some(RateResult {
                    ops: 1,
                    errors: 0,
                    seconds: 1.0,
                    per_s: 59_900.0,
                    latency: Latency::default(),
                }),
                fsync: None,
                notes: vec![],
            }),
            proxy: None,
            postgres: None,
            search: None,
            notes: vec![],
        }
    }
}
