//! [`Lease`]: a granted lock that renews itself, and what it knows about
//! whether it still holds the lock: [`LeaseState`] (Held, Uncertain, Lost).
//!
//! The state is published on a watch by the renewal task, and can also be
//! *checked* against the clock ([`Lease::check`]): after a pause (GC, SIGSTOP,
//! an overloaded machine) the renewal task may not have run yet, but the
//! local deadline has passed all the same. Everything that decides whether to
//! start work — the [`crate::StampLayer`] included — uses the check.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::client::Client;
use crate::clock::{self, Instant};
use crate::error::{ClientError, Reason};
use crate::renewal::{self, ClientRenewer, Timing};
use fencer_token::{FencingToken, LeaseId};

/// How long the best-effort release of a dropped or expired lease may take.
pub(crate) const BACKGROUND_RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

/// What the client knows about its lease (DESIGN §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    /// The last renewal succeeded and the next one is not late: work may start.
    Held,
    /// A renewal failed or is late. The lease may still be valid, but do not
    /// start new work; finish or abandon what is running before the deadline.
    /// Becomes Held again if a renewal succeeds before the local deadline.
    Uncertain,
    /// The lease is over; this is final. Stop all work: another client may
    /// hold the lock (with a larger token) already.
    Lost(LostReason),
}

impl LeaseState {
    /// Whether work may start.
    pub fn is_held(self) -> bool {
        self == Self::Held
    }

    /// Whether the lease is over.
    pub fn is_lost(self) -> bool {
        matches!(self, Self::Lost(_))
    }

    /// Why the lease is over, if it is.
    pub fn lost_reason(self) -> Option<LostReason> {
        match self {
            Self::Lost(r) => Some(r),
            _ => None,
        }
    }
}

impl std::fmt::Display for LeaseState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Held => f.write_str("held"),
            Self::Uncertain => f.write_str("uncertain"),
            Self::Lost(r) => write!(f, "lost ({r})"),
        }
    }
}

/// Why a lease was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LostReason {
    /// The local deadline passed without a successful renewal: the send time
    /// of the last successful renewal + ttl − safety margin.
    DeadlinePassed,
    /// The server said the lease is not the holder (NOT_HOLDER).
    NotHolder,
    /// The server said the lease expired or was force-released (LEASE_EXPIRED).
    LeaseExpired,
    /// The lease was released (or dropped) by its owner.
    Released,
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::DeadlinePassed => "the local deadline passed without a successful renewal",
            Self::NotHolder => "the server says the lease is not the holder",
            Self::LeaseExpired => "the server says the lease expired",
            Self::Released => "released",
        })
    }
}

/// Deadline and next renewal, moved only by the renewal task.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Times {
    /// Local deadline: send time of the last successful renewal (or of the
    /// granted acquire) + ttl − safety margin.
    pub(crate) deadline: Instant,
    /// When the next renewal is due; Held turns Uncertain `late_after` past it.
    pub(crate) next_due: Instant,
}

/// The state shared by a [`Lease`], its [`LeaseHandle`]s and its renewal task.
pub(crate) struct LeaseCore {
    pub(crate) resource: String,
    pub(crate) lease_id: LeaseId,
    pub(crate) token: FencingToken,
    pub(crate) request_id: String,
    pub(crate) timing: Timing,
    /// The leader's signature over the grant, when it sent one.
    pub(crate) signed_token: Option<String>,
    times: Mutex<Times>,
    state: watch::Sender<LeaseState>,
}

impl LeaseCore {
    pub(crate) fn new(
        resource: String,
        lease_id: LeaseId,
        token: FencingToken,
        request_id: String,
        timing: Timing,
        times: Times,
    ) -> Self {
        let (state, _) = watch::channel(LeaseState::Held);
        Self { resource, lease_id, token, request_id, timing, signed_token: None, times: Mutex::new(times), state }
    }

    /// The same core with the grant's signed token.
    pub(crate) fn with_signed_token(mut self, signed_token: Option<String>) -> Self {
        self.signed_token = signed_token;
        self
    }

