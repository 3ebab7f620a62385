//! What the gRPC and JSON front ends share: an Acquire run on a caller's
//! behalf (permission, request rate, tenant quota), the span and metrics
//! around every call, and the conversion of both requests to the service's.

use fencer_proto::v1;
use serde::Deserialize;
use tracing::Instrument as _;

use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::service::{AcquireRequest, Granted, LockError, LockService};
use crate::tenants::{Caller, Permission};

/// An Acquire as a front end runs it: on `who`'s behalf, in its span, with
/// its metrics.
pub(super) fn acquire<'a>(
    svc: &'a LockService,
    metrics: &'a Metrics,
    who: Result<Caller, LockError>,
    req: AcquireRequest,
) -> impl Future<Output = Result<Granted, LockError>> + 'a {
    let (op, resource) = (acquire_op(req.wait_timeout_ms), req.resource.clone());
    observed(metrics, op, resource, async move { acquire_as(svc, &who?, req).await })
}

/// An Acquire on `who`'s behalf, as both front ends make it: the permission
/// and request-rate checks, the tenant's quota on the command (enforced at
/// apply), and a limit refusal that names the tenant.
async fn acquire_as(svc: &LockService, who: &Caller, mut req: AcquireRequest) -> Result<Granted, LockError> {
    who.check(Permission::Acquire, &req.resource)?;
    who.charge_request(&Clock)?;
    req.quota = who.quota();
    svc.acquire(req).await.map_err(|e| with_tenant(e, who))
}

/// Names the tenant in a limit refusal the state machine reported.
fn with_tenant(e: LockError, caller: &Caller) -> LockError {
    match e {
        LockError::TenantLimit { tenant, limit, value } if tenant.is_empty() => {
            LockError::TenantLimit { tenant: caller.name().to_string(), limit, value }
        }
        other => other,
    }
}

/// The metric `op` of an Acquire: one that may queue is measured apart,
/// its latency includes the wait.
fn acquire_op(wait_timeout_ms: u64) -> &'static str {
    if wait_timeout_ms == 0 { "acquire" } else { "acquire_wait" }
}

/// Runs one operation, records its metrics and logs its end at debug
/// level. With debug logging on for the coordinator it runs in its own
/// span — `op`, `resource` and, as they become known, `request_id`,
/// `log_index` (recorded by the service) and `outcome` — so every event
/// logged while it runs carries them, which is how one call is followed
/// from its arrival to the apply of its log entry (the apply logs the same
/// `log_index`). At the default level there is no span (creating, entering
/// and formatting one per call was ~3 % of a leader's CPU); the warnings a
/// call can log name their `resource` themselves.
///
/// Built from combinators rather than as an `async fn`: an `async fn`
/// keeps its argument future and the awaited one side by side, so every
/// layer of wrapping doubled the size of a call's future (28 KB for one
/// batch item), and moving those futures was a seventh of the leader's CPU.
/// For the same reason the resource is taken by value (a `&str`, or an
/// acquire's own copy): no extra future has to own it for the warning.
pub(super) fn observed<'m, T, R: AsRef<str>, F: Future<Output = Result<T, LockError>>>(
    metrics: &'m Metrics,
    op: &'static str,
    resource: R,
    f: F,
) -> impl Future<Output = Result<T, LockError>> + use<'m, T, R, F> {
    let span = tracing::debug_span!(
        "call",
        op,
        resource = resource.as_ref(),
        request_id = tracing::field::Empty,
        log_index = tracing::field::Empty,
        outcome = tracing::field::Empty,
    );
    let started = Clock.now();
    // The closure runs inside the span (it is polled by `Instrumented`).
    let finish = move |r: Result<T, LockError>| {
        let outcome = match &r {
            Ok(_) => "ok",
            Err(e) => e.metric_outcome(),
        };
        let elapsed = started.elapsed();
        metrics.observe_request(op, outcome, elapsed);
        crate::service::record_call_field("outcome", outcome);
        match &r {
            Err(e) if outcome == "unknown" => {
                tracing::warn!(op, resource = resource.as_ref(), error = %e, elapsed_ms = elapsed.as_millis() as u64, "call ended with an unknown outcome")
            }
            Err(e) => tracing::debug!(error = %e, elapsed_ms = elapsed.as_millis() as u64, "call refused"),
            Ok(_) => tracing::debug!(elapsed_ms = elapsed.as_millis() as u64, "call done"),
        }
        r
    };
    futures::FutureExt::map(f, finish).instrument(span)
}

/// The body of `POST /v1/acquire`. Unknown fields are refused (a
/// misspelt `ttl` must not silently become the default ttl); an absent
/// `ttl_ms` is the default, an explicit one (0 included) is checked.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AcquireBody {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    request_id: String,
    #[serde(default)]
    ttl_ms: Option<u64>,
    #[serde(default)]
    wait_timeout_ms: u64,
    #[serde(default)]
    holder: String,
}

impl From<AcquireBody> for AcquireRequest {
    fn from(b: AcquireBody) -> Self {
        Self {
            resource: b.resource,
            request_id: b.request_id,
            ttl_ms: b.ttl_ms,
            wait_timeout_ms: b.wait_timeout_ms,
            holder: b.holder,
            quota: None,
        }
    }
}

impl From<v1::AcquireRequest> for AcquireRequest {
    fn from(r: v1::AcquireRequest) -> Self {
        Self {
            resource: r.resource,
            request_id: r.request_id,
            ttl_ms: r.ttl_ms,
            wait_timeout_ms: r.wait_timeout_ms,
            holder: r.holder,
            quota: None,
        }
    }
}
