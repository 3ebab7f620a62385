//! `fencer log-level`: read or change the log filter of a running
//! coordinator node or proxy, and [`LogFilter`], the reloadable filter the
//! binary installs and hands to both (their `/v1/admin/log-level` and
//! `/v1/log-level` endpoints).

use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::Method;
use serde_json::json;
use tracing_subscriber::reload;
use tracing_subscriber::{EnvFilter, Registry};

use super::node_http;
use crate::output::{OutputFormat, outln, print_json};

/// The process's log filter, replaceable at run time. It reports the
/// filter as the operator wrote it.
pub(crate) struct LogFilter {
    handle: reload::Handle<EnvFilter, Registry>,
    text: Mutex<String>,
}

impl LogFilter {
    pub(crate) fn new(handle: reload::Handle<EnvFilter, Registry>, text: &str) -> Arc<Self> {
        Arc::new(Self { handle, text: Mutex::new(text.to_string()) })
    }

    fn current(&self) -> String {
        self.text.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set(&self, filter: &str) -> Result<(), String> {
        let parsed = EnvFilter::try_new(filter).map_err(|e| format!("{filter:?} is not a log filter: {e}"))?;
        let mut text = self.text.lock().unwrap_or_else(|p| p.into_inner());
        self.handle.reload(parsed).map_err(|e| e.to_string())?;
        *text = filter.to_string();
        Ok(())
    }
}

impl fencer_coordinator::LogControl for LogFilter {
    fn current(&self) -> String {
        LogFilter::current(self)
    }

    fn set(&self, filter: &str) -> Result<(), String> {
        LogFilter::set(self, filter)
    }
}

impl fencer_proxy::LogControl for LogFilter {
    fn current(&self) -> String {
        LogFilter::current(self)
    }

    fn set(&self, filter: &str) -> Result<(), String> {
        LogFilter::set(self, filter)
    }
}

/// Arguments of `fencer log-level`.
#[derive(Debug, clap::Args)]
#[command(group = clap::ArgGroup::new("target").required(true))]
pub(crate) struct LogLevelArgs {
    /// The new filter (tracing env-filter syntax, e.g. `info` or
    /// `info,fencer_coordinator=debug`); without it, print the filter in force.
    filter: Option<String>,

    /// A coordinator node, host:port (its main or status port). The change
    /// applies to that node only.
    #[arg(long, group = "target", env = "FENCER_NODE")]
    node: Option<String>,

    /// A proxy's admin address, host:port.
    #[arg(long, group = "target")]
    proxy_admin: Option<String>,

    /// Output format.
    #[arg(short = 'o', long = "output", env = "FENCER_OUTPUT", value_enum, default_value_t)]
    output: OutputFormat,
}

const TIMEOUT: Duration = Duration::from_secs(5);

pub(crate) async fn run(args: LogLevelArgs) -> anyhow::Result<ExitCode> {
    let body = args.filter.as_ref().map(|filter| json!({ "filter": filter }));
    let method = if body.is_some() { Method::PUT } else { Method::GET };
    let answer = match (&args.node, &args.proxy_admin) {
        (Some(node), _) => node_http::call(method, node, "/v1/admin/log-level", body.as_ref(), TIMEOUT).await?,
        // The proxy's admin token, when it has one, from the file named by
        // FENCER_PROXY_ADMIN_TOKEN_FILE (as `fencer rejections` reads it).
        (None, Some(proxy)) => {
            let auth = node_http::HttpAuth { tls: None, bearer: fencer_proxy::admin_token_from_env()? };
            node_http::call_with(&auth, method, proxy, "/v1/log-level", body.as_ref(), TIMEOUT).await?
        }
        (None, None) => anyhow::bail!("give --node or --proxy-admin"),
    };
    match args.output {
        OutputFormat::Json => print_json(&answer)?,
        OutputFormat::Table => {
            outln!("{}", answer["filter"].as_str().unwrap_or_default());
            if let Some(previous) = answer["previous"].as_str() {
                eprintln!("was: {previous}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
