//! The HTTP fence layer: classify the request by route (P5, P6), check its
//! token (P7), admit it through the core fence (P1–P3, P8), forward it, and
//! hold the resource's shared guard until the upstream response has
//! streamed. An upstream call that may have landed and then failed leaves
//! the resource indeterminate (P4).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderValue, Request, Response, header};
use http_body::Body as _;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::{CaptureConnection, capture_connection};

use crate::core::clock;
use crate::core::fence::{AdmitError, FenceCore, Rejection, RejectionContext};
use crate::core::metrics::{TimeoutStage, UpstreamError};
use crate::core::rejections::RejectReason;
use crate::core::state::{InFlight, ResourceState, Resources};
use crate::http::HttpConfig;
use crate::http::body::{BodyFailure, ClientBody, GuardedBody, ProxyBody, READ_AHEAD_BYTES, ReadAhead};
use crate::http::forward::{ConnectionClosed, Forward, ForwardError, captured_connection};
use crate::http::problem::Refusal;
use crate::http::routes::{ClassifyError, RouteKind};

/// The client's address, put on each request by the server.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PeerAddr(pub(crate) SocketAddr);

/// The identity named by the client's verified certificate (mTLS listener),
/// put on each request by the server; the rejection log's caller.
#[derive(Debug, Clone)]
pub(crate) struct ClientIdentity(pub(crate) Arc<str>);

/// Longest request id taken from a client header; longer ones are replaced.
const MAX_REQUEST_ID_LEN: usize = 128;

/// Tower layer that puts the fence in front of [`Forward`].
#[derive(Debug, Clone)]
pub struct FenceLayer {
    shared: Arc<FenceCore>,
    http: Arc<HttpConfig>,
}

impl FenceLayer {
    pub(crate) fn new(shared: Arc<FenceCore>, http: Arc<HttpConfig>) -> Self {
        Self { shared, http }
    }
}

impl tower::Layer<Forward> for FenceLayer {
    type Service = Fence;

    fn layer(&self, forward: Forward) -> Fence {
        Fence { shared: self.shared.clone(), http: self.http.clone(), forward }
    }
}

/// The fence service: answers refusals itself, forwards everything else.
#[derive(Debug, Clone)]
pub struct Fence {
    shared: Arc<FenceCore>,
    http: Arc<HttpConfig>,
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
                connection.map(ConnectionClosed::settled),
            );
            // `in_flight` (and its guard) is dropped only after the mark.
        }
    }
}

impl Fence {
    fn refuse(&self, log: &RejectionContext, refusal: Refusal) -> Response<ProxyBody> {
        let refusal = match refusal {
            Refusal::Rejected(mut r) => {
                r.resource = r.resource.or_else(|| log.resource.clone());
                self.shared.record_rejection(log, &r, Refusal::status_of(r.reason).as_u16(), None);
                Refusal::Rejected(r)
            }
            other => other,
        };
        refusal.into_response(Some(&log.request_id))
    }

