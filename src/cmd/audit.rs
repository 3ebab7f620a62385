//! `fencer audit`: read a node's audit log — every change it applied to
//! the lock table, one JSON line each (docs/operations.md, "Audit log") —
//! filtered by resource, lease, request, operation and time. Audit files
//! are local to a node: run this where the files are, or copy them.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use fencer_coordinator::{AUDIT_DIR, AuditOp, AuditRecord, audit_files};

use super::parse_duration;
use crate::output::{OutputFormat, print_table};

/// Arguments of `fencer audit`.
#[derive(Debug, clap::Args)]
#[command(group = clap::ArgGroup::new("where").required(true))]
pub(crate) struct AuditArgs {
    /// The node's data dir (its audit log is in DATA_DIR/audit).
    #[arg(long, group = "where", env = "FENCER_DATA_DIR")]
    data_dir: Option<PathBuf>,

    /// The audit dir itself (a node started with --audit-dir, or copied files).
    #[arg(long, group = "where", env = "FENCER_AUDIT_DIR")]
    audit_dir: Option<PathBuf>,

    /// Only this resource.
    #[arg(long)]
    resource: Option<String>,

    /// Only resources starting with this prefix.
    #[arg(long)]
    prefix: Option<String>,

    /// Only this lease (its whole life: queued, granted or promoted,
    /// renewed, ended).
    #[arg(long)]
    lease: Option<String>,

    /// Only this request id.
    #[arg(long)]
    request_id: Option<String>,

    /// Only these operations (repeatable): acquire, renew, release, expire,
    /// force_release, promote, cancel_wait, membership, snapshot_installed.
    #[arg(long = "op", value_parser = parse_op)]
    ops: Vec<AuditOp>,

    /// Only changes at or after this time: RFC 3339 (`2025-01-31T09:00:00Z`)
    /// or a duration ago (`15m`).
    #[arg(long, value_parser = parse_time)]
    since: Option<SystemTime>,

    /// Only changes before this time: RFC 3339 or a duration ago.
    #[arg(long, value_parser = parse_time)]
    until: Option<SystemTime>,

    /// Show only the newest N matching lines.
    #[arg(long)]
    limit: Option<usize>,

    /// `table` for people, `json` for one record per line (JSON lines, as in
    /// the files).
    #[arg(short = 'o', long = "output", env = "FENCER_OUTPUT", value_enum, default_value_t)]
    output: OutputFormat,
}

/// Rows printed at once by a table without `--limit`.
const TABLE_BLOCK: usize = 1000;
const HEADER: [&str; 9] = ["TIME", "INDEX", "OP", "OUTCOME", "RESOURCE", "TOKEN", "LEASE", "HOLDER", "DETAIL"];

fn parse_op(s: &str) -> Result<AuditOp, String> {
    s.parse()
}

