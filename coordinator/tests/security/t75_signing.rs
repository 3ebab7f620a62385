//! Signed fencing tokens issued by the coordinator (DESIGN P7): every node
//! registers its own signing key through the log, a leader signs each grant
//! with a registered key of its own, and the key set exported from the
//! registry verifies every token — also the tokens of a new leader after a
//! failover, and also retried grants. Rotation and retirement through the
//! admin API.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fencer_coordinator::{SigningKeyView, key_set};
use fencer_proto::v1::{
    AcquireRequest, AcquireResponse, ListSigningKeysRequest, RetireSigningKeyRequest, RotateSigningKeyRequest,
};
use fencer_testkit::cluster::Cluster;
use fencer_testkit::eventually;
use fencer_testkit::grpc::reason;
use fencer_token::{KeyRing, KeySet, PresentedToken, SignedToken, VerifyError};

const TIMEOUT: Duration = Duration::from_secs(10);

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

fn views(r: &fencer_proto::v1::ListSigningKeysResponse) -> Vec<SigningKeyView> {
    r.keys.iter().map(SigningKeyView::from).collect()
}

/// The key set as `fencer keys export` writes it, asked of node `n`.
async fn export(c: &Cluster, n: u64) -> (KeySet, Vec<SigningKeyView>) {
    let list = c.admin(n).list_signing_keys(ListSigningKeysRequest {}).await.unwrap().into_inner();
    let views = views(&list);
    let set = key_set(&views).unwrap();
    // Exactly the file format proxies load.
    (KeySet::from_json(set.to_json().as_bytes()).unwrap(), views)
}

fn signed(g: &AcquireResponse) -> SignedToken {
    match PresentedToken::parse(g.signed_token.as_bytes()) {
        Ok(PresentedToken::Signed(t)) => t,
        other => panic!("the grant carries no signed token: {:?} ({other:?})", g.signed_token),
    }
}

async fn acquire(c: &Cluster, n: u64, resource: &str, request_id: &str) -> AcquireResponse {
    let req = AcquireRequest {
        resource: resource.into(),
        request_id: request_id.into(),
        ttl_ms: Some(5_000),
        wait_timeout_ms: 0,
        holder: "t70".into(),
    };
    c.client(n).acquire(req).await.unwrap().into_inner()
}

/// A grant's signed token says what was granted, verifies with the exported
/// key set only for its own resource, and a retry of the same request id
/// gets a token for the same grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t75_grants_carry_a_token_signed_with_a_registered_key() {
    let c = Cluster::start(1).await;
    let g = acquire(&c, 1, "db/x", "t70-request-1").await;
    let token = signed(&g);
    let claims = token.unverified_claims();
    assert_eq!((claims.resource(), claims.token()), ("db/x", g.fencing_token));
    assert_eq!(claims.lease_id_hex(), g.lease_id);
    assert!(claims.key_id().as_str().starts_with("n1-"), "{}", claims.key_id());

    let (set, views) = export(&c, 1).await;
    assert_eq!(views.len(), 1);
    assert!(views[0].current && views[0].node_id == 1);
    let ring = KeyRing::new(&set).unwrap();
    assert_eq!(ring.verify(&token, "db/x", now_ms()).unwrap().token(), g.fencing_token);
    assert!(matches!(ring.verify(&token, "db/y", now_ms()), Err(VerifyError::WrongResource { .. })));

    let retry = acquire(&c, 1, "db/x", "t70-request-1").await;
    assert_eq!((retry.lease_id.as_str(), retry.fencing_token), (g.lease_id.as_str(), g.fencing_token));
    assert_eq!(ring.verify(&signed(&retry), "db/x", now_ms()).unwrap().token(), g.fencing_token);
    c.shutdown().await;
}

