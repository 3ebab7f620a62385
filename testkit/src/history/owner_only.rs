//! I4 owner-only: only the current lease can be renewed or released. Once a
//! newer lease of the same resource was seen granted, the older lease has
//! ended for good (lease ids are never reused), so a renewal of it that
//! succeeds, or a release that reports it was the holder, sent after that
//! moment, means the server acted on a stale lease id: a stale or retried
//! release removed (or could have removed) a newer holder.

use std::collections::BTreeMap;

use super::grants::Lease;
use super::record::{Answer, Call, Op};
use super::report::Violation;

/// The invariant, as reports name it.
pub const NAME: &str = "I4 owner-only";

/// Every violation of I4 in `ops` (see the module docs).
pub fn check(ops: &[Op], leases: &[Lease]) -> Vec<Violation> {
    let lease_of: BTreeMap<&str, &Lease> = leases.iter().map(|l| (l.lease_id.as_str(), l)).collect();
    let mut by_resource: BTreeMap<&str, Vec<&Lease>> = BTreeMap::new();
    for l in leases {
        by_resource.entry(&l.resource).or_default().push(l);
    }
    let mut out = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let lease_id = match (&op.call, &op.answer) {
            (Call::Renew { lease_id, .. }, Answer::Renewed { .. })
            | (Call::Release { lease_id, .. }, Answer::Released) => lease_id,
            _ => continue,
        };
        let Some(a) = lease_of.get(lease_id.as_str()) else { continue };
        // The first newer lease of this resource seen before the call was sent.
        let newer = by_resource[a.resource.as_str()]
            .iter()
            .filter(|b| b.token > a.token && b.first_granted_answer < op.sent)
            .min_by_key(|b| b.first_granted_answer);
        if let Some(b) = newer {
            let what = if matches!(op.call, Call::Renew { .. }) { "renewed" } else { "released as its holder" };
            out.push(
                Violation::new(
                    NAME,
                    format!(
                        "{}: lease {} (token {}) was {what} by a call sent at {:?}, after the newer lease {} \
                         (token {}) had been seen granted at {:?}",
                        a.resource, a.lease_id, a.token, op.sent, b.lease_id, b.token, b.first_granted_answer
                    ),
                )
                .with_ops(a.ops.iter().chain(&b.ops).copied().chain([i])),
            );
        }
    }
    out
}
