//! The lock operations (DESIGN §2, §3): acquire, with its FIFO wait and the
//! clean-up when a waiting caller goes away; renew, release, force-release;
//! the linearizable get and list.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use super::{LockError, LockService};
use crate::metrics::Metrics;
use crate::state_machine::{
    AcquireCmd, CancelOutcome, Command, EndedGrant, Grant, Outcome, Quota, Rejection, ResourceState,
};
use crate::types::{
    AuditText, FencingToken, Holder, InvalidField, LeaseId, RequestId, ResourceName, check_resource_chars,
};
use crate::waiters::Wake;

/// An acquire request, before validation.
#[derive(Debug, Clone, Default)]
pub struct AcquireRequest {
    /// The lock.
    pub resource: String,
    /// The caller's id for this attempt; empty → generated.
    pub request_id: String,
    /// Lease length; `None` → the policy's default (an explicit 0 is refused).
    pub ttl_ms: Option<u64>,
    /// 0 → try once.
    pub wait_timeout_ms: u64,
    /// Who asks.
    pub holder: String,
    /// The caller's tenant limits, checked at apply (module `tenants`).
    pub quota: Option<Quota>,
}

/// A granted lease with the leader's expiry estimate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Granted {
    /// The grant.
    pub grant: Grant,
    /// The request id it is recorded under.
    pub request_id: RequestId,
    /// Wall-clock estimate of the server-side expiry.
    pub expires_at_unix_ms: u64,
    /// The grant signed by this leader (`v1.<claims>.<sig>`, DESIGN P7);
    /// `None` when it has no registered signing key valid now.
    pub signed_token: Option<String>,
}

/// A successful renewal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Renewed {
    /// The lease's token.
    pub token: FencingToken,
    /// Lease length.
    pub ttl_ms: u64,
    /// Wall-clock estimate of the server-side expiry.
    pub expires_at_unix_ms: u64,
}

/// One quorum confirmation (ReadIndex) shared by the renewals that use it:
/// the first to need it asks, the others wait for that answer. Share one
/// only among calls that had all arrived before its first use (a batch's
/// items), since it vouches only for requests received before it was asked.
#[derive(Debug, Default)]
pub(crate) struct QuorumConfirmation(tokio::sync::OnceCell<Result<(), LockError>>);

/// A successful release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    /// The lease no longer holds the lock.
    pub released: bool,
    /// This call is the one that freed it.
    pub was_holder: bool,
}

/// The view of one lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockView {
    /// The lock.
    pub resource: ResourceName,
    /// Whether a lease holds it.
    pub held: bool,
    /// The holder's description.
    pub holder: String,
    /// The holder's token (0 when free).
    pub token: FencingToken,
    /// Queued requests.
    pub waiters: u32,
    /// Remaining lease time on the leader's clock.
    pub remaining_ttl_ms: u64,
    /// Lease length.
    pub ttl_ms: u64,
}

/// The result of a force-release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForceReleased {
    /// Token of the freed lease, if the lock was held.
    pub released_token: Option<FencingToken>,
    /// Index of the log entry.
    pub log_index: u64,
}

impl LockService {
    fn expires_at(&self, lease_id: &LeaseId, ttl_ms: u64) -> u64 {
        let clock = &self.inner.clock;
        match self.inner.leases.deadline(lease_id) {
            Some(d) => clock.to_wall_ms(d),
            None => clock.wall_ms() + ttl_ms,
        }
    }

    /// Every grant answered (at once, after a wait, or to a retry) passes
    /// here: it is signed now, on this leader, from the applied grant.
    async fn granted(&self, grant: Grant, request_id: RequestId) -> Granted {
        // After a wait another call's entry granted this one: its index is
        // the token (I2). (An immediate grant's index was recorded by propose.)
        if grant.waited {
            super::record_call_field("log_index", grant.token.0);
        }
        let expires_at_unix_ms = self.expires_at(&grant.lease_id, grant.ttl_ms);
        let signed_token = self.sign_grant(grant.resource.as_str(), grant.token.0, grant.lease_id.to_u128()).await;
        Granted { grant, request_id, expires_at_unix_ms, signed_token }
    }

