//! The live series behind the console's charts: each server samples its own
//! counters and histograms once a second (no Prometheus needed) and keeps
//! the last 15 minutes here, in fixed memory.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;

/// How often a server samples its metrics for the charts.
pub const SAMPLE_PERIOD: Duration = Duration::from_secs(1);
/// How far back the charts reach.
pub const WINDOW: Duration = Duration::from_secs(15 * 60);
/// Samples kept: [`WINDOW`] / [`SAMPLE_PERIOD`].
pub const WINDOW_SAMPLES: usize = 900;

/// A fixed set of named values, sampled over time; the oldest sample is
/// dropped once [`WINDOW_SAMPLES`] are kept. Memory is bounded by the
/// number of names × 900.
#[derive(Debug)]
pub struct Series {
    names: Vec<&'static str>,
    samples: Mutex<VecDeque<(u64, Vec<Option<f64>>)>>,
}

/// What `/ui/api/rates` answers: one array of times and one array of
/// values per name, oldest first. A value is `null` where it is undefined
/// (a latency quantile of a second without requests).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SeriesView {
    /// Milliseconds between samples.
    pub period_ms: u64,
    /// The sample times, Unix milliseconds.
    pub t: Vec<u64>,
    /// Each name's values, in the order of `t`.
    pub values: std::collections::BTreeMap<&'static str, Vec<Option<f64>>>,
}

impl Series {
    /// An empty series of `names`.
    pub fn new(names: &[&'static str]) -> Self {
        Self { names: names.to_vec(), samples: Mutex::new(VecDeque::with_capacity(WINDOW_SAMPLES)) }
    }

    /// Adds one sample taken at `at_unix_ms`; `values` follow the order of
    /// the names (missing ones are `null`, extra ones are ignored).
    pub fn push(&self, at_unix_ms: u64, mut values: Vec<Option<f64>>) {
        values.resize(self.names.len(), None);
        let mut samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        if samples.len() == WINDOW_SAMPLES {
            samples.pop_front();
        }
        samples.push_back((at_unix_ms, values));
    }

    /// Every kept sample.
    pub fn view(&self) -> SeriesView {
        let samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        let mut values: std::collections::BTreeMap<&'static str, Vec<Option<f64>>> =
            self.names.iter().map(|n| (*n, Vec::with_capacity(samples.len()))).collect();
        let mut t = Vec::with_capacity(samples.len());
        for (at, vs) in samples.iter() {
            t.push(*at);
            for (name, v) in self.names.iter().zip(vs) {
                values.get_mut(name).expect("every name has a column").push(*v);
            }
        }
        SeriesView { period_ms: SAMPLE_PERIOD.as_millis() as u64, t, values }
    }
}

/// The rate of a counter that went from `before` to `now` in `elapsed`
/// (0 when no time passed; a counter that went backwards counts from 0).
pub fn per_second(before: u64, now: u64, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs <= 0.0 {
        return 0.0;
    }
    let delta = if now >= before { now - before } else { now };
    delta as f64 / secs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_window_in_order() {
        let s = Series::new(&["a", "b"]);
        for i in 0..(WINDOW_SAMPLES as u64 + 5) {
            s.push(i * 1000, vec![Some(i as f64), None]);
        }
        let v = s.view();
        assert_eq!(v.t.len(), WINDOW_SAMPLES);
        assert_eq!(v.t[0], 5000);
        assert_eq!(v.values["a"][0], Some(5.0));
        assert_eq!(*v.values["a"].last().unwrap(), Some(WINDOW_SAMPLES as f64 + 4.0));
        assert!(v.values["b"].iter().all(Option::is_none));
    }

    #[test]
    fn short_samples_are_padded() {
        let s = Series::new(&["a", "b"]);
        s.push(1, vec![Some(1.0)]);
        assert_eq!(s.view().values["b"], vec![None]);
    }

    #[test]
    fn rates() {
        assert_eq!(per_second(10, 30, Duration::from_secs(2)), 10.0);
        assert_eq!(per_second(10, 30, Duration::ZERO), 0.0);
        assert_eq!(per_second(30, 4, Duration::from_secs(1)), 4.0);
    }
}
