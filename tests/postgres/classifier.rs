//! The PostgreSQL sidecar's SQL classifier against a real PostgreSQL
//! (DESIGN §4a G2): every form it reads as a token declaration must be one
//! the server accepts as a `SET` of `fencer.token` with the same value
//! (`SHOW fencer.token`), every statement it reads as something else must
//! leave `fencer.token` alone, it must count a Query's statements as the
//! server does (one CommandComplete each), and the startup `options` reader
//! must find the value the server ends up with.
//!
//! The server is the kit's throwaway PostgreSQL (`fencer_testkit::postgres`);
//! the client here is a minimal one speaking the simple Query protocol, so
//! the test sees each statement's CommandComplete. `PG_SQL_SEED` repeats a
//! run of the random part.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use fencer_proxy::fuzzing::{PgStatement, pg_option_settings, pg_statements};

// ---------------------------------------------------------------------------
// A minimal simple-Query client (protocol 3.0, trust authentication)
// ---------------------------------------------------------------------------

/// What one statement of a Query produced.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Complete(String),
    Empty,
    Error(String),
}

#[derive(Debug, Default)]
struct Reply {
    outcomes: Vec<Outcome>,
    /// The first column of every DataRow.
    values: Vec<Option<String>>,
}

impl Reply {
    fn error(&self) -> Option<&str> {
        self.outcomes.iter().find_map(|o| match o {
            Outcome::Error(e) => Some(e.as_str()),
            _ => None,
        })
    }

    fn completes(&self) -> usize {
        self.outcomes.iter().filter(|o| matches!(o, Outcome::Complete(_))).count()
    }
}

struct Session {
    stream: TcpStream,
}

impl Session {
    fn connect(port: u16, options: Option<&str>) -> Result<Self, String> {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
        stream.set_read_timeout(Some(Duration::from_secs(30))).map_err(|e| e.to_string())?;
        let mut body = 196_608u32.to_be_bytes().to_vec(); // protocol 3.0
        for (k, v) in
            [("user", "postgres"), ("database", "postgres")].into_iter().chain(options.map(|o| ("options", o)))
        {
            body.extend_from_slice(k.as_bytes());
            body.push(0);
            body.extend_from_slice(v.as_bytes());
            body.push(0);
        }
        body.push(0);
        let mut packet = u32::try_from(body.len() + 4).expect("a short packet").to_be_bytes().to_vec();
        packet.extend_from_slice(&body);
        stream.write_all(&packet).map_err(|e| e.to_string())?;
        let mut session = Self { stream };
        loop {
            let (tag, body) = session.read_message()?;
            match tag {
                b'R' if body[..4] == [0, 0, 0, 0] => {}
                b'R' => return Err("the server asked for a password".into()),
                b'E' => return Err(error_text(&body)),
                b'Z' => return Ok(session),
                _ => {}
            }
        }
    }

    fn read_message(&mut self) -> Result<(u8, Vec<u8>), String> {
        let mut header = [0u8; 5];
        self.stream.read_exact(&mut header).map_err(|e| e.to_string())?;
        let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        let mut body = vec![0u8; len - 4];
        self.stream.read_exact(&mut body).map_err(|e| e.to_string())?;
        Ok((header[0], body))
    }

    fn query(&mut self, sql: &str) -> Reply {
        assert!(!sql.contains('\0'));
        let mut message = vec![b'Q'];
        message.extend_from_slice(&u32::try_from(sql.len() + 5).expect("a short query").to_be_bytes());
        message.extend_from_slice(sql.as_bytes());
        message.push(0);
        self.stream.write_all(&message).expect("the server reads");
        let mut reply = Reply::default();
        loop {
            let (tag, body) = self.read_message().expect("the server answers");
            match tag {
                b'C' => reply.outcomes.push(Outcome::Complete(cstr(&body))),
                b'I' => reply.outcomes.push(Outcome::Empty),
                b'E' => reply.outcomes.push(Outcome::Error(error_text(&body))),
                b'D' => {
                    let len = i32::from_be_bytes([body[2], body[3], body[4], body[5]]);
                    reply
                        .values
                        .push(usize::try_from(len).ok().map(|n| String::from_utf8_lossy(&body[6..6 + n]).into_owned()));
                }
                b'Z' => return reply,
                _ => {}
            }
        }
    }

