//! History checking (DESIGN §1, §8): a record of every client operation
//! ([`History`]) and one checker per invariant, each in its own file:
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
//! one copy: the in-process cluster harness ([`crate::cluster`]), the
//! process-level tests and the workload runner (through the
//! [relays](crate::relay)), and the checkers' own tests (`t62_checkers`).

pub mod exactly_once;
pub mod fenced_writes;
pub mod grants;
pub mod monotonic_tokens;
pub mod owner_only;
mod record;
pub mod report;
pub mod single_holder;

pub use self::fenced_writes::UpstreamEvent;
pub use self::record::{Answer, Call, History, Op};
pub use self::report::Violation;

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
