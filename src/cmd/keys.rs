//! `fencer keys list | export | rotate | retire`: the cluster's
//! token-signing keys (DESIGN P7, docs/security.md "Rotation").
//!
//! Secrets never leave the node that made them; these commands see and move
//! only public keys. `export` writes exactly the key-set file proxies load
//! (`[signing] keys_file`): every registered key, retired or not yet valid
//! included, so every token any leader ever signed still finds its key.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, UNIX_EPOCH};

use fencer_coordinator::SigningKeyView;
use serde_json::json;

use super::lock::{ClientArgs, fail};
use super::parse_duration;
use crate::exit;
use crate::output::{OutputFormat, out, print_json, print_table};

/// Arguments of `fencer keys`.
#[derive(Debug, clap::Args)]
pub(crate) struct KeysArgs {
    #[command(subcommand)]
    step: Step,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Debug, clap::Subcommand)]
enum Step {
    /// The registered keys: id, node, public key, validity, which one each node signs with now.
    List,
    /// Write the proxies' key-set file (JSON, `[signing] keys_file`) to stdout or --out.
    Export {
        /// Write the file here (atomically, mode 0644) instead of stdout.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Have a node make a new key and register it; it signs from --activate-in on.
    /// Export and reload every proxy before it activates.
    Rotate {
        /// The node whose key to rotate (default: the leader).
        #[arg(long)]
        node: Option<u64>,
        /// How long until the new key is used: time to give every proxy the new key set.
        #[arg(long, value_parser = parse_duration, default_value = "1h")]
        activate_in: Duration,
    },
    /// End a key's validity; tokens it signed are refused from then on (expired_key).
    Retire {
        /// The key id (see `fencer keys list`).
        kid: String,
        /// How long from now the key stays valid: at least the longest time a
        /// lock it signed may still be held. `0s` ends it at once (a compromised key).
        #[arg(long, value_parser = parse_duration)]
        after: Duration,
        /// Retire even if its node is left without a valid key (its grants are then unsigned).
        #[arg(long)]
        force: bool,
    },
}

fn time(ms: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

fn show_keys(output: OutputFormat, keys: &[SigningKeyView]) -> anyhow::Result<()> {
    match output {
        OutputFormat::Json => print_json(&json!({ "keys": keys })),
        OutputFormat::Table => {
            let rows: Vec<Vec<String>> = keys
                .iter()
                .map(|k| {
                    vec![
                        k.kid.clone(),
                        k.node_id.to_string(),
                        k.public_key.clone(),
                        time(k.not_before_unix_ms),
                        k.not_after_unix_ms.map_or_else(|| "-".into(), time),
                        if k.current { "yes".into() } else { String::new() },
                    ]
                })
                .collect();
            print_table(&["KID", "NODE", "PUBLIC KEY", "NOT BEFORE", "NOT AFTER", "CURRENT"], &rows);
            Ok(())
        }
    }
}

pub(crate) async fn run(args: KeysArgs) -> anyhow::Result<ExitCode> {
    let output = args.client.output;
    let client = args.client.client()?;
    match args.step {
        Step::List => match client.signing_keys().await {
            Ok(r) => {
                show_keys(output, &r.keys.iter().map(SigningKeyView::from).collect::<Vec<_>>())?;
                Ok(ExitCode::SUCCESS)
            }
            Err(e) => Ok(fail(output, &e)),
        },
        Step::Export { out } => {
            let r = match client.signing_keys().await {
                Ok(r) => r,
                Err(e) => return Ok(fail(output, &e)),
            };
            let views: Vec<SigningKeyView> = r.keys.iter().map(SigningKeyView::from).collect();
            let set = match fencer_coordinator::key_set(&views) {
                Ok(set) => set,
                Err(e) => {
                    eprintln!("fencer: the registered keys do not make a valid key set: {e}");
                    return Ok(ExitCode::from(exit::ERROR));
                }
            };
            if set.keys.is_empty() {
                eprintln!("fencer: warning: no signing key is registered yet; proxies would refuse every signed token");
            }
            match out {
                Some(path) => {
                    if let Err(e) = set.write(&path) {
                        eprintln!("fencer: cannot write {}: {e}", path.display());
                        return Ok(ExitCode::from(exit::ERROR));
                    }
                    let kids: Vec<&str> = set.keys.iter().map(|k| k.kid.as_str()).collect();
                    eprintln!("fencer: wrote {} key(s) to {}: {}", kids.len(), path.display(), kids.join(", "));
                }
                None => out!("{}", set.to_json()),
            }
            Ok(ExitCode::SUCCESS)
        }
        Step::Rotate { node, activate_in } => {
            let status = match super::member::leader(&client).await {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("fencer: cannot find the leader: {e}");
                    return Ok(ExitCode::from(exit::UNAVAILABLE));
                }
            };
            let (id, addr) = match node {
                None => (status.node_id, status.leader_addr.clone()),
                Some(n) => match status.members.iter().find(|m| m.id == n) {
                    Some(m) => (n, m.addr.clone()),
                    None => {
                        let ids: Vec<String> = status.members.iter().map(|m| m.id.to_string()).collect();
                        eprintln!("fencer: node {n} is not a member (members: {})", ids.join(", "));
                        return Ok(ExitCode::from(exit::INVALID));
                    }
                },
            };
            match client.rotate_signing_key_on(&addr, id, activate_in).await {
                Ok(r) => {
                    let key = r.key.as_ref().map(SigningKeyView::from);
                    if output == OutputFormat::Table {
                        eprintln!(
                            "fencer: node {id} made a new key; export the key set and reload every proxy before it activates"
                        );
                    }
                    show_keys(output, &key.into_iter().collect::<Vec<_>>())?;
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => Ok(fail(output, &e)),
            }
        }
        Step::Retire { kid, after, force } => match client.retire_signing_key(&kid, after, force).await {
            Ok(r) => {
                show_keys(output, &r.key.as_ref().map(SigningKeyView::from).into_iter().collect::<Vec<_>>())?;
                Ok(ExitCode::SUCCESS)
            }
            Err(e) => Ok(fail(output, &e)),
        },
    }
}
