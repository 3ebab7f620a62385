//! The raw ceiling: what the same 3-node cluster commits when every entry is
//! a no-op and nothing else runs (no gRPC clients, no lock state), and what
//! the disk under the data dir does in a write + fdatasync loop. Lock
//! throughput is reported as a fraction of the first; the second bounds the
//! first unless commits are batched (group commit).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use fencer_coordinator::{Node, NodeConfig};
use hdrhistogram::Histogram;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::report::{Latency, RateResult};
use super::servers::free_ports;
use super::workload::{micros_between, new_histogram};

/// Commits no-op entries (`raft().write_blank()`) from `writers` tasks on the
/// leader of an in-process 3-node cluster for `duration`.
pub(crate) async fn commit_ceiling(
    base: &Path,
    writers: usize,
    duration: Duration,
    snapshot_every: u64,
) -> anyhow::Result<RateResult> {
    std::fs::create_dir_all(base)?;
    let dir = tempfile::Builder::new().prefix("fencer-ceiling-").tempdir_in(base)?;
    let ports = free_ports(3)?;
    let peers: BTreeMap<u64, String> =
        ports.iter().enumerate().map(|(i, p)| (i as u64 + 1, format!("127.0.0.1:{p}"))).collect();
    let mut nodes = Vec::new();
    for (id, addr) in &peers {
        let listen: SocketAddr = addr.parse()?;
        let mut config = NodeConfig::single(dir.path().join(format!("node{id}")), listen);
        config.node_id = *id;
        config.peers = peers.clone();
        config.snapshot_every = snapshot_every;
        nodes.push(Node::start(config).await.with_context(|| format!("start in-process node {id}"))?);
    }
    let result = async {
        let leader = nodes[0].wait_for_leader(Duration::from_secs(30)).await.map_err(anyhow::Error::msg)?;
        // Nodes were started in id order from 1.
        let node = usize::try_from(leader).ok().and_then(|l| nodes.get(l - 1)).context("leader node")?;
        // Let the new leader settle (its first blank entry, lease restarts).
        tokio::time::sleep(Duration::from_millis(500)).await;
        let raft = Arc::new(node.raft().clone());
        let start = Instant::now();
        let deadline = start + duration;
        let mut tasks = JoinSet::new();
        for _ in 0..writers.max(1) {
            let raft = raft.clone();
            tasks.spawn(async move {
                let mut hist = new_histogram();
                let mut errors = 0u64;
                while Instant::now() < deadline {
                    let t0 = Instant::now();
                    match tokio::time::timeout(Duration::from_secs(5), raft.write_blank()).await {
                        Ok(Ok(_)) => {
                            let _ = hist.record(micros_between(t0, Instant::now()));
                        }
                        _ => errors += 1,
                    }
                }
                (hist, errors)
            });
        }
        let mut hist = new_histogram();
        let mut errors = 0;
        while let Some(r) = tasks.join_next().await {
            let (h, e) = r?;
            hist.add(h)?;
            errors += e;
        }
        let elapsed = Instant::now() - start;
        anyhow::Ok(RateResult::from_histogram(&hist, errors, elapsed))
    }
    .await;
    for n in nodes {
        n.shutdown().await;
    }
    result
}

/// Appends 4 KiB and `fdatasync`s, in a loop, for `duration` (and at most
/// 100,000 times) in a file under `base`: the disk's durable-write rate.
pub(crate) async fn fsync_rate(base: &Path, duration: Duration) -> anyhow::Result<RateResult> {
    std::fs::create_dir_all(base)?;
    let dir = tempfile::Builder::new().prefix("fsync-").tempdir_in(base)?;
    let path = dir.path().join("probe");
    tokio::task::spawn_blocking(move || -> anyhow::Result<RateResult> {
        let mut file = std::fs::OpenOptions::new().create(true).write(true).truncate(true).open(&path)?;
        let block = vec![0x5au8; 4096];
        let mut hist: Histogram<u64> = new_histogram();
        let start = Instant::now();
        let deadline = start + duration;
        let mut written = 0u64;
        for _ in 0..100_000 {
            if Instant::now() >= deadline {
                break;
            }
            if written >= 64 << 20 {
                // Bounded file: start over (the blocks are allocated by now,
                // like a preallocated log segment).
                file = std::fs::OpenOptions::new().write(true).truncate(true).open(&path)?;
                written = 0;
            }
            let t0 = Instant::now();
            file.write_all(&block)?;
            file.sync_data()?;
            written += block.len() as u64;
            let _ = hist.record(micros_between(t0, Instant::now()));
        }
        Ok(RateResult::from_histogram(&hist, 0, Instant::now() - start))
    })
    .await?
}

impl RateResult {
    pub(crate) fn from_histogram(hist: &Histogram<u64>, errors: u64, elapsed: Duration) -> Self {
        Self {
            ops: hist.len(),
            errors,
            seconds: elapsed.as_secs_f64(),
            per_s: hist.len() as f64 / elapsed.as_secs_f64(),
            latency: Latency::of(hist),
        }
    }
}
