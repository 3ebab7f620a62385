//! [`Client::acquire`]: take a lock with safe retries, then hold it as a
//! renewed [`Lease`] (DESIGN §2, §5, I7).
//!
//! One logical attempt has one request id, reused on every retry, so a
//! retry finds the original outcome instead of creating a second lease or a
//! second waiter. Unknown outcomes (UNAVAILABLE, transport errors, timeouts)
//! are retried with exponential backoff and jitter until the budget —
//! `max(wait, retry_budget)` from the start — runs out. Leader hints are
//! followed by the client's routing.
//!
//! A fresh request id is used only when the old one's outcome is *known* to
//! hold nothing: its queue slot was cancelled (WAIT_TIMEOUT arriving before
//! our own wait ended — the server's timer starts after ours, so this means
//! the server saw a call of ours disconnect and cancelled the waiter), the
//! server said the grant has ended since (LEASE_ENDED, to a retry whose
//! first answer was lost), or the grant was already gone when we confirmed
//! it. Never while the old attempt
//! could still be waiting. A request id given by the caller is never replaced.
//!
//! The first deadline counts from the send time of the *first* attempt with
//! the granted request id (any attempt may be the one that was granted, the
//! first is the earliest). After a grant that waited — which may have lasted
//! longer than the ttl — or when retries left less than one renewal interval,
//! the lease is renewed at once and counts from that renewal's send time.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::time::Duration;

use fencer_proto::v1::{AcquireRequest, AcquireResponse};
use tokio::time::{sleep, timeout_at};

use crate::client::{Client, default_holder, new_request_id};
use crate::clock::{self, Instant, backoff};
use crate::error::{ClientError, Reason};
use crate::lease::{Lease, LeaseCore, Times, Timing, release_in_background};
use fencer_token::{FencingToken, LeaseId};

/// How long unknown outcomes are retried when the caller does not wait.
pub const DEFAULT_RETRY_BUDGET: Duration = Duration::from_secs(10);
/// First and largest pause between retries of an unknown outcome.
const BACKOFF_BASE: Duration = Duration::from_millis(50);
const BACKOFF_CAP: Duration = Duration::from_secs(2);
/// Fresh request ids used after a known-empty outcome, at most.
const MAX_RESTARTS: u32 = 3;
/// A WAIT_TIMEOUT this long before our own wait ends cannot be the server's
/// timer (it started after ours): the slot was cancelled for another reason.
const EARLY_TIMEOUT_SLACK: Duration = Duration::from_millis(100);

/// Why an acquire did not produce a lease.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AcquireError {
    /// Known outcome, no lease: the lock is held (LOCK_HELD), the wait ended
    /// (WAIT_TIMEOUT) or the queue is full (TOO_MANY_WAITERS).
    #[error("not acquired: {0}")]
    NotAcquired(#[source] ClientError),
    /// Refused as invalid (INVALID_ARGUMENT, REQUEST_ID_REUSED, a bad
    /// endpoint) or for another reason a retry cannot fix.
    #[error("refused: {0}")]
    Refused(#[source] ClientError),
    /// The budget ran out while the outcome was still unknown. A lease may
    /// exist on the server: it expires after its ttl, or a later acquire
    /// with the same `request_id` returns it.
    #[error("outcome unknown after retrying (request id {request_id}): {error}")]
    Unavailable {
        /// The request id to retry with.
        request_id: String,
        /// The last failure.
        #[source]
        error: ClientError,
    },
}

impl AcquireError {
    /// The underlying client error.
    pub fn client_error(&self) -> &ClientError {
        match self {
            Self::NotAcquired(e) | Self::Refused(e) | Self::Unavailable { error: e, .. } => e,
        }
    }
}

/// A grant as the server reported it, without renewal: what `fencer
/// acquire` prints. Most programs want the [`Lease`] that awaiting an
/// [`AcquireBuilder`] gives instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The locked resource.
    pub resource: String,
    /// The lease id (the capability to renew and release).
    pub lease_id: LeaseId,
    /// The fencing token.
    pub token: FencingToken,
    /// The lease length.
    pub ttl: Duration,
    /// The leader's wall-clock estimate of the expiry, if not renewed.
    pub expires_at_unix_ms: u64,
    /// Whether the grant came from the wait queue.
    pub waited: bool,
    /// The request id the grant is recorded under.
    pub request_id: String,
    /// The grant as signed by the leader, `v1.<claims>.<sig>` (DESIGN P7);
    /// `None` when the leader had no registered signing key.
    pub signed_token: Option<String>,
    /// Send time of the first attempt with this request id: the earliest
    /// moment the grant can have happened.
    pub first_sent: Instant,
}

