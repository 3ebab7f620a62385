//! `fencer proxy`, `fencer rejections`, `fencer proxy-status`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use fencer_proxy::{
    AdminClient, DEFAULT_ADMIN_ADDR, LogControlHandle, PostgresSimpleConfig, ProxyConfig, RouteKind, SimpleConfig,
};

use super::log_level::LogFilter;

use crate::output::{OutputFormat, outln, print_json, print_table};

/// Arguments of `fencer proxy`.
#[derive(Debug, clap::Args)]
pub(crate) struct ProxyArgs {
    /// Full configuration file (routes, limits, timeouts); see docs/proxy.md.
    #[arg(long, env = "FENCER_PROXY_CONFIG", conflicts_with_all = ["listen", "upstream", "resource", "data_dir", "read_routes", "signing_keys"])]
    config: Option<PathBuf>,

    /// What clients and the upstream speak: `http` (default) or `postgres`
    /// (the PostgreSQL wire protocol, DESIGN §4a; full settings in the
    /// config file's `[postgres]` table).
    #[arg(long, env = "FENCER_PROXY_PROTOCOL", value_enum, default_value_t = Protocol::Http, conflicts_with = "config")]
    protocol: Protocol,

    /// Address clients connect to, e.g. 127.0.0.1:8087 (PostgreSQL:
    /// 127.0.0.1:6432).
    #[arg(long, env = "FENCER_PROXY_LISTEN", required_unless_present = "config")]
    listen: Option<SocketAddr>,

    /// The protected service: http://host:port, or for `--protocol
    /// postgres` host:port or a unix socket path (bind it to loopback, P9/G9).
    #[arg(long, env = "FENCER_PROXY_UPSTREAM", required_unless_present = "config")]
    upstream: Option<String>,

    /// The lock resource every request writes (simple form); for
    /// PostgreSQL also a template such as `pg/{database}` (G10).
    #[arg(long, env = "FENCER_PROXY_RESOURCE", required_unless_present = "config")]
    resource: Option<String>,

    /// Directory of the epoch store, rejection log and audit log.
    #[arg(long, env = "FENCER_PROXY_DATA_DIR", required_unless_present = "config")]
    data_dir: Option<PathBuf>,

    /// Admin API address [default: 127.0.0.1:7421, or the config's].
    #[arg(long, env = "FENCER_PROXY_ADMIN")]
    admin: Option<SocketAddr>,

    /// File holding the admin API's bearer token (16–1024 visible ASCII
    /// characters); every admin call but /livez and /readyz must present
    /// it. Overrides the config's `admin_token_file`.
    #[arg(long, env = "FENCER_PROXY_ADMIN_TOKEN_FILE")]
    admin_token_file: Option<PathBuf>,

    /// Starting epoch for a new (empty) store: at least the coordinator's
    /// current commit index (P10). Ignored when lower than the stored floor.
    #[arg(long, env = "FENCER_PROXY_FLOOR")]
    floor: Option<u64>,

    /// A route forwarded without a token, METHOD:PATH (e.g. GET:/ping);
    /// repeatable. Every other route is a write (P5: default deny).
    #[arg(long = "read-route", value_name = "METHOD:PATH")]
    read_routes: Vec<String>,

    /// Accept only tokens signed by the coordinator (P7): the key-set file
    /// `fencer keys export` writes (simple form of `[signing]`; plain tokens
    /// are refused). Reload it with SIGHUP.
    #[arg(long, env = "FENCER_PROXY_SIGNING_KEYS", value_name = "FILE")]
    signing_keys: Option<PathBuf>,

    /// Validate the configuration and the files it names (signing keys, TLS
    /// certificates), print the routes, and exit.
    #[arg(long)]
    check_config: bool,
}

/// The `--protocol` of `fencer proxy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Protocol {
    /// HTTP/1.1 and HTTP/2 to an HTTP upstream.
    Http,
    /// The PostgreSQL wire protocol to an unmodified PostgreSQL.
    Postgres,
}

