//! [`Client::acquire_all`]: several locks in a fixed (sorted) order within
//! one total timeout, released in reverse order if not all can be had.
//!
//! **Not atomic.** The locks are taken one after the other; other clients
//! can see (and wait behind) the ones taken so far, and a failure part-way
//! releases them again. The sorted order means two clients asking for
//! overlapping sets never wait for each other in a cycle.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use crate::acquire::AcquireError;
use crate::client::Client;
use crate::clock;
use crate::lease::{Lease, LostReason, ReleaseError};

/// Why [`Client::acquire_all`] did not take every lock. The leases taken
/// before the failure were released, in reverse order, before this returned.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AcquireAllError {
    /// Taking `resource` failed.
    #[error("could not acquire {resource}: {source}")]
    Acquire {
        /// The resource that could not be taken.
        resource: String,
        /// Why.
        #[source]
        source: AcquireError,
    },
    /// The total timeout passed before `resource` could be tried.
    #[error("the total timeout passed before {resource} could be acquired")]
    TimedOut {
        /// The first resource not tried.
        resource: String,
    },
    /// A lease taken earlier was lost before the last lock was granted.
    #[error("the lease on {resource} was lost while acquiring the others: {reason}")]
    Lost {
        /// The resource whose lease was lost.
        resource: String,
        /// Why.
        reason: LostReason,
    },
}

/// An [`Client::acquire_all`] being configured; `.await` it for a [`LeaseSet`].
#[must_use = "an acquire does nothing until awaited"]
#[derive(Debug, Clone)]
pub struct AcquireAll {
    client: Client,
    resources: Vec<String>,
    total_timeout: Duration,
    ttl: Option<Duration>,
    holder: Option<String>,
}

impl Client {
    /// Takes every lock in `resources` — sorted, duplicates removed — waiting
    /// for each in turn, all within `total_timeout`. If one cannot be taken
    /// in time, the ones already taken are released in reverse order. Not
    /// atomic (see the module documentation).
    pub fn acquire_all<I, S>(&self, resources: I, total_timeout: Duration) -> AcquireAll
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut resources: Vec<String> = resources.into_iter().map(Into::into).collect();
        resources.sort();
        resources.dedup();
        AcquireAll { client: self.clone(), resources, total_timeout, ttl: None, holder: None }
    }
}

impl AcquireAll {
    /// Lease length of every lock (default: the server's).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Holder description for every lock.
    pub fn holder(mut self, holder: impl Into<String>) -> Self {
        self.holder = Some(holder.into());
        self
    }

    async fn run(self) -> Result<LeaseSet, AcquireAllError> {
        let end = clock::now() + self.total_timeout;
        let mut taken: Vec<Lease> = Vec::with_capacity(self.resources.len());
        for resource in &self.resources {
            let left = end.saturating_duration_since(clock::now());
            if left.is_zero() {
                let _ = release_reverse(taken).await;
                return Err(AcquireAllError::TimedOut { resource: resource.clone() });
            }
            let mut acquire = self.client.acquire(resource.clone()).wait(left).retry_budget(left);
            if let Some(ttl) = self.ttl {
                acquire = acquire.ttl(ttl);
            }
            if let Some(holder) = &self.holder {
                acquire = acquire.holder(holder.clone());
            }
            match acquire.await {
                Ok(lease) => taken.push(lease),
                Err(source) => {
                    let _ = release_reverse(taken).await;
                    return Err(AcquireAllError::Acquire { resource: resource.clone(), source });
                }
            }
        }
        if let Some((resource, reason)) =
            taken.iter().find_map(|l| l.check().lost_reason().map(|r| (l.resource().to_string(), r)))
        {
            let _ = release_reverse(taken).await;
            return Err(AcquireAllError::Lost { resource, reason });
        }
        Ok(LeaseSet { leases: taken })
    }
}

impl IntoFuture for AcquireAll {
    type Output = Result<LeaseSet, AcquireAllError>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.run())
    }
}

/// Releases leases last-taken first; failures are logged (those leases expire).
async fn release_reverse(leases: Vec<Lease>) -> Result<(), ReleaseError> {
    let mut first_error = None;
    for lease in leases.into_iter().rev() {
        let resource = lease.resource().to_string();
        if let Err(e) = lease.release().await {
            tracing::warn!(%resource, error = %e, "could not release; the lease will expire");
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// The leases of an [`Client::acquire_all`], in sorted resource order.
#[derive(Debug)]
pub struct LeaseSet {
    leases: Vec<Lease>,
}

impl LeaseSet {
    /// The leases, in sorted resource order.
    pub fn leases(&self) -> &[Lease] {
        &self.leases
    }

    /// The lease on `resource`.
    pub fn get(&self, resource: &str) -> Option<&Lease> {
        self.leases.iter().find(|l| l.resource() == resource)
    }

    /// Whether every lease is Held now.
    pub fn is_held(&self) -> bool {
        self.leases.iter().all(|l| l.is_held())
    }

    /// Resolves when the first lease is lost: (its resource, why).
    pub fn lost(&self) -> impl Future<Output = (String, LostReason)> + Send + 'static {
        type Lost = Pin<Box<dyn Future<Output = LostReason> + Send>>;
        let mut waiting: Vec<(String, Lost)> =
            self.leases.iter().map(|l| (l.resource().to_string(), Box::pin(l.lost()) as _)).collect();
        std::future::poll_fn(move |cx| {
            for (resource, lost) in &mut waiting {
                if let Poll::Ready(reason) = lost.as_mut().poll(cx) {
                    return Poll::Ready((resource.clone(), reason));
                }
            }
            Poll::Pending
        })
    }

    /// Releases every lease in reverse order. Every release is attempted; the
    /// first failure is returned.
    pub async fn release(self) -> Result<(), ReleaseError> {
        release_reverse(self.leases).await
    }

    /// The leases, to handle one by one.
    pub fn into_leases(self) -> Vec<Lease> {
        self.leases
    }
}
