//! The bearer token that guards the mutation endpoints.

use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
use sha2::{Digest, Sha256};

/// Why a request may not change a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The dashboard has no token: it is read-only.
    ReadOnly,
    /// No `Authorization: Bearer` header.
    Missing,
    /// A token that is not the dashboard's.
    Wrong,
}

/// The token the dashboard is configured with, kept as its SHA-256 digest so that every
/// compare takes the same time whatever the length and content of the token offered.
#[derive(Clone)]
pub(crate) struct Token {
    digest: [u8; 32],
}

impl Token {
    pub(crate) fn new(token: &str) -> Self {
        Self {
            digest: Sha256::digest(token.as_bytes()).into(),
        }
    }

    /// Whether `offered` is this token, compared in constant time.
    pub(crate) fn matches(&self, offered: &str) -> bool {
        let offered: [u8; 32] = Sha256::digest(offered.as_bytes()).into();
        constant_time_eq(&self.digest, &offered)
    }
}

/// Whether two digests are equal, reading every byte of both.
fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a
        .iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// Whether the request's headers carry the token: `Ok` when they do.
pub(crate) fn check(token: Option<&Token>, headers: &HeaderMap) -> Result<(), Refusal> {
    let Some(token) = token else {
        return Err(Refusal::ReadOnly);
    };
    let offered = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer)
        .ok_or(Refusal::Missing)?;
    if token.matches(offered) {
        Ok(())
    } else {
        Err(Refusal::Wrong)
    }
}

/// The token of an `Authorization` header's value of the `Bearer` scheme.
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let token = token.trim();
    (!token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        h
    }

    #[test]
    fn the_token_is_checked() {
        let token = Token::new("s3cret");
        assert_eq!(
            check(None, &headers("Bearer s3cret")),
            Err(Refusal::ReadOnly)
        );
        assert_eq!(
            check(Some(&token), &HeaderMap::new()),
            Err(Refusal::Missing)
        );
        assert_eq!(
            check(Some(&token), &headers("Basic s3cret")),
            Err(Refusal::Missing)
        );
        assert_eq!(
            check(Some(&token), &headers("Bearer ")),
            Err(Refusal::Missing)
        );
        assert_eq!(
            check(Some(&token), &headers("Bearer s3cre")),
            Err(Refusal::Wrong)
        );
        assert_eq!(
            check(Some(&token), &headers("Bearer s3cret!")),
            Err(Refusal::Wrong)
        );
        assert_eq!(check(Some(&token), &headers("Bearer s3cret")), Ok(()));
        assert_eq!(check(Some(&token), &headers("bearer  s3cret")), Ok(()));
    }
}
