//! Who may use the dashboard and JSON API, and how much of the fleet they may ask for
//! (ADR-0102, `docs/security.md`).
//!
//! Every page fans out to every shard (behind the short answer cache), so the HTTP port is
//! bounded however it is exposed: a global request rate (429 past it) and a cap on requests
//! in flight (503 past it). Off loopback it also needs a bearer token (`--http-token-file`),
//! given as `Authorization: Bearer <token>` or as the `bigfleet_token` cookie (so a browser
//! behind an authenticating proxy works); a wrong or missing token is 401.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bigfleet_mesh::{RateLimit, TokenBuckets};
use tokio::sync::Semaphore;

/// The cookie a browser may carry the token in.
pub const TOKEN_COOKIE: &str = "bigfleet_token";

/// Default HTTP budget: a dashboard refreshes every few seconds; scripts get headroom.
pub const DEFAULT_HTTP_RATE: RateLimit = RateLimit {
    per_second: 20.0,
    burst: 40,
};
/// Default cap on HTTP requests in flight.
pub const DEFAULT_HTTP_CONCURRENCY: usize = 16;

/// The HTTP port's gate: token (optional) and limits.
#[derive(Debug, Clone)]
pub struct HttpGuard {
    token: Option<Arc<str>>,
    rate: TokenBuckets,
    in_flight: Arc<Semaphore>,
}

impl HttpGuard {
    pub fn new(token: Option<String>, rate: RateLimit, concurrency: usize) -> Self {
        Self {
            token: token.map(Arc::from),
            rate: TokenBuckets::new(rate),
            in_flight: Arc::new(Semaphore::new(concurrency.max(1))),
        }
    }

    fn authorized(&self, headers: &HeaderMap) -> bool {
        let Some(want) = &self.token else {
            return true;
        };
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let cookie = headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|kv| kv.trim().split_once('='))
            .find(|(k, _)| *k == TOKEN_COOKIE)
            .map(|(_, v)| v);
        bearer
            .into_iter()
            .chain(cookie)
            .any(|given| constant_time_eq(given.as_bytes(), want.as_bytes()))
    }
}

/// Equal-length comparison that does not stop at the first difference, so response timing
/// says nothing about how much of a guess was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn refuse(status: StatusCode, message: &str) -> Response {
    let mut r = (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        format!("{{\"error\":{}}}", serde_json::Value::from(message)),
    )
        .into_response();
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer realm=\"bigfleet\""),
        );
    }
    r
}

/// axum middleware: token, then rate, then concurrency.
pub async fn guard(State(g): State<HttpGuard>, req: Request, next: Next) -> Response {
    if !g.authorized(req.headers()) {
        return refuse(StatusCode::UNAUTHORIZED, "missing or wrong bearer token");
    }
    if !g.rate.try_acquire("http") {
        return refuse(
            StatusCode::TOO_MANY_REQUESTS,
            "request rate limit reached; retry shortly",
        );
    }
    let Ok(_permit) = g.in_flight.clone().try_acquire_owned() else {
        return refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many requests in flight; retry shortly",
        );
    };
    next.run(req).await
}

/// Reads a token file: one line, surrounding whitespace ignored, never empty.
pub fn read_token_file(path: &std::path::Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let token = text.trim();
    if token.len() < 16 {
        return Err(format!(
            "{}: the token must be at least 16 characters",
            path.display()
        ));
    }
    Ok(token.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(k.clone(), v.parse().unwrap());
        }
        h
    }

    #[test]
    fn without_a_token_everyone_passes_the_token_check() {
        let g = HttpGuard::new(None, DEFAULT_HTTP_RATE, 4);
        assert!(g.authorized(&HeaderMap::new()));
    }

    #[test]
    fn bearer_header_or_cookie_must_match_exactly() {
        let g = HttpGuard::new(Some("s3cret-token-0123".into()), DEFAULT_HTTP_RATE, 4);
        assert!(!g.authorized(&HeaderMap::new()));
        assert!(g.authorized(&headers(&[(
            header::AUTHORIZATION,
            "Bearer s3cret-token-0123"
        )])));
        assert!(!g.authorized(&headers(&[(
            header::AUTHORIZATION,
            "Bearer s3cret-token-012"
        )])));
        assert!(!g.authorized(&headers(&[(
            header::AUTHORIZATION,
            "Basic s3cret-token-0123"
        )])));
        assert!(g.authorized(&headers(&[(
            header::COOKIE,
            "a=b; bigfleet_token=s3cret-token-0123"
        )])));
        assert!(!g.authorized(&headers(&[(header::COOKIE, "bigfleet_token=nope")])));
    }

    #[test]
    fn token_files_are_trimmed_and_must_be_long_enough() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t");
        std::fs::write(&p, "  0123456789abcdef\n").unwrap();
        assert_eq!(read_token_file(&p).unwrap(), "0123456789abcdef");
        std::fs::write(&p, "short\n").unwrap();
        assert!(read_token_file(&p).is_err());
        assert!(read_token_file(&dir.path().join("missing")).is_err());
    }

    #[test]
    fn comparison() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
