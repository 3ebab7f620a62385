//! `fencer proxy` as a real process in front of a recording upstream, with
//! one route per hot resource (`POST /w/{name}` writes `res/{name}`, or
//! `POST /write?db={name}` for InfluxDB), killed with SIGKILL and restarted
//! on the same data dir and ports by the nemesis.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use fencer_proxy::testing::{Method, TestClient};

use super::super::common::{Proc, fencer_bin, free_port};

/// How the proxy routes writes to resources.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routes {
    /// `POST /w/{name}` → `res/{name}`.
    Paths,
    /// InfluxDB 1.x: `POST /write?db={name}` → `res/{name}`.
    Influx,
}

pub struct ProxyProc {
    pub listen: SocketAddr,
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
        let listen: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let write_route = match routes {
            Routes::Paths => "[[route]]\nmethods = [\"POST\"]\npath = \"/w/{name}\"\nresource = \"res/{name}\"\n",
            Routes::Influx => {
                "[[route]]\nmethods = [\"POST\"]\npath = \"/write\"\nquery = { db = \"{name}\" }\nresource = \"res/{name}\"\n"
            }
        };
        let config = dir.join("proxy.toml");
        std::fs::write(
            &config,
            format!(
                "listen = \"{listen}\"\nadmin = \"{admin}\"\nupstream = \"{upstream}\"\ndata_dir = \"{data}\"\n\n\
                 [timeouts]\nresponse = \"5s\"\nquarantine = \"1s\"\nshutdown_grace = \"2s\"\n\n\
                 [[route]]\nmethods = [\"GET\"]\npath = \"/ping\"\nkind = \"read\"\n\n{write_route}",
                data = dir.join("data").display()
            ),
        )
        .unwrap();
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
        let err = std::fs::File::create(&log).unwrap();
        let child = cmd
            .env("FENCER_LOG", "warn")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(err)
            .spawn()
            .expect("start fencer proxy");
        self.proc = Some(Proc { child, log });
    }

    /// Waits (bounded) until the admin API answers `/livez`.
    pub async fn wait_live(&mut self) {
        let client = TestClient::new();
        for _ in 0..300 {
            if let Ok(r) = client.send(self.admin, Method::GET, "/livez", &[], "").await
                && r.status.is_success()
            {
                return;
            }
            if let Some(p) = self.proc.as_mut()
                && let Ok(Some(status)) = p.child.try_wait()
            {
                panic!("fencer proxy exited ({status}); its log:\n{}", p.log_text());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("fencer proxy did not come up; its log:\n{}", self.logs());
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
