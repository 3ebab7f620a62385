//! The protocol-neutral fence (P1–P3, P8; G4–G6): admit a token for a
//! resource under its fair guard, persist a raise before anything is
//! forwarded, and record every refusal in the rejection log. The front ends
//! decide what a request or statement is and how a refusal is answered;
//! this module decides whether it may pass.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::OwnedRwLockWriteGuard;

use crate::config::ProxyConfig;
use crate::core::clock;
use crate::core::epoch_store::EpochStore;
use crate::core::metrics::Metrics;
use crate::core::names::FencingToken;
use crate::core::rejections::{RejectReason, RejectionRecord};
use crate::core::signing::TokenVerifier;
use crate::core::state::{InFlight, ResourceState, Resources};

/// A refusal by the fence or a front end's classifier: logged in the
/// rejection log and answered in the front end's own terms (an HTTP status
/// and problem+json, or a PostgreSQL `ErrorResponse` with an `FN` SQLSTATE).
#[derive(Debug, Clone)]
pub(crate) struct Rejection {
    pub(crate) reason: RejectReason,
    /// The message for the client: what was refused and why.
    pub(crate) detail: String,
    pub(crate) resource: Option<String>,
    pub(crate) presented_token: Option<u64>,
    pub(crate) current_epoch: Option<u64>,
    /// When retrying later can succeed (indeterminate, busy).
    pub(crate) retry_after_secs: Option<u64>,
}

impl Rejection {
    /// A refusal that names only its reason and detail.
    pub(crate) fn new(reason: RejectReason, detail: impl Into<String>) -> Self {
        Self {
            reason,
            detail: detail.into(),
            resource: None,
            presented_token: None,
            current_epoch: None,
            retry_after_secs: None,
        }
    }

    /// P1/G4: `token` is below `state`'s epoch.
    pub(crate) fn stale(state: &ResourceState, token: FencingToken, epoch: u64) -> Self {
        Self {
            reason: RejectReason::StaleToken,
            detail: format!(
                "token {token} is older than resource {}'s epoch {epoch}; a newer lock holder exists, so this write is refused",
                state.name
            ),
            resource: Some(state.name.to_string()),
            presented_token: Some(token.get()),
            current_epoch: Some(epoch),
            retry_after_secs: None,
        }
    }
}

/// Why a token was not admitted.
#[derive(Debug, Clone)]
pub(crate) enum AdmitError {
    /// Refused (stale, indeterminate, too large a jump, busy): logged.
    Rejected(Rejection),
    /// The epoch store could not persist a raise; nothing was forwarded.
    StoreUnavailable(String),
}

impl From<Rejection> for AdmitError {
    fn from(r: Rejection) -> Self {
        Self::Rejected(r)
    }
}

/// What the rejection log says about the refused request or statement,
/// besides the refusal itself.
#[derive(Debug, Clone, Default)]
pub(crate) struct RejectionContext {
    /// HTTP method, or the statement's first keyword (`INSERT`, `COMMIT`).
    pub(crate) method: String,
    /// The mTLS identity or the peer address (PostgreSQL: `user@peer`).
    pub(crate) caller: String,
    pub(crate) request_id: String,
    /// The HTTP route template, or the PostgreSQL database.
    pub(crate) route: Option<String>,
    pub(crate) resource: Option<String>,
    pub(crate) token: Option<u64>,
}

/// State shared by every connection of both front ends and by the admin API.
#[derive(Debug)]
pub(crate) struct FenceCore {
    pub(crate) config: Arc<ProxyConfig>,
    pub(crate) store: EpochStore,
    pub(crate) resources: Arc<Resources>,
    pub(crate) metrics: Arc<Metrics>,
    /// Parses and verifies tokens before the fence sees them (P7).
    pub(crate) tokens: Arc<TokenVerifier>,
    request_id_prefix: String,
    request_counter: AtomicU64,
}

impl FenceCore {
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

    /// A fresh request id, for requests and statements that bring none.
    pub(crate) fn next_request_id(&self) -> String {
        let n = self.request_counter.fetch_add(1, Ordering::Relaxed);
        format!("{}-{n}", self.request_id_prefix)
    }

