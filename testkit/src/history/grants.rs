//! The leases of a history with the bounds a correct cluster guarantees
//! about them, as the clients saw them. Shared by the checkers.

use std::collections::BTreeMap;
use std::time::Duration;

use super::record::{Answer, Call, Op};

/// One lease, from every operation that mentions it.
#[derive(Debug, Clone)]
pub struct Lease {
    /// The resource it holds.
    pub resource: String,
    /// The request id of the acquire that created it.
    pub request_id: String,
    /// Its lease id.
    pub lease_id: String,
    /// Its fencing token.
    pub token: u64,
    /// Its ttl, as granted.
    pub ttl: Duration,
    /// Earliest send of any acquire with this request id: the grant
    /// committed after it.
    pub first_sent: Duration,
    /// Earliest answer that reported the grant: it committed before.
    pub first_granted_answer: Duration,
    /// The lease is certainly current until at least this moment: the
    /// server never ends it earlier (I6: ttl after it received the last
    /// successful renew, which is after the client sent it), unless its
    /// holder released it first.
    pub valid_until: Duration,
    /// Indexes (into the ops) of every operation about this lease: the
    /// acquires of its request id, its renewals and releases, and the
    /// writes carrying its token.
    pub ops: Vec<usize>,
}

/// Every lease that some answer reported granted, in token order.
pub fn leases(ops: &[Op]) -> Vec<Lease> {
    let mut first_sent: BTreeMap<&str, Duration> = BTreeMap::new();
    let mut acquires: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, op) in ops.iter().enumerate() {
        if let Call::Acquire { request_id, .. } = &op.call {
            let e = first_sent.entry(request_id).or_insert(op.sent);
            *e = (*e).min(op.sent);
            acquires.entry(request_id).or_default().push(i);
        }
    }
    let mut by_lease: BTreeMap<String, Lease> = BTreeMap::new();
    for op in ops {
        if let (Call::Acquire { resource, request_id, .. }, Answer::Granted { lease_id, token, ttl_ms }) =
            (&op.call, &op.answer)
        {
            let l = by_lease.entry(lease_id.clone()).or_insert_with(|| Lease {
                resource: resource.clone(),
                request_id: request_id.clone(),
                lease_id: lease_id.clone(),
                token: *token,
                ttl: Duration::from_millis(*ttl_ms),
                first_sent: first_sent[request_id.as_str()],
                first_granted_answer: op.answered,
                valid_until: Duration::ZERO,
                ops: acquires[request_id.as_str()].clone(),
            });
            l.first_granted_answer = l.first_granted_answer.min(op.answered);
        }
    }
    let mut last_renew: BTreeMap<String, Duration> = BTreeMap::new();
    let mut first_release: BTreeMap<String, Duration> = BTreeMap::new();
    let lease_of_token: BTreeMap<u64, String> = by_lease.values().map(|l| (l.token, l.lease_id.clone())).collect();
    for (i, op) in ops.iter().enumerate() {
        let about = match &op.call {
            Call::Renew { lease_id, .. } | Call::Release { lease_id, .. } => Some(lease_id),
            Call::Write { token, .. } => lease_of_token.get(token),
            Call::Acquire { .. } => None,
        };
        let Some(l) = about.and_then(|id| by_lease.get_mut(id)) else { continue };
        if !matches!(op.call, Call::Acquire { .. }) {
            l.ops.push(i);
        }
        match (&op.call, &op.answer) {
            (Call::Renew { .. }, Answer::Renewed { .. }) => {
                let e = last_renew.entry(l.lease_id.clone()).or_insert(op.sent);
                *e = (*e).max(op.sent);
            }
            // Any release attempt may have ended it, whatever the answer.
            (Call::Release { .. }, _) => {
                let e = first_release.entry(l.lease_id.clone()).or_insert(op.sent);
                *e = (*e).min(op.sent);
            }
            _ => {}
        }
    }
    let mut out: Vec<Lease> = by_lease.into_values().collect();
    for l in &mut out {
        let renewed = last_renew.get(&l.lease_id).copied().unwrap_or(l.first_sent).max(l.first_sent);
        let by_time = renewed + l.ttl;
        l.valid_until = first_release.get(&l.lease_id).map_or(by_time, |r| (*r).min(by_time));
        l.ops.sort_unstable();
        l.ops.dedup();
    }
    out.sort_by(|a, b| (a.token, &a.lease_id).cmp(&(b.token, &b.lease_id)));
    out
}
