//! The admin API of both front ends (loopback by default; a bearer token
//! with `admin_token_file`): per-resource state, paged
//! rejections, raise-epoch and clear-indeterminate (both audited),
//! `/metrics`, `/livez`, `/readyz`, and the run-time log filter
//! (`/v1/log-level`).
//!
//! - `errors`: [`AdminError`] and the one place it becomes a response.
//! - `client`: [`AdminClient`](client::AdminClient), for the CLI.
//! - `auth`: the bearer token.
//! - `console`: the operator console at `/ui/` (its page is
//!   `fencer_console`'s) and the sampler of its charts.
//! - `extract`: request checks whose refusals are [`AdminError`]s, and the
//!   bounds on operator text.

mod auth;
mod client;
mod console;
mod errors;
mod extract;

pub(crate) use self::auth::AdminToken;
pub use self::auth::{AdminTokenError, MAX_ADMIN_TOKEN_BYTES, MIN_ADMIN_TOKEN_BYTES, admin_token_from_env};
pub use self::client::{ADMIN_TOKEN_FILE_ENV, AdminClient, AdminClientError};
pub(crate) use self::console::Console;
pub(crate) use self::errors::AdminError;
use self::extract::{AdminJson, AdminQuery, operator_text};
pub use self::extract::{MAX_ADMIN_BODY_BYTES, MAX_ADMIN_HEAD_BYTES, MAX_ADMIN_HEADERS, MAX_OPERATOR_TEXT_BYTES};

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::{ConnectInfo, DefaultBodyLimit, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use serde::{Deserialize, Serialize};

use crate::core::clock;
use crate::core::fence::FenceCore;
use crate::core::names::ResourceName;
use crate::core::state::ResourceStatus;

/// Largest page the admin API returns.
pub const MAX_PAGE: usize = 1000;
/// Page size when none is asked for.
pub const DEFAULT_PAGE: usize = 100;

/// `GET /v1/resources` answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ResourcesPage {
    /// The floor: the epoch of every resource not listed (P10).
    pub floor: u64,
    /// Resources in name order.
    pub resources: Vec<ResourceStatus>,
    /// Pass as `after` for the next page; absent on the last.
    pub next_after: Option<String>,
}

/// `POST /v1/raise-epoch` body.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RaiseEpochRequest {
    /// The resource.
    pub resource: String,
    /// The new epoch; must not be below the current one (P8).
    pub epoch: u64,
    /// Why, for the audit log: at most [`MAX_OPERATOR_TEXT_BYTES`] bytes,
    /// no control characters.
    pub reason: String,
}

/// `POST /v1/clear-indeterminate` body.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClearIndeterminateRequest {
    /// The resource.
    pub resource: String,
    /// Why, for the audit log: at most [`MAX_OPERATOR_TEXT_BYTES`] bytes,
    /// no control characters.
    pub reason: String,
}

