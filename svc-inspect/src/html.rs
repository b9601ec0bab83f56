//! Tiny helpers for the pages: URL path encoding and time formatting. HTML escaping is the
//! template library's job (maud escapes every interpolated value).

use std::fmt::Write as _;
use std::time::{Duration, UNIX_EPOCH};

/// Percent-encodes one URL path segment or query value (RFC 3986 unreserved characters
/// pass through).
pub fn pct(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// `2026-06-28T10:00:00Z`; empty for 0.
pub fn timestamp(unix_nanos: i64) -> String {
    if unix_nanos <= 0 {
        return String::new();
    }
    let t = UNIX_EPOCH + Duration::from_nanos(u64::try_from(unix_nanos).unwrap_or(0));
    humantime::format_rfc3339_seconds(t).to_string()
}

/// `12s`, `3m 4s`, `2h 5m`: a coarse duration for "ago" columns.
pub fn coarse(ms: i64) -> String {
    if ms < 0 {
        return "never".to_owned();
    }
    let s = ms / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {}s", s / 60, s % 60),
        3600..86400 => format!("{}h {}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d {}h", s / 86400, (s % 86400) / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn path_segments_are_encoded() {
        assert_eq!(pct("team a/b?c"), "team%20a%2Fb%3Fc");
        assert_eq!(pct("ü"), "%C3%BC");
        assert_eq!(pct("ok-1.2_x~"), "ok-1.2_x~");
    }

    #[test]
    fn times_format() {
        assert_eq!(timestamp(0), "");
        assert_eq!(timestamp(1_000_000_000), "1970-01-01T00:00:01Z");
        assert_eq!(coarse(-1), "never");
        assert_eq!(coarse(12_500), "12s");
        assert_eq!(coarse(184_000), "3m 4s");
        assert_eq!(coarse(7_500_000), "2h 5m");
    }

    proptest! {
        #[test]
        fn encoded_segments_are_plain_ascii(s in ".*") {
            prop_assert!(pct(&s).bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~%".contains(&b)));
        }
    }
}
