//! `fencer acquire | renew | release | get | list | force-release`: the lock
//! API from the command line. Data goes to stdout (a table, or one JSON object
//! with `-o json`); errors go to stderr (and, with `-o json`, also as a JSON
//! error object on stdout). Exit codes are in `exit`.

use std::process::ExitCode;
use std::time::Duration;

use fencer_client::{AcquireError, Client, ClientError, GetLockResponse};
use serde_json::{Value, json};

pub(crate) use super::client_args::ClientArgs;
use super::parse_duration;
use crate::exit;
use crate::output::{OutputFormat, outln, print_json, print_table};

/// Prints a client error (stderr; and stdout as JSON with `-o json`) and
/// returns its exit code.
pub(crate) fn fail(output: OutputFormat, e: &ClientError) -> ExitCode {
    report(output, e);
    exit::for_error(e)
}

/// Prints a client error: stderr, and stdout as JSON with `-o json`.
pub(crate) fn report(output: OutputFormat, e: &ClientError) {
    let (reason, metadata) = match e {
        ClientError::Refused { reason, metadata, .. } => (reason.as_str().to_string(), metadata.clone()),
        ClientError::Unavailable { reason, metadata, .. } => {
            (reason.as_ref().map_or("UNAVAILABLE", |r| r.as_str()).to_string(), metadata.clone())
        }
        ClientError::Config(_) => ("CONFIG".to_string(), Default::default()),
    };
    eprintln!("fencer: {e} ({reason})");
    if output == OutputFormat::Json {
        let _ = print_json(&json!({ "error": { "reason": reason, "message": e.to_string(), "metadata": metadata } }));
    }
}

/// Prints `value` as JSON, or its fields as `key  value` lines.
fn show(output: OutputFormat, value: &Value) -> anyhow::Result<()> {
    match output {
        OutputFormat::Json => print_json(value),
        OutputFormat::Table => {
            if let Value::Object(map) = value {
                let rows: Vec<Vec<String>> = map
                    .iter()
                    .map(|(k, v)| vec![k.clone(), v.as_str().map_or_else(|| v.to_string(), str::to_string)])
                    .collect();
                for row in rows {
                    outln!("{:<20} {}", row[0], row[1]);
                }
            }
            Ok(())
        }
    }
}

/// How to take a lock: shared by `fencer acquire` and `fencer exec`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct LockArgs {
    /// Lease length (`500ms`, `30s`, `5m`); the server's bounds apply.
    #[arg(long, env = "FENCER_TTL", value_parser = parse_duration, default_value = "30s")]
    pub(crate) ttl: Duration,
    /// Wait up to this long in the FIFO queue when the lock is held; 0 tries once.
    #[arg(long, env = "FENCER_WAIT", value_parser = parse_duration, default_value = "0s")]
    pub(crate) wait: Duration,
    /// Keep retrying an unknown outcome (same request id) this long when not
    /// waiting longer anyway.
    #[arg(long, env = "FENCER_RETRY_BUDGET", value_parser = parse_duration, default_value = "10s")]
    pub(crate) retry_budget: Duration,
    /// Who holds the lock, for humans and the audit log (default: user@host/pid).
    #[arg(long, env = "FENCER_HOLDER")]
    pub(crate) holder: Option<String>,
}

impl LockArgs {
    /// An acquire of `resource` configured by these flags.
    pub(crate) fn acquire(&self, client: &Client, resource: &str) -> fencer_client::AcquireBuilder {
        client
            .acquire(resource)
            .ttl(self.ttl)
            .wait(self.wait)
            .retry_budget(self.retry_budget)
            .holder(self.holder.clone().unwrap_or_else(fencer_client::default_holder))
    }
}

/// Arguments of `fencer acquire`.
#[derive(Debug, clap::Args)]
pub(crate) struct AcquireArgs {
    /// The resource to lock, e.g. `orders/42`.
    resource: String,
    #[command(flatten)]
    lock: LockArgs,
    /// The attempt's request id (8–128 printable ASCII bytes); reuse it to retry
    /// safely. Generated when absent.
    #[arg(long)]
    request_id: Option<String>,
    #[command(flatten)]
    client: ClientArgs,
}

