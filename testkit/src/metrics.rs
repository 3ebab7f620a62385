//! A parser of the Prometheus text exposition (`/metrics` of a coordinator
//! or a proxy): every sample by its series, the family of every `# TYPE`
//! line, and the label pairs seen per sample name. Enough to assert that a
//! metric exists and moved; not a full parser (no escapes in label values,
//! no timestamps).

use std::collections::{BTreeMap, BTreeSet};

/// One scrape: every sample by its series (`name{labels}` exactly as
/// exposed), the family of every `# TYPE` line, and the label pairs seen
/// per sample name.
#[derive(Debug, Clone)]
pub struct Exposition {
    /// The scrape as received.
    pub text: String,
    /// Every sample: `name{labels}` exactly as exposed → value.
    pub samples: BTreeMap<String, f64>,
    /// Family name → its `# TYPE` (`counter`, `gauge`, `histogram`, …).
    pub families: BTreeMap<String, String>,
    /// Sample name → every label pair seen on it.
    pub labels: BTreeMap<String, BTreeSet<(String, String)>>,
}

impl Exposition {
    /// Parses one scrape.
    pub fn parse(text: &str) -> Self {
        let mut samples = BTreeMap::new();
        let mut families = BTreeMap::new();
        let mut labels: BTreeMap<String, BTreeSet<(String, String)>> = BTreeMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut parts = rest.split_whitespace();
                if let (Some(name), Some(kind)) = (parts.next(), parts.next()) {
                    families.insert(name.to_string(), kind.to_string());
                }
                continue;
            }
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let Some((series, value)) = line.rsplit_once(' ') else { continue };
            let Ok(value) = value.trim().parse::<f64>() else { continue };
            let name = series.split('{').next().unwrap_or(series).to_string();
            if let Some(set) = series.strip_prefix(name.as_str()).and_then(|s| s.strip_prefix('{')) {
                for pair in set.trim_end_matches('}').split(',').filter(|p| !p.is_empty()) {
                    if let Some((k, v)) = pair.split_once('=') {
                        labels
                            .entry(name.clone())
                            .or_default()
                            .insert((k.to_string(), v.trim_matches('"').to_string()));
                    }
                }
            }
            labels.entry(name).or_default();
            samples.insert(series.to_string(), value);
        }
        Self { text: text.to_string(), samples, families, labels }
    }

    /// The value of one series; panics (showing the scrape) when it does not exist.
    pub fn get(&self, series: &str) -> f64 {
        *self.samples.get(series).unwrap_or_else(|| panic!("{series} is not exposed:\n{}", self.text))
    }

    /// Every sample name exposed (`fencer_requests_total`, `…_bucket`, …).
    pub fn names(&self) -> BTreeSet<&str> {
        self.labels.keys().map(String::as_str).collect()
    }

    /// `(sum, count)` of histogram `name`, added over its label sets.
    pub fn sum_count(&self, name: &str) -> (f64, f64) {
        let total = |suffix: &str| {
            let metric = format!("{name}{suffix}");
            self.samples
                .iter()
                .filter(|(series, _)| series.split('{').next() == Some(metric.as_str()))
                .map(|(_, v)| v)
                .sum()
        };
        (total("_sum"), total("_count"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_families_and_labels_are_read() {
        let text = "\
# HELP fencer_requests_total Requests.
# TYPE fencer_requests_total counter
fencer_requests_total{op=\"acquire\",outcome=\"ok\"} 3
fencer_requests_total{op=\"renew\",outcome=\"ok\"} 1
# TYPE fencer_raft_commit_duration_seconds histogram
fencer_raft_commit_duration_seconds_sum{op=\"a\"} 2.0
fencer_raft_commit_duration_seconds_count{op=\"a\"} 100
fencer_raft_commit_duration_seconds_sum{op=\"b\"} 1.0
fencer_raft_commit_duration_seconds_count{op=\"b\"} 100
fencer_ready 1
";
        let e = Exposition::parse(text);
        assert_eq!(e.get("fencer_requests_total{op=\"acquire\",outcome=\"ok\"}"), 3.0);
        assert_eq!(e.get("fencer_ready"), 1.0);
        assert_eq!(e.families["fencer_requests_total"], "counter");
        assert!(e.labels["fencer_requests_total"].contains(&("op".into(), "renew".into())));
        assert!(e.names().contains("fencer_raft_commit_duration_seconds_sum"));
        assert_eq!(e.sum_count("fencer_raft_commit_duration_seconds"), (3.0, 200.0));
    }
}
