//! The page token: what makes a console action impossible to forge from
//! another site (CSRF).
//!
//! Each server process draws one random token when it starts and writes it
//! into the console page it serves (a `<meta>` element). The page sends it
//! back in the [`PAGE_TOKEN_HEADER`] header of every action. Another site
//! can make a browser send requests to the console, but it cannot read the
//! page (the same-origin policy), so it cannot know the token; and a custom
//! header cannot be added to a cross-site request without a CORS preflight,
//! which the console never approves. The console sets no cookie at all, so
//! nothing the browser adds on its own authorises anything. Actions still
//! need the caller's own authorisation (a bearer token or a client
//! certificate) on top.

use axum::http::HeaderMap;

/// The header a console action carries its page token in.
pub const PAGE_TOKEN_HEADER: &str = "x-fencer-page-token";

/// The per-process page token. Cheap to clone.
#[derive(Clone)]
pub struct PageToken(std::sync::Arc<str>);

impl std::fmt::Debug for PageToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PageToken(…)")
    }
}

/// Why an action was refused before it was looked at.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PageTokenRefused {
    /// The header is absent.
    #[error("console actions need the page token in the {PAGE_TOKEN_HEADER} header")]
    Missing,
    /// The header does not carry this process's token.
    #[error("the {PAGE_TOKEN_HEADER} header does not carry this server's page token; reload the page")]
    Wrong,
}

impl PageToken {
    /// A fresh token of 256 random bits from the OS.
    pub fn generate() -> std::io::Result<Self> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|e| std::io::Error::other(e.to_string()))?;
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        Ok(Self(hex.into()))
    }

    /// The token's text, as the page carries it.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `headers` carry this token, compared in constant time.
    pub fn check(&self, headers: &HeaderMap) -> Result<(), PageTokenRefused> {
        let presented = headers.get(PAGE_TOKEN_HEADER).ok_or(PageTokenRefused::Missing)?.as_bytes();
        let expected = self.0.as_bytes();
        if presented.len() != expected.len() {
            return Err(PageTokenRefused::Wrong);
        }
        let diff = presented.iter().zip(expected).fold(0u8, |acc, (a, b)| acc | (a ^ b));
        if diff == 0 { Ok(()) } else { Err(PageTokenRefused::Wrong) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_same_token_passes() {
        let token = PageToken::generate().unwrap();
        assert_eq!(token.as_str().len(), 64);
        let mut headers = HeaderMap::new();
        assert_eq!(token.check(&headers), Err(PageTokenRefused::Missing));
        headers.insert(PAGE_TOKEN_HEADER, token.as_str().parse().unwrap());
        assert_eq!(token.check(&headers), Ok(()));
        let other = PageToken::generate().unwrap();
        assert_eq!(other.check(&headers), Err(PageTokenRefused::Wrong));
        headers.insert(PAGE_TOKEN_HEADER, "short".parse().unwrap());
        assert_eq!(token.check(&headers), Err(PageTokenRefused::Wrong));
    }
}
