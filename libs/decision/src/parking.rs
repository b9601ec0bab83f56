//! The acquisition-parking ledger (ADR-0042 addendum, ref §5.10): pure helpers
//! the shard keeps across cycles. Same needs only.

use std::collections::HashMap;

/// A Same need whose structural-failure age reached this is parked...
pub const PARK_AFTER_CYCLES: u32 = 8;
/// ...except every this-many cycles of age, when it runs un-parked once (a re-probe).
pub const REPROBE_EVERY_CYCLES: u32 = 32;

/// Ledger key: `cluster \0 group \0 fingerprint`.
pub fn parking_key(cluster: &str, group: &str, fingerprint: &str) -> String {
    let mut k = String::with_capacity(cluster.len() + group.len() + fingerprint.len() + 2);
    k.push_str(cluster);
    k.push('\0');
    k.push_str(group);
    k.push('\0');
    k.push_str(fingerprint);
    k
}

/// Whether a need with this age is parked this cycle.
pub fn is_parked_at(age: u32) -> bool {
    age >= PARK_AFTER_CYCLES && !age.is_multiple_of(REPROBE_EVERY_CYCLES)
}

/// One unsatisfied Same need seen by Phase 1 this cycle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParkingObservation {
    pub key: String,
    /// It acquired something or its chosen domain could satisfy it: the failure
    /// is not structural (a lost race or progress), so its age resets.
    pub progress: bool,
}

/// Ages of Same needs that keep failing structurally.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParkingLedger {
    ages: HashMap<String, u32>,
}

impl ParkingLedger {
    pub fn new() -> Self {
        Self::default()
    }

    /// Current age of a key (0 when absent).
    pub fn age(&self, key: &str) -> u32 {
        self.ages.get(key).copied().unwrap_or(0)
    }

    /// Whether the need with this key is parked this cycle.
    pub fn is_parked(&self, key: &str) -> bool {
        is_parked_at(self.age(key))
    }

    /// Applies one cycle's observations: progress deletes the age, a structural
    /// failure ages it by one, and every key not observed this cycle is dropped.
    pub fn observe(&mut self, observations: &[ParkingObservation]) {
        let mut next = HashMap::with_capacity(observations.len());
        for o in observations {
            if !o.progress {
                let age = self.age(&o.key).saturating_add(1);
                next.insert(o.key.clone(), age);
            }
        }
        self.ages = next;
    }

    pub fn len(&self) -> usize {
        self.ages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ages.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fail(k: &str) -> ParkingObservation {
        ParkingObservation {
            key: k.to_owned(),
            progress: false,
        }
    }

    #[test]
    fn parks_after_eight_and_reprobes_every_thirty_two() {
        let parked: Vec<u32> = (0..=70).filter(|a| is_parked_at(*a)).collect();
        assert!(!is_parked_at(7));
        assert!(is_parked_at(8));
        assert!(is_parked_at(31));
        assert!(!is_parked_at(32));
        assert!(is_parked_at(33));
        assert!(!is_parked_at(64));
        assert_eq!(parked.len(), 70 - 8 + 1 - 2);
    }

    #[test]
    fn ledger_ages_resets_and_forgets() {
        let mut l = ParkingLedger::new();
        let k = parking_key("c1", "g", "fp");
        assert_eq!(k, "c1\0g\0fp");
        for _ in 0..8 {
            assert!(!l.is_parked(&k));
            l.observe(&[fail(&k)]);
        }
        assert_eq!(l.age(&k), 8);
        assert!(l.is_parked(&k));
        // Progress deletes the age.
        l.observe(&[ParkingObservation {
            key: k.clone(),
            progress: true,
        }]);
        assert_eq!(l.age(&k), 0);
        // Unseen keys vanish.
        l.observe(&[fail(&k), fail("other")]);
        l.observe(&[fail("other")]);
        assert_eq!(l.age(&k), 0);
        assert_eq!(l.age("other"), 2);
        assert_eq!(l.len(), 1);
    }

    #[test]
    fn reprobe_cycle_then_parks_again() {
        let mut l = ParkingLedger::new();
        let k = "k".to_owned();
        let mut parked = Vec::new();
        for _ in 0..40 {
            parked.push(l.is_parked(&k));
            l.observe(&[fail(&k)]);
        }
        // Ages 0..=39 at the start of each cycle.
        assert!(parked[..8].iter().all(|p| !p));
        assert!(parked[8..32].iter().all(|p| *p));
        assert!(!parked[32]);
        assert!(parked[33..].iter().all(|p| *p));
    }
}
