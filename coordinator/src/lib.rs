//! fencer-coordinator.
