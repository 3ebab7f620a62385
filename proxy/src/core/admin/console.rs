//! The operator console on a proxy's admin port, for both front ends: the
//! page (`fencer_console`) at `/ui/` and its data under `/ui/api/`.
//!
//! | method | path | what |
//! |---|---|---|
//! | GET | `/ui/api/session` | which front end, its addresses, the rejection reasons |
//! | GET | `/ui/api/resources` | `?prefix=&after=&limit=`: epoch, in flight, indeterminate and quarantine |
//! | GET | `/ui/api/rejections` | `?resource=&reason=&caller=&before=&limit=`: newest first, filtered |
//! | GET | `/ui/api/rates` | accepted and rejected per second, 15 minutes |
//! | POST | `/ui/api/raise-epoch` | `{resource, epoch, reason}` |
//! | POST | `/ui/api/clear-indeterminate` | `{resource, reason}` |
//!
//! The actions are the admin API's own handlers (`POST /v1/raise-epoch`,
//! `POST /v1/clear-indeterminate`) called with the same request, so they
//! are checked, performed and audited exactly as those are; the console
//! adds the page-token check (CSRF, `fencer_console::PageToken`). The admin
//! port has no authentication of its own in this version: whoever reaches
//! it may act, in the console as with curl (docs/proxy.md, "Admin API").

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::{ConnectInfo, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use fencer_console::{PageToken, SAMPLE_PERIOD, Series, SeriesView, per_second};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::{AdminError, AdminState, ClearIndeterminateRequest, MAX_PAGE, RaiseEpochRequest, UpstreamProbe};
use crate::config::Frontend;
use crate::core::clock;
use crate::core::fence::FenceCore;
use crate::core::metrics::{KindLabels, ReasonLabels};
use crate::core::rejections::{RejectReason, RejectionRecord};

/// Rejection records one console search reads at most, newest first (the
/// default size of the rejection table).
const REJECTION_SCAN: usize = 10_000;
/// Resources per page when none is asked for.
const DEFAULT_RESOURCES: usize = 100;
/// Rejections per page when none is asked for.
const DEFAULT_REJECTIONS: usize = 100;
/// The charted values.
const NAMES: [&str; 2] = ["accepted", "rejected"];

/// The console of one proxy. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Console {
    inner: Arc<Inner>,
}

struct Inner {
    admin: AdminState,
    series: Series,
    token: PageToken,
    /// The admin API (and so the console's data) requires a bearer token.
    admin_token: bool,
}

impl Console {
    /// A console over the proxy's state; `probe` is the admin API's;
    /// `admin_token` when the admin API requires a bearer token.
    pub(crate) fn new(
        shared: Arc<FenceCore>,
        probe: Arc<dyn UpstreamProbe>,
        admin_token: bool,
    ) -> std::io::Result<Self> {
        let token = PageToken::generate()?;
        let series = Series::new(&NAMES);
        Ok(Self {
            inner: Arc::new(Inner { admin: AdminState { shared, upstream: probe }, series, token, admin_token }),
        })
    }

    /// `/ui/api/…`: the data and the actions (behind the admin token when
    /// there is one).
    pub(crate) fn api(&self) -> Router {
        let api = Router::new()
            .route("/ui/api/session", get(session))
            .route("/ui/api/resources", get(resources))
            .route("/ui/api/rejections", get(rejections))
            .route("/ui/api/rates", get(rates))
            .route("/ui/api/raise-epoch", post(raise_epoch))
            .route("/ui/api/clear-indeterminate", post(clear_indeterminate))
            .with_state(self.clone());
        fencer_console::secured(api)
    }

    /// `/ui/`: the page and its scripts.
    pub(crate) fn assets(&self) -> Router {
        fencer_console::assets_router(self.inner.token.clone())
    }

