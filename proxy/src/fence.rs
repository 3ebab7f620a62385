//! The fence (P1–P6, P8): classify the request, check its token against the
//! resource's epoch under the fair per-resource guard, persist a raise
//! before forwarding, and hold the guard until the upstream response ends.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use http::{HeaderValue, Request, Response, header};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::{CaptureConnection, capture_connection};

use crate::body::{GuardedBody, ProxyBody};
use crate::clock;
use crate::config::ProxyConfig;
use crate::epoch_store::EpochStore;
use crate::forward::{Forward, ForwardError, captured_connection};
use crate::metrics::{KindLabels, Metrics, UpstreamError};
use crate::names::FencingToken;
use crate::problem::Refusal;
use crate::rejections::{RejectReason, RejectionRecord};
use crate::routes::{ClassifyError, RouteKind};
use crate::signing::TokenVerifier;
use crate::state::{InFlight, ResourceState, Resources};

/// The client's address, put on each request by the server.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PeerAddr(pub(crate) SocketAddr);

/// The identity named by the client's verified certificate (mTLS listener),
/// put on each request by the server; the rejection log's caller.
#[derive(Debug, Clone)]
pub(crate) struct ClientIdentity(pub(crate) Arc<str>);

/// Longest request id taken from a client header; longer ones are replaced.
const MAX_REQUEST_ID_LEN: usize = 128;

/// State shared by every clone of the fence and by the admin API.
#[derive(Debug)]
pub(crate) struct FenceShared {
    pub(crate) config: Arc<ProxyConfig>,
    pub(crate) store: EpochStore,
    pub(crate) resources: Arc<Resources>,
    pub(crate) metrics: Arc<Metrics>,
    /// Parses and verifies tokens before the fence sees them (P7).
    pub(crate) tokens: Arc<TokenVerifier>,
    request_id_prefix: String,
    request_counter: AtomicU64,
}

impl FenceShared {
    pub(crate) fn new(
        config: Arc<ProxyConfig>,
        store: EpochStore,
        resources: Arc<Resources>,
        metrics: Arc<Metrics>,
        tokens: Arc<TokenVerifier>,
    ) -> Self {
        let random = getrandom::u64().unwrap_or_else(|_| clock::unix_ms());
        Self {
            config,
            store,
            resources,
            metrics,
            tokens,
            request_id_prefix: format!("fp-{:08x}", random as u32),
            request_counter: AtomicU64::new(0),
        }
    }
}

/// Tower layer that puts the fence in front of [`Forward`].
#[derive(Debug, Clone)]
pub struct FenceLayer {
    shared: Arc<FenceShared>,
}

impl FenceLayer {
    pub(crate) fn new(shared: Arc<FenceShared>) -> Self {
        Self { shared }
    }
}

impl tower::Layer<Forward> for FenceLayer {
    type Service = Fence;

    fn layer(&self, forward: Forward) -> Fence {
        Fence { shared: self.shared.clone(), forward }
    }
}

/// The fence service: answers refusals itself, forwards everything else.
#[derive(Debug, Clone)]
pub struct Fence {
    shared: Arc<FenceShared>,
    forward: Forward,
}

impl tower::Service<Request<Incoming>> for Fence {
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            this.shared.metrics.in_flight.inc();
            let resp = this.handle(req).await;
            this.shared.metrics.in_flight.dec();
            Ok(resp)
        })
    }
}

/// What the rejection log needs to know about a request.
struct LogCtx {
    method: String,
    caller: String,
    request_id: String,
    route: Option<String>,
    resource: Option<String>,
    token: Option<u64>,
}

fn rejected(reason: RejectReason, detail: impl Into<String>) -> Refusal {
    Refusal::Rejected {
        reason,
        detail: detail.into(),
        resource: None,
        presented_token: None,
        current_epoch: None,
        retry_after_secs: None,
    }
}

fn stale(resource: &ResourceState, token: FencingToken, epoch: u64) -> Refusal {
    Refusal::Rejected {
        reason: RejectReason::StaleToken,
        detail: format!(
            "token {token} is older than resource {}'s epoch {epoch}; a newer lock holder exists, so this write is refused (P1)",
            resource.name
        ),
        resource: Some(resource.name.to_string()),
        presented_token: Some(token.get()),
        current_epoch: Some(epoch),
        retry_after_secs: None,
    }
}