    /// Acquire (DESIGN §2, §3.3).
    pub async fn acquire(&self, req: AcquireRequest) -> Result<Granted, LockError> {
        let policy = &self.inner.policy;
        let resource = ResourceName::new(req.resource)?;
        let request_id = if req.request_id.is_empty() {
            RequestId::random().map_err(|e| LockError::Internal(format!("random request id: {e}")))?
        } else {
            RequestId::new(req.request_id)?
        };
        super::record_call_field("request_id", request_id.as_str());
        let holder = Holder::new(req.holder)?;
        let ttl = policy.ttl(req.ttl_ms)?;
        let wait = policy.wait(req.wait_timeout_ms)?;
        self.ensure_leader()?;
        let lease_id = LeaseId::random().map_err(|e| LockError::Internal(format!("random lease id: {e}")))?;
        let acquire = AcquireCmd {
            request_id: request_id.clone(),
            resource: resource.clone(),
            holder,
            ttl_ms: ttl.as_millis() as u64,
            wait: !wait.is_zero(),
            lease_id,
            max_waiters: policy.max_waiters_per_resource,
        };
        let cmd = match req.quota {
            None => Command::Acquire(acquire),
            Some(quota) => Command::AcquireInQuota { acquire, quota },
        };
        if wait.is_zero() {
            return match self.propose(cmd).await? {
                Outcome::Granted(g) => Ok(self.granted(g, request_id).await),
                // A retry of a request that once waited: report its slot's fate.
                Outcome::Queued { .. } => self.wait_in_queue(resource, request_id, None, Duration::ZERO).await,
                other => Err(self.refusal(other)),
            };
        }
        if self.inner.metrics.waiters.get() as u64 >= policy.max_waiters_total {
            self.inner.metrics.waiter_limit_reached(false);
            return Err(LockError::TooManyWaiters { limit: policy.max_waiters_total });
        }
        self.wait_in_queue(resource, request_id, Some(cmd), wait).await
    }

    /// Parks the call, proposes (if `cmd`), and waits for exactly one of:
    /// granted, WAIT_TIMEOUT (through a committed CancelWait), or unavailable.
    async fn wait_in_queue(
        &self,
        resource: ResourceName,
        request_id: RequestId,
        cmd: Option<Command>,
        wait: Duration,
    ) -> Result<Granted, LockError> {
        let deadline = self.inner.clock.after(wait);
        let mut parked = self.inner.parked.park(&request_id);
        let mut guard = WaitGuard {
            svc: self.clone(),
            resource: resource.clone(),
            request_id: request_id.clone(),
            generation: parked.generation,
            write: cmd.map(|c| self.propose_detached(c)),
            armed: true,
        };
        self.inner.metrics.parked_calls.inc();
        let _parked_gauge = GaugeGuard(self.inner.metrics.clone());
        if let Some(write) = guard.write.as_mut() {
            let outcome = write.await.map_err(|e| LockError::Internal(format!("acquire task: {e}")));
            guard.write = None;
            match outcome.and_then(|r| r) {
                Ok(Outcome::Granted(g)) => {
                    guard.disarm();
                    return Ok(self.granted(g, request_id).await);
                }
                Ok(Outcome::Queued { .. }) => {}
                Ok(other) => {
                    guard.disarm();
                    return Err(self.refusal(other));
                }
                Err(e) => {
                    // Unknown or refused before commit: the client retries with
                    // the same request id, which finds its slot if it was queued.
                    guard.disarm();
                    return Err(e);
                }
            }
        }
        tokio::select! {
            wake = &mut parked.rx => {
                guard.disarm();
                match wake {
                    Ok(Wake::Granted(g)) => Ok(self.granted(g, request_id).await),
                    Ok(Wake::Cancelled) => Err(LockError::WaitTimeout),
                    Ok(Wake::LeaderChanged) | Err(_) => Err(LockError::LeaderChanged),
                    Ok(Wake::Superseded) => Err(LockError::Unknown(
                        "another call with the same request id took over this queue slot".into(),
                    )),
                }
            }
            () = tokio::time::sleep_until(deadline) => {
                guard.disarm();
                self.inner.parked.unpark(&request_id, parked.generation);
                let cancel = self.propose_detached(Command::CancelWait { resource, request_id: request_id.clone() });
                match cancel.await.map_err(|e| LockError::Internal(format!("cancel task: {e}")))?? {
                    Outcome::WaitCancel(CancelOutcome::AlreadyGranted(g)) => Ok(self.granted(g, request_id).await),
                    Outcome::WaitCancel(CancelOutcome::GrantEnded(ended)) => Err(ended_grant(&ended)),
                    Outcome::WaitCancel(_) => Err(LockError::WaitTimeout),
                    other => Err(LockError::Internal(format!("unexpected outcome of CancelWait: {other:?}"))),
                }
            }
        }
    }

