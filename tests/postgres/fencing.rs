//! Token declarations and the check: G2 (declaring, clearing, changing the
//! token), G3 (what a connection without a token may send), G4 (a stale
//! token is refused and nothing reaches PostgreSQL), G8 (two-phase commit
//! refused), G10 (the resource comes from the configuration).

use std::time::Duration;

use fencer_proxy::{AdminClient, RejectReason};

use crate::fixture::{connect, connect_as, require_postgres, sidecar};
use crate::{SOON, expect_code};

/// G4: a zombie (not in a transaction) whose token is older than what B
/// wrote with gets FN001; nothing it sent reaches PostgreSQL, and the
/// rejection log names its statement by its first keyword only.
#[tokio::test]
async fn t10_zombie_after_its_lease_is_refused() {
    let Some(pg) = require_postgres("t10_zombie_after_its_lease_is_refused") else { return };
    let su = pg.setup().await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = sidecar(&pg, dir.path(), "", "").await;
    let a = connect(proxy.local_addr(), "app", None).await.unwrap();
    let b = connect(proxy.local_addr(), "app", None).await.unwrap();
    a.batch_execute("SET fencer.token = 41").await.unwrap();
    b.batch_execute("SET fencer.token = 42; INSERT INTO fenced (writer, token) VALUES ('B', 42)").await.unwrap();

    let message = expect_code(a.batch_execute("INSERT INTO fenced (writer, token) VALUES ('A', 41)").await, "FN001");
    assert!(message.contains("41") && message.contains("42") && message.contains("pg/postgres"), "{message}");
    // Extended protocol too.
    expect_code(a.execute("INSERT INTO fenced (writer, token) VALUES ($1, 41)", &[&"A"]).await, "FN001");
    assert_eq!(pg.rows(&su).await, [("B".to_owned(), 42)], "a stale write reached PostgreSQL");

    let admin = AdminClient::new(&proxy.admin_addr().to_string(), SOON).unwrap();
    // The rejection log is written asynchronously.
    let page = fencer_testkit::eventually("the refusal in the rejection log", SOON, || async {
        admin.rejections(None, 10).await.ok().filter(|p| p.rejections.len() >= 2)
    })
    .await;
    let refused = &page.rejections[0];
    assert_eq!(refused.reason, RejectReason::StaleToken);
    assert_eq!(refused.method, "INSERT", "the log names the statement's first keyword");
    assert_eq!((refused.presented_token, refused.current_epoch), (Some(41), Some(42)));
    assert_eq!(refused.sqlstate.as_deref(), Some("FN001"));
    assert_eq!(refused.resource.as_deref(), Some("pg/postgres"));
    let logged = serde_json::to_string(&page.rejections).unwrap();
    assert!(!logged.contains("fenced (writer"), "the rejection log carries statement text: {logged}");

    // The connection stays refused until it declares a newer token.
    expect_code(a.batch_execute("SELECT 1").await, "FN001");
    a.batch_execute("SET fencer.token = 43; INSERT INTO fenced (writer, token) VALUES ('A', 43)").await.unwrap();
    proxy.shutdown().await;
}