/// Prints an acquire failure (see [`report`]); an unknown outcome also names
/// the request id to retry with, and a refused `--ttl` or `--wait` is
/// restated in the units the flag was given in ([`bounds_hint`]).
pub(crate) fn report_acquire(output: OutputFormat, e: &AcquireError, lock: &LockArgs) {
    if let AcquireError::Unavailable { request_id, .. } = e {
        eprintln!("fencer: the outcome is unknown; retry with --request-id {request_id} to learn it");
    }
    match bounds_hint(e.client_error(), lock) {
        // The flag in its units instead of the wire's milliseconds.
        Some(hint) => {
            eprintln!("fencer: {hint} (INVALID_ARGUMENT)");
            if output == OutputFormat::Json {
                let e = e.client_error();
                let _ = print_json(
                    &json!({ "error": { "reason": "INVALID_ARGUMENT", "message": hint, "metadata": e.metadata() } }),
                );
            }
        }
        None => report(output, e.client_error()),
    }
}

/// A ttl or wait the coordinator refused, said with the flag and in its
/// units (`--wait 10m is above the coordinator's maximum of 5m`), from the
/// bounds the refusal carries (metadata `max_ms`, `min_ms`), not in the
/// milliseconds of the wire.
pub(crate) fn bounds_hint(e: &ClientError, lock: &LockArgs) -> Option<String> {
    let ClientError::Refused { reason: fencer_client::Reason::InvalidArgument, metadata, .. } = e else {
        return None;
    };
    let ms = |key: &str| metadata.get(key).and_then(|v| v.parse::<u64>().ok()).map(Duration::from_millis);
    let human = |d: Duration| humantime::format_duration(d).to_string().replace(' ', "");
    let (flag, given) = match metadata.get("field").map(String::as_str) {
        Some("ttl_ms") => ("--ttl", lock.ttl),
        Some("wait_timeout_ms") => ("--wait", lock.wait),
        _ => return None,
    };
    let max = ms("max_ms")?;
    Some(match ms("min_ms") {
        Some(min) if given < min || given > max => format!(
            "{flag} {} is outside the coordinator's bounds: at least {}, at most {}",
            human(given),
            human(min),
            human(max)
        ),
        _ if given > max => format!("{flag} {} is above the coordinator's maximum of {}", human(given), human(max)),
        _ => return None,
    })
}

pub(crate) async fn acquire(args: AcquireArgs) -> anyhow::Result<ExitCode> {
    let client = args.client.client()?;
    let mut acquire = args.lock.acquire(&client, &args.resource);
    if let Some(id) = args.request_id {
        acquire = acquire.request_id(id);
    }
    // The bare grant: the CLI exits, so nothing would renew a Lease.
    match acquire.grant().await {
        Ok(g) => {
            show(
                args.client.output,
                &json!({
                    "resource": g.resource,
                    "lease_id": g.lease_id.to_string(),
                    "fencing_token": g.token.get(),
                    "ttl_ms": g.ttl.as_millis() as u64,
                    "expires_at_unix_ms": g.expires_at_unix_ms,
                    "waited": g.waited,
                    "request_id": g.request_id,
                    "signed_token": g.signed_token,
                }),
            )?;
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            report_acquire(args.client.output, &e, &args.lock);
            Ok(exit::for_error(e.client_error()))
        }
    }
}

/// Arguments of `fencer renew` and `fencer release`.
#[derive(Debug, clap::Args)]
pub(crate) struct LeaseArgs {
    /// The locked resource.
    resource: String,
    /// The lease id printed by `fencer acquire`.
    #[arg(long, env = "FENCER_LEASE_ID")]
    lease: String,
    #[command(flatten)]
    client: ClientArgs,
}

