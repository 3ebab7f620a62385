//! Server-side figures: a coordinator's `/metrics` (fetched and parsed with
//! the test kit's HTTP GET and exposition parser), a process's memory and
//! CPU from `/proc`, and a description of the machine. Everything here is
//! best effort: a missing figure is reported as absent, never invented.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use fencer_testkit::http_get;
use fencer_testkit::metrics::Exposition;

/// The coordinator histograms whose means explain where the time goes.
pub(crate) const COORDINATOR_HISTOGRAMS: &[&str] = &[
    "fencer_raft_log_fsync_duration_seconds",
    "fencer_raft_log_group_ops",
    "fencer_raft_commit_duration_seconds",
    "fencer_raft_apply_duration_seconds",
    "fencer_raft_apply_batch_entries",
    "fencer_snapshot_build_duration_seconds",
    "fencer_batch_items",
];

/// `(sum, count)` of a Prometheus histogram, added over its label sets.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub(crate) struct SumCount {
    pub(crate) sum: f64,
    pub(crate) count: f64,
}

impl SumCount {
    /// Mean of the observations between two scrapes.
    pub(crate) fn mean_since(&self, before: &SumCount) -> Option<f64> {
        let n = self.count - before.count;
        (n > 0.0).then(|| (self.sum - before.sum) / n)
    }
}

/// Reads `NAME_sum` and `NAME_count` of each histogram in `names` that the
/// scrape has.
pub(crate) fn parse_histograms(text: &str, names: &[&str]) -> BTreeMap<String, SumCount> {
    let scrape = Exposition::parse(text);
    let exposed = scrape.names();
    names
        .iter()
        .filter(|name| {
            exposed.contains(format!("{name}_sum").as_str()) || exposed.contains(format!("{name}_count").as_str())
        })
        .map(|name| {
            let (sum, count) = scrape.sum_count(name);
            (name.to_string(), SumCount { sum, count })
        })
        .collect()
}

/// What one scrape of a node's `/metrics` says.
#[derive(Debug, Clone, Default)]
pub(crate) struct Scrape {
    /// The histograms of [`COORDINATOR_HISTOGRAMS`] that it has.
    pub(crate) histograms: BTreeMap<String, SumCount>,
    /// `fencer_leader_changes_total`: leader changes this node has seen.
    pub(crate) leader_changes: Option<f64>,
    /// `fencer_raft_is_leader`.
    pub(crate) is_leader: Option<bool>,
}

impl Scrape {
    pub(crate) fn parse(text: &str) -> Self {
        let scrape = Exposition::parse(text);
        let exposed = scrape.names();
        let value = |name: &str| exposed.contains(name).then(|| scrape.get(name));
        Self {
            histograms: parse_histograms(text, COORDINATOR_HISTOGRAMS),
            leader_changes: value("fencer_leader_changes_total"),
            is_leader: value("fencer_raft_is_leader").map(|v| v >= 1.0),
        }
    }
}

/// Scrapes one node's coordinator figures.
pub(crate) async fn scrape(addr: SocketAddr) -> Option<Scrape> {
    match http_get(addr, "/metrics", Duration::from_secs(3)).await {
        Ok((200, body)) => Some(Scrape::parse(&body)),
        _ => None,
    }
}

/// Memory and CPU of one process.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub(crate) struct ProcStats {
    /// Resident set size, bytes.
    pub(crate) rss_bytes: u64,
    /// Peak resident set size, bytes.
    pub(crate) peak_rss_bytes: u64,
    /// User + system CPU time, seconds.
    pub(crate) cpu_seconds: f64,
}

/// Clock ticks per second of `/proc/PID/stat` (USER_HZ; 100 on Linux).
const USER_HZ: f64 = 100.0;