    /// Samples the accepted and rejected counters every second into the
    /// charts' series until `shutdown` is cancelled.
    pub(crate) async fn sample(self, shutdown: CancellationToken) {
        let metrics = self.inner.admin.shared.metrics.clone();
        let read = move || {
            let accepted: u64 =
                ["read", "write"].iter().map(|kind| metrics.accepted.get_or_create(&KindLabels { kind }).get()).sum();
            let rejected: u64 = RejectReason::ALL
                .iter()
                .map(|r| metrics.rejected.get_or_create(&ReasonLabels { reason: r.as_str().to_string() }).get())
                .sum();
            (accepted, rejected)
        };
        let mut tick = tokio::time::interval(SAMPLE_PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let (mut before, mut before_at) = (read(), clock::now());
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let (now, at) = (read(), clock::now());
            let elapsed = at - before_at;
            self.inner.series.push(
                clock::unix_ms(),
                vec![Some(per_second(before.0, now.0, elapsed)), Some(per_second(before.1, now.1, elapsed))],
            );
            (before, before_at) = (now, at);
        }
    }
}

/// Why a console request was refused: the admin API's errors, plus the
/// page token.
enum Refusal {
    Admin(AdminError),
    PageToken(fencer_console::PageTokenRefused),
}

impl From<AdminError> for Refusal {
    fn from(e: AdminError) -> Self {
        Self::Admin(e)
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        match self {
            Self::Admin(e) => e.into_response(),
            Self::PageToken(e) => {
                (StatusCode::FORBIDDEN, Json(json!({ "error": { "reason": "PAGE_TOKEN", "message": e.to_string() } })))
                    .into_response()
            }
        }
    }
}

async fn session(State(c): State<Console>) -> Json<Value> {
    let config = &c.inner.admin.shared.config;
    let (front_end, upstream) = match &config.frontend {
        Frontend::Http(http) => ("http", http.upstream.to_string()),
        Frontend::Postgres(pg) => ("postgres", pg.upstream.to_string()),
    };
    Json(json!({
        "kind": "proxy",
        "front_end": front_end,
        "version": env!("CARGO_PKG_VERSION"),
        "actions": true,
        "auth_required": c.inner.admin_token,
        "auth": if c.inner.admin_token { "admin token (Authorization: Bearer)" } else { "admin port (no authentication)" },
        "listen": config.listen.to_string(),
        "upstream": upstream,
        "quarantine_secs": config.timeouts.quarantine.as_secs(),
        "reasons": RejectReason::ALL.iter().map(|r| r.as_str()).collect::<Vec<_>>(),
    }))
}

#[derive(Deserialize)]
struct ResourcesQuery {
    #[serde(default)]
    prefix: String,
    #[serde(default)]
    after: String,
    limit: Option<usize>,
}

async fn resources(State(c): State<Console>, Query(q): Query<ResourcesQuery>) -> Result<Json<Value>, Refusal> {
    let limit = q.limit.unwrap_or(DEFAULT_RESOURCES);
    if limit == 0 || limit > MAX_PAGE {
        return Err(AdminError::BadRequest(format!("limit must be within 1..={MAX_PAGE}")).into());
    }
    let resources = &c.inner.admin.shared.resources;
    // Names in order: start just before the prefix (or after the page's
    // last name) and stop at the first name past the prefix.
    let mut after = (!q.after.is_empty()).then(|| q.after.clone());
    if after.as_deref().is_none_or(|a| a < q.prefix.as_str()) && !q.prefix.is_empty() {
        after = Some(before_prefix(&q.prefix));
    }
    let mut page = Vec::new();
    let mut more = false;
    'pages: loop {
        let batch = resources.list(after.as_deref(), MAX_PAGE);
        let Some(last) = batch.last() else { break };
        let last_name = last.name.to_string();
        for state in &batch {
            let name = state.name.as_str();
            if name < q.prefix.as_str() {
                continue;
            }
            if !name.starts_with(&q.prefix) {
                break 'pages;
            }
            if page.len() == limit {
                more = true;
                break 'pages;
            }
            page.push(resources.status(state));
        }
        if batch.len() < MAX_PAGE {
            break;
        }
        after = Some(last_name);
    }
    let next_after =
        if more { page.last().map(|s: &crate::core::state::ResourceStatus| s.resource.clone()) } else { None };
    Ok(Json(json!({
        "floor": resources.floor(),
        "resources": page,
        "next_after": next_after,
        "now_unix_ms": clock::unix_ms(),
    })))
}

