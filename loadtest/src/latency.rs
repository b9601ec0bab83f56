//! Latency recording shared by many simulated operators.

use std::sync::Arc;
use std::time::Duration;

use hdrhistogram::Histogram;
use parking_lot::Mutex;

/// A shared histogram of latencies in microseconds (1 µs to 60 s, 3 significant digits).
/// Clones record into the same histogram.
#[derive(Clone)]
pub struct LatencyRecorder {
    hist: Arc<Mutex<Histogram<u64>>>,
}

impl std::fmt::Debug for LatencyRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LatencyRecorder")
            .field("count", &self.count())
            .finish()
    }
}

impl Default for LatencyRecorder {
    fn default() -> Self {
        Self::new()
    }
}

const MAX_MICROS: u64 = 60_000_000;

impl LatencyRecorder {
    pub fn new() -> Self {
        let hist = Histogram::new_with_bounds(1, MAX_MICROS, 3).expect("static bounds are valid");
        Self {
            hist: Arc::new(Mutex::new(hist)),
        }
    }

    /// Records one latency (clamped to the histogram's range).
    pub fn record(&self, d: Duration) {
        let us = u64::try_from(d.as_micros())
            .unwrap_or(u64::MAX)
            .clamp(1, MAX_MICROS);
        self.hist.lock().saturating_record(us);
    }

    pub fn count(&self) -> u64 {
        self.hist.lock().len()
    }

    /// The `q` quantile (0..=1) in milliseconds; 0 when empty.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        let h = self.hist.lock();
        if h.is_empty() {
            return 0.0;
        }
        h.value_at_quantile(q) as f64 / 1000.0
    }

    /// Forgets everything recorded so far (e.g. the ramp-up before a measurement window).
    pub fn reset(&self) {
        self.hist.lock().reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_in_milliseconds() {
        let r = LatencyRecorder::new();
        assert_eq!(r.quantile_ms(0.5), 0.0);
        for ms in 1..=100u64 {
            r.clone().record(Duration::from_millis(ms));
        }
        assert_eq!(r.count(), 100);
        let p50 = r.quantile_ms(0.5);
        let p99 = r.quantile_ms(0.99);
        assert!((49.0..=51.0).contains(&p50), "{p50}");
        assert!((98.0..=100.5).contains(&p99), "{p99}");
        r.reset();
        assert_eq!(r.count(), 0);
    }
}
