//! Batching of the calls in flight on one connection (the `Batch` RPC).
//!
//! Every node's connection has a [`Batcher`]: a task that sends each call
//! as its own RPC while fewer than `max_in_flight` RPCs are outstanding on
//! the connection, and once that many are, gathers the calls that arrive
//! meanwhile and sends them as one Batch request (at most `max_items`) as
//! soon as an RPC returns. So an idle or lightly used client sends exactly
//! what it sent before batching existed and waits for nothing, and a busy
//! one sends fewer, larger requests: the server's per-request cost (HTTP/2,
//! gRPC framing, and for renewals the quorum round, which a batch's
//! renewals share) is paid once per batch.
//!
//! Only Acquire without a wait, Renew and Release are batched; the routing
//! above (leader discovery, resends, NOT_LEADER hints) is the same for a
//! batched call as for one sent alone, item by item. A server that predates
//! Batch answers UNIMPLEMENTED: the batch's calls are then sent one by one,
//! and that node is asked with a batch again only after
//! [`RETRY_BATCH_AFTER`] (it may have been upgraded since).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencer_proto::v1::lock_client::LockClient;
use fencer_proto::v1::{
    AcquireRequest, AcquireResponse, BatchItem, BatchRequest, ReleaseRequest, ReleaseResponse, RenewRequest,
    RenewResponse, batch_item, batch_result,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tonic::{Code, Status};

use crate::client::Conn;
use crate::clock::Instant;

/// How long after an UNIMPLEMENTED answer a node is sent calls one by one.
pub(crate) const RETRY_BATCH_AFTER: Duration = Duration::from_secs(60);
/// Calls waiting for a batch on one connection before callers wait to add theirs.
const QUEUE: usize = 4096;
/// Encoded size of one Batch request, at most: well inside the server's
/// request limit (64 KiB, `MAX_REQUEST_BYTES`), which 128 acquires of the
/// longest names and holders would pass.
pub(crate) const MAX_BATCH_BYTES: usize = 48 * 1024;

/// RPCs in flight on one connection before calls are gathered into a Batch
/// request, unless [`crate::Client::with_batching`] says otherwise.
pub const DEFAULT_BATCHING: usize = 2;

/// How a client batches (see [`crate::Client::with_batching`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Batching {
    /// RPCs outstanding on one connection before calls are gathered; 0: never batch.
    pub(crate) max_in_flight: usize,
    /// Calls in one Batch request, at most (the server takes 256).
    pub(crate) max_items: usize,
}

impl Default for Batching {
    fn default() -> Self {
        Self { max_in_flight: DEFAULT_BATCHING, max_items: 128 }
    }
}

/// A call that can go in a batch.
pub(crate) enum Call {
    Acquire(AcquireRequest),
    Renew(RenewRequest),
    Release(ReleaseRequest),
}

/// Its answer.
pub(crate) enum Answer {
    Acquire(AcquireResponse),
    Renew(RenewResponse),
    Release(ReleaseResponse),
}

/// A server that answered a call with another kind of response.
fn mismatched(call: &str) -> Status {
    Status::internal(format!("the server answered a {call} with the response of another call"))
}

impl Answer {
    pub(crate) fn into_acquire(self) -> Result<AcquireResponse, Status> {
        if let Self::Acquire(a) = self { Ok(a) } else { Err(mismatched("acquire")) }
    }

    pub(crate) fn into_renew(self) -> Result<RenewResponse, Status> {
        if let Self::Renew(a) = self { Ok(a) } else { Err(mismatched("renew")) }
    }

    pub(crate) fn into_release(self) -> Result<ReleaseResponse, Status> {
        if let Self::Release(a) = self { Ok(a) } else { Err(mismatched("release")) }
    }
}

impl Call {
    /// Its size in a Batch request: the message and its item's framing.
    fn encoded_len(&self) -> usize {
        use prost::Message as _;
        let body = match self {
            Self::Acquire(r) => r.encoded_len(),
            Self::Renew(r) => r.encoded_len(),
            Self::Release(r) => r.encoded_len(),
        };
        // Two tags and two length prefixes (item, call), at most 3 bytes each.
        body + 8
    }

    /// Whether the call may share a request: an Acquire that waits in the
    /// queue is sent alone (its answer may take minutes).
    pub(crate) fn batchable(&self) -> bool {
        !matches!(self, Self::Acquire(r) if r.wait_timeout_ms > 0)
    }

