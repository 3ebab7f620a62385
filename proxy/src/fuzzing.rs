//! Fuzz checks (feature `fuzzing`): each takes arbitrary bytes, never
//! panics on any input, and asserts the invariants its parser promises. The
//! cargo-fuzz targets in `fuzz/` call them with coverage-guided input; the
//! tests below call them with a bounded number of proptest cases on every
//! `cargo test` (CI is stable-only). `docs/security.md` has the commands.
//!
//! - [`token_header`]: `Fencing-Token` parsing and verification: only tokens
//!   minted by the key ring's signer ever pass, and never an unsigned one.
//! - [`signed_token_mutation`]: any change to a genuine token is refused.
//! - [`route_match`]: route classification over method, URI and headers.
//! - [`resource_name`]: the DESIGN §2 name rules against an oracle.
//! - [`config_text`]: the `proxy.toml` loader.
//! - [`key_set`]: the signing key-set file.
//! - [`pg_frames`], [`pg_sql`], [`pg_options`]: the PostgreSQL front end's
//!   framing, statement classifier and startup `options` reader.

use std::sync::OnceLock;

use http::{HeaderMap, HeaderName, HeaderValue, Method, Uri};

use fencer_token::{KeyId, KeyRing, KeySet, MAX_TOKEN_BYTES, PresentedToken, Signer};

use crate::config::{ConfigError, ProxyConfig};
use crate::core::names::ResourceName;
use crate::core::rejections::RejectReason;
use crate::core::signing::TokenVerifier;
use crate::http::routes::RouteKind;

/// The resource the token checks are made for.
pub const FUZZ_RESOURCE: &str = "db/orders";
/// The wall time (Unix ms) the token checks are made at.
pub const FUZZ_NOW_UNIX_MS: u64 = 1_770_000_000_000;
/// The fencing token [`genuine_token`] carries.
pub const FUZZ_TOKEN: u64 = 4242;

/// The fuzz signer: a fixed, public key (it protects nothing).
pub fn fuzz_signer() -> Signer {
    Signer::from_secret_bytes(KeyId::new("fuzz-k1").expect("valid key id"), &[7; 32])
}

/// A genuine token for [`FUZZ_RESOURCE`]: a seed for the fuzzers.
pub fn genuine_token() -> String {
    fuzz_signer()
        .sign(FUZZ_RESOURCE, FUZZ_TOKEN, 0x6cf4_a1b2_c3d4_e5f6_0718_293a_4b5c_6d7e, FUZZ_NOW_UNIX_MS - 1000)
        .expect("valid claims")
        .into_string()
}

fn verifier() -> TokenVerifier {
    let signer = fuzz_signer();
    let set =
        KeySet { keys: vec![signer.public_entry(FUZZ_NOW_UNIX_MS - 3_600_000, Some(FUZZ_NOW_UNIX_MS + 3_600_000))] };
    TokenVerifier::from_ring(KeyRing::new(&set).expect("valid key set"), true)
}

/// `Fencing-Token` parsing and the proxy's token check.
pub fn token_header(data: &[u8]) {
    match PresentedToken::parse(data) {
        Err(_) => {}
        Ok(_) if data.len() > MAX_TOKEN_BYTES => panic!("a {}-byte value parsed", data.len()),
        Ok(PresentedToken::Plain(n)) => {
            assert!(data.iter().all(u8::is_ascii_digit), "plain tokens are digits only");
            let digits = std::str::from_utf8(data).expect("digits are UTF-8").trim_start_matches('0');
            assert_eq!(n.to_string(), if digits.is_empty() { "0" } else { digits });
        }
        Ok(PresentedToken::Signed(t)) => {
            assert_eq!(t.as_str().as_bytes(), data, "a signed token keeps its exact text");
            let reparsed = PresentedToken::parse(t.as_str().as_bytes()).expect("a parsed token parses again");
            assert_eq!(reparsed, PresentedToken::Signed(t), "parsing is deterministic");
        }
    }
    let resource = ResourceName::new(FUZZ_RESOURCE).expect("valid resource");
    match verifier().check_at(data, &resource, FUZZ_NOW_UNIX_MS) {
        Ok(token) => {
            // Only what the signer minted verifies: re-signing the claims
            // must give back exactly the presented bytes.
            let Ok(PresentedToken::Signed(t)) = PresentedToken::parse(data) else {
                panic!("an unsigned token passed a proxy that requires signed tokens");
            };
            let c = t.unverified_claims();
            assert_eq!(c.token(), token.get());
            assert_eq!(c.resource(), FUZZ_RESOURCE);
            let minted = fuzz_signer()
                .sign(c.resource(), c.token(), c.lease_id(), c.issued_at_unix_ms())
                .expect("verified claims are valid");
            assert_eq!(minted.as_str().as_bytes(), data, "a token the signer did not mint verified");
        }
        Err(refusal) => {
            if matches!(PresentedToken::parse(data), Ok(PresentedToken::Plain(_))) {
                assert_eq!(refusal.reason, RejectReason::UnsignedToken);
            }
        }
    }
}