impl Grant {
    /// The grant in an answer; an answer whose lease id is not one (a
    /// server that breaks the protocol) counts as no answer: the retry with
    /// the same request id may reach one that answers properly.
    fn from_response(r: AcquireResponse, request_id: String, first_sent: Instant) -> Result<Self, ClientError> {
        let lease_id = r.lease_id.parse::<LeaseId>().map_err(|e| ClientError::Unavailable {
            reason: None,
            message: format!("the server answered with a malformed lease id: {e}"),
            metadata: Default::default(),
        })?;
        Ok(Self {
            resource: r.resource,
            lease_id,
            token: FencingToken(r.fencing_token),
            ttl: Duration::from_millis(r.ttl_ms),
            expires_at_unix_ms: r.expires_at_unix_ms,
            waited: r.waited,
            request_id: if r.request_id.is_empty() { request_id } else { r.request_id },
            signed_token: (!r.signed_token.is_empty()).then_some(r.signed_token),
            first_sent,
        })
    }
}

/// An acquire being configured; `.await` it for a [`Lease`], or call
/// [`AcquireBuilder::grant`] for the bare grant.
#[must_use = "an acquire does nothing until awaited"]
#[derive(Debug, Clone)]
pub struct AcquireBuilder {
    client: Client,
    resource: String,
    ttl: Option<Duration>,
    wait: Duration,
    holder: Option<String>,
    request_id: Option<String>,
    retry_budget: Duration,
    safety_margin: Option<Duration>,
}

impl Client {
    /// Starts an acquire of `resource`: try once with the server's default
    /// ttl unless configured otherwise.
    pub fn acquire(&self, resource: impl Into<String>) -> AcquireBuilder {
        AcquireBuilder {
            client: self.clone(),
            resource: resource.into(),
            ttl: None,
            wait: Duration::ZERO,
            holder: None,
            request_id: None,
            retry_budget: DEFAULT_RETRY_BUDGET,
            safety_margin: None,
        }
    }
}

/// How the attempts of one request id ended.
enum Step {
    /// Granted.
    Granted(Grant),
    /// The request id's outcome is known to hold nothing: a fresh one may
    /// try. With the server's refusal that said so, when it did
    /// (LEASE_ENDED), to report if no fresh request id may try.
    Restart(Option<ClientError>),
    /// Final.
    Fail(AcquireError),
}

impl AcquireBuilder {
    /// Lease length (default: the server's, 30 s). The server refuses values
    /// outside its bounds rather than clamping them.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Wait up to this long in the FIFO queue while the lock is held
    /// (default 0: try once). Retries happen within this budget.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Who holds the lock, for humans and the audit log (default `user@host/pid`).
    pub fn holder(mut self, holder: impl Into<String>) -> Self {
        self.holder = Some(holder.into());
        self
    }

    /// The attempt's request id (8–128 printable ASCII bytes). Reuse it to
    /// learn the outcome of an earlier attempt; generated when not given.
    pub fn request_id(mut self, id: impl Into<String>) -> Self {
        self.request_id = Some(id.into());
        self
    }

    /// How long to keep retrying unknown outcomes (default 10 s). The whole
    /// acquire ends within `max(wait, retry_budget)` plus one call's timeout.
    pub fn retry_budget(mut self, budget: Duration) -> Self {
        self.retry_budget = budget;
        self
    }

    /// Subtracted from every local deadline (default ttl/10, at most ttl/2).
    pub fn safety_margin(mut self, margin: Duration) -> Self {
        self.safety_margin = Some(margin);
        self
    }

    /// Takes the lock and returns the bare grant: no renewal, no release on
    /// drop. Unknown outcomes are retried with the same request id.
    pub async fn grant(self) -> Result<Grant, AcquireError> {
        self.obtain(|grant, _| async move { Ok(grant) }).await
    }

