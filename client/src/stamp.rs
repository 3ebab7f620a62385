//! [`StampLayer`]: a tower layer for HTTP clients (hyper, reqwest-style
//! stacks) that stamps the lease's fencing token on every request and
//! refuses to send one unless the lease is Held (DESIGN §5).
//!
//! The refusal is a courtesy, not the guarantee: a request checked while
//! Held can still arrive after the lease ended (the process may pause right
//! after the check). The guarantee is the fence at the other end — the
//! fencer proxy (or the database's own check) rejects a token older than one
//! it has seen, with `409 application/problem+json`.
//!
//! How the token travels is a [`Stamp`]. [`PlainToken`] sends
//! `Fencing-Token: <u64>` (and optionally `Fencing-Resource`). [`SignedStamp`]
//! sends the coordinator's signed token, `Fencing-Token: v1.<claims>.<sig>`
//! (DESIGN P7), which proxies configured with signing keys require; it is
//! built from the token string the grant carried and refuses to stamp it on
//! a request for another resource or token. The coordinator signs every
//! grant: [`SignedStamp::for_lease`] (or [`crate::Lease::signed_stamp_layer`])
//! takes the lease's own signed token. [`Claim`] carries the signed token
//! too, for custom stamps. The default stays [`PlainToken`]: a proxy without
//! `[signing]` refuses signed tokens (fail closed), so switching is the
//! caller's choice, made when its proxies have keys.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderMap, HeaderName, HeaderValue, Request};
use tower::{Layer, Service};

use crate::lease::{Lease, LeaseHandle, LeaseState};
use fencer_token::FencingToken;

/// The header carrying the fencing token (what `fencer proxy` reads).
pub const FENCING_TOKEN_HEADER: HeaderName = HeaderName::from_static("fencing-token");
/// The header naming the resource; the proxy checks it against its route (P6).
pub const FENCING_RESOURCE_HEADER: HeaderName = HeaderName::from_static("fencing-resource");

/// What a [`Stamp`] may put on a request.
#[non_exhaustive]
#[derive(Debug, Clone, Copy)]
pub struct Claim<'a> {
    /// The locked resource.
    pub resource: &'a str,
    /// The lease's fencing token.
    pub token: FencingToken,
    /// The lease's signed token, when the coordinator sent one.
    pub signed_token: Option<&'a str>,
}

/// Why a [`Stamp`] could not stamp a request.
#[derive(Debug, Clone, thiserror::Error)]
#[error("cannot stamp the fencing token: {0}")]
pub struct StampError(pub String);

/// Writes a claim into request headers. Implement it to carry tokens in
/// another form (a signed token, a database-specific header).
pub trait Stamp: Send + Sync + 'static {
    /// Adds the claim to `headers`, replacing any earlier value.
    fn stamp(&self, claim: &Claim<'_>, headers: &mut HeaderMap) -> Result<(), StampError>;
}

/// `Fencing-Token: <u64>`, and `Fencing-Resource: <name>` if asked for.
#[derive(Debug, Clone, Copy, Default)]
pub struct PlainToken {
    with_resource: bool,
}

impl PlainToken {
    /// Also send `Fencing-Resource`, so a proxy whose route maps to another
    /// resource rejects the request instead of applying the token there.
    pub fn with_resource(mut self) -> Self {
        self.with_resource = true;
        self
    }
}

fn stamp_resource(claim: &Claim<'_>, headers: &mut HeaderMap) -> Result<(), StampError> {
    let value = HeaderValue::from_str(claim.resource)
        .map_err(|_| StampError(format!("resource {:?} is not a valid header value", claim.resource)))?;
    headers.insert(FENCING_RESOURCE_HEADER, value);
    Ok(())
}

impl Stamp for PlainToken {
    fn stamp(&self, claim: &Claim<'_>, headers: &mut HeaderMap) -> Result<(), StampError> {
        headers.insert(FENCING_TOKEN_HEADER, HeaderValue::from(claim.token.get()));
        if self.with_resource {
            stamp_resource(claim, headers)?;
        }
        Ok(())
    }
}

