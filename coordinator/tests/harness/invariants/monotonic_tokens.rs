//! I2 monotonic tokens: distinct leases have distinct tokens; a grant seen
//! before another acquire was sent has the smaller token; a renewal reports
//! the token of its grant.

use std::collections::BTreeMap;

use super::super::history::{Answer, Call, Op};
use super::grants::leases;

pub fn check(ops: &[Op]) -> Vec<String> {
    let mut out = Vec::new();
    let ls = leases(ops);
    let mut by_token: BTreeMap<u64, &str> = BTreeMap::new();
    for l in &ls {
        if let Some(other) = by_token.insert(l.token, &l.lease_id)
            && other != l.lease_id
        {
            out.push(format!("I2: token {} was given to two leases, {other} and {}", l.token, l.lease_id));
        }
    }
    for a in &ls {
        for b in &ls {
            if a.first_granted_answer < b.first_sent && a.token >= b.token {
                out.push(format!(
                    "I2: {} (token {}) was seen at {:?}, before {} was requested at {:?}, yet its token {} is not smaller",
                    a.lease_id, a.token, a.first_granted_answer, b.lease_id, b.first_sent, b.token
                ));
            }
        }
    }
    let token_of: BTreeMap<&str, u64> = ls.iter().map(|l| (l.lease_id.as_str(), l.token)).collect();
    for op in ops {
        if let (Call::Renew { lease_id, .. }, Answer::Renewed { token }) = (&op.call, &op.answer)
            && let Some(t) = token_of.get(lease_id.as_str())
            && t != token
        {
            out.push(format!("I2: renewal of {lease_id} reported token {token}, its grant said {t}"));
        }
    }
    out
}
