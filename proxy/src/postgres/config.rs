//! The `[postgres]` table of `proxy.toml` and the flag form of
//! `fencer proxy --protocol postgres` (DESIGN §4a). Secrets are never read
//! here: the admin password's file or environment variable is named, and
//! read when the sidecar starts.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::config::{ConfigError, Frontend, Locator, ProxyConfig, RawConfig, non_empty_path, parse_duration};
use crate::core::names::ResourceName;

/// Where the protected PostgreSQL listens (G9: loopback or a unix socket).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PgAddress {
    /// `host:port`.
    Tcp(SocketAddr),
    /// A unix socket: the socket file, e.g.
    /// `/var/run/postgresql/.s.PGSQL.5432` (a directory is completed with
    /// `.s.PGSQL.5432`).
    Unix(PathBuf),
}

impl std::fmt::Display for PgAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tcp(a) => write!(f, "{a}"),
            Self::Unix(p) => write!(f, "{}", p.display()),
        }
    }
}

/// Which lock resource a connection's statements are fenced on (G10).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PgResource {
    /// One resource for every connection of this listener.
    Fixed(ResourceName),
    /// `prefix{database}suffix`: the startup message's database (default:
    /// the user name) substituted.
    PerDatabase {
        /// Text before `{database}`.
        prefix: String,
        /// Text after `{database}`.
        suffix: String,
    },
}

impl PgResource {
    /// Parses `pg/app` or a template such as `pg/{database}`.
    pub(crate) fn parse(raw: &str) -> Result<Self, String> {
        match raw.split_once("{database}") {
            None => {
                if raw.contains('{') || raw.contains('}') {
                    return Err(format!("resource {raw:?}: the only placeholder is {{database}}"));
                }
                ResourceName::new(raw).map(Self::Fixed).map_err(|e| format!("resource {raw:?}: {e}"))
            }
            Some((prefix, suffix)) => {
                if suffix.contains("{database}") || format!("{prefix}{suffix}").contains(['{', '}']) {
                    return Err(format!("resource {raw:?}: use {{database}} once and no other placeholder"));
                }
                let t = Self::PerDatabase { prefix: prefix.to_owned(), suffix: suffix.to_owned() };
                // A template that cannot make a valid name for a plain
                // database name is a mistake in the file.
                t.for_database("db").map_err(|e| format!("resource {raw:?}: {e}"))?;
                Ok(t)
            }
        }
    }

    /// The resource of a connection to `database`.
    pub(crate) fn for_database(&self, database: &str) -> Result<ResourceName, String> {
        match self {
            Self::Fixed(name) => Ok(name.clone()),
            Self::PerDatabase { prefix, suffix } => ResourceName::new(format!("{prefix}{database}{suffix}"))
                .map_err(|e| format!("database {database:?} does not make a valid resource name: {e}")),
        }
    }
}

impl std::fmt::Display for PgResource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Fixed(n) => write!(f, "{n}"),
            Self::PerDatabase { prefix, suffix } => write!(f, "{prefix}{{database}}{suffix}"),
        }
    }
}

/// Where the admin connection's password comes from. It is read when the
/// sidecar starts, never passed on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PgSecret {
    /// A file holding the password (one line; a trailing newline is
    /// ignored). It should be readable by the sidecar's user only.
    File(PathBuf),
    /// An environment variable holding the password.
    Env(String),
    /// No password (trust or peer authentication for the admin role).
    None,
}

/// The sidecar's own connection to PostgreSQL, used to end older backends
/// with `pg_terminate_backend` (G5) and to confirm they exited (G7). Its
/// role needs `pg_signal_backend` (or to own the backends it ends).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgAdmin {
    /// The role.
    pub user: String,
    /// Its password's source.
    pub password: PgSecret,
    /// The database it connects to (default `postgres`).
    pub database: String,
    /// Where it connects (default: the upstream).
    pub address: Option<PgAddress>,
}