/// `Fencing-Token: v1.<claims>.<sig>`: the lease's signed token (DESIGN P7),
/// and `Fencing-Resource` if asked for.
///
/// Before each request it checks that the token's claims name the lease's
/// resource and fencing token, so a token left over from another lease is
/// never sent. It does not verify the signature (clients hold no keys; the
/// proxy does), and the claims it checks are not trusted for anything else.
#[derive(Debug, Clone)]
pub struct SignedStamp {
    token: fencer_token::SignedToken,
    value: HeaderValue,
    with_resource: bool,
}

impl SignedStamp {
    /// Parses `signed_token` (`v1.<claims>.<sig>`, as the coordinator
    /// issued it); a plain number or a malformed token is refused.
    pub fn new(signed_token: &str) -> Result<Self, StampError> {
        let token = fencer_token::SignedToken::parse(signed_token.as_bytes())
            .map_err(|e| StampError(format!("not a signed fencing token: {e}")))?;
        let value = HeaderValue::from_str(token.as_str())
            .map_err(|_| StampError("the signed token is not a valid header value".into()))?;
        Ok(Self { token, value, with_resource: false })
    }

    /// The signed token the coordinator issued with `lease`'s grant; fails
    /// when the grant carried none (see [`crate::LeaseHandle::signed_token`]).
    pub fn for_lease(lease: &LeaseHandle) -> Result<Self, StampError> {
        let token = lease.signed_token().ok_or_else(|| {
            StampError(format!(
                "the grant of {:?} (token {}) carried no signed token: the coordinator had no registered signing key",
                lease.resource(),
                lease.token()
            ))
        })?;
        Self::new(token)
    }

    /// Also send `Fencing-Resource` (see [`PlainToken::with_resource`]).
    pub fn with_resource(mut self) -> Self {
        self.with_resource = true;
        self
    }

    /// What the token claims (unverified).
    pub fn claims(&self) -> &fencer_token::Claims {
        self.token.unverified_claims()
    }
}

impl Stamp for SignedStamp {
    fn stamp(&self, claim: &Claim<'_>, headers: &mut HeaderMap) -> Result<(), StampError> {
        let signed = self.token.unverified_claims();
        if signed.resource() != claim.resource || signed.token() != claim.token.get() {
            return Err(StampError(format!(
                "the signed token is for resource {:?} token {}, but this lease holds {:?} token {}",
                signed.resource(),
                signed.token(),
                claim.resource,
                claim.token
            )));
        }
        headers.insert(FENCING_TOKEN_HEADER, self.value.clone());
        if self.with_resource {
            stamp_resource(claim, headers)?;
        }
        Ok(())
    }
}

/// A tower layer stamping one lease's token; see the module documentation.
#[derive(Clone)]
pub struct StampLayer {
    lease: LeaseHandle,
    stamp: Arc<dyn Stamp>,
}

impl std::fmt::Debug for StampLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StampLayer").field("lease", &self.lease).finish_non_exhaustive()
    }
}

impl StampLayer {
    /// Stamps `lease`'s token as `Fencing-Token`.
    pub fn new(lease: LeaseHandle) -> Self {
        Self { lease, stamp: Arc::new(PlainToken::default()) }
    }

    /// Uses another way of carrying the token.
    pub fn with_stamp(mut self, stamp: impl Stamp) -> Self {
        self.stamp = Arc::new(stamp);
        self
    }
}

impl<S> Layer<S> for StampLayer {
    type Service = Stamped<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Stamped { inner, lease: self.lease.clone(), stamp: self.stamp.clone() }
    }
}

/// The stamping layers of a lease (here rather than in `lease`, which
/// knows nothing of HTTP).
impl Lease {
    /// A tower layer that stamps this lease's token on HTTP requests and
    /// refuses to send them unless the lease is Held.
    pub fn stamp_layer(&self) -> StampLayer {
        StampLayer::new(self.handle())
    }

    /// A tower layer that stamps this lease's signed token (see
    /// [`SignedStamp::for_lease`]); fails when the grant carried none.
    pub fn signed_stamp_layer(&self) -> Result<StampLayer, StampError> {
        let handle = self.handle();
        let stamp = SignedStamp::for_lease(&handle)?;
        Ok(StampLayer::new(handle).with_stamp(stamp))
    }
}

