//! Prometheus metrics of a coordinator node (DESIGN §6), prefix `fencer_`,
//! base units, real histograms. No resource name is ever a label.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// Labels of the per-operation metrics.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    /// acquire, renew, release, get, list, force_release.
    pub op: &'static str,
}

/// Labels of the per-operation outcome counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// The operation.
    pub op: &'static str,
    /// ok, conflict, timeout, not_holder, invalid, unavailable, unknown.
    pub outcome: &'static str,
}

fn latency() -> Histogram {
    // 100 µs .. ~2 s in steps of 1.6×: fine enough to read p50/p95/p99.
    Histogram::new(exponential_buckets(0.0001, 1.6, 22))
}

/// Every metric of a coordinator node.
pub struct Metrics {
    registry: Registry,
    /// Requests by operation and outcome.
    pub requests: Family<OutcomeLabels, Counter>,
    /// Request latency by operation, as the server saw it.
    pub request_seconds: Family<OpLabels, Histogram, fn() -> Histogram>,
    /// Currently held locks (applied state).
    pub locks_held: Gauge,
    /// Currently queued waiters (applied state).
    pub waiters: Gauge,
    /// Requests parked on this node waiting for a lock.
    pub parked_calls: Gauge,
    /// Leases ended by expiry.
    pub expirations: Counter,
    /// Renewals refused (not holder, expired, unavailable).
    pub renew_failures: Counter,
    /// Acquires answered from the dedup table (retries).
    pub dedup_hits: Counter,
    /// Times this node saw the cluster's leader change.
    pub leader_changes: Counter,
    /// Current raft term.
    pub term: Gauge,
    /// 1 when this node is the leader.
    pub is_leader: Gauge,
    /// Propose → applied latency of writes.
    pub commit_seconds: Histogram,
    /// Time to apply one batch to the state machine and persist it.
    pub apply_seconds: Histogram,
    /// Entries per applied batch.
    pub apply_batch_entries: Histogram,
    /// Time of one durable raft-log group commit (redb write + fsync).
    pub fsync_seconds: Histogram,
    /// Operations covered by one group commit.
    pub group_commit_ops: Histogram,
    /// Size of the latest snapshot.
    pub snapshot_bytes: Gauge,
    /// Time to build a snapshot.
    pub snapshot_build_seconds: Histogram,
    /// Last applied log index.
    pub applied_index: Gauge,
    /// Committed log index.
    pub commit_index: Gauge,
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Arc<Self> {
        let mut registry = Registry::with_prefix("fencer");
        let m = Self {
            requests: Family::default(),
            request_seconds: Family::new_with_constructor(latency),
            locks_held: Gauge::default(),
            waiters: Gauge::default(),
            parked_calls: Gauge::default(),
            expirations: Counter::default(),
            renew_failures: Counter::default(),
            dedup_hits: Counter::default(),
            leader_changes: Counter::default(),
            term: Gauge::default(),
            is_leader: Gauge::default(),
            commit_seconds: latency(),
            apply_seconds: latency(),
            apply_batch_entries: Histogram::new(exponential_buckets(1.0, 2.0, 14)),
            fsync_seconds: latency(),
            group_commit_ops: Histogram::new(exponential_buckets(1.0, 2.0, 14)),
            snapshot_bytes: Gauge::default(),
            snapshot_build_seconds: latency(),
            applied_index: Gauge::default(),
            commit_index: Gauge::default(),
            registry: Registry::default(),
        };
        registry.register("requests", "Lock API requests by operation and outcome", m.requests.clone());
        registry.register_with_unit(
            "request_duration",
            "Lock API request latency by operation",
            Unit::Seconds,
            m.request_seconds.clone(),
        );
        registry.register("locks_held", "Locks currently held", m.locks_held.clone());
        registry.register("waiters", "Requests currently queued for a lock", m.waiters.clone());
        registry.register("parked_calls", "Acquire calls parked on this node", m.parked_calls.clone());
        registry.register("lease_expirations", "Leases ended by expiry", m.expirations.clone());
        registry.register("renew_failures", "Renewals refused", m.renew_failures.clone());
        registry.register("dedup_hits", "Acquires answered from the request-id table", m.dedup_hits.clone());
        registry.register("leader_changes", "Leader changes seen by this node", m.leader_changes.clone());
        registry.register("raft_term", "Current raft term", m.term.clone());
        registry.register("raft_is_leader", "1 when this node is the leader", m.is_leader.clone());
        registry.register_with_unit(
            "raft_commit_duration",
            "Propose-to-apply latency of writes",
            Unit::Seconds,
            m.commit_seconds.clone(),
        );
        registry.register_with_unit(
            "raft_apply_duration",
            "Time to apply and persist one batch",
            Unit::Seconds,
            m.apply_seconds.clone(),
        );
        registry.register("raft_apply_batch_entries", "Entries per applied batch", m.apply_batch_entries.clone());
        registry.register_with_unit(
            "raft_log_fsync_duration",
            "Durable group commit of the raft log",
            Unit::Seconds,
            m.fsync_seconds.clone(),
        );
        registry.register("raft_log_group_ops", "Operations per raft-log group commit", m.group_commit_ops.clone());
        registry.register_with_unit(
            "snapshot_size",
            "Size of the latest snapshot",
            Unit::Bytes,
            m.snapshot_bytes.clone(),
        );
        registry.register_with_unit(
            "snapshot_build_duration",
            "Time to build a snapshot",
            Unit::Seconds,
            m.snapshot_build_seconds.clone(),
        );
        registry.register("raft_applied_index", "Last applied log index", m.applied_index.clone());
        registry.register("raft_commit_index", "Committed log index", m.commit_index.clone());
        Arc::new(Self { registry, ..m })
    }

    /// Counts one request and its latency.
    pub fn observe_request(&self, op: &'static str, outcome: &'static str, elapsed: Duration) {
        self.requests.get_or_create(&OutcomeLabels { op, outcome }).inc();
        self.request_seconds.get_or_create(&OpLabels { op }).observe(elapsed.as_secs_f64());
    }

    /// Records one raft-log group commit.
    pub(crate) fn observe_log_flush(&self, elapsed: Duration, ops: usize) {
        self.fsync_seconds.observe(elapsed.as_secs_f64());
        self.group_commit_ops.observe(ops as f64);
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            let _ = writeln!(out, "# encoding failed");
        }
        out
    }
}
