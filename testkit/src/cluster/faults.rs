//! The fault layers of the in-process harness.
//!
//! - [`NetFaults`]: the raft network between nodes (the coordinator's
//!   [`Faults`] hook). Rules name a direction `from → to`; a request and the
//!   reply that travels back are judged separately, so one-way loss drops a
//!   request going one way and the reply coming back the same way.
//! - [`ClientFaults`] + [`FaultyChannel`]: the client's gRPC channel to one
//!   node. It can lose the next response *after* the node answered — the
//!   write committed, the client never hears (I7's retry case).

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use fencer_coordinator::{FaultAction, Faults, NodeId};
use tonic::transport::Channel;

/// Faults of the raft network.
#[derive(Default)]
pub struct NetFaults {
    inner: Mutex<NetRules>,
}

#[derive(Default)]
struct NetRules {
    isolated: BTreeSet<NodeId>,
    /// Directions `(from, to)` on which every message is lost.
    dropped: BTreeSet<(NodeId, NodeId)>,
    /// Directions on which every message is late.
    delayed: BTreeMap<(NodeId, NodeId), Duration>,
    /// Directions on which appends carrying entries are lost (heartbeats pass).
    held: BTreeSet<(NodeId, NodeId)>,
    /// Directions on which every snapshot is cut in the middle.
    cut_snapshots: BTreeSet<(NodeId, NodeId)>,
}

impl NetFaults {
    fn rules(&self) -> std::sync::MutexGuard<'_, NetRules> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a message travelling `from → to` is lost or late.
    fn judge(&self, from: NodeId, to: NodeId) -> FaultAction {
        let r = self.rules();
        if r.isolated.contains(&from) || r.isolated.contains(&to) || r.dropped.contains(&(from, to)) {
            return FaultAction::Drop;
        }
        match r.delayed.get(&(from, to)) {
            Some(d) => FaultAction::Delay(*d),
            None => FaultAction::Pass,
        }
    }

    /// Every message to or from `n` is lost.
    pub fn isolate(&self, n: NodeId) {
        self.rules().isolated.insert(n);
    }

    /// Messages from `from` to `to` are lost.
    pub fn drop_one_way(&self, from: NodeId, to: NodeId) {
        self.rules().dropped.insert((from, to));
    }

    /// Messages from `from` to `to` arrive `d` late.
    pub fn delay(&self, from: NodeId, to: NodeId, d: Duration) {
        self.rules().delayed.insert((from, to), d);
    }

    /// Appends from `from` to `to` that carry entries are lost; heartbeats
    /// (and their replies) pass, so `from` stays acknowledged as leader
    /// while nothing it appends commits.
    pub fn hold_entries(&self, from: NodeId, to: NodeId) {
        self.rules().held.insert((from, to));
    }

    /// Every snapshot `from` sends `to` is cut in the middle (see
    /// [`Faults::cut_snapshot`]) until [`heal`](Self::heal).
    pub fn cut_snapshots(&self, from: NodeId, to: NodeId) {
        self.rules().cut_snapshots.insert((from, to));
    }

    /// Every rule removed.
    pub fn heal(&self) {
        *self.rules() = NetRules::default();
    }
}

impl Faults for NetFaults {
    fn request(&self, from: NodeId, to: NodeId) -> FaultAction {
        self.judge(from, to)
    }

    /// The reply to `from`'s request travels `to → from`.
    fn reply(&self, from: NodeId, to: NodeId) -> FaultAction {
        self.judge(to, from)
    }

    fn entries(&self, from: NodeId, to: NodeId) -> FaultAction {
        if self.rules().held.contains(&(from, to)) { FaultAction::Drop } else { FaultAction::Pass }
    }

    fn cut_snapshot(&self, from: NodeId, to: NodeId) -> bool {
        self.rules().cut_snapshots.contains(&(from, to))
    }
}

/// Faults of the client channels.
#[derive(Default)]
pub struct ClientFaults {
    /// Nodes whose next response is lost after the node answered.
    lose_next_response: Mutex<BTreeSet<NodeId>>,
}

impl ClientFaults {
    /// The next response of node `n` is lost after the node answered.
    pub fn drop_response_after_commit(&self, n: NodeId) {
        self.lose_next_response.lock().unwrap_or_else(|p| p.into_inner()).insert(n);
    }

    fn take(&self, n: NodeId) -> bool {
        self.lose_next_response.lock().unwrap_or_else(|p| p.into_inner()).remove(&n)
    }

    /// No response is lost.
    pub fn heal(&self) {
        self.lose_next_response.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

/// The error a lost response turns into: the client sees a broken call.
#[derive(Debug)]
pub struct ResponseLost(
    /// The node whose response was lost.
    pub NodeId,
);

impl std::fmt::Display for ResponseLost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the response from node {} was lost (fault injection)", self.0)
    }
}

impl std::error::Error for ResponseLost {}

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Body = tonic::body::Body;

/// A gRPC channel to one node, with [`ClientFaults`] applied.
#[derive(Clone)]
pub struct FaultyChannel {
    /// The node it talks to.
    pub node: NodeId,
    /// The real channel.
    pub inner: Channel,
    /// The faults it applies.
    pub faults: Arc<ClientFaults>,
}

impl tower::Service<http::Request<Body>> for FaultyChannel {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let lose = self.faults.take(self.node);
        let node = self.node;
        let call = self.inner.call(req);
        Box::pin(async move {
            let resp = call.await.map_err(BoxError::from)?;
            if lose {
                // A unary handler has finished (its write committed) before
                // the response head leaves the server; drop it here.
                drop(resp);
                return Err(Box::new(ResponseLost(node)) as BoxError);
            }
            Ok(resp)
        })
    }
}
