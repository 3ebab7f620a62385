//! The lost-answer layer between a client and one coordinator: a gRPC
//! server on loopback that implements `fencer.v1.Lock` by forwarding every
//! call to the real node, and on demand loses answers (after the node
//! answered: the write committed, the client never hears), cuts calls or
//! delays them. It records every call it saw (method, request id, arrival
//! time) and every answer it threw away.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencer_proto::v1::lock_client::LockClient;
use fencer_proto::v1::lock_server::{Lock, LockServer};
use fencer_proto::v1::{
    AcquireRequest, AcquireResponse, BatchRequest, BatchResponse, GetLockRequest, GetLockResponse, ListLocksRequest,
    ListLocksResponse, ReleaseRequest, ReleaseResponse, RenewRequest, RenewResponse,
};
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// One call that reached the fault layer.
#[derive(Debug, Clone)]
pub struct Seen {
    /// `acquire`, `renew`, `release`, or `batch` (refused: UNIMPLEMENTED).
    pub method: &'static str,
    /// The resource it named.
    pub resource: String,
    /// Acquire: its request id.
    pub request_id: String,
    /// Acquire: its wait.
    pub wait_ms: u64,
    /// When it arrived.
    pub at: Instant,
}

/// How an answer is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loss {
    /// The client gets UNAVAILABLE without details, as for a broken connection.
    Transport,
    /// The client gets UNAVAILABLE + OUTCOME_UNKNOWN, as from a server whose
    /// write did not confirm in time.
    OutcomeUnknown,
}

/// What to do to the next calls.
#[derive(Debug, Default)]
pub struct Faults {
    /// Forward the next this many Acquire calls, wait for the real answer,
    /// record it in `dropped`, and answer the client with `loss`.
    pub drop_acquire_answers: usize,
    /// How those answers are lost (`None`: they are not).
    pub loss: Option<Loss>,
    /// Answers thrown away.
    pub dropped: Vec<Result<AcquireResponse, Status>>,
    /// Cut the next this many Acquire calls after this long: the client gets
    /// UNAVAILABLE; the forwarded call goes on upstream (`cancel_upstream`:
    /// it is dropped too, as when the server sees the connection close).
    pub cut_acquires: usize,
    /// How long after arrival a cut call is cut.
    pub cut_after: Duration,
    /// Whether a cut call is also dropped upstream.
    pub cancel_upstream: bool,
    /// Hold every Renew and Acquire answer this long before passing it on.
    pub delay_answers: Duration,
}

#[derive(Clone)]
struct Shared {
    upstream: LockClient<Channel>,
    seen: Arc<Mutex<Vec<Seen>>>,
    faults: Arc<Mutex<Faults>>,
}

/// The running fault layer; stops when dropped.
pub struct FaultProxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    faults: Arc<Mutex<Faults>>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl FaultProxy {
    /// Forwards to the node at `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let channel = Channel::from_shared(format!("http://{upstream}")).unwrap().connect_lazy();
        let shared =
            Shared { upstream: LockClient::new(channel), seen: Default::default(), faults: Default::default() };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (seen, faults) = (shared.seen.clone(), shared.faults.clone());
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(LockServer::new(shared))
                .serve_with_incoming_shutdown(tokio_stream::wrappers::TcpListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await
                .expect("the fault layer serves until it is dropped");
        });
        Self { addr, seen, faults, _stop: stop }
    }

    /// A client that talks to the node only through this layer.
    pub fn client(&self) -> fencer_client::Client {
        fencer_client::Client::new([self.addr.to_string()]).unwrap()
    }

    /// The faults to apply, to change them.
    pub fn faults(&self) -> std::sync::MutexGuard<'_, Faults> {
        self.faults.lock().unwrap()
    }

    /// The calls of `method` on `resource`, in arrival order.
    pub fn seen(&self, method: &str, resource: &str) -> Vec<Seen> {
        self.seen.lock().unwrap().iter().filter(|s| s.method == method && s.resource == resource).cloned().collect()
    }

    /// Every call seen, in arrival order.
    pub fn all(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Every Acquire seen, in arrival order.
    pub fn acquires(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().iter().filter(|s| s.method == "acquire").cloned().collect()
    }
}

