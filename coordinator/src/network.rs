//! The raft transport between coordinator nodes: openraft messages, encoded
//! with postcard, carried by the `fencer.raft.v1.Raft` gRPC service on the
//! node's one listening port.
//!
//! Every message carries the sender's cluster id; a node refuses messages
//! from another cluster, so a node started with a foreign data dir cannot join
//! or disturb the wrong cluster. A [`Faults`] hook lets the test harness drop,
//! delay or cut messages without touching sockets.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use fencer_proto::raft::raft_client::RaftClient;
use fencer_proto::raft::raft_server::Raft as RaftRpc;
use fencer_proto::raft::{HelloRequest, HelloResponse, RaftPayload, SnapshotChunk};
use futures::{Future, StreamExt};
use openraft::BasicNode;
use openraft::errors::{NetworkError, RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest, TransferLeaderResponse,
    VoteRequest, VoteResponse,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::transport::{Channel, ClientTlsConfig};
use tonic::{Request, Response, Status, Streaming};

use crate::bootstrap::ClusterId;
use crate::clock::LastSeen;
use crate::metrics::Metrics;
use crate::raft::{RaftHandle, TypeConfig};
use crate::store::{ReceivedSnapshot, SnapshotBody, decode, encode};
use crate::tls::{ConnInfo, peer_endpoint};
use crate::types::NodeId;

type Vote = <TypeConfig as openraft::RaftTypeConfig>::Vote;
type Snapshot = openraft::alias::SnapshotOf<TypeConfig, SnapshotBody>;
type SnapshotMeta = openraft::alias::SnapshotMetaOf<TypeConfig>;

/// Snapshot chunk size on the wire.
const SNAPSHOT_CHUNK: usize = 1 << 20;
/// Largest raft message accepted (append batches, snapshot chunks).
pub(crate) const MAX_RAFT_MESSAGE: usize = 64 << 20;
/// The shortest deadline of an append that carries entries. openraft
/// offers one heartbeat interval (50 ms by default), but the follower
/// answers after its fsync, which on a loaded machine takes longer; a
/// deadline missed counts as "unreachable" and openraft then pauses
/// replication to that follower for 200 ms and more (its backoff) — when
/// both followers miss it together, nothing commits for that long. A dead
/// follower is noticed by its connection (reset, HTTP/2 keep-alive), not
/// by this deadline. Heartbeats (no entries) keep openraft's.
const APPEND_DEADLINE: Duration = Duration::from_secs(1);

/// What the fault hook decides for one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultAction {
    /// Deliver normally.
    Pass,
    /// Lose the message (the sender sees the peer as unreachable).
    Drop,
    /// Deliver after a delay.
    Delay(Duration),
}

/// Fault injection for the raft transport (tests only in practice).
pub trait Faults: Send + Sync + 'static {
    /// Decides the fate of a request from `from` to `to` before it is sent.
    fn request(&self, from: NodeId, to: NodeId) -> FaultAction;
    /// Decides the fate of the reply to `from` after `to` processed the request.
    fn reply(&self, from: NodeId, to: NodeId) -> FaultAction;
    /// Decides the fate of an append that carries entries (heartbeats carry
    /// none), judged before [`request`](Self::request): a test can hold the
    /// log back while the leader is still acknowledged.
    fn entries(&self, _from: NodeId, _to: NodeId) -> FaultAction {
        FaultAction::Pass
    }
    /// Whether a snapshot that `from` sends to `to` is cut in the middle:
    /// the first half of its body is sent, then the call is dropped, as the
    /// leader drops it when its replication ends or the transfer times out.
    fn cut_snapshot(&self, _from: NodeId, _to: NodeId) -> bool {
        false
    }
}

/// How long a snapshot cut by [`Faults::cut_snapshot`] stays open after its
/// first chunk left, so that the chunk reaches the follower first.
const CUT_SNAPSHOT_AFTER: Duration = Duration::from_millis(300);

/// Builds one [`PeerClient`] per target node.
#[derive(Clone)]
pub(crate) struct NetworkFactory {
    from: NodeId,
    cluster_id: Arc<ClusterId>,
    faults: Option<Arc<dyn Faults>>,
    connect_timeout: Duration,
    tls: Option<ClientTlsConfig>,
    replication_interval: Duration,
}

impl NetworkFactory {
    /// A factory for node `from` of the cluster `cluster_id` names; with
    /// `tls`, peers are called over https with this node's certificate.
    /// Appends to one follower are pulled at most once per
    /// `replication_interval` ([`Paced`]; zero: as fast as answered).
    pub(crate) fn new(
        from: NodeId,
        cluster_id: Arc<ClusterId>,
        faults: Option<Arc<dyn Faults>>,
        tls: Option<ClientTlsConfig>,
        replication_interval: Duration,
    ) -> Self {
        Self { from, cluster_id, faults, connect_timeout: Duration::from_millis(500), tls, replication_interval }
    }
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> PeerClient {
        let channel = peer_endpoint(&node.addr, self.tls.as_ref())
            .map(|e| crate::coalesce::channel(&e.connect_timeout(self.connect_timeout)));
        PeerClient {
            from: self.from,
            target,
            cluster_id: self.cluster_id.clone(),
            client: channel.ok().map(|c| {
                RaftClient::new(c)
                    .max_decoding_message_size(MAX_RAFT_MESSAGE)
                    .max_encoding_message_size(MAX_RAFT_MESSAGE)
            }),
            addr: node.addr.clone(),
            faults: self.faults.clone(),
            replication_interval: self.replication_interval,
            last_append: Arc::new(LastSeen::never()),
        }
    }
}

