//! I1 single holder, with lease time (I6): a resource is never granted to a
//! new lease while the previous lease is certainly still current.
//!
//! For consecutive grants `a`, `b` of a resource (by token), `b` committed
//! before its client saw it, and `a` was current until at least
//! `valid_until` (ttl after the last successful renew was *sent*, or the
//! first release attempt). If `b` was seen granted before that moment, two
//! leases were current at once.

use std::collections::BTreeMap;

use super::grants::Lease;
use super::record::{Call, Op};
use super::report::Violation;

/// The invariant, as reports name it.
pub const NAME: &str = "I1 single holder";

/// Every violation of I1 in `ops` (see the module docs).
pub fn check(ops: &[Op], leases: &[Lease]) -> Vec<Violation> {
    let mut by_resource: BTreeMap<&str, Vec<&Lease>> = BTreeMap::new();
    for l in leases {
        by_resource.entry(&l.resource).or_default().push(l);
    }
    let mut out = Vec::new();
    for (resource, mut ls) in by_resource {
        ls.sort_by_key(|l| l.token);
        for pair in ls.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            if b.first_granted_answer < a.valid_until {
                out.push(
                    Violation::new(
                        NAME,
                        format!(
                            "{resource}: lease {} (token {}) was granted and seen at {:?}, but lease {} (token {}) \
                             was current until at least {:?}",
                            b.lease_id, b.token, b.first_granted_answer, a.lease_id, a.token, a.valid_until
                        ),
                    )
                    .with_ops(a.ops.iter().chain(&b.ops).copied())
                    .with_ops(releases_between(ops, resource, a, b)),
                );
            }
        }
    }
    out
}

/// Releases of any lease of `resource` sent while `a` held it and before
/// `b` was seen: the calls that may have ended `a` early.
fn releases_between(ops: &[Op], resource: &str, a: &Lease, b: &Lease) -> Vec<usize> {
    ops.iter()
        .enumerate()
        .filter(|(_, op)| {
            matches!(&op.call, Call::Release { resource: r, .. } if r == resource)
                && op.sent >= a.first_sent
                && op.sent <= b.first_granted_answer
        })
        .map(|(i, _)| i)
        .collect()
}
