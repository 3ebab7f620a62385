//! Snapshots and log purge in a cluster: a follower that missed more entries
//! than the leader keeps in its log catches up by installing a snapshot, and
//! ends with the same locks, request-id table and ended leases (so retries
//! still get their original outcome, I7); tokens granted after it keep
//! growing (I2). Snapshots are built while applies go on (the build does not
//! hold the apply path), which the concurrent writes here exercise.

use std::time::Duration;

use fencer_coordinator::{RequestId, ResourceName, SNAPSHOT_DIR};
use fencer_testkit::cluster::Cluster;
use fencer_testkit::cluster::replicas::assert_replicas_agree;
use fencer_testkit::eventually;
use fencer_testkit::history::{History, check_all};

const TIMEOUT: Duration = Duration::from_secs(20);

/// Node `n` holds each `(resource, lease id, token)` as granted. The state's
/// guard is let go on return (a held guard would stall the node's applies).
fn assert_holds(c: &Cluster, n: u64, held: &[(String, String, u64)]) {
    let node = c.node(n);
    let state = node.state();
    for (resource, lease, token) in held {
        let lock = state.resource(&ResourceName::new(resource.as_str()).unwrap()).and_then(|r| r.lock.clone());
        let lock = lock.unwrap_or_else(|| panic!("{resource} lost on the caught-up follower {n}"));
        assert_eq!((lock.lease_id.to_string(), lock.token.0), (lease.clone(), *token));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t53_a_lagging_follower_catches_up_from_a_snapshot() {
    let c = Cluster::start_with(3, |cfg| cfg.snapshot_every = 100).await;
    let h = History::new();
    let leader = c.leader(TIMEOUT).await;
    let lagging = c.ids().into_iter().find(|n| *n != leader).unwrap();
    c.crash(lagging).await;

    // Enough writes for several snapshots and a purge behind them.
    let mut max_token = 0;
    let mut held = Vec::new();
    for i in 0..120 {
        let resource = format!("snap/{i}");
        let g = c.acquire(&h, leader, &resource, &format!("snap-request-{i:04}"), 60_000, 0).await.expect("acquire");
        max_token = max_token.max(g.fencing_token);
        if i % 3 == 0 {
            held.push((resource, g.lease_id, g.fencing_token));
        } else {
            c.release(&h, leader, &resource, &g.lease_id).await.expect("release");
        }
    }
    let purged = eventually("the leader purged its log behind a snapshot", TIMEOUT, || async {
        let s = c.node(leader).service().status();
        (s.purged_index > 0 && s.snapshot_index > 0).then_some(s.purged_index)
    })
    .await;
    assert!(purged > 10, "the purge must cover entries the follower never saw");

    c.restart(lagging).await;
    assert_replicas_agree(&c, &c.ids(), TIMEOUT).await;
    assert_holds(&c, lagging, &held);
    // The request-id table came with the snapshot: retries keep their outcome.
    assert!(c.node(lagging).state().dedup(&RequestId::new("snap-request-0001").unwrap()).is_some());
    // The caught-up follower can lead: tokens keep growing past the snapshot.
    c.crash(leader).await;
    let others: Vec<_> = c.ids().into_iter().filter(|n| *n != leader).collect();
    let new = c.leader_among(&others, TIMEOUT).await;
    let retry = c.acquire(&h, new, "snap/0", "snap-request-0000", 60_000, 0).await.expect("retry");
    assert_eq!(retry.lease_id, held[0].1, "a retry after the snapshot returns the original grant (I7)");
    let next = c.acquire(&h, new, "snap/after", "snap-request-after", 60_000, 0).await.expect("acquire");
    assert!(next.fencing_token > max_token, "token {} not above {max_token}", next.fencing_token);
    check_all(&h.ops());
    c.shutdown().await;
}

/// A snapshot cut in the middle (half the body sent, then the call dropped
/// as a lost connection would drop it) installs nothing and leaves nothing
/// behind on the follower, which installs the leader's next attempt. A
/// receiver that took the reset stream for its end would try to install
/// the half body, whose decode fails, and a failed install stops the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t53_a_snapshot_cut_in_the_middle_installs_nothing_and_the_next_attempt_does() {
    let c = Cluster::start_with(3, |cfg| {
        cfg.snapshot_every = 100;
        cfg.snapshot_catchup_entries = Some(0);
    })
    .await;
    let h = History::new();
    let leader = c.leader(TIMEOUT).await;
    let lagging = c.ids().into_iter().find(|n| *n != leader).unwrap();
    c.crash(lagging).await;
    let mut held = Vec::new();
    for i in 0..120 {
        let resource = format!("cut/{i}");
        let g = c.acquire(&h, leader, &resource, &format!("cut-request-{i:04}"), 60_000, 0).await.expect("acquire");
        if i % 2 == 0 {
            held.push((resource, g.lease_id, g.fencing_token));
        } else {
            c.release(&h, leader, &resource, &g.lease_id).await.expect("release");
        }
    }
    eventually("the leader purged its log behind a snapshot", TIMEOUT, || async {
        let s = c.node(leader).service().status();
        (s.purged_index > 10 && s.snapshot_index > 0).then_some(())
    })
    .await;

    // Every snapshot to the lagging node is cut until it has refused one
    // (an attempt while it is still down would cut nothing it receives),
    // then the next one goes through.
    c.cut_snapshots(leader, lagging);
    c.restart(lagging).await;
    eventually("the lagging node refused a snapshot cut short", TIMEOUT, || async {
        (c.node(lagging).metrics().snapshots_refused_for("cut_short") > 0).then_some(())
    })
    .await;
    c.heal();
    assert_replicas_agree(&c, &c.ids(), TIMEOUT).await;
    assert_holds(&c, lagging, &held);
    // Only snapshot files: nothing of the cut attempt is left with a name
    // (waited for: a build of the node's own may be writing its `.tmp`).
    let dir = c.config(lagging).data_dir.join(SNAPSHOT_DIR);
    let names = || -> Vec<String> {
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect()
    };
    eventually("the lagging node's snapshot dir holds only snapshot files", TIMEOUT, || async {
        let names = names();
        (!names.is_empty() && names.iter().all(|n| n.starts_with("snapshot-") && n.ends_with(".bin"))).then_some(())
    })
    .await;
    check_all(&h.ops());
    c.shutdown().await;
}

/// Each member builds its snapshots at its own phase of the period (the
/// members ordered by id, spread evenly), not all at the same index at the
/// same moment as openraft's `LogsSinceLast` policy would have them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t53_members_build_their_snapshots_at_staggered_indexes() {
    const EVERY: u64 = 300;
    let c = Cluster::start_with(3, |cfg| cfg.snapshot_every = EVERY).await;
    let h = History::new();
    let leader = c.leader(TIMEOUT).await;
    // ~900 entries: three periods, so every member builds at least twice.
    for i in 0..450 {
        let resource = format!("stagger/{i}");
        let g = c.acquire(&h, leader, &resource, &format!("stagger-request-{i:04}"), 60_000, 0).await.expect("acquire");
        c.release(&h, leader, &resource, &g.lease_id).await.expect("release");
    }
    let mut ids = c.ids();
    ids.sort_unstable();
    let snapshots = eventually("every member built a snapshot past its first period", TIMEOUT, || async {
        let at: Vec<u64> = ids.iter().map(|id| c.node(*id).service().status().snapshot_index).collect();
        at.iter().all(|s| *s > EVERY).then_some(at)
    })
    .await;
    for (rank, (id, at)) in ids.iter().zip(&snapshots).enumerate() {
        let phase = rank as u64 * EVERY / ids.len() as u64;
        // A build snapshots what is applied when it starts: a few entries
        // past the mark. Builds at a common index would be a third or two
        // thirds of a period off for two of the three.
        let past = (at + EVERY - phase) % EVERY;
        assert!(
            past < EVERY / 6,
            "node {id} (rank {rank}) snapshotted at {at}, {past} past its phase {phase}: {snapshots:?}"
        );
    }
    check_all(&h.ops());
    c.shutdown().await;
}

