//! openraft's storage conformance `Suite` on the redb stores (STYLE.md habit 9).

use std::sync::Arc;

use openraft::StorageError;
use openraft::testing::log::{StoreBuilder, Suite};
use tempfile::TempDir;

use super::*;
use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::types::TypeConfig;

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
