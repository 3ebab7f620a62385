//! The process-level cluster harness: real `fencer coordinator` processes,
//! each on its own loopback address (127.0.0.x — every one of them is
//! loopback on Linux) and data dir, driven by PID: [`ProcCluster::kill9`],
//! [`ProcCluster::restart`], [`ProcCluster::pause`] (SIGSTOP) and
//! [`ProcCluster::resume`] (SIGCONT). Never pkill or killall.
//!
//! It shares the history and the invariant checkers of the in-process
//! harness ([`crate::history`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

use crate::net::{free_port_on, loopback_ip};
use crate::process::{Proc, Signal, signal, spawn_fencer};
use crate::relay::{Relay, RelayNet};

/// Heartbeat of test clusters (`--heartbeat`).
pub const HEARTBEAT: &str = "50ms";
/// Shortest election timeout (`--election-timeout`); the longest is twice it.
pub const ELECTION_MIN: &str = "150ms";
/// The longest election timeout: also the quorum lease.
pub const ELECTION_MAX: Duration = Duration::from_millis(300);

/// A cluster of `fencer coordinator` processes.
pub struct ProcCluster {
    /// Data dirs and logs of every node.
    pub dir: tempfile::TempDir,
    /// Where each node listens (status and readiness are asked here).
    pub addrs: BTreeMap<u64, String>,
    /// What the nodes call each other and give clients as leader hints: the
    /// relay addresses in a relayed cluster, else `addrs`.
    pub advertised: BTreeMap<u64, String>,
    /// The network fault rules of a relayed cluster.
    pub net: Option<Arc<RelayNet>>,
    /// Kept so the relays run as long as the cluster (each stops when dropped).
    _relays: Vec<Relay>,
    procs: BTreeMap<u64, Option<Proc>>,
    args: Vec<String>,
    starts: u32,
}

impl ProcCluster {
    /// Starts `n` nodes with the fast test timings and waits until they
    /// settled on a leader.
    pub async fn start(n: u64) -> Self {
        Self::start_with(n, &["--heartbeat", HEARTBEAT, "--election-timeout", ELECTION_MIN]).await
    }

    /// Starts `n` nodes with extra `fencer coordinator` arguments.
    pub async fn start_with(n: u64, args: &[&str]) -> Self {
        // Spread clusters over 127.0.0.0/8 so parallel test binaries rarely meet.
        let addrs: BTreeMap<u64, String> = (1..=n)
            .map(|id| {
                let ip = loopback_ip(id);
                (id, format!("{ip}:{}", free_port_on(&ip)))
            })
            .collect();
        let mut c = Self {
            dir: tempfile::tempdir().unwrap(),
            advertised: addrs.clone(),
            addrs,
            net: None,
            _relays: Vec::new(),
            procs: BTreeMap::new(),
            args: args.iter().map(|s| s.to_string()).collect(),
            starts: 0,
        };
        for id in c.ids() {
            c.procs.insert(id, None);
            c.restart(id);
        }
        c.settled(Duration::from_secs(20)).await;
        c
    }

    /// Like [`start_with`](Self::start_with), with every node behind a
    /// [relay](crate::relay), so the raft network between the
    /// processes can be cut: [`isolate`](Self::isolate),
    /// [`drop_one_way`](Self::drop_one_way), [`cut`](Self::cut),
    /// [`delay`](Self::delay), [`heal`](Self::heal), and answers lost after
    /// commit ([`drop_acquire_answers`](Self::drop_acquire_answers)).
    pub async fn start_relayed(n: u64, args: &[&str]) -> Self {
        let net = Arc::new(RelayNet::default());
        let mut addrs = BTreeMap::new();
        let mut advertised = BTreeMap::new();
        let mut relays = Vec::new();
        for id in 1..=n {
            let ip = loopback_ip(id);
            let addr = format!("{ip}:{}", free_port_on(&ip));
            let relay = Relay::start(id, &ip, &addr, net.clone()).await;
            advertised.insert(id, relay.addr.to_string());
            addrs.insert(id, addr);
            relays.push(relay);
        }
        let mut c = Self {
            dir: tempfile::tempdir().unwrap(),
            addrs,
            advertised,
            net: Some(net),
            _relays: relays,
            procs: BTreeMap::new(),
            args: args.iter().map(|s| s.to_string()).collect(),
            starts: 0,
        };
        for id in c.ids() {
            c.procs.insert(id, None);
            c.restart(id);
        }
        c.settled(Duration::from_secs(30)).await;
        c
    }

    fn relay_net(&self) -> &RelayNet {
        self.net.as_deref().expect("network faults need a cluster started with start_relayed")
    }

    /// Every raft message to or from `n` is lost (clients still reach it).
    pub fn isolate(&self, n: u64) {
        self.relay_net().isolate(n);
    }

    /// Raft messages between `a` and `b` are lost, both ways.
    pub fn cut(&self, a: u64, b: u64) {
        self.relay_net().drop_one_way(a, b);
        self.relay_net().drop_one_way(b, a);
    }

    /// Raft messages from `from` to `to` are lost.
    pub fn drop_one_way(&self, from: u64, to: u64) {
        self.relay_net().drop_one_way(from, to);
    }

    /// Raft messages from `from` to `to` arrive `d` late.
    pub fn delay(&self, from: u64, to: u64, d: Duration) {
        self.relay_net().delay(from, to, d);
    }

    /// The next `count` acquire answers of node `n` are lost after it answered.
    pub fn drop_acquire_answers(&self, n: u64, count: usize) {
        self.relay_net().drop_acquire_answers(n, count);
    }

    /// Every network fault removed.
    pub fn heal(&self) {
        self.relay_net().heal();
    }

