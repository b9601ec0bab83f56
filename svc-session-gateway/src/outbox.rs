//! The per-cluster outbox of published frames, coalesced by `supersedes_key`.
//!
//! NodeStateUpdate and AvailableCapacityUpdate frames are full statements about one key (a
//! machine, a profile): a newer frame makes a queued older one worthless, so the older one
//! is replaced in place instead of both being sent. That keeps a slow operator's backlog
//! bounded by the number of distinct keys, and a reconnect that replays the latest frame per
//! key converges without ordering subtleties.

use std::collections::{HashMap, VecDeque};

/// What happened to a frame offered to the outbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// Queued behind the frames already waiting.
    Queued,
    /// Replaced a queued frame with the same key (which is now dropped).
    Coalesced,
    /// Dropped: the outbox already holds its capacity of distinct keys.
    Full,
}

/// A bounded FIFO of frames with at most one frame per key. A frame that replaces a queued
/// one takes its place in the queue, so a key that changes often is not starved by keys
/// behind it.
#[derive(Debug)]
pub struct Outbox<T> {
    capacity: usize,
    order: VecDeque<Key>,
    frames: HashMap<Key, T>,
    /// Frames without a key never coalesce; they get unique synthetic keys.
    next_anonymous: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Named(String),
    Anonymous(u64),
}

impl<T> Outbox<T> {
    /// An empty outbox holding at most `capacity` frames (at least one). Allocates nothing
    /// until the first frame arrives.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            order: VecDeque::new(),
            frames: HashMap::new(),
            next_anonymous: 0,
        }
    }

    /// Offers `frame` under `key` (empty: a frame that never coalesces).
    pub fn offer(&mut self, key: &str, frame: T) -> Offer {
        let key = if key.is_empty() {
            self.next_anonymous += 1;
            Key::Anonymous(self.next_anonymous)
        } else {
            Key::Named(key.to_owned())
        };
        if let Some(slot) = self.frames.get_mut(&key) {
            *slot = frame;
            return Offer::Coalesced;
        }
        if self.frames.len() >= self.capacity {
            return Offer::Full;
        }
        self.order.push_back(key.clone());
        self.frames.insert(key, frame);
        Offer::Queued
    }

    /// The oldest queued frame.
    pub fn pop(&mut self) -> Option<T> {
        let key = self.order.pop_front()?;
        let frame = self.frames.remove(&key);
        if self.order.is_empty() {
            // Idle sessions (nearly all of 10,000) keep no memory of a past burst; the next
            // burst allocates again, which costs far less than every session holding
            // queue capacity it rarely uses.
            self.order = VecDeque::new();
            self.frames = HashMap::new();
        }
        frame
    }

    pub fn len(&self) -> usize {
        self.frames.len()
    }

    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Drops everything queued and returns how many frames that was.
    pub fn clear(&mut self) -> usize {
        let n = self.frames.len();
        self.order = VecDeque::new();
        self.frames = HashMap::new();
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn drain(o: &mut Outbox<(String, u32)>) -> Vec<(String, u32)> {
        std::iter::from_fn(|| o.pop()).collect()
    }

    #[test]
    fn newer_frame_replaces_the_queued_one_in_place() {
        let mut o: Outbox<(String, u32)> = Outbox::new(8);
        assert_eq!(o.offer("node:a", ("a".into(), 1)), Offer::Queued);
        assert_eq!(o.offer("node:b", ("b".into(), 1)), Offer::Queued);
        assert_eq!(o.offer("node:a", ("a".into(), 2)), Offer::Coalesced);
        assert_eq!(o.offer("node:a", ("a".into(), 3)), Offer::Coalesced);
        assert_eq!(o.len(), 2);
        assert_eq!(
            drain(&mut o),
            vec![("a".to_owned(), 3), ("b".to_owned(), 1)],
            "only the newest frame of a key is sent, at the key's original position"
        );
        // Once sent, the key queues again.
        assert_eq!(o.offer("node:a", ("a".into(), 4)), Offer::Queued);
        assert_eq!(drain(&mut o), vec![("a".to_owned(), 4)]);
    }

    #[test]
    fn full_outbox_drops_new_keys_but_still_coalesces_known_ones() {
        let mut o: Outbox<(String, u32)> = Outbox::new(2);
        assert_eq!(o.offer("k1", ("k1".into(), 1)), Offer::Queued);
        assert_eq!(o.offer("k2", ("k2".into(), 1)), Offer::Queued);
        assert_eq!(o.offer("k3", ("k3".into(), 1)), Offer::Full);
        assert_eq!(o.offer("k2", ("k2".into(), 2)), Offer::Coalesced);
        assert_eq!(
            drain(&mut o),
            vec![("k1".to_owned(), 1), ("k2".to_owned(), 2)]
        );
    }

    #[test]
    fn frames_without_a_key_never_coalesce() {
        let mut o: Outbox<(String, u32)> = Outbox::new(4);
        assert_eq!(o.offer("", ("x".into(), 1)), Offer::Queued);
        assert_eq!(o.offer("", ("x".into(), 2)), Offer::Queued);
        assert_eq!(drain(&mut o).len(), 2);
    }

    #[test]
    fn a_drained_outbox_holds_no_memory() {
        let mut o: Outbox<(String, u32)> = Outbox::new(8);
        o.offer("a", ("a".into(), 1));
        o.offer("b", ("b".into(), 1));
        assert!(o.order.capacity() > 0 && o.frames.capacity() > 0);
        o.pop();
        assert!(o.order.capacity() > 0, "not drained yet");
        o.pop();
        assert_eq!(o.order.capacity(), 0);
        assert_eq!(o.frames.capacity(), 0);
        assert_eq!(o.offer("a", ("a".into(), 2)), Offer::Queued, "usable again");
    }

    #[test]
    fn clear_empties_and_counts() {
        let mut o: Outbox<(String, u32)> = Outbox::new(4);
        o.offer("a", ("a".into(), 1));
        o.offer("b", ("b".into(), 1));
        assert_eq!(o.clear(), 2);
        assert!(o.is_empty());
        assert!(o.pop().is_none());
    }

    proptest! {
        /// Whatever the sequence of offers, the outbox never exceeds its capacity, never
        /// holds two frames of one key, and every key's frame is the newest one offered
        /// after its last pop.
        #[test]
        fn coalescing_invariants(
            cap in 1usize..6,
            ops in proptest::collection::vec((0u8..8, any::<bool>()), 0..200),
        ) {
            let mut o: Outbox<(String, u32)> = Outbox::new(cap);
            let mut newest: HashMap<String, u32> = HashMap::new();
            let mut seq = 0u32;
            for (k, pop) in ops {
                if pop {
                    if let Some((key, v)) = o.pop() {
                        prop_assert_eq!(newest.remove(&key), Some(v));
                    }
                } else {
                    seq += 1;
                    let key = format!("k{k}");
                    match o.offer(&key, (key.clone(), seq)) {
                        Offer::Queued | Offer::Coalesced => { newest.insert(key, seq); }
                        Offer::Full => prop_assert!(!newest.contains_key(&key)),
                    }
                }
                prop_assert!(o.len() <= cap);
                prop_assert_eq!(o.len(), newest.len());
            }
            for (key, v) in drain(&mut o) {
                prop_assert_eq!(newest.remove(&key), Some(v));
            }
            prop_assert!(newest.is_empty());
        }
    }
}
