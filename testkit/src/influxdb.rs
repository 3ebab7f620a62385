//! A throwaway InfluxDB 1.x server: `influxd` on free loopback ports with a
//! generated config and its data in a directory of the test, stopped by PID
//! when dropped. The real database the proxy's end-to-end tests protect.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::process::Proc;

/// Where `influxd` is expected (Debian package `influxdb`).
pub const INFLUXD: &str = "/usr/bin/influxd";

/// How long `influxd` may take to answer `/ping`.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Whether `influxd` is installed; a loud `SKIPPED` for `test` when not
/// (a failure with `CI=true`), see [`crate::external::require`].
pub fn installed(test: &str) -> bool {
    crate::external::require(test, Path::new(INFLUXD), "`apt-get install -y influxdb` (CI does)")
}

/// A running `influxd`.
#[derive(Debug)]
pub struct Influxd {
    /// Its HTTP API.
    pub http: SocketAddr,
    proc: Proc,
}

impl Influxd {
    /// Starts `influxd` with its config, data and log under `dir` and waits
    /// until `/ping` answers 204. Check [`installed`] first.
    pub async fn start(dir: &Path) -> Self {
        let http = crate::free_addr();
        let rpc = crate::free_addr();
        let conf = dir.join("influxdb.conf");
        std::fs::write(
            &conf,
            format!(
                r#"reporting-disabled = true
bind-address = "{rpc}"

[meta]
  dir = "{d}/meta"

[data]
  dir = "{d}/data"
  wal-dir = "{d}/wal"
  query-log-enabled = false

[monitor]
  store-enabled = false

[subscriber]
  enabled = false

[continuous_queries]
  enabled = false

[http]
  enabled = true
  bind-address = "{http}"
  auth-enabled = false
  log-enabled = false
  pprof-enabled = false
"#,
                d = dir.display()
            ),
        )
        .unwrap_or_else(|e| panic!("write {}: {e}", conf.display()));
        let mut proc =
            Proc::spawn("influxd", Command::new(INFLUXD).arg("-config").arg(&conf), &dir.join("influxd.log"));
        crate::wait_http(http, "/ping", 204, &mut proc, START_TIMEOUT).await;
        Self { http, proc }
    }

    /// `CREATE DATABASE name`; panics when InfluxDB refuses.
    pub async fn create_database(&self, name: &str) {
        let path = format!("/query?q=CREATE+DATABASE+{name}");
        let r = crate::http::http_request(self.http, "POST", &path, "", Duration::from_secs(10)).await;
        assert!(r.as_ref().is_ok_and(|(code, _)| *code == 200), "CREATE DATABASE {name}: {r:?}");
    }

    /// The process, to stop it or read its log.
    pub fn proc(&mut self) -> &mut Proc {
        &mut self.proc
    }
}