/// Arguments of `fencer rejections`.
#[derive(Debug, clap::Args)]
pub(crate) struct RejectionsArgs {
    /// The proxy's admin address.
    #[arg(long, env = "FENCER_PROXY_ADMIN", default_value = DEFAULT_ADMIN_ADDR)]
    admin: String,

    /// How many rejections to show, newest first (1–1000).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=1000))]
    limit: u64,

    /// Only rejections older than this sequence number (paging).
    #[arg(long)]
    before: Option<u64>,

    /// Output format.
    #[arg(short = 'o', long = "output", env = "FENCER_OUTPUT", value_enum, default_value_t)]
    output: OutputFormat,
}

/// Arguments of `fencer proxy-status`.
#[derive(Debug, clap::Args)]
pub(crate) struct ProxyStatusArgs {
    /// Show only this resource.
    resource: Option<String>,

    /// The proxy's admin address.
    #[arg(long, env = "FENCER_PROXY_ADMIN", default_value = DEFAULT_ADMIN_ADDR)]
    admin: String,

    /// Resources per page (1–1000).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=1000))]
    limit: u64,

    /// Start after this resource name (paging).
    #[arg(long)]
    after: Option<String>,

    /// Output format.
    #[arg(short = 'o', long = "output", env = "FENCER_OUTPUT", value_enum, default_value_t)]
    output: OutputFormat,
}

const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);

fn load_config(args: &ProxyArgs) -> anyhow::Result<ProxyConfig> {
    let mut config = match &args.config {
        Some(path) => ProxyConfig::load(path).with_context(|| format!("invalid configuration {}", path.display()))?,
        None if args.protocol == Protocol::Postgres => {
            let missing = |flag: &str| anyhow::anyhow!("{flag} is required without --config");
            if !args.read_routes.is_empty() {
                anyhow::bail!(
                    "--read-route applies to the HTTP proxy; PostgreSQL read-only roles are read_only_users in [postgres]"
                );
            }
            ProxyConfig::simple_postgres(PostgresSimpleConfig {
                listen: args.listen.ok_or_else(|| missing("--listen"))?,
                upstream: args.upstream.clone().ok_or_else(|| missing("--upstream"))?,
                resource: args.resource.clone().ok_or_else(|| missing("--resource"))?,
                data_dir: args.data_dir.clone().ok_or_else(|| missing("--data-dir"))?,
                admin: DEFAULT_ADMIN_ADDR.parse().context("default admin address")?,
            })?
        }
        None => {
            let missing = |flag: &str| anyhow::anyhow!("{flag} is required without --config");
            ProxyConfig::simple(SimpleConfig {
                listen: args.listen.ok_or_else(|| missing("--listen"))?,
                upstream: args.upstream.clone().ok_or_else(|| missing("--upstream"))?,
                resource: args.resource.clone().ok_or_else(|| missing("--resource"))?,
                data_dir: args.data_dir.clone().ok_or_else(|| missing("--data-dir"))?,
                admin: DEFAULT_ADMIN_ADDR.parse().context("default admin address")?,
                read_routes: args.read_routes.clone(),
            })?
        }
    };
    if let Some(keys_file) = &args.signing_keys {
        config.signing = Some(fencer_proxy::SigningConfig {
            keys_file: keys_file.clone(),
            require_signed: true,
            clock_skew: fencer_token::DEFAULT_CLOCK_SKEW,
        });
    }
    if let Some(admin) = args.admin {
        config.admin = admin;
    }
    if let Some(file) = &args.admin_token_file {
        config.admin_token_file = Some(file.clone());
    }
    Ok(config)
}

