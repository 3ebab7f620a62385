//! Network faults between real coordinator processes. Each node is started
//! with `--peers` naming its *relay*: a gRPC server in the test process that
//! forwards every call (raft, lock, admin) to the node's real address.
//! Membership records the relay addresses, so every raft message and every
//! client call that follows a leader hint passes a relay.
//!
//! Raft messages carry their sender (`from`), so the relay of node `to`
//! judges each one like the in-process harness's `NetFaults`: a rule names a
//! direction `from → to`; a request and the reply travelling back are judged
//! separately, so one-way loss drops requests going one way and the replies
//! coming back the same way. Clients reach every relay whatever the raft
//! network does (a minority side is reachable, as the quorum tests need).
//!
//! The relay of a node can also lose the answers of the next acquires after
//! the node answered (the write committed, the client never hears), and it
//! records every lock call it forwarded into a [`History`], so answers that
//! were thrown away are checked too.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::grpc::answer_of;
use crate::history::{Answer, Call, History, Op};
use fencer_proto::UNREACHABLE_HEADER;
use fencer_proto::raft::raft_client::RaftClient;
use fencer_proto::raft::raft_server::{Raft, RaftServer};
use fencer_proto::raft::{HelloRequest, HelloResponse, RaftPayload, SnapshotChunk};
use fencer_proto::v1::admin_client::AdminClient;
use fencer_proto::v1::admin_server::{Admin, AdminServer};
use fencer_proto::v1::lock_client::LockClient;
use fencer_proto::v1::lock_server::{Lock, LockServer};
use fencer_proto::v1::{
    AcquireRequest, AcquireResponse, AddLearnerRequest, BatchItem, BatchRequest, BatchResponse,
    ChangeMembershipRequest, ForceReleaseRequest, ForceReleaseResponse, GetLockRequest, GetLockResponse,
    ListLocksRequest, ListLocksResponse, ListSigningKeysRequest, ListSigningKeysResponse, MembershipResponse,
    ReleaseRequest, ReleaseResponse, RenewRequest, RenewResponse, RetireSigningKeyRequest, RetireSigningKeyResponse,
    RotateSigningKeyRequest, RotateSigningKeyResponse, StatusRequest, StatusResponse, batch_item, batch_result,
};
use tokio_stream::StreamExt;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status, Streaming};

/// Largest raft message (the coordinator's own limit).
const MAX_MESSAGE: usize = 64 << 20;

/// What happens to one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Pass,
    Drop,
    Delay(Duration),
}

#[derive(Default)]
struct Rules {
    isolated: BTreeSet<u64>,
    /// Directions `(from, to)` on which every raft message is lost.
    dropped: BTreeSet<(u64, u64)>,
    /// Directions on which every raft message is late.
    delayed: BTreeMap<(u64, u64), Duration>,
    /// Per node: how many of the next acquire answers to lose after the node answered.
    lose_acquire_answers: BTreeMap<u64, usize>,
}

/// The fault rules of every relay of one cluster, and where they record.
#[derive(Default)]
pub struct RelayNet {
    rules: Mutex<Rules>,
    history: Mutex<Option<Arc<History>>>,
    /// Batch requests forwarded, and the calls they carried.
    batches: Mutex<(usize, usize)>,
}

impl RelayNet {
    fn rules(&self) -> std::sync::MutexGuard<'_, Rules> {
        self.rules.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn judge(&self, from: u64, to: u64) -> Fate {
        let r = self.rules();
        if r.isolated.contains(&from) || r.isolated.contains(&to) || r.dropped.contains(&(from, to)) {
            return Fate::Drop;
        }
        r.delayed.get(&(from, to)).map_or(Fate::Pass, |d| Fate::Delay(*d))
    }

    /// Every raft message to or from `n` is lost.
    pub fn isolate(&self, n: u64) {
        self.rules().isolated.insert(n);
    }

    /// Raft messages from `from` to `to` are lost (and replies going that way).
    pub fn drop_one_way(&self, from: u64, to: u64) {
        self.rules().dropped.insert((from, to));
    }

    /// Raft messages from `from` to `to` arrive `d` late.
    pub fn delay(&self, from: u64, to: u64, d: Duration) {
        self.rules().delayed.insert((from, to), d);
    }

    /// The answers of the next `n` acquires through node `node`'s relay are
    /// lost after the node answered.
    pub fn drop_acquire_answers(&self, node: u64, n: usize) {
        *self.rules().lose_acquire_answers.entry(node).or_default() += n;
    }

