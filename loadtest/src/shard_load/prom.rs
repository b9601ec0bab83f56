//! Just enough Prometheus for `shard-load`: a plain HTTP/1.0 `GET /metrics`, the text
//! format parsed into samples, and quantiles of the part of a histogram recorded between two
//! scrapes (bucket counts diffed, then interpolated within the bucket as
//! `histogram_quantile` does).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One sample of a scrape.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A parsed `/metrics` page.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scrape {
    pub samples: Vec<Sample>,
}

/// `GET path` over HTTP/1.0 on a loopback ops port; `(status, body)`.
pub async fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await?;
        Ok::<_, std::io::Error>(raw)
    };
    let raw = tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "http get timed out"))??;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "no status line"))?;
    Ok((status, body.to_owned()))
}

/// Scrapes `/metrics` at `addr`.
pub async fn scrape(addr: SocketAddr) -> std::io::Result<Scrape> {
    match http_get(addr, "/metrics").await? {
        (200, body) => Ok(Scrape::parse(&body)),
        (code, _) => Err(std::io::Error::other(format!(
            "/metrics at {addr} answered {code}"
        ))),
    }
}

impl Scrape {
    /// Parses the text exposition format (comments and malformed lines skipped).
    pub fn parse(text: &str) -> Self {
        let samples = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .filter_map(parse_line)
            .collect();
        Self { samples }
    }

    /// Whether any sample of `name` (or of its `_bucket`/`_count` series) is present.
    pub fn has(&self, name: &str) -> bool {
        let bucket = format!("{name}_bucket");
        let count = format!("{name}_count");
        self.samples
            .iter()
            .any(|s| s.name == name || s.name == bucket || s.name == count)
    }

    /// Sum of every sample named `name` (all label sets).
    pub fn sum(&self, name: &str) -> f64 {
        self.samples
            .iter()
            .filter(|s| s.name == name)
            .map(|s| s.value)
            .sum()
    }

    /// Sum of every sample named `name` whose label `key` is `value`.
    pub fn sum_where(&self, name: &str, key: &str, value: &str) -> f64 {
        self.samples
            .iter()
            .filter(|s| s.name == name && s.labels.get(key).is_some_and(|v| v == value))
            .map(|s| s.value)
            .sum()
    }

    /// The cumulative buckets of histogram `name`, summed over its label sets, sorted by
    /// upper bound (`+Inf` last). Empty when the histogram is absent.
    pub fn buckets(&self, name: &str) -> Vec<(f64, f64)> {
        let bucket = format!("{name}_bucket");
        let mut by_bound: Vec<(f64, f64)> = Vec::new();
        for s in self.samples.iter().filter(|s| s.name == bucket) {
            let Some(le) = s.labels.get("le").and_then(|v| parse_bound(v)) else {
                continue;
            };
            match by_bound.iter_mut().find(|(b, _)| *b == le) {
                Some((_, n)) => *n += s.value,
                None => by_bound.push((le, s.value)),
            }
        }
        by_bound.sort_by(|a, b| a.0.total_cmp(&b.0));
        by_bound
    }
}

fn parse_bound(v: &str) -> Option<f64> {
    match v {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        other => other.parse().ok(),
    }
}