pub(crate) async fn run_proxy(args: ProxyArgs, log: Arc<LogFilter>) -> anyhow::Result<ExitCode> {
    let mut config = load_config(&args)?;
    config.log_control = Some(LogControlHandle(log));
    if args.check_config {
        fencer_proxy::check_files(&config)?;
        let tls = match &config.tls {
            None => " (plaintext)",
            Some(t) if t.client_ca_file.is_some() => " (TLS, client certificates required)",
            Some(_) => " (TLS)",
        };
        let signing = match &config.signing {
            None => "signed tokens: off (plain tokens, capped by max_epoch_jump only)".to_owned(),
            Some(s) => format!(
                "signed tokens: keys {}, {}, clock skew {:?}",
                s.keys_file.display(),
                if s.require_signed { "unsigned refused" } else { "unsigned accepted" },
                s.clock_skew
            ),
        };
        let Some(http) = config.http() else {
            let pg = config.postgres().context("a PostgreSQL configuration")?;
            outln!(
                "configuration OK: PostgreSQL sidecar, listen {}{tls}, upstream {}, resource {}, admin {}, data dir {}",
                config.listen,
                pg.upstream,
                pg.resource,
                config.admin,
                config.data_dir.display()
            );
            outln!("{signing}");
            outln!(
                "read-only users: {}",
                if pg.read_only_users.is_empty() { "none".to_owned() } else { pg.read_only_users.join(", ") }
            );
            outln!(
                "drain_timeout {:?}, statement_timeout {}, idle_timeout {:?}, older transactions ended by: {}",
                pg.drain_timeout,
                pg.statement_timeout.map_or_else(|| "off".to_owned(), |t| format!("{t:?}")),
                pg.idle_timeout,
                pg.admin.as_ref().map_or_else(
                    || "nobody (no [postgres.admin]: higher tokens get FN004 while one is open)".to_owned(),
                    |a| format!("admin connection as {}", a.user)
                )
            );
            return Ok(ExitCode::SUCCESS);
        };
        outln!(
            "configuration OK: listen {}{tls}, upstream {}, admin {}, data dir {}",
            config.listen,
            http.upstream,
            config.admin,
            config.data_dir.display()
        );
        outln!("{signing}");
        let rows: Vec<Vec<String>> = http
            .router
            .routes()
            .iter()
            .map(|r| {
                let kind = match r.kind() {
                    RouteKind::Read => "read (no token)",
                    RouteKind::Write => "write (token)",
                };
                vec![r.name().to_owned(), r.path_template().to_owned(), kind.to_owned()]
            })
            .collect();
        print_table(&["ROUTE", "PATH", "KIND"], &rows);
        return Ok(ExitCode::SUCCESS);
    }
    // Listen for SIGHUP before the proxy answers anything, so a reload
    // request can never meet SIGHUP's default action (terminate).
    let hangups = hangup_signals();
    let handle = fencer_proxy::start_with_shutdown(config, args.floor, super::shutdown_signal()).await?;
    tracing::info!(console = %format!("http://{}/ui/", handle.admin_addr()), "operator console on the admin port");
    let reload = tokio::spawn(reload_keys_on_sighup(hangups, handle.key_reloader()));
    handle.wait().await;
    reload.abort();
    Ok(ExitCode::SUCCESS)
}

#[cfg(unix)]
type Hangups = Option<tokio::signal::unix::Signal>;
#[cfg(not(unix))]
type Hangups = Option<()>;

fn hangup_signals() -> Hangups {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        signal(SignalKind::hangup())
            .inspect_err(
                |e| tracing::error!(error = %e, "cannot listen for SIGHUP; reload keys with POST /v1/reload-keys"),
            )
            .ok()
    }
    #[cfg(not(unix))]
    None
}

