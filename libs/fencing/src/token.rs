//! Fencing tokens, the strictly-newer rule and sequence minting.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::FencingError;

/// Distance between two consecutive sequence bases: room for 65,536 attempts of one action
/// before its sequences could reach the next action's base.
pub const DEFAULT_SEQUENCE_SPACING: u64 = 1 << 16;

/// The position of a token in its shard's history: compared epoch first, then sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct FenceMark {
    pub epoch: u64,
    pub sequence: u64,
}

/// What every mutating provider call carries.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FencingToken {
    pub shard_id: String,
    pub epoch: u64,
    pub sequence: u64,
}

impl FencingToken {
    pub fn new(shard_id: impl Into<String>, epoch: u64, sequence: u64) -> Self {
        Self {
            shard_id: shard_id.into(),
            epoch,
            sequence,
        }
    }

    pub fn mark(&self) -> FenceMark {
        FenceMark {
            epoch: self.epoch,
            sequence: self.sequence,
        }
    }

    /// The providers' rule: a newer epoch always wins (a restarted shard supersedes its
    /// zombie whatever sequences the zombie reached); within one epoch the sequence must be
    /// strictly higher. Equal is *not* newer — a replayed call is refused.
    pub fn is_newer_than(&self, high_water: &FenceMark) -> bool {
        self.mark() > *high_water
    }
}

/// A provider's per-(shard, machine) high-water marks.
///
/// Plain data with `&mut self`: the owner decides how to share it (a provider typically
/// keeps it under the same lock as the machine record it protects, so check and mutation
/// are one step).
#[derive(Debug, Default, Clone)]
pub struct HighWaterMarks {
    marks: HashMap<(String, String), FenceMark>,
}

impl HighWaterMarks {
    pub fn new() -> Self {
        Self::default()
    }

    /// The mark recorded for `(shard_id, machine_id)`, if any call was accepted yet.
    pub fn get(&self, shard_id: &str, machine_id: &str) -> Option<FenceMark> {
        self.marks
            .get(&(shard_id.to_owned(), machine_id.to_owned()))
            .copied()
    }

    /// Accepts `token` for `machine_id` if it is strictly newer than the recorded mark (or
    /// nothing is recorded yet) and records it; otherwise returns [`FencingError::Stale`]
    /// and leaves the mark unchanged.
    pub fn check_and_record(
        &mut self,
        machine_id: &str,
        token: &FencingToken,
    ) -> Result<(), FencingError> {
        let key = (token.shard_id.clone(), machine_id.to_owned());
        match self.marks.get_mut(&key) {
            Some(hw) if !token.is_newer_than(hw) => Err(FencingError::Stale {
                shard_id: token.shard_id.clone(),
                machine_id: machine_id.to_owned(),
                epoch: token.epoch,
                sequence: token.sequence,
                hw_epoch: hw.epoch,
                hw_sequence: hw.sequence,
            }),
            Some(hw) => {
                *hw = token.mark();
                Ok(())
            }
            None => {
                self.marks.insert(key, token.mark());
                Ok(())
            }
        }
    }

    /// Forgets a machine (e.g. after it is deleted) so the map does not grow forever.
    pub fn forget_machine(&mut self, machine_id: &str) {
        self.marks.retain(|(_, m), _| m != machine_id);
    }

    pub fn len(&self) -> usize {
        self.marks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.marks.is_empty()
    }
}

/// Hands out sequence bases within one epoch; shared by every task of a decide process.
///
/// Lock-free: bases come from one atomic counter, so concurrent callers never receive the
/// same base, and consecutive bases are `spacing` apart so `base + attempt` of one action
/// never reaches another action's range.
#[derive(Debug)]
pub struct SequenceMinter {
    next: AtomicU64,
    spacing: u64,
}

impl SequenceMinter {
    /// A minter whose first base is `spacing` (never 0, so even attempt 0 of the first action
    /// is above a zero-initialised high-water mark).
    ///
    /// # Panics
    /// If `spacing` is 0 (a programming error: every action needs at least one attempt).
    pub fn new(spacing: u64) -> Self {
        assert!(spacing > 0, "sequence spacing must be positive");
        Self {
            next: AtomicU64::new(spacing),
            spacing,
        }
    }