/// `POST /v1/clear-indeterminate` answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClearIndeterminateResponse {
    /// The resource.
    pub resource: String,
    /// Whether it was indeterminate.
    pub was_indeterminate: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResourcesQuery {
    after: Option<String>,
    limit: Option<usize>,
    name: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RejectionsQuery {
    before: Option<u64>,
    limit: Option<usize>,
}

/// Checks that the protected upstream accepts connections (`/readyz`).
pub(crate) trait UpstreamProbe: Send + Sync + 'static {
    /// Opens (and closes) one connection to the upstream within `timeout`.
    fn probe(
        &self,
        timeout: Duration,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send + '_>>;
}

#[derive(Clone)]
struct AdminState {
    shared: Arc<FenceCore>,
    upstream: Arc<dyn UpstreamProbe>,
}

pub(crate) fn router(
    shared: Arc<FenceCore>,
    upstream: Arc<dyn UpstreamProbe>,
    token: Option<AdminToken>,
    console: &Console,
) -> axum::Router {
    let router = axum::Router::new()
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/v1/resources", get(resources))
        .route("/v1/rejections", get(rejections))
        .route("/v1/raise-epoch", post(raise_epoch))
        .route("/v1/clear-indeterminate", post(clear_indeterminate))
        .route("/v1/log-level", get(get_log_level))
        .route("/v1/log-level", put(set_log_level))
        .route("/v1/reload-keys", post(reload_keys))
        .fallback(extract::no_such_path)
        .method_not_allowed_fallback(extract::no_such_method)
        .layer(DefaultBodyLimit::max(MAX_ADMIN_BODY_BYTES))
        .with_state(AdminState { shared, upstream })
        // The console's data and actions: behind the same token as the API.
        .merge(console.api());
    // Outermost, so first: the head limits, then the token, then the
    // routes and their extractors.
    let router = match token {
        Some(token) => router.layer(axum::middleware::from_fn_with_state(token, auth::require_token)),
        None => router,
    };
    // The console's page and scripts need no token: the page asks for it.
    router.merge(console.assets()).layer(axum::middleware::from_fn(extract::head_limits))
}

fn page_limit(limit: Option<usize>) -> Result<usize, AdminError> {
    match limit.unwrap_or(DEFAULT_PAGE) {
        0 => Err(AdminError::BadRequest("limit must be at least 1".into())),
        n if n > MAX_PAGE => Err(AdminError::BadRequest(format!("limit must be at most {MAX_PAGE}"))),
        n => Ok(n),
    }
}

fn resource_name(raw: &str) -> Result<ResourceName, AdminError> {
    ResourceName::new(raw).map_err(|e| {
        // Quote a name of plausible length; of a longer one, only its size.
        if raw.len() <= 2 * crate::core::names::MAX_RESOURCE_NAME_BYTES {
            AdminError::BadRequest(format!("resource {raw:?}: {e}"))
        } else {
            AdminError::BadRequest(format!("resource of {} bytes: {e}", raw.len()))
        }
    })
}

async fn readyz(State(s): State<AdminState>) -> Response {
    let mut problems = Vec::new();
    if let Err(e) = s.shared.store.ping().await {
        problems.push(format!("epoch store: {e}"));
    }
    if let Err(e) = s.upstream.probe(Duration::from_secs(1)).await {
        problems.push(format!("upstream: {e}"));
    }
    let ready = problems.is_empty();
    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(serde_json::json!({ "ready": ready, "problems": problems }))).into_response()
}

/// `GET`/`PUT /v1/log-level` body and answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct LogLevel {
    filter: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    previous: Option<String>,
}

fn log_control(s: &AdminState) -> Result<&crate::core::log_level::LogControlHandle, AdminError> {
    s.shared
        .config
        .log_control
        .as_ref()
        .ok_or_else(|| AdminError::NotImplemented("this process did not hand the proxy a log filter control".into()))
}

async fn get_log_level(State(s): State<AdminState>) -> Result<Json<LogLevel>, AdminError> {
    Ok(Json(LogLevel { filter: log_control(&s)?.0.current(), previous: None }))
}

/// Replaces the log filter; one that does not parse is refused (400) and
/// the old one stays.
async fn set_log_level(
    State(s): State<AdminState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    AdminJson(req): AdminJson<LogLevel>,
) -> Result<Json<LogLevel>, AdminError> {
    operator_text("filter", &req.filter)?;
    let control = log_control(&s)?;
    let previous = control.0.current();
    control.0.set(&req.filter).map_err(|e| AdminError::BadRequest(format!("filter: {e}")))?;
    let filter = control.0.current();
    tracing::warn!(%previous, %filter, caller = %peer, "log filter changed through the admin API");
    Ok(Json(LogLevel { filter, previous: Some(previous) }))
}

async fn metrics(State(s): State<AdminState>) -> Response {
    let mut resp = s.shared.metrics.render().into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    resp
}

async fn resources(
    State(s): State<AdminState>,
    AdminQuery(q): AdminQuery<ResourcesQuery>,
) -> Result<Json<ResourcesPage>, AdminError> {
    let resources = &s.shared.resources;
    if let Some(name) = q.name {
        let name = resource_name(&name)?;
        let status = match resources.get(&name) {
            Some(state) => resources.status(&state),
            // Never written through this proxy: its epoch is the floor.
            None => ResourceStatus {
                resource: name.to_string(),
                epoch: resources.floor(),
                in_flight: 0,
                waiting: 0,
                indeterminate: None,
            },
        };
        return Ok(Json(ResourcesPage { floor: resources.floor(), resources: vec![status], next_after: None }));
    }
    let limit = page_limit(q.limit)?;
    // The cursor is a resource name: one that could not be is refused, like
    // any other bad query, not answered as an empty page.
    if let Some(after) = &q.after {
        resource_name(after).map_err(|e| AdminError::BadRequest(format!("after: {e}")))?;
    }
    let mut page = resources.list(q.after.as_deref(), limit + 1);
    let more = page.len() > limit;
    page.truncate(limit);
    let statuses: Vec<ResourceStatus> = page.iter().map(|st| resources.status(st)).collect();
    let next_after = if more { statuses.last().map(|s| s.resource.clone()) } else { None };
    Ok(Json(ResourcesPage { floor: resources.floor(), resources: statuses, next_after }))
}

