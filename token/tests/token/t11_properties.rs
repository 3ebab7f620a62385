//! Property tests of the token format (a bounded run on every `cargo test`;
//! the coverage-guided fuzzers in `fuzz/` run the same parser for longer).

use fencer_token::{KeyId, KeyRing, KeySet, MAX_TOKEN_BYTES, PresentedToken, ResourceName, Signer};
use proptest::prelude::*;

const NOW: u64 = 1_770_000_000_000;

fn signer() -> Signer {
    Signer::from_secret_bytes(KeyId::new("k1").unwrap(), &[3; 32])
}

fn ring() -> KeyRing {
    KeyRing::new(&KeySet { keys: vec![signer().public_entry(0, None)] }).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    /// What is signed is what verifies, for every valid claim.
    #[test]
    fn sign_parse_verify_round_trips(
        resource in "[A-Za-z0-9._:/-]{1,256}"
            .prop_filter("a valid resource name (DESIGN §2)", |r| ResourceName::new(r.as_str()).is_ok()),
        token in any::<u64>(),
        lease_id in any::<u128>(),
        iat in 0..NOW,
    ) {
        let signed = signer().sign(&resource, token, lease_id, iat).unwrap();
        prop_assert!(signed.as_str().len() <= MAX_TOKEN_BYTES);
        let PresentedToken::Signed(parsed) = PresentedToken::parse(signed.as_str().as_bytes()).unwrap() else {
            panic!("not signed");
        };
        prop_assert_eq!(&parsed, &signed);
        let claims = ring().verify(&parsed, &resource, NOW).unwrap();
        prop_assert_eq!((claims.token(), claims.lease_id(), claims.issued_at_unix_ms()), (token, lease_id, iat));
    }

    /// Flipping any bit of a genuine token makes it fail to parse or verify.
    #[test]
    fn any_bit_flip_is_refused(at in any::<prop::sample::Index>(), bit in 0u8..8) {
        let signed = signer().sign("db/orders", 42, 7, NOW).unwrap();
        let mut bytes = signed.as_str().as_bytes().to_vec();
        let i = at.index(bytes.len());
        bytes[i] ^= 1 << bit;
        let verified = match PresentedToken::parse(&bytes) {
            Ok(PresentedToken::Signed(t)) => ring().verify(&t, "db/orders", NOW).is_ok(),
            _ => false,
        };
        prop_assert!(!verified, "flipped bit {bit} of byte {i} and it still verified");
    }

    /// Plain tokens: every u64, in decimal, and nothing but decimal.
    #[test]
    fn plain_tokens_round_trip(n in any::<u64>()) {
        prop_assert_eq!(PresentedToken::parse(n.to_string().as_bytes()).unwrap(), PresentedToken::Plain(n));
    }

    /// The parser never panics and never accepts an over-long value.
    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..1200)) {
        if let Ok(t) = PresentedToken::parse(&data) {
            prop_assert!(data.len() <= MAX_TOKEN_BYTES);
            let _ = t.claimed_token();
        }
    }
}
