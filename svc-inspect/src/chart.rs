//! Server-rendered sparklines: a series of samples becomes an inline SVG polyline, so the
//! pages draw their time axis without any charting script (ADR-0136).

use std::fmt::Write as _;

use maud::{Markup, html};

/// Drawing area in SVG user units (scaled by CSS).
const WIDTH: f64 = 200.0;
const HEIGHT: f64 = 40.0;
/// Keeps the stroke inside the box at the extremes.
const PAD: f64 = 2.0;

/// One labelled sparkline: caption, latest value, and the line over `values` (oldest first;
/// `None` is a gap, e.g. a sample where the figure was unknown).
///
/// The figure carries `data-series`, `data-samples` and `data-last` so scripts and tests can
/// read what is drawn without parsing the path.
pub fn sparkline(series: &str, label: &str, values: &[Option<i64>], span: &str) -> Markup {
    let last = values.iter().rev().flatten().next().copied();
    let known: Vec<i64> = values.iter().flatten().copied().collect();
    let (lo, hi) = match (known.iter().min(), known.iter().max()) {
        (Some(lo), Some(hi)) => (*lo, *hi),
        _ => (0, 0),
    };
    let summary = match last {
        Some(v) => format!("{label}: {v} now; range {lo} to {hi} over {span}"),
        None => format!("{label}: no samples yet"),
    };
    html! {
        figure.spark data-series=(series) data-samples=(values.len())
            data-last=(last.map(|v| v.to_string()).unwrap_or_default()) {
            figcaption {
                span.l { (label) }
                span.n { (last.map(|v| v.to_string()).unwrap_or_else(|| "–".to_owned())) }
            }
            svg viewBox=(format!("0 0 {WIDTH} {HEIGHT}")) preserveAspectRatio="none"
                role="img" aria-label=(summary) {
                title { (summary) }
                @for points in segments(values, lo, hi) {
                    @if points.contains(' ') {
                        polyline points=(points) {}
                    } @else {
                        // A lone sample between gaps: a dot, since a one-point line is invisible.
                        circle cx=(points.split(',').next().unwrap_or("0"))
                            cy=(points.split(',').nth(1).unwrap_or("0")) r="1.5" {}
                    }
                }
            }
            div.range { (lo) "–" (hi) }
        }
    }
}

/// The polylines' `points` attributes: one per run of known values.
fn segments(values: &[Option<i64>], lo: i64, hi: i64) -> Vec<String> {
    let n = values.len();
    let x = |i: usize| {
        if n <= 1 {
            WIDTH / 2.0
        } else {
            i as f64 * WIDTH / (n - 1) as f64
        }
    };
    let y = |v: i64| {
        if hi == lo {
            HEIGHT / 2.0
        } else {
            let frac = (v - lo) as f64 / (hi - lo) as f64;
            HEIGHT - PAD - frac * (HEIGHT - 2.0 * PAD)
        }
    };
    let mut out = Vec::new();
    let mut current = String::new();
    for (i, v) in values.iter().enumerate() {
        match v {
            Some(v) => {
                if !current.is_empty() {
                    current.push(' ');
                }
                let _ = write!(current, "{:.1},{:.1}", x(i), y(*v));
            }
            None if !current.is_empty() => out.push(std::mem::take(&mut current)),
            None => {}
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// "the last 12 min" for `samples` samples `interval_ms` apart.
pub fn span_text(samples: usize, interval_ms: u64) -> String {
    let ms = i64::try_from(interval_ms.saturating_mul(samples.saturating_sub(1) as u64))
        .unwrap_or(i64::MAX);
    if samples <= 1 || ms == 0 {
        "one sample".to_owned()
    } else {
        format!("the last {}", crate::html::coarse(ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_series_is_scaled_into_the_box_and_split_at_gaps() {
        let segs = segments(&[Some(0), Some(10), None, Some(5)], 0, 10);
        assert_eq!(segs.len(), 2);
        assert_eq!(segs[0], "0.0,38.0 66.7,2.0");
        assert_eq!(segs[1], "200.0,20.0");
        // A flat series sits in the middle.
        assert_eq!(segments(&[Some(3), Some(3)], 3, 3), ["0.0,20.0 200.0,20.0"]);
        assert!(segments(&[None, None], 0, 0).is_empty());
    }

    #[test]
    fn the_figure_says_what_it_draws_and_escapes_its_label() {
        let m =
            sparkline("unmet", "<unmet>", &[Some(1), None, Some(4), Some(2)], "1m").into_string();
        assert!(m.contains("data-series=\"unmet\""), "{m}");
        assert!(m.contains("data-samples=\"4\"") && m.contains("data-last=\"2\""));
        assert!(m.contains("<polyline") && m.contains("<circle"), "{m}");
        assert!(m.contains("&lt;unmet&gt;: 2 now; range 1 to 4 over 1m"));
        assert!(!m.contains("<unmet>"));
        let empty = sparkline("x", "x", &[], "").into_string();
        assert!(empty.contains("no samples yet") && !empty.contains("<polyline"));
    }

    #[test]
    fn spans_read_naturally() {
        assert_eq!(span_text(1, 5000), "one sample");
        assert_eq!(span_text(13, 5000), "the last 1m 0s");
    }
}
