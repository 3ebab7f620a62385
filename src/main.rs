//! `fencer`: one binary for the coordinator, the sidecar proxy, the embedded
//! single-node default and the operator/user CLI. Each subcommand lives in its
//! own module under `cmd/`; this file only parses arguments and dispatches.

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

mod allocator;
mod cmd;
mod exit;
mod log_limit;
mod output;

/// A distributed lock service with fencing tokens.
#[derive(Debug, Parser)]
#[command(name = "fencer", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,

    /// Log filter (tracing env-filter syntax), e.g. `info` or `fencer=debug`.
    /// A running coordinator or proxy changes it with `fencer log-level`.
    #[arg(long, global = true, env = "FENCER_LOG", default_value = "info,openraft=warn")]
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
    /// Run the embedded default: a single-node coordinator with a local data dir.
    Dev(cmd::dev::DevArgs),
    /// Run one node of a coordinator cluster.
    Coordinator(cmd::coordinator::CoordinatorArgs),
    /// Take a lock; prints the lease id and fencing token.
    Acquire(cmd::lock::AcquireArgs),
    /// Extend a lease by its ttl.
    Renew(cmd::lock::LeaseArgs),
    /// Give a lock up.
    Release(cmd::lock::LeaseArgs),
    /// Show one lock: holder, token, waiters, remaining ttl.
    Get(cmd::lock::GetArgs),
    /// List held locks.
    List(cmd::lock::ListArgs),
    /// Cluster status: members, leader, term, indexes, health, readiness.
    Status(cmd::status::StatusArgs),
    /// The busiest resources: by acquire rate, queue length or hold time.
    Top(cmd::top::TopArgs),
    /// Read a node's audit log, filtered by resource, lease, op or time.
    Audit(cmd::audit::AuditArgs),
    /// Read or change the log filter of a running coordinator or proxy.
    LogLevel(cmd::log_level::LogLevelArgs),
    /// Change the cluster's members: add-learner, promote, remove.
    Member(cmd::member::MemberArgs),
    /// Free a lock whoever holds it (operator action, audited).
    ForceRelease(cmd::lock::ForceReleaseArgs),
    /// Token-signing keys: list, export the proxies' key set, rotate, retire.
    Keys(cmd::keys::KeysArgs),
    /// Run a command while holding a lock; stop it if the lock is lost.
    #[command(after_help = "\
The command gets FENCER_RESOURCE, FENCER_TOKEN, FENCER_LEASE_ID and FENCER_SIGNED_TOKEN (empty when \
the grant carried no signed token). Exit status: the command's own \
(128 + N if signal N ended it), or fencer's: 203 not acquired, 204 lock lost while it ran, 205 \
unavailable, 206 invalid, 207 cannot start, 202 usage, 201 other. See docs/client.md.")]
    Exec(cmd::exec::ExecArgs),
    /// Print a shell completion script: `fencer completions bash`.
    Completions(cmd::completions::CompletionsArgs),
    /// Sidecar proxy: fence writes in front of a database (DESIGN §4).
    Proxy(cmd::proxy::ProxyArgs),
    /// Show the proxy's rejected-write log.
    Rejections(cmd::proxy::RejectionsArgs),
    /// Show the proxy's per-resource state.
    ProxyStatus(cmd::proxy::ProxyStatusArgs),
    /// Benchmark: the seed workload, open loop, on a local 3-node cluster (docs/performance.md).
    Bench(Box<fencer_bench::BenchArgs>),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            // A usage error of `exec` must not look like its command's status.
            let code = match e.exit_code() {
                0 => 0,
                _ if cmd::exec::is_exec_invocation(std::env::args_os()) => exit::exec::USAGE,
                _ => exit::USAGE,
            };
            return ExitCode::from(code);
        }
    };
    // A coordinator frees its whole state when it installs a snapshot
    // (module `allocator`); the proxy and the CLI keep mimalloc's default.
    let purge_delay =
        matches!(cli.command, Command::Coordinator(_) | Command::Dev(_)).then(allocator::purge_freed_memory_at_once);
    // `_log_windows` lives to the end of `main`: dropped, it reports the
    // log's last window of withheld repeats (module `log_limit`).
    let (log_filter, _log_windows) = match init_tracing(&cli.log, cli.log_format) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("fencer: {e}");
            return ExitCode::from(2);
        }
    };
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Command::Coordinator(args) = &cli.command {
        builder.worker_threads(args.worker_threads());
    }
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fencer: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    if let Some(purge_delay) = purge_delay {
        purge_delay.report(&runtime);
    }
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Dev(args) => cmd::dev::run(args, log_filter).await,
            Command::Coordinator(args) => cmd::coordinator::run(args, log_filter).await,
            Command::Acquire(args) => cmd::lock::acquire(args).await,
            Command::Renew(args) => cmd::lock::renew(args).await,
            Command::Release(args) => cmd::lock::release(args).await,
            Command::Get(args) => cmd::lock::get(args).await,
            Command::List(args) => cmd::lock::list(args).await,
            Command::Status(args) => cmd::status::run(args).await,
            Command::Top(args) => cmd::top::run(args).await,
            Command::Audit(args) => cmd::audit::run(args).await,
            Command::LogLevel(args) => cmd::log_level::run(args).await,
            Command::Member(args) => cmd::member::run(args).await,
            Command::ForceRelease(args) => cmd::lock::force_release(args).await,
            Command::Keys(args) => cmd::keys::run(args).await,
            Command::Exec(args) => cmd::exec::run(args).await,
            Command::Completions(args) => cmd::completions::run(args, Cli::command()),
            Command::Proxy(args) => cmd::proxy::run_proxy(args, log_filter).await,
            Command::Rejections(args) => cmd::proxy::run_rejections(args).await,
            Command::ProxyStatus(args) => cmd::proxy::run_proxy_status(args).await,
            Command::Bench(args) => fencer_bench::run(*args, cmd::shutdown_signal()).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(e) if output::is_broken_pipe(&e) => ExitCode::from(exit::CLOSED_PIPE),
        Err(e) => {
            eprintln!("fencer: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// Logs go to stderr, as text or JSON lines (with the fields of the spans
/// they happen in); a dependency's repeated warnings are counted rather
/// than all written (module `log_limit`; the guard returned ends its
/// windows). The filter sits in a `reload` layer so that a running
/// coordinator or proxy can change it (`fencer log-level`). Colours only
/// when stderr is a terminal, so log files and journald get plain text. A
/// filter that does not parse is a usage error, not a silent fallback.
fn init_tracing(
    filter: &str,
    format: LogFormat,
) -> Result<(std::sync::Arc<cmd::log_level::LogFilter>, log_limit::Windows), String> {
    use std::io::IsTerminal;
    use tracing_subscriber::prelude::*;
    use tracing_subscriber::{EnvFilter, fmt, reload};
    let parsed = EnvFilter::try_new(filter).map_err(|e| format!("bad --log filter {filter:?}: {e}"))?;
    let (layer, handle) = reload::Layer::new(parsed);
    let limit = log_limit::RepeatLimit::default();
    let windows = limit.start_windows(None).map_err(|e| format!("cannot start the log's window thread: {e}"))?;
    let registry = tracing_subscriber::registry().with(layer).with(limit);
    match format {
        LogFormat::Text => {
            registry.with(fmt::layer().with_ansi(std::io::stderr().is_terminal()).with_writer(std::io::stderr)).init()
        }
        LogFormat::Json => registry.with(fmt::layer().json().with_writer(std::io::stderr)).init(),
    }
    Ok((cmd::log_level::LogFilter::new(handle, filter), windows))
}