/// The connection from this node to one peer.
pub(crate) struct PeerClient {
    from: NodeId,
    target: NodeId,
    cluster_id: Arc<ClusterId>,
    client: Option<RaftClient<Channel>>,
    addr: String,
    faults: Option<Arc<dyn Faults>>,
    replication_interval: Duration,
    last_append: Arc<LastSeen>,
}

/// The deadline of one append: openraft's for a heartbeat, at least
/// [`APPEND_DEADLINE`] for one that carries entries.
fn append_deadline(rpc: &AppendEntriesRequest<TypeConfig>, offered: Duration) -> Duration {
    if rpc.entries.is_empty() { offered } else { offered.max(APPEND_DEADLINE) }
}

fn unreachable(msg: impl ToString) -> RPCError<TypeConfig> {
    RPCError::Unreachable(Unreachable::from_string(msg))
}

impl PeerClient {
    async fn fault(&self, action: FaultAction, what: &str) -> Result<(), RPCError<TypeConfig>> {
        match action {
            FaultAction::Pass => Ok(()),
            FaultAction::Drop => {
                Err(unreachable(format!("{what} {}->{} dropped by fault injection", self.from, self.target)))
            }
            FaultAction::Delay(d) => {
                tokio::time::sleep(d).await;
                Ok(())
            }
        }
    }

    fn client(&self) -> Result<RaftClient<Channel>, RPCError<TypeConfig>> {
        self.client.clone().ok_or_else(|| unreachable(format!("bad peer address {:?}", self.addr)))
    }

    fn payload<T: Serialize>(&self, value: &T) -> Result<RaftPayload, RPCError<TypeConfig>> {
        let data = encode(value).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        Ok(RaftPayload { cluster_id: self.cluster_id.to_text(), from: self.from, to: self.target, data })
    }

    /// Sends one unary RPC with the faults applied and decodes the reply.
    async fn call<Req, Resp, F, Fut>(
        &self,
        what: &str,
        req: &Req,
        ttl: Duration,
        send: F,
    ) -> Result<Resp, RPCError<TypeConfig>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        F: FnOnce(RaftClient<Channel>, Request<RaftPayload>) -> Fut,
        Fut: Future<Output = Result<Response<RaftPayload>, Status>>,
    {
        self.call_or_status(what, req, ttl, send).await.map_err(|e| match e {
            Failed::Status(status) => status_error(what, self.target, status),
            Failed::Rpc(e) => e,
        })
    }

    /// As [`Self::call`], keeping a refusal by the peer's gRPC layer as the
    /// status it was, for callers that treat one code specially.
    async fn call_or_status<Req, Resp, F, Fut>(
        &self,
        what: &str,
        req: &Req,
        ttl: Duration,
        send: F,
    ) -> Result<Resp, Failed>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        F: FnOnce(RaftClient<Channel>, Request<RaftPayload>) -> Fut,
        Fut: Future<Output = Result<Response<RaftPayload>, Status>>,
    {
        if let Some(f) = &self.faults {
            self.fault(f.request(self.from, self.target), what).await?;
        }
        let mut request = Request::new(self.payload(req)?);
        request.set_timeout(ttl);
        let reply = match tokio::time::timeout(ttl, send(self.client()?, request)).await {
            Err(_) => return Err(unreachable(format!("{what} to node {} timed out after {ttl:?}", self.target)).into()),
            Ok(Err(status)) => return Err(Failed::Status(status)),
            Ok(Ok(r)) => r.into_inner(),
        };
        if let Some(f) = &self.faults {
            self.fault(f.reply(self.from, self.target), what).await?;
        }
        let result: Result<Resp, String> =
            decode(&reply.data, what).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|remote| unreachable(format!("node {} refused {what}: {remote}", self.target)).into())
    }
}

/// Why [`PeerClient::call_or_status`] has no answer.
enum Failed {
    /// The peer's gRPC layer answered with this status.
    Status(Status),
    /// Anything else (fault injection, timeout, encoding, the peer's raft).
    Rpc(RPCError<TypeConfig>),
}

impl From<RPCError<TypeConfig>> for Failed {
    fn from(e: RPCError<TypeConfig>) -> Self {
        Self::Rpc(e)
    }
}

fn status_error(what: &str, target: NodeId, status: Status) -> RPCError<TypeConfig> {
    match status.code() {
        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled | tonic::Code::Unknown => {
            unreachable(format!("{what} to node {target}: {}", status.message()))
        }
        _ => RPCError::Network(NetworkError::from_string(format!("{what} to node {target}: {status}"))),
    }
}