/// Applies the edits `data` describes (each 3 bytes: a 2-byte position, a
/// byte) to a genuine token: any token that differs from it is refused.
pub fn signed_token_mutation(data: &[u8]) {
    static GENUINE: OnceLock<String> = OnceLock::new();
    let genuine = GENUINE.get_or_init(genuine_token);
    let mut token = genuine.clone().into_bytes();
    for edit in data.chunks_exact(3) {
        let at = usize::from(u16::from_le_bytes([edit[0], edit[1]]));
        match edit[2] {
            // Some edits insert or cut, so lengths change too.
            0 if !token.is_empty() => {
                token.remove(at % token.len());
            }
            1 => token.insert(at % (token.len() + 1), b'A'),
            b => {
                if let Some(len) = std::num::NonZeroUsize::new(token.len()) {
                    token[at % len.get()] = b;
                }
            }
        }
    }
    let resource = ResourceName::new(FUZZ_RESOURCE).expect("valid resource");
    let result = verifier().check_at(&token, &resource, FUZZ_NOW_UNIX_MS);
    if token == genuine.as_bytes() {
        assert_eq!(result.map(|t| t.get()).ok(), Some(FUZZ_TOKEN), "the genuine token verifies");
    } else {
        assert!(result.is_err(), "an altered token verified: {:?}", String::from_utf8_lossy(&token));
    }
}

/// The resource-name rules against an independent oracle.
pub fn resource_name(data: &[u8]) {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let oracle = (1..=256).contains(&s.len())
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"._:/-".contains(&b))
        && !s.starts_with('/')
        && !s.ends_with('/')
        && !s.contains("//")
        && !s.contains("..");
    let parsed = ResourceName::new(s);
    assert_eq!(parsed.is_ok(), oracle, "{s:?}: {parsed:?}");
    if let Ok(name) = parsed {
        assert_eq!(name.as_str(), s);
        // Every valid name can be put in a signed token.
        fuzz_signer().sign(name.as_str(), 1, 1, 1).expect("a valid resource name is a valid claim");
    }
}

/// The routes [`route_match`] classifies against: path, query and header
/// captures, exact values, a read allow-list and a catch-all.
pub const FUZZ_ROUTES: &str = r#"
listen = "127.0.0.1:1"
upstream = "http://127.0.0.1:2"
data_dir = "d"

[[route]]
methods = ["GET", "HEAD"]
path = "/ping"
kind = "read"

[[route]]
methods = ["GET"]
path = "/query"
query = { q = "SHOW DATABASES" }
kind = "read"

[[route]]
path = "/db/{name}/*"
resource = "db/{name}"

[[route]]
methods = ["POST"]
path = "/write"
query = { db = "{db}", precision = "*" }
resource = "influx/{db}"

[[route]]
path = "/t/{x}"
headers = { "X-Tenant" = "{tenant}" }
resource = "t/{tenant}/{x}"

[[route]]
path = "/*"
resource = "everything"
"#;

/// Route classification: `data` is a method selector byte, then lines: the
/// request target, then `name: value` headers.
pub fn route_match(data: &[u8]) {
    static CONFIG: OnceLock<ProxyConfig> = OnceLock::new();
    let config = CONFIG.get_or_init(|| ProxyConfig::from_toml_str(FUZZ_ROUTES).expect("the fuzz routes are valid"));
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let methods = [Method::GET, Method::POST, Method::PUT, Method::DELETE, Method::HEAD, Method::PATCH];
    let method = methods[usize::from(selector) % methods.len()].clone();
    let mut lines = rest.split(|&b| b == b'\n');
    let target = lines.next().unwrap_or_default();
    let Ok(uri) = Uri::try_from(target) else {
        return;
    };
    let mut headers = HeaderMap::new();
    for line in lines {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        if let (Ok(name), Ok(value)) =
            (HeaderName::from_bytes(&line[..colon]), HeaderValue::from_bytes(line[colon + 1..].trim_ascii()))
        {
            headers.append(name, value);
        }
    }
    let first = config.http().expect("an HTTP config").router.classify(&method, &uri, &headers);
    let again = config.http().expect("an HTTP config").router.classify(&method, &uri, &headers);
    assert_eq!(first.is_ok(), again.is_ok(), "classification is deterministic");
    if let Ok(c) = first {
        assert!(config.http().expect("an HTTP config").router.routes().iter().any(|r| std::ptr::eq(r, c.route)));
        match (c.route.kind(), &c.resource) {
            (RouteKind::Write, Some(r)) => {
                ResourceName::new(r.as_str()).expect("a classified resource is valid");
            }
            (RouteKind::Write, None) => panic!("a write route without a resource"),
            (RouteKind::Read, _) => assert!(matches!(method, Method::GET | Method::HEAD), "reads are allow-listed"),
        }
        assert_eq!(c.resource.map(|r| r.to_string()), again.ok().and_then(|c| c.resource.map(|r| r.to_string())));
    }
}

