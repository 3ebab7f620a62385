//! The audit log (issue 7): exactly one line per change of the lock table,
//! in log order, with the token and log index of the entry that made it —
//! and still exactly one after the state file is lost and every entry is
//! applied again.

use std::path::Path;
use std::time::Duration;

use fencer_coordinator::{AuditOp, AuditOutcome, AuditRecord, STATE_FILE, audit_files, read_audit_file};
use fencer_proto::v1::admin_client::AdminClient;
use fencer_proto::v1::{ForceReleaseRequest, GetLockRequest, ReleaseRequest, RenewRequest};
use fencer_testkit::grpc::reason;
use fencer_testkit::node::{acquire, fast_config, grpc_client as client, start, start_with};

fn lines(dir: &Path) -> Vec<AuditRecord> {
    let mut skipped = 0;
    let mut out = Vec::new();
    for f in audit_files(dir).unwrap() {
        out.extend(read_audit_file(&f, &mut skipped).unwrap());
    }
    assert_eq!(skipped, 0, "every line is a whole record");
    out
}

/// A node on `dir` that writes renewals as log entries (`--renewals-in-log`),
/// so that its audit log records them.
fn logged_renewals(dir: &Path) -> fencer_coordinator::NodeConfig {
    let mut config = fast_config(dir);
    let mut policy = config.policy();
    policy.renewals_in_log = true;
    config.policy = Some(policy);
    config
}

