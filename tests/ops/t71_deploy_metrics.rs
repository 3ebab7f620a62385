//! The Grafana dashboard and the Prometheus alert rules in `deploy/` query
//! only metrics that exist (issue 7): a renamed metric, a wrong suffix or a
//! label value that is never exposed would leave a panel empty and an
//! alert silent, without any error anywhere. A node and a proxy are
//! started, both scraped, and every `fencer_…` name of every PromQL
//! expression is looked up among the exposed samples (so `_total`,
//! `_bucket`, `_sum` and `_count` must be right), as is every `label="value"`
//! matcher of a selector.

use std::collections::BTreeSet;
use std::path::Path;

use crate::stack::Stack;
use fencer_testkit::metrics::Exposition;

const RULES: &str = "deploy/prometheus/fencer-alerts.yml";
const DASHBOARD: &str = "deploy/grafana/fencer-dashboard.json";

/// The alerts issue 7 asks for, by the name docs/operations.md explains.
const REQUIRED_ALERTS: [&str; 7] = [
    "FencerNoLeader",
    "FencerLeaderFlapping",
    "FencerHighCommitLatency",
    "FencerHighFsyncLatency",
    "FencerProxyFencingRejectionsRising",
    "FencerWaiterSaturation",
    "FencerProxyIndeterminateResources",
];

fn read(rel: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// The `expr:` values of a rules file: one-line values and `|`/`>` blocks.
fn rule_exprs(yaml: &str) -> Vec<String> {
    let lines: Vec<&str> = yaml.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        i += 1;
        let Some(value) = line.trim_start().strip_prefix("expr:") else { continue };
        let value = value.trim();
        if value.starts_with('|') || value.starts_with('>') {
            let mut block = Vec::new();
            while i < lines.len() && (lines[i].trim().is_empty() || indent(lines[i]) > indent(line)) {
                block.push(lines[i].trim());
                i += 1;
            }
            out.push(block.join(" "));
        } else {
            out.push(value.trim_matches(|c| c == '"' || c == '\'').to_string());
        }
    }
    out
}

/// The alert names of a rules file.
fn alert_names(yaml: &str) -> BTreeSet<String> {
    yaml.lines().filter_map(|l| l.trim_start().strip_prefix("- alert:")).map(|n| n.trim().to_string()).collect()
}

/// Every PromQL string of a dashboard: panel targets and variable queries.
fn dashboard_exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr" | "query" | "definition", serde_json::Value::String(s)) => out.push(s.clone()),
                    _ => dashboard_exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| dashboard_exprs(v, out)),
        _ => {}
    }
}

/// A metric named in an expression, with the `label="value"` matchers of
/// its selector (target labels such as `job`, regex and negative matchers,
/// and Grafana variables are left out).
#[derive(Debug)]
struct Selector {
    metric: String,
    equals: Vec<(String, String)>,
}

fn selectors(expr: &str) -> Vec<Selector> {
    let bytes = expr.as_bytes();
    let is_ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b':';
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(pos) = expr[i..].find("fencer_") {
        let start = i + pos;
        if start > 0 && is_ident(bytes[start - 1]) {
            i = start + 1;
            continue;
        }
        let mut end = start;
        while end < bytes.len() && is_ident(bytes[end]) {
            end += 1;
        }
        let metric = expr[start..end].to_string();
        let mut equals = Vec::new();
        if expr[end..].starts_with('{') {
            let close = expr[end..].find('}').map_or(expr.len(), |c| end + c);
            for matcher in expr[end + 1..close].split(',') {
                let Some((label, value)) = matcher.split_once('=') else { continue };
                let (label, value) = (label.trim(), value.trim());
                if label.ends_with('!') || value.starts_with('~') || matches!(label, "job" | "instance") {
                    continue;
                }
                let value = value.trim_matches('"');
                if !value.contains('$') {
                    equals.push((label.to_string(), value.to_string()));
                }
            }
            i = close;
        } else {
            i = end;
        }
        out.push(Selector { metric, equals });
    }
    out
}

fn check(source: &str, exprs: &[String], scrapes: &[&Exposition], problems: &mut Vec<String>) -> usize {
    let mut checked = 0;
    for expr in exprs {
        for sel in selectors(expr) {
            checked += 1;
            let Some(scrape) = scrapes.iter().find(|s| s.labels.contains_key(&sel.metric)) else {
                problems.push(format!("{source}: `{}` is not exposed (in `{expr}`)", sel.metric));
                continue;
            };
            for (label, value) in &sel.equals {
                if !scrape.labels[&sel.metric].contains(&(label.clone(), value.clone())) {
                    problems.push(format!("{source}: `{}` has no series with {label}=\"{value}\"", sel.metric));
                }
            }
        }
    }
    checked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t71_every_metric_of_the_dashboard_and_the_alert_rules_exists() {
    let stack = Stack::start().await;
    let (node, proxy) = (stack.scrape_node().await, stack.scrape_proxy().await);
    stack.stop().await;
    let scrapes = [&node, &proxy];

    let rules = read(RULES);
    let rule_exprs = rule_exprs(&rules);
    let alerts = alert_names(&rules);
    assert_eq!(rule_exprs.len(), alerts.len(), "one expression per alert in {RULES}");
    for required in REQUIRED_ALERTS {
        assert!(alerts.contains(required), "{RULES} lacks the alert {required}");
    }
    let dashboard: serde_json::Value = serde_json::from_str(&read(DASHBOARD)).expect("the dashboard is JSON");
    let mut dash_exprs = Vec::new();
    dashboard_exprs(&dashboard, &mut dash_exprs);

    let mut problems = Vec::new();
    let in_rules = check(RULES, &rule_exprs, &scrapes, &mut problems);
    let in_dashboard = check(DASHBOARD, &dash_exprs, &scrapes, &mut problems);
    assert!(problems.is_empty(), "{} problem(s):\n{}", problems.len(), problems.join("\n"));
    assert!(in_rules >= alerts.len() && in_dashboard >= 40, "the files were read: {in_rules} and {in_dashboard} names");

    // Every metric family is used somewhere: an unwatched metric is either
    // missing from the dashboard or should not exist.
    let used: BTreeSet<String> =
        rule_exprs.iter().chain(&dash_exprs).flat_map(|e| selectors(e)).map(|s| s.metric).collect();
    let unused: Vec<&String> = node
        .families
        .keys()
        .chain(proxy.families.keys())
        .filter(|family| {
            !["", "_total", "_bucket", "_sum", "_count"]
                .iter()
                .any(|suffix| used.contains(&format!("{family}{suffix}")))
        })
        .collect();
    assert!(unused.is_empty(), "metrics on no panel and in no alert: {unused:?}");
}

#[test]
fn t71_the_selector_parser_sees_names_suffixes_and_label_values() {
    let s = selectors(
        r#"histogram_quantile(0.99, sum by (le) (rate(fencer_request_duration_seconds_bucket{job=~"$job",op="acquire"}[5m]))) / fencer_waiters_limit"#,
    );
    assert_eq!(s.len(), 2);
    assert_eq!(s[0].metric, "fencer_request_duration_seconds_bucket");
    assert_eq!(s[0].equals, vec![("op".to_string(), "acquire".to_string())]);
    assert_eq!(s[1].metric, "fencer_waiters_limit");
    let yaml = "      - alert: A\n        expr: |\n          sum(\n            fencer_x_total)\n        for: 1m\n      - alert: B\n        expr: fencer_y > 0\n";
    assert_eq!(rule_exprs(yaml), vec!["sum( fencer_x_total)".to_string(), "fencer_y > 0".to_string()]);
}