    fn refusal(&self, outcome: Outcome) -> LockError {
        match outcome {
            Outcome::Rejected(r) => match r {
                Rejection::LockHeld { holder, token } => LockError::LockHeld { holder: holder.to_string(), token },
                Rejection::TooManyWaiters { limit } => {
                    self.inner.metrics.waiter_limit_reached(true);
                    LockError::TooManyWaiters { limit: u64::from(limit) }
                }
                Rejection::NotHolder => LockError::NotHolder,
                Rejection::LeaseExpired => LockError::LeaseExpired,
                Rejection::RequestIdReused(reuse) => LockError::RequestIdReused(reuse),
                Rejection::LeaseEnded(ended) => ended_grant(&ended),
                Rejection::WaitCancelled => LockError::WaitTimeout,
                Rejection::TenantLimit { limit, value } => {
                    LockError::TenantLimit { tenant: String::new(), limit: limit.as_str(), value }
                }
            },
            other => LockError::Internal(format!("unexpected outcome {other:?}")),
        }
    }

    /// Renew (DESIGN §3.2): refused at once when the leader's deadline passed.
    pub async fn renew(&self, resource: &str, lease_id: &str) -> Result<Renewed, LockError> {
        self.renew_with(resource, lease_id, &QuorumConfirmation::default()).await
    }

    /// [`renew`](Self::renew) confirmed by `confirmation`'s quorum round,
    /// which the renewals of one batch share.
    pub(crate) async fn renew_with(
        &self,
        resource: &str,
        lease_id: &str,
        confirmation: &QuorumConfirmation,
    ) -> Result<Renewed, LockError> {
        let resource = ResourceName::new(resource)?;
        let lease_id: LeaseId = lease_id.parse()?;
        self.ensure_leader()?;
        // The local deadline decides only while a quorum vouches that no
        // other leader can exist; a deposed or cut-off leader must answer
        // UNAVAILABLE (through the log: NO_QUORUM), never LEASE_EXPIRED.
        if self.inner.leases.is_overdue(&lease_id) && self.has_quorum_lease() {
            self.inner.metrics.renew_failures.inc();
            return Err(LockError::LeaseExpired);
        }
        if !self.inner.policy.renewals_in_log && self.inner.leases.is_authoritative() && self.has_quorum_lease() {
            match self.renew_confirmed(&resource, &lease_id, confirmation).await {
                Ok(Some(renewed)) => {
                    self.inner.metrics.renewals_confirmed.inc();
                    return Ok(renewed);
                }
                // No authoritative deadline: the log decides, as below.
                Ok(None) => {}
                Err(e) => {
                    self.inner.metrics.renew_failures.inc();
                    return Err(e);
                }
            }
        }
        match self.propose(Command::Renew { resource, lease_id }).await {
            Ok(Outcome::Renewed { token, ttl_ms }) => {
                Ok(Renewed { token, ttl_ms, expires_at_unix_ms: self.expires_at(&lease_id, ttl_ms) })
            }
            Ok(other) => {
                self.inner.metrics.renew_failures.inc();
                Err(self.refusal(other))
            }
            Err(e) => {
                self.inner.metrics.renew_failures.inc();
                Err(e)
            }
        }
    }

    /// A renewal without a log entry (DESIGN §3.2, the default): a quorum
    /// acknowledges this leader after the request arrived (ReadIndex), the
    /// state applied up to that point says the lease is current, and its
    /// deadline moves to `now + ttl` unless the expiry task picked it first.
    /// I5 as it applies to renewals: success is reported only once a
    /// majority confirmed, after the request arrived, that this node leads;
    /// a deposed or cut-off leader gets no such confirmation. I6: a leader
    /// elected later restarts the lease at `ttl` + the election timeout from
    /// its election, which follows that confirmation. `None`: this node has
    /// no authoritative deadline for the lease, so the caller proposes a
    /// Renew entry instead.
    async fn renew_confirmed(
        &self,
        resource: &ResourceName,
        lease_id: &LeaseId,
        confirmation: &QuorumConfirmation,
    ) -> Result<Option<Renewed>, LockError> {
        use crate::lease_clock::Extended;
        confirmation.0.get_or_init(|| self.confirm_quorum()).await.clone()?;
        let current = self.inner.sm.read().renewable(resource, lease_id);
        let (token, ttl_ms) = current.map_err(|r| self.refusal(Outcome::Rejected(r)))?;
        match self.inner.leases.extend(lease_id, ttl_ms) {
            Extended::Until(at) => {
                Ok(Some(Renewed { token, ttl_ms, expires_at_unix_ms: self.inner.clock.to_wall_ms(at) }))
            }
            Extended::Expiring => Err(LockError::LeaseExpired),
            // The lease may have ended between the two looks: the state says.
            Extended::Unknown => match self.inner.sm.read().renewable(resource, lease_id) {
                Err(r) => Err(self.refusal(Outcome::Rejected(r))),
                Ok(_) => Ok(None),
            },
        }
    }

