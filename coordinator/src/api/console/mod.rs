//! The operator console on a coordinator node: the page (`fencer_console`)
//! at `/ui/` and its data under `/ui/api/`, on the node's port and on the
//! status port (read only there: that port serves no lock API, so no
//! actions either).
//!
//! | method | path | what |
//! |---|---|---|
//! | GET | `/ui/api/session` | what this server is, who the caller is, whether actions are served |
//! | GET | `/ui/api/status` | `/v1/status` plus liveness |
//! | GET | `/ui/api/locks` | `?prefix=&page_size=&page_token=`: locks with their FIFO waiters |
//! | GET | `/ui/api/lock` | `?resource=`: one lock, its whole queue, its newest audit lines |
//! | GET | `/ui/api/hot` | `?by=&limit=`: the hot resources the caller may read |
//! | GET | `/ui/api/audit` | `?resource=&prefix=&holder=&op=&since_unix_ms=&until_unix_ms=&limit=` |
//! | GET | `/ui/api/rates` | the charts' series (module `sampler`) |
//! | POST | `/ui/api/force-release` | `{resource, caller, reason}` (node port only; page token required) |
//!
//! Security is the API's: every endpoint authenticates the caller as the
//! JSON API does (bearer token, client certificate); lock data lists only
//! what the caller may `read`; the force-release needs `admin` on the
//! resource and is the very call `POST /v1/admin/force-release` makes, so it
//! is audited the same way. Actions also need the page token in a header
//! (`fencer_console::PageToken`), which makes them CSRF-safe.
//!
//! Lock data is this node's applied state, read locally (no raft round, no
//! tenant request-rate charge): a follower's view may trail the leader's by
//! its replication lag. Remaining lease time is exact only on a ready
//! leader (`leases_authoritative`); elsewhere it is this node's estimate.
//! Lease ids are shortened to 8 hex digits: they are capabilities.

mod audit_tail;
mod sampler;

use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, extract::FromRequestParts};
use fencer_console::{PageToken, PageTokenRefused, Series};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::call::observed;
use super::errors::{grpc_code, http_status, metadata};
use crate::audit::{AuditOp, AuditRecord};
use crate::clock::Clock;
use crate::hot::HotOrder;
use crate::metrics::Metrics;
use crate::service::{LockError, LockService};
use crate::state_machine::{LockState, ResourceState};
use crate::tenants::{Authenticator, Caller, Permission};
use crate::tls::ConnInfo;
use crate::types::{InvalidField, ResourceName, check_resource_chars};

/// Locks per page when none is asked for.
const DEFAULT_PAGE: u32 = 50;
/// Waiters listed per lock in a listing (the lock's own page lists all).
const WAITERS_PER_LISTED_LOCK: usize = 10;
/// Audit lines per search when none is asked for, and at most.
const DEFAULT_AUDIT_LINES: usize = 100;
const MAX_AUDIT_LINES: usize = 1000;
/// Audit lines on a lock's page.
const LOCK_AUDIT_LINES: usize = 50;
/// Hex digits of a lease id the console shows.
const LEASE_ID_SHOWN: usize = 8;

/// The console of one node: its page token, its chart series and what its
/// endpoints read. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Console {
    inner: Arc<Inner>,
}

struct Inner {
    svc: LockService,
    metrics: Arc<Metrics>,
    auth: Authenticator,
    audit_dir: Option<PathBuf>,
    series: Arc<Series>,
    token: PageToken,
}

#[derive(Clone)]
struct ConsoleState {
    inner: Arc<Inner>,
    /// This port serves actions (the node's port, not the status port).
    actions: bool,
}

impl Console {
    /// A console for this node; `audit_dir` is where its audit log is, if
    /// it writes one.
    pub(crate) fn new(
        svc: LockService,
        metrics: Arc<Metrics>,
        auth: Authenticator,
        audit_dir: Option<PathBuf>,
    ) -> std::io::Result<Self> {
        let series = Arc::new(Series::new(&sampler::NAMES));
        let token = PageToken::generate()?;
        Ok(Self { inner: Arc::new(Inner { svc, metrics, auth, audit_dir, series, token }) })
    }