/// The service [`StampLayer`] makes.
#[derive(Clone)]
pub struct Stamped<S> {
    inner: S,
    lease: LeaseHandle,
    stamp: Arc<dyn Stamp>,
}

impl<S: std::fmt::Debug> std::fmt::Debug for Stamped<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stamped").field("inner", &self.inner).field("lease", &self.lease).finish_non_exhaustive()
    }
}

/// Why a [`Stamped`] request failed.
#[derive(Debug)]
pub enum StampedError<E> {
    /// Not sent: the lease was not Held when the request was made.
    NotHeld(LeaseState),
    /// Not sent: the token could not be stamped.
    Stamp(StampError),
    /// Sent (or attempted) by the inner service, which failed.
    Inner(E),
}

impl<E: std::fmt::Display> std::fmt::Display for StampedError<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotHeld(state) => write!(f, "not sent: the lease is {state}"),
            Self::Stamp(e) => write!(f, "not sent: {e}"),
            Self::Inner(e) => e.fmt(f),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for StampedError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::NotHeld(_) => None,
            Self::Stamp(e) => Some(e),
            Self::Inner(e) => Some(e),
        }
    }
}

impl<S, B> Service<Request<B>> for Stamped<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = StampedError<S::Error>;
    type Future = StampedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(StampedError::Inner)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        // Checked against the clock, not only the published state: after a
        // pause the renewal task may not have run, but the deadline is past.
        let state = self.lease.check();
        if !state.is_held() {
            return StampedFuture::refused(StampRefusal::NotHeld(state));
        }
        let claim = Claim {
            resource: self.lease.resource(),
            token: self.lease.token(),
            signed_token: self.lease.signed_token(),
        };
        if let Err(e) = self.stamp.stamp(&claim, req.headers_mut()) {
            return StampedFuture::refused(StampRefusal::Stamp(e));
        }
        StampedFuture { kind: Kind::Inner { future: self.inner.call(req) } }
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`Stamped`].
    pub struct StampedFuture<F> {
        #[pin]
        kind: Kind<F>,
    }
}

