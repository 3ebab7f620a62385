//! Measurement, not a check (ignored by default): the failover
//! unavailability window — kill -9 of the leader to the first successful
//! acquire on the new leader — over 10 runs, with the fast test timings and
//! with the defaults of `fencer coordinator`. Two clients measure at once:
//! `fencer_client::Client` with every endpoint (what applications see,
//! including its retry backoff), and a prober that asks every surviving
//! node directly every 10 ms (when the cluster itself can grant again).
//!
//! ```text
//! cargo test --release --test cluster t59_ -- --ignored --nocapture
//! ```

use std::time::Duration;

use fencer_client::Client;
use fencer_proto::v1::AcquireRequest;
use fencer_proto::v1::lock_client::LockClient;
use fencer_testkit::ProcCluster;
use tokio::time::Instant;
use tonic::transport::Endpoint;

/// Until the first grant through the client library.
async fn through_client(client: &Client, run: usize, killed: Instant) -> Duration {
    for i in 0.. {
        if client.acquire(format!("window/client-{run}-{i}")).grant().await.is_ok() {
            break;
        }
        assert!(killed.elapsed() < Duration::from_secs(60), "no acquire succeeded within a minute");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    killed.elapsed()
}

/// Until the first grant by any survivor, asked directly every 10 ms.
async fn probing(addrs: Vec<String>, run: usize, killed: Instant) -> Duration {
    let clients: Vec<_> = addrs
        .iter()
        .map(|a| {
            let e = Endpoint::from_shared(format!("http://{a}")).unwrap().timeout(Duration::from_millis(200));
            LockClient::new(e.connect_lazy())
        })
        .collect();
    for i in 0.. {
        let mut c = clients[i % clients.len()].clone();
        let req = AcquireRequest { resource: format!("window/probe-{run}-{i}"), ..Default::default() };
        if c.acquire(req).await.is_ok() {
            break;
        }
        assert!(killed.elapsed() < Duration::from_secs(60), "no node granted within a minute");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    killed.elapsed()
}

async fn windows(args: &[&str], runs: usize) -> (Vec<Duration>, Vec<Duration>) {
    let _turn = crate::one_cluster_at_a_time().await;
    let mut c = ProcCluster::start_with(3, args).await;
    let client = Client::new(c.addrs.values().cloned()).unwrap().with_call_timeout(Duration::from_secs(1));
    let (mut lib, mut probe) = (Vec::new(), Vec::new());
    for run in 0..runs {
        let leader = c.settled(Duration::from_secs(30)).await;
        // Warm: the client knows the leader, as a busy client would.
        client.acquire(format!("window/warm-{run}")).grant().await.expect("warm-up acquire");
        let survivors: Vec<String> =
            c.ids().into_iter().filter(|n| *n != leader).map(|n| c.addrs[&n].clone()).collect();
        c.kill9(leader);
        let killed = Instant::now();
        let (l, p) = tokio::join!(through_client(&client, run, killed), probing(survivors, run, killed));
        lib.push(l);
        probe.push(p);
        c.restart(leader);
    }
    (lib, probe)
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
    let (lib, probe) = windows(&["--heartbeat", "50ms", "--election-timeout", "150ms"], 10).await;
    report("heartbeat 50 ms, election timeout 150-300 ms, fencer_client", lib);
    report("heartbeat 50 ms, election timeout 150-300 ms, direct prober", probe);
    let (lib, probe) = windows(&[], 10).await;
    report("defaults (heartbeat 250 ms, election timeout 1-2 s), fencer_client", lib);
    report("defaults (heartbeat 250 ms, election timeout 1-2 s), direct prober", probe);
}
