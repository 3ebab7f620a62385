//! Local servers the bench starts and stops itself: a 3-node fencer cluster
//! (`fencer coordinator` processes of this very binary), and with
//! `bench-peers` a 3-member etcd cluster and one `redis-server`.
//!
//! Everything binds loopback ports, keeps its data in a temporary dir, logs
//! to a file there, and is stopped by its own PID (SIGTERM, then SIGKILL
//! after a bound); the kit's process guard kills it on an early return or
//! a panic.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use fencer_client::Client;
use fencer_testkit::Proc;
use tokio::time::Instant;

/// How long a graceful stop may take before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// The servers' log filter unless `FENCER_BENCH_SERVER_LOG` names another
/// (e.g. `info,openraft=info` to see elections in the node logs).
const SERVER_LOG: &str = "info,openraft=warn";

/// Starts `program ARGS…` as `name`, its output to `log`, owned by a
/// [`Proc`] (killed by its PID if the bench stops early).
pub(crate) fn spawn(name: &str, program: &Path, args: &[String], log: &Path) -> anyhow::Result<Proc> {
    let mut cmd = std::process::Command::new(program);
    let filter = std::env::var("FENCER_BENCH_SERVER_LOG").unwrap_or_else(|_| SERVER_LOG.to_string());
    cmd.args(args).env("FENCER_LOG", filter);
    Proc::try_spawn(name, &mut cmd, log).with_context(|| format!("start {name} ({})", program.display()))
}

/// `n` free loopback ports (bound at once so they differ, then released).
pub(crate) fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    fencer_testkit::free_ports(n).context("bind a loopback port")
}

/// The last lines of a process's log, for error messages.
fn tail(p: &Proc) -> String {
    p.log_tail(8)
}

/// One node of a local fencer cluster.
pub(crate) struct FencerNode {
    pub(crate) id: u64,
    pub(crate) addr: SocketAddr,
    pub(crate) proc: Option<Proc>,
}

/// A local 3-node fencer cluster, or the nodes of an existing one.
pub(crate) struct FencerCluster {
    pub(crate) nodes: Vec<FencerNode>,
    /// Kept so the data outlives the processes; `None` for an external cluster.
    _dir: Option<tempfile::TempDir>,
}

impl FencerCluster {
    /// Starts `fencer coordinator` ×3 from `bin` and waits for a leader.
    /// Logs go to `logs/node{id}.log`.
    pub(crate) async fn start(bin: &Path, base: &Path, snapshot_every: u64, logs: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(base).with_context(|| format!("create {}", base.display()))?;
        std::fs::create_dir_all(logs).with_context(|| format!("create {}", logs.display()))?;
        let dir = tempfile::Builder::new().prefix("fencer-bench-").tempdir_in(base)?;
        let ports = free_ports(3)?;
        let addrs: Vec<SocketAddr> = ports.iter().map(|p| SocketAddr::from(([127, 0, 0, 1], *p))).collect();
        let peers = addrs.iter().enumerate().map(|(i, a)| format!("{}={a}", i + 1)).collect::<Vec<_>>().join(",");
        let mut nodes = Vec::new();
        for (i, addr) in addrs.iter().enumerate() {
            let id = i as u64 + 1;
            let data = dir.path().join(format!("node{id}"));
            let args = vec![
                "coordinator".to_string(),
                format!("--id={id}"),
                format!("--listen={addr}"),
                format!("--peers={peers}"),
                format!("--data-dir={}", data.display()),
                format!("--snapshot-every={snapshot_every}"),
            ];
            let proc = spawn(&format!("fencer node {id}"), bin, &args, &logs.join(format!("node{id}.log")))?;
            nodes.push(FencerNode { id, addr: *addr, proc: Some(proc) });
        }
        let cluster = Self { nodes, _dir: Some(dir) };
        cluster.wait_for_leader(Duration::from_secs(30)).await.map_err(|e| {
            let logs: Vec<String> = cluster
                .nodes
                .iter()
                .filter_map(|n| n.proc.as_ref().map(|p| format!("node {}:\n{}", n.id, tail(p))))
                .collect();
            e.context(logs.join("\n"))
        })?;
        Ok(cluster)
    }