/// G3: without a token nothing but the declaration passes, whatever the
/// statement (no SQL parsing decides read or write): writes, DDL, COPY
/// FROM, DO blocks, function calls, and reads too, in both protocols. A
/// `read_only_users` role passes without a token.
#[tokio::test]
async fn t11_a_connection_without_a_token_sends_nothing_but_the_declaration() {
    let Some(pg) = require_postgres("t11_a_connection_without_a_token_sends_nothing_but_the_declaration") else {
        return;
    };
    let su = pg.setup().await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = sidecar(&pg, dir.path(), "", "").await;
    let c = connect(proxy.local_addr(), "app", None).await.unwrap();
    for sql in [
        "INSERT INTO fenced (writer, token) VALUES ('x', 1)",
        "UPDATE fenced SET token = 2",
        "CREATE TABLE sneaky (x int)",
        "DO $$ BEGIN INSERT INTO fenced (writer, token) VALUES ('do', 1); END $$",
        "SELECT pg_catalog.set_config('fencer.token', '99', false)",
        "SELECT 1",
        "BEGIN",
    ] {
        expect_code(c.batch_execute(sql).await, "FN002");
        expect_code(c.execute(sql, &[]).await, "FN002");
    }
    // COPY FROM STDIN through the COPY sub-protocol.
    let copy = c.copy_in::<_, bytes::Bytes>("COPY fenced (writer, token) FROM STDIN").await;
    expect_code(copy.map(drop), "FN002");
    // A prepared statement other than the declaration cannot even be made.
    expect_code(c.prepare("SELECT 1").await.map(drop), "FN002");
    // ROLLBACK can only undo: always allowed.
    c.batch_execute("ROLLBACK").await.unwrap();
    assert!(pg.rows(&su).await.is_empty());
    su.query_one("SELECT 1 FROM pg_class WHERE relname = 'sneaky'", &[]).await.unwrap_err();

    // The declaration itself passes, in both protocols.
    c.batch_execute("SET fencer.token = 7").await.unwrap();
    c.execute("INSERT INTO fenced (writer, token) VALUES ('c', 7)", &[]).await.unwrap();
    c.execute("RESET fencer.token", &[]).await.unwrap();
    expect_code(c.execute("SELECT 1", &[]).await, "FN002");
    c.execute("SET fencer.token TO 7", &[]).await.unwrap();
    c.execute("SELECT 1", &[]).await.unwrap();

    // A read-only role needs no token.
    let r = connect(proxy.local_addr(), "reporting", None).await.unwrap();
    let n: i64 = r.query_one("SELECT count(*) FROM fenced", &[]).await.unwrap().get(0);
    assert_eq!(n, 1);
    r.batch_execute("SELECT count(*) FROM fenced").await.unwrap();
    proxy.shutdown().await;
}

