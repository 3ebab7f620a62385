//! What a run did and what the checkers found, readable without a debugger:
//! operations by kind and outcome, the faults injected, and each violation
//! with the slice of history (and of the upstream's record) that shows it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use super::fenced_writes::UpstreamEvent;
use super::record::{Answer, Call, Op};

/// Violations of one invariant shown in full; the rest are counted.
const SHOWN_PER_INVARIANT: usize = 5;
/// Operations shown per violation, at most (the first and last ones).
const SLICE_MAX: usize = 40;

/// One broken rule, with the evidence.
#[derive(Debug, Clone)]
pub struct Violation {
    /// The invariant, e.g. `I1 single holder`.
    pub invariant: &'static str,
    /// What happened, in one or two sentences.
    pub message: String,
    /// Indexes into the history's operations that show it.
    pub ops: Vec<usize>,
    /// Indexes into the upstream's record that show it.
    pub upstream: Vec<usize>,
}

impl Violation {
    /// A violation of `invariant`, described by `message`.
    pub fn new(invariant: &'static str, message: String) -> Self {
        Self { invariant, message, ops: Vec::new(), upstream: Vec::new() }
    }

    /// The operations (indexes into the history) that show it.
    pub fn with_ops(mut self, ops: impl IntoIterator<Item = usize>) -> Self {
        self.ops.extend(ops);
        self.ops.sort_unstable();
        self.ops.dedup();
        self
    }

    /// The upstream events (indexes into its record) that show it.
    pub fn with_upstream(mut self, events: impl IntoIterator<Item = usize>) -> Self {
        self.upstream.extend(events);
        self.upstream.sort_unstable();
        self.upstream.dedup();
        self
    }
}

fn secs(d: Duration) -> String {
    format!("{:>8.3}s", d.as_secs_f64())
}

fn short(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

/// One operation on one line.
pub fn render_op(i: usize, op: &Op) -> String {
    let call = match &op.call {
        Call::Acquire { resource, request_id, ttl_ms } => format!("acquire {resource} rid={request_id} ttl={ttl_ms}ms"),
        Call::Renew { resource, lease_id } => format!("renew   {resource} lease={}", short(lease_id)),
        Call::Release { resource, lease_id } => format!("release {resource} lease={}", short(lease_id)),
        Call::Write { resource, token, write_id } => format!("write   {resource} token={token} id={write_id}"),
    };
    let answer = match &op.answer {
        Answer::Granted { lease_id, token, ttl_ms } => {
            format!("granted lease={} token={token} ttl={ttl_ms}ms", short(lease_id))
        }
        Answer::Renewed { token } => format!("renewed token={token}"),
        Answer::Refused { reason } => format!("refused {reason}"),
        Answer::Unavailable { reason } => format!("unknown ({})", reason.chars().take(60).collect::<String>()),
        Answer::Written { status } => format!("written {status}"),
        Answer::Fenced { epoch } => format!("409 fenced, epoch {epoch}"),
        other => other.kind().to_string(),
    };
    format!("[{i:>6}] {}..{} {:<14} {call} -> {answer}", secs(op.sent), secs(op.answered), op.client)
}

fn render_event(i: usize, e: &UpstreamEvent) -> String {
    match e {
        UpstreamEvent::Arrived { token, resource } => {
            format!("upstream[{i:>6}] arrived token={token} ({})", resource.as_deref().unwrap_or("?"))
        }
        UpstreamEvent::Applied { token, resource, write_id } => format!(
            "upstream[{i:>6}] applied token={token} ({}) id={}",
            resource.as_deref().unwrap_or("?"),
            write_id.as_deref().unwrap_or("?")
        ),
    }
}

/// Operations by kind and outcome: `acquire: granted 12, refused 3, …`.
/// Calls recorded by a relay in front of a node (client `relay->nN`: what
/// the node answered, including answers the fault layer then lost) are
/// counted apart from the clients' own view.
pub fn summary(ops: &[Op]) -> String {
    let mut out = String::new();
    for (title, relayed) in [("as the clients saw them", false), ("as the nodes answered them (relays)", true)] {
        let mut counts: BTreeMap<&str, BTreeMap<&str, usize>> = BTreeMap::new();
        for op in ops.iter().filter(|op| op.client.starts_with("relay") == relayed) {
            *counts.entry(op.call.kind()).or_default().entry(op.answer.kind()).or_default() += 1;
        }
        if counts.is_empty() {
            continue;
        }
        let _ = writeln!(out, " {title}:");
        for (kind, outcomes) in &counts {
            let total: usize = outcomes.values().sum();
            let parts: Vec<String> = outcomes.iter().map(|(o, n)| format!("{o} {n}")).collect();
            let _ = writeln!(out, "  {kind:<8} {total:>6}: {}", parts.join(", "));
        }
    }
    out
}

/// The whole report: summary, faults, violations with their slices.
pub fn render(
    title: &str,
    ops: &[Op],
    upstream: &[UpstreamEvent],
    faults: &[(Duration, String)],
    violations: &[Violation],
) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "==== {title} ====");
    let _ = writeln!(out, "operations: {}", ops.len());
    out.push_str(&summary(ops));
    let applied = upstream.iter().filter(|e| matches!(e, UpstreamEvent::Applied { .. })).count();
    let _ = writeln!(out, "upstream: {} events, {applied} writes applied", upstream.len());
    let _ = writeln!(out, "faults injected: {}", faults.len());
    for (at, what) in faults {
        let _ = writeln!(out, "  {} {what}", secs(*at));
    }
    let _ = writeln!(out, "violations: {}", violations.len());
    let mut by_invariant: BTreeMap<&str, Vec<&Violation>> = BTreeMap::new();
    for v in violations {
        by_invariant.entry(v.invariant).or_default().push(v);
    }
    for (invariant, vs) in by_invariant {
        let _ = writeln!(out, "---- {invariant}: {} violation(s)", vs.len());
        for v in vs.iter().take(SHOWN_PER_INVARIANT) {
            let _ = writeln!(out, "* {}", v.message);
            let shown: Vec<usize> = if v.ops.len() > SLICE_MAX {
                v.ops[..SLICE_MAX / 2].iter().chain(&v.ops[v.ops.len() - SLICE_MAX / 2..]).copied().collect()
            } else {
                v.ops.clone()
            };
            let mut ordered: Vec<usize> = shown;
            ordered.sort_by_key(|i| (ops[*i].sent, *i));
            for i in ordered {
                let _ = writeln!(out, "    {}", render_op(i, &ops[i]));
            }
            if v.ops.len() > SLICE_MAX {
                let _ = writeln!(out, "    … {} more operations", v.ops.len() - SLICE_MAX);
            }
            for i in v.upstream.iter().take(SLICE_MAX) {
                let _ = writeln!(out, "    {}", render_event(*i, &upstream[*i]));
            }
        }
        if vs.len() > SHOWN_PER_INVARIANT {
            let _ = writeln!(out, "  … and {} more of {invariant}", vs.len() - SHOWN_PER_INVARIANT);
        }
    }
    out
}