/// Makes a pending upstream call safe to cancel: if the client goes away
/// (hyper drops our future) while the write may be at the upstream, the
/// resource becomes indeterminate before the guard is released (P4).
struct PendingCall {
    resources: Arc<Resources>,
    state: Arc<ResourceState>,
    capture: CaptureConnection,
    in_flight: Option<InFlight>,
}

impl PendingCall {
    fn finish(mut self) -> InFlight {
        self.in_flight.take().expect("finish is called once")
    }
}

impl Drop for PendingCall {
    fn drop(&mut self) {
        if self.in_flight.is_some() {
            let connection = captured_connection(&self.capture);
            self.resources.mark_unknown(
                &self.state,
                "the client went away while its write was at the upstream".into(),
                connection,
            );
            // `in_flight` (and its guard) is dropped only after the mark.
        }
    }
}

impl Fence {
    fn refuse(&self, log: &LogCtx, refusal: Refusal) -> Response<ProxyBody> {
        let status = refusal.status();
        if let Refusal::Rejected { reason, current_epoch, resource, .. } = &refusal {
            let m = &self.shared.metrics;
            m.rejected(*reason);
            let record = RejectionRecord {
                seq: 0,
                time: clock::wall_rfc3339(),
                resource: resource.clone().or_else(|| log.resource.clone()),
                presented_token: log.token,
                current_epoch: *current_epoch,
                caller: log.caller.clone(),
                method: log.method.clone(),
                route: log.route.clone(),
                request_id: log.request_id.clone(),
                reason: *reason,
                status: status.as_u16(),
            };
            tracing::info!(
                reason = reason.as_str(),
                resource = record.resource.as_deref().unwrap_or("-"),
                token = ?log.token,
                epoch = ?current_epoch,
                caller = %log.caller,
                request_id = %log.request_id,
                "write refused"
            );
            if !self.shared.store.log_rejection(record) {
                m.rejection_log_dropped.inc();
            }
        }
        let refusal = match refusal {
            Refusal::Rejected { resource: None, reason, detail, presented_token, current_epoch, retry_after_secs } => {
                Refusal::Rejected {
                    resource: log.resource.clone(),
                    reason,
                    detail,
                    presented_token,
                    current_epoch,
                    retry_after_secs,
                }
            }
            other => other,
        };
        refusal.into_response(Some(&log.request_id))
    }

