//! A lease the server ended behind the client's back is Lost, and the
//! stamping layer then refuses to send (DESIGN §5, the zombie writer):
//!
//! - t43: the client process is paused (its whole runtime blocked, as by
//!   SIGSTOP or a long GC pause) past its ttl; the server expires the lease
//!   and grants the lock to someone else. The first write attempted after
//!   the pause — before the renewal task has run — is refused, and the lease
//!   reports Lost.
//! - t44: the server ends the lease (force-release) while the client runs
//!   normally: the next renewal is refused and the lease is Lost at once,
//!   well before its local deadline.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencer_client::{Client, LeaseState, LostReason, StampedError};
use fencer_testkit::node;
use http::{HeaderMap, Request};
use tower::{Layer, Service, ServiceExt};

const TTL: Duration = Duration::from_millis(800);

type Seen = Arc<Mutex<Vec<HeaderMap>>>;

/// Stands for the protected system: records the headers of what reaches it.
fn upstream(seen: Seen) -> impl Service<Request<()>, Response = (), Error = Infallible> + Clone {
    tower::service_fn(move |req: Request<()>| {
        let seen = seen.clone();
        async move {
            seen.lock().unwrap().push(req.headers().clone());
            Ok::<_, Infallible>(())
        }
    })
}

#[test]
fn t43_paused_past_its_ttl_the_client_is_lost_and_the_layer_refuses_to_send() {
    let dir = tempfile::tempdir().unwrap();
    let server_rt = tokio::runtime::Runtime::new().unwrap();
    let node = server_rt.block_on(node::start(dir.path()));
    let addr = node.local_addr().to_string();
    let (paused_tx, paused_rx) = std::sync::mpsc::channel::<u64>();
    let seen = Seen::default();

    // The client lives on a current-thread runtime of its own thread, so
    // blocking that thread freezes everything it does, renewal included.
    let client_seen = seen.clone();
    let client_addr = addr.clone();
    let client = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let client = Client::new([client_addr]).unwrap();
            let lease = client.acquire("t43/zombie").ttl(TTL).await.unwrap();
            let mut svc = lease.stamp_layer().layer(upstream(client_seen.clone()));
            svc.ready().await.unwrap().call(Request::new(())).await.unwrap();
            paused_tx.send(lease.token().get()).unwrap();

            std::thread::sleep(TTL * 3); // the pause

            // Resumed: the first thing is a write, before any task could run.
            let refused = svc.ready().await.unwrap().call(Request::new(())).await;
            let reason = tokio::time::timeout(Duration::from_secs(5), lease.lost()).await.expect("lost() resolves");
            (refused, reason, lease.check())
        })
    });

    let a_token = paused_rx.recv_timeout(Duration::from_secs(20)).expect("the client got the lock");
    // While A is frozen the server expires its lease and B gets the lock.
    let b = server_rt.block_on(async {
        let other = node::client(&node);
        other.acquire("t43/zombie").ttl(Duration::from_secs(5)).wait(Duration::from_secs(10)).await
    });
    let b = b.expect("B acquires once A's lease expired on the server");
    assert!(b.token().get() > a_token);

    let (refused, reason, state) = client.join().unwrap();
    assert!(
        matches!(refused, Err(StampedError::NotHeld(LeaseState::Lost(LostReason::DeadlinePassed)))),
        "the zombie's write is refused because its lease is lost: {refused:?}"
    );
    assert_eq!(reason, LostReason::DeadlinePassed);
    assert!(state.is_lost());
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1, "only the write made before the pause reached the upstream");
    assert_eq!(seen[0]["fencing-token"], a_token.to_string().as_str());
    drop(b);
    server_rt.block_on(node.shutdown());
}

#[tokio::test]
async fn t44_a_lease_ended_by_the_server_is_lost_at_the_next_renewal() {
    let ttl = Duration::from_secs(3);
    let dir = tempfile::tempdir().unwrap();
    let node = node::start(dir.path()).await;
    let client = node::client(&node);
    let lease = client.acquire("t44/ended").ttl(ttl).await.unwrap();
    let seen = Seen::default();
    let mut svc = lease.stamp_layer().layer(upstream(seen.clone()));
    svc.ready().await.unwrap().call(Request::new(())).await.unwrap();

    client.force_release("t44/ended", "t44", "test: end the lease behind the client's back").await.unwrap();
    let deadline = lease.deadline();
    let reason = tokio::time::timeout_at(deadline, lease.lost())
        .await
        .expect("lost at the next renewal, before the local deadline");
    assert_eq!(reason, LostReason::LeaseExpired);
    assert_eq!(lease.check(), LeaseState::Lost(LostReason::LeaseExpired));
    let refused = svc.ready().await.unwrap().call(Request::new(())).await;
    assert!(matches!(refused, Err(StampedError::NotHeld(LeaseState::Lost(_)))), "{refused:?}");
    assert_eq!(seen.lock().unwrap().len(), 1);
    // Releasing a lost lease is harmless and says it was not the holder.
    assert!(!lease.release().await.unwrap().was_holder);
    node.shutdown().await;
}
