//! Proxy metrics (DESIGN §6): prefix `fencer_proxy_`, base units, real
//! histograms, and never a resource name as a label (hot resources are
//! visible through the admin API instead). Every label value is created at
//! start, so each series exists (at 0) before its first event.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use crate::core::rejections::RejectReason;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct KindLabels {
    /// `read` (an allow-listed HTTP route, a `read_only_users` PostgreSQL
    /// connection) or `write` (fenced).
    pub(crate) kind: &'static str,
}

/// Where a client connection was closed for being too slow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TimeoutStage {
    /// Nothing arrived within `timeouts.first_byte`.
    FirstByte,
    /// The TLS handshake did not finish within `timeouts.tls_handshake`.
    TlsHandshake,
    /// PostgreSQL: startup and authentication did not finish in time.
    Startup,
    /// The connection was idle longer than allowed.
    Idle,
    /// HTTP: a request head was not complete within `timeouts.header_read`.
    HeaderRead,
    /// HTTP: the client took longer than `timeouts.request_body` (in total)
    /// or `timeouts.body_idle` (in one pause) to send its request body.
    RequestBody,
    /// HTTP: the client stopped reading its answer for `timeouts.body_idle`.
    ClientNotReading,
}

impl TimeoutStage {
    const ALL: [Self; 7] = [
        Self::FirstByte,
        Self::TlsHandshake,
        Self::Startup,
        Self::Idle,
        Self::HeaderRead,
        Self::RequestBody,
        Self::ClientNotReading,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Self::FirstByte => "first_byte",
            Self::TlsHandshake => "tls_handshake",
            Self::Startup => "startup",
            Self::Idle => "idle",
            Self::HeaderRead => "header_read",
            Self::RequestBody => "request_body",
            Self::ClientNotReading => "client_not_reading",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StageLabels {
    pub(crate) stage: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReasonLabels {
    pub(crate) reason: String,
}

#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub(crate) enum UpstreamError {
    /// Connect failed or timed out: nothing was sent.
    Connect,
    /// Bytes went upstream, then timeout or reset: outcome unknown.
    OutcomeUnknown,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct UpstreamErrorLabels {
    /// `connect` or `outcome_unknown`.
    pub(crate) kind: &'static str,
}

/// All proxy metrics and the registry that renders them.
#[derive(Debug)]
pub(crate) struct Metrics {
    pub(crate) registry: Registry,
    pub(crate) accepted: Family<KindLabels, Counter>,
    pub(crate) rejected: Family<ReasonLabels, Counter>,
    pub(crate) overloaded: Counter,
    pub(crate) epoch_advances: Counter,
    pub(crate) drain_wait: Histogram,
    pub(crate) indeterminate_resources: Gauge,
    pub(crate) upstream_errors: Family<UpstreamErrorLabels, Counter>,
    pub(crate) upstream_latency: Histogram,
    pub(crate) added_latency: Histogram,
    pub(crate) epoch_persist: Histogram,
    pub(crate) in_flight: Gauge,
    pub(crate) resources: Gauge,
    pub(crate) rejection_log_dropped: Counter,
    pub(crate) build_info: Family<BuildLabels, Gauge>,
    pub(crate) connections: Gauge,
    pub(crate) connections_refused: Counter,
    pub(crate) connections_timed_out: Family<StageLabels, Counter>,
    pub(crate) pg_terminations: Counter,
    pub(crate) pg_cancels: Counter,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct BuildLabels {
    pub(crate) version: &'static str,
}

fn seconds_histogram() -> Histogram {
    // 50 µs … ~73 s in steps of 1.5×: a p99 read from it is within about
    // ±20% (one bucket).
    Histogram::new(exponential_buckets(0.000_05, 1.5, 36))
}

impl Metrics {
    pub(crate) fn new() -> Self {
        let mut registry = Registry::with_prefix("fencer_proxy");
        let m = Self {
            accepted: Family::default(),
            rejected: Family::default(),
            overloaded: Counter::default(),
            epoch_advances: Counter::default(),
            drain_wait: seconds_histogram(),
            indeterminate_resources: Gauge::default(),
            upstream_errors: Family::default(),
            upstream_latency: seconds_histogram(),
            added_latency: seconds_histogram(),
            epoch_persist: seconds_histogram(),
            in_flight: Gauge::default(),
            resources: Gauge::default(),
            rejection_log_dropped: Counter::default(),
            build_info: Family::default(),
            connections: Gauge::default(),
            connections_refused: Counter::default(),
            connections_timed_out: Family::default(),
            pg_terminations: Counter::default(),
            pg_cancels: Counter::default(),
            registry: Registry::default(),
        };
        for kind in ["read", "write"] {
            let _ = m.accepted.get_or_create(&KindLabels { kind });
        }
        for stage in TimeoutStage::ALL {
            let _ = m.connections_timed_out.get_or_create(&StageLabels { stage: stage.as_str() });
        }
        for reason in RejectReason::ALL {
            let _ = m.rejected.get_or_create(&ReasonLabels { reason: reason.as_str().to_owned() });
        }
        for kind in ["connect", "outcome_unknown"] {
            let _ = m.upstream_errors.get_or_create(&UpstreamErrorLabels { kind });
        }
        m.build_info.get_or_create(&BuildLabels { version: env!("CARGO_PKG_VERSION") }).set(1);
        registry.register("accepted", "Requests forwarded upstream, by route kind", m.accepted.clone());
        registry.register("rejected", "Requests refused by the fence, by reason", m.rejected.clone());
        registry.register(
            "overloaded",
            "Requests shed because max_concurrent_requests were in flight",
            m.overloaded.clone(),
        );
        registry.register("epoch_advances", "Times a higher token raised a resource's epoch", m.epoch_advances.clone());
        registry.register_with_unit(
            "drain_wait",
            "Time a higher token waited for lower-token writes in flight to finish (P3)",
            Unit::Seconds,
            m.drain_wait.clone(),
        );
        registry.register(
            "indeterminate_resources",
            "Resources whose last write has an unknown outcome (P4)",
            m.indeterminate_resources.clone(),
        );
        registry.register("upstream_errors", "Upstream calls that failed, by kind", m.upstream_errors.clone());
        registry.register_with_unit(
            "upstream_latency",
            "From forwarding a request to the upstream's response headers",
            Unit::Seconds,
            m.upstream_latency.clone(),
        );
        registry.register_with_unit(
            "added_latency",
            "Time spent in the proxy before response headers, excluding the upstream call",
            Unit::Seconds,
            m.added_latency.clone(),
        );
        registry.register_with_unit(
            "epoch_persist",
            "Immediate-durability commit of an epoch raise (P2)",
            Unit::Seconds,
            m.epoch_persist.clone(),
        );
        registry.register("in_flight_requests", "Requests being handled", m.in_flight.clone());
        registry.register("resources", "Resources tracked in memory", m.resources.clone());
        registry.register(
            "rejection_log_dropped",
            "Rejection records dropped because the writer queue was full",
            m.rejection_log_dropped.clone(),
        );
        registry.register("build_info", "Always 1; the version is a label", m.build_info.clone());
        registry.register("connections", "Client connections open", m.connections.clone());
        registry.register(
            "connections_refused",
            "Client connections refused because limits.max_connections were open",
            m.connections_refused.clone(),
        );
        registry.register(
            "postgres_backends_terminated",
            "PostgreSQL backends of older transactions ended with pg_terminate_backend (G5)",
            m.pg_terminations.clone(),
        );
        registry.register(
            "postgres_cancel_requests",
            "PostgreSQL CancelRequests relayed to the backend they name",
            m.pg_cancels.clone(),
        );
        registry.register(
            "connections_timed_out",
            "Client connections closed for being too slow, by stage",
            m.connections_timed_out.clone(),
        );
        Self { registry, ..m }
    }

    /// Counts one request or statement forwarded: fenced (`write`) or not.
    pub(crate) fn accepted(&self, fenced: bool) {
        let kind = if fenced { "write" } else { "read" };
        self.accepted.get_or_create(&KindLabels { kind }).inc();
    }

    pub(crate) fn timed_out(&self, stage: TimeoutStage) {
        self.connections_timed_out.get_or_create(&StageLabels { stage: stage.as_str() }).inc();
    }

    pub(crate) fn rejected(&self, reason: RejectReason) {
        self.rejected.get_or_create(&ReasonLabels { reason: reason.as_str().to_owned() }).inc();
    }

    pub(crate) fn upstream_error(&self, kind: UpstreamError) {
        let kind = match kind {
            UpstreamError::Connect => "connect",
            UpstreamError::OutcomeUnknown => "outcome_unknown",
        };
        self.upstream_errors.get_or_create(&UpstreamErrorLabels { kind }).inc();
    }

    /// The OpenMetrics text exposition.
    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