    pub(crate) fn times(&self) -> Times {
        *self.times.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn set_times(&self, f: impl FnOnce(&mut Times)) {
        f(&mut self.times.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// The published state (may lag the clock; see [`LeaseCore::check`]).
    pub(crate) fn published(&self) -> LeaseState {
        *self.state.borrow()
    }

    /// Publishes Held or Uncertain, unless the lease is already lost (final).
    pub(crate) fn set(&self, new: LeaseState) {
        self.state.send_if_modified(|s| {
            if s.is_lost() || *s == new {
                return false;
            }
            *s = new;
            true
        });
    }

    /// Publishes Lost; returns false if it was lost already (the first reason stays).
    pub(crate) fn lose(&self, reason: LostReason) -> bool {
        self.state.send_if_modified(|s| {
            if s.is_lost() {
                return false;
            }
            *s = LeaseState::Lost(reason);
            true
        })
    }

    /// The state now, checked against the clock.
    pub(crate) fn check(&self) -> LeaseState {
        let published = self.published();
        if published.is_lost() {
            return published;
        }
        let times = self.times();
        let now = clock::now();
        if now >= times.deadline {
            return LeaseState::Lost(LostReason::DeadlinePassed);
        }
        if published == LeaseState::Held && now >= times.next_due + self.timing.late_after {
            return LeaseState::Uncertain;
        }
        published
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<LeaseState> {
        self.state.subscribe()
    }
}

/// Resolves with the reason once `rx` shows Lost.
async fn wait_lost(mut rx: watch::Receiver<LeaseState>) -> LostReason {
    match rx.wait_for(|s| s.is_lost()).await {
        Ok(s) => s.lost_reason().unwrap_or(LostReason::Released),
        // Only the core owns the sender; it is gone once every owner is.
        Err(_) => LostReason::Released,
    }
}

/// A cheap, cloneable view of a [`Lease`] for code that must check it or
/// stamp its token (workers, the [`crate::StampLayer`]); it cannot renew or
/// release. It outlives the lease harmlessly: then it reports Lost.
#[derive(Clone)]
pub struct LeaseHandle {
    core: Arc<LeaseCore>,
}

impl std::fmt::Debug for LeaseHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseHandle")
            .field("resource", &self.core.resource)
            .field("token", &self.core.token)
            .field("state", &self.core.published())
            .finish()
    }
}

impl LeaseHandle {
    pub(crate) fn from_core(core: Arc<LeaseCore>) -> Self {
        Self { core }
    }

    /// The locked resource.
    pub fn resource(&self) -> &str {
        &self.core.resource
    }

    /// The fencing token to send with every write.
    pub fn token(&self) -> FencingToken {
        self.core.token
    }

    /// The grant signed by the coordinator (`v1.<claims>.<sig>`, DESIGN P7),
    /// for proxies that verify signatures; see [`Lease::signed_token`].
    pub fn signed_token(&self) -> Option<&str> {
        self.core.signed_token.as_deref()
    }

    /// The state now, checked against the clock: Lost once the local deadline
    /// has passed even if the renewal task has not run yet (after a pause),
    /// Uncertain once a renewal is late. Use this before starting work.
    pub fn check(&self) -> LeaseState {
        self.core.check()
    }

    /// Whether work may start now (`check() == Held`).
    pub fn is_held(&self) -> bool {
        self.check().is_held()
    }

    /// A watch of the state as the renewal task publishes it.
    pub fn state(&self) -> watch::Receiver<LeaseState> {
        self.core.subscribe()
    }

    /// Resolves when the lease is lost, with the reason.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        wait_lost(self.core.subscribe())
    }

    /// The local deadline: after it, the lease must be assumed gone.
    pub fn deadline(&self) -> Instant {
        self.core.times().deadline
    }
}

/// The answer to a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    /// This call freed the lock; false when the lease had already ended
    /// (expired, force-released, or released by an earlier attempt).
    pub was_holder: bool,
}

/// Why [`Lease::release`] could not confirm the release. The lease is over
/// locally either way (state Lost(Released)); if the server still has it, it
/// expires after its ttl.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ReleaseError {
    /// No server answered, or the outcome is unknown.
    #[error("release not confirmed: {0}")]
    Unavailable(#[source] ClientError),
    /// The server refused the release for a reason other than "not the holder".
    #[error("release refused: {0}")]
    Refused(#[source] ClientError),
}

/// Releases a lease, treating "not the holder any more" as done.
pub(crate) async fn release_lease(
    client: &Client,
    resource: &str,
    lease_id: &LeaseId,
) -> Result<Released, ReleaseError> {
    match client.release(resource, &lease_id.to_string()).await {
        Ok(r) => Ok(Released { was_holder: r.was_holder }),
        Err(e) => match e.reason() {
            Some(Reason::NotHolder | Reason::LeaseExpired) if !e.is_unavailable() => Ok(Released { was_holder: false }),
            _ if e.is_unavailable() => Err(ReleaseError::Unavailable(e)),
            _ => Err(ReleaseError::Refused(e)),
        },
    }
}

/// Spawns a bounded release on the current runtime, if there is one.
pub(crate) fn release_in_background(client: Client, resource: String, lease_id: LeaseId) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::debug!(%resource, "no runtime to release the lease on; it will expire after its ttl");
        return;
    };
    runtime.spawn(async move {
        match tokio::time::timeout(BACKGROUND_RELEASE_TIMEOUT, release_lease(&client, &resource, &lease_id)).await {
            Ok(Ok(_)) => tracing::debug!(%resource, "lease released in the background"),
            Ok(Err(e)) => tracing::debug!(%resource, error = %e, "background release failed; the lease will expire"),
            Err(_) => tracing::debug!(%resource, "background release timed out; the lease will expire"),
        }
    });
}

