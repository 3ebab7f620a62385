//! Open-loop overhead measurement of the sidecar proxy (DESIGN §9).
//!
//! Sends fenced writes on a fixed schedule at a few rates, once directly to
//! an in-process upstream and once through an in-process proxy in front of
//! it. Latency is measured from each request's *intended* send time, so a
//! stall shows up instead of silently lowering the rate; results go into
//! HDR histograms. Everything runs on loopback, bounded in count and time.
//!
//! ```text
//! cargo run --release --example proxy_bench [-- SECONDS_PER_RUN [RATE…]]
//! ```
//! Defaults: 5 s per run, rates 1000 and 5000 requests/s.

use std::sync::Arc;
use std::time::Duration;

use fencer_proxy::testing::{Method, Status, TestClient, TestUpstream};
use fencer_proxy::{ProxyConfig, SimpleConfig};
use hdrhistogram::Histogram;
use tokio::sync::Mutex;
use tokio::time::Instant;

/// Outstanding requests are abandoned this long after the schedule ends.
const DRAIN: Duration = Duration::from_secs(10);

struct RunResult {
    target: &'static str,
    rate: u64,
    sent: u64,
    ok: u64,
    errors: u64,
    elapsed: Duration,
    hist: Histogram<u64>,
}

async fn run(target: &'static str, addr: std::net::SocketAddr, rate: u64, seconds: u64) -> RunResult {
    let client = TestClient::new();
    let hist = Arc::new(Mutex::new(Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds")));
    let ok = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let errors = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let total = rate * seconds;
    let interval = Duration::from_nanos(1_000_000_000 / rate);
    let start = Instant::now() + Duration::from_millis(50);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..total {
        let intended = start + interval * u32::try_from(i).expect("bounded count");
        tokio::time::sleep_until(intended).await;
        let (client, hist, ok, errors) = (client.clone(), hist.clone(), ok.clone(), errors.clone());
        tasks.spawn(async move {
            let r = client.send(addr, Method::POST, "/write", &[("fencing-token", "1")], "cpu value=1").await;
            let micros = u64::try_from((Instant::now() - intended).as_micros()).unwrap_or(u64::MAX);
            match r {
                Ok(r) if r.status == Status::OK => {
                    ok.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let _ = hist.lock().await.record(micros.max(1));
                }
                _ => {
                    errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        });
    }
    let _ = tokio::time::timeout(DRAIN, async { while tasks.join_next().await.is_some() {} }).await;
    tasks.abort_all();
    let elapsed = Instant::now() - start;
    let hist = hist.lock().await.clone();
    RunResult {
        target,
        rate,
        sent: total,
        ok: ok.load(std::sync::atomic::Ordering::Relaxed),
        errors: errors.load(std::sync::atomic::Ordering::Relaxed),
        elapsed,
        hist,
    }
}

fn ms(micros: u64) -> f64 {
    micros as f64 / 1000.0
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let seconds: u64 = args.first().map(|s| s.parse()).transpose()?.unwrap_or(5).clamp(1, 60);
    let mut rates: Vec<u64> = args.iter().skip(1).map(|s| s.parse()).collect::<Result<_, _>>()?;
    if rates.is_empty() {
        rates = vec![1000, 5000];
    }
    rates.retain(|r| (1..=50_000).contains(r));

    let upstream = TestUpstream::start().await?;
    let dir = tempfile::tempdir()?;
    let mut config = ProxyConfig::simple(SimpleConfig {
        listen: "127.0.0.1:0".parse()?,
        upstream: upstream.url(),
        resource: "bench".into(),
        data_dir: dir.path().to_owned(),
        admin: "127.0.0.1:0".parse()?,
        read_routes: vec![],
    })?;
    config.limits.max_concurrent_requests = 10_000;
    let proxy = fencer_proxy::start(config, Some(0)).await?;
    // The first write persists the resource; later ones share the guard.
    TestClient::new().write(proxy.local_addr(), "/write", 1).await?;

    let mut results = Vec::new();
    for &rate in &rates {
        // Warm both paths (connection pools) before measuring.
        let _ = run("warmup", upstream.addr(), rate.min(1000), 1).await;
        let _ = run("warmup", proxy.local_addr(), rate.min(1000), 1).await;
        results.push(run("direct", upstream.addr(), rate, seconds).await);
        results.push(run("proxy", proxy.local_addr(), rate, seconds).await);
    }

    println!(
        "{:<7} {:>7} {:>8} {:>8} {:>7} {:>10} {:>9} {:>9} {:>9} {:>9}",
        "target", "rate/s", "sent", "ok", "errors", "achieved/s", "p50 ms", "p99 ms", "p99.9 ms", "max ms"
    );
    for r in &results {
        println!(
            "{:<7} {:>7} {:>8} {:>8} {:>7} {:>10.0} {:>9.3} {:>9.3} {:>9.3} {:>9.3}",
            r.target,
            r.rate,
            r.sent,
            r.ok,
            r.errors,
            r.ok as f64 / r.elapsed.as_secs_f64(),
            ms(r.hist.value_at_quantile(0.5)),
            ms(r.hist.value_at_quantile(0.99)),
            ms(r.hist.value_at_quantile(0.999)),
            ms(r.hist.max()),
        );
    }
    let mut report = Vec::new();
    for pair in results.chunks(2) {
        let (d, p) = (&pair[0], &pair[1]);
        let added_p50 = ms(p.hist.value_at_quantile(0.5)) - ms(d.hist.value_at_quantile(0.5));
        let added_p99 = ms(p.hist.value_at_quantile(0.99)) - ms(d.hist.value_at_quantile(0.99));
        println!("rate {:>6}/s: added latency p50 {added_p50:+.3} ms, p99 {added_p99:+.3} ms", d.rate);
        report.push(serde_json::json!({
            "rate_per_s": d.rate,
            "seconds": seconds,
            "direct": { "ok": d.ok, "errors": d.errors, "p50_ms": ms(d.hist.value_at_quantile(0.5)), "p99_ms": ms(d.hist.value_at_quantile(0.99)), "achieved_per_s": d.ok as f64 / d.elapsed.as_secs_f64() },
            "proxy": { "ok": p.ok, "errors": p.errors, "p50_ms": ms(p.hist.value_at_quantile(0.5)), "p99_ms": ms(p.hist.value_at_quantile(0.99)), "achieved_per_s": p.ok as f64 / p.elapsed.as_secs_f64() },
            "added_p50_ms": added_p50,
            "added_p99_ms": added_p99,
        }));
    }
    println!("{}", serde_json::Value::Array(report));
    proxy.shutdown().await;
    Ok(())
}
