//! Profile: the aggregation key of demand, canonicalised, with its fingerprint.

use crate::bucket::PenaltyBucket;
use crate::machine::{Machine, MachineProfile};
use crate::requirement::{
    Requirement, TopologySpread, matches_requirements, pinned_instance_types, same_requirement,
    strict_spread,
};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::hash::{Hash, Hasher};

/// Phase 1 conflict order: compare lexicographically, higher wins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Precedence {
    pub priority: i32,
    pub interruption_bucket: u8,
    pub reclamation_bucket: u8,
}

/// Requirements + spread + priority + both penalty buckets, with no resource
/// shape (ADR-0027). Immutable and canonical: requirement values sorted,
/// requirements fully sorted by (key, operator, values), spread sorted by
/// (topology key, skew, mode). Equal profiles ⇔ equal fingerprints.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(from = "ProfileParts", into = "ProfileParts")]
pub struct Profile {
    requirements: Vec<Requirement>,
    spread: Vec<TopologySpread>,
    priority: i32,
    interruption_bucket: PenaltyBucket,
    reclamation_bucket: PenaltyBucket,
    fingerprint: String,
}

#[derive(Serialize, Deserialize)]
struct ProfileParts {
    requirements: Vec<Requirement>,
    spread: Vec<TopologySpread>,
    priority: i32,
    interruption_bucket: PenaltyBucket,
    reclamation_bucket: PenaltyBucket,
}

impl From<ProfileParts> for Profile {
    fn from(p: ProfileParts) -> Self {
        Profile::new(
            p.requirements,
            p.spread,
            p.priority,
            p.interruption_bucket,
            p.reclamation_bucket,
        )
    }
}

impl From<Profile> for ProfileParts {
    fn from(p: Profile) -> Self {
        ProfileParts {
            requirements: p.requirements,
            spread: p.spread,
            priority: p.priority,
            interruption_bucket: p.interruption_bucket,
            reclamation_bucket: p.reclamation_bucket,
        }
    }
}

impl Profile {
    /// Canonicalises and fingerprints.
    pub fn new(
        mut requirements: Vec<Requirement>,
        mut spread: Vec<TopologySpread>,
        priority: i32,
        interruption_bucket: PenaltyBucket,
        reclamation_bucket: PenaltyBucket,
    ) -> Profile {
        requirements.sort_by(Requirement::canonical_cmp);
        spread.sort_by(TopologySpread::canonical_cmp);
        let fingerprint = fingerprint(
            &requirements,
            &spread,
            priority,
            interruption_bucket,
            reclamation_bucket,
        );
        Profile {
            requirements,
            spread,
            priority,
            interruption_bucket,
            reclamation_bucket,
            fingerprint,
        }
    }

    /// Canonically ordered requirements.
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    /// Canonically ordered spread constraints.
    pub fn spread(&self) -> &[TopologySpread] {
        &self.spread
    }

    pub fn priority(&self) -> i32 {
        self.priority
    }

    pub fn interruption_bucket(&self) -> PenaltyBucket {
        self.interruption_bucket
    }

    pub fn reclamation_bucket(&self) -> PenaltyBucket {
        self.reclamation_bucket
    }

    /// `upper_bound_dollars` of the interruption bucket (what machines are stamped with).
    pub fn interruption_penalty_dollars(&self) -> f64 {
        self.interruption_bucket.upper_bound_dollars()
    }

    /// `upper_bound_dollars` of the reclamation bucket (what machines are stamped with).
    pub fn reclamation_penalty_dollars(&self) -> f64 {
        self.reclamation_bucket.upper_bound_dollars()
    }

    /// The exact reference format:
    /// `p=<prio>|ipb=<ord>|rpb=<ord>|reqs=<key>:<op>:<v1,v2>;...|spr=<key>:<skew>:<mode>;...`
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// (priority, interruption bucket ordinal, reclamation bucket ordinal).
    pub fn precedence(&self) -> Precedence {
        Precedence {
            priority: self.priority,
            interruption_bucket: self.interruption_bucket.ordinal(),
            reclamation_bucket: self.reclamation_bucket.ordinal(),
        }
    }