/// The `proxy.toml` loader: errors name a line and column inside the text.
pub fn config_text(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match ProxyConfig::from_toml_str(text) {
        Ok(config) => {
            assert!(
                !config.http().expect("an HTTP config").router.routes().is_empty(),
                "a config without routes loaded"
            );
            assert!(config.max_epoch_jump >= 1);
        }
        Err(ConfigError::Invalid { line, column, reason }) => {
            assert!(line >= 1 && line <= text.lines().count() + 1, "line {line} of {:?}: {reason}", text);
            assert!(column >= 1, "column {column}: {reason}");
            assert!(!reason.is_empty());
        }
        Err(other) => panic!("from_toml_str returned {other:?}"),
    }
}

/// The key-set file: whatever parses writes back to the same set.
pub fn key_set(data: &[u8]) {
    if let Ok(set) = KeySet::from_json(data) {
        let again = KeySet::from_json(set.to_json().as_bytes()).expect("a written key set parses");
        assert_eq!(again, set);
        KeyRing::new(&set).expect("a parsed key set makes a ring");
    }
}

/// A check by its target name (the cargo-fuzz binary of the same name).
pub fn check_by_name(target: &str) -> Option<fn(&[u8])> {
    Some(match target {
        "token_header" => token_header,
        "signed_token_mutation" => signed_token_mutation,
        "route_match" => route_match,
        "resource_name" => resource_name,
        "config_text" => config_text,
        "key_set" => key_set,
        _ => return None,
    })
}

/// Seed inputs per target: valid and nearly valid cases that lead the
/// fuzzers into the interesting paths. Written to `fuzz/seeds/` by
/// `cargo test -p fencer-proxy --features fuzzing write_fuzz_seeds -- --ignored`,
/// and checked on every `cargo test`.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let genuine = genuine_token();
    let sig = genuine.rsplit('.').next().unwrap_or_default().to_owned();
    let key_set = KeySet { keys: vec![fuzz_signer().public_entry(1, Some(2))] }.to_json();
    let secured = format!(
        "{FUZZ_ROUTES}\n[signing]\nkeys_file = \"keys.json\"\nrequire_signed = false\nclock_skew = \"5s\"\n\n[tls]\ncert_file = \"c.pem\"\nkey_file = \"k.pem\"\nclient_ca_file = \"ca.pem\"\n"
    );
    let text = |s: &str| s.as_bytes().to_vec();
    vec![
        ("token_header", genuine.clone().into_bytes()),
        ("token_header", text("42")),
        ("token_header", text("18446744073709551615")),
        ("token_header", format!("v1.eyJraWQiOiJmdXp6LWsxIn0.{sig}").into_bytes()),
        ("token_header", text("v2.a.b")),
        ("signed_token_mutation", vec![]),
        ("signed_token_mutation", vec![10, 0, b'B', 200, 0, 0, 5, 0, 1]),
        ("route_match", text("\x00/db/orders/rows/7")),
        ("route_match", text("\x01/write?db=metrics&precision=s")),
        ("route_match", text("\x00/query?q=SHOW+DATABASES")),
        ("route_match", text("\x02/t/x\nX-Tenant: acme\nx-other: 1")),
        ("route_match", text("\x00/db/%2e%2e/x")),
        ("resource_name", text(FUZZ_RESOURCE)),
        ("resource_name", text("a/../b")),
        ("resource_name", "r".repeat(256).into_bytes()),
        ("config_text", text(FUZZ_ROUTES)),
        ("config_text", secured.into_bytes()),
        ("key_set", key_set.into_bytes()),
    ]
}

#[cfg(test)]
mod tests {
    //! Bounded proptest runs of the fuzz checks, on every `cargo test`.
    //! `PROPTEST_CASES=100000 cargo test -p fencer-proxy fuzzing` runs longer.

    use proptest::prelude::*;

    use super::*;

