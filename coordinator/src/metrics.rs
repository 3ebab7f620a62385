//! Prometheus metrics of a coordinator node (DESIGN §6), prefix `fencer_`,
//! base units, real histograms. No resource name is ever a label: the
//! busiest resources are served by the hot-resources endpoint instead.
//! `docs/operations.md` says what each metric means and which alert reads it.
//!
//! Every label value a metric can take is created at start, so a series
//! exists (at 0) before its first event and `rate()` sees its first
//! increment.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// The `op` label values of the lock API metrics. `acquire` is an Acquire
/// that does not wait (the latency objective of DESIGN §0 applies to it);
/// `acquire_wait` one that may queue, whose latency includes the wait.
pub const OPS: [&str; 7] = ["acquire", "acquire_wait", "renew", "release", "get", "list", "force_release"];
/// The `outcome` label values (DESIGN §6).
pub const OUTCOMES: [&str; 7] = ["ok", "conflict", "timeout", "not_holder", "invalid", "unavailable", "unknown"];

/// Labels of the per-operation metrics.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    /// One of [`OPS`].
    pub op: &'static str,
}

/// Labels of the per-operation outcome counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// One of [`OPS`].
    pub op: &'static str,
    /// One of [`OUTCOMES`].
    pub outcome: &'static str,
}

/// Labels of the waiter-limit refusals.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabels {
    /// `per_resource` or `total`.
    pub limit: &'static str,
}

/// The `reason` label values of [`Metrics::snapshots_refused`]: a stream
/// that ended before the length its first chunk declared (its sender
/// cancelled it), one that carried more, and one this node could not write
/// down (a full disk).
pub const SNAPSHOT_REFUSALS: [&str; 3] = ["cut_short", "too_long", "not_stored"];

/// Labels of the refused-snapshot counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabels {
    /// One of [`SNAPSHOT_REFUSALS`].
    pub reason: &'static str,
}

/// Labels of the build info gauge.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    /// The fencer version.
    pub version: &'static str,
}

/// 100 µs to ~490 s in steps of 1.5×: a quantile read from it is within
/// about ±20% (one bucket), from a fast local commit to the longest queue wait.
fn request_latency() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 1.5, 39))
}

/// 100 µs to ~13 s in steps of 1.5×, for raft, disk and apply timings.
fn latency() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 1.5, 30))
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
    /// The cluster-wide waiter limit (policy), for saturation alerts.
    pub waiters_limit: Gauge,
    /// The per-resource waiter limit (policy).
    pub waiters_per_resource_limit: Gauge,
    /// Acquires refused because a waiter limit was reached.
    pub waiter_limit_rejections: Family<LimitLabels, Counter>,
    /// Requests parked on this node waiting for a lock.
    pub parked_calls: Gauge,
    /// Leases ended by expiry.
    pub expirations: Counter,
    /// Renewals refused (not holder, expired, unavailable).
    pub renew_failures: Counter,
    /// Renewals confirmed by a quorum round without a log entry.
    pub renewals_confirmed: Counter,
    /// Acquires answered from the dedup table (retries).
    pub dedup_hits: Counter,
    /// Connections closed at accept because the port had its maximum open
    /// (`ConnectionLimits::max_connections`).
    pub connections_refused: Counter,
    /// Times this node saw the cluster's leader change.
    pub leader_changes: Counter,
    /// Current raft term.
    pub term: Gauge,
    /// 1 when this node is the leader.
    pub is_leader: Gauge,
    /// 1 when this node knows a leader.
    pub has_leader: Gauge,
    /// 1 when `/readyz` answers 200 (refreshed at each scrape).
    pub ready: Gauge,
    /// 1 on a leader that took over its leases and has a quorum.
    pub leader_ready: Gauge,
    /// On the leader: seconds since a quorum last acknowledged it (0 elsewhere).
    pub quorum_ack_age: Gauge<f64, AtomicU64>,
    /// The longest election timeout: the quorum-acknowledgement bound of readiness.
    pub election_timeout: Gauge<f64, AtomicU64>,
    /// Propose → applied latency of writes.
    pub commit_seconds: Histogram,
    /// Time to apply one batch to the in-memory state machine.
    pub apply_seconds: Histogram,
    /// Entries per applied batch.
    pub apply_batch_entries: Histogram,
    /// Items per Batch call received (the client library's batching).
    pub batch_items: Histogram,
    /// Time of one durable raft-log group commit (write + fdatasync).
    pub fsync_seconds: Histogram,
    /// Operations covered by one group commit.
    pub group_commit_ops: Histogram,
    /// Time of one flush of the audit log by the persister (the lock state is
    /// persisted only in snapshot files; the name is kept for dashboards).
    pub state_persist_seconds: Histogram,
    /// Size of the latest snapshot.
    pub snapshot_bytes: Gauge,
    /// Time to build a snapshot.
    pub snapshot_build_seconds: Histogram,
    /// Snapshots sent to this node that it refused, with nothing installed,
    /// by one of [`SNAPSHOT_REFUSALS`].
    pub snapshots_refused: Family<RefusalLabels, Counter>,
    /// Last applied log index.
    pub applied_index: Gauge,
    /// Committed log index.
    pub commit_index: Gauge,
    /// Audit lines written.
    pub audit_lines: Counter,
    /// Audit lines of re-applied entries that the file already held.
    pub audit_lines_skipped: Counter,
    /// Audit file rotations.
    pub audit_rotations: Counter,
    /// Always 1, labelled with the version.
    pub build_info: Family<BuildLabels, Gauge>,
}

