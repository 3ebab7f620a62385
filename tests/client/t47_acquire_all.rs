//! `acquire_all` (DESIGN §5): sorted order, one total timeout, and the locks
//! taken so far released (in reverse order) when the rest cannot be had in
//! time. Not atomic: the test also shows the partial state is visible.

use std::time::Duration;

use fencer_client::{AcquireAllError, AcquireError, Reason};
use fencer_testkit::fault::FaultProxy;
use fencer_testkit::node;
use tokio::time::Instant;

#[tokio::test]
async fn t47_acquire_all_releases_what_it_took_when_it_cannot_get_everything_in_time() {
    let ttl = Duration::from_secs(10);
    let dir = tempfile::tempdir().unwrap();
    let node = node::start(dir.path()).await;
    let proxy = FaultProxy::start(node.local_addr()).await;
    let direct = node::client(&node);
    let client = proxy.client();

    // Someone else holds the middle one for longer than the total timeout.
    let b = direct.acquire("t47/b").ttl(ttl).await.unwrap();
    let started = Instant::now();
    let err = client
        .acquire_all(["t47/c", "t47/a", "t47/b", "t47/a"], Duration::from_millis(1500))
        .ttl(ttl)
        .await
        .unwrap_err();
    let took = started.elapsed();
    match &err {
        AcquireAllError::Acquire { resource, source: AcquireError::NotAcquired(e) } => {
            assert_eq!(resource, "t47/b");
            assert_eq!(e.reason(), Some(&Reason::WaitTimeout));
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(took >= Duration::from_millis(1400), "waited for b within the total timeout: {took:?}");
    assert!(took < Duration::from_secs(6), "and not much longer: {took:?}");
    // Sorted order, duplicates removed; c was never tried.
    let order: Vec<String> = proxy.acquires().iter().map(|s| s.resource.clone()).collect();
    assert_eq!(order.first().map(String::as_str), Some("t47/a"));
    assert!(order.iter().skip(1).all(|r| r == "t47/b"), "{order:?}");
    // a was taken and given back; b is still the other holder's.
    assert_eq!(proxy.seen("release", "t47/a").len(), 1);
    assert!(!direct.get("t47/a").await.unwrap().held, "a released after the failure");
    assert!(!direct.get("t47/c").await.unwrap().held);
    let view = direct.get("t47/b").await.unwrap();
    assert_eq!((view.held, view.fencing_token, view.waiters), (true, b.token().get(), 0));

    // Once b is free they can all be had, in sorted order, and given back.
    b.release().await.unwrap();
    let set = client.acquire_all(["t47/c", "t47/b", "t47/a"], Duration::from_secs(5)).ttl(ttl).await.unwrap();
    let names: Vec<&str> = set.leases().iter().map(|l| l.resource()).collect();
    assert_eq!(names, ["t47/a", "t47/b", "t47/c"]);
    assert!(set.is_held());
    let tokens: Vec<u64> = set.leases().iter().map(|l| l.token().get()).collect();
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "taken one after the other: {tokens:?}");
    set.release().await.unwrap();
    for r in ["t47/a", "t47/b", "t47/c"] {
        assert!(!direct.get(r).await.unwrap().held, "{r} released");
    }
    let releases: Vec<String> =
        proxy.all().iter().filter(|s| s.method == "release").map(|s| s.resource.clone()).collect();
    assert_eq!(releases[releases.len() - 3..], ["t47/c", "t47/b", "t47/a"], "reverse order");
    node.shutdown().await;
}