fn lost(loss: Loss) -> Status {
    match loss {
        Loss::Transport => Status::unavailable("fault layer: connection lost before the answer"),
        Loss::OutcomeUnknown => Status::with_error_details(
            tonic::Code::Unavailable,
            "fault layer: outcome unknown",
            ErrorDetails::with_error_info(
                "OUTCOME_UNKNOWN",
                fencer_proto::ERROR_DOMAIN,
                std::collections::HashMap::new(),
            ),
        ),
    }
}

impl Shared {
    fn record(&self, method: &'static str, resource: &str, request_id: &str, wait_ms: u64) {
        let seen =
            Seen { method, resource: resource.into(), request_id: request_id.into(), wait_ms, at: Instant::now() };
        self.seen.lock().unwrap().push(seen);
    }

    fn delay(&self) -> Duration {
        self.faults.lock().unwrap().delay_answers
    }
}

#[tonic::async_trait]
impl Lock for Shared {
    async fn acquire(&self, request: Request<AcquireRequest>) -> Result<Response<AcquireResponse>, Status> {
        let req = request.into_inner();
        self.record("acquire", &req.resource, &req.request_id, req.wait_timeout_ms);
        let (drop_answer, cut) = {
            let mut f = self.faults.lock().unwrap();
            let drop_answer = if f.drop_acquire_answers > 0 {
                f.drop_acquire_answers -= 1;
                f.loss
            } else {
                None
            };
            let cut = if f.cut_acquires > 0 {
                f.cut_acquires -= 1;
                Some((f.cut_after, f.cancel_upstream))
            } else {
                None
            };
            (drop_answer, cut)
        };
        let mut upstream = self.upstream.clone();
        let call = tokio::spawn(async move { upstream.acquire(req).await.map(Response::into_inner) });
        if let Some((after, cancel_upstream)) = cut {
            tokio::time::sleep(after).await;
            if cancel_upstream {
                call.abort();
                // Let the server see the reset before the client hears of it.
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            // Otherwise the forwarded call goes on, its answer unread.
            return Err(lost(Loss::Transport));
        }
        let answer = call.await.map_err(|e| Status::internal(e.to_string()))?;
        tokio::time::sleep(self.delay()).await;
        if let Some(loss) = drop_answer {
            self.faults.lock().unwrap().dropped.push(answer);
            return Err(lost(loss));
        }
        answer.map(Response::new)
    }

    async fn renew(&self, request: Request<RenewRequest>) -> Result<Response<RenewResponse>, Status> {
        let req = request.into_inner();
        self.record("renew", &req.resource, "", 0);
        let answer = self.upstream.clone().renew(req).await;
        tokio::time::sleep(self.delay()).await;
        answer
    }

    async fn release(&self, request: Request<ReleaseRequest>) -> Result<Response<ReleaseResponse>, Status> {
        let req = request.into_inner();
        self.record("release", &req.resource, "", 0);
        self.upstream.clone().release(req).await
    }

    /// The fault layer sees calls one by one: it answers a Batch as a server
    /// that predates Batch does, and the client falls back to single calls
    /// (which is what the client's fallback test checks).
    async fn batch(&self, _request: Request<BatchRequest>) -> Result<Response<BatchResponse>, Status> {
        self.record("batch", "", "", 0);
        Err(Status::unimplemented("fault layer: no Batch call"))
    }

    async fn get_lock(&self, request: Request<GetLockRequest>) -> Result<Response<GetLockResponse>, Status> {
        self.upstream.clone().get_lock(request.into_inner()).await
    }

    async fn list_locks(&self, request: Request<ListLocksRequest>) -> Result<Response<ListLocksResponse>, Status> {
        self.upstream.clone().list_locks(request.into_inner()).await
    }
}
