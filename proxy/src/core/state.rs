//! Per-resource fence state: the epoch E in memory (mirroring the store),
//! the fair shared/exclusive guard (P3), the in-flight count and the
//! indeterminate marker (P4). Resources are independent: each has its own
//! guard, so a slow resource never blocks another.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::{OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::core::clock::{self, Instant};
use crate::core::metrics::Metrics;
use crate::core::names::ResourceName;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Debug)]
struct Indeterminate {
    /// Distinguishes this episode from a later one after a clear.
    episode: u64,
    /// Bumped on every new unknown outcome within the episode.
    generation: u64,
    since: String,
    reason: String,
    /// Unknown-outcome connections not yet closed.
    open_connections: usize,
    /// Set once every such connection closed: the quarantine's end.
    quarantine_until: Option<Instant>,
}

/// One resource's fence state.
#[derive(Debug)]
pub(crate) struct ResourceState {
    pub(crate) name: ResourceName,
    epoch: AtomicU64,
    /// Fair (FIFO) shared/exclusive guard: tokio's `RwLock` queues readers
    /// behind a waiting writer, so old-token writes cannot starve a new
    /// holder (P3).
    pub(crate) guard: Arc<RwLock<()>>,
    in_flight: AtomicU64,
    /// Higher tokens (and admin raises) waiting for the exclusive guard.
    waiting_exclusive: AtomicU64,
    indeterminate: Mutex<Option<Indeterminate>>,
    /// Whether the store has a row for this resource. Until it does, even a
    /// token equal to the floor is persisted before it is forwarded, so an
    /// unclean restart knows the resource had writes (see `Resources::new`).
    persisted: std::sync::atomic::AtomicBool,
}

/// Counts a fenced write as in flight until dropped, and holds its shared
/// guard.
#[derive(Debug)]
pub(crate) struct InFlight {
    state: Arc<ResourceState>,
    _guard: OwnedRwLockReadGuard<()>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.state.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl ResourceState {
    fn new(name: ResourceName, epoch: u64, persisted: bool, indeterminate: Option<Indeterminate>) -> Self {
        Self {
            name,
            epoch: AtomicU64::new(epoch),
            guard: Arc::new(RwLock::new(())),
            in_flight: AtomicU64::new(0),
            waiting_exclusive: AtomicU64::new(0),
            indeterminate: Mutex::new(indeterminate),
            persisted: std::sync::atomic::AtomicBool::new(persisted),
        }
    }

    pub(crate) fn is_persisted(&self) -> bool {
        self.persisted.load(Ordering::Acquire)
    }

    /// The current epoch E.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Sets E after the store committed it. Only ever called with the
    /// exclusive guard held, and never lowers (P8).
    pub(crate) fn set_epoch(&self, epoch: u64) {
        self.epoch.fetch_max(epoch, Ordering::AcqRel);
        self.persisted.store(true, Ordering::Release);
    }

    pub(crate) fn enter(self: &Arc<Self>, guard: OwnedRwLockReadGuard<()>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight { state: self.clone(), _guard: guard }
    }

    pub(crate) fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Takes the exclusive guard: waits for every shared holder to finish.
    /// Waiters are counted (and uncounted if the caller goes away).
    pub(crate) async fn exclusive(&self) -> OwnedRwLockWriteGuard<()> {
        struct Waiting<'a>(&'a AtomicU64);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        self.waiting_exclusive.fetch_add(1, Ordering::AcqRel);
        let _waiting = Waiting(&self.waiting_exclusive);
        self.guard.clone().write_owned().await
    }
}

/// What the admin API shows about an indeterminate resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndeterminateStatus {
    /// When the first unknown outcome of this episode happened (RFC 3339).
    pub since: String,
    /// The last unknown outcome's cause.
    pub reason: String,
    /// Upstream connections of unknown outcomes still open.
    pub open_connections: u64,
    /// Seconds until the quarantine ends, once every connection closed.
    pub quarantine_remaining_secs: Option<u64>,
}

/// What the admin API shows about a resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceStatus {
    /// The resource.
    pub resource: String,
    /// Its epoch E: the highest token accepted (or the floor).
    pub epoch: u64,
    /// Fenced writes in flight (admitted, response not finished).
    pub in_flight: u64,
    /// Higher tokens waiting for those writes to drain (P3).
    pub waiting: u64,
    /// Set while the resource is indeterminate (P4).
    pub indeterminate: Option<IndeterminateStatus>,
}

