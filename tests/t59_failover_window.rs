//! Measurement, not a check (ignored by default): the failover
//! unavailability window — kill -9 of the leader to the first successful
//! acquire on the new leader, as a client with every endpoint sees it —
//! over 10 runs, with the fast test timings and with the defaults of
//! `fencer coordinator`.
//!
//! ```text
//! cargo test --release --test t59_failover_window -- --ignored --nocapture
//! ```

#[path = "common/cluster.rs"]
mod cluster;
mod common;

use std::time::Duration;

use cluster::ProcCluster;
use fencer_client::{AcquireOptions, Client};
use tokio::time::Instant;

async fn windows(args: &[&str], runs: usize) -> Vec<Duration> {
    let mut c = ProcCluster::start_with(3, args).await;
    let client = Client::new(c.addrs.values().cloned()).unwrap().with_call_timeout(Duration::from_secs(1));
    let mut out = Vec::new();
    for run in 0..runs {
        let leader = c.settled(Duration::from_secs(30)).await;
        // Warm: the client knows the leader, as a busy client would.
        client.acquire(AcquireOptions::new(format!("window/warm-{run}"))).await.expect("warm-up acquire");
        c.kill9(leader);
        let killed = Instant::now();
        let mut i = 0;
        loop {
            i += 1;
            let opts = AcquireOptions::new(format!("window/{run}-{i}"));
            if client.acquire(opts).await.is_ok() {
                break;
            }
            assert!(killed.elapsed() < Duration::from_secs(60), "no acquire succeeded within a minute");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        out.push(killed.elapsed());
        c.restart(leader);
    }
    out
}

fn report(name: &str, mut w: Vec<Duration>) {
    w.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let median = (ms(w[w.len() / 2 - 1]) + ms(w[w.len() / 2])) / 2.0;
    println!(
        "{name}: failover window over {} runs: median {median:.0} ms, max {:.0} ms, all {:?} ms",
        w.len(),
        ms(*w.last().unwrap()),
        w.iter().map(|d| ms(*d).round() as u64).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement; run with --ignored --nocapture"]
async fn t59_failover_window_over_ten_runs() {
    let fast = windows(&["--heartbeat", "50ms", "--election-timeout", "150ms"], 10).await;
    report("heartbeat 50 ms, election timeout 150-300 ms", fast);
    let defaults = windows(&[], 10).await;
    report("defaults: heartbeat 250 ms, election timeout 1-2 s", defaults);
}