    fn config() -> ProptestConfig {
        // Enough to catch regressions in a few seconds; the long runs are
        // cargo-fuzz's job. PROPTEST_CASES overrides it.
        ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() }
    }

    /// Strings shaped like signed tokens: the prefix, base64url-ish parts,
    /// dots, and sometimes pieces of a genuine token.
    fn token_like() -> impl Strategy<Value = Vec<u8>> {
        let genuine = genuine_token();
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..1100),
            "[0-9]{0,25}".prop_map(String::into_bytes),
            "v1\\.[A-Za-z0-9_-]{0,700}\\.[A-Za-z0-9_-]{80,90}".prop_map(String::into_bytes),
            "v[0-9]?\\.?[A-Za-z0-9_.=+/-]{0,200}".prop_map(String::into_bytes),
            (0..genuine.len(), 0..genuine.len())
                .prop_map(move |(a, b)| genuine.as_bytes()[a.min(b)..a.max(b)].to_vec()),
        ]
    }

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn token_headers(data in token_like()) {
            token_header(&data);
        }

        #[test]
        fn signed_token_mutations(edits in proptest::collection::vec(any::<u8>(), 0..30)) {
            signed_token_mutation(&edits);
        }

        #[test]
        fn resource_names(s in prop_oneof![
            "[A-Za-z0-9._:/ -]{0,20}".prop_map(String::into_bytes),
            "[a-z/.]{250,260}".prop_map(String::into_bytes),
            proptest::collection::vec(any::<u8>(), 0..300),
        ]) {
            resource_name(&s);
        }

        #[test]
        fn route_matches(
            selector in any::<u8>(),
            segments in proptest::collection::vec(
                prop_oneof!["db", "t", "write", "query", "ping", "%2e", "%2F", "..", ".", "", "a b", "x:y", "[a-z]{1,5}"],
                0..6,
            ),
            query in proptest::collection::vec(("[a-z]{1,3}|db|q|precision", "[A-Za-z0-9+%. ]{0,12}"), 0..4),
            headers in proptest::collection::vec(("X-Tenant|x-other", "[ -~]{0,12}"), 0..3),
        ) {
            let mut text = vec![selector];
            text.extend_from_slice(format!("/{}", segments.join("/")).as_bytes());
            if !query.is_empty() {
                let q: Vec<String> = query.iter().map(|(k, v)| format!("{k}={}", v.replace(' ', "+"))).collect();
                text.extend_from_slice(format!("?{}", q.join("&")).as_bytes());
            }
            for (k, v) in &headers {
                text.extend_from_slice(format!("\n{k}: {v}").as_bytes());
            }
            route_match(&text);
        }

        #[test]
        fn route_matches_raw(data in proptest::collection::vec(any::<u8>(), 0..200)) {
            route_match(&data);
        }

        #[test]
        fn config_texts(cut in 0..FUZZ_ROUTES.lines().count(), dup in 0..FUZZ_ROUTES.lines().count(), junk in "[ -~\n]{0,40}") {
            // A valid config with a line cut, a line repeated and junk inserted.
            let lines: Vec<&str> = FUZZ_ROUTES.lines().collect();
            let mut out: Vec<String> = Vec::new();
            for (i, line) in lines.iter().enumerate() {
                if i == dup {
                    out.push((*line).to_owned());
                    out.push(junk.clone());
                }
                if i != cut {
                    out.push((*line).to_owned());
                }
            }
            config_text(out.join("\n").as_bytes());
        }

        #[test]
        fn config_texts_raw(data in proptest::collection::vec(any::<u8>(), 0..300)) {
            config_text(&data);
        }

        #[test]
        fn key_sets(data in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..300),
            (any::<u64>(), proptest::option::of(any::<u64>()), "[a-z0-9.-]{0,10}").prop_map(|(nb, na, kid)| {
                let key = fuzz_signer().public_key().to_base64url();
                let na = na.map_or_else(String::new, |na| format!(r#","not_after_unix_ms":{na}"#));
                format!(r#"{{"keys":[{{"kid":"{kid}","public_key":"{key}","not_before_unix_ms":{nb}{na}}}]}}"#).into_bytes()
            }),
        ]) {
            key_set(&data);
        }
    }

    #[test]
    fn the_seeds_pass_their_checks() {
        for (target, data) in seeds() {
            check_by_name(target).expect("a known target")(&data);
        }
    }

    /// Writes `fuzz/seeds/<target>/<n>` (run by hand after changing seeds).
    #[test]
    #[ignore = "writes the seed corpus into the source tree"]
    fn write_fuzz_seeds() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds");
        for (n, (target, data)) in seeds().into_iter().enumerate() {
            let dir = root.join(target);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(format!("seed-{n:02}")), data).unwrap();
        }
    }

    #[test]
    fn the_genuine_token_passes_and_nothing_else_does() {
        token_header(genuine_token().as_bytes());
        signed_token_mutation(&[]);
        token_header(b"18446744073709551615");
    }
}

// ---------------------------------------------------------------------------
// The PostgreSQL front end's parsers (issue 14): `pg_sql` and `pg_options`.
// Appended here, with their own lookup and seeds (`pg_check_by_name`,
// `pg_seeds`), while the rest of the proxy is restructured; they can join
// `check_by_name` and `seeds` above when the front end is wired up.
// ---------------------------------------------------------------------------

/// How the PostgreSQL classifier (`postgres::sql`) sees one statement: for
/// the real-server cross-check in `tests/proxy_pg_sql.rs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgStatement {
    /// The statement's text (without its `;`).
    pub text: String,
    /// Its first keyword as the rejection log would show it.
    pub keyword: &'static str,
    /// The decoded value when it declares `fencer.token`.
    pub sets_token: Option<String>,
    /// It clears `fencer.token` (`RESET`, `DEFAULT`, `RESET ALL`, `DISCARD ALL`).
    pub clears_token: bool,
    /// It is forwarded without a fence (a declaration, a reset, `BEGIN`).
    pub unfenced: bool,
    /// The classification, as `Debug` text.
    pub kind: String,
    /// An unterminated construct runs to the end.
    pub incomplete: bool,
}

