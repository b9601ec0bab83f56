//! Dense integer resource vectors for the hot path.
//!
//! Every resource name seen in a cycle (machine capacity, need aggregates and
//! min units) is interned once into a [`Dims`] table sorted by name; after that a
//! vector is a fixed-length slice of milli-units indexed by dimension. A missing
//! dimension is 0, which gives exactly the named-dimension semantics of
//! `ResourceVector` for non-negative capacities (capacities are clamped at 0).

use bigfleet_model::ResourceVector;
use smallvec::SmallVec;
use std::collections::HashSet;

/// An owned dense vector (length = number of dimensions in the cycle).
pub(crate) type Qty = SmallVec<[i64; 6]>;

/// The cycle's resource dimensions, sorted by name.
#[derive(Debug, Default, Clone)]
pub(crate) struct Dims<'a> {
    names: Vec<&'a str>,
}

impl<'a> Dims<'a> {
    /// Builds the table from every vector the cycle will convert, in time linear in the
    /// number of names read (ADR-0104).
    pub(crate) fn collect(vectors: impl IntoIterator<Item = &'a ResourceVector>) -> Dims<'a> {
        // Vectors repeat a handful of names: a linear probe of the few seen so
        // far beats hashing every occurrence. Past LINEAR_NAMES distinct names the probe
        // would make the walk quadratic (demand can name many), so a hash set takes over.
        // It is keyed (std's SipHash): the names come from operators' roll-ups.
        const LINEAR_NAMES: usize = 16;
        let mut names: Vec<&'a str> = Vec::new();
        let mut index: Option<HashSet<&'a str>> = None;
        for v in vectors {
            for (n, _) in v.iter() {
                let new = match &mut index {
                    Some(set) => set.insert(n),
                    None => !names.contains(&n),
                };
                if new {
                    names.push(n);
                    if index.is_none() && names.len() > LINEAR_NAMES {
                        index = Some(names.iter().copied().collect());
                    }
                }
            }
        }
        names.sort_unstable();
        Dims { names }
    }

    pub(crate) fn len(&self) -> usize {
        self.names.len()
    }

    pub(crate) fn zero(&self) -> Qty {
        SmallVec::from_elem(0, self.names.len())
    }

    /// Dense form of `v`. Both sides are sorted by name, so this is a merge walk.
    /// Names unknown to the table are ignored (callers collect every vector first).
    pub(crate) fn dense(&self, v: &ResourceVector) -> Qty {
        let mut out = self.zero();
        let mut i = 0;
        for (name, milli) in v.iter() {
            while i < self.names.len() && self.names[i] < name {
                i += 1;
            }
            if i < self.names.len() && self.names[i] == name {
                out[i] = milli;
            }
        }
        out
    }

    /// Dense capacity: like [`Self::dense`] but negative capacities read as 0.
    pub(crate) fn dense_capacity(&self, v: &ResourceVector) -> Qty {
        let mut q = self.dense(v);
        for x in q.iter_mut() {
            *x = (*x).max(0);
        }
        q
    }

    /// Back to the model type, keeping only positive dimensions.
    pub(crate) fn to_vector(&self, q: &[i64]) -> ResourceVector {
        ResourceVector::from_milli(
            q.iter()
                .enumerate()
                .filter(|(_, v)| **v > 0)
                .map(|(i, v)| (self.names[i], *v)),
        )
    }
}

/// `have` covers `want` in every dimension.
#[inline]
pub(crate) fn covers(have: &[i64], want: &[i64]) -> bool {
    have.iter().zip(want).all(|(h, w)| h >= w)
}

/// Every dimension `<= 0`.
#[inline]
pub(crate) fn is_zero(v: &[i64]) -> bool {
    v.iter().all(|x| *x <= 0)
}

/// `acc = max(0, acc - b)` per dimension (deficit arithmetic).
#[inline]
pub(crate) fn sub_assign(acc: &mut [i64], b: &[i64]) {
    for (a, b) in acc.iter_mut().zip(b) {
        *a = a.saturating_sub(*b).max(0);
    }
}

/// How many subtractions of `b` (with [`sub_assign`]) bring `acc` to zero:
/// the largest per-dimension ceiling quotient; `u64::MAX` when a positive
/// dimension of `acc` is not reduced by `b` at all.
pub(crate) fn units_to_cover(acc: &[i64], b: &[i64]) -> u64 {
    let mut k = 0u64;
    for (&a, &b) in acc.iter().zip(b) {
        if a <= 0 {
            continue;
        }
        if b <= 0 {
            return u64::MAX;
        }
        k = k.max((a as u64).div_ceil(b as u64));
    }
    k
}

/// [`sub_assign`] applied `k ≥ 1` times, in one step (exact for the
/// non-negative capacities it is used with: every step floors at zero).
#[inline]
pub(crate) fn sub_assign_times(acc: &mut [i64], b: &[i64], k: i64) {
    for (a, b) in acc.iter_mut().zip(b) {
        debug_assert!(*b >= 0, "capacities are clamped at zero");
        *a = a.saturating_sub(b.saturating_mul(k)).max(0);
    }
}

/// `acc += b` per dimension, saturating.
#[inline]
pub(crate) fn add_assign(acc: &mut [i64], b: &[i64]) {
    for (a, b) in acc.iter_mut().zip(b) {
        *a = a.saturating_add(*b);
    }
}

/// `acc += b × n` per dimension, saturating.
#[inline]
pub(crate) fn add_scaled(acc: &mut [i64], b: &[i64], n: u32) {
    for (a, b) in acc.iter_mut().zip(b) {
        *a = a.saturating_add(b.saturating_mul(i64::from(n)));
    }
}

/// The Same-bucket score: Σ over dimensions with a positive deficit of
/// `have / deficit`, each ratio capped at 1 when `capped`. Summed in dimension
/// (name) order so the float result is reproducible.
pub(crate) fn score(have: &[i64], deficit: &[i64], capped: bool) -> f64 {
    let mut s = 0.0;
    for (h, d) in have.iter().zip(deficit) {
        if *d > 0 {
            let mut r = (*h).max(0) as f64 / *d as f64;
            if capped && r > 1.0 {
                r = 1.0;
            }
            s += r;
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rv(pairs: &[(&str, i64)]) -> ResourceVector {
        ResourceVector::from_milli(pairs.iter().map(|(n, v)| (*n, *v)))
    }

    #[test]
    fn dense_round_trip_and_ops() {
        let a = rv(&[("cpu", 4000), ("memory", 8)]);
        let b = rv(&[("cpu", 1000), ("nvidia.com/gpu", 1000)]);
        let dims = Dims::collect([&a, &b]);
        assert_eq!(dims.len(), 3);
        assert_eq!(dims.names[0], "cpu");
        let da = dims.dense(&a);
        let db = dims.dense(&b);
        assert_eq!(da.as_slice(), &[4000, 8, 0]);
        assert!(!covers(&da, &db));
        let mut r = da.clone();
        sub_assign(&mut r, &db);
        assert_eq!(r.as_slice(), &[3000, 8, 0]);
        assert_eq!(dims.to_vector(&r), rv(&[("cpu", 3000), ("memory", 8)]));
        let mut s = dims.zero();
        add_scaled(&mut s, &db, 3);
        assert_eq!(s.as_slice(), &[3000, 0, 3000]);
        assert!(is_zero(&dims.zero()));
        assert!(!is_zero(&s));
    }

    proptest::proptest! {
        /// The one-step run arithmetic equals subtracting one unit at a time
        /// until covered (or `limit` units, whichever comes first).
        #[test]
        fn run_arithmetic_matches_unit_steps(
            acc in proptest::collection::vec(-50i64..5_000, 1..4),
            cap in proptest::collection::vec(0i64..700, 4),
            limit in 0u64..40,
        ) {
            let cap = &cap[..acc.len()];
            let mut stepped = acc.clone();
            let mut steps = 0u64;
            while steps < limit && !is_zero(&stepped) {
                sub_assign(&mut stepped, cap);
                steps += 1;
            }
            let k = units_to_cover(&acc, cap).min(limit);
            let mut run = acc.clone();
            if k > 0 {
                sub_assign_times(&mut run, cap, k as i64);
            }
            proptest::prop_assert_eq!(k, steps);
            proptest::prop_assert_eq!(run, stepped);
        }
    }

    /// Many distinct names (far past the linear probe) are each collected once, sorted,
    /// and repeats across vectors do not add columns.
    #[test]
    fn collects_many_distinct_names_once() {
        let vs: Vec<ResourceVector> = (0..100_000)
            .map(|i| rv(&[("cpu", 1), (&format!("example.com/r{i:06}"), 1)]))
            .collect();
        let dims = Dims::collect(vs.iter().chain(vs.iter()));
        assert_eq!(dims.len(), 100_001);
        assert!(dims.names.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(dims.names[0], "cpu");
        assert_eq!(dims.dense(&vs[7]).iter().sum::<i64>(), 2);
    }

    proptest::proptest! {
        /// The table is the sorted distinct names, whatever the mix of few and many.
        #[test]
        fn collect_is_sorted_distinct_names(
            names in proptest::collection::vec(proptest::collection::vec(0u32..60, 0..6), 0..40),
        ) {
            let vs: Vec<ResourceVector> = names
                .iter()
                .map(|ns| ResourceVector::from_milli(ns.iter().map(|n| (format!("d{n}"), 1))))
                .collect();
            let mut want: Vec<String> = names.iter().flatten().map(|n| format!("d{n}")).collect();
            want.sort();
            want.dedup();
            let dims = Dims::collect(&vs);
            proptest::prop_assert_eq!(dims.names, want);
        }
    }

    #[test]
    fn capacity_clamps_negative() {
        let a = rv(&[("cpu", -5)]);
        let dims = Dims::collect([&a]);
        assert_eq!(dims.dense_capacity(&a).as_slice(), &[0]);
        assert_eq!(dims.dense(&a).as_slice(), &[-5]);
    }

    #[test]
    fn score_caps_and_skips_satisfied_dims() {
        assert_eq!(score(&[6, 1], &[3, 0], false), 2.0);
        assert_eq!(score(&[6, 1], &[3, 0], true), 1.0);
        assert_eq!(score(&[1, 1], &[2, 4], true), 0.75);
    }
}