/// `snapshot_catchup_entries` (`--snapshot-catchup-entries`) is the log kept
/// behind a snapshot: with 0 the leader purges up to its snapshot, with
/// more than the run writes it purges nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t53_the_log_kept_behind_a_snapshot_is_snapshot_catchup_entries() {
    for (keep, expect_purge) in [(0, true), (10_000, false)] {
        let c = Cluster::start_with(3, |cfg| {
            cfg.snapshot_every = 100;
            cfg.snapshot_catchup_entries = Some(keep);
        })
        .await;
        let h = History::new();
        let leader = c.leader(TIMEOUT).await;
        let write = |i: usize| {
            let (c, h) = (&c, &h);
            async move {
                let resource = format!("keep/{i}");
                let g =
                    c.acquire(h, leader, &resource, &format!("keep-request-{i:04}"), 60_000, 0).await.expect("acquire");
                c.release(h, leader, &resource, &g.lease_id).await.expect("release");
            }
        };
        for i in 0..150 {
            write(i).await;
        }
        let snapshot = eventually("the leader built a snapshot", TIMEOUT, || async {
            let s = c.node(leader).service().status();
            (s.snapshot_index > 0).then_some(s.snapshot_index)
        })
        .await;
        if expect_purge {
            let purged = eventually("the leader purged up to its snapshot", TIMEOUT, || async {
                let s = c.node(leader).service().status();
                (s.purged_index + 25 >= s.snapshot_index && s.purged_index > 0).then_some(s.purged_index)
            })
            .await;
            assert!(purged <= c.node(leader).service().status().snapshot_index, "never past the snapshot");
        } else {
            // More writes, until a later snapshot was built: the purge the
            // first one allowed (none) has had its turn.
            for i in 150..260 {
                write(i).await;
            }
            eventually("the leader built a later snapshot", TIMEOUT, || async {
                (c.node(leader).service().status().snapshot_index > snapshot).then_some(())
            })
            .await;
            let s = c.node(leader).service().status();
            assert_eq!(s.purged_index, 0, "keeping {keep} entries, nothing of this run may be purged");
        }
        c.shutdown().await;
    }
}
