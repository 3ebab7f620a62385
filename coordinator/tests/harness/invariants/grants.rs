//! The grants of a history with the bounds a correct cluster guarantees
//! about them, as the clients saw them. Shared by the checkers.

use std::collections::BTreeMap;
use std::time::Duration;

use super::super::history::{Answer, Call, Op};

/// One lease, from every operation that mentions it.
#[derive(Debug, Clone)]
pub struct Lease {
    pub resource: String,
    pub request_id: String,
    pub lease_id: String,
    pub token: u64,
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
}

pub fn leases(ops: &[Op]) -> Vec<Lease> {
    let mut first_sent: BTreeMap<&str, Duration> = BTreeMap::new();
    for op in ops {
        if let Call::Acquire { request_id, .. } = &op.call {
            let e = first_sent.entry(request_id).or_insert(op.sent);
            *e = (*e).min(op.sent);
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
            });
            l.first_granted_answer = l.first_granted_answer.min(op.answered);
        }
    }
    for l in by_lease.values_mut() {
        let mut last_renew = l.first_sent;
        let mut release: Option<Duration> = None;
        for op in ops {
            match (&op.call, &op.answer) {
                (Call::Renew { lease_id, .. }, Answer::Renewed { .. }) if *lease_id == l.lease_id => {
                    last_renew = last_renew.max(op.sent);
                }
                // Any release attempt may have ended it, whatever the answer.
                (Call::Release { lease_id, .. }, _) if *lease_id == l.lease_id => {
                    release = Some(release.map_or(op.sent, |r| r.min(op.sent)));
                }
                _ => {}
            }
        }
        let by_time = last_renew + l.ttl;
        l.valid_until = release.map_or(by_time, |r| r.min(by_time));
    }
    by_lease.into_values().collect()
}