    /// `fencer.token` as the server has it.
    fn token(&mut self) -> String {
        let reply = self.query("SHOW fencer.token");
        assert_eq!(reply.error(), None);
        reply.values[0].clone().expect("SHOW returns a value")
    }
}

fn cstr(body: &[u8]) -> String {
    String::from_utf8_lossy(body.split(|&b| b == 0).next().unwrap_or_default()).into_owned()
}

/// "SQLSTATE: message" of an ErrorResponse.
fn error_text(body: &[u8]) -> String {
    let mut code = String::new();
    let mut message = String::new();
    for field in body.split(|&b| b == 0).filter(|f| !f.is_empty()) {
        match field[0] {
            b'C' => code = String::from_utf8_lossy(&field[1..]).into_owned(),
            b'M' => message = String::from_utf8_lossy(&field[1..]).into_owned(),
            _ => {}
        }
    }
    format!("{code}: {message}")
}

// ---------------------------------------------------------------------------
// Cases
// ---------------------------------------------------------------------------

/// Token declarations in every spelling the classifier accepts.
const DECLARATIONS: &[&str] = &[
    "SET fencer.token = 42",
    "set FENCER.TOKEN to 42",
    "SET SESSION fencer.token = 42",
    "SET \"fencer\".token = 42",
    "SET fencer.\"token\" = 42",
    "SET \"fencer.token\" = 42",
    "SET \"FENCER\".\"TOKEN\" = 42",
    "SET U&\"fencer\\002etoken\" = 42",
    "SET U&\"fencer!002etoken\" UESCAPE '!' = 42",
    "SET U&\"fencer!002etoken\" uescape E'!' = 42",
    "SET U&\"fencer!002etoken\" UESCAPE $$!$$ = 42",
    "SET fencer /* c */ . -- c\n token = 42",
    "\n\tSET\nfencer.token\n=\n42\n-- done",
    "SET/**/fencer.token/**/=/**/42/**/",
    "SET fencer.token = 'v1.abc'",
    "SET fencer.token = 'it''s'",
    "SET fencer.token = E'\\x34\\062'",
    "SET fencer.token = e'a\\tb\\nc\\\\d\\'e\\q\\f\\b\\r'",
    "SET fencer.token = E'\\u0041\\U0001F600\\uD83D\\uDE00'",
    "SET fencer.token = E'\\x4g'",
    "SET fencer.token = E'\\101\\1011'",
    "SET fencer.token = $$v1.a'b;c$$",
    "SET fencer.token = $t$v$$1$t$",
    "SET fencer.token = U&'\\0034\\+000032'",
    "SET fencer.token = U&'!0034!!' UESCAPE '!'",
    "SET fencer.token = U&'\\D83D\\DE00'",
    "SET fencer.token = U&'a\\\\b'",
    "SET fencer.token = '4'\n'2'",
    "SET fencer.token = '4' -- it's\n  -- more\n '2'",
    "SET fencer.token = E'\\x34'\r\n'\\062'",
    "SET fencer.token = U&'\\00'\n'34'",
    "SET fencer.token = 00042",
    "SET fencer.token = 0",
    "SET fencer.token = 000",
    "SET fencer.token = 2147483647",
    "SET fencer.token = 2147483648",
    "SET fencer.token = 02147483648",
    "SET fencer.token = 18446744073709551615",
    "SET fencer.token = 99999999999999999999999",
    "SET fencer.token = abc",
    "SET fencer.token = ABC",
    "SET fencer.token = \"ABC\"",
    "SET fencer.token = U&\"a\\0042\"",
    "SET fencer.token = on",
    "SET fencer.token = TRUE",
    "SET fencer.token = false",
    "SET fencer.token = local",
    "SET fencer.token = left",
    "SET fencer.token = between",
    "SET fencer.token = session",
    "SET fencer.token = ''",
    "SET fencer.token = 'DEFAULT'",
    "SET fencer.token = \"default\"",
    "SET fencer.token = 'a\\b'",
    "SET fencer.token = 42;",
];