    /// The call as its own RPC, carrying `request`'s metadata.
    pub(crate) async fn send_alone(self, conn: Conn, attempt: &crate::client::Attempt) -> Result<Answer, Status> {
        let mut lock = LockClient::new(conn);
        match self {
            Self::Acquire(r) => lock.acquire(attempt.request(r)).await.map(|a| Answer::Acquire(a.into_inner())),
            Self::Renew(r) => lock.renew(attempt.request(r)).await.map(|a| Answer::Renew(a.into_inner())),
            Self::Release(r) => lock.release(attempt.request(r)).await.map(|a| Answer::Release(a.into_inner())),
        }
    }
}

struct Pending {
    call: Call,
    reply: oneshot::Sender<Result<Answer, Status>>,
}

/// The batching queue of one connection. Cheap to clone; the task behind it
/// ends when the last clone is dropped.
#[derive(Clone)]
pub(crate) struct Batcher {
    tx: mpsc::Sender<Pending>,
}

impl Batcher {
    /// Starts the batching task of `conn` on the current tokio runtime.
    pub(crate) fn start(conn: Conn, batching: Batching) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(run(conn, rx, batching));
        Self { tx }
    }

    /// Sends `call`, alone or in a batch, and returns its answer.
    pub(crate) async fn call(&self, call: Call) -> Result<Answer, Status> {
        let (reply, answer) = oneshot::channel();
        if self.tx.send(Pending { call, reply }).await.is_err() {
            return Err(Status::unavailable("the client's connection task ended"));
        }
        answer.await.unwrap_or_else(|_| Err(Status::unavailable("the client's connection task dropped the call")))
    }
}

/// Until when a node that answered UNIMPLEMENTED gets calls one by one.
type Unsupported = Arc<Mutex<Option<Instant>>>;

async fn run(conn: Conn, mut rx: mpsc::Receiver<Pending>, batching: Batching) {
    let slots = Arc::new(Semaphore::new(batching.max_in_flight.max(1)));
    let unsupported: Unsupported = Arc::default();
    // A call that did not fit in the last batch goes first in the next.
    let mut carried: Option<Pending> = None;
    loop {
        // A free slot first: while every slot is taken, calls pile up in
        // the queue and leave together when one frees.
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let first = match carried.take() {
            Some(p) => p,
            None => match rx.recv().await {
                Some(p) => p,
                None => return,
            },
        };
        let mut bytes = first.call.encoded_len();
        let mut calls = vec![first];
        while calls.len() < batching.max_items {
            let Ok(p) = rx.try_recv() else { break };
            let len = p.call.encoded_len();
            if bytes + len > MAX_BATCH_BYTES {
                carried = Some(p);
                break;
            }
            bytes += len;
            calls.push(p);
        }
        // Calls whose caller gave up (its timeout) are not sent at all.
        calls.retain(|p| !p.reply.is_closed());
        if calls.is_empty() {
            continue;
        }
        tokio::spawn(send(conn.clone(), calls, slot, unsupported.clone()));
    }
}

/// Sends `calls` (one RPC, or one Batch), holding `slot` until answered.
async fn send(conn: Conn, calls: Vec<Pending>, slot: OwnedSemaphorePermit, unsupported: Unsupported) {
    let _slot = slot;
    if calls.len() == 1 || refuses_batches(&unsupported) {
        return send_alone(&conn, calls).await;
    }
    let items: Vec<BatchItem> = calls.iter().map(|p| BatchItem { call: Some(p.call.to_item()) }).collect();
    let count = items.len();
    match LockClient::new(conn.clone()).batch(BatchRequest { items }).await {
        Ok(response) => {
            let results = response.into_inner().results;
            if results.len() != count {
                let status =
                    Status::internal(format!("the server answered {} results to {count} calls", results.len()));
                return fail_all(calls, &status);
            }
            for (p, r) in calls.into_iter().zip(results) {
                let _ = p.reply.send(answer_of(r.result));
            }
        }
        Err(status) if status.code() == Code::Unimplemented => {
            tracing::debug!("the node has no Batch call: sending calls one by one");
            *unsupported.lock().unwrap_or_else(|p| p.into_inner()) = Some(crate::clock::now() + RETRY_BATCH_AFTER);
            send_alone(&conn, calls).await;
        }
        // The request or its answer was lost: every call's outcome is
        // unknown, as for a call sent alone.
        Err(status) => fail_all(calls, &status),
    }
}