/// The largest string below every name that starts with `prefix`: the
/// prefix without its last byte (names are ASCII).
fn before_prefix(prefix: &str) -> String {
    prefix[..prefix.len() - 1].to_string()
}

#[derive(Deserialize)]
struct RejectionsQuery {
    before: Option<u64>,
    limit: Option<usize>,
    resource: Option<String>,
    reason: Option<String>,
    caller: Option<String>,
}

impl RejectionsQuery {
    fn keeps(&self, r: &RejectionRecord) -> bool {
        let nonempty = |s: &Option<String>| s.as_deref().filter(|v| !v.is_empty()).map(str::to_string);
        nonempty(&self.resource).is_none_or(|want| r.resource.as_deref() == Some(want.as_str()))
            && nonempty(&self.reason).is_none_or(|want| r.reason.as_str() == want)
            && nonempty(&self.caller).is_none_or(|want| r.caller.contains(&want))
    }
}

/// The newest rejections that match, reading at most [`REJECTION_SCAN`]
/// records per request; `next_before` continues the search.
async fn rejections(State(c): State<Console>, Query(q): Query<RejectionsQuery>) -> Result<Json<Value>, Refusal> {
    let limit = q.limit.unwrap_or(DEFAULT_REJECTIONS);
    if limit == 0 || limit > MAX_PAGE {
        return Err(AdminError::BadRequest(format!("limit must be within 1..={MAX_PAGE}")).into());
    }
    if let Some(reason) = q.reason.as_deref().filter(|r| !r.is_empty())
        && !RejectReason::ALL.iter().any(|r| r.as_str() == reason)
    {
        return Err(AdminError::BadRequest(format!("reason {reason:?} is not a rejection reason")).into());
    }
    let store = &c.inner.admin.shared.store;
    let mut out = Vec::new();
    let mut scanned = 0usize;
    let mut before = q.before;
    let mut table_max;
    let complete = loop {
        let page = store.rejections(before, MAX_PAGE).await.map_err(|e| AdminError::Unavailable(e.to_string()))?;
        table_max = page.table_max;
        for r in page.rejections {
            scanned += 1;
            before = Some(r.seq);
            if q.keeps(&r) {
                out.push(r);
                if out.len() == limit {
                    break;
                }
            }
            if scanned == REJECTION_SCAN {
                break;
            }
        }
        if out.len() == limit || scanned == REJECTION_SCAN {
            break false;
        }
        match page.next_before {
            Some(n) => before = Some(n),
            None => break true,
        }
    };
    Ok(Json(json!({
        "rejections": out,
        "next_before": if complete { None } else { before },
        "table_max": table_max,
        "scanned": scanned,
        "scan_complete": complete,
    })))
}

async fn rates(State(c): State<Console>) -> Json<SeriesView> {
    Json(c.inner.series.view())
}

async fn raise_epoch(
    State(c): State<Console>,
    peer: ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    super::extract::AdminJson(req): super::extract::AdminJson<RaiseEpochRequest>,
) -> Result<Response, Refusal> {
    c.inner.token.check(&headers).map_err(Refusal::PageToken)?;
    Ok(super::raise_epoch(State(c.inner.admin.clone()), peer, super::extract::AdminJson(req)).await.into_response())
}

async fn clear_indeterminate(
    State(c): State<Console>,
    peer: ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    super::extract::AdminJson(req): super::extract::AdminJson<ClearIndeterminateRequest>,
) -> Result<Response, Refusal> {
    c.inner.token.check(&headers).map_err(Refusal::PageToken)?;
    Ok(super::clear_indeterminate(State(c.inner.admin.clone()), peer, super::extract::AdminJson(req))
        .await
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_before_a_prefix_sorts_before_every_name_under_it() {
        let b = before_prefix("influx/");
        for name in ["influx/", "influx/a", "influx/zzz"] {
            assert!(b.as_str() < name);
        }
        assert!(b.as_str() > "influw/zzz" && b.as_str() >= "influx");
    }
}
