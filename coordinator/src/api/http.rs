//! JSON over HTTP on the node's port, for curl users and scripts, plus the
//! status routes (also served alone on the status port, when configured).
//!
//! | method | path | body / query |
//! |---|---|---|
//! | GET | `/v1/openapi.json` | this API as an OpenAPI 3.1 document (`docs/openapi.json`) |
//! | POST | `/v1/acquire` | `{resource, request_id?, ttl_ms?, wait_timeout_ms?, holder?}` |
//! | POST | `/v1/renew` | `{resource, lease_id}` |
//! | POST | `/v1/release` | `{resource, lease_id}` |
//! | GET | `/v1/locks/{resource}` | |
//! | GET | `/v1/locks` | `?prefix=&page_size=&page_token=` |
//! | POST | `/v1/admin/force-release` | `{resource, caller?, reason?}` |
//! | GET | `/v1/admin/signing-keys` | the registered signing keys (`fencer keys list -o json`) |
//! | GET | `/v1/admin/signing-keys/key-set` | the proxy key-set file (`fencer keys export`) |
//! | *status routes* | | |
//! | GET | `/metrics` | Prometheus text |
//! | GET | `/livez` | 200 while raft runs and the files are writable |
//! | GET | `/readyz` | 200 with a known leader (and, on the leader, a recent quorum) |
//! | GET | `/v1/status` | this node's view of the cluster |
//! | GET | `/v1/admin/hot` | `?by=acquires\|waiters\|hold&limit=` the busiest resources |
//! | GET, PUT | `/v1/admin/log-level` | `{filter}`: read or replace the log filter |
//!
//! Errors answer `{"error": {"code", "reason", "message", "metadata"}}` with
//! the HTTP status of `api::errors::http_status`; requests the API cannot
//! take (not JSON, unknown fields, unknown paths) get the same body (`json`).

use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use super::call::{self, AcquireBody, observed};
use super::errors::ApiError;
use super::json::{JsonBody, Params};
use crate::clock::Clock;
use crate::hot::HotOrder;
use crate::tenants::{Authenticator, Caller, Permission};
use crate::tls::ConnInfo;

/// Resources listed by `/v1/admin/hot` when no `limit` is given.
const DEFAULT_HOT_LIMIT: usize = 20;
use crate::metrics::Metrics;
use crate::service::{LockError, LockService, LockView};

#[derive(Clone)]
struct HttpState {
    svc: LockService,
    metrics: Arc<Metrics>,
    auth: Authenticator,
}

/// The caller of an HTTP request (or why it has none): the connection's
/// verified client certificate and the `Authorization` header.
struct Who(Result<Caller, LockError>);

impl axum::extract::FromRequestParts<HttpState> for Who {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        s: &HttpState,
    ) -> Result<Self, Self::Rejection> {
        let conn = parts.extensions.get::<ConnInfo>().cloned().unwrap_or_default();
        let authorization = parts.headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        Ok(Who(s.auth.caller(&conn, authorization)))
    }
}

/// The JSON lock API and the status routes.
pub(crate) fn router(svc: LockService, metrics: Arc<Metrics>, auth: Authenticator) -> Router {
    Router::new()
        .route("/v1/openapi.json", get(super::openapi::document))
        .route("/v1/acquire", post(acquire))
        .route("/v1/renew", post(renew))
        .route("/v1/release", post(release))
        .route("/v1/locks", get(list))
        .route("/v1/locks/{*resource}", get(get_lock))
        .route("/v1/admin/force-release", post(force_release))
        .route("/v1/admin/signing-keys", get(signing_keys))
        .route("/v1/admin/signing-keys/key-set", get(key_set))
        .with_state(HttpState { svc: svc.clone(), metrics: metrics.clone(), auth: auth.clone() })
        .merge(status_router(svc, metrics, auth))
}

/// Metrics, health, status and the operator endpoints: what the status
/// port serves (and the main port too).
/// With tenants, the operator endpoints (hot resources, log level) need
/// `admin` on the empty prefix; metrics, health and status stay open (they
/// name no resource).
pub(crate) fn status_router(svc: LockService, metrics: Arc<Metrics>, auth: Authenticator) -> Router {
    Router::new()
        .route("/v1/status", get(status))
        .route("/v1/admin/hot", get(hot))
        .route("/v1/admin/log-level", get(get_log_level))
        .route("/v1/admin/log-level", put(set_log_level))
        .route("/metrics", get(metrics_text))
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .with_state(HttpState { svc, metrics, auth })
}

