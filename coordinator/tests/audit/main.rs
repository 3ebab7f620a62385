//! The audit log (issue 7) on in-process nodes:
//!
//! - `t63_audit` — one line per change with its token and index, exactly
//!   once across replay; a foreign audit dir is refused.
//! - `t64_audit_replicas` — replicas audit the same lines, a snapshot
//!   install is marked.

mod t63_audit;
mod t64_audit_replicas;
