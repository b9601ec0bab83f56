//! The acquisition-parking ledger (ADR-0042 addendum): pure helpers
//! the shard keeps across cycles. Same needs only.
//!
//! The reference counts cycles. A ledger built with [`ParkingLedger::with_timing`]
//! measures the same thresholds in wall-clock time instead (ADR-0105): the
//! shard runs a cycle every `--cycle-interval` *and* on every accepted roll-up,
//! so "8 cycles" can be anything from milliseconds to minutes. Ages in cycles
//! are still kept, for the verdicts' `parked_age_cycles`.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// A Same need whose structural-failure age reached this is parked...
pub const PARK_AFTER_CYCLES: u32 = 8;
/// ...except every this-many cycles of age, when it runs un-parked once (a re-probe).
pub const REPROBE_EVERY_CYCLES: u32 = 32;
/// [`PARK_AFTER_CYCLES`] in time: eight of the shard's default 1 s cycles.
pub const PARK_AFTER: Duration = Duration::from_secs(8);
/// [`REPROBE_EVERY_CYCLES`] in time.
pub const REPROBE_EVERY: Duration = Duration::from_secs(32);

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

/// Whether a need with this age is parked this cycle (the cycle-counting rule).
pub fn is_parked_at(age: u32) -> bool {
    age >= PARK_AFTER_CYCLES && !age.is_multiple_of(REPROBE_EVERY_CYCLES)
}

/// Parking thresholds in wall-clock time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParkingTiming {
    /// Failing structurally this long parks a Same need...
    pub park_after: Duration,
    /// ...and once per this much failing time it runs un-parked for one cycle.
    pub reprobe_every: Duration,
}

impl Default for ParkingTiming {
    fn default() -> Self {
        ParkingTiming {
            park_after: PARK_AFTER,
            reprobe_every: REPROBE_EVERY,
        }
    }
}

/// One unsatisfied Same need seen by Phase 1 this cycle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParkingObservation {
    pub key: String,
    /// It acquired something or its chosen domain could satisfy it: the failure
    /// is not structural (a lost race or progress), so its age resets.
    pub progress: bool,
}

/// When a key started failing, and how many re-probe periods it has used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FailingSince {
    since_unix_nanos: i64,
    probes: u64,
}

/// Ages of Same needs that keep failing structurally.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParkingLedger {
    ages: HashMap<String, u32>,
    /// Set: thresholds are time, not cycles.
    timing: Option<ParkingTiming>,
    since: HashMap<String, FailingSince>,
    /// Keys parked for the cycle [`ParkingLedger::prepare`] was called for.
    parked: HashSet<String>,
    prepared_at: i64,
}

fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

impl ParkingLedger {
    /// A ledger counting cycles (the reference's rule).
    pub fn new() -> Self {
        Self::default()
    }

    /// A ledger measuring its thresholds in time: call
    /// [`ParkingLedger::prepare`] before each cycle and
    /// [`ParkingLedger::observe_at`] after it.
    pub fn with_timing(timing: ParkingTiming) -> Self {
        ParkingLedger {
            timing: Some(timing),
            ..Self::default()
        }
    }

    /// Current age of a key in cycles (0 when absent).
    pub fn age(&self, key: &str) -> u32 {
        self.ages.get(key).copied().unwrap_or(0)
    }

    /// How long a key has been failing at `now` (zero when absent).
    pub fn failing_for(&self, key: &str, now_unix_nanos: i64) -> Duration {
        self.since.get(key).map_or(Duration::ZERO, |f| {
            Duration::from_nanos(
                u64::try_from(now_unix_nanos.saturating_sub(f.since_unix_nanos)).unwrap_or(0),
            )
        })
    }

    /// Whether the need with this key is parked this cycle.
    pub fn is_parked(&self, key: &str) -> bool {
        match self.timing {
            None => is_parked_at(self.age(key)),
            Some(_) => self.parked.contains(key),
        }
    }

    /// Decides, for a timed ledger, which keys are parked in the cycle about
    /// to run at `now`: those failing for at least `park_after`, except that
    /// the first cycle after each further `reprobe_every` of failing time runs
    /// un-parked (at a 1 s cycle: exactly the cycle-counting rule). A no-op
    /// for a cycle-counting ledger.
    pub fn prepare(&mut self, now_unix_nanos: i64) {
        let Some(t) = self.timing else {
            return;
        };
        self.prepared_at = now_unix_nanos;
        self.parked.clear();
        for (key, f) in &mut self.since {
            let failing = now_unix_nanos.saturating_sub(f.since_unix_nanos).max(0);
            if failing < nanos(t.park_after) {
                continue;
            }
            let period = nanos(t.reprobe_every);
            let due = if period > 0 {
                (failing / period) as u64
            } else {
                0
            };
            if due > f.probes {
                f.probes = due;
                continue;
            }
            self.parked.insert(key.clone());
        }
    }

