//! A throwaway PostgreSQL server for the sidecar's tests, and the sidecar
//! in front of it.
//!
//! [`TestPostgres::start`] runs `initdb` in a temporary directory (as the
//! `postgres` system user when the tests run as root, as PostgreSQL
//! refuses root), writes a `pg_hba.conf` with trust for most roles and
//! SCRAM-SHA-256 for `scram_user` and `fencer_admin`, starts the server on a
//! free loopback port and a private unix socket directory with `pg_ctl -w
//! start`, and stops it with `pg_ctl stop -m immediate` when dropped.
//! Without PostgreSQL it prints a loud SKIPPED (and fails when `CI=true`).

#![allow(dead_code, unreachable_pub)]

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use fencer_proxy::{ProxyConfig, ProxyHandle};
use tokio_postgres::{Client, NoTls};

/// The password of `scram_user` and `fencer_admin`.
pub const SCRAM_PASSWORD: &str = "correct horse battery staple";

/// A loopback address with a port that was free a moment ago.
pub fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free loopback port")
}

fn find_bin_dir() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("FENCER_TEST_PG_BIN") {
        return Some(PathBuf::from(dir));
    }
    for v in ["18", "17", "16", "15", "14"] {
        let dir = PathBuf::from(format!("/usr/lib/postgresql/{v}/bin"));
        if dir.join("initdb").exists() {
            return Some(dir);
        }
    }
    let out = Command::new("pg_config").arg("--bindir").output().ok()?;
    let dir = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    dir.join("initdb").exists().then_some(dir)
}

fn is_root() -> bool {
    rustix_free_geteuid() == 0
}

/// The effective uid, from `/proc/self/status` (no libc dependency).
fn rustix_free_geteuid() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).and_then(|l| l.split_whitespace().nth(2)?.parse().ok()))
        .unwrap_or(u32::MAX)
}

/// A running throwaway PostgreSQL.
pub struct TestPostgres {
    _dir: tempfile::TempDir,
    pub root: PathBuf,
    pub data: PathBuf,
    pub bin: PathBuf,
    pub port: u16,
    as_postgres: bool,
}

/// Returns a server, or `None` after a loud skip message (a failure when
/// `CI=true`: CI installs PostgreSQL, so a missing one is a broken CI).
pub fn require_postgres(test: &str) -> Option<TestPostgres> {
    match find_bin_dir() {
        Some(bin) => Some(TestPostgres::start(bin)),
        None => {
            let msg = format!(
                "{test}: PostgreSQL not found (looked for /usr/lib/postgresql/*/bin/initdb and pg_config; set FENCER_TEST_PG_BIN). Install it with `apt-get install -y postgresql` (CI does)"
            );
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("{msg}");
            }
            eprintln!(
                "\n\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\
                 !! SKIPPED {msg}\n\
                 !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n"
            );
            None
        }
    }
}

impl TestPostgres {
    fn run(&self, tool: &str, args: &[&str]) -> std::process::Output {
        let path = self.bin.join(tool);
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&path);
            c
        } else {
            Command::new(&path)
        };
        cmd.args(args).output().unwrap_or_else(|e| panic!("cannot run {tool}: {e}"))
    }

    fn start(bin: PathBuf) -> Self {
        let dir = tempfile::Builder::new().prefix("fencer-pg-").tempdir().expect("a temp dir");
        let root = dir.path().to_owned();
        let as_postgres = is_root();
        if as_postgres {
            let ok = Command::new("chown").args(["-R", "postgres"]).arg(&root).status().is_ok_and(|s| s.success());
            assert!(ok, "cannot chown {} to postgres", root.display());
        }
        let data = root.join("data");
        let port = free_addr().port();
        let mut pg = Self { _dir: dir, root: root.clone(), data: data.clone(), bin, port, as_postgres };
        let out = pg
            .run("initdb", &["-D", data.to_str().unwrap(), "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8"]);
        assert!(out.status.success(), "initdb failed: {}", String::from_utf8_lossy(&out.stderr));
        let hba = "local all all trust\n\
                   host all scram_user 127.0.0.1/32 scram-sha-256\n\
                   host all fencer_admin 127.0.0.1/32 scram-sha-256\n\
                   host all all 127.0.0.1/32 trust\n";
        std::fs::write(data.join("pg_hba.conf"), hba).expect("write pg_hba.conf");
        let conf = format!(
            "listen_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = '{}'\nmax_connections = 700\n\
             fsync = off\nsynchronous_commit = off\nfull_page_writes = off\nshared_buffers = 64MB\n\
             log_min_messages = warning\nlog_min_error_statement = panic\n",
            root.display()
        );
        let mut existing = std::fs::read_to_string(data.join("postgresql.conf")).unwrap_or_default();
        existing.push_str(&conf);
        std::fs::write(data.join("postgresql.conf"), existing).expect("write postgresql.conf");
        if as_postgres {
            let _ = Command::new("chown").args(["-R", "postgres"]).arg(&root).status();
        }
        let log = root.join("postgres.log");
        let out =
            pg.run("pg_ctl", &["-D", data.to_str().unwrap(), "-l", log.to_str().unwrap(), "-w", "-t", "60", "start"]);
        assert!(
            out.status.success(),
            "pg_ctl start failed: {}{}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        pg.port = port;
        pg
    }

    /// The server's loopback address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The server's unix socket file.
    pub fn socket(&self) -> PathBuf {
        self.root.join(format!(".s.PGSQL.{}", self.port))
    }

    /// A direct connection (not through the sidecar) as `user`.
    pub async fn direct(&self, user: &str) -> Client {
        connect(self.addr(), user, None).await.unwrap_or_else(|e| panic!("direct connection as {user}: {e}"))
    }

    /// Creates the roles the tests use and a `fenced` table; returns a
    /// superuser connection.
    pub async fn setup(&self) -> Client {
        let su = self.direct("postgres").await;
        su.batch_execute(&format!(
            "CREATE ROLE app LOGIN;
             CREATE ROLE scram_user LOGIN PASSWORD '{SCRAM_PASSWORD}';
             CREATE ROLE reporting LOGIN;
             CREATE ROLE fencer_admin LOGIN PASSWORD '{SCRAM_PASSWORD}';
             GRANT pg_signal_backend TO fencer_admin;
             CREATE TABLE fenced (id bigserial PRIMARY KEY, writer text NOT NULL, token bigint NOT NULL,
                                  at timestamptz NOT NULL DEFAULT clock_timestamp());
             GRANT SELECT ON fenced TO reporting;
             GRANT ALL ON fenced, fenced_id_seq TO app, scram_user;"
        ))
        .await
        .expect("set up roles and the fenced table");
        su
    }

    /// Runs `tool` (psql, pgbench) from the server's bin dir or PATH.
    pub fn tool(&self, tool: &str) -> Command {
        let path = self.bin.join(tool);
        Command::new(if path.exists() { path } else { PathBuf::from(tool) })
    }

    /// The pid of a backend, found by application_name.
    pub async fn backend_pid(&self, su: &Client, application_name: &str) -> Option<i32> {
        su.query_opt("SELECT pid FROM pg_stat_activity WHERE application_name = $1", &[&application_name])
            .await
            .expect("pg_stat_activity")
            .map(|r| r.get(0))
    }

    /// Whether backend `pid` is still in `pg_stat_activity`.
    pub async fn backend_alive(&self, su: &Client, pid: i32) -> bool {
        su.query_opt("SELECT 1 FROM pg_stat_activity WHERE pid = $1", &[&pid])
            .await
            .expect("pg_stat_activity")
            .is_some()
    }

    /// The fenced table's rows as (writer, token), in insertion order.
    pub async fn rows(&self, su: &Client) -> Vec<(String, i64)> {
        su.query("SELECT writer, token FROM fenced ORDER BY id", &[])
            .await
            .expect("read fenced")
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    }
}