    /// Counts, traces and stores one refusal. `status` is what the client
    /// was answered: the HTTP status, or for PostgreSQL the `FN` code's
    /// HTTP equivalent (so `fencer rejections` reads the same for both).
    pub(crate) fn record_rejection(
        &self,
        ctx: &RejectionContext,
        rejection: &Rejection,
        status: u16,
        sqlstate: Option<&str>,
    ) {
        let m = &self.metrics;
        m.rejected(rejection.reason);
        let record = RejectionRecord {
            seq: 0,
            time: clock::wall_rfc3339(),
            resource: rejection.resource.clone().or_else(|| ctx.resource.clone()),
            presented_token: ctx.token.or(rejection.presented_token),
            current_epoch: rejection.current_epoch,
            caller: ctx.caller.clone(),
            method: ctx.method.clone(),
            route: ctx.route.clone(),
            request_id: ctx.request_id.clone(),
            reason: rejection.reason,
            status,
            sqlstate: sqlstate.map(str::to_owned),
        };
        tracing::info!(
            reason = rejection.reason.as_str(),
            resource = record.resource.as_deref().unwrap_or("-"),
            token = ?record.presented_token,
            epoch = ?rejection.current_epoch,
            caller = %ctx.caller,
            request_id = %ctx.request_id,
            "write refused"
        );
        if !self.store.log_rejection(record) {
            m.rejection_log_dropped.inc();
        }
    }

    /// P1–P3, P8 (G4–G6): admits `token` for `state` and returns the held
    /// shared guard, or the refusal.
    ///
    /// A token equal to the epoch shares the guard. A higher one takes the
    /// exclusive guard through `exclusive`, which the front end supplies:
    /// the HTTP proxy waits for every lower-token write in flight to end;
    /// the PostgreSQL sidecar waits at most `drain_timeout` and then ends
    /// the older transactions (G5). The guard is FIFO-fair, so old-token
    /// writes arriving later queue behind a waiting higher token. With the
    /// exclusive guard held the epoch is re-checked, persisted with
    /// immediate durability (P2/G6) and only then is the guard downgraded to
    /// shared and returned: nothing of the request has been forwarded yet.
    pub(crate) async fn admit<F, Fut>(
        &self,
        state: &Arc<ResourceState>,
        token: FencingToken,
        exclusive: F,
    ) -> Result<InFlight, AdmitError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<OwnedRwLockWriteGuard<()>, Rejection>>,
    {
        let t = token.get();
        let epoch = state.epoch();
        if t < epoch {
            return Err(Rejection::stale(state, token, epoch).into());
        }
        if t == epoch && state.is_persisted() {
            // Equal tokens share the guard and run concurrently.
            let guard = state.guard.clone().read_owned().await;
            // Re-check: a higher token may have raised E while we queued.
            let epoch = state.epoch();
            if t < epoch {
                return Err(Rejection::stale(state, token, epoch).into());
            }
            return Ok(state.enter(guard));
        }
        if t > epoch {
            self.check_raise(state, token, epoch)?;
        }
        let waiting = clock::now();
        let exclusive = exclusive().await?;
        self.metrics.drain_wait.observe((clock::now() - waiting).as_secs_f64());
        let epoch = state.epoch();
        if t < epoch {
            return Err(Rejection::stale(state, token, epoch).into());
        }
        if t > epoch || !state.is_persisted() {
            if t > epoch {
                // Re-check: a write we waited for may have ended in an
                // unknown outcome.
                self.check_raise(state, token, epoch)?;
            }
            let persisting = clock::now();
            // P2/G6: durable before any byte of this request goes upstream.
            let stored =
                self.store.raise(&state.name, t).await.map_err(|e| AdmitError::StoreUnavailable(e.to_string()))?;
            self.metrics.epoch_persist.observe((clock::now() - persisting).as_secs_f64());
            state.set_epoch(stored);
            if t > epoch {
                self.metrics.epoch_advances.inc();
                tracing::info!(resource = %state.name, from = epoch, to = stored, "epoch advanced");
            }
            if stored > t {
                return Err(Rejection::stale(state, token, stored).into());
            }
        }
        Ok(state.enter(exclusive.downgrade()))
    }

    /// What a raise from `epoch` to `token` must pass: not indeterminate
    /// (P4/G7), not a jump beyond the cap (P7's second line of defence: even
    /// a genuinely signed token, say from a leaked key, moves E only so far).
    fn check_raise(&self, state: &ResourceState, token: FencingToken, epoch: u64) -> Result<(), Rejection> {
        if let Some((status, retry_after)) = self.resources.indeterminate(state) {
            return Err(Rejection {
                reason: RejectReason::Indeterminate,
                detail: format!(
                    "resource {} is indeterminate ({}); token {token} may not advance its epoch until the quarantine passes or an operator clears it",
                    state.name, status.reason
                ),
                resource: Some(state.name.to_string()),
                presented_token: Some(token.get()),
                current_epoch: Some(epoch),
                retry_after_secs: Some(retry_after),
            });
        }
        let max = self.config.max_epoch_jump;
        if token.get() - epoch > max {
            return Err(Rejection {
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