    fn request_id(&self, req: &Request<Incoming>) -> String {
        let header = &self.shared.config.request_id_header;
        req.headers()
            .get(header)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty() && v.len() <= MAX_REQUEST_ID_LEN)
            .map_or_else(
                || {
                    let n = self.shared.request_counter.fetch_add(1, Ordering::Relaxed);
                    format!("{}-{n}", self.shared.request_id_prefix)
                },
                str::to_owned,
            )
    }

    async fn handle(&self, mut req: Request<Incoming>) -> Response<ProxyBody> {
        let started = clock::now();
        let shared = &self.shared;
        let config = &shared.config;
        let request_id = self.request_id(&req);
        if let Ok(v) = HeaderValue::from_str(&request_id) {
            req.headers_mut().insert(config.request_id_header.clone(), v);
        }
        let mut log = LogCtx {
            method: req.method().to_string(),
            caller: match (req.extensions().get::<ClientIdentity>(), req.extensions().get::<PeerAddr>()) {
                (Some(id), _) => id.0.to_string(),
                (None, Some(peer)) => peer.0.to_string(),
                (None, None) => "unknown".to_owned(),
            },
            request_id,
            route: None,
            resource: None,
            token: None,
        };

        let declared = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if let Some(len) = declared.filter(|len| *len > config.limits.max_request_body_bytes) {
            let detail = format!(
                "the body is {len} bytes; limits.max_request_body_bytes is {}",
                config.limits.max_request_body_bytes
            );
            return self.refuse(&log, rejected(RejectReason::BodyTooLarge, detail));
        }

        let classified = match config.router.classify(req.method(), req.uri(), req.headers()) {
            Ok(c) => c,
            Err(e) => {
                let reason = match &e {
                    ClassifyError::NoRoute => RejectReason::NoRoute,
                    ClassifyError::AmbiguousPath | ClassifyError::Repeated(..) => RejectReason::AmbiguousRequest,
                    ClassifyError::InvalidResource { route_template, .. } => {
                        log.route = Some(route_template.clone());
                        RejectReason::InvalidResource
                    }
                };
                return self.refuse(&log, rejected(reason, e.to_string()));
            }
        };
        let kind = classified.route.kind();
        log.route = Some(classified.route.path_template().to_owned());
        log.resource = classified.resource.as_ref().map(ToString::to_string);

        // P6: the sidecar decides the resource; a client's claim must agree.
        let mut claims = req.headers().get_all(&config.resource_header).iter();
        if let Some(claim) = claims.next() {
            let agrees = claims.next().is_none()
                && classified.resource.as_ref().is_some_and(|r| claim.as_bytes() == r.as_str().as_bytes());
            if !agrees {
                let detail = format!(
                    "the {} header says {:?} but this route writes resource {:?}; the sidecar decides the resource (P6)",
                    config.resource_header,
                    String::from_utf8_lossy(claim.as_bytes()),
                    log.resource.as_deref().unwrap_or("(none)")
                );
                return self.refuse(&log, rejected(RejectReason::ResourceMismatch, detail));
            }
        }

        if kind == RouteKind::Read {
            shared.metrics.accepted.get_or_create(&KindLabels::from(kind)).inc();
            return match self.forward.call(req).await {
                Ok((resp, upstream)) => {
                    shared.metrics.upstream_latency.observe(upstream.as_secs_f64());
                    shared
                        .metrics
                        .added_latency
                        .observe((clock::now() - started).saturating_sub(upstream).as_secs_f64());
                    resp.map(BodyExt::boxed)
                }
                Err(e) => self.upstream_failed(&log, e, None),
            };
        }

        let Some(resource) = classified.resource else {
            return self.refuse(&log, Refusal::Internal("write route without a resource".into()));
        };
        let mut tokens = req.headers().get_all(&config.token_header).iter();
        let token = match (tokens.next(), tokens.next()) {
            (None, _) => {
                let detail = format!(
                    "route {} is a write (not on the read allow-list) and needs a {} header (P5)",
                    classified.route.path_template(),
                    config.token_header
                );
                return self.refuse(&log, rejected(RejectReason::MissingToken, detail));
            }
            (Some(_), Some(_)) => {
                return self.refuse(
                    &log,
                    rejected(RejectReason::MalformedToken, format!("more than one {} header", config.token_header)),
                );
            }
            // P7: parsed and, when signed, verified before the epoch can move.
            (Some(v), None) => match shared.tokens.check(v.as_bytes(), &resource) {
                Ok(t) => t,
                Err(refusal) => {
                    log.token = refusal.claimed;
                    let detail = format!("{}: {}", config.token_header, refusal.detail);
                    return self.refuse(&log, rejected(refusal.reason, detail));
                }
            },
        };
        log.token = Some(token.get());
        let state = match shared.resources.get_or_create(&resource) {
            Ok(s) => s,
            Err(e) => {
                return self.refuse(&log, rejected(RejectReason::TooManyResources, e.to_string()));
            }
        };

        let in_flight = match self.admit(&state, token).await {
            Ok(g) => g,
            Err(refusal) => return self.refuse(&log, refusal),
        };
        shared.metrics.accepted.get_or_create(&KindLabels::from(kind)).inc();
        let admitted = clock::now();

        let capture = capture_connection(&mut req);
        let pending = PendingCall {
            resources: shared.resources.clone(),
            state: state.clone(),
            capture,
            in_flight: Some(in_flight),
        };
        let result = self.forward.call(req).await;
        match result {
            Ok((resp, upstream)) => {
                let in_flight = pending.finish();
                shared.metrics.upstream_latency.observe(upstream.as_secs_f64());
                let proxy_time = (admitted - started) + (clock::now() - admitted).saturating_sub(upstream);
                shared.metrics.added_latency.observe(proxy_time.as_secs_f64());
                // The shared guard travels with the body: a higher token
                // waits until this response has fully streamed (P3).
                resp.map(|body| GuardedBody::new(body.boxed(), in_flight).boxed())
            }
            Err(e) => {
                let connection = captured_connection(&pending.capture);
                let in_flight = pending.finish();
                let resp = self.upstream_failed(&log, e, Some((&state, connection)));
                // Marked indeterminate (if it was) before the guard goes.
                drop(in_flight);
                resp
            }
        }
    }

    fn upstream_failed(
        &self,
        log: &LogCtx,
        err: ForwardError,
        fenced: Option<(&Arc<ResourceState>, Option<crate::forward::ConnectionClosed>)>,
    ) -> Response<ProxyBody> {
        let m = &self.shared.metrics;
        match err {
            ForwardError::Connect(msg) => {
                m.upstream_error(UpstreamError::Connect);
                tracing::warn!(request_id = %log.request_id, error = %msg, "upstream unreachable");
                self.refuse(
                    log,
                    Refusal::UpstreamUnreachable(format!("{msg}; nothing was sent, the request may be retried")),
                )
            }
            ForwardError::OutcomeUnknown(reason) => {
                m.upstream_error(UpstreamError::OutcomeUnknown);
                tracing::warn!(request_id = %log.request_id, resource = log.resource.as_deref().unwrap_or("-"), %reason, "upstream outcome unknown");
                if let Some((state, connection)) = fenced {
                    self.shared.resources.mark_unknown(state, reason, connection);
                }
                let resource = log.resource.clone().unwrap_or_default();
                self.refuse(log, Refusal::OutcomeUnknown { resource })
            }
        }
    }

    /// P1–P3, P8: admits `token` for `state` and returns the held shared
    /// guard, or the refusal.
    async fn admit(&self, state: &Arc<ResourceState>, token: FencingToken) -> Result<InFlight, Refusal> {
        let t = token.get();
        let shared = &self.shared;
        let epoch = state.epoch();
        if t < epoch {
            return Err(stale(state, token, epoch));
        }
        if t == epoch && state.is_persisted() {
            // Equal tokens share the guard and run concurrently.
            let guard = state.guard.clone().read_owned().await;
            // Re-check: a higher token may have raised E while we queued.
            let epoch = state.epoch();
            if t < epoch {
                return Err(stale(state, token, epoch));
            }
            return Ok(state.enter(guard));
        }
        if t > epoch {
            self.check_raise(state, token, epoch)?;
        }
        // A higher token takes the exclusive guard: it waits for every
        // lower-token write in flight to finish. The guard is FIFO-fair, so
        // old-token writes arriving later queue behind it.
        let waiting = clock::now();
        let exclusive = state.exclusive().await;
        shared.metrics.drain_wait.observe((clock::now() - waiting).as_secs_f64());
        let epoch = state.epoch();
        if t < epoch {
            return Err(stale(state, token, epoch));
        }
        if t > epoch || !state.is_persisted() {
            if t > epoch {
                // Re-check: a write we waited for may have ended in an
                // unknown outcome.
                self.check_raise(state, token, epoch)?;
            }
            let persisting = clock::now();
            // P2: durable before any byte of this request goes upstream.
            let stored =
                shared.store.raise(&state.name, t).await.map_err(|e| Refusal::StoreUnavailable(e.to_string()))?;
            shared.metrics.epoch_persist.observe((clock::now() - persisting).as_secs_f64());
            state.set_epoch(stored);
            if t > epoch {
                shared.metrics.epoch_advances.inc();
                tracing::info!(resource = %state.name, from = epoch, to = stored, "epoch advanced");
            }
            if stored > t {
                return Err(stale(state, token, stored));
            }
        }
        Ok(state.enter(exclusive.downgrade()))
    }

    /// What a raise from `epoch` to `token` must pass: not indeterminate
    /// (P4), not a jump beyond the cap (P7's second line of defence: even a
    /// genuinely signed token, say from a leaked key, moves E only so far).
    fn check_raise(&self, state: &ResourceState, token: FencingToken, epoch: u64) -> Result<(), Refusal> {
        if let Some((status, retry_after)) = self.shared.resources.indeterminate(state) {
            return Err(Refusal::Rejected {
                reason: RejectReason::Indeterminate,
                detail: format!(
                    "resource {} is indeterminate ({}); token {token} may not advance its epoch until the quarantine passes or an operator clears it (P4)",
                    state.name, status.reason
                ),
                resource: Some(state.name.to_string()),
                presented_token: Some(token.get()),
                current_epoch: Some(epoch),
                retry_after_secs: Some(retry_after),
            });
        }
        let max = self.shared.config.max_epoch_jump;
        if token.get() - epoch > max {
            return Err(Refusal::Rejected {
                reason: RejectReason::TokenJumpTooLarge,
                detail: format!(
                    "token {token} is {} above resource {}'s epoch {epoch}; max_epoch_jump is {max}. If the token is genuine, an operator can raise the epoch first",
                    token.get() - epoch,
                    state.name
                ),
                resource: Some(state.name.to_string()),
                presented_token: Some(token.get()),
                current_epoch: Some(epoch),
                retry_after_secs: None,
            });
        }
        Ok(())
    }
}
