//! Acquire→release round trips against a coordinator (one node or a
//! cluster), closed loop with N concurrent clients, for a fixed duration.
//! Prints throughput and latency percentiles (HDR histogram). The full
//! open-loop benchmark is `fencer bench`.
//!
//! ```text
//! cargo run --release --example lock_bench -- [CLIENTS] [SECONDS] [ENDPOINT[,ENDPOINT…]]
//! ```
//! Without ENDPOINT it starts a node in-process on a temporary data dir.
//! With several endpoints (the nodes of a cluster) each client finds the
//! leader and follows it, as applications do.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use fencer_client::Client;
use fencer_coordinator::{Node, NodeConfig};
use hdrhistogram::Histogram;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let clients: usize = args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(64);
    let seconds: u64 = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(10);
    let dir = tempfile::tempdir()?;
    let (endpoint, node) = match args.get(3) {
        Some(eps) => (eps.clone(), None),
        None => {
            let node = Node::start(NodeConfig::single(dir.path(), "127.0.0.1:0".parse()?)).await?;
            node.wait_for_leader(Duration::from_secs(10)).await.map_err(anyhow::Error::msg)?;
            tokio::time::sleep(Duration::from_millis(300)).await;
            (node.local_addr().to_string(), Some(node))
        }
    };
    println!("lock_bench: {clients} clients, {seconds} s, endpoints {endpoint}");
    let endpoints: Vec<String> = endpoint.split(',').map(str::to_string).collect();
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for c in 0..clients {
        let client = Arc::new(Client::new(endpoints.clone())?);
        tasks.push(tokio::spawn(async move {
            let mut rt = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram");
            let mut acq = rt.clone();
            let mut errors = 0u64;
            let mut i = 0u64;
            while Instant::now() < deadline {
                let resource = format!("bench/{c}/{}", i % 1000);
                i += 1;
                let t0 = Instant::now();
                // The bare grant: no renewal task, as before.
                let lease = match client.acquire(resource.clone()).grant().await {
                    Ok(l) => l,
                    Err(_) => {
                        errors += 1;
                        continue;
                    }
                };
                let t1 = Instant::now();
                if client.release(&resource, &lease.lease_id.to_string()).await.is_err() {
                    errors += 1;
                    continue;
                }
                let _ = acq.record((t1 - t0).as_micros() as u64);
                let _ = rt.record(t0.elapsed().as_micros() as u64);
            }
            (rt, acq, errors)
        }));
    }
    let mut rt = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let mut acq = rt.clone();
    let mut errors = 0;
    for t in tasks {
        let (r, a, e) = t.await?;
        rt.add(r)?;
        acq.add(a)?;
        errors += e;
    }
    let ms = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "round trips: {} in {} s = {:.0}/s (each = 2 committed writes), errors {}",
        rt.len(),
        seconds,
        rt.len() as f64 / seconds as f64,
        errors
    );
    println!(
        "acquire→release round trip ms: p50 {:.2}  p99 {:.2}  max {:.2}",
        ms(&rt, 0.5),
        ms(&rt, 0.99),
        rt.max() as f64 / 1000.0
    );
    println!("acquire ms: p50 {:.2}  p99 {:.2}  max {:.2}", ms(&acq, 0.5), ms(&acq, 0.99), acq.max() as f64 / 1000.0);
    if let Some(node) = node {
        node.shutdown().await;
    }
    Ok(())
}