/// Resolves once nothing an unknown outcome sent can still land upstream:
/// the HTTP upstream connection closed, or the PostgreSQL backend confirmed
/// gone. The quarantine starts then (P4/G7).
pub(crate) type Settled = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Why a write for a new resource cannot be tracked.
#[derive(Debug, thiserror::Error)]
#[error("the proxy already tracks {0} resources (limits.max_resources)")]
pub(crate) struct TooManyResources(pub(crate) usize);

/// All resources, the floor and the quarantine machinery.
#[derive(Debug)]
pub(crate) struct Resources {
    map: Mutex<BTreeMap<ResourceName, Arc<ResourceState>>>,
    floor: u64,
    max: usize,
    quarantine: Duration,
    next_episode: AtomicU64,
    tasks: TaskTracker,
    shutdown: CancellationToken,
    metrics: Arc<Metrics>,
}

impl Resources {
    /// `unclean_start`: the previous process did not stop cleanly, so writes
    /// it had in flight may still be applied by the upstream. Every stored
    /// resource (every resource that ever had a write, see `persisted`)
    /// starts indeterminate, its quarantine already running (P4).
    pub(crate) fn new(
        stored: Vec<(ResourceName, u64)>,
        floor: u64,
        max: usize,
        quarantine: Duration,
        unclean_start: bool,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        let until = clock::now() + quarantine;
        let since = clock::wall_rfc3339();
        let map: BTreeMap<_, _> = stored
            .into_iter()
            .enumerate()
            .map(|(i, (name, epoch))| {
                let ind = unclean_start.then(|| Indeterminate {
                    episode: i as u64 + 1,
                    generation: 0,
                    since: since.clone(),
                    reason: "the previous proxy process stopped uncleanly; writes it had in flight may still land"
                        .into(),
                    open_connections: 0,
                    quarantine_until: Some(until),
                });
                (name.clone(), Arc::new(ResourceState::new(name, epoch.max(floor), true, ind)))
            })
            .collect();
        let count = map.len();
        metrics.resources.set(i64::try_from(count).unwrap_or(i64::MAX));
        if unclean_start {
            metrics.indeterminate_resources.set(i64::try_from(count).unwrap_or(i64::MAX));
        }
        let this = Arc::new(Self {
            map: Mutex::new(map),
            floor,
            max,
            quarantine,
            next_episode: AtomicU64::new(count as u64 + 1),
            tasks: TaskTracker::new(),
            shutdown: CancellationToken::new(),
            metrics,
        });
        if unclean_start && count > 0 {
            tracing::warn!(
                resources = count,
                ?quarantine,
                "previous stop was unclean; every known resource is indeterminate until the quarantine passes"
            );
            let sweeper = this.clone();
            let shutdown = this.shutdown.clone();
            this.tasks.spawn(async move {
                tokio::select! {
                    () = tokio::time::sleep_until(until) => {
                        for state in sweeper.list(None, usize::MAX) {
                            let _ = sweeper.indeterminate(&state);
                        }
                    }
                    () = shutdown.cancelled() => {}
                }
            });
        }
        this
    }

    pub(crate) fn floor(&self) -> u64 {
        self.floor
    }

    pub(crate) fn get(&self, name: &ResourceName) -> Option<Arc<ResourceState>> {
        lock(&self.map).get(name).cloned()
    }

    pub(crate) fn get_or_create(&self, name: &ResourceName) -> Result<Arc<ResourceState>, TooManyResources> {
        let mut map = lock(&self.map);
        if let Some(s) = map.get(name) {
            return Ok(s.clone());
        }
        if map.len() >= self.max {
            return Err(TooManyResources(self.max));
        }
        let state = Arc::new(ResourceState::new(name.clone(), self.floor, false, None));
        map.insert(name.clone(), state.clone());
        self.metrics.resources.set(i64::try_from(map.len()).unwrap_or(i64::MAX));
        Ok(state)
    }

    /// Resources in name order, after `after`, at most `limit`.
    pub(crate) fn list(&self, after: Option<&str>, limit: usize) -> Vec<Arc<ResourceState>> {
        let map = lock(&self.map);
        map.iter().filter(|(k, _)| after.is_none_or(|a| k.as_str() > a)).take(limit).map(|(_, v)| v.clone()).collect()
    }

    pub(crate) fn status(&self, state: &ResourceState) -> ResourceStatus {
        ResourceStatus {
            resource: state.name.to_string(),
            epoch: state.epoch(),
            in_flight: state.in_flight(),
            waiting: state.waiting_exclusive.load(Ordering::Acquire),
            indeterminate: self.indeterminate(state).map(|(status, _)| status),
        }
    }