pin_project_lite::pin_project! {
    #[project = KindProj]
    enum Kind<F> {
        Refused { error: Option<StampRefusal> },
        Inner { #[pin] future: F },
    }
}

/// A refusal made before the inner service was called.
enum StampRefusal {
    NotHeld(LeaseState),
    Stamp(StampError),
}

impl<F> StampedFuture<F> {
    fn refused(error: StampRefusal) -> Self {
        Self { kind: Kind::Refused { error: Some(error) } }
    }
}

impl<F, T, E> Future for StampedFuture<F>
where
    F: Future<Output = Result<T, E>>,
{
    type Output = Result<T, StampedError<E>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Refused { error } => Poll::Ready(Err(match error.take() {
                Some(StampRefusal::NotHeld(s)) => StampedError::NotHeld(s),
                Some(StampRefusal::Stamp(e)) => StampedError::Stamp(e),
                None => panic!("StampedFuture polled after completion"),
            })),
            KindProj::Inner { future } => future.poll(cx).map_err(StampedError::Inner),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use tower::ServiceExt;

    use super::*;
    use crate::lease::test_core as core;
    use crate::lease::{LeaseHandle, LostReason};

    type Seen = Arc<Mutex<Vec<HeaderMap>>>;

    fn upstream(seen: Seen) -> impl Service<Request<()>, Response = u16, Error = std::convert::Infallible> + Clone {
        tower::service_fn(move |req: Request<()>| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(req.headers().clone());
                Ok(200)
            }
        })
    }

    #[tokio::test(start_paused = true)]
    async fn stamps_the_token_while_held_and_refuses_otherwise() {
        let ttl = Duration::from_secs(30);
        let core = core(ttl, crate::clock::now());
        let lease = LeaseHandle::from_core(core.clone());
        let seen = Seen::default();
        let svc = StampLayer::new(lease.clone())
            .with_stamp(PlainToken::default().with_resource())
            .layer(upstream(seen.clone()));

        let mut req = Request::new(());
        req.headers_mut().insert(FENCING_TOKEN_HEADER, HeaderValue::from_static("999"));
        assert_eq!(svc.clone().oneshot(req).await.unwrap(), 200);
        {
            let seen = seen.lock().unwrap();
            assert_eq!(
                seen[0].get_all(FENCING_TOKEN_HEADER).iter().collect::<Vec<_>>(),
                ["7"],
                "replaced, not appended"
            );
            assert_eq!(seen[0][FENCING_RESOURCE_HEADER], "orders/42");
        }

        core.set(LeaseState::Uncertain);
        let err = svc.clone().oneshot(Request::new(())).await.unwrap_err();
        assert!(matches!(err, StampedError::NotHeld(LeaseState::Uncertain)), "{err}");
        core.set(LeaseState::Held);

        // Past the deadline with no renewal task to say so: refused all the same.
        tokio::time::advance(ttl).await;
        let err = svc.clone().oneshot(Request::new(())).await.unwrap_err();
        assert!(matches!(err, StampedError::NotHeld(LeaseState::Lost(LostReason::DeadlinePassed))), "{err}");
        assert_eq!(seen.lock().unwrap().len(), 1, "refused requests never reach the inner service");
    }

    #[tokio::test(start_paused = true)]
    async fn stamps_the_signed_token_of_this_lease_only() {
        let core = core(Duration::from_secs(30), crate::clock::now());
        let lease = LeaseHandle::from_core(core);
        let signer = fencer_token::Signer::from_secret_bytes(fencer_token::KeyId::new("k1").unwrap(), &[1; 32]);
        let mine = signer.sign("orders/42", 7, 1, 1_770_000_000_000).unwrap();
        let seen = Seen::default();
        let svc = StampLayer::new(lease.clone())
            .with_stamp(SignedStamp::new(mine.as_str()).unwrap().with_resource())
            .layer(upstream(seen.clone()));
        assert_eq!(svc.oneshot(Request::new(())).await.unwrap(), 200);
        {
            let seen = seen.lock().unwrap();
            assert_eq!(seen[0][FENCING_TOKEN_HEADER], mine.as_str());
            assert_eq!(seen[0][FENCING_RESOURCE_HEADER], "orders/42");
        }

        // Another lease's token (other resource, or older token) is never sent.
        for other in [signer.sign("orders/43", 7, 1, 1).unwrap(), signer.sign("orders/42", 6, 1, 1).unwrap()] {
            let svc = StampLayer::new(lease.clone())
                .with_stamp(SignedStamp::new(other.as_str()).unwrap())
                .layer(upstream(seen.clone()));
            let err = svc.oneshot(Request::new(())).await.unwrap_err();
            assert!(matches!(err, StampedError::Stamp(_)), "{err}");
        }
        assert_eq!(seen.lock().unwrap().len(), 1);
        assert!(SignedStamp::new("7").is_err(), "a plain number is not a signed token");
    }

    #[tokio::test(start_paused = true)]
    async fn stamps_the_signed_token_the_lease_was_granted_with() {
        let plain = LeaseHandle::from_core(core(Duration::from_secs(30), crate::clock::now()));
        let err = SignedStamp::for_lease(&plain).unwrap_err();
        assert!(err.to_string().contains("carried no signed token"), "{err}");

        let signer = fencer_token::Signer::from_secret_bytes(fencer_token::KeyId::new("n1-x").unwrap(), &[2; 32]);
        let mine = signer.sign("orders/42", 7, 1, 1_770_000_000_000).unwrap();
        let unique = Arc::try_unwrap(core(Duration::from_secs(30), crate::clock::now())).ok().unwrap();
        let lease = LeaseHandle::from_core(Arc::new(unique.with_signed_token(Some(mine.as_str().to_string()))));
        assert_eq!(lease.signed_token(), Some(mine.as_str()));
        let seen = Seen::default();
        let svc = StampLayer::new(lease.clone())
            .with_stamp(SignedStamp::for_lease(&lease).unwrap())
            .layer(upstream(seen.clone()));
        assert_eq!(svc.oneshot(Request::new(())).await.unwrap(), 200);
        assert_eq!(seen.lock().unwrap()[0][FENCING_TOKEN_HEADER], mine.as_str());
    }
}
