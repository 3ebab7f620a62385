//! KeyRing verification (DESIGN P7): each check in its order — known key
//! id, key window at `iat` and now (with the skew allowance), signature,
//! resource — refuses what it must and nothing else.

use std::time::Duration;

use fencer_token::{KeyId, KeyRing, KeySet, PresentedToken, SignedToken, Signer, VerifyError};

const NOW: u64 = 1_770_000_000_000;
const HOUR: u64 = 3_600_000;
const LID: u128 = 0x6cf4_a1b2_c3d4_e5f6_0718_293a_4b5c_6d7e;

fn signer(kid: &str, seed: u8) -> Signer {
    Signer::from_secret_bytes(KeyId::new(kid).unwrap(), &[seed; 32])
}

fn ring(entries: Vec<fencer_token::PublicKeyEntry>) -> KeyRing {
    KeyRing::new(&KeySet { keys: entries }).unwrap()
}

fn parse(token: &SignedToken) -> SignedToken {
    match PresentedToken::parse(token.as_str().as_bytes()).unwrap() {
        PresentedToken::Signed(t) => t,
        PresentedToken::Plain(_) => panic!("signed tokens parse as signed"),
    }
}

#[test]
fn a_genuine_token_verifies_and_says_what_was_signed() {
    let s = signer("k1", 1);
    let token = parse(&s.sign("db/orders", 42, LID, NOW - 5).unwrap());
    let claims = ring(vec![s.public_entry(NOW - HOUR, None)]).verify(&token, "db/orders", NOW).unwrap();
    assert_eq!(claims.token(), 42);
    assert_eq!(claims.resource(), "db/orders");
    assert_eq!(claims.lease_id(), LID);
    assert_eq!(claims.lease_id_hex(), "6cf4a1b2c3d4e5f60718293a4b5c6d7e");
    assert_eq!(claims.issued_at_unix_ms(), NOW - 5);
    assert_eq!(claims.key_id().as_str(), "k1");
    assert!(token.as_str().starts_with("v1."));
    assert!(token.as_str().len() < 300);
}

#[test]
fn the_largest_genuine_token_fits_the_bounds() {
    let s = signer(&"k".repeat(64), 1);
    let token = s.sign(&"r".repeat(256), u64::MAX, u128::MAX, u64::MAX).unwrap();
    assert!(token.as_str().len() <= fencer_token::MAX_TOKEN_BYTES, "{}", token.as_str().len());
    let parsed = parse(&token);
    assert!(ring(vec![s.public_entry(0, None)]).verify(&parsed, &"r".repeat(256), NOW).is_ok());
}

#[test]
fn unknown_key_ids_are_refused() {
    let token = parse(&signer("k2", 2).sign("db/orders", 42, LID, NOW).unwrap());
    let err = ring(vec![signer("k1", 1).public_entry(0, None)]).verify(&token, "db/orders", NOW).unwrap_err();
    assert_eq!(err, VerifyError::UnknownKey { kid: KeyId::new("k2").unwrap() });
    assert_eq!(err.reason(), "unknown_key");
}

#[test]
fn a_key_of_the_same_id_but_another_secret_is_a_bad_signature() {
    // A forger who knows the key id signs with their own key.
    let forged = parse(&signer("k1", 9).sign("db/orders", u64::MAX, LID, NOW).unwrap());
    let err = ring(vec![signer("k1", 1).public_entry(0, None)]).verify(&forged, "db/orders", NOW).unwrap_err();
    assert_eq!(err.reason(), "bad_signature");
}

#[test]
fn expired_keys_are_refused_at_issue_and_now_with_skew() {
    let s = signer("k1", 1);
    let skew = Duration::from_secs(30);
    let end = NOW - HOUR;
    let r = ring(vec![s.public_entry(NOW - 10 * HOUR, Some(end))]).with_clock_skew(skew);
    // Issued while valid, presented after the end (+ skew): refused.
    let old = parse(&s.sign("db/orders", 1, LID, end - HOUR).unwrap());
    let err = r.verify(&old, "db/orders", NOW).unwrap_err();
    assert_eq!(
        err,
        VerifyError::ExpiredKey { kid: KeyId::new("k1").unwrap(), not_after_unix_ms: end, at_unix_ms: NOW }
    );
    // Within the skew allowance of the end: still accepted.
    assert!(r.verify(&old, "db/orders", end + 29_999).is_ok());
    assert!(r.verify(&old, "db/orders", end + 30_000).is_err());
    // Issued after the end: refused even if "now" were earlier.
    let late = parse(&s.sign("db/orders", 1, LID, end + 30_000).unwrap());
    assert!(
        matches!(r.verify(&late, "db/orders", end), Err(VerifyError::ExpiredKey { at_unix_ms, .. }) if at_unix_ms == end + 30_000)
    );
}

#[test]
fn tokens_issued_before_their_key_are_refused() {
    let s = signer("k1", 1);
    let r = ring(vec![s.public_entry(NOW, None)]).with_clock_skew(Duration::from_secs(1));
    assert!(r.verify(&parse(&s.sign("a", 1, LID, NOW - 1000).unwrap()), "a", NOW).is_ok(), "within skew");
    let err = r.verify(&parse(&s.sign("a", 1, LID, NOW - 1001).unwrap()), "a", NOW).unwrap_err();
    assert_eq!(err.reason(), "key_not_yet_valid");
}

#[test]
fn a_token_for_one_resource_is_refused_on_another() {
    let s = signer("k1", 1);
    let token = parse(&s.sign("db/x", 7, LID, NOW).unwrap());
    let err = ring(vec![s.public_entry(0, None)]).verify(&token, "db/y", NOW).unwrap_err();
    assert_eq!(err, VerifyError::WrongResource { token_resource: "db/x".into(), expected: "db/y".into() });
}

#[test]
fn rotation_keeps_old_tokens_valid_until_the_old_key_ends() {
    let (old, new) = (signer("2026-01", 1), signer("2026-02", 2));
    let r = ring(vec![old.public_entry(0, Some(NOW + HOUR)), new.public_entry(NOW - HOUR, None)]);
    assert_eq!(r.key_ids().iter().map(|k| k.as_str()).collect::<Vec<_>>(), ["2026-01", "2026-02"]);
    for s in [&old, &new] {
        assert!(r.verify(&parse(&s.sign("a", 1, LID, NOW).unwrap()), "a", NOW).is_ok());
    }
    let stale = parse(&old.sign("a", 1, LID, NOW).unwrap());
    assert_eq!(r.verify(&stale, "a", NOW + 2 * HOUR).unwrap_err().reason(), "expired_key");
}
