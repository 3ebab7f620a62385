//! The fencer lock coordinator.

mod state_machine;
mod types;

pub use self::state_machine::{
    Applied, CancelOutcome, Changes, Command, DedupOutcome, DedupRecord, EndReason, EndedLease, Event, Grant,
    LockRecord, LockState, LogCommand, Outcome, Rejection, ResourceState, Waiter,
};
pub use self::types::{
    FencingToken, Holder, InvalidField, LeaseId, MAX_HOLDER_LEN, MAX_REQUEST_ID_LEN, MAX_RESOURCE_LEN,
    MIN_REQUEST_ID_LEN, NodeId, RequestId, ResourceName, TypeConfig,
};
