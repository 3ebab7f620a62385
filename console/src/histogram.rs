//! One histogram read from a server's own Prometheus text exposition (the
//! metrics library keeps its buckets private; the text is their public
//! form), the difference of two readings (the observations of one sample
//! period), and quantiles estimated the way Prometheus' `histogram_quantile`
//! does: linear interpolation inside the bucket the rank falls in.

/// Cumulative bucket counts of one histogram series, by upper bound
/// (ascending; the last bound is `+Inf`).
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    buckets: Vec<(f64, u64)>,
}

impl Histogram {
    /// The buckets of the series of histogram `name` whose label `label.0`
    /// equals `label.1`, read from the text exposition `text`. `None` when
    /// the series is absent or a bucket line does not parse.
    pub fn parse(text: &str, name: &str, label: (&str, &str)) -> Option<Self> {
        let prefix = format!("{name}_bucket{{");
        let wanted = format!("{}=\"{}\"", label.0, label.1);
        let mut buckets = Vec::new();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix(&prefix) else { continue };
            let (labels, value) = rest.split_once("} ")?;
            if !labels.split(',').any(|l| l == wanted) {
                continue;
            }
            let le = labels.split(',').find_map(|l| l.strip_prefix("le=\""))?.strip_suffix('"')?;
            let bound = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
            // The value may be followed by a timestamp or an exemplar.
            let count = value.split_whitespace().next()?.parse::<f64>().ok()?;
            buckets.push((bound, count as u64));
        }
        if buckets.is_empty() {
            return None;
        }
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        Some(Self { buckets })
    }

    /// Observations in the histogram.
    pub fn count(&self) -> u64 {
        self.buckets.last().map_or(0, |b| b.1)
    }

    /// The observations made since `earlier` (a reading of the same series
    /// with the same bounds); `None` when the bounds differ or a count went
    /// backwards (the series was reset).
    pub fn since(&self, earlier: &Self) -> Option<Self> {
        if self.buckets.len() != earlier.buckets.len() {
            return None;
        }
        let mut buckets = Vec::with_capacity(self.buckets.len());
        for ((bound, now), (bound_then, then)) in self.buckets.iter().zip(&earlier.buckets) {
            if bound != bound_then || now < then {
                return None;
            }
            buckets.push((*bound, now - then));
        }
        Some(Self { buckets })
    }

    /// The `q` quantile (0 ≤ q ≤ 1) in the histogram's unit; `None`
    /// without observations. A rank in the `+Inf` bucket answers the
    /// highest finite bound, as Prometheus does.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.count();
        if total == 0 || !(0.0..=1.0).contains(&q) {
            return None;
        }
        let rank = q * total as f64;
        let mut lower_bound = 0.0;
        let mut lower_count = 0u64;
        for &(bound, count) in &self.buckets {
            if count as f64 >= rank && count > lower_count {
                if bound.is_infinite() {
                    return Some(lower_bound);
                }
                let inside = (rank - lower_count as f64) / (count - lower_count) as f64;
                return Some(lower_bound + (bound - lower_bound) * inside.clamp(0.0, 1.0));
            }
            if bound.is_finite() {
                lower_bound = bound;
            }
            lower_count = count;
        }
        Some(lower_bound)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
# TYPE fencer_request_duration_seconds histogram
fencer_request_duration_seconds_sum{op=\"acquire\"} 0.5
fencer_request_duration_seconds_count{op=\"acquire\"} 100
fencer_request_duration_seconds_bucket{le=\"0.001\",op=\"acquire\"} 50
fencer_request_duration_seconds_bucket{le=\"0.002\",op=\"acquire\"} 90
fencer_request_duration_seconds_bucket{le=\"0.004\",op=\"acquire\"} 100
fencer_request_duration_seconds_bucket{le=\"+Inf\",op=\"acquire\"} 100
fencer_request_duration_seconds_bucket{le=\"0.001\",op=\"renew\"} 7
fencer_request_duration_seconds_bucket{le=\"+Inf\",op=\"renew\"} 7
";

    #[test]
    fn reads_one_series() {
        let h = Histogram::parse(TEXT, "fencer_request_duration_seconds", ("op", "acquire")).unwrap();
        assert_eq!(h.count(), 100);
        let r = Histogram::parse(TEXT, "fencer_request_duration_seconds", ("op", "renew")).unwrap();
        assert_eq!(r.count(), 7);
        assert!(Histogram::parse(TEXT, "fencer_request_duration_seconds", ("op", "release")).is_none());
    }

    #[test]
    fn quantiles_interpolate_inside_the_bucket() {
        let h = Histogram::parse(TEXT, "fencer_request_duration_seconds", ("op", "acquire")).unwrap();
        // Rank 50 is the top of the first bucket; rank 99 is 9/10 into the third.
        assert!((h.quantile(0.5).unwrap() - 0.001).abs() < 1e-12);
        assert!((h.quantile(0.99).unwrap() - 0.0038).abs() < 1e-9);
        assert!((h.quantile(0.7).unwrap() - 0.0015).abs() < 1e-9);
    }

    #[test]
    fn the_difference_of_two_readings_is_one_period() {
        let later = Histogram::parse(TEXT, "fencer_request_duration_seconds", ("op", "acquire")).unwrap();
        let earlier_text = TEXT.replace("} 90", "} 89").replace("} 100", "} 89");
        let earlier = Histogram::parse(&earlier_text, "fencer_request_duration_seconds", ("op", "acquire")).unwrap();
        let period = later.since(&earlier).unwrap();
        // 11 new observations: 1 in (1 ms, 2 ms], 10 in (2 ms, 4 ms].
        assert_eq!(period.count(), 11);
        let p50 = period.quantile(0.5).unwrap();
        assert!(p50 > 0.002 && p50 < 0.004, "{p50}");
        assert_eq!(earlier.since(&later), None, "a count that went backwards is a reset");
        assert_eq!(period.since(&period).unwrap().quantile(0.5), None, "no observations, no quantile");
    }

    #[test]
    fn a_rank_in_the_overflow_bucket_answers_the_highest_bound() {
        let text = "h_bucket{x=\"y\",le=\"1\"} 1\nh_bucket{x=\"y\",le=\"+Inf\"} 10\n";
        let h = Histogram::parse(text, "h", ("x", "y")).unwrap();
        assert_eq!(h.quantile(0.99), Some(1.0));
    }
}