/// Whether `unsupported` says to send calls one by one for now.
fn refuses_batches(unsupported: &Unsupported) -> bool {
    let mut until = unsupported.lock().unwrap_or_else(|p| p.into_inner());
    match *until {
        Some(t) if crate::clock::now() < t => true,
        Some(_) => {
            *until = None;
            false
        }
        None => false,
    }
}

fn fail_all(calls: Vec<Pending>, status: &Status) {
    for p in calls {
        let _ = p.reply.send(Err(status.clone()));
    }
}

/// Each call as its own RPC, concurrently.
async fn send_alone(conn: &Conn, calls: Vec<Pending>) {
    let plain = crate::client::Attempt::new(&[]);
    let sends = calls.into_iter().map(|p| {
        let (conn, plain) = (conn.clone(), &plain);
        async move {
            let answer = p.call.send_alone(conn, plain).await;
            let _ = p.reply.send(answer);
        }
    });
    futures::future::join_all(sends).await;
}

impl Call {
    fn to_item(&self) -> batch_item::Call {
        match self {
            Self::Acquire(r) => batch_item::Call::Acquire(r.clone()),
            Self::Renew(r) => batch_item::Call::Renew(r.clone()),
            Self::Release(r) => batch_item::Call::Release(r.clone()),
        }
    }
}

/// One item's answer as the status or response a call sent alone gets.
fn answer_of(result: Option<batch_result::Result>) -> Result<Answer, Status> {
    match result {
        Some(batch_result::Result::Acquire(a)) => Ok(Answer::Acquire(a)),
        Some(batch_result::Result::Renew(a)) => Ok(Answer::Renew(a)),
        Some(batch_result::Result::Release(a)) => Ok(Answer::Release(a)),
        Some(batch_result::Result::Error(e)) => Err(Status::from(&e)),
        None => Err(Status::internal("the server answered a batch item with nothing")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_item_error_decodes_as_the_status_of_a_call_sent_alone() {
        let alone = <Status as tonic_types::StatusExt>::with_error_details(
            Code::Unavailable,
            "not the leader",
            tonic_types::ErrorDetails::with_error_info(
                "NOT_LEADER",
                fencer_proto::ERROR_DOMAIN,
                std::collections::HashMap::from([("leader_addr".to_string(), "127.0.0.1:7421".to_string())]),
            ),
        );
        let item = fencer_proto::v1::BatchError::from(&alone);
        let Err(decoded) = answer_of(Some(batch_result::Result::Error(item))) else { panic!("an error") };
        let (a, b) = (crate::ClientError::from_status(&alone), crate::ClientError::from_status(&decoded));
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
        assert!(matches!(b, crate::ClientError::Unavailable { reason: Some(crate::Reason::NotLeader), .. }), "{b:?}");
    }

    #[test]
    fn the_size_counted_for_a_call_covers_its_share_of_the_batch_request() {
        use prost::Message as _;
        let long = |n: usize| "x".repeat(n);
        let calls = [
            Call::Acquire(AcquireRequest {
                resource: long(256),
                request_id: long(128),
                ttl_ms: Some(u64::MAX),
                wait_timeout_ms: 0,
                holder: long(256),
            }),
            Call::Renew(RenewRequest { resource: long(256), lease_id: long(32) }),
            Call::Release(ReleaseRequest { resource: "r".into(), lease_id: long(32) }),
        ];
        let counted: usize = calls.iter().map(Call::encoded_len).sum();
        let items = calls.iter().map(|c| BatchItem { call: Some(c.to_item()) }).collect();
        assert!(BatchRequest { items }.encoded_len() <= counted);
        // The bound matters: the largest acquires would not fit 128 to a request.
        assert!(128 * calls[0].encoded_len() > MAX_BATCH_BYTES && MAX_BATCH_BYTES < 64 * 1024);
    }

    #[test]
    fn an_empty_item_answer_is_an_internal_error_not_a_success() {
        assert!(matches!(answer_of(None), Err(s) if s.code() == Code::Internal));
    }
}