impl Drop for TestPostgres {
    fn drop(&mut self) {
        let _ = self.run("pg_ctl", &["-D", self.data.to_str().unwrap_or_default(), "-m", "immediate", "-w", "stop"]);
    }
}

/// Connects to `addr` as `user` (with `password` for SCRAM), naming the
/// connection `application_name` = user unless `options` says otherwise.
pub async fn connect(addr: SocketAddr, user: &str, password: Option<&str>) -> Result<Client, tokio_postgres::Error> {
    connect_as(addr, user, password, user, None).await
}

/// [`connect`] with an application name and startup `options`.
pub async fn connect_as(
    addr: SocketAddr,
    user: &str,
    password: Option<&str>,
    application_name: &str,
    options: Option<&str>,
) -> Result<Client, tokio_postgres::Error> {
    let mut config = tokio_postgres::Config::new();
    config
        .host(addr.ip().to_string())
        .port(addr.port())
        .user(user)
        .dbname("postgres")
        .application_name(application_name)
        .connect_timeout(Duration::from_secs(10));
    if let Some(p) = password {
        config.password(p);
    }
    if let Some(o) = options {
        config.options(o);
    }
    let (client, connection) = config.connect(NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// The SQLSTATE of a failed statement, and its message.
pub fn code_of(e: &tokio_postgres::Error) -> (String, String) {
    match e.as_db_error() {
        Some(db) => (db.code().code().to_owned(), db.message().to_owned()),
        None => (String::new(), e.to_string()),
    }
}

/// The sidecar in front of `pg`, in process, with `extra` appended to its
/// `[postgres]` table and `tables` after it.
pub async fn sidecar(pg: &TestPostgres, data: &Path, extra: &str, tables: &str) -> ProxyHandle {
    let text = sidecar_config(pg, data, extra, tables, free_addr());
    let config = ProxyConfig::from_toml_str(&text).unwrap_or_else(|e| panic!("sidecar config: {e}\n{text}"));
    fencer_proxy::start(config, Some(1)).await.expect("the sidecar starts")
}

/// The sidecar's `proxy.toml` for `pg`.
pub fn sidecar_config(pg: &TestPostgres, data: &Path, extra: &str, tables: &str, listen: SocketAddr) -> String {
    format!(
        r#"
protocol = "postgres"
listen = "{listen}"
admin = "127.0.0.1:0"
data_dir = "{data}"

[timeouts]
quarantine = "1s"

[postgres]
upstream = "{upstream}"
resource = "pg/{{database}}"
read_only_users = ["reporting"]
{extra}

{tables}
"#,
        data = data.display(),
        upstream = pg.addr(),
    )
}

/// `[postgres.admin]` for the fixture's `fencer_admin` role, the password
/// in a file.
pub fn admin_table(dir: &Path) -> String {
    let file = dir.join("pg-admin-password");
    std::fs::write(&file, format!("{SCRAM_PASSWORD}\n")).expect("write the admin password file");
    format!("[postgres.admin]\nuser = \"fencer_admin\"\npassword_file = \"{}\"\n", file.display())
}