/// The statements of a simple-Query string, as the sidecar classifies them.
pub fn pg_statements(sql: &str, standard_conforming_strings: bool) -> Vec<PgStatement> {
    use crate::postgres::sql::{StatementKind, split_statements};
    split_statements(sql, standard_conforming_strings)
        .into_iter()
        .map(|s| PgStatement {
            text: sql[s.range.clone()].to_owned(),
            keyword: s.keyword,
            sets_token: match &s.kind {
                StatementKind::SetToken(v) => Some(v.clone()),
                _ => None,
            },
            clears_token: matches!(
                s.kind,
                StatementKind::ResetToken | StatementKind::ResetAll | StatementKind::DiscardAll
            ),
            unfenced: is_unfenced(&s.kind),
            kind: format!("{:?}", s.kind),
            incomplete: s.incomplete,
        })
        .collect()
}

/// The `-c`/`--` settings of a startup `options` value, or the error text.
pub fn pg_option_settings(options: &str) -> Result<Vec<(String, String)>, String> {
    crate::postgres::options::settings(options).map_err(|e| e.to_string())
}

fn is_unfenced(kind: &crate::postgres::sql::StatementKind) -> bool {
    use crate::postgres::sql::StatementKind::*;
    matches!(kind, SetToken(_) | ResetToken | SetResource(_) | ResetResource | ResetAll | DiscardAll | Begin)
}

/// The PostgreSQL statement splitter and classifier, with
/// `standard_conforming_strings` on and off: statements are ordered and
/// disjoint, only the last can be incomplete (and then it is `Other`), a
/// statement's own text classifies the same, every keyword is one of the
/// fixed placeholders or statement keywords, each recognised shape has the
/// keyword it must have, and a declared value written back as a plain
/// string constant declares the same value.
pub fn pg_sql(data: &[u8]) {
    use crate::postgres::sql::{self, StatementKind::*};
    let text = String::from_utf8_lossy(data);
    for scs in [true, false] {
        let statements = sql::split_statements(&text, scs);
        let mut end = 0;
        for (i, s) in statements.iter().enumerate() {
            assert!(end <= s.range.start && s.range.start < s.range.end && s.range.end <= text.len(), "{s:?}");
            end = s.range.end;
            let k = s.keyword;
            assert!(
                k.len() <= 32 && (k.bytes().all(|b| b.is_ascii_uppercase()) || k == "(" || k == "?"),
                "keyword {k:?}"
            );
            if s.incomplete {
                assert_eq!(i + 1, statements.len(), "only the last statement can be incomplete");
                assert_eq!((s.range.end, &s.kind), (text.len(), &Other));
                continue;
            }
            let again = sql::classify_one(&text[s.range.clone()], scs);
            assert_eq!((again.keyword, &again.kind), (k, &s.kind), "a statement's own text classifies the same");
            let expected_keywords: &[&str] = match &s.kind {
                SetToken(_) | SetResource(_) => &["SET"],
                ResetToken | ResetResource | UnsupportedFencerSetting(_) => &["SET", "RESET"],
                ResetAll => &["RESET"],
                DiscardAll => &["DISCARD"],
                Begin => &["BEGIN", "START"],
                TwoPhase(_) => &["PREPARE", "COMMIT", "ROLLBACK"],
                CopyFromStdin => &["COPY"],
                Other => &[k],
            };
            assert!(expected_keywords.contains(&k), "{:?} with keyword {k}", s.kind);
            if let SetToken(value) | SetResource(value) = &s.kind {
                let written = format!("SET fencer.token = '{}'", value.replace('\'', "''"));
                assert_eq!(sql::classify_one(&written, true).kind, SetToken(value.clone()), "{written:?}");
            }
        }
        let one = sql::classify_one(&text, scs);
        match statements.as_slice() {
            [only] => assert_eq!(&one, only),
            _ => assert_eq!(one.kind, Other),
        }
    }
}