/// openraft's request stream of one follower, pulled no sooner than
/// `interval` after the previous request was pulled (pacing, issue 18).
///
/// openraft builds an append request when it is pulled, from every entry
/// the leader holds by then, and pulls the next one when the previous
/// answer arrives: on a fast disk that is a round every ~1 ms carrying a
/// few entries, and a follower's CPU goes by rounds (a gRPC call, a raft
/// step, an `fdatasync`, an apply batch, wake-ups), not by entries. Pulling
/// at most once per interval lets the entries proposed meanwhile travel
/// together; an append that follows a quiet spell is never delayed, so the
/// added latency is at most the interval and only under load.
struct Paced<S> {
    inner: S,
    interval: Duration,
    /// When this follower's last append request was pulled (shared across
    /// openraft's replication sessions to it).
    last: Arc<LastSeen>,
    sleep: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl<S: futures::Stream + Unpin> futures::Stream for Paced<S> {
    type Item = S::Item;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<S::Item>> {
        use std::task::Poll;
        let this = &mut *self;
        if let Some(age) = this.last.age()
            && age < this.interval
        {
            let sleep = this.sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep(this.interval - age)));
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
        this.sleep = None;
        let next = std::pin::Pin::new(&mut this.inner).poll_next(cx);
        if let Poll::Ready(Some(_)) = &next {
            this.last.touch();
        }
        next
    }
}

impl RaftNetworkV2<TypeConfig> for PeerClient {
    type SnapshotData = SnapshotBody;

    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> openraft::base::BoxFuture<
        's,
        Result<
            openraft::base::BoxStream<'s, Result<openraft::raft::StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>>,
            RPCError<TypeConfig>,
        >,
    >
    where
        S: futures::Stream<Item = AppendEntriesRequest<TypeConfig>> + openraft::OptionalSend + Unpin + 'static,
    {
        let paced =
            Paced { inner: input, interval: self.replication_interval, last: self.last_append.clone(), sleep: None };
        openraft::network::stream_append_sequential(self, paced, option)
    }

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        let ttl = append_deadline(&rpc, option.hard_ttl());
        if let Some(f) = self.faults.as_ref().filter(|_| !rpc.entries.is_empty()) {
            self.fault(f.entries(self.from, self.target), "append_entries with entries").await?;
        }
        self.call("append_entries", &rpc, ttl, |mut c, r| async move { c.append_entries(r).await }).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call("vote", &rpc, option.hard_ttl(), |mut c, r| async move { c.vote(r).await }).await
    }

    /// Pre-Vote (served, and off in `node` until `/readyz` judges a
    /// follower's leader by its last contact): a peer that predates the RPC answers
    /// UNIMPLEMENTED and is counted as granting, as openraft's own default
    /// does, so a cluster in the middle of a rolling upgrade still elects.
    /// Any other failure is no grant: an isolated node must not talk itself
    /// into an election.
    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        let what = "pre_vote";
        match self.call_or_status(what, &rpc, option.hard_ttl(), |mut c, r| async move { c.pre_vote(r).await }).await {
            Ok(resp) => Ok(resp),
            Err(Failed::Status(s)) if s.code() == tonic::Code::Unimplemented => {
                tracing::debug!(target = self.target, "peer predates Pre-Vote; counting it as granting");
                Ok(VoteResponse::new(rpc.vote, None, true))
            }
            Err(Failed::Status(s)) => Err(status_error(what, self.target, s)),
            Err(Failed::Rpc(e)) => Err(e),
        }
    }

    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call("transfer_leader", &req, option.hard_ttl(), |mut c, r| async move { c.transfer_leader(r).await })
            .await
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let to_streaming = |e: RPCError<TypeConfig>| match e {
            RPCError::Unreachable(u) => StreamingError::Unreachable(u),
            RPCError::Timeout(t) => StreamingError::Timeout(t),
            RPCError::Network(n) => StreamingError::Network(n),
            RPCError::RemoteError(r) => StreamingError::Unreachable(Unreachable::from_string(r.to_string())),
        };
        if let Some(f) = &self.faults {
            self.fault(f.request(self.from, self.target), "install_snapshot").await.map_err(to_streaming)?;
        }
        let header =
            encode(&(vote, snapshot.meta.clone())).map_err(|e| StreamingError::Network(NetworkError::new(&e)))?;
        let blank = SnapshotChunk {
            cluster_id: self.cluster_id.to_text(),
            from: self.from,
            to: self.target,
            header: Vec::new(),
            data: Vec::new(),
            body_len: None,
        };
        let cut = self.faults.as_ref().is_some_and(|f| f.cut_snapshot(self.from, self.target));
        let size = if cut { (snapshot.snapshot.len() / 2).max(1) as usize } else { SNAPSHOT_CHUNK };
        let (chunks, mut read_failed) = snapshot_chunks(snapshot.snapshot, header, blank, size);
        let (chunks, first_taken) = if cut {
            let (chunks, first_taken) = cut_after_first(chunks);
            (futures::future::Either::Left(chunks), Some(first_taken))
        } else {
            (futures::future::Either::Right(chunks), None)
        };
        // A cut call is dropped once its first chunk has had time to arrive.
        let cut_now = async move {
            let Some(taken) = first_taken else { return std::future::pending().await };
            match taken.await {
                Ok(()) => tokio::time::sleep(CUT_SNAPSHOT_AFTER).await,
                Err(_) => std::future::pending().await,
            }
        };
        let mut client = self.client().map_err(to_streaming)?;
        let send = client.install_snapshot(chunks);
        let ttl = option.hard_ttl().max(Duration::from_secs(30));
        let reply = tokio::select! {
            closed = cancel => return Err(StreamingError::Closed(closed)),
            () = cut_now => {
                let e = format!("install_snapshot {}->{} cut by fault injection", self.from, self.target);
                return Err(to_streaming(unreachable(e)));
            }
            // Dropping the call resets its stream, which the follower sees
            // as an end: it refuses the body short of its declared length.
            Ok(e) = &mut read_failed => return Err(StreamingError::Network(NetworkError::new(&e))),
            r = tokio::time::timeout(ttl, send) => match r {
                Err(_) => return Err(to_streaming(unreachable(format!("snapshot to node {} timed out", self.target)))),
                Ok(Err(status)) => return Err(to_streaming(status_error("install_snapshot", self.target, status))),
                Ok(Ok(r)) => r.into_inner(),
            },
        };
        let result: Result<SnapshotResponse<TypeConfig>, String> =
            decode(&reply.data, "snapshot reply").map_err(|e| StreamingError::Network(NetworkError::new(&e)))?;
        result.map_err(|remote| to_streaming(unreachable(format!("node {} refused snapshot: {remote}", self.target))))
    }
}

