//! `fencer proxy` as a real process in front of a recording upstream, with
//! one route per hot resource (`POST /w/{name}` writes `res/{name}`, or
//! `POST /write?db={name}` for InfluxDB), killed with SIGKILL and restarted
//! on the same data dir and ports by the nemesis.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use fencer_testkit::{Proc, ProxyConfigBuilder, fencer_bin, free_addr, wait_http};

/// How the proxy routes writes to resources.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routes {
    /// `POST /w/{name}` → `res/{name}`.
    Paths,
    /// InfluxDB 1.x: `POST /write?db={name}` → `res/{name}`.
    Influx,
    /// The PostgreSQL sidecar: database `{name}` → `res/{name}`.
    Postgres,
}

/// `fencer proxy`, restartable on its data dir and ports.
pub struct ProxyProc {
    /// Where clients write.
    pub listen: SocketAddr,
    /// Its admin API.
    pub admin: SocketAddr,
    dir: PathBuf,
    config: PathBuf,
    proc: Option<Proc>,
    starts: u32,
}

impl ProxyProc {
    /// Starts the proxy in front of `upstream` (`http://…`) with a fresh
    /// store raised to floor 1, and waits until it serves.
    pub async fn start(dir: PathBuf, upstream: &str, routes: Routes) -> Self {
        std::fs::create_dir_all(&dir).unwrap();
        let (listen, admin) = (free_addr(), free_addr());
        let config = ProxyConfigBuilder::new(upstream, dir.join("data"))
            .listen(listen)
            .admin(admin)
            .table("timeouts", "response = \"5s\"\nquarantine = \"1s\"\nshutdown_grace = \"2s\"")
            .read(&["GET"], "/ping");
        let config = match routes {
            Routes::Paths => config.write(&["POST"], "/w/{name}", "res/{name}"),
            Routes::Influx => config.write_if(&["POST"], "/write", ("db", "{name}"), "res/{name}"),
            Routes::Postgres => unreachable!("start_postgres"),
        };
        let config = config.write_to(&dir.join("proxy.toml"));
        Self::launch(listen, admin, dir, config).await
    }

    /// `fencer proxy --protocol postgres` in front of `pg`: resource
    /// `res/{database}`, older transactions ended through the admin
    /// connection after 300 ms (G5), a 5 s statement timeout (G7).
    pub async fn start_postgres(dir: PathBuf, pg: &super::upstream::PgRecorder) -> Self {
        std::fs::create_dir_all(&dir).unwrap();
        let (listen, admin) = (free_addr(), free_addr());
        let text = format!(
            r#"protocol = "postgres"
listen = "{listen}"
admin = "{admin}"
data_dir = "{data}"

[timeouts]
quarantine = "1s"
shutdown_grace = "2s"

[postgres]
upstream = "{upstream}"
resource = "res/{{database}}"
drain_timeout = "300ms"
terminate_timeout = "3s"
statement_timeout = "5s"

[postgres.admin]
user = "fencer_admin"
password_file = "{password}"
"#,
            data = dir.join("data").display(),
            upstream = pg.pg.addr(),
            password = pg.admin_password_file.display(),
        );
        let config = dir.join("proxy.toml");
        std::fs::write(&config, text).unwrap();
        Self::launch(listen, admin, dir, config).await
    }

    async fn launch(listen: SocketAddr, admin: SocketAddr, dir: PathBuf, config: PathBuf) -> Self {
        let mut p = Self { listen, admin, dir, config, proc: None, starts: 0 };
        p.spawn(true);
        p.wait_live().await;
        p
    }

    fn spawn(&mut self, floor: bool) {
        self.starts += 1;
        let log = self.dir.join(format!("proxy-{}.log", self.starts));
        let mut cmd = Command::new(fencer_bin());
        cmd.args(["proxy", "--config"]).arg(&self.config);
        if floor {
            cmd.args(["--floor", "1"]);
        }
        self.proc = Some(Proc::spawn("fencer proxy", cmd.env("FENCER_LOG", "warn"), &log));
    }

    /// Waits (bounded) until the admin API answers `/livez`.
    pub async fn wait_live(&mut self) {
        let proc = self.proc.as_mut().expect("the proxy was started");
        wait_http(self.admin, "/livez", 200, proc, Duration::from_secs(15)).await;
    }

    /// kill -9, by PID.
    pub fn kill9(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill9();
        }
    }

    /// Starts it again on the same data dir and ports (no floor: the store
    /// remembers its epochs).
    pub async fn restart(&mut self) {
        assert!(self.proc.is_none(), "the proxy is running");
        self.spawn(false);
        self.wait_live().await;
    }

    /// The logs of every start.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for i in 1..=self.starts {
            let path = self.dir.join(format!("proxy-{i}.log"));
            if let Ok(text) = std::fs::read_to_string(&path) {
                out.push_str(&format!("--- {}\n{text}", path.display()));
            }
        }
        out
    }
}

impl Drop for ProxyProc {
    fn drop(&mut self) {
        self.kill9();
    }
}