/// The startup `options` reader: never more than its bound, names as the
/// server compares them, and what it returns, written back as `-c name=value`
/// with backslash escapes, reads back the same.
pub fn pg_options(data: &[u8]) {
    use crate::postgres::options::{MAX_OPTIONS_BYTES, OptionsError, settings};
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match settings(text) {
        Ok(found) => {
            assert!(text.len() <= MAX_OPTIONS_BYTES);
            let escape = |s: &str| {
                s.chars()
                    .flat_map(|c| {
                        let special = c == '\\' || matches!(c, ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r');
                        special.then_some('\\').into_iter().chain([c])
                    })
                    .collect::<String>()
            };
            for (name, _) in &found {
                assert!(!name.contains('-') && !name.contains('='), "{name:?}");
                assert!(!name.bytes().any(|b| b.is_ascii_uppercase()), "{name:?}");
            }
            let written: Vec<String> = found.iter().map(|(n, v)| format!("-c {}={}", escape(n), escape(v))).collect();
            let written = written.join(" ");
            if written.len() <= MAX_OPTIONS_BYTES {
                assert_eq!(settings(&written).as_ref(), Ok(&found), "{written:?}");
            }
        }
        Err(OptionsError::TooLong { len }) => assert!(len == text.len() && len > MAX_OPTIONS_BYTES),
        Err(e) => {
            let message = e.to_string();
            assert!(!message.is_empty() && message.len() < 256, "{message:?}");
        }
    }
}

/// The PostgreSQL framing (`postgres::protocol`), read as the sidecar reads
/// a connection: a startup packet, then a stream of messages (a 1-byte tag
/// and a 4-byte length that counts itself). Nothing panics; a startup
/// packet is accepted only within PostgreSQL's bounds, and a parsed
/// StartupMessage re-encoded parses the same; a header either is refused
/// with a reason or covers at least its own length; every body a parser
/// accepts is rebuilt byte for byte by the sidecar's own writers (Query,
/// Parse, AuthenticationSASL, ErrorResponse); the fields the rules read are
/// NUL-free slices of the body; the ASCII prefix is ASCII.
pub fn pg_frames(data: &[u8]) {
    use crate::postgres::protocol::*;
    use bytes::Bytes;
    if let Some(head) = data.first_chunk::<4>() {
        match startup_length(*head) {
            Ok(len) => {
                assert!((8..=MAX_STARTUP_PACKET).contains(&len));
                if let Some(packet) = data.get(..len) {
                    match parse_startup(Bytes::copy_from_slice(packet)) {
                        Ok(Startup::Message { version, params, raw }) => {
                            assert_eq!(raw.as_ref(), packet);
                            for (k, v) in &params {
                                assert!(!k.is_empty() && !k.contains('\0') && !v.contains('\0'));
                            }
                            let pairs: Vec<(&str, &str)> =
                                params.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                            let again = startup_message(version, &pairs);
                            assert_eq!(again.as_ref(), packet, "a StartupMessage re-encodes to its own bytes");
                        }
                        Ok(Startup::Cancel { raw, key, .. }) => {
                            assert_eq!(raw.as_ref(), packet);
                            assert!((4..=MAX_CANCEL_KEY).contains(&key.len()));
                        }
                        Ok(Startup::Ssl | Startup::GssEnc) => assert_eq!(len, 8),
                        Err(e) => assert!(!e.to_string().is_empty()),
                    }
                }
            }
            Err(e) => assert!(matches!(e, ProtocolError::StartupLength(_)), "{e:?}"),
        }
    }
    let mut rest = data;
    loop {
        let header = match Header::parse(rest) {
            Ok(Some(h)) => h,
            Ok(None) => {
                assert!(rest.len() < 5);
                break;
            }
            Err(e) => {
                assert!(matches!(e, ProtocolError::Length { .. }) && !e.to_string().is_empty());
                break;
            }
        };
        assert_eq!(header.total(), header.body_len + 5);
        let Some(frame) = rest.get(..header.total()) else { break };
        let body = &frame[5..];
        assert_eq!(message(header.tag, body).as_ref(), frame, "a message re-encodes to its own bytes");
        match frontend_kind(header.tag, 1024) {
            Ok(FrontendKind::Whole { limit }) => assert!(limit >= 1024),
            Ok(_) => {}
            Err(e) => assert!(matches!(e, ProtocolError::UnknownFrontendTag(_))),
        }
        let nul_free = |b: &[u8]| !b.contains(&0);
        match header.tag {
            b'Q' => {
                if let Ok(q) = query_message(body) {
                    assert!(nul_free(q));
                    assert!(ascii_prefix(q) <= q.len() && q[..ascii_prefix(q)].is_ascii());
                    if let Ok(text) = std::str::from_utf8(q) {
                        assert_eq!(query(text).as_ref(), frame, "Query rebuilds");
                    }
                }
            }
            b'P' => {
                if let Ok((name, q)) = parse_message(body) {
                    assert!(nul_free(name) && nul_free(q));
                    if let (Ok(n), Ok(t)) = (std::str::from_utf8(name), std::str::from_utf8(q))
                        && body.len() == name.len() + q.len() + 4
                        && body.ends_with(&[0, 0])
                    {
                        assert_eq!(parse(n, t).as_ref(), frame, "Parse rebuilds");
                    }
                }
            }
            b'B' => {
                if let Some((portal, statement)) = bind_names(&body[..body.len().min(BIND_PREFIX_LIMIT)]) {
                    assert!(nul_free(portal) && nul_free(statement));
                }
            }
            b'C' | b'D' => {
                if let Ok((kind, name)) = target(header.tag, body) {
                    assert!(matches!(kind, b'S' | b'P') && nul_free(name));
                    assert_eq!(body.len(), name.len() + 2);
                }
            }
            b'K' => {
                if let Ok((pid, key)) = backend_key(body) {
                    assert_eq!(pid.to_be_bytes(), body[..4]);
                    assert_eq!(key.as_ref(), &body[4..]);
                }
            }
            b'R' => {
                if let Ok(mechanisms) = sasl_mechanisms(body) {
                    assert!(mechanisms.iter().all(|m| !m.is_empty() && nul_free(m)));
                    let offer = sasl_offer(&mechanisms);
                    assert_eq!(sasl_mechanisms(&offer[5..]).ok(), Some(mechanisms.clone()), "an offer round-trips");
                }
            }
            b'S' => {
                if let Some((name, value)) = parameter_status(body) {
                    assert!(nul_free(name) && nul_free(value));
                }
            }
            _ => {}
        }
        // ErrorResponse ('E', also the frontend's Execute) and NoticeResponse.
        if matches!(header.tag, b'E' | b'N') {
            let (code, text) = error_fields(body);
            assert!(code.is_none_or(nul_free) && text.is_none_or(nul_free));
            if let (Some(code), Some(text)) = (code, text)
                && let (Ok(code), Ok(text)) = (std::str::from_utf8(code), std::str::from_utf8(text))
            {
                let ours = error_response(Severity::Error, code, text, None, None);
                assert_eq!(error_fields(&ours[5..]), (Some(code.as_bytes()), Some(text.as_bytes())));
            }
        }
        if header.tag == b'E'
            && let Ok(portal) = execute_portal(body)
        {
            assert_eq!(body.len(), portal.len() + 5);
        }
        rest = &rest[header.total()..];
    }
}

/// The PostgreSQL checks by target name (the cargo-fuzz binaries).
pub fn pg_check_by_name(target: &str) -> Option<fn(&[u8])> {
    Some(match target {
        "pg_sql" => pg_sql,
        "pg_options" => pg_options,
        "pg_frames" => pg_frames,
        _ => return None,
    })
}

/// Seed inputs for the PostgreSQL targets. Written to
/// `fuzz/seeds/<target>/seed-NN` (numbered after [`seeds`]) by
/// `cargo test -p fencer-proxy --features fuzzing write_pg_fuzz_seeds -- --ignored`.
pub fn pg_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let text = |s: &str| s.as_bytes().to_vec();
    vec![
        ("pg_sql", text("SET fencer.token = 42; INSERT INTO t VALUES (1); COMMIT")),
        ("pg_sql", text("SET SESSION \"fencer\".token TO 'v1.abc'; BEGIN ISOLATION LEVEL SERIALIZABLE, READ WRITE")),
        ("pg_sql", text("SET U&\"fencer!002etoken\" UESCAPE '!' = E'\\x34\\062'\n'7'; RESET fencer.token; RESET ALL")),
        ("pg_sql", text("SELECT '\\'; SET fencer.token = 1; --'; SELECT $a$;$b$;$a$, x$a$, $1; DISCARD ALL")),
        (
            "pg_sql",
            text(
                "CREATE FUNCTION f() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1 AS end; SELECT CASE WHEN true THEN 1 END; END; SET fencer.token = 2",
            ),
        ),
        (
            "pg_sql",
            text("/* /* ; */ */ SELECT 1e--5, U&'\\0041' UESCAPE '!'; COPY t (a) FROM STDIN; PREPARE TRANSACTION 'g'"),
        ),
        (
            "pg_sql",
            text("SET LOCAL fencer.token = 1; SET fencer.token = 1, 2; SET fencer.token = $1; SET fencer.token = 'x"),
        ),
        ("pg_options", text("-c fencer.token=42")),
        ("pg_options", text("-cfencer.token=1 --fencer.resource=pg/app -c search_path=a\\ b\\\\c")),
        ("pg_options", text("-ec fencer.token=8 -D -cx=1 -- ")),
        ("pg_options", text("-c fencer.token")),
        ("pg_frames", pg_frame_stream(true)),
        ("pg_frames", pg_frame_stream(false)),
    ]
}