    /// The addresses clients should use: the advertised ones, comma-separated.
    pub fn client_endpoints(&self) -> Vec<String> {
        self.advertised.values().cloned().collect()
    }

    /// Every node id, running or not.
    pub fn ids(&self) -> Vec<u64> {
        self.addrs.keys().copied().collect()
    }

    /// `--peers` of the nodes: `id=advertised address`, comma-separated.
    pub fn peers(&self) -> String {
        self.advertised.iter().map(|(id, a)| format!("{id}={a}")).collect::<Vec<_>>().join(",")
    }

    /// Every node's address, comma-separated (for `--endpoints`).
    pub fn endpoints(&self) -> String {
        self.addrs.values().cloned().collect::<Vec<_>>().join(",")
    }

    /// Node `n`'s data dir.
    pub fn data_dir(&self, n: u64) -> PathBuf {
        self.dir.path().join(format!("n{n}"))
    }

    /// Node `n`'s PID; panics when it does not run.
    pub fn pid(&self, n: u64) -> u32 {
        self.procs[&n].as_ref().expect("node runs").pid()
    }

    /// The `fencer coordinator` arguments of node `n` with `data_dir`.
    pub fn coordinator_args(&self, n: u64, data_dir: &std::path::Path) -> Vec<String> {
        let mut a = vec![
            "coordinator".to_string(),
            "--id".into(),
            n.to_string(),
            "--listen".into(),
            self.addrs[&n].clone(),
            "--peers".into(),
            self.peers(),
            "--data-dir".into(),
            data_dir.display().to_string(),
        ];
        a.extend(self.args.iter().cloned());
        a
    }

    /// Starts node `n` (again) on its data dir; does not wait.
    pub fn restart(&mut self, n: u64) {
        assert!(self.procs[&n].is_none(), "node {n} is running");
        self.starts += 1;
        let args = self.coordinator_args(n, &self.data_dir(n));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let log = self.dir.path().join(format!("n{n}-{}.log", self.starts));
        self.procs.insert(n, Some(spawn_fencer(&args, &log)));
    }

    /// kill -9, by PID.
    pub fn kill9(&mut self, n: u64) {
        if let Some(mut p) = self.procs.get_mut(&n).and_then(Option::take) {
            p.kill9();
        }
    }

    /// SIGSTOP, by PID: the process keeps its sockets but runs no code.
    pub fn pause(&self, n: u64) {
        signal(self.pid(n), Signal::STOP);
    }

    /// SIGCONT, by PID.
    pub fn resume(&self, n: u64) {
        signal(self.pid(n), Signal::CONT);
    }

    /// The ids of running nodes.
    pub fn running(&self) -> Vec<u64> {
        self.procs.iter().filter(|(_, p)| p.is_some()).map(|(id, _)| *id).collect()
    }

    /// The logs of every start of node `n`.
    pub fn logs(&self, n: u64) -> String {
        let mut out = String::new();
        for i in 1..=self.starts {
            let path = self.dir.path().join(format!("n{n}-{i}.log"));
            if let Ok(text) = std::fs::read_to_string(&path) {
                out.push_str(&format!("--- {}\n{text}", path.display()));
            }
        }
        out
    }

    /// `GET /v1/status` of node `n` (JSON), if it answers within 1 s.
    pub async fn status(&self, n: u64) -> Option<Value> {
        let (code, body) = crate::http_get(self.addrs[&n].as_str(), "/v1/status", Duration::from_secs(1)).await.ok()?;
        (code == 200).then(|| serde_json::from_str(&body).ok()).flatten()
    }

    /// `GET /readyz` status code of node `n`.
    pub async fn readyz(&self, n: u64) -> Option<u16> {
        crate::http_get(self.addrs[&n].as_str(), "/readyz", Duration::from_secs(1)).await.ok().map(|r| r.0)
    }

    /// The leader among `ids`: the node in the highest term that calls
    /// itself leader and that another of `ids` follows.
    pub async fn leader_among(&self, ids: &[u64], timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        loop {
            let mut views = BTreeMap::new();
            for id in ids {
                if let Some(s) = self.status(*id).await {
                    views.insert(*id, s);
                }
            }
            let best = views
                .iter()
                .filter(|(id, s)| {
                    s["state"] == "leader"
                        && views.iter().any(|(o, v)| o != *id && v["leader_id"].as_u64() == Some(**id))
                })
                .max_by_key(|(_, s)| s["term"].as_u64());
            if let Some((id, _)) = best {
                return *id;
            }
            assert!(Instant::now() < deadline, "no leader among {ids:?} within {timeout:?}; views: {views:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until every running node follows one leader that took over
    /// its leases; returns the leader.
    pub async fn settled(&self, timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        loop {
            let running = self.running();
            let mut views = Vec::new();
            for id in &running {
                views.push((*id, self.status(*id).await));
            }
            let leader = views.iter().find_map(|(id, s)| {
                s.as_ref().filter(|s| s["state"] == "leader" && s["leader_ready"] == true).map(|_| *id)
            });
            if let Some(l) = leader
                && views.iter().all(|(_, s)| s.as_ref().is_some_and(|s| s["leader_id"].as_u64() == Some(l)))
            {
                return l;
            }
            if Instant::now() > deadline {
                let logs: String = running.iter().map(|n| self.logs(*n)).collect();
                panic!("the cluster did not settle within {timeout:?}; views: {views:?}\n{logs}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for ProcCluster {
    fn drop(&mut self) {
        // A stopped process dies of SIGKILL too; Proc's own drop kills by PID.
        for id in self.ids() {
            self.kill9(id);
        }
    }
}
