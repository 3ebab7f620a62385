//! The newtypes that cross the proxy's edges: [`ResourceName`] (DESIGN §2
//! rules) and [`FencingToken`] (a `u64` carried in a header). They are the
//! nouns of every fencer crate, defined once in `fencer_token`; the proxy
//! uses them as they are.

pub use fencer_token::{FencingToken, ResourceName, ResourceNameError, TokenParseError};

/// Longest resource name, in bytes (DESIGN §2).
pub const MAX_RESOURCE_NAME_BYTES: usize = fencer_token::MAX_RESOURCE_BYTES;

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn resource_names_follow_design_rules() {
        for ok in ["db/metrics", "a", "x.y:z_w-1/2", &"a".repeat(256)] {
            assert!(ResourceName::new(ok).is_ok(), "{ok}");
        }
        assert_eq!(ResourceName::new(""), Err(ResourceNameError::Empty));
        assert_eq!(ResourceName::new("a".repeat(257)), Err(ResourceNameError::TooLong { len: 257 }));
        assert_eq!(ResourceName::new("a b"), Err(ResourceNameError::BadChar { ch: ' ', at: 1 }));
        assert_eq!(ResourceName::new("/a"), Err(ResourceNameError::EdgeSlash));
        assert_eq!(ResourceName::new("a/"), Err(ResourceNameError::EdgeSlash));
        assert_eq!(ResourceName::new("a//b"), Err(ResourceNameError::DoubleSlash));
        assert_eq!(ResourceName::new("a/../b"), Err(ResourceNameError::DotDot));
        assert!(matches!(ResourceName::new("é"), Err(ResourceNameError::BadChar { .. })));
        assert_eq!(MAX_RESOURCE_NAME_BYTES, 256);
    }

    #[test]
    fn tokens_are_strict_decimal_u64() {
        assert_eq!(FencingToken::parse(b"42"), Ok(FencingToken::new(42)));
        assert_eq!(FencingToken::parse(b"18446744073709551615"), Ok(FencingToken::new(u64::MAX)));
        assert_eq!(FencingToken::parse(b"18446744073709551616"), Err(TokenParseError::TooLarge));
        assert_eq!(FencingToken::parse(b""), Err(TokenParseError::Empty));
        for bad in [&b" 42"[..], b"+42", b"-1", b"4 2", b"0x2a", b"42\n"] {
            assert_eq!(FencingToken::parse(bad), Err(TokenParseError::NotDecimal), "{bad:?}");
        }
    }

    proptest! {
        /// The proxy checks a name (a route's resource, a config or admin
        /// request, an epoch-store key) by the one rule of
        /// `fencer_token::ResourceName`, also when it reads one from JSON
        /// or TOML, and a signed token's resource by the same rule.
        #[test]
        fn the_proxy_checks_names_by_the_shared_rule(
            name in "[a/.:_ é-]{0,8}|[A-Za-z0-9./~-]{0,12}|[a-z/]{250,260}|.{0,6}",
        ) {
            let shared = fencer_token::ResourceName::new(name.as_str());
            prop_assert_eq!(ResourceName::new(name.as_str()), shared.clone());
            let json = serde_json::to_string(&name).unwrap();
            prop_assert_eq!(serde_json::from_str::<ResourceName>(&json).is_ok(), shared.is_ok());
            #[derive(serde::Deserialize)]
            struct Route {
                resource: ResourceName,
            }
            let toml = format!("resource = {json}");
            prop_assert_eq!(toml::from_str::<Route>(&toml).ok().map(|r| r.resource), shared.clone().ok(), "{}", toml);
            let claims = fencer_token::Claims::new(fencer_token::KeyId::new("k").unwrap(), name.as_str(), 1, 1, 1);
            prop_assert_eq!(claims.is_ok(), shared.is_ok());
        }
    }
}