/// The PostgreSQL front end's settings, the `[postgres]` table.
#[derive(Debug, Clone)]
pub struct PostgresConfig {
    /// The protected PostgreSQL.
    pub upstream: PgAddress,
    /// Allow an upstream that is not on loopback (G9: then `pg_hba.conf`
    /// must admit writers only from this sidecar). Default false.
    pub allow_remote_upstream: bool,
    /// The resource a connection's statements are fenced on (G10).
    pub resource: PgResource,
    /// Roles whose connections pass without a token (G3). Make them
    /// read-only in PostgreSQL: the sidecar does not look at what they send.
    pub read_only_users: Vec<String>,
    /// How long a higher token waits for older transactions to end before
    /// it ends them (G5, default 5 s).
    pub drain_timeout: Duration,
    /// How long `pg_terminate_backend` may wait for an older backend to
    /// exit, and how long the sidecar then polls `pg_stat_activity` for it
    /// (default 5 s).
    pub terminate_timeout: Duration,
    /// How long PostgreSQL may stay silent while a statement is outstanding
    /// before the sidecar gives up on it: FN003, the connection is closed,
    /// the resource indeterminate (G7). `None` (the default): no limit, as
    /// without the sidecar; set PostgreSQL's own `statement_timeout` for
    /// slow queries.
    pub statement_timeout: Option<Duration>,
    /// How long a client connection may send nothing before it is closed
    /// (`57P05`, default 1 h).
    pub idle_timeout: Duration,
    /// Time from accepting a connection to the end of its authentication
    /// (default 15 s).
    pub startup_timeout: Duration,
    /// Largest Query or Parse message, whose text the sidecar reads
    /// (default 16 MiB; PostgreSQL's own limit is 1 GiB). Larger ones close
    /// the connection with `FATAL 54000`. Bind, CopyData and FunctionCall
    /// stream and are bounded only by PostgreSQL's limit.
    pub max_statement_bytes: usize,
    /// Prepared statements and portals tracked per connection (default
    /// 10,000); beyond it the connection is closed with `FATAL 54000`.
    pub max_prepared_statements: usize,
    /// The admin connection for G5/G7; `None`: a higher token gets FN004
    /// while an older transaction is open, and an unknown outcome is
    /// resolved by the quarantine after the upstream socket closed.
    pub admin: Option<PgAdmin>,
}

/// Default `[postgres] drain_timeout`.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

impl PostgresConfig {
    /// Defaults around an upstream and a resource.
    pub fn new(upstream: PgAddress, resource: PgResource) -> Self {
        Self {
            upstream,
            allow_remote_upstream: false,
            resource,
            read_only_users: Vec::new(),
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            terminate_timeout: Duration::from_secs(5),
            statement_timeout: None,
            idle_timeout: Duration::from_secs(3600),
            startup_timeout: Duration::from_secs(15),
            max_statement_bytes: 16 * 1024 * 1024,
            max_prepared_statements: 10_000,
            admin: None,
        }
    }
}

