//! Minimal HTTP probes of the services' plain ops ports (`/readyz`, `/metrics`) and a
//! Prometheus text parser — enough for readiness waits and the progress view without an
//! HTTP client dependency.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// `GET path` over HTTP/1.0; returns (status code, body).
pub async fn http_get(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> std::io::Result<(u16, String)> {
    tokio::time::timeout(timeout, http_request(addr, "GET", path, None))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "http probe timed out"))?
}

/// One HTTP/1.0 request (JSON body when given); returns (status code, body).
pub async fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(addr).await?;
    let mut req = format!("{method} {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(b) = body {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            b.len()
        ));
    }
    req.push_str("\r\n");
    if let Some(b) = body {
        req.push_str(b);
    }
    s.write_all(req.as_bytes()).await?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidData, "no http status line")
        })?;
    Ok((status, body.to_owned()))
}

/// Whether `/readyz` answers 200.
pub async fn is_ready(addr: SocketAddr) -> bool {
    matches!(
        http_get(addr, "/readyz", Duration::from_secs(2)).await,
        Ok((200, _))
    )
}

/// One sample: metric name, labels, value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parses the Prometheus text format (comments skipped, no escapes beyond `\"`).
pub fn parse_metrics(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (series, value) = match line.rfind(' ') {
            Some(i) => (&line[..i], line[i + 1..].trim()),
            None => continue,
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let (name, labels) = match series.find('{') {
            None => (series.trim().to_owned(), BTreeMap::new()),
            Some(i) => {
                let inner = series[i + 1..].trim_end().trim_end_matches('}');
                (series[..i].to_owned(), parse_labels(inner))
            }
        };
        out.push(Sample {
            name,
            labels,
            value,
        });
    }
    out
}

fn parse_labels(s: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut rest = s;
    while let Some(eq) = rest.find('=') {
        let key = rest[..eq].trim().trim_start_matches(',').trim().to_owned();
        let after = &rest[eq + 1..];
        let Some(stripped) = after.strip_prefix('"') else {
            break;
        };
        let mut value = String::new();
        let mut end = None;
        let mut chars = stripped.char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, n)) = chars.next() {
                        value.push(n);
                    }
                }
                '"' => {
                    end = Some(i);
                    break;
                }
                c => value.push(c),
            }
        }
        let Some(end) = end else { break };
        labels.insert(key, value);
        rest = &stripped[end + 1..];
    }
    labels
}

/// Sum of every sample of `name` whose labels include all of `with`.
pub fn sum(samples: &[Sample], name: &str, with: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name)
        .filter(|s| {
            with.iter()
                .all(|(k, v)| s.labels.get(*k).is_some_and(|x| x == v))
        })
        .map(|s| s.value)
        .sum()
}

/// Fetches and parses `/metrics`; empty when the endpoint does not answer.
pub async fn scrape(addr: SocketAddr) -> Vec<Sample> {
    match http_get(addr, "/metrics", Duration::from_secs(2)).await {
        Ok((200, body)) => parse_metrics(&body),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_counters_with_labels() {
        let text = "# HELP x y\n# TYPE x counter\n\
            bigfleet_shard_action_execute_outcomes_total{kind=\"bootstrap\",outcome=\"success\"} 7\n\
            bigfleet_shard_action_execute_outcomes_total{kind=\"reclaim\",outcome=\"fenced\"} 2\n\
            bigfleet_shard_shortfalls 3\n\
            weird{a=\"q\\\"uote\"} 1.5\n";
        let s = parse_metrics(text);
        assert_eq!(s.len(), 4);
        assert_eq!(
            sum(&s, "bigfleet_shard_action_execute_outcomes_total", &[]),
            9.0
        );
        assert_eq!(
            sum(
                &s,
                "bigfleet_shard_action_execute_outcomes_total",
                &[("outcome", "fenced")]
            ),
            2.0
        );
        assert_eq!(sum(&s, "bigfleet_shard_shortfalls", &[]), 3.0);
        assert_eq!(s[3].labels["a"], "q\"uote");
    }

    #[tokio::test]
    async fn http_get_reads_status_and_body() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 512];
            let _ = s.read(&mut buf).await.unwrap();
            s.write_all(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 4\r\n\r\nnope")
                .await
                .unwrap();
        });
        let (code, body) = http_get(addr, "/readyz", Duration::from_secs(2))
            .await
            .unwrap();
        assert_eq!((code, body.as_str()), (503, "nope"));
    }
}