/// The chunks of a snapshot cut by [`Faults::cut_snapshot`]: the first
/// one, then none; the receiver hears when the first one was taken. The
/// stream ends well after the call is dropped (so the transport's task
/// that sends it finishes instead of holding the connection open); should
/// that end still reach the follower, the body is short of its declared
/// length all the same.
fn cut_after_first(
    chunks: impl futures::Stream<Item = SnapshotChunk> + Send + 'static,
) -> (impl futures::Stream<Item = SnapshotChunk> + Send + 'static, tokio::sync::oneshot::Receiver<()>) {
    let (taken, first_taken) = tokio::sync::oneshot::channel();
    let mut taken = Some(taken);
    let chunks = chunks
        .take(1)
        .inspect(move |_| {
            if let Some(taken) = taken.take() {
                let _ = taken.send(());
            }
        })
        .chain(
            futures::stream::once(tokio::time::sleep(CUT_SNAPSHOT_AFTER * 2))
                .filter_map(|()| std::future::ready(None::<SnapshotChunk>)),
        );
    (chunks, first_taken)
}

/// How long the chunk stream of a snapshot whose read failed stalls before
/// it ends (see [`snapshot_chunks`]).
const STALLED_SNAPSHOT_ENDS_AFTER: Duration = Duration::from_secs(10);

/// The chunks of a snapshot on the wire, read from its body one at a time
/// (so the body is never whole in memory to be sent): the first carries
/// `header`, every one is `blank` with its data; a body of no bytes is one
/// chunk; the first declares the body's length. A read error is sent on
/// the returned receiver and the stream then stalls for
/// [`STALLED_SNAPSHOT_ENDS_AFTER`], so the caller drops the call first.
/// Either way the follower receives less than the declared length and
/// refuses it (a reset reaches it as an end, see the proto's `body_len`).
fn snapshot_chunks(
    body: SnapshotBody,
    header: Vec<u8>,
    blank: SnapshotChunk,
    size: usize,
) -> (impl futures::Stream<Item = SnapshotChunk> + Send + 'static, tokio::sync::oneshot::Receiver<std::io::Error>) {
    let (failed, read_failed) = tokio::sync::oneshot::channel();
    let state = (body, 0u64, Some(header), Some(failed));
    let chunks = futures::stream::unfold(state, move |(body, at, header, mut failed)| {
        let blank = blank.clone();
        async move {
            if header.is_none() && at >= body.len() {
                return None;
            }
            match body.read_chunk(at, size).await {
                Ok(data) => {
                    let next = at + data.len() as u64;
                    // The first chunk says how long the body is (see the proto).
                    let body_len = header.is_some().then(|| body.len());
                    let chunk = SnapshotChunk { header: header.unwrap_or_default(), data, body_len, ..blank };
                    Some((chunk, (body, next, None, failed)))
                }
                Err(e) => {
                    if let Some(failed) = failed.take() {
                        let _ = failed.send(e);
                    }
                    // The caller drops the call at once, which resets the
                    // stream. Should the transport go on polling a dropped
                    // call's body, it ends after a while; the follower
                    // refuses the short body either way (its declared length).
                    tokio::time::sleep(STALLED_SNAPSHOT_ENDS_AFTER).await;
                    None
                }
            }
        }
    });
    (chunks, read_failed)
}

/// The server side of the raft transport.
pub(crate) struct RaftService {
    raft: RaftHandle,
    node_id: NodeId,
    cluster_id: Arc<ClusterId>,
    require_peer: bool,
    /// For members' signing-key registrations (module `signing`).
    svc: crate::service::LockService,
    /// Where a snapshot being received is written (the store's snapshot dir).
    snapshot_dir: PathBuf,
}

