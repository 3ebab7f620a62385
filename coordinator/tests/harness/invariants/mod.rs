//! Invariant checkers over a recorded [`History`](super::history::History),
//! one per file (DESIGN §1). Each returns every violation it finds, with
//! enough context to read the failure without a debugger. Std only: the
//! process-level tests include these files too.

pub mod exactly_once;
pub mod grants;
pub mod monotonic_tokens;
pub mod single_holder;

use super::history::Op;

/// Runs every history checker; panics listing all violations.
pub fn check_all(ops: &[Op]) {
    let mut violations = Vec::new();
    violations.extend(single_holder::check(ops));
    violations.extend(monotonic_tokens::check(ops));
    violations.extend(exactly_once::check(ops));
    assert!(violations.is_empty(), "{} invariant violation(s):\n{}", violations.len(), violations.join("\n"));
}