/// SIGHUP re-reads the signing key-set file (P7); a bad file is logged and
/// the keys in force stay. Runs until the proxy stops.
async fn reload_keys_on_sighup(hangups: Hangups, keys: fencer_proxy::KeyReloader) {
    #[cfg(unix)]
    if let Some(mut hup) = hangups {
        while hup.recv().await.is_some() {
            tracing::info!("SIGHUP received: reloading signing keys");
            // The reloader logs the outcome.
            let _ = keys.reload();
        }
    }
    #[cfg(not(unix))]
    let _ = (hangups, keys);
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

/// A proxy admin call that failed, explained when `addr` is in fact a
/// coordinator's port (it answers `/v1/status` with a cluster id): the
/// usual mistake, which would otherwise read as a parse error.
async fn not_a_coordinator(addr: &str, e: anyhow::Error) -> anyhow::Error {
    match super::node_http::call(hyper::Method::GET, addr, "/v1/status", None, ADMIN_TIMEOUT).await {
        Ok(status) if status.get("cluster_id").is_some_and(serde_json::Value::is_string) => anyhow::anyhow!(
            "{addr} is a fencer coordinator, not a proxy admin port (the proxy's admin address is its `admin` \
             setting, default {DEFAULT_ADMIN_ADDR}; pass it with --admin)"
        ),
        _ => e,
    }
}

pub(crate) async fn run_rejections(args: RejectionsArgs) -> anyhow::Result<ExitCode> {
    let client = AdminClient::new(&args.admin, ADMIN_TIMEOUT)?.with_token_from_env()?;
    let limit = usize::try_from(args.limit).unwrap_or(fencer_proxy::MAX_PAGE);
    let page = match client.rejections(args.before, limit).await {
        Ok(page) => page,
        Err(e) => return Err(not_a_coordinator(&args.admin, e.into()).await),
    };
    match args.output {
        OutputFormat::Json => print_json(&page)?,
        OutputFormat::Table => {
            let rows: Vec<Vec<String>> = page
                .rejections
                .iter()
                .map(|r| {
                    vec![
                        r.seq.to_string(),
                        r.time.clone(),
                        opt(r.resource.as_deref()),
                        opt(r.presented_token),
                        opt(r.current_epoch),
                        r.reason.as_str().to_owned(),
                        r.status.to_string(),
                        r.method.clone(),
                        opt(r.route.as_deref()),
                        r.caller.clone(),
                        r.request_id.clone(),
                    ]
                })
                .collect();
            print_table(
                &[
                    "SEQ",
                    "TIME",
                    "RESOURCE",
                    "TOKEN",
                    "EPOCH",
                    "REASON",
                    "STATUS",
                    "METHOD",
                    "ROUTE",
                    "CALLER",
                    "REQUEST_ID",
                ],
                &rows,
            );
            if let Some(next) = page.next_before {
                eprintln!("more: --before {next}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn run_proxy_status(args: ProxyStatusArgs) -> anyhow::Result<ExitCode> {
    let client = AdminClient::new(&args.admin, ADMIN_TIMEOUT)?.with_token_from_env()?;
    let page = match &args.resource {
        Some(name) => {
            let status = match client.resource(name).await {
                Ok(status) => status,
                Err(e) => return Err(not_a_coordinator(&args.admin, e.into()).await),
            };
            let floor = client.resources(None, 1).await?.floor;
            fencer_proxy::ResourcesPage { floor, resources: vec![status], next_after: None }
        }
        None => {
            let limit = usize::try_from(args.limit).unwrap_or(fencer_proxy::MAX_PAGE);
            match client.resources(args.after.as_deref(), limit).await {
                Ok(page) => page,
                Err(e) => return Err(not_a_coordinator(&args.admin, e.into()).await),
            }
        }
    };
    match args.output {
        OutputFormat::Json => print_json(&page)?,
        OutputFormat::Table => {
            let rows: Vec<Vec<String>> = page
                .resources
                .iter()
                .map(|r| {
                    let ind = r.indeterminate.as_ref().map_or_else(
                        || "no".to_owned(),
                        |i| match i.quarantine_remaining_secs {
                            Some(s) => format!("yes (quarantine {s}s left)"),
                            None => format!("yes ({} connection(s) open)", i.open_connections),
                        },
                    );
                    vec![r.resource.clone(), r.epoch.to_string(), r.in_flight.to_string(), ind]
                })
                .collect();
            print_table(&["RESOURCE", "EPOCH", "IN_FLIGHT", "INDETERMINATE"], &rows);
            eprintln!("floor: {} (epoch of every resource not listed)", page.floor);
            if let Some(next) = page.next_after {
                eprintln!("more: --after {next}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
