//! I3 fenced writes, from the upstream's own record of the order in which
//! writes reached it and were applied: once a write with token `t` reached
//! the upstream for a resource (the proxy accepted `t`), no write with a
//! token `< t` for that resource reaches it or is applied afterwards —
//! including writes that were already in flight when `t` arrived (P3: the
//! proxy drains them first). Also, the proxy's answers tell the truth: a
//! write answered 409 was never applied, and its epoch was above its token;
//! a write answered 2xx was applied.

use std::collections::{BTreeMap, BTreeSet};

use super::record::{Answer, Call, Op};
use super::report::Violation;

/// The invariant, as reports name it.
pub const NAME: &str = "I3 fenced writes";

/// What the upstream recorded, in its order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamEvent {
    /// A write carrying `token` reached the upstream.
    Arrived {
        /// Its token.
        token: u64,
        /// Its resource, when the upstream can tell.
        resource: Option<String>,
    },
    /// The upstream applied a write carrying `token`; `write_id` from its body.
    Applied {
        /// Its token.
        token: u64,
        /// Its resource, when the upstream can tell.
        resource: Option<String>,
        /// The write's id, when the upstream can tell.
        write_id: Option<String>,
    },
}

impl UpstreamEvent {
    /// The token of the write.
    pub fn token(&self) -> u64 {
        match self {
            UpstreamEvent::Arrived { token, .. } | UpstreamEvent::Applied { token, .. } => *token,
        }
    }

    fn resource(&self) -> Option<&str> {
        match self {
            UpstreamEvent::Arrived { resource, .. } | UpstreamEvent::Applied { resource, .. } => resource.as_deref(),
        }
    }
}

/// Every violation of I3 in `ops` and the upstream's record (see the module docs).
pub fn check(ops: &[Op], upstream: &[UpstreamEvent]) -> Vec<Violation> {
    let mut out = Vec::new();
    // Which resources a token was written to, and the writes of each token.
    // Tokens are unique across resources; if a broken build reused one, an
    // event that does not name its resource cannot be placed (I2 reports
    // the reuse) and is skipped here.
    let mut resources_of: BTreeMap<u64, BTreeSet<&str>> = BTreeMap::new();
    let mut resource_of_write: BTreeMap<&str, &str> = BTreeMap::new();
    let mut writes_of: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for (i, op) in ops.iter().enumerate() {
        if let Call::Write { resource, token, write_id } = &op.call {
            resources_of.entry(*token).or_default().insert(resource);
            resource_of_write.insert(write_id, resource);
            writes_of.entry(*token).or_default().push(i);
        }
    }
    // Per resource: the highest token that reached the upstream, and where.
    let mut highest: BTreeMap<String, (u64, usize)> = BTreeMap::new();
    // Stale arrivals already reported, whose application need not be again.
    let mut reported_arrivals: BTreeMap<(String, u64), usize> = BTreeMap::new();
    for (i, e) in upstream.iter().enumerate() {
        let t = e.token();
        let by_id = match e {
            UpstreamEvent::Applied { write_id: Some(id), .. } => resource_of_write.get(id.as_str()).copied(),
            _ => None,
        };
        let resource = match (e.resource().or(by_id), resources_of.get(&t)) {
            (Some(r), _) => r,
            (None, Some(rs)) if rs.len() == 1 => rs.first().copied().unwrap_or_default(),
            (None, Some(_)) => continue,
            (None, None) => {
                out.push(
                    Violation::new(NAME, format!("a write with token {t} reached the upstream, but no client sent it"))
                        .with_upstream([i]),
                );
                continue;
            }
        };
        if let Some((top, at)) = highest.get(resource).copied()
            && t < top
        {
            let key = (resource.to_string(), t);
            match e {
                UpstreamEvent::Arrived { .. } => *reported_arrivals.entry(key).or_default() += 1,
                UpstreamEvent::Applied { .. } => match reported_arrivals.get_mut(&key) {
                    Some(n) if *n > 0 => {
                        *n -= 1;
                        continue;
                    }
                    _ => {}
                },
            }
            let what = match e {
                UpstreamEvent::Arrived { .. } => "reached the upstream",
                UpstreamEvent::Applied { .. } => "was applied",
            };
            let ops_shown = writes_of.get(&t).into_iter().flatten().chain(writes_of.get(&top).into_iter().flatten());
            out.push(
                Violation::new(
                    NAME,
                    format!(
                        "{resource}: a write with token {t} {what} (upstream event {i}) after token {top} had \
                         reached it (upstream event {at})"
                    ),
                )
                .with_ops(ops_shown.copied())
                .with_upstream([at, i]),
            );
        }
        if let UpstreamEvent::Arrived { .. } = e {
            let entry = highest.entry(resource.to_string()).or_insert((t, i));
            if t > entry.0 {
                *entry = (t, i);
            }
        }
    }
    // The answers against the record.
    let mut applied: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, e) in upstream.iter().enumerate() {
        if let UpstreamEvent::Applied { write_id: Some(id), .. } = e {
            applied.entry(id).or_insert(i);
        }
    }
    let have_ids = upstream.iter().any(|e| matches!(e, UpstreamEvent::Applied { write_id: Some(_), .. }));
    let mut reported: BTreeSet<usize> = BTreeSet::new();
    for (i, op) in ops.iter().enumerate() {
        let Call::Write { resource, token, write_id } = &op.call else { continue };
        match &op.answer {
            Answer::Fenced { epoch } => {
                if *epoch <= *token {
                    out.push(
                        Violation::new(
                            NAME,
                            format!(
                                "{resource}: write {write_id} (token {token}) got 409 with epoch {epoch}, not above it"
                            ),
                        )
                        .with_ops([i]),
                    );
                }
                if let Some(at) = applied.get(write_id.as_str())
                    && reported.insert(i)
                {
                    out.push(
                        Violation::new(
                            NAME,
                            format!("{resource}: write {write_id} (token {token}) was answered 409, yet the upstream applied it"),
                        )
                        .with_ops([i])
                        .with_upstream([*at]),
                    );
                }
            }
            Answer::Written { status } if have_ids && !applied.contains_key(write_id.as_str()) => {
                out.push(
                    Violation::new(
                        NAME,
                        format!(
                            "{resource}: write {write_id} (token {token}) was answered {status}, but the upstream never \
                             applied it"
                        ),
                    )
                    .with_ops([i]),
                );
            }
            _ => {}
        }
    }
    out
}
