//! `fencer status`: the cluster as each of its nodes sees it. Asks the given
//! endpoints, then every member they name, so one endpoint is enough: the
//! table shows each member's own state, term, last and commit index, its
//! readiness (what its `/readyz` answers, with the reason when not ready)
//! and the leader's view of its health.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use fencer_client::{Client, StatusResponse};
use serde_json::{Value, json};

use super::lock::{ClientArgs, fail};
use crate::output::{OutputFormat, outln, print_json, print_table};

/// How long one node may take to answer a status call.
const NODE_TIMEOUT: Duration = Duration::from_secs(2);

/// Arguments of `fencer status`.
#[derive(Debug, clap::Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    client: ClientArgs,
}

fn node_json(s: &StatusResponse) -> Value {
    json!({
        "node_id": s.node_id,
        "cluster_id": s.cluster_id,
        "state": s.state,
        "leader_id": if s.has_leader { Some(s.leader_id) } else { None },
        "leader_addr": s.leader_addr,
        "term": s.term,
        "last_log_index": s.last_log_index,
        "commit_index": s.commit_index,
        "applied_index": s.applied_index,
        "snapshot_index": s.snapshot_index,
        "purged_index": s.purged_index,
        "locks_held": s.locks_held,
        "waiters": s.waiters,
        "ready": s.ready,
        "ready_reason": s.ready_reason,
        "leader_ready": s.leader_ready,
        "millis_since_quorum_ack": (s.millis_since_quorum_ack >= 0).then_some(s.millis_since_quorum_ack),
        "version": s.version,
        "members": s.members.iter().map(|m| json!({
            "id": m.id, "addr": m.addr, "role": m.role, "matched_index": m.matched_index,
            "last_ack_ms": m.last_ack_ms, "health": m.health,
        })).collect::<Vec<_>>(),
    })
}

/// What every reachable node said, by the address it was asked at, and the
/// addresses that did not answer.
struct Views {
    answered: BTreeMap<String, StatusResponse>,
    unreachable: BTreeMap<String, String>,
}

async fn ask(client: &Client, addr: &str, views: &mut Views) {
    if views.answered.contains_key(addr) || views.unreachable.contains_key(addr) {
        return;
    }
    match client.node_status(addr).await {
        Ok(s) => {
            views.answered.insert(addr.to_string(), s);
        }
        Err(e) => {
            views.unreachable.insert(addr.to_string(), e.to_string());
        }
    }
}

pub(crate) async fn run(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let client = args.client.client()?.with_call_timeout(NODE_TIMEOUT);
    let mut views = Views { answered: BTreeMap::new(), unreachable: BTreeMap::new() };
    for ep in client.endpoints() {
        ask(&client, ep, &mut views).await;
    }
    // Then every member and the leader any answer names.
    let named: Vec<String> = views
        .answered
        .values()
        .flat_map(|s| s.members.iter().map(|m| m.addr.clone()).chain(Some(s.leader_addr.clone())))
        .filter(|a| !a.is_empty())
        .collect();
    for addr in named {
        ask(&client, &addr, &mut views).await;
    }
    if views.answered.is_empty() {
        for (addr, e) in &views.unreachable {
            eprintln!("fencer: {addr}: {e}");
        }
        let e = fencer_client::ClientError::Unavailable {
            reason: None,
            message: "no node answered".into(),
            metadata: Default::default(),
        };
        return Ok(fail(args.client.output, &e));
    }
    // The leader's view is authoritative for membership and health; without
    // a leader, the view of the highest term.
    let best = views
        .answered
        .values()
        .filter(|s| s.state == "leader")
        .max_by_key(|s| s.term)
        .or_else(|| views.answered.values().max_by_key(|s| s.term))
        .cloned()
        .expect("at least one view");
    let own = |id: u64| views.answered.values().find(|s| s.node_id == id);
    let members: Vec<Value> = best
        .members
        .iter()
        .map(|m| {
            let mut v = json!({
                "id": m.id, "addr": m.addr, "role": m.role, "health": m.health,
                "matched_index": m.matched_index, "last_ack_ms": m.last_ack_ms,
            });
            match own(m.id) {
                Some(s) => {
                    v["reachable"] = json!(true);
                    v["state"] = json!(s.state);
                    v["term"] = json!(s.term);
                    v["last_log_index"] = json!(s.last_log_index);
                    v["commit_index"] = json!(s.commit_index);
                    v["applied_index"] = json!(s.applied_index);
                    v["ready"] = json!(s.ready);
                    v["ready_reason"] = json!(s.ready_reason);
                }
                None => {
                    v["reachable"] = json!(false);
                    v["state"] = json!("unreachable");
                    v["ready"] = json!(false);
                    v["ready_reason"] = json!("did not answer");
                }
            }
            v
        })
        .collect();
    match args.client.output {
        OutputFormat::Json => print_json(&json!({
            "cluster_id": best.cluster_id,
            "leader_id": if best.has_leader { Some(best.leader_id) } else { None },
            "leader_addr": best.leader_addr,
            "term": best.term,
            "last_log_index": best.last_log_index,
            "commit_index": best.commit_index,
            "members": members,
            "nodes": views.answered.iter().map(|(ep, s)| json!({"endpoint": ep, "status": node_json(s)})).collect::<Vec<_>>(),
            "unreachable": views.unreachable.keys().collect::<Vec<_>>(),
        }))?,
        OutputFormat::Table => {
            outln!(
                "cluster {}  leader {}  term {}  last index {}  commit index {}  locks {}  waiters {}",
                if best.cluster_id.is_empty() { "(forming)" } else { &best.cluster_id },
                if best.has_leader { format!("{} ({})", best.leader_id, best.leader_addr) } else { "none".into() },
                best.term,
                best.last_log_index,
                best.commit_index,
                best.locks_held,
                best.waiters,
            );
            let cell = |v: &Value, k: &str| match &v[k] {
                Value::Null => "-".to_string(),
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let rows: Vec<Vec<String>> = members
                .iter()
                .map(|m| {
                    let ack = m["last_ack_ms"].as_i64().unwrap_or(-1);
                    vec![
                        cell(m, "id"),
                        cell(m, "addr"),
                        cell(m, "role"),
                        cell(m, "state"),
                        cell(m, "term"),
                        cell(m, "last_log_index"),
                        cell(m, "commit_index"),
                        if m["ready"].as_bool() == Some(true) { "yes".into() } else { "no".into() },
                        cell(m, "health"),
                        if ack < 0 { "-".into() } else { format!("{ack}ms") },
                    ]
                })
                .collect();
            print_table(
                &["NODE", "ADDRESS", "ROLE", "STATE", "TERM", "LAST", "COMMIT", "READY", "HEALTH", "LAST ACK"],
                &rows,
            );
            for m in members.iter().filter(|m| m["ready"].as_bool() != Some(true)) {
                eprintln!("node {} not ready: {}", cell(m, "id"), cell(m, "ready_reason"));
            }
            for (addr, e) in &views.unreachable {
                eprintln!("fencer: {addr} did not answer: {e}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
