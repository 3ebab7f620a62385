//! `fencer top`: the busiest resources of the cluster, as the leader counts
//! them (bounded, approximate: see docs/operations.md, "Hot resources").

use std::process::ExitCode;
use std::time::Duration;

use fencer_coordinator::HotResources;
use hyper::Method;

use super::lock::ClientArgs;
use super::{node_http, parse_duration};
use crate::output::{OutputFormat, out, outln, print_json, print_table};

/// How long one node may take to answer.
const TIMEOUT: Duration = Duration::from_secs(5);

/// The order of `fencer top`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum TopOrder {
    /// Decayed rate of acquire entries (granted, queued or refused).
    Acquires,
    /// Requests queued now.
    Waiters,
    /// How long the current holder has held the lock.
    Hold,
}

impl TopOrder {
    fn as_str(self) -> &'static str {
        match self {
            Self::Acquires => "acquires",
            Self::Waiters => "waiters",
            Self::Hold => "hold",
        }
    }
}

/// Arguments of `fencer top`.
#[derive(Debug, clap::Args)]
pub(crate) struct TopArgs {
    /// Order by.
    #[arg(long, value_enum, default_value_t = TopOrder::Acquires)]
    by: TopOrder,

    /// Resources to show (at most the tracker's capacity, 1,024 by default).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    limit: u64,

    /// Refresh every this long until interrupted (table output only).
    #[arg(long, value_parser = parse_duration)]
    watch: Option<Duration>,

    #[command(flatten)]
    client: ClientArgs,
}

/// The leader's address as the first answering endpoint knows it (or that
/// endpoint itself when no leader is known): every node counts what it
/// applies, but the leader's view is the freshest.
async fn pick_node(auth: &node_http::HttpAuth, endpoints: &[String]) -> anyhow::Result<String> {
    let mut last = None;
    for ep in endpoints {
        match node_http::call_with(auth, Method::GET, ep, "/v1/status", None, TIMEOUT).await {
            Ok(status) => {
                return Ok(status["leader_addr"].as_str().filter(|a| !a.is_empty()).unwrap_or(ep).to_string());
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("no endpoint given")))
}

async fn fetch(args: &TopArgs) -> anyhow::Result<HotResources> {
    let auth = args.client.http_auth()?;
    let node = pick_node(&auth, &args.client.endpoints).await?;
    let path = format!("/v1/admin/hot?by={}&limit={}", args.by.as_str(), args.limit);
    let v = match node_http::call_with(&auth, Method::GET, &node, &path, None, TIMEOUT).await {
        Ok(v) => v,
        // The leader moved or is unreachable: any node will do.
        Err(_) => node_http::call_with(&auth, Method::GET, &args.client.endpoints[0], &path, None, TIMEOUT).await?,
    };
    Ok(serde_json::from_value(v)?)
}

fn secs(s: Option<f64>) -> String {
    match s {
        None => "-".into(),
        Some(s) if s < 60.0 => format!("{s:.1}s"),
        Some(s) if s < 3600.0 => format!("{:.1}m", s / 60.0),
        Some(s) => format!("{:.1}h", s / 3600.0),
    }
}

fn print(hot: &HotResources) {
    outln!(
        "node {}  by {}  tracking {} of {} resources  rates decay with a {:.0}s half-life",
        hot.node_id,
        hot.by,
        hot.tracked,
        hot.capacity,
        hot.half_life_secs
    );
    let rows: Vec<Vec<String>> = hot
        .resources
        .iter()
        .map(|r| {
            vec![
                r.resource.clone(),
                format!("{:.2}", r.acquires_per_sec),
                format!("±{:.2}", r.error_per_sec),
                r.waiters.to_string(),
                r.holder.clone().unwrap_or_else(|| "-".into()),
                r.token.map_or_else(|| "-".into(), |t| t.to_string()),
                secs(r.held_for_secs),
                secs(r.mean_hold_secs),
            ]
        })
        .collect();
    print_table(&["RESOURCE", "ACQ/S", "ERROR", "WAITERS", "HOLDER", "TOKEN", "HELD FOR", "MEAN HOLD"], &rows);
}

pub(crate) async fn run(args: TopArgs) -> anyhow::Result<ExitCode> {
    match (args.watch, args.client.output) {
        (Some(every), OutputFormat::Table) => loop {
            let hot = fetch(&args).await;
            // Clear the screen and go home, as top does.
            out!("\x1b[2J\x1b[H");
            match hot {
                Ok(hot) => print(&hot),
                Err(e) => outln!("fencer: {e:#}"),
            }
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                _ = tokio::signal::ctrl_c() => return Ok(ExitCode::SUCCESS),
            }
        },
        (_, OutputFormat::Json) => print_json(&fetch(&args).await?)?,
        (None, OutputFormat::Table) => print(&fetch(&args).await?),
    }
    Ok(ExitCode::SUCCESS)
}
