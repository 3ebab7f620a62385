//! `fencer member add-learner | promote | remove`: change the voters of a
//! cluster, one safe step at a time (docs/cluster.md, "Replacing a node").
//! Every step goes to the leader, found through the given endpoints.

use std::process::ExitCode;

use fencer_client::{Client, ClientError, NodeStatus, StatusResponse};
use fencer_proto::v1::MembershipResponse;
use serde_json::json;

use super::lock::ClientArgs;
use crate::exit;
use crate::output::{OutputFormat, outln, print_json, print_table};

/// Arguments of `fencer member`.
#[derive(Debug, clap::Args)]
pub(crate) struct MemberArgs {
    #[command(subcommand)]
    step: Step,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Debug, clap::Subcommand)]
enum Step {
    /// Add a running, pristine node as a learner; returns once it caught up.
    /// Start it first with `fencer coordinator --id ID --peers <members>,ID=ADDR`.
    AddLearner {
        /// The new node's id (unused in the cluster).
        id: u64,
        /// The address members reach it at, `host:port`.
        addr: String,
    },
    /// Make a learner a voter.
    Promote {
        /// The learner's id.
        id: u64,
    },
    /// Remove a node (voter or learner) from the cluster. Stop it afterwards.
    Remove {
        /// The node's id.
        id: u64,
    },
}

/// Finds the leader's status through the endpoints (asking the leader a
/// follower names, too).
pub(crate) async fn leader(client: &Client) -> Result<StatusResponse, String> {
    let mut last = String::from("no endpoint answered");
    for ep in client.endpoints() {
        match client.node_status(ep).await {
            Ok(s) if s.state == "leader" => return Ok(s),
            Ok(s) if s.has_leader && !s.leader_addr.is_empty() => match client.node_status(&s.leader_addr).await {
                Ok(l) if l.state == "leader" => return Ok(l),
                Ok(_) => last = format!("{} does not answer as leader", s.leader_addr),
                Err(e) => last = format!("the leader {} did not answer: {e}", s.leader_addr),
            },
            Ok(s) => last = format!("{ep} knows no leader (it is {})", s.state),
            Err(e) => last = format!("{ep}: {e}"),
        }
    }
    Err(last)
}

fn voters(members: &[NodeStatus]) -> Vec<u64> {
    members.iter().filter(|m| m.role == "voter").map(|m| m.id).collect()
}

pub(crate) async fn run(args: MemberArgs) -> anyhow::Result<ExitCode> {
    let output = args.client.output;
    let client = args.client.client()?;
    let leader = match leader(&client).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("fencer: cannot find the leader: {e}");
            return Ok(ExitCode::from(exit::UNAVAILABLE));
        }
    };
    let at = leader.leader_addr.as_str();
    let current = voters(&leader.members);
    let result = match args.step {
        Step::AddLearner { id, addr } => {
            if leader.members.iter().any(|m| m.id == id) {
                eprintln!("fencer: node {id} is already a member");
                return Ok(ExitCode::from(exit::INVALID));
            }
            client.add_learner(at, id, &addr).await
        }
        Step::Promote { id } => {
            match leader.members.iter().find(|m| m.id == id) {
                None => {
                    eprintln!("fencer: node {id} is not a member; add it as a learner first");
                    return Ok(ExitCode::from(exit::INVALID));
                }
                Some(m) if m.role == "voter" => {
                    eprintln!("fencer: node {id} is already a voter");
                    return Ok(ExitCode::from(exit::INVALID));
                }
                Some(_) => {}
            }
            let mut voters = current.clone();
            voters.push(id);
            client.change_membership(at, voters, false).await
        }
        Step::Remove { id } => {
            if !leader.members.iter().any(|m| m.id == id) {
                eprintln!("fencer: node {id} is not a member");
                return Ok(ExitCode::from(exit::INVALID));
            }
            let voters: Vec<u64> = current.iter().copied().filter(|v| *v != id).collect();
            if voters.is_empty() {
                eprintln!("fencer: refusing to remove the last voter");
                return Ok(ExitCode::from(exit::INVALID));
            }
            client.change_membership(at, voters, false).await
        }
    };
    match result {
        Ok(r) => {
            show(output, &r)?;
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("fencer: {}: {e}", leader.leader_addr);
            let code = match &e {
                ClientError::Unavailable { .. } => exit::UNAVAILABLE,
                ClientError::Refused {
                    code: tonic::Code::InvalidArgument | tonic::Code::FailedPrecondition, ..
                } => exit::INVALID,
                _ => exit::ERROR,
            };
            if output == OutputFormat::Json {
                let c = match &e {
                    ClientError::Refused { code, .. } => format!("{code:?}"),
                    ClientError::Unavailable { .. } => "Unavailable".into(),
                    ClientError::Config(_) => "Config".into(),
                };
                print_json(&json!({"error": {"code": c, "message": e.to_string()}}))?;
            }
            Ok(ExitCode::from(code))
        }
    }
}

fn show(output: OutputFormat, r: &MembershipResponse) -> anyhow::Result<()> {
    match output {
        OutputFormat::Json => print_json(&json!({
            "log_index": r.log_index,
            "members": r.members.iter().map(|m| json!({"id": m.id, "addr": m.addr, "role": m.role})).collect::<Vec<_>>(),
        })),
        OutputFormat::Table => {
            outln!("membership committed at log index {}", r.log_index);
            let rows: Vec<Vec<String>> =
                r.members.iter().map(|m| vec![m.id.to_string(), m.addr.clone(), m.role.clone()]).collect();
            print_table(&["NODE", "ADDRESS", "ROLE"], &rows);
            Ok(())
        }
    }
}