fn error_response(e: &LockError) -> Response {
    ApiError::from(e).into_response()
}

fn reply(r: Result<Value, LockError>) -> Response {
    match r {
        Ok(v) => Json(v).into_response(),
        Err(e) => error_response(&e),
    }
}

async fn acquire(State(s): State<HttpState>, Who(who): Who, JsonBody(b): JsonBody<AcquireBody>) -> Response {
    reply(call::acquire(&s.svc, &s.metrics, who, b.into()).await.map(|g| {
        json!({
            "resource": g.grant.resource.as_str(),
            "lease_id": g.grant.lease_id.to_string(),
            "fencing_token": g.grant.token.0,
            "ttl_ms": g.grant.ttl_ms,
            "expires_at_unix_ms": g.expires_at_unix_ms,
            "waited": g.grant.waited,
            "request_id": g.request_id.as_str(),
            "signed_token": g.signed_token,
        })
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LeaseBody {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    lease_id: String,
}

async fn renew(State(s): State<HttpState>, Who(who): Who, JsonBody(b): JsonBody<LeaseBody>) -> Response {
    let call = async {
        who?.check(Permission::Acquire, &b.resource)?;
        s.svc.renew(&b.resource, &b.lease_id).await
    };
    reply(
        observed(&s.metrics, "renew", &b.resource, call).await.map(
            |r| json!({ "fencing_token": r.token.0, "ttl_ms": r.ttl_ms, "expires_at_unix_ms": r.expires_at_unix_ms }),
        ),
    )
}

async fn release(State(s): State<HttpState>, Who(who): Who, JsonBody(b): JsonBody<LeaseBody>) -> Response {
    let call = async {
        who?.check(Permission::Acquire, &b.resource)?;
        s.svc.release(&b.resource, &b.lease_id).await
    };
    reply(
        observed(&s.metrics, "release", &b.resource, call)
            .await
            .map(|r| json!({ "released": r.released, "was_holder": r.was_holder })),
    )
}

pub(crate) fn view_json(v: &LockView) -> Value {
    json!({
        "resource": v.resource.as_str(),
        "held": v.held,
        "holder": v.holder,
        "fencing_token": v.token.0,
        "waiters": v.waiters,
        "remaining_ttl_ms": v.remaining_ttl_ms,
        "ttl_ms": v.ttl_ms,
    })
}

async fn get_lock(State(s): State<HttpState>, Who(who): Who, Path(resource): Path<String>) -> Response {
    let call = async {
        let who = who?;
        who.check(Permission::Read, &resource)?;
        who.charge_request(&Clock)?;
        s.svc.get(&resource).await
    };
    reply(observed(&s.metrics, "get", &resource, call).await.map(|v| view_json(&v)))
}

/// The parameters of `GET /v1/locks`.
const LIST_PARAMS: [&str; 3] = ["prefix", "page_size", "page_token"];

async fn list(State(s): State<HttpState>, Who(who): Who, RawQuery(query): RawQuery) -> Response {
    let mut q = match Params::parse(query.as_deref()) {
        Ok(q) => q,
        Err(e) => return e.into_response(),
    };
    let (prefix, page_token) = (q.text("prefix").unwrap_or_default(), q.text("page_token").unwrap_or_default());
    let page_size = match q.parsed::<u32>("page_size", "a page size").and_then(|n| q.finish(&LIST_PARAMS).map(|()| n)) {
        Ok(n) => n.unwrap_or(0),
        Err(e) => return e.into_response(),
    };
    let call = async {
        let who = who?;
        who.charge_request(&Clock)?;
        s.svc.list_where(&prefix, page_size, &page_token, |name| who.may(Permission::Read, name)).await
    };
    reply(observed(&s.metrics, "list", &prefix, call).await.map(
        |(views, next)| json!({ "locks": views.iter().map(view_json).collect::<Vec<_>>(), "next_page_token": next }),
    ))
}

async fn status(State(s): State<HttpState>) -> Response {
    Json(s.svc.status()).into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ForceBody {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    caller: String,
    #[serde(default)]
    reason: String,
}

async fn force_release(State(s): State<HttpState>, Who(who): Who, JsonBody(b): JsonBody<ForceBody>) -> Response {
    let call = async {
        let who = who?;
        who.check(Permission::Admin, &b.resource)?;
        let audit_caller = who.audit_caller(&b.caller);
        s.svc.force_release(&b.resource, &audit_caller, &b.reason).await
    };
    reply(observed(&s.metrics, "force_release", &b.resource, call).await.map(|r| {
        json!({
            "released": r.released_token.is_some(),
            "released_token": r.released_token.map_or(0, |t| t.0),
            "log_index": r.log_index,
        })
    }))
}

// Any authenticated caller, as over gRPC: public keys only, but the read is
// linearizable (a quorum round), which anonymous callers must not trigger.
async fn signing_keys(State(s): State<HttpState>, Who(who): Who) -> Response {
    if let Err(e) = who {
        return error_response(&e);
    }
    reply(s.svc.signing_keys().await.map(|(keys, now)| json!({ "keys": keys, "now_unix_ms": now })))
}

/// Exactly the `fencer_token::KeySet` file proxies load.
async fn key_set(State(s): State<HttpState>, Who(who): Who) -> Response {
    if let Err(e) = who {
        return error_response(&e);
    }
    match s.svc.signing_keys().await {
        Ok((keys, _)) => match crate::signing::key_set(&keys) {
            Ok(set) => ([(header::CONTENT_TYPE, "application/json")], set.to_json()).into_response(),
            Err(e) => error_response(&LockError::Internal(e)),
        },
        Err(e) => error_response(&e),
    }
}

async fn metrics_text(State(s): State<HttpState>) -> Response {
    s.svc.refresh_health_metrics();
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], s.metrics.encode())
        .into_response()
}

/// Live = raft runs and the state and audit files are writable; a node that
/// is not live never recovers on its own (restart it).
async fn livez(State(s): State<HttpState>) -> Response {
    let h = s.svc.health();
    let code = if h.live { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (code, format!("{}: {}\n", if h.live { "ok" } else { "not live" }, h.live_reason)).into_response()
}

/// Ready = a leader is known and, on the leader, a quorum acknowledged it
/// within one election timeout (see `LockService::health`).
async fn readyz(State(s): State<HttpState>) -> Response {
    let h = s.svc.health();
    let code = if h.ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (code, format!("{}: {}\n", if h.ready { "ready" } else { "not ready" }, h.ready_reason)).into_response()
}

/// The busiest resources (module `hot`).
async fn hot(State(s): State<HttpState>, Who(who): Who, RawQuery(query): RawQuery) -> Response {
    if let Err(e) = who.and_then(|c| c.check_cluster_admin()) {
        return error_response(&e);
    }
    let parsed = Params::parse(query.as_deref()).and_then(|mut q| {
        let by = q.parsed::<HotOrder>("by", "one of acquires, waiters, hold")?;
        let limit = q.parsed::<usize>("limit", "a number")?;
        q.finish(&["by", "limit"])?;
        Ok((by, limit))
    });
    let (by, limit) = match parsed {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    let limit = limit.unwrap_or(DEFAULT_HOT_LIMIT);
    let max = s.svc.hot_capacity().max(1);
    if limit == 0 || limit > max {
        return ApiError::invalid("limit", format!("limit: {limit} is outside 1..={max} (the tracker's capacity)"))
            .into_response();
    }
    Json(s.svc.hot(by.unwrap_or(HotOrder::Acquires), limit)).into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LogLevelBody {
    filter: String,
}

fn no_log_control() -> Response {
    ApiError::no_log_control().into_response()
}

async fn get_log_level(State(s): State<HttpState>, Who(who): Who) -> Response {
    if let Err(e) = who.and_then(|c| c.check_cluster_admin()) {
        return error_response(&e);
    }
    match s.svc.log_control() {
        Some(c) => Json(json!({ "filter": c.current() })).into_response(),
        None => no_log_control(),
    }
}

/// Replaces the log filter; a filter that does not parse answers 400 and
/// the old one stays.
async fn set_log_level(State(s): State<HttpState>, Who(who): Who, JsonBody(b): JsonBody<LogLevelBody>) -> Response {
    if let Err(e) = who.and_then(|c| c.check_cluster_admin()) {
        return error_response(&e);
    }
    let Some(c) = s.svc.log_control() else { return no_log_control() };
    let previous = c.current();
    match c.set(&b.filter) {
        Ok(()) => {
            let filter = c.current();
            tracing::warn!(%previous, %filter, "log filter changed through the admin endpoint");
            Json(json!({ "filter": filter, "previous": previous })).into_response()
        }
        Err(e) => ApiError::invalid("filter", format!("filter: {e}")).into_response(),
    }
}
