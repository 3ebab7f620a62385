//! openraft's storage conformance `Suite` on our stores (STYLE.md habit 9),
//! the audit log's order, and moving a redb log of an earlier version into
//! the write-ahead log.

use std::sync::Arc;

use openraft::StorageError;
use openraft::testing::log::{StoreBuilder, Suite};
use tempfile::TempDir;

use super::*;
use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::raft::TypeConfig;

/// The stores as a node opens them; `Some` segment size: the log with that
/// size (a small one makes the suite's writes cross segments).
struct Builder(Option<u64>);

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, TempDir> for Builder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachineStore), StorageError<TypeConfig>> {
        let dir = TempDir::new().expect("temp dir");
        let metrics = Metrics::new();
        let options = match self.0 {
            Some(segment_bytes) => WalOptions { segment_bytes, zero_chunk: 1024 },
            None => WalOptions::default(),
        };
        let log = LogStore::open_with(
            &dir.path().join(LOG_DIR),
            metrics.clone(),
            options,
            crate::DEFAULT_REPLICATION_INTERVAL,
        )
        .expect("open log");
        let sm = StateMachineStore::open(
            &dir.path().join(STATE_FILE),
            &dir.path().join(SNAPSHOT_DIR),
            Arc::new(NoObserver),
            metrics,
            Clock,
            None,
        )
        .expect("open state");
        Ok((dir, log, sm))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t10_openraft_storage_suite() {
    Suite::test_all(Builder(None)).await.expect("openraft storage suite");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t10_openraft_storage_suite_on_4_kib_segments() {
    Suite::test_all(Builder(Some(4096))).await.expect("openraft storage suite, small segments");
}

mod legacy_log {
    //! A data dir of a version before the write-ahead log keeps its raft
    //! log in `raft-log.redb`: the first start moves it over, whole.

    use openraft::alias::{EntryOf, LogIdOf, VoteOf};
    use openraft::entry::RaftEntry;
    use openraft::storage::{RaftLogReader, RaftLogStorage};
    use redb::{Database, TableDefinition};

    use super::*;
    use crate::state_machine::{Command, LogCommand};
    use crate::store::encode;

    const LOG: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("log");
    const META: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("meta");

    fn entry(index: u64) -> EntryOf<TypeConfig> {
        let cmd = Command::PruneDedup { older_than_ms: index };
        EntryOf::<TypeConfig>::new_normal(
            openraft::testing::log_id::<TypeConfig>(2, 1, index),
            LogCommand { at_ms: index, cmd },
        )
    }

    /// Writes a log as the redb store did: entries by index, the vote,
    /// committed id and purge marker in a meta table. Entry 3 is at or
    /// below the purge marker: left behind by a purge a crash cut short.
    fn write_legacy(path: &std::path::Path) {
        let db = Database::create(path).unwrap();
        let w = db.begin_write().unwrap();
        {
            let mut log = w.open_table(LOG).unwrap();
            for i in 3..=10 {
                log.insert(i, encode(&entry(i)).unwrap().as_slice()).unwrap();
            }
            let mut meta = w.open_table(META).unwrap();
            let vote: VoteOf<TypeConfig> = VoteOf::<TypeConfig>::new_committed(2, 1);
            meta.insert("vote", encode(&vote).unwrap().as_slice()).unwrap();
            let committed: LogIdOf<TypeConfig> = openraft::testing::log_id::<TypeConfig>(2, 1, 9);
            meta.insert("committed", encode(&committed).unwrap().as_slice()).unwrap();
            let purged: LogIdOf<TypeConfig> = openraft::testing::log_id::<TypeConfig>(2, 1, 5);
            meta.insert("last_purged", encode(&purged).unwrap().as_slice()).unwrap();
        }
        w.commit().unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn t21_a_redb_log_of_an_earlier_version_is_moved_into_the_write_ahead_log() {
        let dir = TempDir::new().unwrap();
        let legacy = dir.path().join(LEGACY_LOG_FILE);
        write_legacy(&legacy);
        let log_dir = dir.path().join(LOG_DIR);
        assert!(LogStore::holds_raft_data(&log_dir).unwrap(), "the earlier log counts as raft data");

        let mut log = LogStore::open(&log_dir, Metrics::new()).unwrap();
        assert!(!legacy.exists(), "the redb file is removed once moved");
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_purged_log_id.map(|l| l.index), Some(5));
        assert_eq!(state.last_log_id.map(|l| l.index), Some(10));
        assert_eq!(log.read_vote().await.unwrap(), Some(VoteOf::<TypeConfig>::new_committed(2, 1)));
        assert_eq!(log.read_committed().await.unwrap().map(|l| l.index), Some(9));
        let entries = log.try_get_log_entries(0..100).await.unwrap();
        assert_eq!(entries, (6..=10).map(entry).collect::<Vec<_>>(), "entries past the purge marker, as they were");
        drop(log);

        // A second start reads the moved log and does not look for the old one.
        let mut log = LogStore::open(&log_dir, Metrics::new()).unwrap();
        assert_eq!(log.get_log_state().await.unwrap().last_log_id.map(|l| l.index), Some(10));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn t22_a_move_cut_short_is_done_again_and_a_finished_one_only_removes_the_file() {
        let dir = TempDir::new().unwrap();
        let legacy = dir.path().join(LEGACY_LOG_FILE);
        let log_dir = dir.path().join(LOG_DIR);
        // Cut short before the rename: a half-written temporary dir.
        write_legacy(&legacy);
        std::fs::create_dir_all(log_dir.with_extension("migrating")).unwrap();
        std::fs::write(log_dir.with_extension("migrating").join("00000000000000000001.wal"), b"half").unwrap();
        let mut log = LogStore::open(&log_dir, Metrics::new()).unwrap();
        assert_eq!(log.try_get_log_entries(0..100).await.unwrap().len(), 5);
        drop(log);
        // Cut short after the rename: the redb file is still there, the new log wins.
        write_legacy(&legacy);
        let mut log = LogStore::open(&log_dir, Metrics::new()).unwrap();
        assert!(!legacy.exists());
        assert_eq!(log.try_get_log_entries(0..100).await.unwrap().len(), 5);
    }
}

mod audit_order {
    //! A snapshot file is never ahead of the audit log, and a failed audit
    //! write stops applies instead of losing lines (module `audit`).

    use std::time::Duration;

    use futures::stream;
    use openraft::alias::EntryOf;
    use openraft::entry::RaftEntry;
    use openraft::storage::RaftStateMachine;

    use super::*;
    use crate::audit::{AUDIT_FILE, AuditConfig, AuditLog, read_audit_file};
    use crate::state_machine::{AcquireCmd, Command, LogCommand};
    use crate::types::{Holder, LeaseId, RequestId, ResourceName};

    fn acquire(index: u64) -> EntryOf<TypeConfig> {
        let cmd = Command::Acquire(AcquireCmd {
            request_id: RequestId::new(format!("request-{index:04}")).unwrap(),
            resource: ResourceName::new(format!("order/{index}")).unwrap(),
            // Long holders: a few dozen lines fill the 4 KiB audit file.
            holder: Holder::new("h".repeat(200)).unwrap(),
            ttl_ms: 30_000,
            wait: false,
            lease_id: LeaseId::from_u128(u128::from(index)),
            max_waiters: 8,
        });
        EntryOf::<TypeConfig>::new_normal(
            openraft::testing::log_id::<TypeConfig>(1, 1, index),
            LogCommand { at_ms: index, cmd },
        )
    }

    async fn apply(sm: &mut StateMachineStore, indexes: std::ops::RangeInclusive<u64>) -> std::io::Result<()> {
        sm.apply(stream::iter(indexes.map(|i| Ok((acquire(i), None))))).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn t20_an_audit_failure_stops_applies_and_no_snapshot_passes_the_audit() {
        let dir = TempDir::new().unwrap();
        let (state, snapshots, audit_dir) =
            (dir.path().join(STATE_FILE), dir.path().join(SNAPSHOT_DIR), dir.path().join("audit"));
        let metrics = Metrics::new();
        let config = AuditConfig { max_file_bytes: 4096, max_files: 2, ..AuditConfig::default() };
        let audit = AuditLog::open(&audit_dir, &config, metrics.clone()).unwrap();
        let mut sm =
            StateMachineStore::open(&state, &snapshots, Arc::new(NoObserver), metrics, Clock, Some(audit)).unwrap();
        apply(&mut sm, 1..=3).await.unwrap();
        sm.build_snapshot().await.unwrap();
        // The next rotation cannot happen: where the oldest file is deleted
        // and the current one moved to, there is a directory.
        std::fs::create_dir_all(audit_dir.join(format!("{AUDIT_FILE}.1")).join("in-the-way")).unwrap();
        // One batch larger than the file: the rotation fails in its middle.
        apply(&mut sm, 4..=40).await.unwrap();
        let mut stopped = false;
        for i in 41..=200 {
            if apply(&mut sm, i..=i).await.is_err() {
                stopped = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(stopped, "applies fail once the audit log cannot be written");
        assert!(sm.failure_message().is_some_and(|m| m.contains("audit")), "{:?}", sm.failure_message());
        assert!(sm.build_snapshot().await.is_err(), "no snapshot is built past a failed audit log");
        drop(sm);

        let mut skipped = 0;
        let audited = read_audit_file(&audit_dir.join(AUDIT_FILE), &mut skipped).unwrap();
        let last_audited = audited.last().map_or(0, |r| r.log_index);
        assert!(last_audited >= 3, "the lines before the failure are kept");
        // Reopen once the persister thread let the files go.
        let mut reopened = None;
        for _ in 0..200 {
            match StateMachineStore::open(&state, &snapshots, Arc::new(NoObserver), Metrics::new(), Clock, None) {
                Ok(sm) => {
                    reopened = Some(sm);
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
        let applied = reopened.expect("the store reopens").applied_index().unwrap_or(0);
        assert_eq!(applied, 3, "the state is the snapshot's; the log replays the rest");
        assert!(applied <= last_audited, "snapshot at {applied} passed the audit log at {last_audited}");
    }
}

mod commit_gap {
    //! `--log-commit-gap`: a durable write waits out the rest of the gap
    //! after the previous one, and one after a quiet spell waits for nothing.

    use std::time::Duration;

    use openraft::alias::EntryOf;
    use openraft::entry::RaftEntry;
    use openraft::storage::{IOFlushed, RaftLogStorage};
    use openraft::type_config::TypeConfigExt as _;
    use tokio::time::Instant;

    use super::*;
    use crate::state_machine::{Command, LogCommand};

    fn entry(index: u64) -> EntryOf<TypeConfig> {
        EntryOf::<TypeConfig>::new_normal(
            openraft::testing::log_id::<TypeConfig>(1, 1, index),
            LogCommand { at_ms: index, cmd: Command::PruneDedup { older_than_ms: index } },
        )
    }

    /// Appends entry `index` and returns once the log says it is durable.
    async fn append_durably(log: &mut LogStore, index: u64) {
        let (tx, rx) = TypeConfig::oneshot();
        log.append([entry(index)], IOFlushed::signal(tx)).await.unwrap();
        rx.await.unwrap().unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn t23_a_durable_write_waits_out_the_commit_gap_unless_the_log_was_quiet() {
        let gap = Duration::from_millis(1500);
        let dir = TempDir::new().unwrap();
        let mut log =
            LogStore::open_with(&dir.path().join(LOG_DIR), Metrics::new(), WalOptions::default(), gap).unwrap();
        let start = Instant::now();
        append_durably(&mut log, 1).await;
        // The first write's sync started after `start`, so the second one,
        // queued right away, cannot start before `start + gap`.
        append_durably(&mut log, 2).await;
        assert!(start.elapsed() >= gap, "the second write waited {:?}, less than the gap", start.elapsed());

        // A quiet spell longer than the gap: the next write is not held. The
        // bound is the gap itself, so a slow disk cannot fail this by accident
        // short of a sync slower than 1.5 s.
        tokio::time::sleep(gap).await;
        let quiet = Instant::now();
        append_durably(&mut log, 3).await;
        assert!(quiet.elapsed() < gap, "a write after a quiet spell waited {:?}", quiet.elapsed());

        // Zero: the second write of a pair does not wait for a gap.
        let other = TempDir::new().unwrap();
        let mut log =
            LogStore::open_with(&other.path().join(LOG_DIR), Metrics::new(), WalOptions::default(), Duration::ZERO)
                .unwrap();
        let start = Instant::now();
        append_durably(&mut log, 1).await;
        append_durably(&mut log, 2).await;
        assert!(start.elapsed() < gap, "with no gap two writes took {:?}", start.elapsed());
    }

    /// A gap set while the log is open holds from the next durable write
    /// on (a node follows its cluster's voters this way), both ways.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn t23_a_commit_gap_set_while_open_holds_from_the_next_write() {
        let gap = Duration::from_millis(1500);
        let dir = TempDir::new().unwrap();
        let mut log =
            LogStore::open_with(&dir.path().join(LOG_DIR), Metrics::new(), WalOptions::default(), Duration::ZERO)
                .unwrap();
        assert_eq!(log.commit_gap(), Duration::ZERO);
        log.set_commit_gap(gap);
        assert_eq!(log.commit_gap(), gap);
        let start = Instant::now();
        append_durably(&mut log, 1).await;
        append_durably(&mut log, 2).await;
        assert!(start.elapsed() >= gap, "the raised gap was not waited out: {:?}", start.elapsed());

        log.set_commit_gap(Duration::ZERO);
        let start = Instant::now();
        append_durably(&mut log, 3).await;
        append_durably(&mut log, 4).await;
        assert!(start.elapsed() < gap, "the lowered gap still held the writes: {:?}", start.elapsed());
    }
}
