//! Token buckets per caller identity.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::time::Instant;

/// Sustained rate and burst per identity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// Tokens added per second.
    pub per_second: f64,
    /// Bucket capacity: how many calls may arrive at once after a quiet period.
    pub burst: u32,
}

/// When the map holds this many keys, full (idle) buckets are dropped: a full bucket is
/// indistinguishable from a fresh one, so forgetting it changes nothing.
const PRUNE_AT: usize = 4096;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    last: Instant,
}

/// Shared buckets for all connections of a server.
#[derive(Debug, Clone)]
pub struct TokenBuckets {
    limit: RateLimit,
    buckets: Arc<Mutex<HashMap<String, Bucket>>>,
}

impl TokenBuckets {
    pub fn new(limit: RateLimit) -> Self {
        Self {
            limit,
            buckets: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// Takes one token from `key`'s bucket; `false` when it is empty.
    pub fn try_acquire(&self, key: &str) -> bool {
        let now = Instant::now();
        let burst = f64::from(self.limit.burst.max(1));
        let mut buckets = self.buckets.lock();
        if buckets.len() >= PRUNE_AT && !buckets.contains_key(key) {
            let limit = self.limit;
            buckets.retain(|_, b| refill(b, now, limit) < burst);
        }
        let bucket = buckets.entry(key.to_owned()).or_insert(Bucket {
            tokens: burst,
            last: now,
        });
        refill(bucket, now, self.limit);
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.buckets.lock().len()
    }
}

fn refill(b: &mut Bucket, now: Instant, limit: RateLimit) -> f64 {
    let elapsed = now.saturating_duration_since(b.last).as_secs_f64();
    b.tokens = (b.tokens + elapsed * limit.per_second).min(f64::from(limit.burst.max(1)));
    b.last = now;
    b.tokens
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn burst_then_refill_per_key() {
        let tb = TokenBuckets::new(RateLimit {
            per_second: 2.0,
            burst: 3,
        });
        for _ in 0..3 {
            assert!(tb.try_acquire("a"));
        }
        assert!(!tb.try_acquire("a"));
        // Another identity has its own bucket.
        assert!(tb.try_acquire("b"));
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(tb.try_acquire("a"), "one token refilled after 0.5 s at 2/s");
        assert!(!tb.try_acquire("a"));
        tokio::time::advance(Duration::from_secs(60)).await;
        for _ in 0..3 {
            assert!(tb.try_acquire("a"));
        }
        assert!(!tb.try_acquire("a"), "refill is capped at the burst");
    }

    #[tokio::test(start_paused = true)]
    async fn idle_buckets_are_pruned() {
        let tb = TokenBuckets::new(RateLimit {
            per_second: 1000.0,
            burst: 1,
        });
        for i in 0..PRUNE_AT {
            assert!(tb.try_acquire(&format!("k{i}")));
        }
        assert_eq!(tb.len(), PRUNE_AT);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(tb.try_acquire("new"));
        assert_eq!(tb.len(), 1);
    }
}
