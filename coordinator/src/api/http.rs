//! JSON over HTTP on the node's port, for curl users and scripts, plus
//! `/metrics`, `/livez` and `/readyz`.
//!
//! | method | path | body / query |
//! |---|---|---|
//! | POST | `/v1/acquire` | `{resource, request_id?, ttl_ms?, wait_timeout_ms?, holder?}` |
//! | POST | `/v1/renew` | `{resource, lease_id}` |
//! | POST | `/v1/release` | `{resource, lease_id}` |
//! | GET | `/v1/locks/{resource}` | |
//! | GET | `/v1/locks` | `?prefix=&page_size=&page_token=` |
//! | GET | `/v1/status` | |
//! | POST | `/v1/admin/force-release` | `{resource, caller?, reason?}` |
//!
//! Errors answer `{"error": {"code", "reason", "message", "metadata"}}` with
//! the HTTP status of `api::errors::http_status`.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use fencer_proto::LEADER_ADDR_HEADER;
use serde::Deserialize;
use serde_json::{Value, json};

use super::errors::{grpc_code, http_status, metadata};
use super::grpc::observed;
use crate::metrics::Metrics;
use crate::service::{self, LockError, LockService, LockView};

#[derive(Clone)]
struct HttpState {
    svc: LockService,
    metrics: Arc<Metrics>,
    election_timeout: Duration,
}

/// The JSON, metrics and health routes.
pub(crate) fn router(svc: LockService, metrics: Arc<Metrics>, election_timeout: Duration) -> Router {
    Router::new()
        .route("/v1/acquire", post(acquire))
        .route("/v1/renew", post(renew))
        .route("/v1/release", post(release))
        .route("/v1/locks", get(list))
        .route("/v1/locks/{*resource}", get(get_lock))
        .route("/v1/status", get(status))
        .route("/v1/admin/force-release", post(force_release))
        .route("/metrics", get(metrics_text))
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(HttpState { svc, metrics, election_timeout })
}

fn error_response(e: &LockError) -> Response {
    let body = json!({
        "error": {
            "code": format!("{:?}", grpc_code(e)).to_uppercase(),
            "reason": e.reason(),
            "message": e.to_string(),
            "metadata": metadata(e),
        }
    });
    let status = StatusCode::from_u16(http_status(e)).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = (status, Json(body)).into_response();
    if let LockError::NotLeader { leader_addr: Some(addr), .. } = e
        && let Ok(v) = HeaderValue::from_str(addr)
    {
        resp.headers_mut().insert(LEADER_ADDR_HEADER, v);
    }
    resp
}

fn reply(r: Result<Value, LockError>) -> Response {
    match r {
        Ok(v) => Json(v).into_response(),
        Err(e) => error_response(&e),
    }
}

#[derive(Deserialize)]
struct AcquireBody {
    resource: String,
    #[serde(default)]
    request_id: String,
    #[serde(default)]
    ttl_ms: u64,
    #[serde(default)]
    wait_timeout_ms: u64,
    #[serde(default)]
    holder: String,
}

async fn acquire(State(s): State<HttpState>, Json(b): Json<AcquireBody>) -> Response {
    let req = service::AcquireRequest {
        resource: b.resource,
        request_id: b.request_id,
        ttl_ms: b.ttl_ms,
        wait_timeout_ms: b.wait_timeout_ms,
        holder: b.holder,
    };
    reply(observed(&s.metrics, "acquire", s.svc.acquire(req)).await.map(|g| {
        json!({
            "resource": g.grant.resource.as_str(),
            "lease_id": g.grant.lease_id.to_string(),
            "fencing_token": g.grant.token.0,
            "ttl_ms": g.grant.ttl_ms,
            "expires_at_unix_ms": g.expires_at_unix_ms,
            "waited": g.grant.waited,
            "request_id": g.request_id.as_str(),
        })
    }))
}

#[derive(Deserialize)]
struct LeaseBody {
    resource: String,
    lease_id: String,
}

async fn renew(State(s): State<HttpState>, Json(b): Json<LeaseBody>) -> Response {
    reply(
        observed(&s.metrics, "renew", s.svc.renew(&b.resource, &b.lease_id)).await.map(
            |r| json!({ "fencing_token": r.token.0, "ttl_ms": r.ttl_ms, "expires_at_unix_ms": r.expires_at_unix_ms }),
        ),
    )
}

async fn release(State(s): State<HttpState>, Json(b): Json<LeaseBody>) -> Response {
    reply(
        observed(&s.metrics, "release", s.svc.release(&b.resource, &b.lease_id))
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

async fn get_lock(State(s): State<HttpState>, Path(resource): Path<String>) -> Response {
    reply(observed(&s.metrics, "get", s.svc.get(&resource)).await.map(|v| view_json(&v)))
}

#[derive(Deserialize)]
struct ListQuery {
    #[serde(default)]
    prefix: String,
    #[serde(default)]
    page_size: u32,
    #[serde(default)]
    page_token: String,
}

async fn list(State(s): State<HttpState>, Query(q): Query<ListQuery>) -> Response {
    reply(observed(&s.metrics, "list", s.svc.list(&q.prefix, q.page_size, &q.page_token)).await.map(
        |(views, next)| json!({ "locks": views.iter().map(view_json).collect::<Vec<_>>(), "next_page_token": next }),
    ))
}

async fn status(State(s): State<HttpState>) -> Response {
    Json(s.svc.status()).into_response()
}

#[derive(Deserialize)]
struct ForceBody {
    resource: String,
    #[serde(default)]
    caller: String,
    #[serde(default)]
    reason: String,
}

async fn force_release(State(s): State<HttpState>, Json(b): Json<ForceBody>) -> Response {
    tracing::warn!(resource = %b.resource, caller = %b.caller, reason = %b.reason, "force-release requested over HTTP");
    reply(observed(&s.metrics, "force_release", s.svc.force_release(&b.resource)).await.map(|r| {
        json!({
            "released": r.released_token.is_some(),
            "released_token": r.released_token.map_or(0, |t| t.0),
            "log_index": r.log_index,
        })
    }))
}

async fn metrics_text(State(s): State<HttpState>) -> Response {
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], s.metrics.encode())
        .into_response()
}

/// Ready = a leader is known and, on the leader, a quorum acknowledged it
/// within one election timeout.
async fn readyz(State(s): State<HttpState>) -> Response {
    let st = s.svc.status();
    let limit = s.election_timeout.as_millis() as u64;
    let voters = st.members.iter().filter(|m| m.role == "voter").count();
    let (ready, why) = match (st.leader_id, st.state) {
        (None, _) => (false, "no leader known".to_string()),
        (Some(_), "leader") if voters == 1 => (true, "leader of a single-node cluster".to_string()),
        (Some(_), "leader") => match st.millis_since_quorum_ack {
            Some(ms) if ms <= limit => (true, format!("leader; quorum acknowledged {ms} ms ago")),
            Some(ms) => (false, format!("leader without a recent quorum (last ack {ms} ms ago)")),
            None => (false, "leader without any quorum acknowledgement yet".to_string()),
        },
        (Some(l), state) => (true, format!("{state}; leader is node {l}")),
    };
    let code = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (code, format!("{}: {why}\n", if ready { "ready" } else { "not ready" })).into_response()
}