    /// If the resource is indeterminate: its status and the Retry-After to
    /// give a higher token (seconds, at least 1).
    pub(crate) fn indeterminate(&self, state: &ResourceState) -> Option<(IndeterminateStatus, u64)> {
        let now = clock::now();
        let ceil_secs = |d: Duration| d.as_secs() + u64::from(d.subsec_nanos() > 0);
        let mut guard = lock(&state.indeterminate);
        // The quarantine may have passed without its timer having run yet.
        if guard.as_ref().is_some_and(|i| i.open_connections == 0 && i.quarantine_until.is_some_and(|u| u <= now)) {
            *guard = None;
            self.metrics.indeterminate_resources.dec();
            tracing::info!(resource = %state.name, "quarantine passed; resource is no longer indeterminate");
        }
        let ind = guard.as_ref()?;
        let remaining = ind.quarantine_until.map(|u| ceil_secs(u.saturating_duration_since(now)));
        let retry_after = remaining.unwrap_or_else(|| ceil_secs(self.quarantine)).max(1);
        Some((
            IndeterminateStatus {
                since: ind.since.clone(),
                reason: ind.reason.clone(),
                open_connections: ind.open_connections as u64,
                quarantine_remaining_secs: remaining,
            },
            retry_after,
        ))
    }

    /// Marks the resource indeterminate after an unknown outcome (P4/G7).
    /// The quarantine starts once `settled` resolves (at once without one:
    /// an HTTP connection that was never captured never carried the request
    /// far).
    pub(crate) fn mark_unknown(self: &Arc<Self>, state: &Arc<ResourceState>, reason: String, settled: Option<Settled>) {
        let episode = {
            let mut ind = lock(&state.indeterminate);
            match ind.as_mut() {
                Some(i) => {
                    i.generation += 1;
                    i.open_connections += 1;
                    i.quarantine_until = None;
                    i.reason = reason;
                }
                None => {
                    self.metrics.indeterminate_resources.inc();
                    *ind = Some(Indeterminate {
                        episode: self.next_episode.fetch_add(1, Ordering::Relaxed),
                        generation: 0,
                        since: clock::wall_rfc3339(),
                        reason,
                        open_connections: 1,
                        quarantine_until: None,
                    });
                }
            }
            ind.as_ref().map_or(0, |i| i.episode)
        };
        tracing::warn!(resource = %state.name, "resource is indeterminate: a write's outcome is unknown (P4)");
        let this = self.clone();
        let state = state.clone();
        let shutdown = self.shutdown.clone();
        // Drop guards may run outside a runtime (at process exit); the
        // marker then simply stays until the process ends.
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        self.tasks.spawn(async move {
            tokio::select! {
                () = async {
                    if let Some(settled) = settled {
                        settled.await;
                    }
                    this.connection_closed(&state, episode).await;
                } => {}
                () = shutdown.cancelled() => {}
            }
        });
    }

    async fn connection_closed(&self, state: &ResourceState, episode: u64) {
        let (until, generation) = {
            let mut ind = lock(&state.indeterminate);
            let Some(i) = ind.as_mut().filter(|i| i.episode == episode) else {
                return;
            };
            i.open_connections = i.open_connections.saturating_sub(1);
            if i.open_connections > 0 {
                return;
            }
            let until = clock::now() + self.quarantine;
            i.quarantine_until = Some(until);
            (until, i.generation)
        };
        tokio::time::sleep_until(until).await;
        let due =
            lock(&state.indeterminate).as_ref().is_some_and(|i| i.episode == episode && i.generation == generation);
        if due {
            // Clears it when the quarantine has indeed passed.
            let _ = self.indeterminate(state);
        }
    }

    /// Operator override (audited by the caller). Returns whether the
    /// resource was indeterminate.
    pub(crate) fn clear_indeterminate(&self, state: &ResourceState) -> bool {
        let was = lock(&state.indeterminate).take().is_some();
        if was {
            self.metrics.indeterminate_resources.dec();
        }
        was
    }

    /// Whether any resource is indeterminate now.
    pub(crate) fn any_indeterminate(&self) -> bool {
        self.list(None, usize::MAX).iter().any(|s| self.indeterminate(s).is_some())
    }

    /// Stops the quarantine tasks.
    pub(crate) async fn shutdown(&self) {
        self.shutdown.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }
}