/// A granted lock that renews itself every ttl/3 (±10 %) until it is
/// released, dropped or lost.
///
/// Use [`Lease::token`] with every write, and check [`Lease::check`] (or
/// [`Lease::is_held`]) before starting each piece of work: Uncertain means
/// "stop starting work", Lost means "stop everything".
///
/// **Drop** releases the lease on a best-effort basis: it stops the renewal
/// and, if a tokio runtime is running, spawns a release bounded to 5 s. If
/// there is no runtime, or the release fails, the lease expires after its
/// ttl. Call [`Lease::release`] to know that it happened.
pub struct Lease {
    core: Arc<LeaseCore>,
    client: Client,
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
    released: bool,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("resource", &self.core.resource)
            .field("token", &self.core.token)
            .field("lease_id", &self.core.lease_id)
            .field("state", &self.core.published())
            .finish()
    }
}

impl Lease {
    /// Starts renewing a granted lease. `times` carry the first deadline and
    /// the first renewal, computed by the caller from send times.
    pub(crate) fn start(client: Client, core: LeaseCore) -> Self {
        let core = Arc::new(core);
        let stop = CancellationToken::new();
        let renewer = ClientRenewer::new(client.clone(), core.resource.clone(), core.lease_id);
        let task = tokio::spawn(renewal::run(core.clone(), renewer, stop.clone()));
        Self { core, client, stop, task: Some(task), released: false }
    }

    /// The locked resource.
    pub fn resource(&self) -> &str {
        &self.core.resource
    }

    /// The fencing token to send with every write (I2).
    pub fn token(&self) -> FencingToken {
        self.core.token
    }

    /// The grant as signed by the coordinator's leader: `v1.<claims>.<sig>`
    /// over {resource, token, lease id, issued at} (DESIGN P7). Send it as
    /// `Fencing-Token` to proxies configured with `[signing]`
    /// ([`crate::SignedStamp::for_lease`] does). `None` when the leader had
    /// no registered signing key (a coordinator older than signing, or a
    /// brand-new cluster whose key was not committed within 2 s). It is as
    /// secret as the lease id: it names it.
    pub fn signed_token(&self) -> Option<&str> {
        self.core.signed_token.as_deref()
    }

    /// A tower layer that stamps this lease's signed token (see
    /// [`crate::SignedStamp::for_lease`]); fails when the grant carried none.
    pub fn signed_stamp_layer(&self) -> Result<crate::StampLayer, crate::StampError> {
        let handle = self.handle();
        let stamp = crate::SignedStamp::for_lease(&handle)?;
        Ok(crate::StampLayer::new(handle).with_stamp(stamp))
    }

    /// The lease id: the capability to renew and release. Keep it secret.
    pub fn lease_id(&self) -> &LeaseId {
        &self.core.lease_id
    }

    /// The request id the grant is recorded under.
    pub fn request_id(&self) -> &str {
        &self.core.request_id
    }

    /// The lease length.
    pub fn ttl(&self) -> Duration {
        self.core.timing.ttl
    }

    /// The local deadline: send time of the last successful renewal (or of
    /// the granted acquire) + ttl − safety margin. Past it, the lease is Lost.
    pub fn deadline(&self) -> Instant {
        self.core.times().deadline
    }

    /// The state now, checked against the clock (see [`LeaseHandle::check`]).
    pub fn check(&self) -> LeaseState {
        self.core.check()
    }

    /// Whether work may start now (`check() == Held`).
    pub fn is_held(&self) -> bool {
        self.check().is_held()
    }

    /// A watch of the state as the renewal task publishes it: Held →
    /// Uncertain → Held … → Lost (final).
    pub fn state(&self) -> watch::Receiver<LeaseState> {
        self.core.subscribe()
    }

    /// Resolves when the lease is lost, with the reason. It does not borrow
    /// the lease, so it can be raced against work with `tokio::select!`.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        wait_lost(self.core.subscribe())
    }

    /// A cheap handle for workers and the [`crate::StampLayer`].
    pub fn handle(&self) -> LeaseHandle {
        LeaseHandle::from_core(self.core.clone())
    }

    /// A tower layer that stamps this lease's token on HTTP requests and
    /// refuses to send them unless the lease is Held.
    pub fn stamp_layer(&self) -> crate::StampLayer {
        crate::StampLayer::new(self.handle())
    }

    /// Stops renewing, marks the lease Lost(Released), and releases it on
    /// the server. Safe to call after the lease was lost.
    pub async fn release(mut self) -> Result<Released, ReleaseError> {
        self.released = true;
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        let before = self.core.published();
        self.core.lose(LostReason::Released);
        if matches!(before, LeaseState::Lost(LostReason::NotHolder | LostReason::LeaseExpired)) {
            return Ok(Released { was_holder: false });
        }
        release_lease(&self.client, &self.core.resource, &self.core.lease_id).await
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.stop.cancel();
        if self.released {
            return;
        }
        let before = self.core.published();
        self.core.lose(LostReason::Released);
        // A lease the server ended needs no release; one that passed its
        // deadline was released by the renewal task already.
        if !before.is_lost() {
            release_in_background(self.client.clone(), self.core.resource.clone(), self.core.lease_id);
        }
    }
}

/// Waits for `core` to be lost (tests).
#[cfg(test)]
pub(crate) async fn tests_wait_lost(core: &LeaseCore) -> LostReason {
    wait_lost(core.subscribe()).await
}