async fn rejections(
    State(s): State<AdminState>,
    AdminQuery(q): AdminQuery<RejectionsQuery>,
) -> Result<Json<crate::core::rejections::RejectionsPage>, AdminError> {
    let limit = page_limit(q.limit)?;
    s.shared.store.rejections(q.before, limit).await.map(Json).map_err(|e| AdminError::Unavailable(e.to_string()))
}

async fn raise_epoch(
    State(s): State<AdminState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    AdminJson(req): AdminJson<RaiseEpochRequest>,
) -> Result<Json<ResourceStatus>, AdminError> {
    let name = resource_name(&req.resource)?;
    operator_text("reason", &req.reason)?;
    let shared = &s.shared;
    let state = shared.resources.get_or_create(&name).map_err(|e| AdminError::Unavailable(e.to_string()))?;
    // Like a higher token: wait for writes in flight, then move E.
    let _exclusive = state.exclusive().await;
    let current = state.epoch();
    if req.epoch < current {
        return Err(AdminError::WouldLower(format!(
            "resource {name} is at epoch {current}; {} would lower it, and the epoch never decreases (P8)",
            req.epoch
        )));
    }
    let audit = serde_json::json!({
        "time": clock::wall_rfc3339(),
        "op": "raise_epoch",
        "resource": name.as_str(),
        "from": current,
        "to": req.epoch,
        "reason": req.reason,
        "caller": peer.to_string(),
    });
    let stored = shared
        .store
        .raise_audited(&name, req.epoch, audit.to_string().into_bytes())
        .await
        .map_err(|e| AdminError::Unavailable(e.to_string()))?;
    state.set_epoch(stored);
    if stored > current {
        shared.metrics.epoch_advances.inc();
    }
    tracing::warn!(resource = %name, from = current, to = stored, reason = %req.reason, caller = %peer, "epoch raised by an operator");
    Ok(Json(shared.resources.status(&state)))
}

async fn clear_indeterminate(
    State(s): State<AdminState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    AdminJson(req): AdminJson<ClearIndeterminateRequest>,
) -> Result<Json<ClearIndeterminateResponse>, AdminError> {
    let name = resource_name(&req.resource)?;
    operator_text("reason", &req.reason)?;
    let shared = &s.shared;
    let state = shared
        .resources
        .get(&name)
        .ok_or_else(|| AdminError::NotFound(format!("resource {name} has no state in this proxy")))?;
    let audit = serde_json::json!({
        "time": clock::wall_rfc3339(),
        "op": "clear_indeterminate",
        "resource": name.as_str(),
        "reason": req.reason,
        "caller": peer.to_string(),
    });
    // Audit first: an override nobody can trace is worse than a refusal.
    shared.store.audit(audit.to_string().into_bytes()).await.map_err(|e| AdminError::Unavailable(e.to_string()))?;
    let was = shared.resources.clear_indeterminate(&state);
    tracing::warn!(resource = %name, was_indeterminate = was, reason = %req.reason, caller = %peer, "indeterminate cleared by an operator");
    Ok(Json(ClearIndeterminateResponse { resource: name.to_string(), was_indeterminate: was }))
}

async fn reload_keys(
    State(s): State<AdminState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
) -> Result<Json<crate::core::signing::KeysLoaded>, AdminError> {
    use crate::core::signing::KeysError;
    let loaded = crate::core::signing::KeyReloader(s.shared.tokens.clone()).reload().map_err(|e| match e {
        KeysError::NotConfigured => AdminError::NotFound(e.to_string()),
        KeysError::Load { .. } | KeysError::Empty { .. } => AdminError::BadRequest(e.to_string()),
    })?;
    let audit = serde_json::json!({
        "time": clock::wall_rfc3339(),
        "op": "reload_keys",
        "keys_file": loaded.keys_file,
        "key_ids": loaded.key_ids,
        "caller": peer.to_string(),
    });
    s.shared.store.audit(audit.to_string().into_bytes()).await.map_err(|e| AdminError::Unavailable(e.to_string()))?;
    Ok(Json(loaded))
}