    /// An existing cluster: nothing to start, nothing to stop.
    pub(crate) fn external(endpoints: &[String]) -> anyhow::Result<Self> {
        let nodes = endpoints
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let addr = tokio_addr(e)?;
                Ok(FencerNode { id: i as u64 + 1, addr, proc: None })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Self { nodes, _dir: None })
    }

    pub(crate) fn endpoints(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.addr.to_string()).collect()
    }

    /// The leader's node id, as a live node reports it; waits (bounded).
    pub(crate) async fn wait_for_leader(&self, timeout: Duration) -> anyhow::Result<u64> {
        let client = Client::new(self.endpoints())?.with_call_timeout(Duration::from_secs(1));
        let deadline = Instant::now() + timeout;
        let mut last = String::from("no node answered");
        while Instant::now() < deadline {
            for n in &self.nodes {
                match client.node_status(&n.addr.to_string()).await {
                    Ok(s) if s.has_leader && s.state == "leader" => {
                        // Prefer the leader's own word: it serves writes.
                        return Ok(s.node_id);
                    }
                    Ok(s) => last = format!("node {} is {} (leader known: {})", s.node_id, s.state, s.has_leader),
                    Err(e) => last = format!("node {}: {e}", n.id),
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        anyhow::bail!("no leader within {timeout:?}: {last}")
    }

    /// A live follower of `leader`, if any.
    pub(crate) fn follower_of(&self, leader: u64) -> Option<u64> {
        self.nodes.iter().find(|n| n.id != leader && n.proc.is_some()).map(|n| n.id)
    }

    /// `kill -9` of node `id` (by its PID); returns the moment of the kill.
    pub(crate) async fn kill(&mut self, id: u64) -> anyhow::Result<Instant> {
        let node = self.nodes.iter_mut().find(|n| n.id == id).context("no such node")?;
        let mut proc = node.proc.take().context("the node was not started by the bench")?;
        let at = Instant::now();
        proc.kill().await;
        Ok(at)
    }

    /// Live processes: node id and PID.
    pub(crate) fn pids(&self) -> Vec<(u64, u32)> {
        self.nodes.iter().filter_map(|n| n.proc.as_ref().map(|p| (n.id, p.pid()))).collect()
    }

    /// Addresses of the nodes still running (all of them for an external cluster).
    pub(crate) fn live_addrs(&self) -> Vec<(u64, SocketAddr)> {
        let external = self._dir.is_none();
        self.nodes.iter().filter(|n| external || n.proc.is_some()).map(|n| (n.id, n.addr)).collect()
    }

    pub(crate) async fn stop(mut self) {
        for n in &mut self.nodes {
            if let Some(mut p) = n.proc.take() {
                p.stop(STOP_GRACE).await;
            }
        }
    }
}

fn tokio_addr(endpoint: &str) -> anyhow::Result<SocketAddr> {
    use std::net::ToSocketAddrs;
    let e = endpoint.trim_start_matches("http://");
    e.to_socket_addrs()?.next().with_context(|| format!("{endpoint:?} resolves to no address"))
}

#[cfg(feature = "bench-peers")]
pub(crate) use peers::{EtcdCluster, RedisServer};

#[cfg(feature = "bench-peers")]
mod peers {
    use std::net::SocketAddr;
    use std::path::Path;
    use std::time::Duration;

    use anyhow::Context as _;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::time::Instant;

    use fencer_testkit::{Proc, http_get};

    use super::{STOP_GRACE, free_ports, spawn, tail};

    /// Three etcd members on loopback, data in a temporary dir.
    pub(crate) struct EtcdCluster {
        pub(crate) members: Vec<Proc>,
        pub(crate) client_urls: Vec<String>,
        _dir: tempfile::TempDir,
    }

    impl EtcdCluster {
        pub(crate) async fn start(bin: &Path, base: &Path, logs: &Path) -> anyhow::Result<Self> {
            std::fs::create_dir_all(logs)?;
            let dir = tempfile::Builder::new().prefix("etcd-bench-").tempdir_in(base)?;
            let ports = free_ports(6)?;
            let (client, peer) = ports.split_at(3);
            let initial = (0..3).map(|i| format!("m{i}=http://127.0.0.1:{}", peer[i])).collect::<Vec<_>>().join(",");
            let mut members = Vec::new();
            for i in 0..3 {
                let args = vec![
                    format!("--name=m{i}"),
                    format!("--data-dir={}", dir.path().join(format!("m{i}")).display()),
                    format!("--listen-client-urls=http://127.0.0.1:{}", client[i]),
                    format!("--advertise-client-urls=http://127.0.0.1:{}", client[i]),
                    format!("--listen-peer-urls=http://127.0.0.1:{}", peer[i]),
                    format!("--initial-advertise-peer-urls=http://127.0.0.1:{}", peer[i]),
                    format!("--initial-cluster={initial}"),
                    "--initial-cluster-state=new".into(),
                    "--initial-cluster-token=fencer-bench".into(),
                    "--log-level=warn".into(),
                    "--logger=zap".into(),
                    // etcd's defaults, spelled out: 100 ms heartbeat, 1 s
                    // election timeout (fencer: 50 ms, 150–300 ms).
                    "--heartbeat-interval=100".into(),
                    "--election-timeout=1000".into(),
                ];
                members.push(spawn(&format!("etcd m{i}"), bin, &args, &logs.join(format!("m{i}.log")))?);
            }
            let client_urls: Vec<String> = client.iter().map(|p| format!("http://127.0.0.1:{p}")).collect();
            let this = Self { members, client_urls, _dir: dir };
            let deadline = Instant::now() + Duration::from_secs(30);
            for p in client {
                let addr = SocketAddr::from(([127, 0, 0, 1], *p));
                loop {
                    if let Ok((200, body)) = http_get(addr, "/health", Duration::from_secs(2)).await
                        && body.contains("true")
                    {
                        break;
                    }
                    if Instant::now() > deadline {
                        let tails: Vec<String> = this.members.iter().map(tail).collect();
                        anyhow::bail!("etcd not healthy within 30 s:\n{}", tails.join("\n"));
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            Ok(this)
        }

        pub(crate) fn pids(&self) -> Vec<(u64, u32)> {
            self.members.iter().enumerate().map(|(i, p)| (i as u64 + 1, p.pid())).collect()
        }

        pub(crate) async fn stop(self) {
            for mut m in self.members {
                m.stop(STOP_GRACE).await;
            }
        }
    }

    /// One `redis-server` without persistence (the unsafe speed reference).
    pub(crate) struct RedisServer {
        pub(crate) proc: Proc,
        pub(crate) addr: SocketAddr,
        _dir: tempfile::TempDir,
    }

    impl RedisServer {
        pub(crate) async fn start(bin: &Path, base: &Path, logs: &Path) -> anyhow::Result<Self> {
            std::fs::create_dir_all(logs)?;
            let dir = tempfile::Builder::new().prefix("redis-bench-").tempdir_in(base)?;
            let port = free_ports(1)?[0];
            let args = vec![
                "--bind".into(),
                "127.0.0.1".into(),
                "--port".into(),
                port.to_string(),
                "--save".into(),
                String::new(),
                "--appendonly".into(),
                "no".into(),
                "--dir".into(),
                dir.path().display().to_string(),
                "--daemonize".into(),
                "no".into(),
            ];
            let proc = spawn("redis-server", bin, &args, &logs.join("redis.log"))?;
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if ping(addr).await.unwrap_or(false) {
                    break;
                }
                if Instant::now() > deadline {
                    anyhow::bail!("redis-server did not answer PING within 10 s:\n{}", tail(&proc));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(Self { proc, addr, _dir: dir })
        }

        pub(crate) async fn stop(mut self) {
            self.proc.stop(STOP_GRACE).await;
        }
    }

    async fn ping(addr: SocketAddr) -> anyhow::Result<bool> {
        let work = async {
            let mut s = tokio::net::TcpStream::connect(addr).await?;
            s.write_all(b"PING\r\n").await?;
            let mut buf = [0u8; 16];
            let n = s.read(&mut buf).await?;
            anyhow::Ok(buf[..n].starts_with(b"+PONG"))
        };
        tokio::time::timeout(Duration::from_secs(1), work).await.context("PING timed out")?
    }
}