/// A startup packet followed by the messages of one extended-protocol
/// round trip from both directions (with `startup`), or the messages alone.
fn pg_frame_stream(startup: bool) -> Vec<u8> {
    use crate::postgres::protocol::{Severity, error_response, message, parse, query, sasl_offer, startup_message};
    let mut out = Vec::new();
    if startup {
        let params = [("user", "app"), ("database", "shop"), ("options", "-c fencer.token=7")];
        out.extend_from_slice(&startup_message(196_608, &params));
    }
    out.extend_from_slice(&query("SET fencer.token = 42; INSERT INTO t VALUES (1)"));
    out.extend_from_slice(&parse("s1", "UPDATE t SET a = $1"));
    out.extend_from_slice(&message(b'B', b"p1\0s1\0\0\0\0\x01\0\0\0\x011\0\0"));
    out.extend_from_slice(&message(b'E', b"p1\0\0\0\0\0"));
    out.extend_from_slice(&message(b'D', b"Pp1\0"));
    out.extend_from_slice(&message(b'S', b""));
    out.extend_from_slice(&message(b'K', &[0, 0, 0x30, 0x39, 1, 2, 3, 4]));
    out.extend_from_slice(&sasl_offer(&[b"SCRAM-SHA-256-PLUS", b"SCRAM-SHA-256"]));
    out.extend_from_slice(&message(b'S', b"standard_conforming_strings\0on\0"));
    out.extend_from_slice(&error_response(Severity::Error, "FN001", "stale token", Some("d"), None));
    out.extend_from_slice(&message(b'Z', b"I"));
    out
}