pub(crate) async fn renew(args: LeaseArgs) -> anyhow::Result<ExitCode> {
    let client = args.client.client()?;
    match client.renew(&args.resource, &args.lease).await {
        Ok(r) => {
            show(
                args.client.output,
                &json!({ "resource": args.resource, "fencing_token": r.fencing_token, "ttl_ms": r.ttl_ms, "expires_at_unix_ms": r.expires_at_unix_ms }),
            )?;
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => Ok(fail(args.client.output, &e)),
    }
}

pub(crate) async fn release(args: LeaseArgs) -> anyhow::Result<ExitCode> {
    let client = args.client.client()?;
    match client.release(&args.resource, &args.lease).await {
        Ok(r) => {
            show(
                args.client.output,
                &json!({ "resource": args.resource, "released": r.released, "was_holder": r.was_holder }),
            )?;
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => Ok(fail(args.client.output, &e)),
    }
}

/// Arguments of `fencer get`.
#[derive(Debug, clap::Args)]
pub(crate) struct GetArgs {
    /// The resource.
    resource: String,
    #[command(flatten)]
    client: ClientArgs,
}

fn lock_json(l: &GetLockResponse) -> Value {
    json!({
        "resource": l.resource,
        "held": l.held,
        "holder": l.holder,
        "fencing_token": l.fencing_token,
        "waiters": l.waiters,
        "remaining_ttl_ms": l.remaining_ttl_ms,
        "ttl_ms": l.ttl_ms,
    })
}

pub(crate) async fn get(args: GetArgs) -> anyhow::Result<ExitCode> {
    let client = args.client.client()?;
    match client.get(&args.resource).await {
        Ok(l) => {
            show(args.client.output, &lock_json(&l))?;
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => Ok(fail(args.client.output, &e)),
    }
}

/// Arguments of `fencer list`.
#[derive(Debug, clap::Args)]
pub(crate) struct ListArgs {
    /// Only resources whose name starts with this.
    #[arg(long, default_value = "")]
    prefix: String,
    /// Locks per page (at most 1000).
    #[arg(long, default_value_t = 100)]
    page_size: u32,
    /// Continue after this page token.
    #[arg(long, default_value = "")]
    page_token: String,
    /// Follow every page (bounded by --max-locks).
    #[arg(long)]
    all: bool,
    /// With --all, stop after this many locks.
    #[arg(long, default_value_t = 100_000)]
    max_locks: usize,
    #[command(flatten)]
    client: ClientArgs,
}

pub(crate) async fn list(args: ListArgs) -> anyhow::Result<ExitCode> {
    let client = args.client.client()?;
    let mut locks = Vec::new();
    let mut token = args.page_token.clone();
    loop {
        match client.list(&args.prefix, args.page_size, &token).await {
            Ok(page) => {
                locks.extend(page.locks);
                token = page.next_page_token;
            }
            Err(e) => return Ok(fail(args.client.output, &e)),
        }
        if !args.all || token.is_empty() || locks.len() >= args.max_locks {
            break;
        }
    }
    match args.client.output {
        OutputFormat::Json => print_json(&json!({
            "locks": locks.iter().map(lock_json).collect::<Vec<_>>(),
            "next_page_token": token,
        }))?,
        OutputFormat::Table => {
            let rows: Vec<Vec<String>> = locks
                .iter()
                .map(|l| {
                    vec![
                        l.resource.clone(),
                        l.fencing_token.to_string(),
                        l.holder.clone(),
                        l.waiters.to_string(),
                        format!("{:.1}s", l.remaining_ttl_ms as f64 / 1000.0),
                    ]
                })
                .collect();
            print_table(&["RESOURCE", "TOKEN", "HOLDER", "WAITERS", "REMAINING"], &rows);
            if !token.is_empty() {
                eprintln!("more: --page-token {token}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Arguments of `fencer force-release`.
#[derive(Debug, clap::Args)]
pub(crate) struct ForceReleaseArgs {
    /// The resource to free, whoever holds it.
    resource: String,
    /// Why (recorded in the server's log and audit trail).
    #[arg(long)]
    reason: String,
    /// Who asks (default: $USER).
    #[arg(long)]
    caller: Option<String>,
    #[command(flatten)]
    client: ClientArgs,
}

pub(crate) async fn force_release(args: ForceReleaseArgs) -> anyhow::Result<ExitCode> {
    let client = args.client.client()?;
    let caller = args.caller.unwrap_or_else(|| std::env::var("USER").unwrap_or_else(|_| "unknown".into()));
    match client.force_release(&args.resource, &caller, &args.reason).await {
        Ok(r) => {
            show(
                args.client.output,
                &json!({ "resource": args.resource, "released": r.released, "released_token": r.released_token, "log_index": r.log_index }),
            )?;
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => Ok(fail(args.client.output, &e)),
    }
}