    /// `/ui/` and `/ui/api/…`; with `actions`, the force-release too.
    pub(crate) fn router(&self, actions: bool) -> Router {
        let mut api = Router::new()
            .route("/ui/api/session", get(session))
            .route("/ui/api/status", get(status))
            .route("/ui/api/locks", get(locks))
            .route("/ui/api/lock", get(lock))
            .route("/ui/api/hot", get(hot))
            .route("/ui/api/audit", get(audit))
            .route("/ui/api/rates", get(rates));
        if actions {
            api = api.route("/ui/api/force-release", post(force_release));
        }
        let api = api.with_state(ConsoleState { inner: self.inner.clone(), actions });
        fencer_console::assets_router(self.inner.token.clone()).merge(fencer_console::secured(api))
    }

    /// The sampler task of the charts; ends when `shutdown` turns true.
    pub(crate) fn sample(&self, shutdown: tokio::sync::watch::Receiver<bool>) -> impl Future<Output = ()> + use<> {
        sampler::run(self.inner.metrics.clone(), self.inner.series.clone(), shutdown)
    }
}

/// Why a console request was refused; becomes its answer in one place.
#[derive(Debug, thiserror::Error)]
enum Refusal {
    /// The service refused (authentication, permission, invalid field, …).
    #[error(transparent)]
    Lock(#[from] LockError),
    /// A query parameter of the console's own is invalid.
    #[error("{0}")]
    BadQuery(String),
    /// An action without this process's page token.
    #[error(transparent)]
    PageToken(#[from] PageTokenRefused),
    /// The audit files could not be read.
    #[error("audit log: {0}")]
    Audit(std::io::Error),
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let (status, code, reason, meta) = match &self {
            Self::Lock(e) => (
                StatusCode::from_u16(http_status(e)).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                format!("{:?}", grpc_code(e)).to_uppercase(),
                e.reason(),
                metadata(e),
            ),
            Self::BadQuery(_) => {
                (StatusCode::BAD_REQUEST, "INVALID_ARGUMENT".into(), "INVALID_ARGUMENT", Default::default())
            }
            Self::PageToken(_) => (StatusCode::FORBIDDEN, "PERMISSION_DENIED".into(), "PAGE_TOKEN", Default::default()),
            Self::Audit(_) => {
                (StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE".into(), "AUDIT_UNREADABLE", Default::default())
            }
        };
        let body =
            json!({ "error": { "code": code, "reason": reason, "message": self.to_string(), "metadata": meta } });
        (status, Json(body)).into_response()
    }
}

/// The authenticated caller of a console request, as the JSON API finds it.
struct Who(Caller);

impl FromRequestParts<ConsoleState> for Who {
    type Rejection = Refusal;

    async fn from_request_parts(parts: &mut http::request::Parts, s: &ConsoleState) -> Result<Self, Self::Rejection> {
        let conn = parts.extensions.get::<ConnInfo>().cloned().unwrap_or_default();
        let authorization = parts.headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        Ok(Who(s.inner.auth.caller(&conn, authorization)?))
    }
}

async fn session(State(s): State<ConsoleState>, Who(who): Who, conn: Option<axum::Extension<ConnInfo>>) -> Json<Value> {
    let status = s.inner.svc.status();
    let certificate = conn.and_then(|c| c.0.client_identity.as_deref().map(str::to_string));
    Json(json!({
        "kind": "coordinator",
        "node_id": status.node_id,
        "version": status.version,
        "actions": s.actions,
        "auth": {
            "tenants": s.inner.auth.enabled(),
            // The verified client certificate of this connection (mTLS), if any.
            "client_certificate": certificate,
        },
        "caller": {
            "tenant": who.name(),
            "cluster_admin": who.check_cluster_admin().is_ok(),
        },
        "audit_log": s.inner.audit_dir.is_some(),
    }))
}

async fn status(State(s): State<ConsoleState>, Who(_): Who) -> Json<Value> {
    let health = s.inner.svc.health();
    let mut v = serde_json::to_value(s.inner.svc.status()).unwrap_or_default();
    if let Value::Object(m) = &mut v {
        m.insert("live".into(), health.live.into());
        m.insert("live_reason".into(), health.live_reason.into());
        m.insert("now_unix_ms".into(), Clock.wall_ms().into());
    }
    Json(v)
}

/// One lock as the console shows it.
#[derive(Debug, Serialize)]
struct LockEntry {
    resource: String,
    held: bool,
    holder: String,
    fencing_token: u64,
    ttl_ms: u64,
    /// This node's deadline of the lease (exact on a ready leader).
    remaining_ttl_ms: Option<u64>,
    granted_at_unix_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lease_id_prefix: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    request_id: Option<String>,
    waiters_total: usize,
    waiters: Vec<WaiterEntry>,
    /// Whether this caller may force-release it.
    may_force_release: bool,
}

/// One queued request, in FIFO order.
#[derive(Debug, Serialize)]
struct WaiterEntry {
    position: usize,
    holder: String,
    ttl_ms: u64,
    /// When it joined the queue (leader wall time of its entry).
    queued_at_unix_ms: Option<u64>,
    waited_ms: Option<u64>,
}

fn shortened(lease_id: &str) -> String {
    lease_id.chars().take(LEASE_ID_SHOWN).collect()
}

impl Inner {
    fn entry(&self, state: &LockState, name: &str, r: &ResourceState, who: &Caller, waiters: usize) -> LockEntry {
        let now = Clock.wall_ms();
        let lock = r.lock.as_ref();
        let waiters_shown = r
            .waiters
            .iter()
            .take(waiters)
            .enumerate()
            .map(|(i, w)| {
                // A queued request keeps its request-id record while it waits;
                // its time is the entry that queued it.
                let queued = state.dedup(&w.request_id).map(|d| d.at_ms);
                WaiterEntry {
                    position: i + 1,
                    holder: w.holder.to_string(),
                    ttl_ms: w.ttl_ms,
                    queued_at_unix_ms: queued,
                    waited_ms: queued.map(|q| now.saturating_sub(q)),
                }
            })
            .collect();
        LockEntry {
            resource: name.to_string(),
            held: lock.is_some(),
            holder: lock.map(|l| l.holder.to_string()).unwrap_or_default(),
            fencing_token: lock.map_or(0, |l| l.token.0),
            ttl_ms: lock.map_or(0, |l| l.ttl_ms),
            remaining_ttl_ms: lock
                .and_then(|l| self.svc.inner.leases.deadline(&l.lease_id))
                .map(|d| Clock.millis_until(d)),
            granted_at_unix_ms: lock.map(|l| l.granted_at_ms),
            lease_id_prefix: lock.map(|l| shortened(&l.lease_id.to_string())),
            request_id: lock.map(|l| l.request_id.as_str().to_string()),
            waiters_total: r.waiters.len(),
            waiters: waiters_shown,
            may_force_release: who.may(Permission::Admin, name),
        }
    }
}

#[derive(Deserialize)]
struct LocksQuery {
    #[serde(default)]
    prefix: String,
    page_size: Option<u32>,
    #[serde(default)]
    page_token: String,
}

async fn locks(
    State(s): State<ConsoleState>,
    Who(who): Who,
    Query(q): Query<LocksQuery>,
) -> Result<Json<Value>, Refusal> {
    check_resource_chars(&q.prefix).map_err(|e| LockError::from(InvalidField::Prefix(e.to_string())))?;
    let max = s.inner.svc.policy().max_page_size;
    let page_size = q.page_size.unwrap_or(DEFAULT_PAGE);
    if page_size == 0 || page_size > max {
        return Err(Refusal::BadQuery(format!("page_size: {page_size} is outside 1..={max}")));
    }
    let after = match q.page_token.as_str() {
        "" => None,
        t => Some(ResourceName::new(t).map_err(|_| LockError::from(InvalidField::PageToken))?),
    };
    let state = s.inner.svc.inner.sm.read();
    use std::ops::Bound;
    let from = match &after {
        Some(a) if a.as_str() >= q.prefix.as_str() => Bound::Excluded(a.as_str()),
        _ => Bound::Included(q.prefix.as_str()),
    };
    let mut out: Vec<LockEntry> = Vec::new();
    let mut next = String::new();
    for (name, r) in state.resources().range::<_, str>((from, Bound::Unbounded)) {
        if !name.as_str().starts_with(&q.prefix) {
            break;
        }
        if !who.may(Permission::Read, name.as_str()) {
            continue;
        }
        if out.len() == page_size as usize {
            next = out.last().map(|e| e.resource.clone()).unwrap_or_default();
            break;
        }
        out.push(s.inner.entry(&state, name.as_str(), r, &who, WAITERS_PER_LISTED_LOCK));
    }
    drop(state);
    Ok(Json(json!({
        "locks": out,
        "next_page_token": next,
        "leases_authoritative": s.inner.svc.inner.leases.is_authoritative(),
        "now_unix_ms": Clock.wall_ms(),
    })))
}

#[derive(Deserialize)]
struct LockQuery {
    resource: String,
}

async fn lock(
    State(s): State<ConsoleState>,
    Who(who): Who,
    Query(q): Query<LockQuery>,
) -> Result<Json<Value>, Refusal> {
    let name = ResourceName::new(&q.resource).map_err(LockError::from)?;
    who.check(Permission::Read, name.as_str())?;
    let entry = {
        let state = s.inner.svc.inner.sm.read();
        match state.resource(&name) {
            Some(r) => s.inner.entry(&state, name.as_str(), r, &who, usize::MAX),
            None => s.inner.entry(&state, name.as_str(), &ResourceState::default(), &who, 0),
        }
    };
    let filter = AuditFilter { resource: Some(name.to_string()), ..AuditFilter::default() };
    let audit = search_audit(&s.inner, who, filter, LOCK_AUDIT_LINES).await?;
    Ok(Json(json!({
        "lock": entry,
        "audit": audit,
        "leases_authoritative": s.inner.svc.inner.leases.is_authoritative(),
        "now_unix_ms": Clock.wall_ms(),
    })))
}

#[derive(Deserialize)]
struct HotQuery {
    by: Option<HotOrder>,
    limit: Option<usize>,
}

/// The hot resources the caller may read (the tracker ranks all of them;
/// the others are left out, not replaced).
async fn hot(State(s): State<ConsoleState>, Who(who): Who, Query(q): Query<HotQuery>) -> Result<Json<Value>, Refusal> {
    let max = s.inner.svc.hot_capacity().max(1);
    let limit = q.limit.unwrap_or(20);
    if limit == 0 || limit > max {
        return Err(Refusal::BadQuery(format!("limit: {limit} is outside 1..={max} (the tracker's capacity)")));
    }
    let mut hot = s.inner.svc.hot(q.by.unwrap_or(HotOrder::Acquires), limit);
    hot.resources.retain(|r| who.may(Permission::Read, &r.resource));
    Ok(Json(serde_json::to_value(hot).unwrap_or_default()))
}

/// What an audit search keeps; every field is optional.
#[derive(Debug, Default, Deserialize)]
struct AuditFilter {
    resource: Option<String>,
    prefix: Option<String>,
    holder: Option<String>,
    op: Option<String>,
    since_unix_ms: Option<u64>,
    until_unix_ms: Option<u64>,
    limit: Option<usize>,
}

impl AuditFilter {
    fn keeps(&self, r: &AuditRecord, op: Option<AuditOp>) -> bool {
        let resource = r.resource.as_deref();
        self.resource.as_deref().is_none_or(|want| resource == Some(want))
            && self.prefix.as_deref().is_none_or(|p| resource.is_some_and(|res| res.starts_with(p)))
            && self.holder.as_deref().is_none_or(|h| r.holder.as_deref() == Some(h))
            && op.is_none_or(|op| r.op == op)
            && (self.since_unix_ms.is_none() && self.until_unix_ms.is_none()
                || r.unix_ms().is_some_and(|t| {
                    self.since_unix_ms.is_none_or(|s| t >= s) && self.until_unix_ms.is_none_or(|u| t <= u)
                }))
    }
}

async fn audit(
    State(s): State<ConsoleState>,
    Who(who): Who,
    Query(filter): Query<AuditFilter>,
) -> Result<Json<Value>, Refusal> {
    let limit = filter.limit.unwrap_or(DEFAULT_AUDIT_LINES);
    if limit == 0 || limit > MAX_AUDIT_LINES {
        return Err(Refusal::BadQuery(format!("limit: {limit} is outside 1..={MAX_AUDIT_LINES}")));
    }
    if let Some(r) = &filter.resource {
        who.check(Permission::Read, r)?;
    }
    Ok(Json(search_audit(&s.inner, who, filter, limit).await?))
}

/// The newest `limit` audit lines matching `filter` that `who` may read:
/// lines naming a resource need `read` on it; the others (membership,
/// snapshots, signing keys) need cluster admin. Lease ids are shortened.
async fn search_audit(inner: &Inner, who: Caller, filter: AuditFilter, limit: usize) -> Result<Value, Refusal> {
    let Some(dir) = inner.audit_dir.clone() else {
        return Ok(json!({ "enabled": false, "lines": [], "scanned_bytes": 0, "complete": true }));
    };
    let op = match filter.op.as_deref().filter(|o| !o.is_empty()) {
        None => None,
        Some(o) => Some(
            serde_json::from_value::<AuditOp>(Value::String(o.to_string()))
                .map_err(|_| Refusal::BadQuery(format!("op: {o:?} is not an audit operation")))?,
        ),
    };
    let cluster_admin = who.check_cluster_admin().is_ok();
    let found = tokio::task::spawn_blocking(move || {
        audit_tail::newest(&dir, limit, audit_tail::SCAN_BYTES, |r| {
            let readable = match r.resource.as_deref() {
                Some(res) => who.may(Permission::Read, res),
                None => cluster_admin,
            };
            readable && filter.keeps(r, op)
        })
    })
    .await
    .map_err(|e| Refusal::Audit(std::io::Error::other(e)))?
    .map_err(Refusal::Audit)?;
    let lines: Vec<AuditRecord> = found
        .lines
        .into_iter()
        .map(|mut r| {
            r.lease_id = r.lease_id.map(|l| shortened(&l));
            r
        })
        .collect();
    Ok(json!({
        "enabled": true,
        "lines": lines,
        "scanned_bytes": found.scanned_bytes,
        "scan_limit_bytes": audit_tail::SCAN_BYTES,
        "complete": found.complete,
    }))
}

async fn rates(State(s): State<ConsoleState>, Who(_): Who) -> Json<fencer_console::SeriesView> {
    Json(s.inner.series.view())
}

#[derive(Deserialize)]
struct ForceBody {
    resource: String,
    #[serde(default)]
    caller: String,
    #[serde(default)]
    reason: String,
}

/// Exactly `POST /v1/admin/force-release` (and so `fencer force-release`):
/// `admin` on the resource, the caller recorded with its tenant, caller
/// and reason in the replicated command and so in every node's audit log.
async fn force_release(
    State(s): State<ConsoleState>,
    headers: HeaderMap,
    Who(who): Who,
    Json(b): Json<ForceBody>,
) -> Result<Json<Value>, Refusal> {
    s.inner.token.check(&headers)?;
    let call = async {
        who.check(Permission::Admin, &b.resource)?;
        let audit_caller = who.audit_caller(&b.caller);
        tracing::warn!(caller = %audit_caller, reason = %b.reason, "force-release requested in the console");
        s.inner.svc.force_release(&b.resource, &audit_caller, &b.reason).await
    };
    let r = observed(&s.inner.metrics, "force_release", &b.resource, call).await?;
    Ok(Json(json!({
        "released": r.released_token.is_some(),
        "released_token": r.released_token.map_or(0, |t| t.0),
        "log_index": r.log_index,
    })))
}