#[cfg(test)]
mod pg_tests {
    //! Bounded proptest runs of the PostgreSQL fuzz checks.

    use proptest::prelude::*;

    use super::*;

    fn config() -> ProptestConfig {
        let cases = std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(256);
        ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() }
    }

    /// Pieces of SQL that exercise the lexer and the classifier.
    fn sql_like() -> impl Strategy<Value = Vec<u8>> {
        let piece = proptest::sample::select(vec![
            "SET",
            "RESET",
            "SESSION",
            "LOCAL",
            "fencer",
            ".",
            "token",
            "resource",
            "\"fencer.token\"",
            "U&\"fencer\"",
            "UESCAPE",
            "'!'",
            "=",
            "TO",
            "DEFAULT",
            "ALL",
            "DISCARD",
            "BEGIN",
            "ATOMIC",
            "END",
            "START",
            "TRANSACTION",
            "CREATE",
            "FUNCTION",
            "PREPARE",
            "COMMIT",
            "PREPARED",
            "COPY",
            "FROM",
            "STDIN",
            "42",
            "007",
            "'4''2'",
            "E'\\x34'",
            "$$4$$",
            "$a$",
            "$1",
            "U&'\\0034'",
            ";",
            ";",
            " ",
            "\n",
            "/*",
            "*/",
            "--",
            "'",
            "\"",
            "\\",
            "(",
            ")",
            ",",
            "-",
            "e",
            "x",
            "é",
        ]);
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..200),
            proptest::collection::vec((piece, proptest::sample::select(vec!["", " ", "\n"])), 0..30)
                .prop_map(|p| { p.into_iter().flat_map(|(a, b)| [a, b]).collect::<String>().into_bytes() }),
        ]
    }

    /// Well-framed messages of the types the sidecar reads, with bodies
    /// made of NUL-rich bytes, so the body parsers meet every shape.
    fn pg_frames_like() -> impl Strategy<Value = Vec<u8>> {
        let tag = proptest::sample::select(b"QPBECDSHKRNZFdpX".to_vec());
        let byte = proptest::sample::select(vec![0u8, 0, 0, b'a', b'S', b'P', b'I', 0x80, 1, 10, 0xff]);
        let body = proptest::collection::vec(byte, 0..24);
        proptest::collection::vec((tag, body), 1..8).prop_map(|frames| {
            frames.into_iter().flat_map(|(t, b)| crate::postgres::protocol::message(t, &b).to_vec()).collect()
        })
    }

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn pg_sql_checks(data in sql_like()) {
            pg_sql(&data);
        }

        #[test]
        fn pg_frames_checks(data in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..300),
            pg_frames_like(),
            (any::<bool>(), proptest::collection::vec((0..400usize, any::<u8>()), 0..6)).prop_map(|(startup, edits)| {
                let mut d = pg_frame_stream(startup);
                for (at, b) in edits {
                    let at = at % d.len();
                    d[at] = b;
                }
                d
            }),
        ]) {
            pg_frames(&data);
        }

        #[test]
        fn pg_options_checks(data in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..120),
            "(-[-a-zA-Z]{0,3}[ \t\\\\]?[a-z.=\\\\ é-]{0,12} ?){0,6}".prop_map(String::into_bytes),
        ]) {
            pg_options(&data);
        }
    }

    #[test]
    fn the_pg_seeds_pass_their_checks() {
        for (target, data) in pg_seeds() {
            pg_check_by_name(target).expect("a known target")(&data);
        }
        assert!(pg_check_by_name("token_header").is_none());
    }

    #[test]
    fn pg_statements_show_what_the_sidecar_does() {
        let s = pg_statements("SET fencer.token = 4; RESET ALL; SELECT 1", true);
        assert_eq!(s.len(), 3);
        assert_eq!((s[0].sets_token.as_deref(), s[0].unfenced, s[0].clears_token), (Some("4"), true, false));
        assert_eq!((s[1].sets_token.as_deref(), s[1].unfenced, s[1].clears_token), (None, true, true));
        assert_eq!((s[2].keyword, s[2].unfenced, s[2].text.as_str()), ("SELECT", false, "SELECT 1"));
        assert_eq!(pg_option_settings("-c fencer.token=5"), Ok(vec![("fencer.token".into(), "5".into())]));
        assert!(pg_option_settings("-c x").is_err());
    }

    /// Writes `fuzz/seeds/<target>/seed-NN` (run by hand after changing seeds).
    #[test]
    #[ignore = "writes the seed corpus into the source tree"]
    fn write_pg_fuzz_seeds() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds");
        for (n, (target, data)) in pg_seeds().into_iter().enumerate() {
            let dir = root.join(target);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(format!("seed-{:02}", seeds().len() + n)), data).unwrap();
        }
    }
}
