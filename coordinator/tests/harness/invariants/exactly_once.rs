//! I7 exactly-once acquire: every answer to one request id that reports a
//! grant reports the same lease and token.

use std::collections::BTreeMap;

use super::super::history::{Answer, Call, Op};

pub fn check(ops: &[Op]) -> Vec<String> {
    let mut seen: BTreeMap<&str, (&str, u64)> = BTreeMap::new();
    let mut out = Vec::new();
    for op in ops {
        if let (Call::Acquire { request_id, .. }, Answer::Granted { lease_id, token, .. }) = (&op.call, &op.answer) {
            match seen.get(request_id.as_str()) {
                None => {
                    seen.insert(request_id, (lease_id, *token));
                }
                Some((l, t)) if (*l, *t) != (lease_id.as_str(), *token) => out.push(format!(
                    "I7: request {request_id} was granted twice: lease {l} (token {t}) and lease {lease_id} (token {token})"
                )),
                Some(_) => {}
            }
        }
    }
    out
}
