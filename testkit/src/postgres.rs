//! A throwaway PostgreSQL server (feature `postgres`): `initdb` in a
//! temporary directory, `pg_ctl -w start` on a free loopback port with its
//! unix socket in that directory, `pg_ctl stop -m immediate` when dropped.
//! PostgreSQL refuses to run as root, so as root both run as the `postgres`
//! system user (`runuser -u postgres`) and the directory is handed to it.
//!
//! The binaries come from `$FENCER_TEST_PG_BIN`, else the newest
//! `/usr/lib/postgresql/*/bin`, else `pg_config --bindir`. Without them
//! [`installed`] prints a loud `SKIPPED` (a failure when `CI=true`, see
//! [`crate::external`]).
//!
//! [`TestPostgres::setup`] makes the roles the sidecar's tests use: `app`
//! and `scram_user` (not superusers: a `pg_signal_backend` role cannot end a
//! superuser's backend), `reporting` (read-only), `fencer_admin`
//! (`pg_signal_backend`), and a table `fenced`. `pg_hba.conf` trusts every
//! role on loopback except `scram_user` and `fencer_admin`, which use
//! SCRAM-SHA-256 with [`SCRAM_PASSWORD`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tokio_postgres::{Client, NoTls};

/// The password of `scram_user` and `fencer_admin`.
pub const SCRAM_PASSWORD: &str = "correct horse battery staple";

/// Where the PostgreSQL binaries are, if anywhere.
pub fn bin_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("FENCER_TEST_PG_BIN") {
        return Some(PathBuf::from(dir));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, bin)| bin.join("initdb").exists())
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Some(bin);
    }
    let out = Command::new("pg_config").arg("--bindir").output().ok()?;
    let bin = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    bin.join("initdb").exists().then_some(bin)
}

