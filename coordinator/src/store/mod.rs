//! openraft storage: the raft log and vote ([`LogStore`]) in a write-ahead
//! log, the lock state ([`StateMachineStore`]) in memory and in snapshot
//! files (DESIGN §3.4).
//!
//! - `log_store` — the raft log and vote, with group commit.
//! - `wal` — the write-ahead log's segment files: format, recovery, writer.
//! - `sm_store` — [`StateMachineStore`], openraft's `RaftStateMachine`:
//!   applies in memory, hands each batch to the persister.
//! - `persister` — the thread that writes the audit log.
//! - `tables` — the state file's tables, their rows, loading the state.
//! - `snapshot` — snapshot formats (and migrating old ones), building,
//!   receiving and installing, snapshot files.
//! - `stream` — decoding a snapshot body as it is read, a row at a time.
//! - `codec` — postcard, with errors that name what failed.

use openraft::{LogId, StoredMembership};

use crate::raft::TypeConfig;

mod codec;
mod log_store;
mod persister;
mod sm_store;
mod snapshot;
mod stream;
mod tables;
#[cfg(test)]
mod tests;
mod wal;

pub(crate) use self::codec::{decode, encode};
pub use self::log_store::{LEGACY_LOG_FILE, LogReader, LogStore};
pub use self::sm_store::{ApplyObserver, NoObserver, StateMachineStore};
pub(crate) use self::snapshot::ReceivedSnapshot;
pub use self::snapshot::SnapshotBody;
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) use self::stream::check_against_whole;
pub use self::wal::{LOG_DIR, WalOptions};

/// File name of the state machine inside a data dir.
pub const STATE_FILE: &str = "state.redb";
/// Directory of snapshot files inside a data dir.
pub const SNAPSHOT_DIR: &str = "snapshots";

type LogIdT = LogId<openraft::alias::CommittedLeaderIdOf<TypeConfig>>;
type Membership = StoredMembership<openraft::alias::CommittedLeaderIdOf<TypeConfig>, u64, openraft::BasicNode>;
type SnapshotMeta = openraft::alias::SnapshotMetaOf<TypeConfig>;
type Snapshot = openraft::alias::SnapshotOf<TypeConfig, SnapshotBody>;
