//! A small time-to-live cache with one refresh in flight per key: a burst of dashboard loads
//! costs one fan-out, not one per request.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex as AsyncMutex;
use tokio::time::Instant;

type Slot<V> = Arc<AsyncMutex<Option<(Instant, Arc<V>)>>>;

/// Values live `ttl` (zero: never reused); at most `capacity` keys are kept.
pub struct TtlCache<K, V> {
    ttl: Duration,
    capacity: usize,
    slots: parking_lot::Mutex<HashMap<K, Slot<V>>>,
}

impl<K: Eq + Hash + Clone, V> TtlCache<K, V> {
    pub fn new(ttl: Duration, capacity: usize) -> Self {
        Self {
            ttl,
            capacity: capacity.max(1),
            slots: parking_lot::Mutex::new(HashMap::new()),
        }
    }

    /// The cached value for `key` if younger than the TTL, else the result of `load`
    /// (stored on success; errors are never cached). Concurrent callers for one key wait
    /// for the single load in flight.
    pub async fn get_or_load<E, F, Fut>(&self, key: &K, load: F) -> Result<Arc<V>, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<V, E>>,
    {
        let slot = self.slot(key);
        let mut guard = slot.lock().await;
        if let Some((at, value)) = guard.as_ref()
            && !self.ttl.is_zero()
            && at.elapsed() < self.ttl
        {
            return Ok(Arc::clone(value));
        }
        let value = Arc::new(load().await?);
        *guard = Some((Instant::now(), Arc::clone(&value)));
        Ok(value)
    }

    fn slot(&self, key: &K) -> Slot<V> {
        let mut slots = self.slots.lock();
        if let Some(slot) = slots.get(key) {
            return Arc::clone(slot);
        }
        if slots.len() >= self.capacity {
            self.evict(&mut slots);
        }
        let slot: Slot<V> = Arc::new(AsyncMutex::new(None));
        slots.insert(key.clone(), Arc::clone(&slot));
        slot
    }

    /// Drops expired idle entries; if none expired, drops idle entries until under capacity
    /// (a slot being loaded right now is never dropped).
    fn evict(&self, slots: &mut HashMap<K, Slot<V>>) {
        let ttl = self.ttl;
        slots.retain(|_, slot| match slot.try_lock() {
            Ok(g) => g
                .as_ref()
                .is_some_and(|(at, _)| !ttl.is_zero() && at.elapsed() < ttl),
            Err(_) => true,
        });
        if slots.len() >= self.capacity {
            let idle: Vec<K> = slots
                .iter()
                .filter(|(_, s)| s.try_lock().is_ok())
                .map(|(k, _)| k.clone())
                .take(slots.len() + 1 - self.capacity)
                .collect();
            for k in idle {
                slots.remove(&k);
            }
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.slots.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test(start_paused = true)]
    async fn values_are_reused_within_the_ttl_and_reloaded_after() {
        let cache: TtlCache<&str, usize> = TtlCache::new(Duration::from_secs(2), 8);
        let loads = AtomicUsize::new(0);
        let load = || async { Ok::<_, ()>(loads.fetch_add(1, Ordering::SeqCst)) };
        assert_eq!(*cache.get_or_load(&"k", load).await.unwrap(), 0);
        assert_eq!(*cache.get_or_load(&"k", load).await.unwrap(), 0);
        tokio::time::advance(Duration::from_millis(2100)).await;
        assert_eq!(*cache.get_or_load(&"k", load).await.unwrap(), 1);
        assert_eq!(*cache.get_or_load(&"other", load).await.unwrap(), 2);
    }

    #[tokio::test]
    async fn errors_are_not_cached_and_zero_ttl_never_reuses() {
        let cache: TtlCache<u8, u8> = TtlCache::new(Duration::from_secs(60), 8);
        assert!(
            cache
                .get_or_load(&1, || async { Err::<u8, _>("down") })
                .await
                .is_err()
        );
        assert_eq!(
            *cache
                .get_or_load(&1, || async { Ok::<_, ()>(5) })
                .await
                .unwrap(),
            5
        );
        let none: TtlCache<u8, u8> = TtlCache::new(Duration::ZERO, 8);
        assert_eq!(
            *none
                .get_or_load(&1, || async { Ok::<_, ()>(1) })
                .await
                .unwrap(),
            1
        );
        assert_eq!(
            *none
                .get_or_load(&1, || async { Ok::<_, ()>(2) })
                .await
                .unwrap(),
            2
        );
    }

    #[tokio::test]
    async fn concurrent_misses_share_one_load() {
        let cache = Arc::new(TtlCache::<u8, usize>::new(Duration::from_secs(60), 8));
        let loads = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (cache, loads) = (Arc::clone(&cache), Arc::clone(&loads));
            tasks.push(tokio::spawn(async move {
                *cache
                    .get_or_load(&1, || async {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        Ok::<_, ()>(loads.fetch_add(1, Ordering::SeqCst))
                    })
                    .await
                    .unwrap()
            }));
        }
        for t in tasks {
            assert_eq!(t.await.unwrap(), 0);
        }
        assert_eq!(loads.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn the_key_count_stays_bounded() {
        let cache: TtlCache<u32, u32> = TtlCache::new(Duration::from_secs(60), 4);
        for k in 0..20 {
            cache
                .get_or_load(&k, || async { Ok::<_, ()>(k) })
                .await
                .unwrap();
            assert!(cache.len() <= 4, "{} keys", cache.len());
        }
    }
}