/// The health figures the scrape refreshes (see `LockService::health`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct HealthGauges {
    pub(crate) ready: bool,
    pub(crate) has_leader: bool,
    pub(crate) leader_ready: bool,
    pub(crate) quorum_ack_age: Option<Duration>,
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Arc<Self> {
        let mut registry = Registry::with_prefix("fencer");
        let m = Self {
            requests: Family::default(),
            request_seconds: Family::new_with_constructor(request_latency),
            locks_held: Gauge::default(),
            waiters: Gauge::default(),
            waiters_limit: Gauge::default(),
            waiters_per_resource_limit: Gauge::default(),
            waiter_limit_rejections: Family::default(),
            parked_calls: Gauge::default(),
            expirations: Counter::default(),
            renew_failures: Counter::default(),
            renewals_confirmed: Counter::default(),
            dedup_hits: Counter::default(),
            connections_refused: Counter::default(),
            leader_changes: Counter::default(),
            term: Gauge::default(),
            is_leader: Gauge::default(),
            has_leader: Gauge::default(),
            ready: Gauge::default(),
            leader_ready: Gauge::default(),
            quorum_ack_age: Gauge::default(),
            election_timeout: Gauge::default(),
            commit_seconds: latency(),
            apply_seconds: latency(),
            apply_batch_entries: Histogram::new(exponential_buckets(1.0, 2.0, 14)),
            batch_items: Histogram::new(exponential_buckets(1.0, 2.0, 9)),
            fsync_seconds: latency(),
            group_commit_ops: Histogram::new(exponential_buckets(1.0, 2.0, 14)),
            state_persist_seconds: latency(),
            snapshot_bytes: Gauge::default(),
            snapshot_build_seconds: latency(),
            snapshots_refused: Family::default(),
            applied_index: Gauge::default(),
            commit_index: Gauge::default(),
            audit_lines: Counter::default(),
            audit_lines_skipped: Counter::default(),
            audit_rotations: Counter::default(),
            build_info: Family::default(),
            registry: Registry::default(),
        };
        for op in OPS {
            let _ = m.request_seconds.get_or_create(&OpLabels { op });
            for outcome in OUTCOMES {
                let _ = m.requests.get_or_create(&OutcomeLabels { op, outcome });
            }
        }
        for limit in ["per_resource", "total"] {
            let _ = m.waiter_limit_rejections.get_or_create(&LimitLabels { limit });
        }
        for reason in SNAPSHOT_REFUSALS {
            let _ = m.snapshots_refused.get_or_create(&RefusalLabels { reason });
        }
        m.build_info.get_or_create(&BuildLabels { version: env!("CARGO_PKG_VERSION") }).set(1);

        let r = &mut registry;
        r.register("requests", "Lock API requests by operation and outcome", m.requests.clone());
        r.register_with_unit(
            "request_duration",
            "Lock API request latency by operation, as the server saw it",
            Unit::Seconds,
            m.request_seconds.clone(),
        );
        r.register("locks_held", "Locks currently held", m.locks_held.clone());
        r.register("waiters", "Requests currently queued for a lock", m.waiters.clone());
        r.register(
            "waiters_limit",
            "Most requests queued at once over all resources (policy)",
            m.waiters_limit.clone(),
        );
        r.register(
            "waiters_per_resource_limit",
            "Most requests queued at once for one resource (policy)",
            m.waiters_per_resource_limit.clone(),
        );
        r.register(
            "waiter_limit_rejections",
            "Acquires refused with TOO_MANY_WAITERS, by the limit that was reached",
            m.waiter_limit_rejections.clone(),
        );
        r.register("parked_calls", "Acquire calls parked on this node", m.parked_calls.clone());
        r.register("lease_expirations", "Leases ended by expiry", m.expirations.clone());
        r.register("renew_failures", "Renewals refused", m.renew_failures.clone());
        r.register(
            "renewals_confirmed",
            "Renewals confirmed by a quorum round on the leader, without a log entry",
            m.renewals_confirmed.clone(),
        );
        r.register("dedup_hits", "Acquires answered from the request-id table", m.dedup_hits.clone());
        r.register(
            "connections_refused",
            "Connections closed at accept because the port had its maximum open",
            m.connections_refused.clone(),
        );
        r.register("leader_changes", "Leader changes seen by this node", m.leader_changes.clone());
        r.register("raft_term", "Current raft term", m.term.clone());
        r.register("raft_is_leader", "1 when this node is the leader", m.is_leader.clone());
        r.register("raft_has_leader", "1 when this node knows a leader (on a follower: and heard from it within two election timeouts; set at each scrape)", m.has_leader.clone());
        r.register("ready", "1 when this node is ready (GET /readyz answers 200)", m.ready.clone());
        r.register(
            "leader_ready",
            "1 on a leader that took over its inherited leases and has a quorum",
            m.leader_ready.clone(),
        );
        r.register_with_unit(
            "raft_quorum_ack_age",
            "On the leader, time since a quorum last acknowledged it; 0 on other nodes",
            Unit::Seconds,
            m.quorum_ack_age.clone(),
        );
        r.register_with_unit(
            "raft_election_timeout",
            "The longest election timeout, which bounds the quorum-acknowledgement age of a ready leader",
            Unit::Seconds,
            m.election_timeout.clone(),
        );
        r.register_with_unit(
            "raft_commit_duration",
            "Propose-to-apply latency of writes",
            Unit::Seconds,
            m.commit_seconds.clone(),
        );
        r.register_with_unit(
            "raft_apply_duration",
            "Time to apply one batch in memory",
            Unit::Seconds,
            m.apply_seconds.clone(),
        );
        r.register("raft_apply_batch_entries", "Entries per applied batch", m.apply_batch_entries.clone());
        r.register("batch_items", "Items per Batch call received", m.batch_items.clone());
        r.register_with_unit(
            "raft_log_fsync_duration",
            "Durable group commit of the raft log",
            Unit::Seconds,
            m.fsync_seconds.clone(),
        );
        r.register("raft_log_group_ops", "Operations per raft-log group commit", m.group_commit_ops.clone());
        r.register_with_unit(
            "state_persist_duration",
            "One flush of the audit log by the persister thread (an fdatasync once a second)",
            Unit::Seconds,
            m.state_persist_seconds.clone(),
        );
        r.register_with_unit("snapshot_size", "Size of the latest snapshot", Unit::Bytes, m.snapshot_bytes.clone());
        r.register_with_unit(
            "snapshot_build_duration",
            "Time to build a snapshot",
            Unit::Seconds,
            m.snapshot_build_seconds.clone(),
        );
        r.register(
            "snapshots_refused",
            "Snapshots sent to this node that it refused, with nothing installed, by reason",
            m.snapshots_refused.clone(),
        );
        r.register("raft_applied_index", "Last applied log index", m.applied_index.clone());
        r.register("raft_commit_index", "Committed log index", m.commit_index.clone());
        r.register("audit_lines", "Audit log lines written", m.audit_lines.clone());
        r.register(
            "audit_lines_skipped",
            "Audit lines of entries re-applied after a restart that the audit log already held",
            m.audit_lines_skipped.clone(),
        );
        r.register("audit_rotations", "Audit file rotations", m.audit_rotations.clone());
        r.register("build_info", "Always 1; the version is a label", m.build_info.clone());
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

    /// Counts an Acquire refused by a waiter limit.
    pub(crate) fn waiter_limit_reached(&self, per_resource: bool) {
        let limit = if per_resource { "per_resource" } else { "total" };
        self.waiter_limit_rejections.get_or_create(&LimitLabels { limit }).inc();
    }

    /// Counts a snapshot refused for `reason`, one of [`SNAPSHOT_REFUSALS`].
    pub(crate) fn snapshot_refused(&self, reason: &'static str) {
        self.snapshots_refused.get_or_create(&RefusalLabels { reason }).inc();
    }

    /// How many snapshots this node refused for `reason`.
    pub fn snapshots_refused_for(&self, reason: &'static str) -> u64 {
        self.snapshots_refused.get_or_create(&RefusalLabels { reason }).get()
    }

    /// Sets the gauges that depend on time and raft state.
    pub(crate) fn set_health(&self, h: HealthGauges) {
        self.ready.set(i64::from(h.ready));
        self.has_leader.set(i64::from(h.has_leader));
        self.leader_ready.set(i64::from(h.leader_ready));
        self.quorum_ack_age.set(h.quorum_ack_age.map_or(0.0, |d| d.as_secs_f64()));
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