impl RaftService {
    /// Serves raft messages for `raft`, refusing other clusters' messages
    /// and every message while this node has not joined a cluster yet.
    /// With `require_peer` (TLS on the port), every call must come over a
    /// connection whose client certificate chains to the peer CA.
    pub(crate) fn new(
        raft: RaftHandle,
        node_id: NodeId,
        cluster_id: Arc<ClusterId>,
        require_peer: bool,
        svc: crate::service::LockService,
        snapshot_dir: PathBuf,
    ) -> Self {
        Self { raft, node_id, cluster_id, require_peer, svc, snapshot_dir }
    }

    /// Refuses a call that did not come from an authenticated peer, when
    /// peers must authenticate. Clients cannot reach raft this way: their
    /// certificates (if any) chain to the client CA, not the peer CA.
    fn authenticate<T>(&self, request: &Request<T>) -> Result<(), Status> {
        if !self.require_peer {
            return Ok(());
        }
        let peer = request.extensions().get::<ConnInfo>().is_some_and(|c| c.peer);
        if !peer {
            tracing::warn!(remote = ?request.remote_addr(), "refusing raft traffic without a peer certificate");
            return Err(Status::permission_denied(
                "raft traffic needs a client certificate issued by the cluster's peer CA",
            ));
        }
        Ok(())
    }

    /// Refuses a message of another cluster, one sent to another node, one
    /// claiming to come from this node, and every message before this node
    /// joined a cluster. `to` is 0 from a sender that does not say.
    fn check(&self, cluster_id: &str, from: NodeId, to: NodeId) -> Result<(), Status> {
        let Some(ours) = self.cluster_id.get() else {
            return Err(Status::failed_precondition(format!(
                "node {} has not joined a cluster yet (it greets its peers and adopts their cluster)",
                self.node_id
            )));
        };
        if cluster_id != &*ours {
            tracing::error!(from, theirs = cluster_id, %ours, "refusing raft message from another cluster; check --peers and the data dirs");
            return Err(Status::failed_precondition(format!(
                "node {} belongs to cluster {ours}, not {cluster_id}",
                self.node_id
            )));
        }
        misrouted(self.node_id, from, to).map_err(|why| {
            tracing::error!(from, to, me = self.node_id, "refusing a misrouted raft message: {why}");
            Status::failed_precondition(why)
        })
    }

    /// The request of a unary raft RPC from an authenticated peer, checked
    /// for cluster and routing ([`Self::check`]) and decoded, with its sender.
    fn open<T: DeserializeOwned>(&self, request: Request<RaftPayload>, what: &str) -> Result<(NodeId, T), Status> {
        self.authenticate(&request)?;
        let p = request.into_inner();
        self.check(&p.cluster_id, p.from, p.to)?;
        Ok((p.from, decode(&p.data, what).map_err(bad_payload)?))
    }

    /// Refuses an append, vote, pre-vote or snapshot request whose vote names this
    /// node ([`own_vote`]), logging it.
    fn not_mine(&self, what: &str, from: NodeId, vote: &Vote) -> Result<(), Status> {
        own_vote(self.node_id, what, vote).map_err(|why| {
            tracing::error!(from, me = self.node_id, %vote, "refusing a looped-back raft message: {why}");
            Status::failed_precondition(why)
        })
    }

    fn reply<T: Serialize>(&self, result: Result<T, String>) -> Result<Response<RaftPayload>, Status> {
        let data = encode(&result).map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(RaftPayload { cluster_id: self.cluster_id.to_text(), from: self.node_id, to: 0, data }))
    }
}

/// Why node `me` must not take a raft message that says it comes from
/// `from` and is meant for `to` (0: not said): the peer lists disagree
/// about which address is which node, and acting on it could make a node
/// follow its own leadership.
fn misrouted(me: NodeId, from: NodeId, to: NodeId) -> Result<(), String> {
    if to != 0 && to != me {
        return Err(format!(
            "a raft message for node {to} from node {from} reached node {me}: node {from}'s peer list gives node {to} this node's address"
        ));
    }
    if from == me {
        return Err(format!(
            "a raft message claims to come from node {me}, which is this node: two nodes run with node id {me}, or a peer list gives another node this node's address"
        ));
    }
    Ok(())
}

/// Why node `me` must not hand raft a `what` request carrying `vote`: only
/// `me` leads or campaigns under its own id, so a request with its vote is
/// its own message looped back, or one from a second process running with
/// its id. Raft must never see it: counting itself twice, a leader could
/// commit without a real majority.
fn own_vote(me: NodeId, what: &str, vote: &Vote) -> Result<(), String> {
    if vote.leader_id().node_id != me {
        return Ok(());
    }
    Err(format!(
        "a raft {what} request with node {me}'s own vote {vote} reached node {me}: a second process runs with node id {me}, or a peer list gives another node this node's address"
    ))
}

fn bad_payload(e: std::io::Error) -> Status {
    Status::invalid_argument(format!("undecodable raft payload: {e}"))
}

/// A snapshot this node could not write down as it arrived (a full disk,
/// say): logged here, and refused to the leader, which sends it again.
fn not_received(metrics: &Metrics, e: std::io::Error) -> Status {
    metrics.snapshot_refused("not_stored");
    tracing::warn!(error = %e, "could not store a snapshot being received; the leader will send it again");
    Status::unavailable(format!("this node could not store the snapshot: {e}"))
}

