//! [`Lease`]: a granted lock that renews itself, and what it knows about
//! whether it still holds the lock: [`LeaseState`] (Held, Uncertain, Lost).
//!
//! The state is published on a watch by the renewal task, and can also be
//! *checked* against the clock ([`LeaseHandle::check`]): after a pause (GC, SIGSTOP,
//! an overloaded machine) the renewal task may not have run yet, but the
//! local deadline has passed all the same. Everything that decides whether to
//! start work — the [`crate::StampLayer`] included — uses the check.
//!
//! - this module — [`Lease`], which owns the renewal and the release, and
//!   [`LeaseHandle`], the view every holder of the lease shares (a `Lease`
//!   derefs to its handle, so each accessor is written once).
//! - `state` — [`LeaseState`], [`LostReason`], and the state shared by the
//!   lease, its handles and its renewal task.
//! - `renewal` — the renewal task and its timing.
//! - `release` — [`Released`], [`ReleaseError`], the background release.

use std::future::Future;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::client::Client;
use crate::clock::Instant;
use fencer_token::{FencingToken, LeaseId};

mod release;
mod renewal;
mod state;

pub(crate) use self::release::release_in_background;
use self::release::release_lease;
pub use self::release::{ReleaseError, Released};
use self::renewal::ClientRenewer;
pub(crate) use self::renewal::Timing;
use self::state::wait_lost;
pub(crate) use self::state::{LeaseCore, Times};
pub use self::state::{LeaseState, LostReason};

/// A cheap, cloneable view of a [`Lease`] for code that must check it or
/// stamp its token (workers, the [`crate::StampLayer`]); it cannot renew or
/// release. It outlives the lease harmlessly: then it reports Lost.
///
/// Every view of a lease is here, once: a [`Lease`] derefs to its handle
/// (as a `PathBuf` does to a `Path`), so `lease.token()` and
/// `handle.token()` are the same method.
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

    /// The local deadline: send time of the last successful renewal (or of
    /// the granted acquire) + ttl − safety margin. Past it, the lease is
    /// Lost and must be assumed gone.
    pub fn deadline(&self) -> Instant {
        self.core.times().deadline
    }
}

/// A granted lock that renews itself every ttl/3 (±10 %) until it is
/// released, dropped or lost.
///
/// Use [`LeaseHandle::token`] with every write, and check
/// [`LeaseHandle::check`] (or [`LeaseHandle::is_held`]) before starting each
/// piece of work: Uncertain means "stop starting work", Lost means "stop
/// everything". Those views are the [`LeaseHandle`]'s, which a `Lease`
/// derefs to: `lease.token()`, `lease.check()`.
///
/// **Drop** releases the lease on a best-effort basis: it stops the renewal
/// and, if a tokio runtime is running, spawns a release bounded to 5 s. If
/// there is no runtime, or the release fails, the lease expires after its
/// ttl. Call [`Lease::release`] to know that it happened.
pub struct Lease {
    handle: LeaseHandle,
    client: Client,
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
    released: bool,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let core = &self.handle.core;
        f.debug_struct("Lease")
            .field("resource", &core.resource)
            .field("token", &core.token)
            .field("lease_id", &core.lease_id)
            .field("state", &core.published())
            .finish()
    }
}

/// The views of the lease (token, state, check, deadline, …).
impl Deref for Lease {
    type Target = LeaseHandle;

    fn deref(&self) -> &LeaseHandle {
        &self.handle
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
        Self { handle: LeaseHandle::from_core(core), client, stop, task: Some(task), released: false }
    }

    fn core(&self) -> &LeaseCore {
        &self.handle.core
    }

    /// The lease id: the capability to renew and release. Keep it secret.
    pub fn lease_id(&self) -> &LeaseId {
        &self.core().lease_id
    }

    /// The request id the grant is recorded under.
    pub fn request_id(&self) -> &str {
        &self.core().request_id
    }

    /// The lease length.
    pub fn ttl(&self) -> Duration {
        self.core().timing.ttl
    }

    /// A cheap handle for workers and the [`crate::StampLayer`] (module
    /// `stamp` adds [`Lease::stamp_layer`] and [`Lease::signed_stamp_layer`]).
    pub fn handle(&self) -> LeaseHandle {
        self.handle.clone()
    }

    /// Stops renewing, marks the lease Lost(Released), and releases it on
    /// the server. Safe to call after the lease was lost.
    pub async fn release(mut self) -> Result<Released, ReleaseError> {
        self.released = true;
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        let core = self.core();
        let before = core.published();
        core.lose(LostReason::Released);
        if matches!(before, LeaseState::Lost(LostReason::NotHolder | LostReason::LeaseExpired)) {
            return Ok(Released { was_holder: false });
        }
        release_lease(&self.client, &core.resource, &core.lease_id).await
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.stop.cancel();
        if self.released {
            return;
        }
        let core = self.core();
        let before = core.published();
        core.lose(LostReason::Released);
        // A lease the server ended needs no release; one that passed its
        // deadline was released by the renewal task already.
        if !before.is_lost() {
            release_in_background(self.client.clone(), core.resource.clone(), core.lease_id);
        }
    }
}

/// A core for tests: granted at `granted_at` with `ttl`, Held, no task.
#[cfg(test)]
pub(crate) fn test_core(ttl: Duration, granted_at: Instant) -> Arc<LeaseCore> {
    let timing = Timing::new(ttl, None);
    let times = Times { deadline: timing.deadline_from(granted_at), next_due: granted_at + timing.interval };
    Arc::new(LeaseCore::new(
        "orders/42".into(),
        "0123456789abcdef0123456789abcdef".parse().unwrap(),
        FencingToken(7),
        "request-0001".into(),
        timing,
        times,
    ))
}
