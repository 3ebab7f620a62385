//! When each node builds its snapshots.
//!
//! openraft's own policy (`LogsSinceLast`) has every node snapshot when its
//! log has grown `snapshot_every` entries past its last snapshot, so all the
//! members of a cluster that started together build at the same index, at the
//! same moment: on a small machine three encodings of the whole state at once
//! held every commit of the cluster for hundreds of milliseconds
//! (docs/performance.md, "Snapshots at staggered indexes"). fencer sets the
//! policy to `Never` and triggers the builds itself: still one every
//! `snapshot_every` entries per node, but each member at its own phase, the
//! members (voters and learners, ordered by id) spread evenly over the
//! period. With three nodes and the default 100,000, the first builds at
//! indexes ≡ 0, the second at ≡ 33,333 and the third at ≡ 66,666 modulo
//! 100,000.

use std::time::Duration;

use crate::clock::Instant;
use crate::types::NodeId;

/// The least distance, as a fraction of the period, from a snapshot to the
/// next build: a node whose snapshot lands just before its next mark (one
/// installed from the leader, or its first after a restart) skips that mark
/// instead of building twice in a row.
const MIN_GAP_DIVISOR: u64 = 4;

/// How long a requested build may take to show up as a newer snapshot before
/// it is requested again (openraft drops a request while a build or an
/// install is in flight).
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The snapshot phase of one node and the build it last asked for.
#[derive(Debug)]
pub(crate) struct SnapshotSchedule {
    every: u64,
    me: NodeId,
    asked: Option<(u64, Instant)>,
}

impl SnapshotSchedule {
    /// A schedule of one build every `every` entries (at least 1) for node `me`.
    pub(crate) fn new(every: u64, me: NodeId) -> Self {
        Self { every: every.max(1), me, asked: None }
    }

    /// This node's phase: its rank among `members` (distinct ids, its own
    /// included or not) times the period over their number. Counted, not
    /// sorted: it runs on every change of raft's metrics.
    pub(crate) fn offset(&self, members: impl IntoIterator<Item = NodeId>) -> u64 {
        let (mut below, mut count, mut listed) = (0u128, 0u128, false);
        for id in members {
            count += 1;
            below += u128::from(id < self.me);
            listed |= id == self.me;
        }
        count += u128::from(!listed);
        // below < count, so the quotient is below `every` and fits.
        (below * u128::from(self.every) / count) as u64
    }

    /// The first index at which this node builds after a snapshot at
    /// `snapshot` (0: none): the least index ≡ `offset` modulo the period
    /// that is at least a quarter of a period past the snapshot.
    pub(crate) fn next_mark(&self, offset: u64, snapshot: u64) -> u64 {
        let from = snapshot.saturating_add(self.every / MIN_GAP_DIVISOR).max(1);
        let phase = offset % self.every;
        let ahead = (phase + self.every - from % self.every) % self.every;
        from.saturating_add(ahead)
    }

    /// Whether to ask for a build now, with the cluster's `members`: the
    /// applied index has reached this node's next mark and the same mark
    /// was not asked for within [`RETRY_AFTER`]. Records the request when
    /// it answers true.
    pub(crate) fn due(
        &mut self,
        applied: u64,
        snapshot: u64,
        members: impl IntoIterator<Item = NodeId>,
        now: Instant,
    ) -> bool {
        let mark = self.next_mark(self.offset(members), snapshot);
        if applied < mark {
            return false;
        }
        if let Some((asked, at)) = self.asked
            && asked == mark
            && now.duration_since(at) < RETRY_AFTER
        {
            return false;
        }
        self.asked = Some((mark, now));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn t01_three_members_are_spread_a_third_of_the_period_apart() {
        let offsets: Vec<u64> =
            [1, 2, 3].iter().map(|me| SnapshotSchedule::new(50_000, *me).offset([3, 1, 2])).collect();
        assert_eq!(offsets, [0, 16_666, 33_333]);
        // Ids need not be dense; a node missing from the list counts itself.
        assert_eq!(SnapshotSchedule::new(900, 70).offset([5, 9]), 600);
    }

    #[test]
    fn t02_builds_on_its_marks_and_never_twice_within_a_quarter_period() {
        let s = SnapshotSchedule::new(100, 1);
        assert_eq!(s.next_mark(0, 0), 100);
        assert_eq!(s.next_mark(33, 0), 33);
        assert_eq!(s.next_mark(33, 40), 133);
        // A snapshot just short of the mark (installed from the leader) skips it.
        assert_eq!(s.next_mark(33, 20), 133);
        assert_eq!(s.next_mark(33, 8), 33);
    }

    #[test]
    fn t03_asks_once_per_mark_until_the_retry_delay() {
        let mut s = SnapshotSchedule::new(100, 1);
        let t = Instant::now();
        assert!(!s.due(99, 0, [1], t));
        assert!(s.due(100, 0, [1], t));
        assert!(!s.due(130, 0, [1], t + Duration::from_millis(500)));
        assert!(s.due(140, 0, [1], t + RETRY_AFTER));
        // Built at 140: the next mark is 200.
        assert!(!s.due(199, 140, [1], t + RETRY_AFTER));
        assert!(s.due(200, 140, [1], t + RETRY_AFTER));
        // The second of two members builds half a period later.
        let mut second = SnapshotSchedule::new(100, 2);
        assert!(!second.due(49, 0, [1, 2], t));
        assert!(second.due(50, 0, [1, 2], t));
    }

    proptest! {
        /// The next mark is on the node's phase, at least a quarter period
        /// past the snapshot and at most a period and a quarter past it.
        #[test]
        fn t04_marks_are_on_phase_and_spaced(every in 1u64..1_000_000, rank in 0u64..7, snapshot in 0u64..u64::MAX / 2) {
            let s = SnapshotSchedule::new(every, 1);
            let offset = rank * every / 7;
            let mark = s.next_mark(offset, snapshot);
            prop_assert_eq!(mark % every, offset % every);
            prop_assert!(mark >= snapshot + every / 4);
            prop_assert!(mark < snapshot + every / 4 + every + 1);
        }

        /// Any set of members gets distinct phases when the period allows.
        #[test]
        fn t05_members_get_distinct_phases(ids in proptest::collection::btree_set(0u64..1_000, 1..9), every in 100u64..100_000) {
            let offsets: std::collections::BTreeSet<u64> =
                ids.iter().map(|me| SnapshotSchedule::new(every, *me).offset(ids.iter().copied())).collect();
            prop_assert_eq!(offsets.len(), ids.len());
        }
    }
}
