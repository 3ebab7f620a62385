//! The gRPC services: thin adapters from protobuf to [`LockService`].

use std::sync::Arc;

use fencer_proto::UNREACHABLE_HEADER;
use fencer_proto::v1::admin_server::Admin;
use fencer_proto::v1::lock_server::Lock;
use fencer_proto::v1::{
    AcquireRequest, AcquireResponse, AddLearnerRequest, BatchError, BatchItem, BatchRequest, BatchResponse,
    BatchResult, ChangeMembershipRequest, ForceReleaseRequest, ForceReleaseResponse, GetLockRequest, GetLockResponse,
    ListLocksRequest, ListLocksResponse, ListSigningKeysRequest, ListSigningKeysResponse, MembershipResponse,
    NodeStatus, ReleaseRequest, ReleaseResponse, RenewRequest, RenewResponse, RetireSigningKeyRequest,
    RetireSigningKeyResponse, RotateSigningKeyRequest, RotateSigningKeyResponse, StatusRequest, StatusResponse,
    batch_item, batch_result,
};
use tonic::{Request, Response, Status};

use super::call::{self, observed};
use super::errors::to_status;
use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::service::{LockError, LockService, LockView, QuorumConfirmation, StatusView};
use crate::tenants::{Authenticator, Caller, Permission};
use crate::tls::ConnInfo;
use crate::types::{InvalidField, MAX_BATCH_ITEMS};

/// `fencer.v1.Lock`.
pub(crate) struct LockApi {
    pub(crate) svc: LockService,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) auth: Authenticator,
}

/// The caller of a gRPC request: its connection's verified client
/// certificate (set by the accept loop, never by the client) and its
/// `authorization` metadata.
fn caller<T>(auth: &Authenticator, request: &Request<T>) -> Result<Caller, LockError> {
    let conn = request.extensions().get::<ConnInfo>().cloned().unwrap_or_default();
    let authorization = request.metadata().get("authorization").and_then(|v| v.to_str().ok());
    auth.caller(&conn, authorization)
}

/// Nodes named in a `fencer-unreachable` header, at most.
const MAX_UNREACHABLE: usize = 8;

/// The nodes the caller reports it could not use as leader
/// ([`UNREACHABLE_HEADER`]); an unreadable header names none.
fn unreachable<T>(request: &Request<T>) -> Vec<String> {
    let Some(value) = request.metadata().get(UNREACHABLE_HEADER).and_then(|v| v.to_str().ok()) else {
        return Vec::new();
    };
    value.split(',').map(str::trim).filter(|a| !a.is_empty()).take(MAX_UNREACHABLE).map(String::from).collect()
}

impl LockApi {
    /// Opens a lock call: a follower without a usable leader holds it until
    /// it knows one (`LockService::await_leader`); then the caller and the
    /// message.
    async fn open<T>(&self, request: Request<T>) -> (Result<Caller, LockError>, T) {
        self.svc.await_leader(&unreachable(&request)).await;
        let who = caller(&self.auth, &request);
        (who, request.into_inner())
    }
}

/// A lock call's answer on the wire.
fn answer<R>(r: Result<R, LockError>) -> Result<Response<R>, Status> {
    r.map(Response::new).map_err(|e| to_status(&e))
}

pub(crate) fn view_to_proto(v: LockView) -> GetLockResponse {
    GetLockResponse {
        resource: v.resource.to_string(),
        held: v.held,
        holder: v.holder,
        fencing_token: v.token.0,
        waiters: v.waiters,
        remaining_ttl_ms: v.remaining_ttl_ms,
        ttl_ms: v.ttl_ms,
    }
}

impl LockApi {
    /// One Acquire on `who`'s behalf, alone or as a batch item.
    async fn acquire_call(
        &self,
        who: Result<Caller, LockError>,
        r: AcquireRequest,
    ) -> Result<AcquireResponse, LockError> {
        let g = call::acquire(&self.svc, &self.metrics, who, r.into()).await?;
        Ok(AcquireResponse {
            lease_id: g.grant.lease_id.to_string(),
            fencing_token: g.grant.token.0,
            ttl_ms: g.grant.ttl_ms,
            expires_at_unix_ms: g.expires_at_unix_ms,
            resource: g.grant.resource.to_string(),
            waited: g.grant.waited,
            request_id: g.request_id.to_string(),
            signed_token: g.signed_token.unwrap_or_default(),
        })
    }

    /// One Renew, confirmed by `confirmation` (a batch's renewals share one).
    async fn renew_call(
        &self,
        who: Result<Caller, LockError>,
        r: RenewRequest,
        confirmation: &QuorumConfirmation,
    ) -> Result<RenewResponse, LockError> {
        // A lease id works only with its own resource, so checking the
        // resource named here makes another tenant's lease id useless.
        let call = async {
            who?.check(Permission::Acquire, &r.resource)?;
            self.svc.renew_with(&r.resource, &r.lease_id, confirmation).await
        };
        let ok = observed(&self.metrics, "renew", &r.resource, call).await?;
        Ok(RenewResponse { ttl_ms: ok.ttl_ms, expires_at_unix_ms: ok.expires_at_unix_ms, fencing_token: ok.token.0 })
    }