fn parse_line(line: &str) -> Option<Sample> {
    let (series, value) = line.rsplit_once(' ')?;
    let value: f64 = match value.trim() {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    let series = series.trim();
    let (name, labels) = match series.split_once('{') {
        None => (series, BTreeMap::new()),
        Some((name, rest)) => (name, parse_labels(rest.strip_suffix('}')?)?),
    };
    Some(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// `a="x",b="y\"z"` into a map.
fn parse_labels(mut rest: &str) -> Option<BTreeMap<String, String>> {
    let mut labels = BTreeMap::new();
    loop {
        rest = rest.trim_start_matches([',', ' ']);
        if rest.is_empty() {
            return Some(labels);
        }
        let (key, after) = rest.split_once('=')?;
        let mut chars = after.strip_prefix('"')?.char_indices();
        let mut value = String::new();
        let end = loop {
            match chars.next()? {
                (_, '\\') => value.push(chars.next()?.1),
                (i, '"') => break i,
                (_, c) => value.push(c),
            }
        };
        labels.insert(key.trim().to_owned(), value);
        rest = &after[end + 2..];
    }
}

/// The buckets of a histogram recorded between two scrapes: `end − start` per bound
/// (bounds missing at the start count from zero: the histogram was created in between).
pub fn bucket_delta(start: &[(f64, f64)], end: &[(f64, f64)]) -> Vec<(f64, f64)> {
    end.iter()
        .map(|&(le, n)| {
            let before = start
                .iter()
                .find(|(b, _)| *b == le)
                .map_or(0.0, |(_, n)| *n);
            (le, (n - before).max(0.0))
        })
        .collect()
}

/// The `q` quantile (0..=1) of cumulative `buckets`, interpolated linearly within the
/// bucket it falls in (lower bound 0 for the first); a rank in the `+Inf` bucket gives the
/// highest finite bound. `None` when nothing was recorded.
pub fn quantile(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = buckets.last().map(|(_, n)| *n)?;
    if total <= 0.0 {
        return None;
    }
    let rank = q.clamp(0.0, 1.0) * total;
    let mut lower = (0.0, 0.0);
    for &(le, n) in buckets {
        if n >= rank && n > 0.0 {
            if le.is_infinite() {
                return Some(lower.0);
            }
            let in_bucket = n - lower.1;
            let frac = if in_bucket > 0.0 {
                (rank - lower.1) / in_bucket
            } else {
                1.0
            };
            return Some(lower.0 + (le - lower.0) * frac);
        }
        lower = (le, n);
    }
    Some(lower.0)
}

/// The upper bound of the bucket the `q` quantile falls in (the coarse, never-low reading).
pub fn quantile_bucket_bound(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = buckets.last().map(|(_, n)| *n)?;
    if total <= 0.0 {
        return None;
    }
    let rank = q.clamp(0.0, 1.0) * total;
    buckets
        .iter()
        .find(|(_, n)| *n >= rank && *n > 0.0)
        .map(|(le, _)| *le)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "# HELP h a histogram\n# TYPE h histogram\n\
        h_bucket{le=\"0.001\"} 0\n\
        h_bucket{le=\"0.002\"} 10\n\
        h_bucket{le=\"0.004\"} 90\n\
        h_bucket{le=\"0.008\"} 100\n\
        h_bucket{le=\"+Inf\"} 100\n\
        h_sum 0.3\n\
        h_count 100\n\
        c_total{kind=\"a\",why=\"q\\\"x\"} 3\n\
        c_total{kind=\"b\"} 4\n\
        junk line here\n";

    #[test]
    fn parses_samples_and_labels() {
        let s = Scrape::parse(PAGE);
        assert_eq!(s.sum("c_total"), 7.0);
        assert_eq!(s.sum("h_count"), 100.0);
        assert!(s.has("h"));
        assert!(!s.has("absent"));
        let quoted = s
            .samples
            .iter()
            .find(|x| x.labels.get("kind").is_some_and(|k| k == "a"))
            .unwrap();
        assert_eq!(quoted.labels["why"], "q\"x");
        assert_eq!(s.buckets("h").len(), 5);
        assert!(s.buckets("absent").is_empty());
    }

    #[test]
    fn quantiles_interpolate_within_the_bucket() {
        let b = Scrape::parse(PAGE).buckets("h");
        // rank 50 of 100 lies 40/80 of the way through (0.002, 0.004].
        let p50 = quantile(&b, 0.5).unwrap();
        assert!((p50 - 0.003).abs() < 1e-9, "{p50}");
        // rank 99 lies 9/10 of the way through (0.004, 0.008].
        let p99 = quantile(&b, 0.99).unwrap();
        assert!((p99 - 0.0076).abs() < 1e-9, "{p99}");
        assert_eq!(quantile_bucket_bound(&b, 0.99), Some(0.008));
        assert_eq!(quantile(&[], 0.5), None);
        assert_eq!(quantile(&[(1.0, 0.0), (f64::INFINITY, 0.0)], 0.5), None);
        // Everything above the last finite bound reads as that bound.
        assert_eq!(
            quantile(&[(1.0, 0.0), (f64::INFINITY, 5.0)], 0.5),
            Some(1.0)
        );
    }

    #[test]
    fn the_window_is_the_difference_of_two_scrapes() {
        let start = vec![(0.001, 5.0), (0.002, 5.0), (f64::INFINITY, 5.0)];
        let end = vec![(0.001, 5.0), (0.002, 15.0), (f64::INFINITY, 15.0)];
        let d = bucket_delta(&start, &end);
        assert_eq!(d, vec![(0.001, 0.0), (0.002, 10.0), (f64::INFINITY, 10.0)]);
        // All ten in (0.001, 0.002]: the median is half way.
        let p50 = quantile(&d, 0.5).unwrap();
        assert!((p50 - 0.0015).abs() < 1e-12, "{p50}");
        // A histogram that appeared mid-window counts from zero.
        assert_eq!(bucket_delta(&[], &end), end);
    }
}
