//! G5: a transaction holds the resource's shared guard from its first
//! fenced message until ReadyForQuery reports idle. A higher token waits
//! for older transactions at most `drain_timeout`, then ends them with
//! `pg_terminate_backend` over the sidecar's admin connection, and moves
//! the epoch only once every older backend has exited. Without an admin
//! connection it gets FN004 instead.

use std::time::Duration;

use crate::fixture::{admin_table, connect_as, require_postgres, sidecar};
use crate::{SOON, expect_code};

/// The zombie in a transaction: A holds an open transaction with a write
/// and goes silent; B's higher token ends A's backend and writes, and B's
/// row becomes visible only after A's backend is gone from
/// `pg_stat_activity`; A's later COMMIT fails; only B's row is in the
/// table. Then COMMIT itself is fenced: an open transaction whose token
/// fell behind cannot commit (FN001), and ROLLBACK still can.
#[tokio::test]
async fn t20_zombie_in_a_transaction() {
    let Some(pg) = require_postgres("t20_zombie_in_a_transaction") else { return };
    let su = pg.setup().await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = sidecar(&pg, dir.path(), "drain_timeout = \"300ms\"", &admin_table(dir.path())).await;
    let addr = proxy.local_addr();
    let a = connect_as(addr, "app", None, "zombie-a", None).await.unwrap();
    a.batch_execute("SET fencer.token = 41; BEGIN; INSERT INTO fenced (writer, token) VALUES ('A', 41)").await.unwrap();
    let a_pid = pg.backend_pid(&su, "zombie-a").await.expect("A's backend");

    let b = connect_as(addr, "app", None, "writer-b", None).await.unwrap();
    let b_write = tokio::spawn(async move {
        b.batch_execute("SET fencer.token = 42; INSERT INTO fenced (writer, token) VALUES ('B', 42)").await
    });
    // Watch: B's row must never be visible while A's backend still runs.
    let started = std::time::SystemTime::now();
    loop {
        let a_alive = pg.backend_alive(&su, a_pid).await;
        let b_visible = pg.rows(&su).await.iter().any(|(w, _)| w == "B");
        assert!(!(a_alive && b_visible), "B's write landed while A's older transaction was still open (G5)");
        if b_visible {
            break;
        }
        assert!(started.elapsed().unwrap() < SOON, "B's write never landed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    b_write.await.unwrap().expect("B's write succeeds once A is gone");
    assert!(!pg.backend_alive(&su, a_pid).await);

    // A wakes up and commits: its connection is gone.
    let commit = a.batch_execute("COMMIT").await;
    assert!(commit.is_err(), "A's COMMIT after its backend was ended succeeded");
    assert_eq!(pg.rows(&su).await, [("B".to_owned(), 42)]);
    let metrics = fencer_proxy::AdminClient::new(&proxy.admin_addr().to_string(), SOON).unwrap();
    let status = metrics.resource("pg/postgres").await.unwrap();
    assert_eq!(status.epoch, 42);
    assert!(status.indeterminate.is_none(), "an idle transaction ended by the sidecar left an unknown outcome");

    // COMMIT is fenced like a write, not let through like ROLLBACK: a
    // transaction that began with 41 before the epoch moved past it (BEGIN
    // takes no guard) cannot commit with 41; ROLLBACK always can.
    let c = connect_as(addr, "app", None, "stale-c", None).await.unwrap();
    c.batch_execute("SET fencer.token = 42; BEGIN").await.unwrap();
    let d = connect_as(addr, "app", None, "writer-d", None).await.unwrap();
    d.batch_execute("SET fencer.token = 43; INSERT INTO fenced (writer, token) VALUES ('D', 43)").await.unwrap();
    expect_code(c.batch_execute("COMMIT").await, "FN001");
    c.batch_execute("ROLLBACK").await.expect("ROLLBACK needs no current token");
    proxy.shutdown().await;
}

/// The race: a write with 42 must not reach PostgreSQL before the
/// transaction of 41 that was in flight ended (here it ends on its own
/// within the drain timeout). The order is read from `clock_timestamp()`
/// recorded by each row.
#[tokio::test]
async fn t21_a_higher_token_waits_for_the_older_transaction_in_flight() {
    let Some(pg) = require_postgres("t21_a_higher_token_waits_for_the_older_transaction_in_flight") else { return };
    let su = pg.setup().await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = sidecar(&pg, dir.path(), "drain_timeout = \"20s\"", "").await;
    let addr = proxy.local_addr();
    let a = connect_as(addr, "app", None, "slow-a", None).await.unwrap();
    let b = connect_as(addr, "app", None, "fast-b", None).await.unwrap();
    b.batch_execute("SET fencer.token = 42").await.unwrap();
    let a_txn = tokio::spawn(async move {
        a.batch_execute(
            "SET fencer.token = 41; BEGIN; INSERT INTO fenced (writer, token) VALUES ('A-start', 41);
             SELECT pg_sleep(1.5); INSERT INTO fenced (writer, token) VALUES ('A-end', 41); COMMIT",
        )
        .await
    });
    // Wait until A's transaction is in flight at PostgreSQL.
    let started = std::time::SystemTime::now();
    while pg.rows(&su).await.is_empty() {
        let in_sleep: i64 = su
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'slow-a' AND query LIKE '%pg_sleep%'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if in_sleep > 0 {
            break;
        }
        assert!(started.elapsed().unwrap() < SOON);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    b.batch_execute("INSERT INTO fenced (writer, token) VALUES ('B', 42)").await.unwrap();
    a_txn.await.unwrap().unwrap();
    let order: Vec<(String, bool)> = su
        .query("SELECT writer, at >= (SELECT max(at) FROM fenced WHERE writer LIKE 'A%') FROM fenced ORDER BY at", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let writers: Vec<&str> = order.iter().map(|(w, _)| w.as_str()).collect();
    assert_eq!(writers, ["A-start", "A-end", "B"], "42's write reached PostgreSQL inside 41's transaction");
    proxy.shutdown().await;
}

/// Without `[postgres.admin]` the sidecar cannot end an older transaction:
/// after `drain_timeout` the higher token gets FN004 (retry), and nothing
/// of it reaches PostgreSQL; once the older transaction ends, it passes.
#[tokio::test]
async fn t22_without_an_admin_connection_a_higher_token_gets_fn004() {
    let Some(pg) = require_postgres("t22_without_an_admin_connection_a_higher_token_gets_fn004") else { return };
    let su = pg.setup().await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = sidecar(&pg, dir.path(), "drain_timeout = \"300ms\"", "").await;
    let addr = proxy.local_addr();
    let a = connect_as(addr, "app", None, "a", None).await.unwrap();
    a.batch_execute("SET fencer.token = 41; BEGIN; INSERT INTO fenced (writer, token) VALUES ('A', 41)").await.unwrap();
    let b = connect_as(addr, "app", None, "b", None).await.unwrap();
    let message = expect_code(
        b.batch_execute("SET fencer.token = 42; INSERT INTO fenced (writer, token) VALUES ('B', 42)").await,
        "FN004",
    );
    assert!(message.contains("older transaction"), "{message}");
    a.batch_execute("COMMIT").await.unwrap();
    b.batch_execute("SET fencer.token = 42; INSERT INTO fenced (writer, token) VALUES ('B', 42)").await.unwrap();
    assert_eq!(pg.rows(&su).await, [("A".to_owned(), 41), ("B".to_owned(), 42)]);
    // A is fenced out now.
    expect_code(a.batch_execute("INSERT INTO fenced (writer, token) VALUES ('A', 41)").await, "FN001");
    proxy.shutdown().await;
}