/// A snapshot stream that ended before the whole body arrived: logged here
/// and refused, with nothing installed (the leader sends it again).
fn cut_short(metrics: &Metrics, received: u64, declared: u64) -> Status {
    metrics.snapshot_refused("cut_short");
    tracing::warn!(
        received,
        declared,
        "a snapshot stream ended before its whole body arrived (its sender cancelled it); nothing installed"
    );
    Status::aborted(format!(
        "the snapshot stream ended after {received} of its {declared} bytes (its sender cancelled it); nothing installed"
    ))
}

/// A snapshot stream that carries more than its first chunk declared:
/// logged here and refused, with nothing installed.
fn too_long(metrics: &Metrics, declared: u64) -> Status {
    metrics.snapshot_refused("too_long");
    tracing::warn!(declared, "a snapshot stream carries more than its first chunk declared; refused");
    Status::invalid_argument(format!(
        "the snapshot stream carries more than the {declared} bytes its first chunk declared"
    ))
}

#[tonic::async_trait]
impl RaftRpc for RaftService {
    async fn append_entries(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let (from, req): (_, AppendEntriesRequest<TypeConfig>) = self.open(request, "append_entries")?;
        self.not_mine("append_entries", from, &req.vote)?;
        let result = self.raft.append_entries(req).await;
        // Accepted as coming from this node's leader (a log conflict too):
        // what a follower's readiness counts from (module `service::status`).
        if matches!(&result, Ok(r) if !matches!(r, AppendEntriesResponse::HigherVote(_))) {
            self.svc.inner.leader_contact.touch();
        }
        self.reply(result.map_err(|e| e.to_string()))
    }

    async fn vote(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let (from, req): (_, VoteRequest<TypeConfig>) = self.open(request, "vote")?;
        self.not_mine("vote", from, &req.vote)?;
        self.reply(self.raft.vote(req).await.map_err(|e| e.to_string()))
    }

    async fn pre_vote(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let (from, req): (_, VoteRequest<TypeConfig>) = self.open(request, "pre_vote")?;
        self.not_mine("pre_vote", from, &req.vote)?;
        self.reply(self.raft.pre_vote(req).await.map_err(|e| e.to_string()))
    }

    async fn transfer_leader(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let (_, req): (_, TransferLeaderRequest<TypeConfig>) = self.open(request, "transfer_leader")?;
        self.reply(self.raft.handle_transfer_leader(req).await.map_err(|e| e.to_string()))
    }