    /// Every fault removed.
    pub fn heal(&self) {
        *self.rules() = Rules::default();
    }

    /// Records every lock call forwarded from now on into `h`.
    pub fn record_into(&self, h: Arc<History>) {
        *self.history.lock().unwrap_or_else(|p| p.into_inner()) = Some(h);
    }

    /// Batch requests the relays forwarded, and the calls they carried.
    pub fn batches(&self) -> (usize, usize) {
        *self.batches.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn history(&self) -> Option<Arc<History>> {
        self.history.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn take_acquire_loss(&self, node: u64) -> bool {
        let mut r = self.rules();
        match r.lose_acquire_answers.get_mut(&node) {
            Some(n) if *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        }
    }
}

/// The relay of one node; stops when dropped.
pub struct Relay {
    /// Where the relay listens: what the nodes and clients are told.
    pub addr: SocketAddr,
    _stop: tokio::sync::oneshot::Sender<()>,
}

#[derive(Clone)]
struct Forward {
    node: u64,
    net: Arc<RelayNet>,
    raft: RaftClient<Channel>,
    lock: LockClient<Channel>,
    admin: AdminClient<Channel>,
}

impl Relay {
    /// Binds a relay for node `node` on `ip` (port chosen by the OS),
    /// forwarding to `target` (the node's real address, which need not be
    /// listening yet).
    pub async fn start(node: u64, ip: &str, target: &str, net: Arc<RelayNet>) -> Self {
        let listener = tokio::net::TcpListener::bind((ip, 0)).await.expect("bind a relay port");
        let addr = listener.local_addr().unwrap();
        let channel = Endpoint::from_shared(format!("http://{target}"))
            .unwrap()
            .connect_timeout(Duration::from_millis(500))
            .tcp_nodelay(true)
            .connect_lazy();
        let fwd = Forward {
            node,
            net,
            raft: RaftClient::new(channel.clone())
                .max_decoding_message_size(MAX_MESSAGE)
                .max_encoding_message_size(MAX_MESSAGE),
            lock: LockClient::new(channel.clone()),
            admin: AdminClient::new(channel),
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(
                    RaftServer::new(fwd.clone())
                        .max_decoding_message_size(MAX_MESSAGE)
                        .max_encoding_message_size(MAX_MESSAGE),
                )
                .add_service(LockServer::new(fwd.clone()))
                .add_service(AdminServer::new(fwd))
                .serve_with_incoming_shutdown(tokio_stream::wrappers::TcpListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await;
        });
        Self { addr, _stop: stop }
    }
}

/// A lock call as the relay sends it on: the message and the client's
/// `fencer-unreachable` header, which the node reads (the rest of the
/// caller's metadata stays behind, as before).
fn onward<T>(req: Request<T>) -> Request<T> {
    let unreachable = req.metadata().get(UNREACHABLE_HEADER).cloned();
    let mut out = Request::new(req.into_inner());
    if let Some(v) = unreachable {
        out.metadata_mut().insert(UNREACHABLE_HEADER, v);
    }
    out
}

fn lost(what: &str, from: u64, to: u64) -> Status {
    Status::unavailable(format!("relay: {what} {from}->{to} lost (fault injection)"))
}

async fn suffer(fate: Fate, what: &str, from: u64, to: u64) -> Result<(), Status> {
    match fate {
        Fate::Pass => Ok(()),
        Fate::Drop => Err(lost(what, from, to)),
        Fate::Delay(d) => {
            tokio::time::sleep(d).await;
            Ok(())
        }
    }
}

impl Forward {
    /// One raft message from `from` to this node: judged on the way in,
    /// forwarded, and its reply judged on the way back.
    async fn raft_call<T, F, Fut>(&self, from: u64, call: F) -> Result<Response<T>, Status>
    where
        F: FnOnce(RaftClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<Response<T>, Status>>,
    {
        suffer(self.net.judge(from, self.node), "request", from, self.node).await?;
        let reply = call(self.raft.clone()).await?;
        suffer(self.net.judge(self.node, from), "reply", self.node, from).await?;
        Ok(reply)
    }

    fn record(&self, call: Call, sent: Duration, answer: Answer) {
        if let Some(h) = self.net.history() {
            h.record(Op { client: format!("relay->n{}", self.node), call, sent, answered: h.now(), answer });
        }
    }

    fn now(&self) -> Duration {
        self.net.history().map_or(Duration::ZERO, |h| h.now())
    }
}

#[tonic::async_trait]
impl Raft for Forward {
    async fn append_entries(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let req = req.into_inner();
        self.raft_call(req.from, |mut c| async move { c.append_entries(req).await }).await
    }

    async fn vote(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let req = req.into_inner();
        self.raft_call(req.from, |mut c| async move { c.vote(req).await }).await
    }

    async fn pre_vote(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let req = req.into_inner();
        self.raft_call(req.from, |mut c| async move { c.pre_vote(req).await }).await
    }

    async fn install_snapshot(&self, req: Request<Streaming<SnapshotChunk>>) -> Result<Response<RaftPayload>, Status> {
        let mut stream = req.into_inner();
        let Some(first) = stream.next().await.transpose()? else {
            return Err(Status::invalid_argument("relay: empty snapshot stream"));
        };
        let from = first.from;
        let rest = stream.map_while(Result::ok);
        let chunks = tokio_stream::once(first).chain(rest);
        self.raft_call(from, |mut c| async move { c.install_snapshot(chunks).await }).await
    }

    async fn transfer_leader(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let req = req.into_inner();
        self.raft_call(req.from, |mut c| async move { c.transfer_leader(req).await }).await
    }

    async fn hello(&self, req: Request<HelloRequest>) -> Result<Response<HelloResponse>, Status> {
        let req = req.into_inner();
        self.raft_call(req.from, |mut c| async move { c.hello(req).await }).await
    }

    async fn register_signing_key(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let req = req.into_inner();
        self.raft_call(req.from, |mut c| async move { c.register_signing_key(req).await }).await
    }
}

/// The history's record of an Acquire: the ttl asked for, 0 when none was
/// (the server's default).
fn acquire_call(m: &AcquireRequest) -> Call {
    Call::Acquire { resource: m.resource.clone(), request_id: m.request_id.clone(), ttl_ms: m.ttl_ms.unwrap_or(0) }
}

fn acquire_answer(r: Result<&AcquireResponse, &Status>) -> Answer {
    match r {
        Ok(g) => Answer::Granted { lease_id: g.lease_id.clone(), token: g.fencing_token, ttl_ms: g.ttl_ms },
        Err(s) => answer_of(s),
    }
}

fn renew_answer(r: Result<&RenewResponse, &Status>) -> Answer {
    match r {
        Ok(ok) => Answer::Renewed { token: ok.fencing_token },
        Err(s) => answer_of(s),
    }
}

fn release_answer(r: Result<&ReleaseResponse, &Status>) -> Answer {
    match r {
        Ok(ok) if ok.was_holder => Answer::Released,
        Ok(_) => Answer::AlreadyReleased,
        Err(s) => answer_of(s),
    }
}

/// One batch item as the history records it, with its answer: `result` is
/// the item's result, or the status the whole batch failed with. The flag
/// says whether it is an acquire the node granted.
fn batch_record(
    item: &BatchItem,
    result: Result<Option<&batch_result::Result>, &Status>,
) -> Option<(Call, Answer, bool)> {
    use batch_result::Result as R;
    let failed = || match result {
        Err(s) => s.clone(),
        Ok(Some(R::Error(e))) => Status::from(e),
        Ok(_) => Status::internal("relay: the node answered the item with nothing or another call's response"),
    };
    let ok = result.ok().flatten();
    Some(match item.call.as_ref()? {
        batch_item::Call::Acquire(m) => match ok {
            Some(R::Acquire(g)) => (acquire_call(m), acquire_answer(Ok(g)), true),
            _ => (acquire_call(m), acquire_answer(Err(&failed())), false),
        },
        batch_item::Call::Renew(m) => {
            let answer = match ok {
                Some(R::Renew(r)) => renew_answer(Ok(r)),
                _ => renew_answer(Err(&failed())),
            };
            (Call::Renew { resource: m.resource.clone(), lease_id: m.lease_id.clone() }, answer, false)
        }
        batch_item::Call::Release(m) => {
            let answer = match ok {
                Some(R::Release(r)) => release_answer(Ok(r)),
                _ => release_answer(Err(&failed())),
            };
            (Call::Release { resource: m.resource.clone(), lease_id: m.lease_id.clone() }, answer, false)
        }
    })
}

#[tonic::async_trait]
impl Lock for Forward {
    async fn acquire(&self, req: Request<AcquireRequest>) -> Result<Response<AcquireResponse>, Status> {
        let req = onward(req);
        let call = acquire_call(req.get_ref());
        let sent = self.now();
        let r = self.lock.clone().acquire(req).await;
        self.record(call, sent, acquire_answer(r.as_ref().map(Response::get_ref)));
        if r.is_ok() && self.net.take_acquire_loss(self.node) {
            return Err(Status::unavailable("relay: the answer was lost after the node answered (fault injection)"));
        }
        r
    }

    async fn renew(&self, req: Request<RenewRequest>) -> Result<Response<RenewResponse>, Status> {
        let req = onward(req);
        let call = Call::Renew { resource: req.get_ref().resource.clone(), lease_id: req.get_ref().lease_id.clone() };
        let sent = self.now();
        let r = self.lock.clone().renew(req).await;
        self.record(call, sent, renew_answer(r.as_ref().map(Response::get_ref)));
        r
    }

    async fn release(&self, req: Request<ReleaseRequest>) -> Result<Response<ReleaseResponse>, Status> {
        let req = onward(req);
        let call = Call::Release { resource: req.get_ref().resource.clone(), lease_id: req.get_ref().lease_id.clone() };
        let sent = self.now();
        let r = self.lock.clone().release(req).await;
        self.record(call, sent, release_answer(r.as_ref().map(Response::get_ref)));
        r
    }

    /// Every item is recorded as the call it carries, with its own answer.
    /// Losing an acquire's answer loses the whole batch's answer (one
    /// response carries them all); that counts as one lost answer.
    async fn batch(&self, req: Request<BatchRequest>) -> Result<Response<BatchResponse>, Status> {
        let req = onward(req);
        let items = req.get_ref().items.clone();
        {
            let mut b = self.net.batches.lock().unwrap_or_else(|p| p.into_inner());
            *b = (b.0 + 1, b.1 + items.len());
        }
        let sent = self.now();
        let r = self.lock.clone().batch(req).await;
        let mut granted_any = false;
        for (i, item) in items.iter().enumerate() {
            let result = match &r {
                Ok(resp) => Ok(resp.get_ref().results.get(i).and_then(|x| x.result.as_ref())),
                Err(s) => Err(s),
            };
            if let Some((call, answer, granted)) = batch_record(item, result) {
                granted_any |= granted;
                self.record(call, sent, answer);
            }
        }
        if granted_any && self.net.take_acquire_loss(self.node) {
            return Err(Status::unavailable("relay: the answer was lost after the node answered (fault injection)"));
        }
        r
    }

    async fn get_lock(&self, req: Request<GetLockRequest>) -> Result<Response<GetLockResponse>, Status> {
        self.lock.clone().get_lock(onward(req)).await
    }

    async fn list_locks(&self, req: Request<ListLocksRequest>) -> Result<Response<ListLocksResponse>, Status> {
        self.lock.clone().list_locks(onward(req)).await
    }
}

#[tonic::async_trait]
impl Admin for Forward {
    async fn status(&self, req: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        self.admin.clone().status(req.into_inner()).await
    }

    async fn force_release(&self, req: Request<ForceReleaseRequest>) -> Result<Response<ForceReleaseResponse>, Status> {
        self.admin.clone().force_release(req.into_inner()).await
    }

    async fn add_learner(&self, req: Request<AddLearnerRequest>) -> Result<Response<MembershipResponse>, Status> {
        self.admin.clone().add_learner(req.into_inner()).await
    }

    async fn change_membership(
        &self,
        req: Request<ChangeMembershipRequest>,
    ) -> Result<Response<MembershipResponse>, Status> {
        self.admin.clone().change_membership(req.into_inner()).await
    }

    async fn list_signing_keys(
        &self,
        req: Request<ListSigningKeysRequest>,
    ) -> Result<Response<ListSigningKeysResponse>, Status> {
        self.admin.clone().list_signing_keys(req.into_inner()).await
    }

    async fn rotate_signing_key(
        &self,
        req: Request<RotateSigningKeyRequest>,
    ) -> Result<Response<RotateSigningKeyResponse>, Status> {
        self.admin.clone().rotate_signing_key(req.into_inner()).await
    }

    async fn retire_signing_key(
        &self,
        req: Request<RetireSigningKeyRequest>,
    ) -> Result<Response<RetireSigningKeyResponse>, Status> {
        self.admin.clone().retire_signing_key(req.into_inner()).await
    }
}
