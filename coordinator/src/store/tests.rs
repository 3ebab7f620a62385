//! openraft's storage conformance `Suite` on the redb stores (STYLE.md habit 9).

use std::sync::Arc;

use openraft::StorageError;
use openraft::testing::log::{StoreBuilder, Suite};
use tempfile::TempDir;

use super::*;
use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::raft::TypeConfig;

struct RedbBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, TempDir> for RedbBuilder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachineStore), StorageError<TypeConfig>> {
        let dir = TempDir::new().expect("temp dir");
        let metrics = Metrics::new();
        let log = LogStore::open(&dir.path().join(LOG_FILE), metrics.clone()).expect("open log");
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
    Suite::test_all(RedbBuilder).await.expect("openraft storage suite");
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