    /// Applies one cycle's observations: progress deletes the age, a structural
    /// failure ages it by one, and every key not observed this cycle is dropped.
    /// A timed ledger takes the time of its last [`ParkingLedger::prepare`].
    pub fn observe(&mut self, observations: &[ParkingObservation]) {
        self.observe_at(observations, self.prepared_at);
    }

    /// [`ParkingLedger::observe`] for the cycle that ran at `now`: a key that
    /// starts failing now is failing since `now`.
    pub fn observe_at(&mut self, observations: &[ParkingObservation], now_unix_nanos: i64) {
        let mut next = HashMap::with_capacity(observations.len());
        let mut since = HashMap::new();
        for o in observations {
            if !o.progress {
                let age = self.age(&o.key).saturating_add(1);
                next.insert(o.key.clone(), age);
                if self.timing.is_some() {
                    let f = self.since.get(&o.key).copied().unwrap_or(FailingSince {
                        since_unix_nanos: now_unix_nanos,
                        probes: 0,
                    });
                    since.insert(o.key.clone(), f);
                }
            }
        }
        self.ages = next;
        self.since = since;
        self.parked.retain(|k| self.ages.contains_key(k));
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

    const SEC: i64 = 1_000_000_000;

    /// One failing key over cycles at `times` (seconds): parked per cycle.
    fn timed_run(times: &[f64]) -> Vec<bool> {
        let mut l = ParkingLedger::with_timing(ParkingTiming::default());
        let k = "k".to_owned();
        times
            .iter()
            .map(|t| {
                let now = (t * SEC as f64) as i64;
                l.prepare(now);
                let parked = l.is_parked(&k);
                l.observe_at(&[fail(&k)], now);
                parked
            })
            .collect()
    }

    #[test]
    fn timed_ledger_at_one_second_cycles_is_the_cycle_rule() {
        let times: Vec<f64> = (0..100).map(f64::from).collect();
        let timed = timed_run(&times);
        let counted: Vec<bool> = (0..100u32).map(is_parked_at).collect();
        assert_eq!(timed, counted);
    }

    #[test]
    fn timed_ledger_ignores_how_many_cycles_ran() {
        // Ten cycles a second (roll-ups waking cycles): the reference would
        // park after 0.8 s; time parks after 8 s.
        let times: Vec<f64> = (0..400).map(|i| f64::from(i) / 10.0).collect();
        let p = timed_run(&times);
        assert!(p[..80].iter().all(|x| !x), "not parked before 8 s");
        assert!(p[80..320].iter().all(|x| *x), "parked from 8 s");
        // One un-parked cycle at 32 s, not a second's worth.
        assert!(!p[320]);
        assert!(p[321..].iter().all(|x| *x));
        // A cycle every 20 s (the reference would not park within 5 cycles):
        // parked from the first cycle 8 s in; the first cycle after each 32 s
        // of failing (32, 64, 96) re-probes.
        let p = timed_run(&[0.0, 20.0, 40.0, 60.0, 80.0, 100.0, 120.0]);
        assert_eq!(p, [false, true, false, true, false, false, true]);
    }

    #[test]
    fn timed_ledger_resets_on_progress_and_forgets_unseen() {
        let mut l = ParkingLedger::with_timing(ParkingTiming::default());
        let k = "k".to_owned();
        l.prepare(0);
        l.observe_at(&[fail(&k)], 0);
        l.prepare(9 * SEC);
        assert!(l.is_parked(&k));
        assert_eq!(l.failing_for(&k, 9 * SEC), Duration::from_secs(9));
        assert_eq!(l.age(&k), 1, "ages still count cycles");
        l.observe_at(
            &[ParkingObservation {
                key: k.clone(),
                progress: true,
            }],
            9 * SEC,
        );
        assert!(!l.is_parked(&k));
        l.prepare(10 * SEC);
        l.observe_at(&[fail(&k)], 10 * SEC);
        l.prepare(17 * SEC);
        assert!(!l.is_parked(&k), "failing since 10 s: 7 s");
        l.observe_at(&[fail(&k)], 17 * SEC);
        l.prepare(18 * SEC);
        assert!(l.is_parked(&k));
        l.observe_at(&[], 18 * SEC);
        assert!(!l.is_parked(&k) && l.is_empty());
        assert_eq!(l.failing_for(&k, 20 * SEC), Duration::ZERO);
    }
}