    /// Release (I4: a stale lease id never frees a newer holder).
    pub async fn release(&self, resource: &str, lease_id: &str) -> Result<Released, LockError> {
        let resource = ResourceName::new(resource)?;
        let lease_id: LeaseId = lease_id.parse()?;
        self.ensure_leader()?;
        match self.propose(Command::Release { resource, lease_id }).await? {
            Outcome::Released { was_holder } => Ok(Released { released: true, was_holder }),
            other => Err(self.refusal(other)),
        }
    }

    /// Force-release (operator action): `caller` and `reason` travel in the
    /// log entry, so every node's audit log records who asked and why.
    pub async fn force_release(&self, resource: &str, caller: &str, reason: &str) -> Result<ForceReleased, LockError> {
        let resource = ResourceName::new(resource)?;
        let caller = AuditText::new(caller, "caller")?;
        let reason = AuditText::new(reason, "reason")?;
        // Logged only once bounded and free of control characters (an
        // operator's text must not forge log lines or flood the log).
        tracing::warn!(%resource, caller = %caller.as_str(), reason = %reason.as_str(), "force-release requested");
        self.ensure_leader()?;
        match self.propose_indexed(Command::ForceRelease { resource, caller, reason }).await? {
            (log_index, Outcome::ForceReleased { released_token }) => Ok(ForceReleased { released_token, log_index }),
            (_, other) => Err(LockError::Internal(format!("unexpected outcome {other:?}"))),
        }
    }

    fn view(&self, resource: ResourceName, state: Option<&ResourceState>) -> LockView {
        match state.and_then(|s| s.lock.as_ref().map(|l| (l, s.waiters.len()))) {
            Some((lock, waiters)) => LockView {
                remaining_ttl_ms: self
                    .inner
                    .leases
                    .deadline(&lock.lease_id)
                    .map_or(0, |d| self.inner.clock.millis_until(d)),
                resource,
                held: true,
                holder: lock.holder.to_string(),
                token: lock.token,
                waiters: waiters as u32,
                ttl_ms: lock.ttl_ms,
            },
            None => LockView {
                resource,
                held: false,
                holder: String::new(),
                token: FencingToken(0),
                waiters: 0,
                remaining_ttl_ms: 0,
                ttl_ms: 0,
            },
        }
    }

    /// GetLock: a linearizable view of one resource.
    pub async fn get(&self, resource: &str) -> Result<LockView, LockError> {
        let resource = ResourceName::new(resource)?;
        self.linearize().await?;
        let state = self.inner.sm.read();
        Ok(self.view(resource.clone(), state.resource(&resource)))
    }

    /// ListLocks: held locks whose name starts with `prefix`, in name order,
    /// `page_size` at a time (0 → 100).
    pub async fn list(
        &self,
        prefix: &str,
        page_size: u32,
        page_token: &str,
    ) -> Result<(Vec<LockView>, String), LockError> {
        self.list_where(prefix, page_size, page_token, |_| true).await
    }

    /// [`list`](Self::list) of the resources `visible` admits only (a
    /// tenant's readable prefixes); the others are skipped as if absent.
    pub async fn list_where(
        &self,
        prefix: &str,
        page_size: u32,
        page_token: &str,
        visible: impl Fn(&str) -> bool,
    ) -> Result<(Vec<LockView>, String), LockError> {
        check_resource_chars(prefix).map_err(|e| InvalidField::Prefix(e.to_string()))?;
        let max = self.inner.policy.max_page_size;
        if page_size > max {
            return Err(InvalidField::PageSize { value: page_size, max }.into());
        }
        let page_size = if page_size == 0 { 100 } else { page_size as usize };
        let after = if page_token.is_empty() { None } else { Some(decode_page_token(page_token)?) };
        self.linearize().await?;
        let state = self.inner.sm.read();
        // Seek straight to the first name at or after both the prefix and the
        // page token, instead of walking the table from its start.
        use std::ops::Bound;
        let from = match &after {
            Some(a) if a.as_str() >= prefix => Bound::Excluded(a.as_str()),
            _ => Bound::Included(prefix),
        };
        let range = state.resources().range::<_, str>((from, Bound::Unbounded));
        let mut out = Vec::new();
        let mut next = String::new();
        for (name, r) in range {
            if !name.as_str().starts_with(prefix) {
                break;
            }
            if !visible(name.as_str()) {
                continue;
            }
            if out.len() == page_size {
                next = out.last().map(|v: &LockView| page_token_after(&v.resource)).unwrap_or_default();
                break;
            }
            out.push(self.view(name.clone(), Some(r)));
        }
        Ok((out, next))
    }
}

