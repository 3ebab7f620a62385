//! Giving a lease back: [`Lease::release`](super::Lease::release) and the
//! bounded background release of a dropped or expired lease.

use std::time::Duration;

use crate::client::Client;
use crate::error::{ClientError, Reason};
use fencer_token::LeaseId;

/// How long the best-effort release of a dropped or expired lease may take.
pub(crate) const BACKGROUND_RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

/// The answer to a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    /// This call freed the lock; false when the lease had already ended
    /// (expired, force-released, or released by an earlier attempt).
    pub was_holder: bool,
}

/// Why [`Lease::release`](super::Lease::release) could not confirm the release. The lease is over
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
