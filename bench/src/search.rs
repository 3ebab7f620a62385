//! The rate search: the highest multiple of the configured workload (rates,
//! active set and resources scaled together) that still passes — no errors
//! and p99 acquire under the bound. Doubling from 1× until a step fails (or
//! the ceiling of the search is reached), halving if 1× already fails, then
//! bisecting between the highest pass and the lowest failure.

/// The search's state: pure, driven by [`Search::next`] and [`Search::record`].
#[derive(Debug, Clone)]
pub(crate) struct Search {
    highest_pass: Option<f64>,
    lowest_fail: Option<f64>,
    max_scale: f64,
    bisections_left: u32,
}

/// Below this the search gives up going down.
const MIN_SCALE: f64 = 1.0 / 16.0;

impl Search {
    pub(crate) fn new(max_scale: f64, bisections: u32) -> Self {
        Self { highest_pass: None, lowest_fail: None, max_scale: max_scale.max(1.0), bisections_left: bisections }
    }

    /// The next scale to try, or `None` when the search is over.
    pub(crate) fn next(&self) -> Option<f64> {
        match (self.highest_pass, self.lowest_fail) {
            (None, None) => Some(1.0),
            (Some(lo), None) => (lo < self.max_scale).then(|| (lo * 2.0).min(self.max_scale)),
            (None, Some(hi)) => (hi / 2.0 >= MIN_SCALE).then_some(hi / 2.0),
            (Some(lo), Some(hi)) => (self.bisections_left > 0 && hi / lo > 1.05).then_some((lo + hi) / 2.0),
        }
    }

    pub(crate) fn record(&mut self, scale: f64, pass: bool) {
        if self.highest_pass.is_some() && self.lowest_fail.is_some() {
            self.bisections_left = self.bisections_left.saturating_sub(1);
        }
        if pass {
            self.highest_pass = Some(self.highest_pass.map_or(scale, |p| p.max(scale)));
        } else {
            self.lowest_fail = Some(self.lowest_fail.map_or(scale, |f| f.min(scale)));
        }
    }

    pub(crate) fn highest_pass(&self) -> Option<f64> {
        self.highest_pass
    }
}

#[cfg(test)]
mod tests {
    use super::Search;

    fn run(limit: f64, max: f64, bisections: u32) -> (Vec<f64>, Option<f64>) {
        let mut s = Search::new(max, bisections);
        let mut tried = Vec::new();
        while let Some(x) = s.next() {
            assert!(tried.len() < 20, "the search is bounded");
            tried.push(x);
            s.record(x, x <= limit);
        }
        (tried, s.highest_pass())
    }

    #[test]
    fn doubles_then_bisects() {
        let (tried, best) = run(3.3, 16.0, 3);
        assert_eq!(tried, vec![1.0, 2.0, 4.0, 3.0, 3.5, 3.25]);
        assert_eq!(best, Some(3.25));
    }

    #[test]
    fn stops_at_the_maximum() {
        let (tried, best) = run(100.0, 4.0, 3);
        assert_eq!(tried, vec![1.0, 2.0, 4.0]);
        assert_eq!(best, Some(4.0));
    }

    #[test]
    fn goes_down_when_the_base_rate_fails() {
        let (tried, best) = run(0.3, 8.0, 2);
        assert_eq!(tried, vec![1.0, 0.5, 0.25, 0.375, 0.3125]);
        assert_eq!(best, Some(0.25));
        let (_, best) = run(0.0, 8.0, 2);
        assert_eq!(best, None);
    }
}