    fn request_id(&self, req: &Request<Incoming>) -> String {
        req.headers()
            .get(&self.http.request_id_header)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty() && v.len() <= MAX_REQUEST_ID_LEN)
            .map_or_else(|| self.shared.next_request_id(), str::to_owned)
    }

    async fn handle(&self, mut req: Request<Incoming>) -> Response<ProxyBody> {
        let started = clock::now();
        let shared = &self.shared;
        let config = &*self.http;
        let request_id = self.request_id(&req);
        if let Ok(v) = HeaderValue::from_str(&request_id) {
            req.headers_mut().insert(config.request_id_header.clone(), v);
        }
        let mut log = RejectionContext {
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

        if let Err(refusal) = self.check_head(&req) {
            return self.refuse(&log, refusal);
        }
        let declared = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        let max_body = shared.config.limits.max_request_body_bytes;
        if let Some(len) = declared.filter(|len| *len > max_body) {
            let detail = format!("the body is {len} bytes; limits.max_request_body_bytes is {max_body}");
            return self.refuse(&log, Refusal::Rejected(Rejection::new(RejectReason::BodyTooLarge, detail)));
        }
        let req = self.client_body(req);

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
                return self.refuse(&log, Refusal::Rejected(Rejection::new(reason, e.to_string())));
            }
        };
        let kind = classified.route.kind();
        log.route = Some(classified.route.path_template().to_owned());
        log.resource = classified.resource.as_ref().map(ToString::to_string);

        // P6: the sidecar decides the resource; a client's claim must agree.
        let claims: Vec<&HeaderValue> = req.headers().get_all(&config.resource_header).iter().collect();
        let route_resource = log.resource.as_deref().unwrap_or("(none)");
        let mismatch = match claims.as_slice() {
            [] => None,
            [claim] if classified.resource.as_ref().is_some_and(|r| claim.as_bytes() == r.as_str().as_bytes()) => None,
            [claim] => Some(format!(
                "the {} header says {} but this route writes resource {route_resource:?}; the sidecar decides the resource (P6)",
                config.resource_header,
                quote_bounded(claim.as_bytes()),
            )),
            many => Some(format!(
                "the {} header appears {} times; send it at most once (this route writes resource {route_resource:?}, P6)",
                config.resource_header,
                many.len()
            )),
        };
        if let Some(detail) = mismatch {
            return self.refuse(&log, Refusal::Rejected(Rejection::new(RejectReason::ResourceMismatch, detail)));
        }

        if kind == RouteKind::Read {
            let req = match self.read_ahead(req).await {
                Ok(r) => r,
                Err(refusal) => return self.refuse(&log, refusal),
            };
            shared.metrics.accepted(false);
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
                return self.refuse(&log, Refusal::Rejected(Rejection::new(RejectReason::MissingToken, detail)));
            }
            (Some(_), Some(_)) => {
                let detail = format!("more than one {} header", config.token_header);
                return self.refuse(&log, Refusal::Rejected(Rejection::new(RejectReason::MalformedToken, detail)));
            }
            // P7: parsed and, when signed, verified before the epoch can move.
            (Some(v), None) => match shared.tokens.check(v.as_bytes(), &resource) {
                Ok(t) => t,
                Err(refusal) => {
                    log.token = refusal.claimed;
                    let detail = format!("{}: {}", config.token_header, refusal.detail);
                    return self.refuse(&log, Refusal::Rejected(Rejection::new(refusal.reason, detail)));
                }
            },
        };
        log.token = Some(token.get());
        let state = match shared.resources.get_or_create(&resource) {
            Ok(s) => s,
            Err(e) => {
                let rejection = Rejection::new(RejectReason::TooManyResources, e.to_string());
                return self.refuse(&log, Refusal::Rejected(rejection));
            }
        };

        // The body's beginning is read before the epoch can move or anything
        // is forwarded: a small body over the limit, or a client too slow to
        // send it, is refused with nothing sent upstream.
        let mut req = match self.read_ahead(req).await {
            Ok(r) => r,
            Err(refusal) => return self.refuse(&log, refusal),
        };

        // A higher token waits for every lower-token write in flight to end
        // (P3): each holds the shared guard until its response has streamed.
        let exclusive = || async { Ok(state.exclusive().await) };
        let in_flight = match shared.admit(&state, token, exclusive).await {
            Ok(g) => g,
            Err(AdmitError::Rejected(r)) => return self.refuse(&log, Refusal::Rejected(r)),
            Err(AdmitError::StoreUnavailable(e)) => return self.refuse(&log, Refusal::StoreUnavailable(e)),
        };
        shared.metrics.accepted(true);
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

    /// The head limits, answered as problem+json (hyper's own limits, twice
    /// these, answer a bare 431 and close the connection).
    fn check_head(&self, req: &Request<Incoming>) -> Result<(), Refusal> {
        let limits = &self.shared.config.limits;
        let headers = req.headers();
        if headers.len() > limits.max_headers {
            return Err(Refusal::HeadersTooLarge(format!(
                "the request has {} headers; limits.max_headers is {}",
                headers.len(),
                limits.max_headers
            )));
        }
        let target = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
        let size = req.method().as_str().len()
            + target
            + headers.iter().map(|(name, value)| name.as_str().len() + value.len() + 4).sum::<usize>();
        if size > limits.max_header_bytes {
            return Err(Refusal::HeadersTooLarge(format!(
                "the request line and headers are about {size} bytes; limits.max_header_bytes is {}",
                limits.max_header_bytes
            )));
        }
        Ok(())
    }

    /// Wraps the client's body: the size limit (cut the moment it is
    /// crossed) and the client's timeouts.
    fn client_body(&self, req: Request<Incoming>) -> Request<ProxyBody> {
        let config = &self.shared.config;
        let max = usize::try_from(config.limits.max_request_body_bytes).unwrap_or(usize::MAX);
        let timeouts = &config.timeouts;
        req.map(|body| ClientBody::new(Limited::new(body, max), timeouts.body_idle, timeouts.request_body).boxed())
    }

    /// Reads the beginning of a body (see [`READ_AHEAD_BYTES`]): a body of
    /// unknown length, or one whose declared length fits in the read-ahead
    /// (so a client too slow to send it is refused with nothing sent). A
    /// larger declared body, or none, passes as it is.
    async fn read_ahead(&self, req: Request<ProxyBody>) -> Result<Request<ProxyBody>, Refusal> {
        let declared_large = req.body().size_hint().exact().is_some_and(|n| n > READ_AHEAD_BYTES as u64);
        if req.body().is_end_stream() || declared_large {
            return Ok(req);
        }
        let (parts, body) = req.into_parts();
        let max = self.shared.config.limits.max_request_body_bytes;
        let up_to = usize::try_from(max.saturating_add(1)).unwrap_or(usize::MAX).min(READ_AHEAD_BYTES);
        match ReadAhead::read(body, up_to).await {
            Ok(body) => Ok(Request::from_parts(parts, body.boxed())),
            Err(e) => Err(match BodyFailure::of(&*e) {
                Some(BodyFailure::TooLarge) => Refusal::Rejected(Rejection::new(
                    RejectReason::BodyTooLarge,
                    format!(
                        "the body grew past limits.max_request_body_bytes ({max} bytes) before anything was forwarded"
                    ),
                )),
                Some(BodyFailure::TooSlow) => {
                    self.shared.metrics.timed_out(TimeoutStage::RequestBody);
                    Refusal::ClientBodyTimeout(format!("{e}; nothing was forwarded"))
                }
                None => Refusal::ClientBodyFailed(format!("{e}; nothing was forwarded")),
            }),
        }
    }

    fn upstream_failed(
        &self,
        log: &RejectionContext,
        err: ForwardError,
        fenced: Option<(&Arc<ResourceState>, Option<ConnectionClosed>)>,
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
            ForwardError::OutcomeUnknown { reason, body } => {
                m.upstream_error(UpstreamError::OutcomeUnknown);
                if body == Some(BodyFailure::TooSlow) {
                    m.timed_out(TimeoutStage::RequestBody);
                }
                tracing::warn!(request_id = %log.request_id, resource = log.resource.as_deref().unwrap_or("-"), %reason, "upstream outcome unknown");
                // The client's own body failure is the cause worth telling it.
                let cause = body.map(|_| reason.clone());
                if let Some((state, connection)) = fenced {
                    self.shared.resources.mark_unknown(state, reason, connection.map(ConnectionClosed::settled));
                }
                let resource = log.resource.clone().unwrap_or_default();
                self.refuse(log, Refusal::OutcomeUnknown { resource, cause })
            }
        }
    }
}

/// Longest client text quoted back in a refusal's detail, in bytes.
const MAX_QUOTED_BYTES: usize = 256;

/// Client-supplied bytes quoted for a detail: as a debug string (control
/// characters escaped) and cut at [`MAX_QUOTED_BYTES`].
fn quote_bounded(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw);
    if text.len() <= MAX_QUOTED_BYTES {
        return format!("{text:?}");
    }
    let mut end = MAX_QUOTED_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}… ({} bytes)", &text[..end], raw.len())
}