    /// Takes the lock, confirms it if needed, and starts renewing it.
    async fn lease(self) -> Result<Lease, AcquireError> {
        self.obtain(|grant, end| self.confirm(grant, end)).await
    }

    /// Runs the attempts of one request id after another until `finish`
    /// accepts a grant. `finish` answers `Err(None)` when the grant turned
    /// out to hold nothing, which (like a cancelled queue slot) lets a fresh
    /// request id try, unless the caller chose the id.
    async fn obtain<T, F, Fut>(&self, mut finish: F) -> Result<T, AcquireError>
    where
        F: FnMut(Grant, Instant) -> Fut,
        Fut: Future<Output = Result<T, Option<AcquireError>>>,
    {
        let (wait_end, end) = self.ends(clock::now());
        let caller_id = self.request_id.is_some();
        let mut request_id = self.request_id.clone().unwrap_or_else(new_request_id);
        let mut restarts = 0;
        loop {
            let (failure, why) = match self.attempt_all(&request_id, wait_end, end, restarts == 0).await {
                Step::Granted(grant) => match finish(grant, end).await {
                    Ok(done) => return Ok(done),
                    Err(failure) => (failure, None),
                },
                Step::Restart(why) => (None, why),
                Step::Fail(e) => (Some(e), None),
            };
            match failure {
                Some(e) => return Err(e),
                // The caller's own request id: say what the server said.
                None if caller_id && why.is_some() => {
                    return Err(AcquireError::NotAcquired(why.expect("checked")));
                }
                None if !caller_id && restarts < MAX_RESTARTS => {
                    restarts += 1;
                    request_id = new_request_id();
                    tracing::debug!(resource = %self.resource, "the earlier attempt holds nothing; trying again with a fresh request id");
                }
                None => {
                    return Err(AcquireError::NotAcquired(ClientError::Refused {
                        code: tonic::Code::DeadlineExceeded,
                        reason: Reason::WaitTimeout,
                        message: "the request's queue slot or grant ended before it could be used".into(),
                        metadata: Default::default(),
                    }));
                }
            }
        }
    }

    /// (end of the wait, end of the whole budget), from the start.
    fn ends(&self, start: Instant) -> (Instant, Instant) {
        (start + self.wait, start + self.wait.max(self.retry_budget))
    }

    fn request(&self, request_id: &str, wait: Duration) -> AcquireRequest {
        AcquireRequest {
            resource: self.resource.clone(),
            request_id: request_id.to_string(),
            // None: the server's default; an explicit value is checked as is.
            ttl_ms: self.ttl.map(|t| t.as_millis() as u64),
            wait_timeout_ms: wait.as_millis() as u64,
            holder: self.holder.clone().unwrap_or_else(default_holder),
        }
    }