/// The page token that continues a listing after `name`: opaque to
/// callers (`p` and the name in hex), so that a token the server did not
/// hand out is refused (INVALID_ARGUMENT, `page_token`), never read as a
/// position.
fn page_token_after(name: &ResourceName) -> String {
    let mut token = String::with_capacity(1 + 2 * name.as_str().len());
    token.push('p');
    for b in name.as_str().bytes() {
        token.push_str(&format!("{b:02x}"));
    }
    token
}

/// The name a page token continues after, or why it is not a token.
fn decode_page_token(token: &str) -> Result<ResourceName, InvalidField> {
    let hex = token.strip_prefix('p').ok_or(InvalidField::PageToken)?;
    if hex.len() % 2 != 0 || !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Err(InvalidField::PageToken);
    }
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16))
        .collect::<Result<_, _>>()
        .map_err(|_| InvalidField::PageToken)?;
    let name = String::from_utf8(bytes).map_err(|_| InvalidField::PageToken)?;
    ResourceName::new(name).map_err(|_| InvalidField::PageToken)
}

/// The answer to a retry whose grant has ended since: the original grant,
/// with the expiry it had when granted.
fn ended_grant(ended: &EndedGrant) -> LockError {
    let g = &ended.grant;
    LockError::LeaseEnded {
        lease_id: g.lease_id,
        token: g.token,
        ttl_ms: g.ttl_ms,
        expires_at_unix_ms: ended.granted_at_ms.saturating_add(g.ttl_ms),
        waited: g.waited,
    }
}

/// Decrements the parked-calls gauge however the call ends.
struct GaugeGuard(Arc<Metrics>);

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.parked_calls.dec();
    }
}

/// Cleans up after a waiting call that went away (client disconnect): cancels
/// its queue slot, or releases the lease if it was granted meanwhile.
struct WaitGuard {
    svc: LockService,
    resource: ResourceName,
    request_id: RequestId,
    generation: u64,
    write: Option<JoinHandle<Result<Outcome, LockError>>>,
    armed: bool,
}

impl WaitGuard {
    fn disarm(&mut self) {
        if self.armed {
            self.armed = false;
            self.svc.inner.parked.unpark(&self.request_id, self.generation);
        }
    }
}

impl Drop for WaitGuard {
    fn drop(&mut self) {
        if !self.armed || self.svc.inner.stopping.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let parked = &self.svc.inner.parked;
        // If a retry took the slot over, it is no longer ours to clean up.
        let ours = parked.unpark(&self.request_id, self.generation) || parked.take_promoted(&self.request_id);
        if !ours {
            return;
        }
        let (svc, resource, request_id, write) =
            (self.svc.clone(), self.resource.clone(), self.request_id.clone(), self.write.take());
        tokio::spawn(async move {
            if let Some(write) = write {
                match write.await {
                    Ok(Ok(Outcome::Granted(g))) => {
                        return svc.release_orphan(&g).await;
                    }
                    Ok(Ok(Outcome::Queued { .. })) => {}
                    _ => return,
                }
            }
            if svc.ensure_leader().is_err() {
                return; // the new leader's grace sweep cancels the slot
            }
            tracing::debug!(%resource, %request_id, "caller went away; cancelling its queue slot");
            match svc.propose(Command::CancelWait { resource, request_id }).await {
                Ok(Outcome::WaitCancel(CancelOutcome::AlreadyGranted(g))) => svc.release_orphan(&g).await,
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "could not cancel the queue slot of a departed caller"),
            }
        });
    }
}

impl LockService {
    async fn release_orphan(&self, g: &Grant) {
        tracing::info!(resource = %g.resource, token = %g.token, "caller went away after its grant; releasing the orphaned lease");
        if let Err(e) = self.propose(Command::Release { resource: g.resource.clone(), lease_id: g.lease_id }).await {
            tracing::warn!(error = %e, "could not release an orphaned lease; it will expire");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_tokens_are_only_those_handed_out() {
        let name = ResourceName::new("orders/42").unwrap();
        let token = page_token_after(&name);
        assert_eq!(decode_page_token(&token).unwrap(), name);
        // A resource name is not a token, nor is text that is not hex of one.
        for bad in ["garbage", "orders/42", "p", "p0", "pzz", "p2f2f", "P6f72", "p6F72", "\u{fffd}\u{fffd}", "pff"] {
            assert!(matches!(decode_page_token(bad), Err(InvalidField::PageToken)), "{bad:?}");
        }
        assert_eq!(decode_page_token("p6f72").unwrap().as_str(), "or");
    }
}