    /// One Release.
    async fn release_call(
        &self,
        who: Result<Caller, LockError>,
        r: ReleaseRequest,
    ) -> Result<ReleaseResponse, LockError> {
        let call = async {
            who?.check(Permission::Acquire, &r.resource)?;
            self.svc.release(&r.resource, &r.lease_id).await
        };
        let ok = observed(&self.metrics, "release", &r.resource, call).await?;
        Ok(ReleaseResponse { released: ok.released, was_holder: ok.was_holder })
    }

    /// One item of a batch, answered as the same call sent alone would be.
    async fn batch_item(
        &self,
        who: Result<Caller, LockError>,
        item: BatchItem,
        confirmation: &QuorumConfirmation,
    ) -> BatchResult {
        let result = match item.call {
            Some(batch_item::Call::Acquire(r)) if r.wait_timeout_ms > 0 => {
                Err(InvalidField::BatchedWait { value: r.wait_timeout_ms }.into())
            }
            Some(batch_item::Call::Acquire(r)) => self.acquire_call(who, r).await.map(batch_result::Result::Acquire),
            Some(batch_item::Call::Renew(r)) => {
                self.renew_call(who, r, confirmation).await.map(batch_result::Result::Renew)
            }
            Some(batch_item::Call::Release(r)) => self.release_call(who, r).await.map(batch_result::Result::Release),
            None => Err(InvalidField::BatchItemEmpty.into()),
        };
        let result = result.unwrap_or_else(|e| batch_result::Result::Error(BatchError::from(&to_status(&e))));
        BatchResult { result: Some(result) }
    }
}

#[tonic::async_trait]
impl Lock for LockApi {
    async fn acquire(&self, request: Request<AcquireRequest>) -> Result<Response<AcquireResponse>, Status> {
        let (who, r) = self.open(request).await;
        answer(self.acquire_call(who, r).await)
    }

    async fn renew(&self, request: Request<RenewRequest>) -> Result<Response<RenewResponse>, Status> {
        let (who, r) = self.open(request).await;
        answer(self.renew_call(who, r, &QuorumConfirmation::default()).await)
    }

    async fn release(&self, request: Request<ReleaseRequest>) -> Result<Response<ReleaseResponse>, Status> {
        let (who, r) = self.open(request).await;
        answer(self.release_call(who, r).await)
    }

    /// The items run concurrently, as separate calls would; the renewals
    /// among them share one quorum confirmation (DESIGN §3.2: one ReadIndex
    /// per batch of renewals), asked after every item arrived.
    async fn batch(&self, request: Request<BatchRequest>) -> Result<Response<BatchResponse>, Status> {
        let (who, BatchRequest { items }) = self.open(request).await;
        if items.is_empty() || items.len() > MAX_BATCH_ITEMS {
            return Err(to_status(&InvalidField::BatchItems { count: items.len() }.into()));
        }
        self.metrics.batch_items.observe(items.len() as f64);
        let confirmation = QuorumConfirmation::default();
        let calls = items.into_iter().map(|item| self.batch_item(who.clone(), item, &confirmation));
        let results = futures::future::join_all(calls).await;
        Ok(Response::new(BatchResponse { results }))
    }

    async fn get_lock(&self, request: Request<GetLockRequest>) -> Result<Response<GetLockResponse>, Status> {
        let (who, r) = self.open(request).await;
        let call = async {
            let who = who?;
            who.check(Permission::Read, &r.resource)?;
            who.charge_request(&Clock)?;
            self.svc.get(&r.resource).await
        };
        answer(observed(&self.metrics, "get", &r.resource, call).await.map(view_to_proto))
    }

    async fn list_locks(&self, request: Request<ListLocksRequest>) -> Result<Response<ListLocksResponse>, Status> {
        let (who, r) = self.open(request).await;
        let call = async {
            let who = who?;
            who.charge_request(&Clock)?;
            self.svc.list_where(&r.prefix, r.page_size, &r.page_token, |name| who.may(Permission::Read, name)).await
        };
        let page = observed(&self.metrics, "list", &r.prefix, call).await;
        answer(page.map(|(views, next)| ListLocksResponse {
            locks: views.into_iter().map(view_to_proto).collect(),
            next_page_token: next,
        }))
    }
}

/// `fencer.v1.Admin`.
pub(crate) struct AdminApi {
    pub(crate) svc: LockService,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) auth: Authenticator,
}