/// With standard_conforming_strings off.
const DECLARATIONS_SCS_OFF: &[&str] = &[
    "SET fencer.token = 'a\\'b'",
    "SET fencer.token = 'a\\\\b\\n'",
    "SET fencer.token = 'a\\\nb'",
    "SET U&\"fencer.token\" = 5",
];

/// Statements the classifier does not read as declarations. Those it calls
/// `Other` are forwarded: if the server accepts them, `fencer.token` must
/// not change. Those it refuses (`UnsupportedFencerSetting`) never reach it.
const NOT_DECLARATIONS: &[&str] = &[
    "SET fencer.tokens = 1",
    "SET fencer.token2 = 1",
    "SET fencer.token.x = 1",
    "SET fencer_token = 1",
    "SET \"fencer.token \" = 1",
    "SET fencer..token = 1",
    "SET xfencer.token = 1",
    "SET session.token = 1",
    "SET local.fencer = 1",
    "SET application_name = 'fencer.token'",
    "ALTER ROLE postgres SET fencer.token = 1",
    "RESET fencer.tokens",
    "SHOW fencer.token",
    "SET LOCAL fencer.token = 1",
    "SET fencer.token = 1, 2",
    "SET fencer.token = 1 INSERT INTO t VALUES (1)",
    "SET fencer.token FROM CURRENT",
    "SET fencer.token = $1",
    "SET fencer.token = B'01'",
    "SET fencer.token = N'42'",
    "SET fencer.token = E'\\0'",
    "SET fencer.token = E'\\xff'",
    "SET fencer.token = U&'\\D800'",
    "SET fencer.token = U&'x' UESCAPE '+'",
    "SET fencer.token = \"\"",
    "SET fencer.token == 1",
    "SET fencer.token := 1",
    "SET fencer.token = 5::int",
    "SET fencer.token = 'a' 'b'",
    "SET fencer.token = 'a' /* */\n'b'",
    "SET SESSION LOCAL fencer.token = 1",
    "RESET SESSION fencer.token",
    "RESET fencer.token, x",
    "SET fencer.token = 1\u{b}",
    "SET fencer.token = 1_000",
    "SET fencer.token = 0x10",
    "SET fencer.token = select",
    "SET fencer.token = '1",
    "SET fencer.token = E'\\'",
    "SELECT '\\'; SET fencer.token = 1'",
    "SET fencer.token = N'x' || 'y'",
    "SET fencer.token = -5",
    "SET fencer.token = 1.5",
];

