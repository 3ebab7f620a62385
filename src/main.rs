//! `fencer`: one binary for the coordinator, the sidecar proxy, the embedded
//! single-node default and the operator/user CLI. Each subcommand lives in its
//! own module under `cmd/`; this file only parses arguments and dispatches.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cmd;
mod output;

/// A distributed lock service with fencing tokens.
#[derive(Debug, Parser)]
#[command(name = "fencer", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,

    /// Log filter (tracing env-filter syntax), e.g. `info` or `fencer=debug`.
    #[arg(long, global = true, env = "FENCER_LOG", default_value = "info")]
    log: String,

    /// Log format on stderr.
    #[arg(long, global = true, env = "FENCER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Sidecar proxy: fence writes in front of a database (DESIGN §4).
    Proxy(cmd::proxy::ProxyArgs),
    /// Show the proxy's rejected-write log.
    Rejections(cmd::proxy::RejectionsArgs),
    /// Show the proxy's per-resource state.
    ProxyStatus(cmd::proxy::ProxyStatusArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(&cli.log, cli.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fencer: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Proxy(args) => cmd::proxy::run_proxy(args).await,
            Command::Rejections(args) => cmd::proxy::run_rejections(args).await,
            Command::ProxyStatus(args) => cmd::proxy::run_proxy_status(args).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("fencer: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn init_tracing(filter: &str, format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_new(filter).unwrap_or_else(|e| {
        eprintln!("fencer: bad --log filter {filter:?} ({e}); using `info`");
        EnvFilter::new("info")
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
