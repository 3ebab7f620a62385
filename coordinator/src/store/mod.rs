//! openraft storage on redb: the raft log and vote ([`LogStore`]) in one file,
//! the lock state ([`StateMachineStore`]) in another (DESIGN §3.4).

mod codec;

pub(crate) use self::codec::{decode, encode};
mod log_store;
mod sm_store;
#[cfg(test)]
mod tests;

pub use self::log_store::{LogReader, LogStore};
pub use self::sm_store::{ApplyObserver, NoObserver, StateMachineStore};

/// File name of the raft log inside a data dir.
pub const LOG_FILE: &str = "raft-log.redb";
/// File name of the state machine inside a data dir.
pub const STATE_FILE: &str = "state.redb";
/// Directory of snapshot files inside a data dir.
pub const SNAPSHOT_DIR: &str = "snapshots";