    /// Every requirement matches this machine profile.
    pub fn matches_profile(&self, machine: &MachineProfile) -> bool {
        matches_requirements(&self.requirements, machine)
    }

    /// Every requirement matches this machine (the reference's `MatchProfile`).
    pub fn matches(&self, machine: &Machine) -> bool {
        self.matches_profile(&machine.profile)
    }

    /// Pinned instance types (see [`pinned_instance_types`]).
    pub fn pinned_instance_types(&self) -> Option<&[String]> {
        pinned_instance_types(&self.requirements)
    }

    /// The first `Same` requirement, if any.
    pub fn same_requirement(&self) -> Option<&Requirement> {
        same_requirement(&self.requirements)
    }

    /// Key of the first `Same` requirement (the co-location domain key).
    pub fn same_requirement_key(&self) -> Option<&str> {
        self.same_requirement().map(Requirement::key)
    }

    /// The first `DoNotSchedule` spread, if any.
    pub fn strict_spread(&self) -> Option<&TopologySpread> {
        strict_spread(&self.spread)
    }
}

fn fingerprint(
    requirements: &[Requirement],
    spread: &[TopologySpread],
    priority: i32,
    ipb: PenaltyBucket,
    rpb: PenaltyBucket,
) -> String {
    let mut s = String::with_capacity(32 + 48 * requirements.len() + 32 * spread.len());
    // Writing to a String cannot fail.
    let _ = write!(
        s,
        "p={priority}|ipb={}|rpb={}|reqs=",
        ipb.ordinal(),
        rpb.ordinal()
    );
    for r in requirements {
        let _ = write!(s, "{r};");
    }
    s.push_str("|spr=");
    for sp in spread {
        let _ = write!(s, "{sp};");
    }
    s
}

impl AsRef<Profile> for Profile {
    fn as_ref(&self) -> &Profile {
        self
    }
}

impl PartialEq for Profile {
    fn eq(&self, other: &Self) -> bool {
        // The fingerprint is injective over canonical profiles only when keys and
        // values avoid the separators, so compare the fields themselves.
        self.priority == other.priority
            && self.interruption_bucket == other.interruption_bucket
            && self.reclamation_bucket == other.reclamation_bucket
            && self.requirements == other.requirements
            && self.spread == other.spread
    }
}

impl Eq for Profile {}