/// Every member registers its key before it leads: after the leader is
/// killed, the new leader's tokens verify with the key set exported before
/// the failover, and so does its answer to a retry of an old request id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t76_tokens_of_a_new_leader_after_failover_verify_with_the_keys_exported_before() {
    let c = Cluster::start(3).await;
    let old = c.leader(TIMEOUT).await;
    let (set, _) = eventually("every member registered its key", TIMEOUT, || async {
        let (set, views) = export(&c, old).await;
        let nodes: std::collections::BTreeSet<u64> = views.iter().map(|v| v.node_id).collect();
        (nodes.len() == 3).then_some((set, views))
    })
    .await;
    let ring = KeyRing::new(&set).unwrap();
    let before = acquire(&c, old, "db/a", "t71-request-1").await;
    assert_eq!(signed(&before).unverified_claims().key_id().as_str().split('-').next(), Some(&*format!("n{old}")));
    ring.verify(&signed(&before), "db/a", now_ms()).unwrap();

    c.crash(old).await;
    let survivors: Vec<u64> = c.running();
    let new = c.leader_among(&survivors, TIMEOUT).await;
    let after = eventually("the new leader grants", TIMEOUT, || async {
        let req = AcquireRequest {
            resource: "db/b".into(),
            request_id: "t71-request-2".into(),
            ttl_ms: Some(5_000),
            wait_timeout_ms: 0,
            holder: "t71".into(),
        };
        c.client(new).acquire(req).await.ok().map(|r| r.into_inner())
    })
    .await;
    let token = signed(&after);
    assert!(token.unverified_claims().key_id().as_str().starts_with(&format!("n{new}-")));
    assert!(after.fencing_token > before.fencing_token);
    assert_eq!(ring.verify(&token, "db/b", now_ms()).unwrap().token(), after.fencing_token);
    // The old grant, asked again of the new leader: signed anew, still genuine.
    let retried = acquire(&c, new, "db/a", "t71-request-1").await;
    assert_eq!(retried.fencing_token, before.fencing_token);
    assert_eq!(ring.verify(&signed(&retried), "db/a", now_ms()).unwrap().token(), before.fencing_token);

    // A follower rotates its own key: made there, registered through the leader.
    let follower = survivors.into_iter().find(|n| *n != new).unwrap();
    let req = RotateSigningKeyRequest { node_id: follower, activate_in_ms: 0 };
    let key = c.admin(follower).rotate_signing_key(req).await.unwrap().into_inner().key.unwrap();
    assert_eq!(key.node_id, follower);
    assert!(key.current, "{key:?}");
    let (_, views) = export(&c, new).await;
    assert!(views.iter().any(|v| v.kid == key.kid && v.current), "the leader lists it as current: {views:?}");
    c.shutdown().await;
}

/// Rotation makes a new key on the node that keeps it; it signs from its
/// not_before on. Retiring the old key makes its tokens expire at the
/// proxy; retiring a node's last key, an unknown key, or rotating on the
/// wrong node is refused with a clear reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t77_rotation_and_retirement() {
    let c = Cluster::start(1).await;
    let first = acquire(&c, 1, "db/r", "t72-request-1").await;
    let old_kid = signed(&first).unverified_claims().key_id().to_string();

    let last = c
        .admin(1)
        .retire_signing_key(RetireSigningKeyRequest { kid: old_kid.clone(), after_ms: 0, force: false })
        .await
        .unwrap_err();
    assert_eq!(reason(&last), "SIGNING_KEY_REFUSED", "{last:?}");
    assert!(last.message().contains("rotate it first"), "{}", last.message());
    let unknown = c
        .admin(1)
        .retire_signing_key(RetireSigningKeyRequest { kid: "nope".into(), after_ms: 0, force: false })
        .await
        .unwrap_err();
    assert_eq!((unknown.code(), reason(&unknown).as_str()), (tonic::Code::NotFound, "UNKNOWN_SIGNING_KEY"));
    let wrong =
        c.admin(1).rotate_signing_key(RotateSigningKeyRequest { node_id: 2, activate_in_ms: 0 }).await.unwrap_err();
    assert_eq!(wrong.code(), tonic::Code::FailedPrecondition, "{wrong:?}");

    // A key activated in the future is registered at once but not used yet.
    let later = c
        .admin(1)
        .rotate_signing_key(RotateSigningKeyRequest { node_id: 1, activate_in_ms: 3_600_000 })
        .await
        .unwrap()
        .into_inner()
        .key
        .unwrap();
    assert!(!later.current && later.not_before_unix_ms > now_ms());
    let still_old = acquire(&c, 1, "db/r2", "t72-request-2").await;
    assert_eq!(signed(&still_old).unverified_claims().key_id().as_str(), old_kid);

    let new = c
        .admin(1)
        .rotate_signing_key(RotateSigningKeyRequest { node_id: 0, activate_in_ms: 0 })
        .await
        .unwrap()
        .into_inner()
        .key
        .unwrap();
    assert!(new.current, "{new:?}");
    let second = acquire(&c, 1, "db/r3", "t72-request-3").await;
    assert_eq!(signed(&second).unverified_claims().key_id().as_str(), new.kid);

    let retired = c
        .admin(1)
        .retire_signing_key(RetireSigningKeyRequest { kid: old_kid.clone(), after_ms: 0, force: false })
        .await
        .unwrap()
        .into_inner()
        .key
        .unwrap();
    assert!(retired.not_after_unix_ms > 0 && retired.not_after_unix_ms <= now_ms());
    let (set, views) = export(&c, 1).await;
    assert_eq!(views.len(), 3, "every key stays in the set, retired or not yet valid");
    let ring = KeyRing::new(&set).unwrap().with_clock_skew(Duration::ZERO);
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert!(matches!(ring.verify(&signed(&first), "db/r", now_ms()), Err(VerifyError::ExpiredKey { .. })));
    ring.verify(&signed(&second), "db/r3", now_ms()).unwrap();
    // The registry and its audit agree on every node, across a restart.
    c.crash(1).await;
    c.restart(1).await;
    c.settled(TIMEOUT).await;
    let (again, _) = export(&c, 1).await;
    assert_eq!(again, set);
    c.shutdown().await;
}