pub(crate) fn status_to_proto(s: StatusView) -> StatusResponse {
    StatusResponse {
        node_id: s.node_id,
        cluster_id: s.cluster_id,
        state: s.state.into(),
        leader_id: s.leader_id.unwrap_or(0),
        has_leader: s.leader_id.is_some(),
        leader_addr: s.leader_addr.unwrap_or_default(),
        term: s.term,
        last_log_index: s.last_log_index,
        commit_index: s.commit_index,
        applied_index: s.applied_index,
        members: s
            .members
            .into_iter()
            .map(|m| NodeStatus {
                id: m.id,
                addr: m.addr,
                role: m.role.into(),
                matched_index: m.matched_index,
                last_ack_ms: m.last_ack_ms,
                health: m.health.into(),
            })
            .collect(),
        locks_held: s.locks_held,
        waiters: s.waiters,
        version: s.version.into(),
        snapshot_index: s.snapshot_index,
        purged_index: s.purged_index,
        ready: s.ready,
        ready_reason: s.ready_reason,
        millis_since_quorum_ack: s.millis_since_quorum_ack.map_or(-1, |ms| i64::try_from(ms).unwrap_or(i64::MAX)),
        leader_ready: s.leader_ready,
    }
}

impl AdminApi {
    fn members(&self) -> Vec<NodeStatus> {
        status_to_proto(self.svc.status()).members
    }
}

#[tonic::async_trait]
impl Admin for AdminApi {
    async fn status(&self, request: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        // Any authenticated caller: the status names members, not resources.
        caller(&self.auth, &request).map_err(|e| to_status(&e))?;
        Ok(Response::new(status_to_proto(self.svc.status())))
    }

    async fn force_release(
        &self,
        request: Request<ForceReleaseRequest>,
    ) -> Result<Response<ForceReleaseResponse>, Status> {
        let who = caller(&self.auth, &request);
        let r = request.into_inner();
        let ok = observed(&self.metrics, "force_release", &r.resource, async {
            let who = who?;
            who.check(Permission::Admin, &r.resource)?;
            let audit_caller = who.audit_caller(&r.caller);
            self.svc.force_release(&r.resource, &audit_caller, &r.reason).await
        })
        .await
        .map_err(|e| to_status(&e))?;
        Ok(Response::new(ForceReleaseResponse {
            released: ok.released_token.is_some(),
            released_token: ok.released_token.map_or(0, |t| t.0),
            log_index: ok.log_index,
        }))
    }

    async fn add_learner(&self, request: Request<AddLearnerRequest>) -> Result<Response<MembershipResponse>, Status> {
        caller(&self.auth, &request).and_then(|c| c.check_cluster_admin()).map_err(|e| to_status(&e))?;
        let r = request.into_inner();
        let index = self.svc.add_learner(r.node_id, r.addr).await.map_err(|e| to_status(&e))?;
        Ok(Response::new(MembershipResponse { log_index: index, members: self.members() }))
    }

    async fn change_membership(
        &self,
        request: Request<ChangeMembershipRequest>,
    ) -> Result<Response<MembershipResponse>, Status> {
        caller(&self.auth, &request).and_then(|c| c.check_cluster_admin()).map_err(|e| to_status(&e))?;
        let r = request.into_inner();
        let index = self.svc.change_membership(r.voters, r.retain).await.map_err(|e| to_status(&e))?;
        Ok(Response::new(MembershipResponse { log_index: index, members: self.members() }))
    }

    async fn list_signing_keys(
        &self,
        request: Request<ListSigningKeysRequest>,
    ) -> Result<Response<ListSigningKeysResponse>, Status> {
        // Any authenticated caller, as for status: public keys and node ids only.
        caller(&self.auth, &request).map_err(|e| to_status(&e))?;
        let (keys, now_unix_ms) = self.svc.signing_keys().await.map_err(|e| to_status(&e))?;
        Ok(Response::new(ListSigningKeysResponse { keys: keys.into_iter().map(Into::into).collect(), now_unix_ms }))
    }

    async fn rotate_signing_key(
        &self,
        request: Request<RotateSigningKeyRequest>,
    ) -> Result<Response<RotateSigningKeyResponse>, Status> {
        caller(&self.auth, &request).and_then(|c| c.check_cluster_admin()).map_err(|e| to_status(&e))?;
        let r = request.into_inner();
        let activate_in = std::time::Duration::from_millis(r.activate_in_ms);
        let key = self.svc.rotate_signing_key(r.node_id, activate_in).await.map_err(|e| to_status(&e))?;
        Ok(Response::new(RotateSigningKeyResponse { key: Some(key.into()) }))
    }

    async fn retire_signing_key(
        &self,
        request: Request<RetireSigningKeyRequest>,
    ) -> Result<Response<RetireSigningKeyResponse>, Status> {
        caller(&self.auth, &request).and_then(|c| c.check_cluster_admin()).map_err(|e| to_status(&e))?;
        let r = request.into_inner();
        let after = std::time::Duration::from_millis(r.after_ms);
        let key = self.svc.retire_signing_key(&r.kid, after, r.force).await.map_err(|e| to_status(&e))?;
        Ok(Response::new(RetireSigningKeyResponse { key: Some(key.into()) }))
    }
}