    pub fn spacing(&self) -> u64 {
        self.spacing
    }

    /// The next unused base.
    pub fn next_base(&self) -> Result<SequenceBase, FencingError> {
        let spacing = self.spacing;
        self.next
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                // Refuse the last window too: its `base + spacing - 1` must still fit.
                n.checked_add(spacing).map(|_| n + spacing)
            })
            .map(|base| SequenceBase { base, spacing })
            .map_err(|_| FencingError::Overflow { what: "sequence" })
    }
}

impl Default for SequenceMinter {
    fn default() -> Self {
        Self::new(DEFAULT_SEQUENCE_SPACING)
    }
}

/// One action's reserved sequence window `[base, base + spacing)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SequenceBase {
    pub base: u64,
    pub spacing: u64,
}

impl SequenceBase {
    /// The sequence for attempt `attempt` (0-based) of this action.
    pub fn sequence(&self, attempt: u64) -> Result<u64, FencingError> {
        if attempt >= self.spacing {
            return Err(FencingError::AttemptOutOfRange {
                attempt,
                spacing: self.spacing,
            });
        }
        Ok(self.base + attempt)
    }

    /// The full token for attempt `attempt`.
    pub fn token(
        &self,
        shard_id: &str,
        epoch: u64,
        attempt: u64,
    ) -> Result<FencingToken, FencingError> {
        Ok(FencingToken::new(shard_id, epoch, self.sequence(attempt)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashSet;
    use std::sync::Arc;

    fn mark(epoch: u64, sequence: u64) -> FenceMark {
        FenceMark { epoch, sequence }
    }

    #[test]
    fn newer_epoch_wins_even_with_a_lower_sequence() {
        let t = FencingToken::new("s1", 3, 1);
        assert!(t.is_newer_than(&mark(2, 1_000_000)));
    }

    #[test]
    fn same_epoch_needs_a_strictly_higher_sequence() {
        assert!(FencingToken::new("s1", 2, 11).is_newer_than(&mark(2, 10)));
        assert!(!FencingToken::new("s1", 2, 10).is_newer_than(&mark(2, 10)));
        assert!(!FencingToken::new("s1", 2, 9).is_newer_than(&mark(2, 10)));
    }

    #[test]
    fn older_epoch_loses_whatever_its_sequence() {
        assert!(!FencingToken::new("s1", 1, u64::MAX).is_newer_than(&mark(2, 0)));
    }

    #[test]
    fn high_water_marks_are_per_shard_and_machine() {
        let mut hw = HighWaterMarks::new();
        hw.check_and_record("m1", &FencingToken::new("s1", 2, 5))
            .unwrap();
        // Same machine, replayed token: refused and the mark is unchanged.
        let err = hw
            .check_and_record("m1", &FencingToken::new("s1", 2, 5))
            .unwrap_err();
        assert!(matches!(
            err,
            FencingError::Stale {
                hw_epoch: 2,
                hw_sequence: 5,
                ..
            }
        ));
        assert_eq!(hw.get("s1", "m1"), Some(mark(2, 5)));
        // Another machine and another shard have their own marks.
        hw.check_and_record("m2", &FencingToken::new("s1", 2, 1))
            .unwrap();
        hw.check_and_record("m1", &FencingToken::new("s2", 1, 1))
            .unwrap();
        // A zombie from epoch 1 of s1 is fenced on m1.
        assert!(
            hw.check_and_record("m1", &FencingToken::new("s1", 1, 99))
                .is_err()
        );
        // The restarted shard (epoch 3) supersedes.
        hw.check_and_record("m1", &FencingToken::new("s1", 3, 1))
            .unwrap();
        assert_eq!(hw.get("s1", "m1"), Some(mark(3, 1)));
        assert_eq!(hw.len(), 3);
        hw.forget_machine("m1");
        assert_eq!(hw.len(), 1);
        assert_eq!(hw.get("s1", "m1"), None);
    }

    #[test]
    fn clock_sized_epochs_fit_the_wire_and_supersede_counted_ones() {
        // ADR-0103: file-mode epochs are wall-clock seconds (~1.8e9). The sequence space is
        // per process and independent of the epoch, so nothing is scaled by it.
        let epoch = 1_800_000_000u64;
        let minter = SequenceMinter::default();
        let first = minter.next_base().unwrap();
        let last_attempt = first.token("s1", epoch, first.spacing - 1).unwrap();
        // What decide and execute put into the int64 wire fields.
        assert_eq!(i64::try_from(last_attempt.epoch).unwrap(), 1_800_000_000);
        assert!(i64::try_from(first.base + first.spacing).is_ok());
        // The first call of a start from the floor beats every mark of the counted epochs
        // (the original's 1, 2, 3, ...) and of the previous second, whatever their sequence.
        let t = first.token("s1", epoch, 0).unwrap();
        assert!(t.is_newer_than(&mark(41, u64::MAX)));
        assert!(t.is_newer_than(&mark(epoch - 1, i64::MAX as u64)));
        assert!(!FencingToken::new("s1", epoch - 1, u64::MAX).is_newer_than(&t.mark()));
    }

    #[test]
    fn bases_are_spaced_and_attempts_stay_inside_their_window() {
        let minter = SequenceMinter::new(16);
        let a = minter.next_base().unwrap();
        let b = minter.next_base().unwrap();
        assert_eq!(a.base, 16);
        assert_eq!(b.base, 32);
        assert_eq!(a.sequence(0).unwrap(), 16);
        assert_eq!(a.sequence(15).unwrap(), 31);
        assert!(a.sequence(15).unwrap() < b.sequence(0).unwrap());
        assert!(matches!(
            a.sequence(16),
            Err(FencingError::AttemptOutOfRange {
                attempt: 16,
                spacing: 16
            })
        ));
        let tok = b.token("s1", 7, 2).unwrap();
        assert_eq!(tok, FencingToken::new("s1", 7, 34));
    }

    #[test]
    fn minting_stops_at_overflow_instead_of_wrapping() {
        let minter = SequenceMinter {
            next: AtomicU64::new(u64::MAX - 10),
            spacing: 8,
        };
        let last = minter.next_base().unwrap();
        assert_eq!(last.sequence(7).unwrap(), u64::MAX - 3);
        assert!(matches!(
            minter.next_base(),
            Err(FencingError::Overflow { what: "sequence" })
        ));
    }

    #[test]
    fn concurrent_minting_never_hands_out_the_same_window() {
        let minter = Arc::new(SequenceMinter::default());
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let m = Arc::clone(&minter);
                std::thread::spawn(move || {
                    (0..2_000)
                        .map(|_| m.next_base().unwrap().base)
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut all = Vec::new();
        for t in threads {
            all.extend(t.join().unwrap());
        }
        let unique: HashSet<_> = all.iter().copied().collect();
        assert_eq!(unique.len(), all.len());
        all.sort_unstable();
        for pair in all.windows(2) {
            assert_eq!(pair[1] - pair[0], DEFAULT_SEQUENCE_SPACING);
        }
        assert_eq!(all[0], DEFAULT_SEQUENCE_SPACING);
    }

    proptest! {
        #[test]
        fn newer_is_the_strict_lexicographic_order(
            e1 in 0u64..4, s1 in 0u64..4, e2 in 0u64..4, s2 in 0u64..4
        ) {
            let t = FencingToken::new("s", e1, s1);
            let expected = e1 > e2 || (e1 == e2 && s1 > s2);
            prop_assert_eq!(t.is_newer_than(&mark(e2, s2)), expected);
            // Antisymmetric: never both newer than each other.
            let u = FencingToken::new("s", e2, s2);
            prop_assert!(!(t.is_newer_than(&u.mark()) && u.is_newer_than(&t.mark())));
        }

        #[test]
        fn retries_of_successive_actions_are_strictly_increasing(
            attempts in proptest::collection::vec(0u64..5, 1..20)
        ) {
            // A worker fleet stamping base + attempt for each action in mint order: every
            // call of a later action is accepted after every call of an earlier one.
            let minter = SequenceMinter::new(8);
            let mut hw = HighWaterMarks::new();
            for n in attempts {
                let base = minter.next_base().unwrap();
                for attempt in 0..=n {
                    let token = base.token("s", 1, attempt).unwrap();
                    prop_assert!(hw.check_and_record("m", &token).is_ok());
                }
            }
        }
    }
}