/// Texts whose statements the classifier counts; the server runs them in a
/// transaction that is rolled back.
const SPLITS: &[&str] = &[
    "SELECT 1; SELECT 2",
    ";;SELECT 1;;;SELECT 2;;",
    "SELECT 1 -- ; SELECT 2\n; SELECT 3",
    "SELECT /* /* */ ; */ 1; SELECT 2",
    "SELECT /**/ 1; SELECT /***/ 2; SELECT /*/ ; */ 3",
    "SELECT 1 +/* ; */ 2; SELECT 3",
    "SELECT 1 +-- ;\n 2; SELECT 3",
    "SELECT 'a;b'; SELECT 2",
    "SELECT 'it''s; x'; SELECT 2",
    "SELECT E'\\'; x'; SELECT 2",
    "SELECT E'\\\\'; SELECT 2",
    "SELECT N'a;b', X'0a', b'1'; SELECT 2",
    "SELECT U&'a;\\0041'; SELECT 2",
    "SELECT '\\'; SELECT 2; --'",
    "SELECT E'a'\n'\\'; SELECT 1; --'",
    "SELECT 'a'\n  -- c\n ';'; SELECT 2",
    "SELECT $$;$$; SELECT 2",
    "SELECT $a$ $$ ; $b$ ; $a$; SELECT 2",
    "SELECT $a$x$b$y;$a$; SELECT 2",
    "SELECT $_1$;$_1$, $é$;$é$; SELECT 2",
    "SELECT 1 AS \"a;b\"; SELECT 2",
    "SELECT 1 AS \"a\"\";b\"; SELECT 2",
    "SELECT 1 AS U&\"a;\\0041\"; SELECT 2",
    "SELECT 1 AS x$a$ ; SELECT 2",
    "SELECT 1 AS uu, 2 AS u; SELECT 2",
    "DO $$ BEGIN PERFORM 1; PERFORM 2; END $$; SELECT 2",
    "CREATE TABLE tt(a int, \"end\" int); SELECT 2",
    "CREATE TABLE tt(a int, \"end\" int); CREATE FUNCTION f1() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1; SELECT 2; END; SELECT 3",
    "create or replace function f2() returns int language sql begin atomic select case when true then 1 end; end; SELECT 2",
    "CREATE TABLE tt(a int, \"end\" int); CREATE FUNCTION f3() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT tt.end FROM tt; END; SELECT 2",
    "CREATE FUNCTION f4() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1 AS end; END; SELECT 2",
    "CREATE FUNCTION f5() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1 end; END; SELECT 2",
    "CREATE FUNCTION f11() RETURNS void LANGUAGE sql BEGIN ATOMIC END; SELECT 2",
    "CREATE FUNCTION f10(begin int) RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT begin; END; SELECT 2",
    "CREATE FUNCTION begin() RETURNS int LANGUAGE sql AS 'select 1'; SELECT 2",
    "CREATE FUNCTION f6() RETURNS int LANGUAGE plpgsql AS $$BEGIN RETURN 1; END$$; SELECT 2",
    "CREATE OR REPLACE PROCEDURE p2() LANGUAGE sql BEGIN /* c */ ATOMIC SELECT 1; END; SELECT 2",
    "SELECT .5e3; SELECT 1.5e-3",
];

/// `options` values and the `fencer.token` the server ends up with.
const OPTIONS: &[&str] = &[
    "-c fencer.token=5",
    "--fencer.token=6",
    "-cfencer.token=7",
    "-c fencer.token=a\\ b\\\\c",
    "-ec fencer.token=8",
    "-c FENCER.TOKEN=9 -c fencer.token=10",
    "-c fencer.token=12 --",
    "-c fencer.token==",
    "-c fencer.token=",
    "-c\tfencer.token=15\u{b}",
    "-c fencer.token=16 -d 1",
    "-c fencer.token=14\\",
    "-D -cfencer.token=1",
    " -c  fencer.token=v1.Ab_-x ",
    "-c fencer.token",
    "--fencer.token",
    "foo -c fencer.token=11",
    "-- -c fencer.token=13",
    "-x",
    "-c",
    "-c fencer.token=17 -",
];

/// A small deterministic generator (splitmix64), so a failure can be rerun.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[(self.next() % items.len() as u64) as usize]
    }
}

const GAPS: &[&str] = &[" ", "\n", "\t", " /* ; */ ", "/*/* ; */*/", " -- ; ' \" $$\n", "\r\n"];
const EXPRESSIONS: &[&str] = &[
    "'a;b'",
    "'it''s;'",
    "E'\\';\\\\'",
    "$$;$$",
    "$q$ $$ ; $q$",
    "U&'\\0041;'",
    "B'01'",
    "X'0a'",
    "N'x;y'",
    "(1)",
    "1.5e-3",
    "'a'\n';'",
    "1 /* ; */ + 2",
    "1 -- ;\n + 2",
    "(SELECT 1 AS \"a;b\")",
];