/// The flag form: `fencer proxy --protocol postgres --listen … --upstream …
/// --resource … --data-dir …`.
#[derive(Debug, Clone)]
pub struct PostgresSimpleConfig {
    /// `--listen`.
    pub listen: SocketAddr,
    /// `--upstream`: `host:port` or a unix socket path.
    pub upstream: String,
    /// `--resource`: a name or a `{database}` template.
    pub resource: String,
    /// `--data-dir`.
    pub data_dir: PathBuf,
    /// `--admin`.
    pub admin: SocketAddr,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPostgres {
    upstream: Spanned<String>,
    allow_remote_upstream: Option<bool>,
    resource: Spanned<String>,
    #[serde(default)]
    read_only_users: Vec<Spanned<String>>,
    drain_timeout: Option<Spanned<String>>,
    terminate_timeout: Option<Spanned<String>>,
    statement_timeout: Option<Spanned<String>>,
    idle_timeout: Option<Spanned<String>>,
    startup_timeout: Option<Spanned<String>>,
    max_statement_bytes: Option<Spanned<u64>>,
    max_prepared_statements: Option<Spanned<u64>>,
    admin: Option<Spanned<RawPgAdmin>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPgAdmin {
    user: Spanned<String>,
    password_file: Option<Spanned<String>>,
    password_env: Option<Spanned<String>>,
    database: Option<Spanned<String>>,
    upstream: Option<Spanned<String>>,
}

/// Parses `host:port` or a unix socket path.
pub(crate) fn parse_address(raw: &str) -> Result<PgAddress, String> {
    if raw.starts_with('/') {
        let path = Path::new(raw);
        // A directory is where PostgreSQL puts its socket (unix_socket_directories).
        let file = if path.is_dir() { path.join(".s.PGSQL.5432") } else { path.to_owned() };
        return Ok(PgAddress::Unix(file));
    }
    raw.parse::<SocketAddr>().map(PgAddress::Tcp).map_err(|_| {
        format!("upstream {raw:?} is neither host:port (an IP address and port) nor an absolute unix socket path")
    })
}

fn check_upstream(listen: SocketAddr, upstream: &PgAddress, allow_remote: bool) -> Result<(), String> {
    if let PgAddress::Tcp(up) = upstream {
        if *up == listen || (up.port() == listen.port() && (up.ip().is_unspecified() || listen.ip().is_unspecified())) {
            return Err(format!("upstream {up} is the sidecar's own listen address; that would loop"));
        }
        if !up.ip().is_loopback() && !allow_remote {
            return Err(format!(
                "upstream {up} is not on loopback; PostgreSQL must be reachable only through the sidecar (G9). \
                 If pg_hba.conf admits writers only from this host, set allow_remote_upstream = true"
            ));
        }
    }
    Ok(())
}

/// The keys of `[timeouts]`, `[limits]` and the top level that only the
/// HTTP proxy reads: a PostgreSQL sidecar refuses them instead of
/// silently ignoring them.
fn refuse_http_keys(loc: &Locator<'_>, raw: &RawConfig) -> Result<(), ConfigError> {
    let top: [(&str, Option<std::ops::Range<usize>>); 5] = [
        ("upstream (top level)", raw.upstream.as_ref().map(Spanned::span)),
        ("token_header", raw.token_header.as_ref().map(Spanned::span)),
        ("resource_header", raw.resource_header.as_ref().map(Spanned::span)),
        ("request_id_header", raw.request_id_header.as_ref().map(Spanned::span)),
        ("[upstream_tls]", raw.upstream_tls.as_ref().map(Spanned::span)),
    ];
    let t = &raw.timeouts;
    let l = &raw.limits;
    let nested = [
        ("timeouts.connect", t.connect.as_ref().map(Spanned::span)),
        ("timeouts.response", t.response.as_ref().map(Spanned::span)),
        ("timeouts.body_idle", t.body_idle.as_ref().map(Spanned::span)),
        ("timeouts.header_read", t.header_read.as_ref().map(Spanned::span)),
        ("limits.max_concurrent_requests", l.max_concurrent_requests.as_ref().map(Spanned::span)),
        ("limits.max_streams_per_connection", l.max_streams_per_connection.as_ref().map(Spanned::span)),
        ("limits.max_header_bytes", l.max_header_bytes.as_ref().map(Spanned::span)),
        ("limits.max_headers", l.max_headers.as_ref().map(Spanned::span)),
        ("limits.max_request_body_bytes", l.max_request_body_bytes.as_ref().map(Spanned::span)),
        ("limits.upstream_max_idle_connections", l.upstream_max_idle_connections.as_ref().map(Spanned::span)),
    ];
    for (key, span) in top.into_iter().chain(nested) {
        if let Some(span) = span {
            return Err(loc.err(
                span,
                format!(
                    "{key} applies to protocol = \"http\" only; the PostgreSQL sidecar's settings are in [postgres]"
                ),
            ));
        }
    }
    if let Some(route) = raw.routes.first() {
        return Err(loc.at(route.path_span(), "[[route]] applies to protocol = \"http\" only"));
    }
    Ok(())
}

impl PostgresConfig {
    /// The `[postgres]` table of a parsed `proxy.toml`.
    pub(crate) fn from_raw(
        loc: &Locator<'_>,
        raw: &RawConfig,
        pg: Option<&Spanned<RawPostgres>>,
        listen: SocketAddr,
    ) -> Result<Self, ConfigError> {
        refuse_http_keys(loc, raw)?;
        let Some(pg) = pg else {
            return Err(loc.at(
                raw.protocol.as_ref().expect("set for postgres"),
                "protocol = \"postgres\" needs a [postgres] table with at least upstream and resource",
            ));
        };
        let p = pg.get_ref();
        let upstream = parse_address(p.upstream.get_ref()).map_err(|r| loc.at(&p.upstream, r))?;
        let allow_remote_upstream = p.allow_remote_upstream.unwrap_or(false);
        check_upstream(listen, &upstream, allow_remote_upstream).map_err(|r| loc.at(&p.upstream, r))?;
        let resource = PgResource::parse(p.resource.get_ref()).map_err(|r| loc.at(&p.resource, r))?;
        let mut c = Self::new(upstream, resource);
        c.allow_remote_upstream = allow_remote_upstream;
        for user in &p.read_only_users {
            if user.get_ref().is_empty() {
                return Err(loc.at(user, "a read_only_users entry must not be empty"));
            }
            c.read_only_users.push(user.get_ref().clone());
        }
        for (field, slot) in [
            (&p.drain_timeout, &mut c.drain_timeout),
            (&p.terminate_timeout, &mut c.terminate_timeout),
            (&p.idle_timeout, &mut c.idle_timeout),
            (&p.startup_timeout, &mut c.startup_timeout),
        ] {
            if let Some(v) = field {
                *slot = parse_duration(v.get_ref()).map_err(|r| loc.at(v, r))?;
            }
        }
        if let Some(v) = &p.statement_timeout {
            c.statement_timeout = Some(parse_duration(v.get_ref()).map_err(|r| loc.at(v, r))?);
        }
        if let Some(v) = &p.max_statement_bytes {
            let n = *v.get_ref();
            if !(1024..=crate::postgres::protocol::LARGE_MESSAGE_LIMIT as u64).contains(&n) {
                return Err(loc.at(v, "max_statement_bytes must be between 1024 and 1073741823 (1 GiB - 1)"));
            }
            c.max_statement_bytes = usize::try_from(n).unwrap_or(usize::MAX);
        }
        if let Some(v) = &p.max_prepared_statements {
            let n = *v.get_ref();
            if !(16..=10_000_000).contains(&n) {
                return Err(loc.at(v, "max_prepared_statements must be between 16 and 10000000"));
            }
            c.max_prepared_statements = usize::try_from(n).unwrap_or(usize::MAX);
        }
        if let Some(admin) = &p.admin {
            let a = admin.get_ref();
            if a.user.get_ref().is_empty() {
                return Err(loc.at(&a.user, "admin.user must not be empty"));
            }
            let password = match (&a.password_file, &a.password_env) {
                (Some(_), Some(e)) => {
                    return Err(loc.at(e, "set admin.password_file or admin.password_env, not both"));
                }
                (Some(f), None) => PgSecret::File(non_empty_path(loc, f, "admin.password_file")?),
                (None, Some(e)) => {
                    if e.get_ref().is_empty() {
                        return Err(loc.at(e, "admin.password_env must name an environment variable"));
                    }
                    PgSecret::Env(e.get_ref().clone())
                }
                (None, None) => PgSecret::None,
            };
            let address =
                a.upstream.as_ref().map(|u| parse_address(u.get_ref()).map_err(|r| loc.at(u, r))).transpose()?;
            c.admin = Some(PgAdmin {
                user: a.user.get_ref().clone(),
                password,
                database: a.database.as_ref().map_or_else(|| "postgres".to_owned(), |d| d.get_ref().clone()),
                address,
            });
        }
        Ok(c)
    }
}

impl ProxyConfig {
    /// The flag form of the PostgreSQL sidecar: one upstream, one resource
    /// (or a `{database}` template), every default.
    pub fn simple_postgres(args: PostgresSimpleConfig) -> Result<Self, ConfigError> {
        let flag = |flag: &'static str| move |reason: String| ConfigError::Flag { flag, reason };
        let upstream = parse_address(&args.upstream).map_err(flag("--upstream"))?;
        check_upstream(args.listen, &upstream, false).map_err(flag("--upstream"))?;
        let resource = PgResource::parse(&args.resource).map_err(flag("--resource"))?;
        let frontend = Frontend::Postgres(PostgresConfig::new(upstream, resource));
        Ok(Self::with_defaults(args.listen, args.data_dir, args.admin, frontend))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
protocol = "postgres"
listen = "127.0.0.1:6432"
data_dir = "/tmp/x"

[postgres]
upstream = "127.0.0.1:5432"
resource = "pg/{database}"
read_only_users = ["reporting"]
drain_timeout = "2s"
statement_timeout = "30s"

[postgres.admin]
user = "fencer_admin"
password_env = "FENCER_PG_ADMIN_PASSWORD"
"#;

    fn err_of(text: &str) -> (usize, String) {
        match ProxyConfig::from_toml_str(text) {
            Err(ConfigError::Invalid { line, reason, .. }) => (line, reason),
            other => panic!("expected an Invalid error, got {other:?}"),
        }
    }

    #[test]
    fn a_postgres_config_parses() {
        let c = ProxyConfig::from_toml_str(BASE).unwrap();
        let Frontend::Postgres(pg) = &c.frontend else { panic!("not postgres") };
        assert_eq!(pg.upstream, PgAddress::Tcp("127.0.0.1:5432".parse().unwrap()));
        assert_eq!(pg.resource.for_database("shop").unwrap().as_str(), "pg/shop");
        assert_eq!(pg.read_only_users, ["reporting"]);
        assert_eq!(pg.drain_timeout, Duration::from_secs(2));
        assert_eq!(pg.statement_timeout, Some(Duration::from_secs(30)));
        assert_eq!(pg.idle_timeout, Duration::from_secs(3600));
        let admin = pg.admin.as_ref().unwrap();
        assert_eq!(admin.password, PgSecret::Env("FENCER_PG_ADMIN_PASSWORD".into()));
        assert_eq!(admin.database, "postgres");
    }

    #[test]
    fn postgres_mistakes_name_the_line() {
        let (line, reason) = err_of(&BASE.replace("127.0.0.1:5432", "10.0.0.5:5432"));
        assert_eq!(line, 7);
        assert!(reason.contains("G9") && reason.contains("allow_remote_upstream"), "{reason}");
        let (line, reason) = err_of(&BASE.replace("pg/{database}", "pg/{db}"));
        assert_eq!(line, 8);
        assert!(reason.contains("{database}"), "{reason}");
        let (_, reason) = err_of(&BASE.replace("pg/{database}", "/pg"));
        assert!(reason.contains("resource"), "{reason}");
        let (_, reason) = err_of(&BASE.replace("127.0.0.1:5432", "127.0.0.1:6432"));
        assert!(reason.contains("loop"), "{reason}");
        let (_, reason) =
            err_of(&BASE.replace("password_env = \"FENCER_PG_ADMIN_PASSWORD\"", "password = \"hunter2\""));
        assert!(reason.contains("password"), "{reason}");
        let (_, reason) = err_of(&format!("{BASE}password_file = \"/etc/pw\"\n"));
        assert!(reason.contains("not both"), "{reason}");
        let (line, reason) =
            err_of(&BASE.replace("data_dir = \"/tmp/x\"", "data_dir = \"/tmp/x\"\n[limits]\nmax_headers = 5"));
        assert_eq!(line, 6);
        assert!(reason.contains("protocol = \"http\" only"), "{reason}");
        let (_, reason) = err_of(&format!("{BASE}\n[[route]]\npath = \"/\"\nresource = \"x\"\n"));
        assert!(reason.contains("[[route]]"), "{reason}");
        let (_, reason) = err_of("protocol = \"postgres\"\nlisten = \"127.0.0.1:1\"\ndata_dir = \"d\"\n");
        assert!(reason.contains("[postgres]"), "{reason}");
        let (_, reason) = err_of(&BASE.replace("\"postgres\"\nlisten", "\"mysql\"\nlisten"));
        assert!(reason.contains("\"http\" or \"postgres\""), "{reason}");
        let (_, reason) = err_of(&BASE.replace("drain_timeout = \"2s\"", "drain_timeout = \"0s\""));
        assert!(reason.contains("zero"), "{reason}");
    }

    #[test]
    fn unix_sockets_and_the_flag_form() {
        assert_eq!(
            parse_address("/run/pg/.s.PGSQL.5433").unwrap(),
            PgAddress::Unix(PathBuf::from("/run/pg/.s.PGSQL.5433"))
        );
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            parse_address(dir.path().to_str().unwrap()).unwrap(),
            PgAddress::Unix(dir.path().join(".s.PGSQL.5432"))
        );
        assert!(parse_address("localhost:5432").unwrap_err().contains("neither"));
        let c = ProxyConfig::simple_postgres(PostgresSimpleConfig {
            listen: "127.0.0.1:6432".parse().unwrap(),
            upstream: "127.0.0.1:5432".into(),
            resource: "pg/app".into(),
            data_dir: "d".into(),
            admin: "127.0.0.1:7421".parse().unwrap(),
        })
        .unwrap();
        assert!(matches!(&c.frontend, Frontend::Postgres(pg) if pg.resource.to_string() == "pg/app"));
        let bad = ProxyConfig::simple_postgres(PostgresSimpleConfig {
            listen: "127.0.0.1:6432".parse().unwrap(),
            upstream: "192.0.2.1:5432".into(),
            resource: "pg/app".into(),
            data_dir: "d".into(),
            admin: "127.0.0.1:7421".parse().unwrap(),
        })
        .unwrap_err();
        assert!(bad.to_string().starts_with("--upstream:"), "{bad}");
    }
}
