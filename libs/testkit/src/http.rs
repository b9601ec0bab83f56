//! A minimal HTTP/1.0 client for the plain-HTTP endpoints (`/metrics`, `/healthz`,
//! `/readyz`, the inspect API) that suites poll without pulling in an HTTP stack.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long connecting and reading the answer may take; bounds against a hung server,
/// not measurements.
const CONNECT_WITHIN: Duration = Duration::from_secs(2);
const READ_WITHIN: Duration = Duration::from_secs(5);

/// `GET path` with `headers` over HTTP/1.0: the status code and the body, or `None`
/// when the server cannot be reached, does not answer in time or answers garbage.
pub async fn http_request(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> Option<(u16, String)> {
    let mut s = tokio::time::timeout(CONNECT_WITHIN, TcpStream::connect(addr))
        .await
        .ok()?
        .ok()?;
    let mut req = format!("GET {path} HTTP/1.0\r\nHost: x\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await.ok()?;
    let mut buf = Vec::new();
    tokio::time::timeout(READ_WITHIN, s.read_to_end(&mut buf))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
    Some((code, body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    #[tokio::test]
    async fn reads_status_and_body_and_sends_the_headers() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut req = Vec::new();
            while !req.ends_with(b"\r\n\r\n") {
                let mut b = [0u8; 1];
                s.read_exact(&mut b).await.unwrap();
                req.push(b[0]);
            }
            s.write_all(b"HTTP/1.0 503 Service Unavailable\r\nX: y\r\n\r\nnot ready")
                .await
                .unwrap();
            String::from_utf8(req).unwrap()
        });
        let answer = http_request(addr, "/readyz", &[("Authorization", "Bearer t")]).await;
        assert_eq!(answer, Some((503, "not ready".to_owned())));
        let req = server.await.unwrap();
        assert!(req.starts_with("GET /readyz HTTP/1.0\r\n"), "{req}");
        assert!(req.contains("\r\nAuthorization: Bearer t\r\n"), "{req}");
    }

    #[tokio::test]
    async fn an_unreachable_server_is_none() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        assert_eq!(http_request(addr, "/", &[]).await, None);
    }
}