/// A random token declaration of `value` (its digits, as written).
fn random_declaration(rng: &mut Rng, value: u64) -> String {
    let digits = value.to_string();
    let each = |f: &dyn Fn(char) -> String| digits.chars().map(f).collect::<String>();
    let literal = match rng.next() % 8 {
        0 => digits.clone(),
        1 => format!("'{digits}'"),
        2 => format!("E'{}'", each(&|c| format!("\\x3{c}"))),
        3 => format!("e'{}'", each(&|c| format!("\\{:03o}", u32::from(c)))),
        4 => format!("$${digits}$$"),
        5 => format!("$v$ {digits}$v$").replacen(' ', "", 1),
        6 => format!("U&'{}'", each(&|c| format!("\\003{c}"))),
        _ => {
            let (a, b) = digits.split_at(digits.len() / 2);
            format!("'{a}'\n  '{b}'")
        }
    };
    let name = rng.pick(&[
        "fencer.token",
        "FENCER.TOKEN",
        "\"fencer\".token",
        "\"fencer.token\"",
        "U&\"fencer\\002etoken\"",
        "U&\"fencer!002Etoken\" UESCAPE '!'",
        "fencer/**/.-- c\ntoken",
    ]);
    let set = rng.pick(&["SET", "set", "Set", "SET SESSION", "set session"]);
    let assign = rng.pick(&["=", "TO", "to"]);
    let g: Vec<&str> = (0..4).map(|_| rng.pick(GAPS)).collect();
    format!("{}{set} {name}{}{assign}{}{literal}{}", g[0], g[1], g[2], g[3])
}

// ---------------------------------------------------------------------------
// The test
// ---------------------------------------------------------------------------

fn only(statements: &[PgStatement], sql: &str) -> PgStatement {
    assert_eq!(statements.len(), 1, "{sql:?}: {statements:?}");
    statements[0].clone()
}

