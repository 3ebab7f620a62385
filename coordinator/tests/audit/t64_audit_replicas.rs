//! Every node audits the entries it applies (issue 7): the lines of two
//! replicas are the same, line for line, for every entry both applied; a
//! follower that catches up from a snapshot says so with one
//! `snapshot_installed` line at the snapshot's index, writes no line for
//! the entries the snapshot covered, and audits everything after it.

use std::path::Path;
use std::time::Duration;

use fencer_coordinator::{AuditOp, AuditRecord, audit_files, read_audit_file};
use fencer_testkit::cluster::Cluster;
use fencer_testkit::cluster::replicas::assert_replicas_agree;
use fencer_testkit::eventually;
use fencer_testkit::history::History;

const TIMEOUT: Duration = Duration::from_secs(20);

fn lines(dir: &Path) -> Vec<AuditRecord> {
    let mut skipped = 0;
    let mut out = Vec::new();
    for f in audit_files(dir).unwrap() {
        out.extend(read_audit_file(&f, &mut skipped).unwrap());
    }
    assert_eq!(skipped, 0);
    out
}

/// A line without the node-local time of membership and snapshot lines.
fn comparable(r: &AuditRecord) -> AuditRecord {
    let mut r = r.clone();
    if matches!(r.op, AuditOp::Membership | AuditOp::SnapshotInstalled) {
        r.time.clear();
    }
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t64_replicas_audit_the_same_lines_and_a_snapshot_install_is_marked() {
    let c = Cluster::start_with(3, |cfg| cfg.snapshot_every = 100).await;
    let h = History::new();
    let leader = c.leader(TIMEOUT).await;
    let lagging = c.ids().into_iter().find(|n| *n != leader).unwrap();
    let audit_dir = |n| c.config(n).data_dir.join("audit");
    let g = c.acquire(&h, leader, "rep/first", "rep-request-first", 60_000, 0).await.expect("acquire");
    // The lagging node applied the first grant before it went away.
    eventually("the first grant audited on the lagging node", TIMEOUT, || async {
        lines(&audit_dir(lagging)).iter().any(|l| l.token == Some(g.fencing_token)).then_some(())
    })
    .await;
    c.crash(lagging).await;
    for i in 0..120 {
        let resource = format!("rep/{i}");
        let g = c.acquire(&h, leader, &resource, &format!("rep-request-{i:04}"), 60_000, 0).await.expect("acquire");
        c.release(&h, leader, &resource, &g.lease_id).await.expect("release");
    }
    eventually("the leader purged its log behind a snapshot", TIMEOUT, || async {
        let s = c.node(leader).service().status();
        (s.purged_index > 10).then_some(())
    })
    .await;
    c.restart(lagging).await;
    let last = c.acquire(&h, leader, "rep/last", "rep-request-last", 60_000, 0).await.expect("acquire");
    assert_replicas_agree(&c, &c.ids(), TIMEOUT).await;
    let (on_leader, on_lagging) = eventually("both nodes audited the last grant", TIMEOUT, || async {
        let (a, b) = (lines(&audit_dir(leader)), lines(&audit_dir(lagging)));
        let done = |ls: &[AuditRecord]| ls.last().is_some_and(|l| l.log_index == last.fencing_token);
        (done(&a) && done(&b)).then_some((a, b))
    })
    .await;

    for ls in [&on_leader, &on_lagging] {
        assert!(ls.windows(2).all(|w| w[0].position() < w[1].position()), "each line once, in order");
    }
    let installs: Vec<&AuditRecord> = on_lagging.iter().filter(|l| l.op == AuditOp::SnapshotInstalled).collect();
    assert_eq!(installs.len(), 1, "one snapshot install: {installs:?}");
    let snapshot = installs[0].log_index;
    // Before the crash and after the snapshot the lagging node wrote exactly
    // the leader's lines; for the entries the snapshot covered, none.
    let leader_lines = |keep: &dyn Fn(u64) -> bool| -> Vec<AuditRecord> {
        on_leader.iter().filter(|l| keep(l.log_index)).map(comparable).collect()
    };
    let lagging_lines = |keep: &dyn Fn(u64) -> bool| -> Vec<AuditRecord> {
        on_lagging.iter().filter(|l| keep(l.log_index) && l.op != AuditOp::SnapshotInstalled).map(comparable).collect()
    };
    let before_crash = |i: u64| i <= g.fencing_token;
    let after_snapshot = |i: u64| i > snapshot;
    assert_eq!(lagging_lines(&before_crash), leader_lines(&before_crash));
    assert_eq!(lagging_lines(&after_snapshot), leader_lines(&after_snapshot));
    assert!(!lagging_lines(&after_snapshot).is_empty(), "entries after the snapshot are audited");
    assert!(
        on_lagging.iter().all(|l| before_crash(l.log_index) || l.log_index >= snapshot),
        "nothing between the crash and the snapshot: those entries were never applied there"
    );
    c.shutdown().await;
}
