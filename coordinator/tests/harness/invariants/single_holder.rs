//! I1 single holder, with lease time (I6): a resource is never granted to a
//! new lease while the previous lease is certainly still current.
//!
//! For consecutive grants g1, g2 of a resource (by token), g2 committed
//! before the client saw it, and g1 was current until at least
//! `valid_until` (ttl after the last successful renew was *sent*, or the
//! first release attempt). If g2 was seen granted before that moment, two
//! leases were current at once.

use std::collections::BTreeMap;

use super::super::history::Op;
use super::grants::{Lease, leases};

pub fn check(ops: &[Op]) -> Vec<String> {
    let mut by_resource: BTreeMap<String, Vec<Lease>> = BTreeMap::new();
    for l in leases(ops) {
        by_resource.entry(l.resource.clone()).or_default().push(l);
    }
    let mut out = Vec::new();
    for (resource, mut ls) in by_resource {
        ls.sort_by_key(|l| l.token);
        for pair in ls.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            if b.first_granted_answer < a.valid_until {
                out.push(format!(
                    "I1: {resource}: lease {} (token {}) was granted and seen at {:?}, but lease {} (token {}) \
                     was current until at least {:?}",
                    b.lease_id, b.token, b.first_granted_answer, a.lease_id, a.token, a.valid_until
                ));
            }
        }
    }
    out
}
