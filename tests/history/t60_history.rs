//! History-checked fault runs (DESIGN §8, issue 6): clients against a
//! 3-node cluster of real `fencer coordinator` processes, writing through a
//! real `fencer proxy` process to an upstream that records the order in
//! which it applied writes, while a nemesis kills, isolates, pauses and
//! partitions. Afterwards every invariant checker of `fencer_testkit::history` runs
//! over the recorded operations and the upstream's record: I1 (with lease
//! time), I2, I3, I4, I7. A failure prints the report with the slice of
//! history behind each violation (docs/testing.md explains how to read it).
//!
//! - `t60_short_fault_run_keeps_every_invariant`: CI, every fault once.
//! - `t60_influxdb_fault_run_keeps_every_invariant`: the same against a real
//!   InfluxDB (loud SKIPPED without `influxd`).
//! - `t60_postgres_fault_run_keeps_every_invariant`: the same through the
//!   PostgreSQL sidecar against a real PostgreSQL (loud SKIPPED without one).
//! - `t60_long_fault_run_keeps_every_invariant` (ignored): every fault, then
//!   random ones for `FENCER_HISTORY_SECS` (default 300).

use crate::workload::nemesis::Fault;
use crate::workload::{self, Backend, Config, Outcome};

/// The run did real work: without it a clean result proves nothing.
fn assert_meaningful(o: &Outcome, config: &Config) {
    let count = |kind: &str, answer: &str| {
        o.client_ops().filter(|op| op.call.kind() == kind && op.answer.kind() == answer).count()
    };
    assert!(count("acquire", "granted") >= 20, "too few grants to mean anything:\n{}", o.report);
    assert!(count("write", "written") >= 20, "too few writes applied to mean anything:\n{}", o.report);
    assert!(count("renew", "renewed") >= 10, "too few renewals to mean anything:\n{}", o.report);
    // Restarts must load a snapshot and re-apply the log after it, not only
    // re-apply the whole log: that is the path a token reused after a
    // restart takes (docs/testing.md, "Deliberately broken builds").
    assert!(
        o.snapshots.built >= 3,
        "too few snapshots built to cover restarts from one (\"built snapshot\" lines in the node logs):\n{}",
        o.report
    );
    for f in &config.schedule {
        let needle = match f {
            Fault::KillLeader => "kill -9 leader",
            Fault::IsolateLeader => "isolate leader",
            Fault::OneWayFromLeader => "(one way)",
            Fault::MajorityLoss => "majority loss",
            Fault::PauseLeader => "SIGSTOP leader",
            Fault::DropAcquireAnswers => "acquire answers",
            Fault::KillProxy => "kill -9 the proxy",
            Fault::PauseClient => "stops renewing",
            Fault::RestartAll => "kill -9 every node",
        };
        assert!(o.faults.iter().any(|(_, w)| w.contains(needle)), "fault {f:?} was never injected:\n{}", o.report);
    }
}

fn assert_clean(o: &Outcome) {
    assert!(o.violations.is_empty(), "{} invariant violation(s):\n{}", o.violations.len(), o.report);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t60_short_fault_run_keeps_every_invariant() {
    let config = Config::short("short");
    let o = workload::run(config.clone()).await;
    assert_clean(&o);
    assert_meaningful(&o, &config);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t60_influxdb_fault_run_keeps_every_invariant() {
    let config = Config {
        backend: Backend::Influx,
        duration: std::time::Duration::from_secs(30),
        schedule: vec![
            Fault::KillLeader,
            Fault::PauseClient,
            Fault::KillProxy,
            Fault::IsolateLeader,
            Fault::PauseClient,
        ],
        ..Config::short("influx")
    };
    if !fencer_testkit::influxdb::installed("t60_influxdb_fault_run_keeps_every_invariant") {
        return;
    }
    let o = workload::run(config.clone()).await;
    assert_clean(&o);
    assert_meaningful(&o, &config);
}

/// The same against a real PostgreSQL behind the PostgreSQL sidecar (G1–G8):
/// writes are transactions (`BEGIN; INSERT; COMMIT`), a paused client is
/// sometimes paused inside its open transaction (the sidecar must end it,
/// G5), and the applied order is PostgreSQL's commit order. Loud SKIPPED
/// without PostgreSQL (a failure when `CI=true`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t60_postgres_fault_run_keeps_every_invariant() {
    if fencer_testkit::postgres::installed("t60_postgres_fault_run_keeps_every_invariant").is_none() {
        return;
    }
    // Few resources and many pauses: zombies meet newer holders often.
    let config = Config {
        backend: Backend::Postgres,
        duration: std::time::Duration::from_secs(35),
        resources: 2,
        cold_resources: 2,
        cold_probability: 0.1,
        pause_probability: 0.15,
        schedule: vec![
            Fault::PauseClient,
            Fault::KillLeader,
            Fault::PauseClient,
            Fault::KillProxy,
            Fault::PauseClient,
            Fault::IsolateLeader,
            Fault::PauseClient,
        ],
        ..Config::short("postgres")
    };
    let o = workload::run(config.clone()).await;
    assert_clean(&o);
    assert_meaningful(&o, &config);
}

/// The long configuration: `cargo test --test history t60_long -- --ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: every fault, then random faults for FENCER_HISTORY_SECS (default 300)"]
async fn t60_long_fault_run_keeps_every_invariant() {
    let run_id = format!("long-{}", std::process::id());
    let config = Config::long(&run_id);
    let o = workload::run(config.clone()).await;
    assert_clean(&o);
    assert_meaningful(&o, &config);
    // Nodes that fell behind caught up by snapshot install, under faults
    // (the short runs install 0 or 1: too few to require there).
    assert!(
        o.snapshots.installed >= 1,
        "no node caught up by snapshot install (\"installed snapshot\" lines in the node logs):\n{}",
        o.report
    );
}
