//! The cluster through the command line, with real processes: one
//! `fencer coordinator` command per node forms the cluster; `fencer status`
//! shows members, leader, term, indexes and per-node health; clients keep
//! working through kill -9 of the leader; the killed node rejoins on its data
//! dir; a data dir from another cluster is refused with a clear error; a node
//! is replaced with `fencer member add-learner | promote | remove`.

use std::time::Duration;

use fencer_testkit::net::free_port_on;
use fencer_testkit::proc_cluster::{ELECTION_MIN, HEARTBEAT, ProcCluster};
use fencer_testkit::{free_port, run, run_json, spawn_fencer, wait_ready};
use serde_json::Value;
use tokio::time::Instant;

fn member(status: &Value, id: u64) -> &Value {
    listed(status, id).unwrap_or_else(|| panic!("{status}"))
}

/// Member `id` of a status, if it lists it (a node that joined a moment ago
/// does not know the membership yet: the polls wait for it, never panic).
fn listed(status: &Value, id: u64) -> Option<&Value> {
    status["members"].as_array()?.iter().find(|m| m["id"] == id)
}

/// Polls `fencer status -o json` until `ok` holds.
async fn status_until(endpoints: &str, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (code, s) = run_json(&["status", "--endpoints", endpoints, "-o", "json"]);
        if code == 0 && ok(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "fencer status never showed {what}: {s}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t56_cluster_cli_status_failover_rejoin_foreign_dir_and_replace() {
    let _turn = crate::one_cluster_at_a_time().await;
    let mut c = ProcCluster::start(3).await;
    let leader = c.settled(Duration::from_secs(20)).await;
    let eps = c.endpoints();
    let follower = c.ids().into_iter().find(|n| *n != leader).unwrap();

    // One endpoint is enough for the whole picture.
    let s = status_until(&c.addrs[&follower], "three healthy members", |s| {
        (1..=3)
            .all(|id| listed(s, id).is_some_and(|m| ["ok", "self"].contains(&m["health"].as_str().unwrap_or_default())))
    })
    .await;
    let cluster_id = s["cluster_id"].as_str().unwrap().to_string();
    assert!(!cluster_id.is_empty());
    assert_eq!(s["leader_id"], leader);
    assert!(s["term"].as_u64() > Some(0) && s["commit_index"].as_u64() >= Some(1), "{s}");
    for id in 1..=3 {
        let m = member(&s, id);
        assert_eq!((m["role"].as_str(), m["reachable"].as_bool()), (Some("voter"), Some(true)), "{m}");
        assert!(m["term"].is_u64() && m["last_log_index"].is_u64() && m["commit_index"].is_u64(), "{m}");
    }
    let (code, table, _) = run(&["status", "--endpoints", &c.addrs[&follower]]);
    assert_eq!(code, 0);
    for col in ["NODE", "ROLE", "STATE", "TERM", "LAST", "COMMIT", "HEALTH"] {
        assert!(table.contains(col), "the table lacks {col}:\n{table}");
    }

    // Clients keep working through kill -9 of the leader.
    let (code, g1) = run_json(&["acquire", "cli/one", "--ttl", "30s", "--endpoints", &eps, "-o", "json"]);
    assert_eq!(code, 0, "{g1}");
    let logged_before: Vec<(u64, usize)> =
        c.ids().into_iter().filter(|n| *n != leader).map(|n| (n, c.logs(n).len())).collect();
    c.kill9(leader);
    let killed = Instant::now();
    let (code, g2) = run_json(&["acquire", "cli/two", "--ttl", "30s", "--endpoints", &eps, "-o", "json"]);
    assert_eq!(code, 0, "acquire after the leader died: {g2}");
    assert!(g2["fencing_token"].as_u64() > g1["fencing_token"].as_u64());
    let s = status_until(&eps, "the dead leader as unreachable", |s| {
        s["leader_id"].as_u64().is_some_and(|l| l != leader)
            && listed(s, leader).is_some_and(|m| m["reachable"] == false)
    })
    .await;
    assert_eq!(member(&s, leader)["state"], "unreachable");

    // The dead node does not flood the new leader's log: openraft warns once
    // per failed heartbeat (20 a second or more with this heartbeat), and
    // fencer writes a dependency's line at most 5 times per 10 s window
    // (src/log_limit.rs). First the warnings are seen at all (a line, or a
    // window's report of withheld ones), then their number is bounded by
    // the windows elapsed since the kill.
    let new_leader = s["leader_id"].as_u64().unwrap();
    let (_, before) = logged_before.iter().find(|(n, _)| *n == new_leader).unwrap();
    let seen_by = Instant::now() + Duration::from_secs(15);
    let since_kill = loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let since_kill = c.logs(new_leader)[*before..].to_string();
        let reported = since_kill.lines().any(|l| l.contains("fencer::log") && l.contains("heartbeat/worker.rs"));
        if killed.elapsed() >= Duration::from_secs(2) && (since_kill.contains("failed to send a heartbeat") || reported)
        {
            break since_kill;
        }
        assert!(Instant::now() < seen_by, "no failed heartbeat seen since the kill:\n{since_kill}");
    };
    let windows = killed.elapsed().as_secs() / 10 + 2;
    let heartbeats = since_kill.lines().filter(|l| l.contains("failed to send a heartbeat")).count();
    assert!(
        heartbeats as u64 <= 5 * windows,
        "{heartbeats} failed-heartbeat lines in the {:?} since the kill:\n{since_kill}",
        killed.elapsed()
    );

    // The killed node rejoins on its data dir: same cluster, nothing lost.
    c.restart(leader);
    c.settled(Duration::from_secs(20)).await;
    let s = status_until(&eps, "every member back", |s| {
        (1..=3).all(|id| listed(s, id).is_some_and(|m| m["reachable"] == true))
    })
    .await;
    assert_eq!(s["cluster_id"], cluster_id.as_str());
    let (code, v) = run_json(&["get", "cli/one", "--endpoints", &eps, "-o", "json"]);
    assert_eq!((code, &v["fencing_token"]), (0, &g1["fencing_token"]), "{v}");

    // A data dir of another cluster is refused with a clear error.
    let current = c.settled(Duration::from_secs(20)).await;
    let victim = c.ids().into_iter().find(|n| *n != current).unwrap();
    let foreign = c.dir.path().join("foreign");
    let lone_addr = format!("127.0.0.1:{}", free_port());
    let foreign_s = foreign.display().to_string();
    let id_s = victim.to_string();
    let mut lone = spawn_fencer(
        &["coordinator", "--id", &id_s, "--listen", &lone_addr, "--data-dir", &foreign_s],
        &c.dir.path().join("lone.log"),
    );
    let lone_port: u16 = lone_addr.rsplit_once(':').unwrap().1.parse().unwrap();
    wait_ready(lone_port, Duration::from_secs(20), &mut lone);
    lone.terminate(Duration::from_secs(10));
    c.kill9(victim);
    let args = c.coordinator_args(victim, &foreign);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, _, err) = run(&args);
    assert_eq!(code, 1, "a foreign data dir must stop the process: {err}");
    assert!(err.contains("belongs to cluster") && err.contains(&cluster_id), "the error must say why: {err}");

    // Replace the node: a new node 4 joins as a learner, is promoted, and
    // the dead node is removed.
    let ip4 = "127.0.0.254";
    let addr4 = format!("{ip4}:{}", free_port_on(ip4));
    let dir4 = c.dir.path().join("n4").display().to_string();
    let peers4 = format!("{},4={addr4}", c.peers());
    let _node4 = spawn_fencer(
        &[
            "coordinator",
            "--id",
            "4",
            "--listen",
            &addr4,
            "--peers",
            &peers4,
            "--data-dir",
            &dir4,
            "--heartbeat",
            HEARTBEAT,
            "--election-timeout",
            ELECTION_MIN,
        ],
        &c.dir.path().join("n4.log"),
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (code, out, err) = run(&["member", "add-learner", "4", &addr4, "--endpoints", &eps, "-o", "json"]);
        if code == 0 {
            let v: Value = serde_json::from_str(out.trim()).unwrap();
            assert!(v["members"].as_array().unwrap().iter().any(|m| m["id"] == 4 && m["role"] == "learner"), "{v}");
            break;
        }
        assert!(Instant::now() < deadline, "add-learner kept failing: {err}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (code, out, err) = run(&["member", "promote", "4", "--endpoints", &eps, "-o", "json"]);
    assert_eq!(code, 0, "promote: {out} {err}");
    let (code, out, err) = run(&["member", "remove", &id_s, "--endpoints", &eps, "-o", "json"]);
    assert_eq!(code, 0, "remove: {out} {err}");
    let (code, _, err) = run(&["member", "promote", "4", "--endpoints", &eps]);
    assert_eq!(code, 6, "promoting a voter again is refused: {err}");
    let s = status_until(&addr4, &format!("node 4 as a healthy voter and no node {victim}"), |s| {
        let ms = s["members"].as_array().unwrap();
        ms.len() == 3 && !ms.iter().any(|m| m["id"] == victim) && listed(s, 4).is_some_and(|m| m["health"] == "ok")
    })
    .await;
    assert_eq!(member(&s, 4)["role"], "voter");
    let (code, v) = run_json(&["get", "cli/two", "--endpoints", &addr4, "-o", "json"]);
    assert_eq!((code, &v["fencing_token"]), (0, &g2["fencing_token"]), "{v}");
}
