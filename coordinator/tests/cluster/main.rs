//! The in-process cluster harness (`fencer_testkit::cluster`, DESIGN §8):
//! real nodes on loopback in this process with named faults.
//!
//! - `t50_partition` — an isolated old leader grants and renews nothing; a
//!   lost majority grants nothing.
//! - `t51_failover` — a killed leader, a response lost after commit, parked
//!   waiters and lease time across a leader change.
//! - `t52_bootstrap` — automatic bootstrap in any order, foreign data dirs,
//!   replacing a dead node.
//! - `t53_snapshot` — a lagging follower caught up from a snapshot.
//! - `t54_readiness` — readiness flips on quorum loss and back.
//! - `t90_regression` — bugs found by the history runs, one test each.
//!
//! The harness runs one cluster at a time per binary, so the tests of this
//! area take turns as they did in separate binaries.

mod t50_partition;
mod t51_failover;
mod t52_bootstrap;
mod t53_snapshot;
mod t54_readiness;
mod t90_regression;
