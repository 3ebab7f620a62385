//! `fencer status`: the cluster as each reachable node sees it.

use std::process::ExitCode;

use fencer_client::StatusResponse;
use serde_json::json;

use super::lock::{ClientArgs, fail};
use crate::output::{OutputFormat, print_json, print_table};

/// Arguments of `fencer status`.
#[derive(Debug, clap::Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    client: ClientArgs,
}

fn node_json(s: &StatusResponse) -> serde_json::Value {
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
        "version": s.version,
        "members": s.members.iter().map(|m| json!({
            "id": m.id, "addr": m.addr, "role": m.role, "matched_index": m.matched_index,
            "last_ack_ms": m.last_ack_ms, "health": m.health,
        })).collect::<Vec<_>>(),
    })
}

pub(crate) async fn run(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let client = args.client.client()?;
    let mut views = Vec::new();
    let mut last_err = None;
    for ep in client.endpoints() {
        match client.node_status(ep).await {
            Ok(s) => views.push((ep.clone(), s)),
            Err(e) => {
                eprintln!("fencer: {ep}: {e}");
                last_err = Some(e);
            }
        }
    }
    // Ask the leader too when the endpoints did not include it.
    if let Some(leader_addr) = views.iter().find(|(_, s)| s.has_leader).map(|(_, s)| s.leader_addr.clone())
        && !leader_addr.is_empty()
        && !views.iter().any(|(ep, _)| *ep == leader_addr)
        && let Ok(s) = client.node_status(&leader_addr).await
    {
        views.push((leader_addr, s));
    }
    if views.is_empty() {
        return Ok(match last_err {
            Some(e) => fail(args.client.output, &e),
            None => ExitCode::from(crate::exit::UNAVAILABLE),
        });
    }
    // The leader's view of members is the authoritative one (it has health).
    let best = views.iter().find(|(_, s)| s.state == "leader").unwrap_or(&views[0]).1.clone();
    match args.client.output {
        OutputFormat::Json => print_json(&json!({
            "cluster_id": best.cluster_id,
            "leader_id": if best.has_leader { Some(best.leader_id) } else { None },
            "leader_addr": best.leader_addr,
            "term": best.term,
            "last_log_index": best.last_log_index,
            "commit_index": best.commit_index,
            "members": node_json(&best)["members"],
            "nodes": views.iter().map(|(ep, s)| json!({"endpoint": ep, "status": node_json(s)})).collect::<Vec<_>>(),
        }))?,
        OutputFormat::Table => {
            println!(
                "cluster {}  leader {}  term {}  last index {}  commit index {}  locks {}  waiters {}",
                best.cluster_id,
                if best.has_leader { format!("{} ({})", best.leader_id, best.leader_addr) } else { "none".into() },
                best.term,
                best.last_log_index,
                best.commit_index,
                best.locks_held,
                best.waiters,
            );
            let rows: Vec<Vec<String>> = best
                .members
                .iter()
                .map(|m| {
                    let state =
                        views.iter().find(|(_, s)| s.node_id == m.id).map_or("?".to_string(), |(_, s)| s.state.clone());
                    vec![
                        m.id.to_string(),
                        m.addr.clone(),
                        m.role.clone(),
                        state,
                        m.health.clone(),
                        m.matched_index.to_string(),
                        if m.last_ack_ms < 0 { "-".into() } else { format!("{}ms", m.last_ack_ms) },
                    ]
                })
                .collect();
            print_table(&["NODE", "ADDRESS", "ROLE", "STATE", "HEALTH", "MATCHED", "LAST ACK"], &rows);
        }
    }
    Ok(ExitCode::SUCCESS)
}
