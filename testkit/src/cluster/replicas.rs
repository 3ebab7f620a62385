//! Replica agreement: once running nodes have applied the same log prefix,
//! their lock states are identical (no node holds a lease another does not —
//! the cluster-wide form of I1 — and tokens agree, I2).

use std::time::Duration;

use fencer_coordinator::NodeId;
use tokio::time::Instant;

use super::Cluster;

/// Waits until every node in `ids` has applied the same index with the same
/// state. Panics with the last difference seen if that does not happen
/// within `timeout`.
pub async fn assert_replicas_agree(cluster: &Cluster, ids: &[NodeId], timeout: Duration) {
    let deadline = Instant::now() + timeout;
    let mut last = String::from("no two snapshots at the same index");
    loop {
        let snaps: Vec<_> = ids
            .iter()
            .map(|id| {
                let node = cluster.node(*id);
                let s = node.state();
                let snap = (s.resources().clone(), s.dedup_records().clone(), s.ended_records().clone());
                drop(s);
                (*id, node.applied_index(), snap)
            })
            .collect();
        let (id0, index0, snap0) = &snaps[0];
        if snaps.iter().all(|(_, i, _)| i == index0) {
            match snaps.iter().find(|(_, _, s)| s != snap0) {
                None => return,
                Some((id, _, s)) => {
                    last =
                        format!("at index {index0:?}, node {id} has\n{:#?}\nwhile node {id0} has\n{:#?}", s.0, snap0.0)
                }
            }
        }
        assert!(Instant::now() < deadline, "replicas do not agree: {last}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