impl Hash for Profile {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.fingerprint.hash(state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::requirement::{INSTANCE_TYPE_KEY, Operator, WhenUnsatisfiable};
    use PenaltyBucket::*;
    use proptest::prelude::*;

    fn req(key: &str, op: Operator, values: &[&str]) -> Requirement {
        Requirement::new(key, op, values.iter().copied())
    }

    fn spread(key: &str, skew: i32, mode: WhenUnsatisfiable) -> TopologySpread {
        TopologySpread {
            topology_key: key.into(),
            max_skew: skew,
            when_unsatisfiable: mode,
        }
    }

    #[test]
    fn fingerprint_exact_format() {
        let p = Profile::new(
            vec![
                req("rack", Operator::Same, &[]),
                req(INSTANCE_TYPE_KEY, Operator::In, &["p5", "a100"]),
                req("rack", Operator::Exists, &[]),
            ],
            vec![
                spread("zone", 1, WhenUnsatisfiable::DoNotSchedule),
                spread("host", 2, WhenUnsatisfiable::ScheduleAnyway),
            ],
            1_000_000,
            B8192,
            HalfDollar,
        );
        assert_eq!(
            p.fingerprint(),
            "p=1000000|ipb=16|rpb=2|reqs=node.kubernetes.io/instance-type:1:a100,p5;\
             rack:3:;rack:5:;|spr=host:2:2;zone:1:1;"
        );
        let empty = Profile::new(vec![], vec![], -5, Unspecified, Zero);
        assert_eq!(empty.fingerprint(), "p=-5|ipb=0|rpb=1|reqs=|spr=");
    }

    #[test]
    fn accessors() {
        let p = Profile::new(
            vec![
                req("zone", Operator::Same, &[]),
                req(INSTANCE_TYPE_KEY, Operator::In, &["b", "a"]),
            ],
            vec![spread("zone", 1, WhenUnsatisfiable::DoNotSchedule)],
            7,
            B2,
            Pinned,
        );
        assert_eq!(p.pinned_instance_types().unwrap(), ["a", "b"]);
        assert_eq!(p.same_requirement_key(), Some("zone"));
        assert_eq!(p.strict_spread().map(|s| s.max_skew), Some(1));
        assert_eq!(p.interruption_penalty_dollars(), 2.0);
        assert_eq!(p.reclamation_penalty_dollars(), f64::INFINITY);
        assert_eq!(p.requirements()[0].key(), INSTANCE_TYPE_KEY);
    }

    #[test]
    fn precedence_is_lexicographic() {
        let p = |prio, ipb, rpb| Profile::new(vec![], vec![], prio, ipb, rpb).precedence();
        assert!(p(2, Zero, Zero) > p(1, Pinned, Pinned));
        assert!(p(1, B2, Zero) > p(1, B1, Pinned));
        assert!(p(1, B2, B4) > p(1, B2, B2));
        assert_eq!(p(1, B2, B4), p(1, B2, B4));
    }

    #[test]
    fn serde_recanonicalises() {
        let p = Profile::new(
            vec![
                req("b", Operator::In, &["y", "x"]),
                req("a", Operator::Exists, &[]),
            ],
            vec![],
            3,
            B1,
            B2,
        );
        let json = serde_json::to_string(&p).unwrap();
        let back: Profile = serde_json::from_str(&json).unwrap();
        assert_eq!(back, p);
        assert_eq!(back.fingerprint(), p.fingerprint());
    }

    fn arb_req() -> impl Strategy<Value = (String, u8, Vec<String>)> {
        ("[a-c]", 0u8..6, proptest::collection::vec("[x-z]", 0..3)).prop_map(|(k, o, v)| (k, o, v))
    }

    fn build(
        reqs: &[(String, u8, Vec<String>)],
        spreads: &[(String, i32, u8)],
        prio: i32,
    ) -> Profile {
        Profile::new(
            reqs.iter()
                .map(|(k, o, v)| {
                    Requirement::new(
                        k.clone(),
                        Operator::from_ordinal((*o).into()).unwrap(),
                        v.clone(),
                    )
                })
                .collect(),
            spreads
                .iter()
                .map(|(k, s, w)| TopologySpread {
                    topology_key: k.clone(),
                    max_skew: *s,
                    when_unsatisfiable: WhenUnsatisfiable::from_ordinal((*w).into()).unwrap(),
                })
                .collect(),
            prio,
            B4,
            Zero,
        )
    }

    proptest! {
        #[test]
        fn fingerprint_ignores_every_order(
            reqs in proptest::collection::vec(arb_req(), 0..6),
            spreads in proptest::collection::vec(("[a-c]", 0i32..3, 0u8..3), 0..4),
            prio in any::<i32>(),
            seed in any::<u64>(),
        ) {
            let original = build(&reqs, &spreads, prio);
            // Permute requirements, each requirement's values and the spread list.
            let mut rng = seed;
            let mut next = move || { rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); (rng >> 33) as usize };
            let mut shuffled = reqs.clone();
            for i in (1..shuffled.len()).rev() { let j = next() % (i + 1); shuffled.swap(i, j); }
            for r in &mut shuffled { r.2.reverse(); }
            let mut spreads2 = spreads.clone();
            spreads2.reverse();
            let permuted = build(&shuffled, &spreads2, prio);
            prop_assert_eq!(original.fingerprint(), permuted.fingerprint());
            prop_assert_eq!(&original, &permuted);
        }

        #[test]
        fn equal_fingerprints_iff_equal_profiles(
            a in proptest::collection::vec(arb_req(), 0..3),
            b in proptest::collection::vec(arb_req(), 0..3),
            pa in 0i32..2,
            pb in 0i32..2,
        ) {
            let (x, y) = (build(&a, &[], pa), build(&b, &[], pb));
            prop_assert_eq!(x.fingerprint() == y.fingerprint(), x == y);
        }
    }
}