#[test]
fn the_classifier_agrees_with_postgres() {
    let Some(pg) = fencer_testkit::postgres::require("the_classifier_agrees_with_postgres") else {
        return;
    };
    let port = pg.port();
    let mut on = Session::connect(port, None).expect("a session");
    let mut off = Session::connect(port, Some("-c standard_conforming_strings=off")).expect("a session");
    assert_eq!(on.query("SHOW standard_conforming_strings").values, [Some("on".to_owned())]);
    assert_eq!(off.query("SHOW standard_conforming_strings").values, [Some("off".to_owned())]);

    // Every declaration is one the server accepts, with the decoded value.
    let mut checked = 0;
    let mut declare = |session: &mut Session, scs: bool, sql: &str| {
        let statement = only(&pg_statements(sql, scs), sql);
        let value = statement.sets_token.clone().unwrap_or_else(|| panic!("{sql:?} is a declaration: {statement:?}"));
        assert_eq!(session.query("SET fencer.token = 'before'").error(), None);
        let reply = session.query(sql);
        assert_eq!(reply.error(), None, "{sql:?} (scs {scs})");
        assert_eq!(session.token(), value, "{sql:?} (scs {scs})");
        // A reset clears it again.
        assert_eq!(session.query("RESET fencer.token").error(), None);
        assert_eq!(session.token(), "");
        checked += 1;
    };
    for sql in DECLARATIONS {
        declare(&mut on, true, sql);
    }
    for sql in DECLARATIONS_SCS_OFF {
        declare(&mut off, false, sql);
    }
    let seed = std::env::var("PG_SQL_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed_f00d);
    eprintln!("proxy_pg_sql: random cases from PG_SQL_SEED={seed}");
    let mut rng = Rng(seed);
    for _ in 0..150 {
        let value = match rng.next() % 3 {
            0 => rng.next() % 100,
            1 => rng.next() % 3_000_000_000,
            _ => rng.next(),
        };
        let sql = random_declaration(&mut rng, value);
        declare(&mut on, true, &sql);
        if !sql.contains("U&'") {
            declare(&mut off, false, &sql);
        }
    }
    eprintln!("proxy_pg_sql: {checked} declarations agree");

    // Whatever else the server accepts leaves fencer.token alone.
    for (session, scs) in [(&mut on, true), (&mut off, false)] {
        for sql in NOT_DECLARATIONS {
            let statements = pg_statements(sql, scs);
            assert!(statements.iter().all(|s| s.sets_token.is_none() && !s.clears_token), "{sql:?}: {statements:?}");
            assert_eq!(session.query("SET fencer.token = 'before'").error(), None);
            // The sidecar refuses these; the server may well take them.
            let refused = statements.iter().any(|s| s.kind.starts_with("UnsupportedFencerSetting"));
            if session.query(sql).error().is_none() && !refused {
                assert_eq!(session.token(), "before", "{sql:?} (scs {scs}) changed fencer.token");
            }
        }
    }
    // An unterminated construct anywhere: the server runs nothing of the
    // text, not even a complete declaration before it.
    for sql in
        ["SET fencer.token = 1; /* x", "SET fencer.token = 1; SELECT 'x", "SET fencer.token = '1", "BEGIN; SELECT $a$"]
    {
        let statements = pg_statements(sql, true);
        assert!(statements.last().is_some_and(|s| s.incomplete), "{sql:?}: {statements:?}");
        assert_eq!(on.query("SET fencer.token = 'before'").error(), None);
        let reply = on.query(sql);
        assert!(reply.error().is_some() && reply.completes() == 0, "{sql:?}: {reply:?}");
        assert_eq!(on.token(), "before");
    }
    // The role default set above would reach the sessions below.
    assert_eq!(on.query("ALTER ROLE postgres RESET fencer.token").error(), None);

    // The server runs one statement per statement counted (nothing, if the
    // text does not parse).
    for sql in SPLITS {
        let statements = pg_statements(sql, true);
        assert_eq!(on.query("BEGIN").error(), None);
        let reply = on.query(sql);
        assert_eq!(reply.error(), None, "{sql:?}");
        assert_eq!(reply.completes(), statements.len(), "{sql:?}: {statements:?} vs {:?}", reply.outcomes);
        assert_eq!(on.query("ROLLBACK").error(), None);
    }
    // Random mixes of SELECTs with tricky literals and declarations, ending
    // in SHOW: the statement count, and the last declared value.
    for _ in 0..150 {
        let mut sql = String::new();
        let mut expected_token = "before".to_owned();
        let count = 1 + rng.next() % 5;
        for _ in 0..count {
            if rng.next().is_multiple_of(3) {
                let value = rng.next() % 1_000_000;
                sql.push_str(&random_declaration(&mut rng, value));
                expected_token = value.to_string();
            } else {
                sql.push_str("SELECT ");
                let n = 1 + rng.next() % 3;
                let expressions: Vec<String> =
                    (0..n).map(|_| format!("{}{}", rng.pick(GAPS), rng.pick(EXPRESSIONS))).collect();
                sql.push_str(&expressions.join(","));
            }
            sql.push_str(rng.pick(&[";", ";;", " ; ", ";\n"]));
            sql.push_str(rng.pick(GAPS));
        }
        sql.push_str("SHOW fencer.token");
        let statements = pg_statements(&sql, true);
        let last = statements.iter().rev().find_map(|s| s.sets_token.clone());
        assert_eq!(last.as_deref().unwrap_or("before"), expected_token, "{sql:?}: {statements:?}");
        assert_eq!(on.query("SET fencer.token = 'before'").error(), None);
        let reply = on.query(&sql);
        assert_eq!(reply.error(), None, "{sql:?}");
        assert_eq!(reply.completes(), statements.len(), "{sql:?}: {statements:?} vs {:?}", reply.outcomes);
        assert_eq!(reply.values.last().cloned().flatten().as_deref(), Some(expected_token.as_str()), "{sql:?}");
    }

    // The startup options reader finds what the server sets.
    for options in OPTIONS {
        let ours = pg_option_settings(options);
        match (Session::connect(port, Some(options)), ours) {
            (Ok(mut session), Ok(settings)) => {
                let value = settings.iter().rev().find(|(n, _)| n == "fencer.token").map(|(_, v)| v.clone());
                let shown = session.query("SHOW fencer.token");
                match value {
                    Some(v) => assert_eq!(shown.values, [Some(v)], "{options:?}"),
                    None => assert!(shown.error().is_some(), "{options:?}: {shown:?}"),
                }
            }
            (Err(_), Err(_)) => {}
            (theirs, ours) => panic!("{options:?}: the server says {:?}, we say {ours:?}", theirs.map(|_| "connected")),
        }
    }
}
