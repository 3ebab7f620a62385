//! I2 monotonic tokens. Tokens are raft log indexes, so they order grants
//! across every resource, and per resource in particular:
//! - distinct leases have distinct tokens;
//! - a grant seen before another acquire was sent has the smaller token
//!   (real-time order; checked per resource and across resources);
//! - a renewal reports the token of its grant.

use std::collections::BTreeMap;

use super::grants::Lease;
use super::record::{Answer, Call, Op};
use super::report::Violation;

/// The invariant, as reports name it.
pub const NAME: &str = "I2 monotonic tokens";

/// Every violation of I2 in `ops` (see the module docs).
pub fn check(ops: &[Op], leases: &[Lease]) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut by_token: BTreeMap<u64, &Lease> = BTreeMap::new();
    for l in leases {
        if let Some(other) = by_token.insert(l.token, l)
            && other.lease_id != l.lease_id
        {
            out.push(
                Violation::new(
                    NAME,
                    format!(
                        "token {} was given to two leases: {} on {} and {} on {}",
                        l.token, other.lease_id, other.resource, l.lease_id, l.resource
                    ),
                )
                .with_ops(other.ops.iter().chain(&l.ops).copied()),
            );
        }
    }
    // Real time: sweep the leases by the moment their grant was first seen;
    // every acquire sent later must get a larger token than all of them.
    let mut seen: Vec<&Lease> = leases.iter().collect();
    seen.sort_by_key(|l| l.first_granted_answer);
    let mut requested: Vec<&Lease> = leases.iter().collect();
    requested.sort_by_key(|l| l.first_sent);
    let mut max_seen: Option<&Lease> = None;
    let mut max_seen_here: BTreeMap<&str, &Lease> = BTreeMap::new();
    let mut next = 0;
    for b in requested {
        while next < seen.len() && seen[next].first_granted_answer < b.first_sent {
            let a = seen[next];
            if max_seen.is_none_or(|m| a.token > m.token) {
                max_seen = Some(a);
            }
            let here = max_seen_here.entry(&a.resource).or_insert(a);
            if a.token > here.token {
                *here = a;
            }
            next += 1;
        }
        let per_resource = max_seen_here.get(b.resource.as_str()).copied();
        let worst = per_resource.filter(|a| a.token >= b.token).or(max_seen.filter(|a| a.token >= b.token));
        if let Some(a) = worst
            && a.lease_id != b.lease_id
        {
            let scope = if a.resource == b.resource { "on the same resource" } else { "across resources" };
            out.push(
                Violation::new(
                    NAME,
                    format!(
                        "{} on {} (token {}) was seen granted at {:?}, before {} on {} was requested at {:?}, \
                         yet the later token {} is not larger ({scope})",
                        a.lease_id,
                        a.resource,
                        a.token,
                        a.first_granted_answer,
                        b.lease_id,
                        b.resource,
                        b.first_sent,
                        b.token
                    ),
                )
                .with_ops(a.ops.iter().chain(&b.ops).copied()),
            );
        }
    }
    let lease_of: BTreeMap<&str, &Lease> = leases.iter().map(|l| (l.lease_id.as_str(), l)).collect();
    for (i, op) in ops.iter().enumerate() {
        if let (Call::Renew { lease_id, .. }, Answer::Renewed { token }) = (&op.call, &op.answer)
            && let Some(l) = lease_of.get(lease_id.as_str())
            && l.token != *token
        {
            out.push(
                Violation::new(
                    NAME,
                    format!("renewal of {lease_id} reported token {token}, its grant said {}", l.token),
                )
                .with_ops(l.ops.iter().copied().chain([i])),
            );
        }
    }
    out
}
