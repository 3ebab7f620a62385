//! History checking (DESIGN §1, §8): a record of every client operation
//! ([`history`]) and one checker per invariant, each in its own file:
//!
//! | module | invariant |
//! |---|---|
//! | [`single_holder`] | I1 single holder, with lease time accounted for |
//! | [`monotonic_tokens`] | I2 monotonic tokens, per resource and across resources |
//! | [`fenced_writes`] | I3 fenced writes, from the upstream's applied-write order |
//! | [`owner_only`] | I4 owner-only renew and release |
//! | [`exactly_once`] | I7 exactly-once acquire on retries |
//!
//! [`grants`] derives the leases and their guaranteed validity that I1, I2
//! and I4 reason about; [`report`] renders a run and its violations with the
//! slice of history that shows each one.
//!
//! Plain data and std only (plus tokio's clock), so every harness shares this
//! one copy, included with `#[path]`: the in-process cluster harness
//! (`coordinator/tests/harness`), the process-level tests and the workload
//! runner (through `tests/common/cluster.rs`), and the checkers' own tests
//! (`tests/t62_checkers.rs`).
#![allow(dead_code, unreachable_pub, missing_docs)]

pub mod exactly_once;
pub mod fenced_writes;
pub mod grants;
pub mod history;
pub mod monotonic_tokens;
pub mod owner_only;
pub mod report;
pub mod single_holder;

use self::fenced_writes::UpstreamEvent;
use self::history::Op;
use self::report::Violation;

/// Runs every checker over the operations and, when given, the upstream's
/// record of writes.
pub fn check(ops: &[Op], upstream: &[UpstreamEvent]) -> Vec<Violation> {
    let leases = grants::leases(ops);
    let mut violations = Vec::new();
    violations.extend(single_holder::check(ops, &leases));
    violations.extend(monotonic_tokens::check(ops, &leases));
    violations.extend(fenced_writes::check(ops, upstream));
    violations.extend(owner_only::check(ops, &leases));
    violations.extend(exactly_once::check(ops));
    violations
}

/// Runs every history checker; panics with the report if any invariant is
/// violated.
pub fn check_all(ops: &[Op]) {
    let violations = check(ops, &[]);
    assert!(violations.is_empty(), "{}", report::render("history check", ops, &[], &[], &violations));
}