fn parse_time(s: &str) -> Result<SystemTime, String> {
    if let Ok(t) = humantime::parse_rfc3339_weak(s.trim()) {
        return Ok(t);
    }
    let ago = parse_duration(s).map_err(|_| format!("{s:?} is neither an RFC 3339 time nor a duration like 15m"))?;
    SystemTime::now().checked_sub(ago).ok_or_else(|| format!("{s:?} reaches before 1970"))
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

struct Filter {
    resource: Option<String>,
    prefix: Option<String>,
    lease: Option<String>,
    request_id: Option<String>,
    ops: Vec<AuditOp>,
    since_ms: Option<u64>,
    until_ms: Option<u64>,
}

impl Filter {
    fn matches(&self, r: &AuditRecord) -> bool {
        let eq = |want: &Option<String>, got: &Option<String>| want.as_ref().is_none_or(|w| got.as_ref() == Some(w));
        if !eq(&self.resource, &r.resource) || !eq(&self.lease, &r.lease_id) || !eq(&self.request_id, &r.request_id) {
            return false;
        }
        if let Some(p) = &self.prefix
            && !r.resource.as_deref().is_some_and(|res| res.starts_with(p.as_str()))
        {
            return false;
        }
        if !self.ops.is_empty() && !self.ops.contains(&r.op) {
            return false;
        }
        if self.since_ms.is_some() || self.until_ms.is_some() {
            let Some(t) = r.unix_ms() else { return false };
            if self.since_ms.is_some_and(|s| t < s) || self.until_ms.is_some_and(|u| t >= u) {
                return false;
            }
        }
        true
    }
}

fn detail(r: &AuditRecord) -> String {
    let mut parts = Vec::new();
    if let Some(c) = &r.caller {
        parts.push(format!("caller={c}"));
    }
    if let Some(why) = &r.reason {
        parts.push(format!("reason={why:?}"));
    }
    if let Some(p) = r.queue_position {
        parts.push(format!("position={p}"));
    }
    if let Some(ms) = r.held_ms {
        parts.push(format!("held={:?}", Duration::from_millis(ms)));
    }
    if let Some(v) = &r.voters {
        parts.push(format!("voters={v:?}"));
    }
    if let Some(l) = r.learners.as_ref().filter(|l| !l.is_empty()) {
        parts.push(format!("learners={l:?}"));
    }
    if let Some(k) = &r.key_id {
        parts.push(format!("key={k}"));
    }
    if let Some(n) = r.key_node {
        parts.push(format!("node={n}"));
    }
    if let Some(ms) = r.not_before_unix_ms {
        parts.push(format!("not_before={ms}"));
    }
    if let Some(ms) = r.not_after_unix_ms {
        parts.push(format!("not_after={ms}"));
    }
    parts.join(" ")
}

fn row(r: &AuditRecord) -> Vec<String> {
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    vec![
        r.time.clone(),
        if r.part == 0 { r.log_index.to_string() } else { format!("{}.{}", r.log_index, r.part) },
        r.op.as_str().to_string(),
        serde_json::to_value(r.outcome).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default(),
        opt(&r.resource),
        r.token.map_or_else(|| "-".into(), |t| t.to_string()),
        opt(&r.lease_id),
        opt(&r.holder),
        detail(r),
    ]
}

pub(crate) async fn run(args: AuditArgs) -> anyhow::Result<ExitCode> {
    let dir = match (&args.audit_dir, &args.data_dir) {
        (Some(d), _) => d.clone(),
        (None, Some(d)) => d.join(AUDIT_DIR),
        (None, None) => anyhow::bail!("give --data-dir or --audit-dir"),
    };
    let filter = Filter {
        resource: args.resource,
        prefix: args.prefix,
        lease: args.lease,
        request_id: args.request_id,
        ops: args.ops,
        since_ms: args.since.map(unix_ms),
        until_ms: args.until.map(unix_ms),
    };
    let (output, limit) = (args.output, args.limit);
    // Files are read as streams: the audit dir may hold gigabytes.
    tokio::task::spawn_blocking(move || print_matching(&dir, &filter, output, limit)).await?
}

fn print_matching(
    dir: &std::path::Path,
    filter: &Filter,
    output: OutputFormat,
    limit: Option<usize>,
) -> anyhow::Result<ExitCode> {
    let files = audit_files(dir).with_context(|| format!("cannot list the audit dir {}", dir.display()))?;
    let mut kept: VecDeque<AuditRecord> = VecDeque::new();
    let mut rows = Vec::new();
    let mut unreadable = 0u64;
    // Positions only grow; a line seen twice (a rotation while reading) is
    // skipped, and said so.
    let mut last: Option<(u64, u32)> = None;
    let mut out_of_order = 0u64;
    let stdout = std::io::stdout();
    for path in files {
        let file = match std::fs::File::open(&path) {
            Ok(f) => f,
            // Rotated away while listing.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("cannot open {}", path.display())),
        };
        for line in BufReader::new(file).split(b'\n') {
            let line = line.with_context(|| format!("cannot read {}", path.display()))?;
            if line.is_empty() {
                continue;
            }
            let Ok(r) = serde_json::from_slice::<AuditRecord>(&line) else {
                unreadable += 1;
                continue;
            };
            if last.is_some_and(|l| r.position() <= l) {
                out_of_order += 1;
                continue;
            }
            last = Some(r.position());
            if !filter.matches(&r) {
                continue;
            }
            match (limit, output) {
                (Some(n), _) => {
                    kept.push_back(r);
                    if kept.len() > n {
                        kept.pop_front();
                    }
                }
                (None, OutputFormat::Json) => {
                    use std::io::Write as _;
                    let mut out = stdout.lock();
                    serde_json::to_writer(&mut out, &r)?;
                    writeln!(out)?;
                }
                (None, OutputFormat::Table) => {
                    rows.push(row(&r));
                    // Bounded memory: a long listing is printed in blocks,
                    // each with its header and its own column widths.
                    if rows.len() == TABLE_BLOCK {
                        print_table(&HEADER, &rows);
                        rows.clear();
                    }
                }
            }
        }
    }
    match output {
        OutputFormat::Json => {
            use std::io::Write as _;
            let mut out = stdout.lock();
            for r in &kept {
                serde_json::to_writer(&mut out, r)?;
                writeln!(out)?;
            }
        }
        OutputFormat::Table => {
            rows.extend(kept.iter().map(row));
            print_table(&HEADER, &rows);
        }
    }
    if out_of_order > 0 {
        eprintln!(
            "fencer: {out_of_order} line(s) not after the line before them were skipped (a rotation while reading shows a line twice; otherwise the files were edited or copied together)"
        );
    }
    if unreadable > 0 {
        eprintln!(
            "fencer: {unreadable} line(s) could not be read (a torn write after a crash, or not an audit record)"
        );
    }
    Ok(ExitCode::SUCCESS)
}