    async fn install_snapshot(
        &self,
        request: Request<Streaming<SnapshotChunk>>,
    ) -> Result<Response<RaftPayload>, Status> {
        self.authenticate(&request)?;
        let mut stream = request.into_inner();
        // The header of the first chunk, and the body, which goes to a file
        // as it arrives (issue 18: in memory, a follower catching up peaked
        // at 321 MB).
        let metrics = &self.svc.inner.metrics;
        let mut received: Option<(Vote, SnapshotMeta, ReceivedSnapshot)> = None;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            self.check(&chunk.cluster_id, chunk.from, chunk.to)?;
            let (_, _, body) = match received.as_mut() {
                Some(received) => received,
                None => {
                    let (vote, meta) = decode(&chunk.header, "snapshot header").map_err(bad_payload)?;
                    // Before anything is written down.
                    self.not_mine("install_snapshot", chunk.from, &vote)?;
                    let body = ReceivedSnapshot::create(&self.snapshot_dir, chunk.body_len)
                        .await
                        .map_err(|e| not_received(metrics, e))?;
                    received.insert((vote, meta, body))
                }
            };
            if let Some(declared) = body.would_exceed(chunk.data.len()) {
                return Err(too_long(metrics, declared));
            }
            body.append(chunk.data).await.map_err(|e| not_received(metrics, e))?;
        }
        let Some((vote, meta, body)) = received else {
            return Err(Status::invalid_argument("empty snapshot stream"));
        };
        // Only a whole body: openraft handed half of one fails to install
        // it, and a failed install stops this node's raft.
        let body = body.whole().map_err(|(received, declared)| cut_short(metrics, received, declared))?;
        let snapshot = Snapshot { meta, snapshot: body };
        self.reply(self.raft.install_full_snapshot(vote, snapshot).await.map_err(|e| e.to_string()))
    }

    /// A member registers its own signing key with this leader: `from` is
    /// the node that keeps the secret, and must be a member.
    async fn register_signing_key(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let (from, reg): (_, crate::signing::KeyRegistration) = self.open(request, "register_signing_key")?;
        if !self.svc.is_member(from) {
            return Err(Status::permission_denied(format!("node {from} is not a member of this cluster")));
        }
        if self.raft.as_leader().is_err() {
            return self
                .reply::<crate::state_machine::KeyChange>(Err(format!("node {} is not the leader", self.node_id)));
        }
        let result = self
            .svc
            .registration_outcome(from, reg.kid, reg.public_key, reg.not_before_unix_ms)
            .await
            .map_err(|e| e.to_string());
        self.reply(result)
    }

    async fn hello(&self, request: Request<HelloRequest>) -> Result<Response<HelloResponse>, Status> {
        self.authenticate(&request)?;
        let r = request.into_inner();
        let ours = self.cluster_id.to_text();
        if !r.cluster_id.is_empty() && !ours.is_empty() && r.cluster_id != ours {
            tracing::error!(from = r.from, theirs = %r.cluster_id, %ours, "a node of another cluster greeted this one; check --peers and the data dirs");
        }
        Ok(Response::new(HelloResponse { cluster_id: ours, node_id: self.node_id }))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use openraft::alias::EntryOf;
    use openraft::entry::RaftEntry as _;
    use openraft::raft::AppendEntriesRequest;

    use super::{
        APPEND_DEADLINE, SnapshotBody, SnapshotChunk, Vote, append_deadline, misrouted, own_vote, snapshot_chunks,
    };
    use crate::raft::TypeConfig;

    #[test]
    fn an_append_with_entries_waits_for_the_followers_fsync_a_heartbeat_does_not() {
        let log_id = openraft::testing::log_id::<TypeConfig>(1, 1, 7);
        let heartbeat = AppendEntriesRequest::<TypeConfig> {
            vote: Vote::new_committed(1, 1),
            prev_log_id: Some(log_id),
            leader_commit: Some(log_id),
            entries: vec![],
        };
        let fifty = Duration::from_millis(50);
        assert_eq!(append_deadline(&heartbeat, fifty), fifty, "a heartbeat keeps openraft's deadline");
        let mut append = heartbeat;
        append.entries = vec![EntryOf::<TypeConfig>::new_blank(openraft::testing::log_id::<TypeConfig>(1, 1, 8))];
        assert_eq!(append_deadline(&append, fifty), APPEND_DEADLINE, "entries wait for the fsync");
        let long = APPEND_DEADLINE * 3;
        assert_eq!(append_deadline(&append, long), long, "a longer deadline offered is kept");
    }

    /// Pacing (issue 18): a follower's next append request is pulled no
    /// sooner than the interval after the last, across replication
    /// sessions; one after a quiet spell is not held at all.
    #[tokio::test(start_paused = true)]
    async fn appends_are_pulled_at_most_once_per_interval_and_never_held_after_a_quiet_spell() {
        use std::sync::Arc;

        use futures::StreamExt as _;
        use tokio::time::Instant;

        use super::{LastSeen, Paced};

        let interval = Duration::from_millis(4);
        let last = Arc::new(LastSeen::never());
        let (tx, rx) = futures::channel::mpsc::unbounded::<u32>();
        let mut paced = Paced { inner: rx, interval, last: last.clone(), sleep: None };
        tx.unbounded_send(1).unwrap();
        tx.unbounded_send(2).unwrap();
        let start = Instant::now();
        assert_eq!(paced.next().await, Some(1));
        assert_eq!(start.elapsed(), Duration::ZERO, "the first request is not held");
        assert_eq!(paced.next().await, Some(2));
        assert_eq!(start.elapsed(), interval, "the next one waits out the interval");

        tokio::time::advance(Duration::from_millis(10)).await;
        tx.unbounded_send(3).unwrap();
        let quiet = Instant::now();
        assert_eq!(paced.next().await, Some(3));
        assert_eq!(quiet.elapsed(), Duration::ZERO, "after a quiet spell nothing waits");

        // A new replication session to the same follower keeps the pace.
        let (tx2, rx2) = futures::channel::mpsc::unbounded::<u32>();
        let mut session = Paced { inner: rx2, interval, last, sleep: None };
        tx2.unbounded_send(4).unwrap();
        let next = Instant::now();
        assert_eq!(session.next().await, Some(4));
        assert_eq!(next.elapsed(), interval);

        // Zero: never held.
        let (tx3, rx3) = futures::channel::mpsc::unbounded::<u32>();
        let mut unpaced =
            Paced { inner: rx3, interval: Duration::ZERO, last: Arc::new(LastSeen::never()), sleep: None };
        tx3.unbounded_send(5).unwrap();
        tx3.unbounded_send(6).unwrap();
        let at = Instant::now();
        assert_eq!(unpaced.next().await, Some(5));
        assert_eq!(unpaced.next().await, Some(6));
        assert_eq!(at.elapsed(), Duration::ZERO);
    }

    #[test]
    fn a_request_with_the_receivers_own_vote_is_refused() {
        let vote = |term: u64, node: u64| Vote::new_committed(term, node);
        assert_eq!(own_vote(2, "append_entries", &vote(3, 1)), Ok(()));
        let e = own_vote(1, "append_entries", &vote(3, 1)).unwrap_err();
        assert!(e.contains("node 1's own vote"), "{e}");
        assert!(own_vote(1, "vote", &Vote::new(4, 1)).is_err(), "a campaign under this node's id");
    }

    #[test]
    fn a_message_for_another_node_or_from_itself_is_misrouted() {
        assert_eq!(misrouted(2, 1, 2), Ok(()));
        assert_eq!(misrouted(2, 1, 0), Ok(()), "a sender that does not say `to` is taken");
        let e = misrouted(2, 1, 3).unwrap_err();
        assert!(e.contains("for node 3 from node 1 reached node 2"), "{e}");
        let e = misrouted(2, 2, 2).unwrap_err();
        assert!(e.contains("claims to come from node 2"), "{e}");
        assert!(misrouted(2, 2, 0).is_err());
    }

    /// A snapshot the follower cannot write down (a full disk) is refused
    /// as UNAVAILABLE, which the leader retries, with the cause in the text.
    #[test]
    fn a_snapshot_that_cannot_be_stored_is_refused_as_unavailable() {
        let full = std::io::Error::new(std::io::ErrorKind::StorageFull, "write /data/snapshots: No space left");
        let metrics = crate::metrics::Metrics::new();
        let status = super::not_received(&metrics, full);
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert!(status.message().contains("could not store the snapshot"), "{}", status.message());
        assert!(status.message().contains("No space left"), "{}", status.message());
        assert_eq!(metrics.snapshots_refused_for("not_stored"), 1, "counted for operators");
    }

    /// A stream cut short is refused as ABORTED with both lengths in the
    /// text, one that runs past its length as INVALID_ARGUMENT, each
    /// counted under its reason.
    #[test]
    fn a_snapshot_cut_short_or_too_long_is_refused_and_counted() {
        let metrics = crate::metrics::Metrics::new();
        let status = super::cut_short(&metrics, 10, 30);
        assert_eq!(status.code(), tonic::Code::Aborted);
        assert!(status.message().contains("after 10 of its 30 bytes"), "{}", status.message());
        assert_eq!(metrics.snapshots_refused_for("cut_short"), 1);
        let status = super::too_long(&metrics, 30);
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains("more than the 30 bytes"), "{}", status.message());
        assert_eq!(metrics.snapshots_refused_for("too_long"), 1);
        assert!(
            metrics.encode().contains(r#"fencer_snapshots_refused_total{reason="cut_short"} 1"#),
            "{}",
            metrics.encode()
        );
    }

    fn blank() -> SnapshotChunk {
        SnapshotChunk { cluster_id: "c".into(), from: 1, to: 2, header: Vec::new(), data: Vec::new(), body_len: None }
    }

    /// A snapshot goes out a chunk at a time, the header on the first only;
    /// the chunks are the body, and an empty body is one chunk.
    #[tokio::test]
    async fn a_snapshot_is_sent_in_chunks_with_the_header_on_the_first() {
        use futures::StreamExt as _;

        let body: Vec<u8> = (0..10).collect();
        let (chunks, _failed) = snapshot_chunks(SnapshotBody::from_bytes(body.clone()), vec![9, 9], blank(), 3);
        let chunks: Vec<SnapshotChunk> = chunks.collect().await;
        let sizes: Vec<usize> = chunks.iter().map(|c| c.data.len()).collect();
        assert_eq!(sizes, [3, 3, 3, 1]);
        assert_eq!(chunks[0].header, [9, 9]);
        assert!(chunks[1..].iter().all(|c| c.header.is_empty()), "the header travels once");
        assert_eq!(chunks[0].body_len, Some(10), "the first chunk declares the body's length");
        assert!(chunks[1..].iter().all(|c| c.body_len.is_none()), "once");
        assert!(chunks.iter().all(|c| c.cluster_id == "c" && c.from == 1 && c.to == 2));
        assert_eq!(chunks.iter().flat_map(|c| c.data.clone()).collect::<Vec<u8>>(), body);

        let (chunks, _failed) = snapshot_chunks(SnapshotBody::from_bytes(Vec::new()), vec![7], blank(), 3);
        let chunks: Vec<SnapshotChunk> = chunks.collect().await;
        assert_eq!(chunks.len(), 1, "an empty body still carries the header");
        assert_eq!((chunks[0].header.as_slice(), chunks[0].data.len()), (&[7u8][..], 0));
        assert_eq!(chunks[0].body_len, Some(0));
    }

    /// A read error mid-body is reported, and the stream does not end at
    /// once: a clean end would hand the follower a short body (the caller
    /// drops the call instead, which resets the stream).
    #[tokio::test]
    async fn a_read_error_while_sending_a_snapshot_is_reported_and_stalls_the_stream() {
        use futures::StreamExt as _;

        let dir = tempfile::TempDir::new().unwrap();
        let path = dir.path().join("snapshot-00000000000000000009.bin");
        std::fs::write(&path, [0u8; 32]).unwrap();
        let write_only = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let body = SnapshotBody::in_file(write_only, path.clone(), 0, 32);
        let (chunks, mut failed) = snapshot_chunks(body, vec![1], blank(), 8);
        // Nothing is read before the call takes a chunk: a follower that
        // cannot be reached costs no read of the body (the leader retries).
        assert!(matches!(failed.try_recv(), Err(tokio::sync::oneshot::error::TryRecvError::Empty)));
        let mut chunks = Box::pin(chunks);
        let next = tokio::time::timeout(Duration::from_millis(200), chunks.next()).await;
        assert!(next.is_err(), "the stream must stall, not end or yield: {:?}", next.map(|c| c.map(|c| c.data)));
        let e = failed.await.expect("the read error is reported");
        assert!(e.to_string().contains(&path.display().to_string()), "{e}");
    }
}