/// G2 and G8: the token may change only outside a transaction or before
/// its first fenced statement (FN005, and PostgreSQL's transaction is
/// aborted as if it had refused the statement itself); RESET ALL, DISCARD
/// ALL and RESET fencer.token clear it; the startup options declare it;
/// unsupported forms are refused; PREPARE TRANSACTION, COMMIT PREPARED and
/// ROLLBACK PREPARED are refused (FN006).
#[tokio::test]
async fn t12_declaring_changing_and_clearing_the_token() {
    let Some(pg) = require_postgres("t12_declaring_changing_and_clearing_the_token") else { return };
    let su = pg.setup().await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = sidecar(&pg, dir.path(), "", "").await;
    let addr = proxy.local_addr();
    let c = connect(addr, "app", None).await.unwrap();

    // Inside a transaction, after a fenced statement: FN005, and the
    // transaction is aborted (COMMIT rolls back), in both protocols.
    c.batch_execute("SET fencer.token = 10; BEGIN; INSERT INTO fenced (writer, token) VALUES ('t', 10)").await.unwrap();
    expect_code(c.batch_execute("SET fencer.token = 11").await, "FN005");
    expect_code(c.batch_execute("INSERT INTO fenced (writer, token) VALUES ('t', 10)").await, "25P02");
    c.batch_execute("COMMIT").await.unwrap();
    assert!(pg.rows(&su).await.is_empty(), "the aborted transaction committed");
    c.batch_execute("BEGIN").await.unwrap();
    c.execute("INSERT INTO fenced (writer, token) VALUES ('t', 10)", &[]).await.unwrap();
    expect_code(c.execute("SET fencer.token = 11", &[]).await, "FN005");
    c.batch_execute("ROLLBACK").await.unwrap();
    // In one Query: a declaration after a fenced statement.
    expect_code(
        c.batch_execute("INSERT INTO fenced (writer, token) VALUES ('t', 10); SET fencer.token = 12").await,
        "FN005",
    );
    assert!(pg.rows(&su).await.is_empty());

    // Before the transaction's first fenced statement: allowed.
    c.batch_execute("BEGIN; SET fencer.token = 12; INSERT INTO fenced (writer, token) VALUES ('t', 12); COMMIT")
        .await
        .unwrap();
    // Outside a transaction, right after autocommit writes: allowed.
    c.batch_execute("INSERT INTO fenced (writer, token) VALUES ('t', 12)").await.unwrap();
    c.batch_execute("SET fencer.token = 13").await.unwrap();
    assert_eq!(pg.rows(&su).await.len(), 2);

    // Clearing: RESET fencer.token, RESET ALL, DISCARD ALL.
    for clear in ["RESET fencer.token", "RESET ALL", "DISCARD ALL", "SET fencer.token TO DEFAULT"] {
        c.batch_execute("SET fencer.token = 13").await.unwrap();
        c.batch_execute("SELECT 1").await.unwrap();
        c.batch_execute(clear).await.unwrap();
        expect_code(c.batch_execute("SELECT 1").await, "FN002");
    }

    // Unsupported forms are refused with the supported one named.
    for bad in ["SET LOCAL fencer.token = 14", "SET fencer.token = 14, 15", "SET fencer.token = -14"] {
        let message = expect_code(c.batch_execute(bad).await, "FN006");
        assert!(message.contains("SET fencer.token"), "{message}");
    }
    // A malformed token value.
    expect_code(c.batch_execute("SET fencer.token = 'v1.not.a-token'").await, "FN002");
    // A declaration with a non-ASCII byte is never taken as one (docs:
    // Limits): it is fenced like any statement, here refused without a token.
    c.batch_execute("RESET fencer.token").await.unwrap();
    expect_code(c.batch_execute("SET fencer.token = '14é'").await, "FN002");
    expect_code(c.batch_execute("SELECT 'é'; SET fencer.token = 14").await, "FN002");
    // After its last token (a comment) it changes nothing PostgreSQL reads.
    c.batch_execute("SET fencer.token = 14 /* é */").await.unwrap();

    // G8, in both protocols, even with a valid token.
    c.batch_execute("SET fencer.token = 14").await.unwrap();
    for two_phase in ["PREPARE TRANSACTION 'g1'", "COMMIT PREPARED 'g1'", "ROLLBACK PREPARED 'g1'"] {
        expect_code(c.batch_execute(two_phase).await, "FN006");
        expect_code(c.execute(two_phase, &[]).await, "FN006");
    }

    // The startup options declare the token (libpq's PGOPTIONS).
    let o = connect_as(addr, "app", None, "opts", Some("-c fencer.token=14")).await.unwrap();
    o.batch_execute("INSERT INTO fenced (writer, token) VALUES ('o', 14)").await.unwrap();
    let shown: String = o.query_one("SHOW fencer.token", &[]).await.unwrap().get(0);
    assert_eq!(shown, "14", "PostgreSQL saw the declaration too");
    // A stale one in the options is refused at startup.
    let stale = connect_as(addr, "app", None, "stale", Some("-c fencer.token=3")).await.unwrap_err();
    assert_eq!(crate::fixture::code_of(&stale).0, "FN001", "{stale}");

    // G10: the resource comes from the configuration; SET fencer.resource
    // only checks it.
    o.batch_execute("SET fencer.resource = 'pg/postgres'").await.unwrap();
    expect_code(o.batch_execute("SET fencer.resource = 'pg/other'").await, "FN006");
    proxy.shutdown().await;
}

/// A token change waits for the answers to what was sent before it
/// (pipelined autocommit writes), so it is not refused for a transaction
/// that has in fact ended; and every refusal is logged.
#[tokio::test]
async fn t13_pipelined_autocommit_writes_then_a_new_token() {
    let Some(pg) = require_postgres("t13_pipelined_autocommit_writes_then_a_new_token") else { return };
    let su = pg.setup().await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = sidecar(&pg, dir.path(), "", "").await;
    let c = connect(proxy.local_addr(), "app", None).await.unwrap();
    c.batch_execute("SET fencer.token = 20").await.unwrap();
    let insert = c.prepare("INSERT INTO fenced (writer, token) VALUES ($1, $2)").await.unwrap();
    // tokio-postgres pipelines concurrent calls on one connection.
    let writes = (0..20).map(|i| {
        let (c, insert) = (&c, &insert);
        async move { c.execute(insert, &[&format!("p{i}"), &20i64]).await }
    });
    let declare = async {
        tokio::time::sleep(Duration::from_millis(1)).await;
        c.execute("SET fencer.token = 21", &[]).await
    };
    let (results, declared) = tokio::join!(futures::future::join_all(writes), declare);
    for r in results {
        r.unwrap();
    }
    declared.unwrap();
    c.execute(&insert, &[&"after", &21i64]).await.unwrap();
    assert_eq!(pg.rows(&su).await.len(), 21);
    proxy.shutdown().await;
}