/// Starts a node on a data dir a stopped node just left: its store threads
/// may hold the files for a moment longer.
async fn restart(dir: &Path) -> fencer_coordinator::Node {
    for _ in 0..200 {
        match fencer_coordinator::Node::start(logged_renewals(dir)).await {
            Ok(node) => {
                node.wait_for_leader(Duration::from_secs(10)).await.expect("leader elected");
                for _ in 0..200 {
                    if node.service().status().state == "leader" {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                return node;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    panic!("the node does not restart on {}", dir.display());
}

/// What a line is about, for comparing a whole log at once.
fn shape(r: &AuditRecord) -> (AuditOp, AuditOutcome, Option<&str>) {
    (r.op, r.outcome, r.resource.as_deref())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t63_one_line_per_change_with_its_token_and_index_exactly_once_across_replay() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_with(logged_renewals(dir.path())).await;
    let audit_dir = node.audit_dir().expect("audit is on by default").to_path_buf();
    let mut c = client(&node).await;
    let mut admin = AdminClient::connect(format!("http://{}", node.local_addr())).await.unwrap();

    // 1. A takes the lock; B is refused (no line); C queues.
    let a = acquire(&mut c, "aud/1", "audit-a-0001", 5_000, 0).await.unwrap();
    let refused = acquire(&mut c, "aud/1", "audit-b-0001", 5_000, 0).await.unwrap_err();
    assert_eq!(reason(&refused), "LOCK_HELD");
    let mut cc = client(&node).await;
    let c_wait = tokio::spawn(async move { acquire(&mut cc, "aud/1", "audit-c-0001", 5_000, 10_000).await });
    for _ in 0..250 {
        if c.get_lock(GetLockRequest { resource: "aud/1".into() }).await.unwrap().into_inner().waiters == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // 2. A renews, a stale renew changes nothing, a retried acquire neither.
    c.renew(RenewRequest { resource: "aud/1".into(), lease_id: a.lease_id.clone() }).await.unwrap();
    let stale = "0".repeat(32);
    assert!(c.renew(RenewRequest { resource: "aud/1".into(), lease_id: stale }).await.is_err());
    assert_eq!(acquire(&mut c, "aud/1", "audit-a-0001", 5_000, 0).await.unwrap().fencing_token, a.fencing_token);
    // 3. A releases: C is promoted in the same entry.
    c.release(ReleaseRequest { resource: "aud/1".into(), lease_id: a.lease_id.clone() }).await.unwrap();
    let c_grant = c_wait.await.unwrap().unwrap();
    // 4. An operator frees a held lock and a free one.
    let d = acquire(&mut c, "aud/2", "audit-d-0001", 5_000, 0).await.unwrap();
    let force = |resource: &str| ForceReleaseRequest {
        resource: resource.into(),
        caller: "alice".into(),
        reason: "stuck job, ticket OPS-7".into(),
    };
    let forced = admin.force_release(force("aud/2")).await.unwrap().into_inner();
    let forced_free = admin.force_release(force("aud/3")).await.unwrap().into_inner();
    assert_eq!((forced.released, forced_free.released), (true, false));
    // 5. A lease nobody renews expires.
    let e = acquire(&mut c, "aud/4", "audit-e-0001", 500, 0).await.unwrap();
    for _ in 0..250 {
        if !c.get_lock(GetLockRequest { resource: "aud/4".into() }).await.unwrap().into_inner().held {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // 6. A waiter whose wait runs out is cancelled through the log.
    let f = acquire(&mut c, "aud/5", "audit-f-0001", 5_000, 0).await.unwrap();
    let timed_out = acquire(&mut c, "aud/5", "audit-g-0001", 5_000, 300).await.unwrap_err();
    assert_eq!(reason(&timed_out), "WAIT_TIMEOUT");
    // 7. C releases: nobody waits, no promotion.
    c.release(ReleaseRequest { resource: "aud/1".into(), lease_id: c_grant.lease_id.clone() }).await.unwrap();
    node.shutdown().await;

    let first = lines(&audit_dir);
    use AuditOp::*;
    use AuditOutcome::*;
    assert_eq!(
        first.iter().map(shape).collect::<Vec<_>>(),
        vec![
            (Membership, Changed, None),
            (SigningKeyRegister, Registered, None),
            (Acquire, Granted, Some("aud/1")),
            (Acquire, Queued, Some("aud/1")),
            (Renew, Renewed, Some("aud/1")),
            (Release, Released, Some("aud/1")),
            (Promote, Granted, Some("aud/1")),
            (Acquire, Granted, Some("aud/2")),
            (ForceRelease, Released, Some("aud/2")),
            (ForceRelease, NotHeld, Some("aud/3")),
            (Acquire, Granted, Some("aud/4")),
            (Expire, Expired, Some("aud/4")),
            (Acquire, Granted, Some("aud/5")),
            (Acquire, Queued, Some("aud/5")),
            (CancelWait, Cancelled, Some("aud/5")),
            (Release, Released, Some("aud/1")),
        ],
        "one line per change, in log order; refusals, stale renewals and retries write nothing"
    );
    // Lines are named by (log index, part), strictly increasing.
    assert!(first.windows(2).all(|w| w[0].position() < w[1].position()), "{first:#?}");
    // The node's signing key, registered before the first grant: its id,
    // node and public key, never a secret.
    let key = &first[1];
    assert!(key.key_id.as_deref().is_some_and(|k| k.starts_with("n1-")) && key.key_node == Some(1), "{key:?}");
    assert_eq!(key.public_key.as_ref().map(String::len), Some(43));
    let (grant_a, queued_c, renew_a, release_a, promote_c) = (&first[2], &first[3], &first[4], &first[5], &first[6]);
    // A grant's token is its log index (I2), and the line says both.
    assert_eq!((grant_a.log_index, grant_a.token), (a.fencing_token, Some(a.fencing_token)));
    assert_eq!(grant_a.lease_id.as_deref(), Some(a.lease_id.as_str()));
    assert_eq!(grant_a.request_id.as_deref(), Some("audit-a-0001"));
    assert_eq!(renew_a.token, Some(a.fencing_token));
    // The queued line names the lease the waiter got when promoted.
    assert_eq!(queued_c.lease_id.as_deref(), Some(c_grant.lease_id.as_str()));
    // The promotion is part 1 of the release's entry, whose index is C's token.
    assert_eq!(
        (release_a.log_index, release_a.part, release_a.token),
        (c_grant.fencing_token, 0, Some(a.fencing_token))
    );
    assert_eq!((promote_c.log_index, promote_c.part), (c_grant.fencing_token, 1));
    assert_eq!(promote_c.token, Some(c_grant.fencing_token));
    assert_eq!(promote_c.holder.as_deref(), Some("test/audit-c-0001"));
    // The force-releases are at the indexes the admin API answered, with who and why.
    let (forced_line, forced_free_line) = (&first[8], &first[9]);
    assert_eq!((forced_line.log_index, forced_line.token), (forced.log_index, Some(d.fencing_token)));
    assert_eq!((forced_free_line.log_index, forced_free_line.token), (forced_free.log_index, None));
    for l in [forced_line, forced_free_line] {
        assert_eq!((l.caller.as_deref(), l.reason.as_deref()), (Some("alice"), Some("stuck job, ticket OPS-7")));
    }
    assert_eq!((first[11].token, first[11].lease_id.as_deref()), (Some(e.fencing_token), Some(e.lease_id.as_str())));
    assert_eq!(first[12].token, Some(f.fencing_token));
    assert_eq!(first[14].request_id.as_deref(), Some("audit-g-0001"));
    assert_eq!(first[15].token, Some(c_grant.fencing_token));

    // No snapshot was built yet, and the state is persisted only in
    // snapshots (no state file is written): after the restart every entry
    // is applied again from the log. Not one line may be written twice, and
    // what happens next is recorded once.
    assert!(!dir.path().join(STATE_FILE).exists(), "no state file is written");
    let node = restart(dir.path()).await;
    let mut c = client(&node).await;
    let h = acquire(&mut c, "aud/6", "audit-h-0001", 5_000, 0).await.unwrap();
    assert!(h.fencing_token > first.last().unwrap().log_index, "the log was applied again before this grant");
    // The persister writes (and skips) lines just after apply: count after
    // the stop, which drains it.
    let metrics = node.metrics().clone();
    node.shutdown().await;
    let skipped = metrics.audit_lines_skipped.get();
    let second = lines(&audit_dir);
    assert_eq!(second.len(), first.len() + 1, "exactly once across the replay: {second:#?}");
    assert_eq!(second[..first.len()], first[..]);
    let last = second.last().unwrap();
    assert_eq!((last.op, last.log_index, last.token), (Acquire, h.fencing_token, Some(h.fencing_token)));
    assert_eq!(skipped, first.len() as u64, "every replayed line was recognised as already written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t63_by_default_a_renewal_writes_no_log_entry_and_no_line() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path()).await;
    let audit_dir = node.audit_dir().expect("audit is on by default").to_path_buf();
    let mut c = client(&node).await;
    let a = acquire(&mut c, "aud/r", "audit-r-0001", 5_000, 0).await.unwrap();
    let before = node.service().status().last_log_index;
    let mut expiry = a.expires_at_unix_ms;
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let r = c.renew(RenewRequest { resource: "aud/r".into(), lease_id: a.lease_id.clone() }).await.unwrap();
        let r = r.into_inner();
        assert!(r.expires_at_unix_ms > expiry, "each renewal moves the deadline: {r:?} after {expiry}");
        expiry = r.expires_at_unix_ms;
    }
    // A renewal of a lease that is not current is refused as through the log.
    let stale = c.renew(RenewRequest { resource: "aud/r".into(), lease_id: "0".repeat(32) }).await.unwrap_err();
    assert_eq!(reason(&stale), "NOT_HOLDER");
    assert_eq!(node.service().status().last_log_index, before, "renewals confirmed without a log entry");
    assert_eq!(node.metrics().renewals_confirmed.get(), 5);
    c.release(ReleaseRequest { resource: "aud/r".into(), lease_id: a.lease_id.clone() }).await.unwrap();
    let released = c.renew(RenewRequest { resource: "aud/r".into(), lease_id: a.lease_id.clone() }).await.unwrap_err();
    assert_eq!(reason(&released), "NOT_HOLDER", "a released lease is not renewed");
    node.shutdown().await;
    let ops: Vec<_> = lines(&audit_dir).iter().map(|l| l.op).collect();
    assert!(!ops.contains(&AuditOp::Renew), "no renew line without --renewals-in-log: {ops:?}");
    assert!(ops.contains(&AuditOp::Release), "{ops:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t63_an_audit_dir_with_another_logs_lines_is_refused_for_a_new_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("shared-audit");
    let config = |data: &str| {
        let mut c = fast_config(&dir.path().join(data));
        c.audit = Some(fencer_coordinator::AuditConfig { dir: Some(audit.clone()), ..Default::default() });
        c
    };
    let node = start_with(config("first")).await;
    let mut c = client(&node).await;
    acquire(&mut c, "aud/x", "audit-x-0001", 5_000, 0).await.unwrap();
    node.shutdown().await;
    // A new data dir starts its log at index 0 again: its lines would be
    // taken for lines already written and skipped.
    let err = fencer_coordinator::Node::start(config("second")).await.err().expect("refused");
    assert!(matches!(err, fencer_coordinator::StartError::ForeignAudit { .. }), "{err}");
    assert!(err.to_string().contains("--audit-dir"), "{err}");
    // The node it belongs to starts on it again.
    let node = restart(&dir.path().join("first")).await;
    node.shutdown().await;
}
