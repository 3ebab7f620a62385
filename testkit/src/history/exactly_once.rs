//! I7 exactly-once acquire: every answer to one request id that reports a
//! grant reports the same lease and token (a retry never creates a second
//! lease), and the grant is for the resource that request id named.

use std::collections::BTreeMap;

use super::record::{Answer, Call, Op};
use super::report::Violation;

/// The invariant, as reports name it.
pub const NAME: &str = "I7 exactly-once acquire";

/// Every violation of I7 in `ops` (see the module docs).
pub fn check(ops: &[Op]) -> Vec<Violation> {
    let mut seen: BTreeMap<&str, (usize, &str, &str, u64)> = BTreeMap::new();
    let mut out = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let (Call::Acquire { request_id, resource, .. }, Answer::Granted { lease_id, token, .. }) =
            (&op.call, &op.answer)
        else {
            continue;
        };
        match seen.get(request_id.as_str()) {
            None => {
                seen.insert(request_id, (i, resource, lease_id, *token));
            }
            Some((first, r, l, t)) if (*r, *l, *t) != (resource.as_str(), lease_id.as_str(), *token) => {
                let all = ops.iter().enumerate().filter_map(|(j, o)| match &o.call {
                    Call::Acquire { request_id: id, .. } if id == request_id => Some(j),
                    _ => None,
                });
                out.push(
                    Violation::new(
                        NAME,
                        format!(
                            "request {request_id} was granted twice: lease {l} on {r} (token {t}) and lease \
                             {lease_id} on {resource} (token {token})"
                        ),
                    )
                    .with_ops(all.chain([*first, i])),
                );
            }
            Some(_) => {}
        }
    }
    out
}
