//! The raft type configuration and the raft handle, declared once at the
//! root as openraft's own examples do: the state machine, the store, the
//! network and the service all name these, and none of them names another
//! only to reach them.

openraft::declare_raft_types!(
    /// The raft type configuration of fencer's coordinator: log entries
    /// carry a [`LogCommand`](crate::LogCommand), applying one answers an
    /// [`Outcome`](crate::Outcome).
    pub TypeConfig:
        D = crate::state_machine::LogCommand,
        R = crate::state_machine::Outcome,
);

/// The raft handle type of a coordinator node.
pub type RaftHandle = openraft::Raft<TypeConfig, crate::store::StateMachineStore>;