/// The PostgreSQL binaries, or `None` after a loud `SKIPPED` naming `test`
/// (a panic when `CI=true`: CI installs PostgreSQL).
pub fn installed(test: &str) -> Option<PathBuf> {
    let found = bin_dir();
    let program =
        found.as_ref().map_or_else(|| PathBuf::from("/usr/lib/postgresql/*/bin/initdb"), |b| b.join("initdb"));
    crate::external::require(test, &program, "`apt-get install -y postgresql` (CI does), or set FENCER_TEST_PG_BIN")
        .then_some(found)
        .flatten()
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// A running throwaway PostgreSQL.
#[derive(Debug)]
pub struct TestPostgres {
    dir: tempfile::TempDir,
    data: PathBuf,
    bin: PathBuf,
    port: u16,
    as_postgres: bool,
}

/// Starts a server for `test`, or `None` when PostgreSQL is not installed
/// (see [`installed`]).
pub fn require(test: &str) -> Option<TestPostgres> {
    installed(test).map(TestPostgres::start)
}

impl TestPostgres {
    /// Runs a PostgreSQL server binary (`initdb`, `pg_ctl`) as the user
    /// PostgreSQL accepts.
    fn run(&self, tool: &str, args: &[&str]) -> Result<(), String> {
        run_as(self.as_postgres, &self.bin.join(tool), args)
    }

    /// `initdb`, the configuration, `pg_ctl -w start`; panics (a test
    /// fixture) when the server cannot start.
    pub fn start(bin: PathBuf) -> Self {
        Self::try_start(bin).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`TestPostgres::start`], answering why when the server cannot start
    /// (for `fencer bench --postgres`).
    pub fn try_start(bin: PathBuf) -> Result<Self, String> {
        let dir = tempfile::Builder::new()
            .prefix("fencer-pg-")
            .tempdir()
            .map_err(|e| format!("a temporary directory: {e}"))?;
        let root = dir.path().to_owned();
        let root_arg = root.to_str().ok_or("the temporary directory's path is not UTF-8")?.to_owned();
        let as_postgres = is_root();
        if as_postgres {
            run_as(false, Path::new("chown"), &["-R", "postgres", &root_arg])
                .map_err(|e| format!("handing the directory to the postgres user: {e}"))?;
        }
        let data = root.join("data");
        let data_arg = format!("{root_arg}/data");
        let port = crate::free_port();
        let pg = Self { dir, data: data.clone(), bin, port, as_postgres };
        pg.run("initdb", &["-D", &data_arg, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"])?;
        let hba = "local all all trust\n\
                   host all scram_user 127.0.0.1/32 scram-sha-256\n\
                   host all fencer_admin 127.0.0.1/32 scram-sha-256\n\
                   host all all 127.0.0.1/32 trust\n";
        let write = |name: &str, text: &str| {
            std::fs::write(data.join(name), text).map_err(|e| format!("writing {}: {e}", data.join(name).display()))
        };
        write("pg_hba.conf", hba)?;
        let mut conf = std::fs::read_to_string(data.join("postgresql.conf")).unwrap_or_default();
        conf.push_str(&format!(
            "\nlisten_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = '{root_arg}'\n\
             max_connections = 700\nfsync = off\nsynchronous_commit = off\nfull_page_writes = off\n\
             shared_buffers = 64MB\nlog_min_messages = warning\ntrack_commit_timestamp = on\n"
        ));
        write("postgresql.conf", &conf)?;
        if as_postgres {
            let _ = run_as(false, Path::new("chown"), &["-R", "postgres", &root_arg]);
        }
        let log = format!("{root_arg}/postgres.log");
        if let Err(e) = pg.run("pg_ctl", &["-D", &data_arg, "-l", &log, "-w", "-t", "60", "start"]) {
            return Err(format!("{e}\nserver log:\n{}", std::fs::read_to_string(&log).unwrap_or_default()));
        }
        Ok(pg)
    }

    /// The server's loopback address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's unix socket file.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join(format!(".s.PGSQL.{}", self.port))
    }

    /// The directory of the server's data, socket and log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A client program (`psql`, `pgbench`) from the server's bin dir, or
    /// from `PATH`.
    pub fn tool(&self, tool: &str) -> Command {
        let path = self.bin.join(tool);
        Command::new(if path.exists() { path } else { PathBuf::from(tool) })
    }

    /// A direct connection (not through a sidecar) as `user`.
    pub async fn direct(&self, user: &str) -> Client {
        connect(self.addr(), user, None).await.unwrap_or_else(|e| panic!("a direct connection as {user}: {e}"))
    }

    /// Creates the roles and the `fenced` table; returns a superuser
    /// connection.
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

    /// The pid of the backend whose `application_name` is `name`.
    pub async fn backend_pid(&self, su: &Client, name: &str) -> Option<i32> {
        su.query_opt("SELECT pid FROM pg_stat_activity WHERE application_name = $1", &[&name])
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

    /// The `fenced` table's rows as (writer, token), in insertion order.
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
        let data = self.data.to_str().unwrap_or_default().to_owned();
        // No panic here: this may run while a failed assertion unwinds.
        if let Err(e) = self.run("pg_ctl", &["-D", &data, "-m", "immediate", "-w", "stop"]) {
            eprintln!("stopping the test PostgreSQL failed: {e}");
        }
    }
}

fn run_as(as_postgres: bool, program: &Path, args: &[&str]) -> Result<(), String> {
    let mut command = if as_postgres {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    };
    let out = command.args(args).output().map_err(|e| format!("{}: {e}", program.display()))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "{} {args:?}: {}{}",
        program.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

/// Connects to `addr` as `user` (`password` for SCRAM), its
/// `application_name` the user's name.
pub async fn connect(addr: SocketAddr, user: &str, password: Option<&str>) -> Result<Client, tokio_postgres::Error> {
    connect_as(addr, user, password, user, None).await
}

/// [`connect`] with an `application_name` and startup `options`.
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
