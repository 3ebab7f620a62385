//! The sampler behind the console's charts: once a second it reads this
//! node's own request counters and acquire latency histogram (the same
//! series `/metrics` exports; no Prometheus needed) and keeps the rates and
//! quantiles of that second for 15 minutes.

use std::sync::Arc;

use fencer_console::{Histogram, SAMPLE_PERIOD, Series, per_second};
use prometheus_client::registry::{Registry, Unit};
use tokio::sync::watch;

use crate::clock::Clock;
use crate::metrics::{Metrics, OutcomeLabels};

/// The charted values, in the order the sampler pushes them.
pub(super) const NAMES: [&str; 6] =
    ["grants", "renewals", "releases", "expirations", "acquire_p50_ms", "acquire_p99_ms"];

/// The latency histogram's name in the text exposition.
const LATENCY: &str = "fencer_request_duration_seconds";

/// The counters of one reading.
struct Reading {
    grants: u64,
    renewals: u64,
    releases: u64,
    expirations: u64,
    acquire: Option<Histogram>,
}

fn ok(metrics: &Metrics, op: &'static str) -> u64 {
    metrics.requests.get_or_create(&OutcomeLabels { op, outcome: "ok" }).get()
}

impl Reading {
    fn take(metrics: &Metrics, latency: &Registry) -> Self {
        let mut text = String::new();
        let acquire = match prometheus_client::encoding::text::encode(&mut text, latency) {
            Ok(()) => Histogram::parse(&text, LATENCY, ("op", "acquire")),
            Err(_) => None,
        };
        Self {
            // Grants answered by this node: immediate and after a wait.
            grants: ok(metrics, "acquire") + ok(metrics, "acquire_wait"),
            renewals: ok(metrics, "renew"),
            // An operator's force-release ends a lease as a release does.
            releases: ok(metrics, "release") + ok(metrics, "force_release"),
            expirations: metrics.expirations.get(),
            acquire,
        }
    }
}

/// Samples `metrics` into `series` every [`SAMPLE_PERIOD`] until `shutdown`.
pub(super) async fn run(metrics: Arc<Metrics>, series: Arc<Series>, mut shutdown: watch::Receiver<bool>) {
    // A registry of the latency family alone: the cheapest way to read its
    // buckets, which the metrics library keeps private.
    let mut latency = Registry::with_prefix("fencer");
    latency.register_with_unit("request_duration", "", Unit::Seconds, metrics.request_seconds.clone());
    let mut tick = tokio::time::interval(SAMPLE_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let clock = Clock;
    let mut before = Reading::take(&metrics, &latency);
    let mut before_at = clock.now();
    loop {
        tokio::select! {
            changed = shutdown.changed() => if changed.is_err() || *shutdown.borrow() { return },
            _ = tick.tick() => {}
        }
        let now = Reading::take(&metrics, &latency);
        let at = clock.now();
        let elapsed = at - before_at;
        let period = match (&now.acquire, &before.acquire) {
            (Some(n), Some(b)) => n.since(b),
            _ => None,
        };
        let quantile_ms = |q| period.as_ref().and_then(|p| p.quantile(q)).map(|s| s * 1000.0);
        series.push(
            clock.wall_ms(),
            vec![
                Some(per_second(before.grants, now.grants, elapsed)),
                Some(per_second(before.renewals, now.renewals, elapsed)),
                Some(per_second(before.releases, now.releases, elapsed)),
                Some(per_second(before.expirations, now.expirations, elapsed)),
                quantile_ms(0.5),
                quantile_ms(0.99),
            ],
        );
        before = now;
        before_at = at;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn rates_and_quantiles_of_each_second() {
        let metrics = Metrics::new();
        let series = Arc::new(Series::new(&NAMES));
        let (stop_tx, stop) = watch::channel(false);
        let task = tokio::spawn(run(metrics.clone(), series.clone(), stop));
        // The first tick fires at once; let it pass before the load.
        tokio::time::sleep(Duration::from_millis(10)).await;
        for _ in 0..10 {
            metrics.observe_request("acquire", "ok", Duration::from_millis(3));
        }
        metrics.observe_request("acquire", "conflict", Duration::from_millis(3));
        metrics.observe_request("release", "ok", Duration::from_millis(1));
        metrics.expirations.inc();
        tokio::time::sleep(SAMPLE_PERIOD).await;
        let v = series.view();
        let last = v.t.len() - 1;
        assert_eq!(v.values["grants"][last], Some(10.0), "{v:?}");
        assert_eq!(v.values["releases"][last], Some(1.0));
        assert_eq!(v.values["expirations"][last], Some(1.0));
        assert_eq!(v.values["renewals"][last], Some(0.0));
        let p50 = v.values["acquire_p50_ms"][last].expect("acquires were observed");
        assert!((2.0..=5.0).contains(&p50), "p50 {p50} ms of 3 ms calls, within one bucket");
        // A quiet second: rates drop to zero, quantiles are undefined.
        tokio::time::sleep(SAMPLE_PERIOD).await;
        let v = series.view();
        let last = v.t.len() - 1;
        assert_eq!(v.values["grants"][last], Some(0.0));
        assert_eq!(v.values["acquire_p99_ms"][last], None);
        stop_tx.send(true).unwrap();
        task.await.unwrap();
    }
}