    /// Every attempt of one request id, until a known outcome or the end of
    /// the budget. The very first attempt of the acquire (`first`) asks for
    /// the whole wait as configured (so `wait(5 min)` asks for exactly the
    /// server's maximum, not a millisecond less); each retry asks to wait
    /// only for what is left of it.
    async fn attempt_all(&self, request_id: &str, wait_end: Instant, end: Instant, first: bool) -> Step {
        let first_sent = clock::now();
        let mut attempt = 0u32;
        loop {
            let sent = clock::now();
            let wait = if first && attempt == 0 { self.wait } else { wait_end.saturating_duration_since(sent) };
            let call_end = end.max(sent + wait) + self.client.call_timeout();
            let call = self.client.acquire_once(self.request(request_id, wait), wait_end);
            let result = match timeout_at(call_end, call).await {
                Ok(r) => r,
                Err(_) => Err(ClientError::Unavailable {
                    reason: None,
                    message: "the acquire did not answer in time".into(),
                    metadata: Default::default(),
                }),
            };
            let error = match result {
                Ok(resp) => match Grant::from_response(resp, request_id.to_string(), first_sent) {
                    Ok(grant) => return Step::Granted(grant),
                    Err(e) => e,
                },
                Err(e) => e,
            };
            match &error {
                ClientError::Unavailable { .. } => {
                    attempt += 1;
                    let pause = backoff(attempt, BACKOFF_BASE, BACKOFF_CAP);
                    if clock::now() + pause >= end {
                        return Step::Fail(AcquireError::Unavailable { request_id: request_id.to_string(), error });
                    }
                    tracing::debug!(resource = %self.resource, %request_id, error = %error, ?pause, "acquire outcome unknown; retrying with the same request id");
                    sleep(pause).await;
                }
                ClientError::Refused { reason: Reason::WaitTimeout, .. } => {
                    // The server's wait timer started after ours, so it cannot
                    // fire first: an early WAIT_TIMEOUT means the slot was
                    // cancelled (committed) for another reason, e.g. the
                    // server saw an earlier call of ours disconnect — possibly
                    // inside the routing's own resend, hidden from us.
                    let early = clock::now() + EARLY_TIMEOUT_SLACK < wait_end;
                    return if early { Step::Restart(None) } else { Step::Fail(AcquireError::NotAcquired(error)) };
                }
                ClientError::Refused { reason: Reason::LeaseEnded, .. } => {
                    // A retry learnt that this request id's grant (lost
                    // with an answer) has ended since: it holds nothing,
                    // never a Held lease. A fresh request id may try.
                    tracing::debug!(resource = %self.resource, %request_id, "the request id's grant has ended since");
                    return Step::Restart(Some(error));
                }
                ClientError::Refused { reason: Reason::LockHeld | Reason::TooManyWaiters, .. } => {
                    return Step::Fail(AcquireError::NotAcquired(error));
                }
                ClientError::Refused { .. } | ClientError::Config(_) => {
                    return Step::Fail(AcquireError::Refused(error));
                }
            }
        }
    }

    /// Turns a grant into a renewed lease. Renews at once first when the
    /// grant waited or the conservative first deadline is nearly used up.
    async fn confirm(&self, grant: Grant, end: Instant) -> Result<Lease, Option<AcquireError>> {
        let timing = Timing::new(grant.ttl, self.safety_margin);
        let mut deadline = timing.deadline_from(grant.first_sent);
        let mut basis = grant.first_sent;
        if grant.waited || deadline.saturating_duration_since(clock::now()) < timing.interval {
            // Leave time for the confirmation even if the wait used the budget up.
            let confirm_end = end.max(clock::now() + timing.interval);
            let mut attempt = 0u32;
            loop {
                let sent = clock::now();
                let result = match timeout_at(
                    confirm_end,
                    self.client.renew(&grant.resource, &grant.lease_id.to_string()),
                )
                .await
                {
                    Ok(r) => r,
                    Err(_) => Err(ClientError::Unavailable {
                        reason: None,
                        message: "the confirming renewal did not answer in time".into(),
                        metadata: Default::default(),
                    }),
                };
                match result {
                    Ok(r) => {
                        let ttl = Duration::from_millis(r.ttl_ms).min(timing.ttl);
                        deadline = sent + ttl - timing.margin;
                        basis = sent;
                        break;
                    }
                    Err(e @ ClientError::Refused { reason: Reason::NotHolder | Reason::LeaseExpired, .. }) => {
                        tracing::debug!(resource = %grant.resource, error = %e, "the grant was gone when confirmed");
                        return Err(None);
                    }
                    Err(e) if e.is_unavailable() => {
                        attempt += 1;
                        let pause = backoff(attempt, BACKOFF_BASE, BACKOFF_CAP);
                        if clock::now() + pause >= confirm_end {
                            release_in_background(self.client.clone(), grant.resource.clone(), grant.lease_id);
                            return Err(Some(AcquireError::Unavailable { request_id: grant.request_id, error: e }));
                        }
                        sleep(pause).await;
                    }
                    Err(e) => {
                        release_in_background(self.client.clone(), grant.resource.clone(), grant.lease_id);
                        return Err(Some(AcquireError::Refused(e)));
                    }
                }
            }
        }
        let times = Times { deadline, next_due: timing.next_due_from(basis) };
        let core = LeaseCore::new(grant.resource, grant.lease_id, grant.token, grant.request_id, timing, times)
            .with_signed_token(grant.signed_token);
        Ok(Lease::start(self.client.clone(), core))
    }
}

impl IntoFuture for AcquireBuilder {
    type Output = Result<Lease, AcquireError>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.lease())
    }
}