/// Reads `/proc/PID/status` and `/proc/PID/stat` (`self` for this process).
pub(crate) fn proc_stats(pid: &str) -> Option<ProcStats> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .map(|k| k * 1024)
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat.rsplit_once(')').map(|(_, r)| r)?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 here.
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    Some(ProcStats {
        rss_bytes: kb("VmRSS:").unwrap_or(0),
        peak_rss_bytes: kb("VmHWM:").unwrap_or(0),
        cpu_seconds: (ticks(11) + ticks(12)) / USER_HZ,
    })
}

/// The machine a run happened on, and how busy it was.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub(crate) struct Machine {
    pub(crate) cpu_model: String,
    pub(crate) cpus: usize,
    pub(crate) memory_gib: f64,
    pub(crate) kernel: String,
    /// `/proc/loadavg` when the bench started and ended.
    pub(crate) load_at_start: String,
    pub(crate) load_at_end: String,
    /// Filesystem type and device of the data dirs.
    pub(crate) data_filesystem: String,
}

impl Machine {
    pub(crate) fn describe(data_dir: &std::path::Path) -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let mem_kb = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0);
        Self {
            cpu_model,
            cpus: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            memory_gib: (mem_kb / 1024.0 / 1024.0 * 10.0).round() / 10.0,
            kernel: read_trimmed("/proc/sys/kernel/osrelease"),
            load_at_start: read_trimmed("/proc/loadavg"),
            load_at_end: String::new(),
            data_filesystem: filesystem_of(data_dir),
        }
    }

    pub(crate) fn finish(&mut self) {
        self.load_at_end = read_trimmed("/proc/loadavg");
    }
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path).map(|s| s.trim().to_string()).unwrap_or_default()
}

/// The longest mount point of `/proc/mounts` containing `dir`.
fn filesystem_of(dir: &std::path::Path) -> String {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 3 && dir.starts_with(f[1])).then(|| (f[1].len(), format!("{} on {} ({})", f[0], f[1], f[2])))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, s)| s)
        .unwrap_or_else(|| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_summed_over_label_sets() {
        let text = "\
# HELP fencer_raft_log_fsync_duration_seconds Durable group commit of the raft log.
# TYPE fencer_raft_log_fsync_duration_seconds histogram
fencer_raft_log_fsync_duration_seconds_sum 1.5
fencer_raft_log_fsync_duration_seconds_count 300
fencer_raft_log_fsync_duration_seconds_bucket{le=\"0.001\"} 10
fencer_raft_commit_duration_seconds_sum{op=\"a\"} 2.0
fencer_raft_commit_duration_seconds_count{op=\"a\"} 100
fencer_raft_commit_duration_seconds_sum{op=\"b\"} 1.0
fencer_raft_commit_duration_seconds_count{op=\"b\"} 100
";
        let h = parse_histograms(text, COORDINATOR_HISTOGRAMS);
        assert_eq!(h["fencer_raft_log_fsync_duration_seconds"], SumCount { sum: 1.5, count: 300.0 });
        assert_eq!(h["fencer_raft_commit_duration_seconds"], SumCount { sum: 3.0, count: 200.0 });
        let before = SumCount { sum: 1.0, count: 100.0 };
        assert_eq!(h["fencer_raft_commit_duration_seconds"].mean_since(&before), Some(0.02));
        assert_eq!(before.mean_since(&before), None);
    }

    #[test]
    fn a_scrape_reads_leader_changes_and_the_role() {
        let text = "\
# TYPE fencer_leader_changes_total counter
fencer_leader_changes_total 3
# TYPE fencer_raft_is_leader gauge
fencer_raft_is_leader 1
";
        let s = Scrape::parse(text);
        assert_eq!((s.leader_changes, s.is_leader), (Some(3.0), Some(true)));
        let s = Scrape::parse("fencer_raft_is_leader 0\n");
        assert_eq!((s.leader_changes, s.is_leader), (None, Some(false)), "absent is absent, not 0");
    }

    #[test]
    fn this_process_has_stats() {
        let s = proc_stats("self").expect("linux /proc");
        assert!(s.rss_bytes > 0 && s.peak_rss_bytes >= s.rss_bytes);
    }
}
