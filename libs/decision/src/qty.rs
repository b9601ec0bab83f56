//! Dense integer resource vectors for the hot path.
//!
//! Every resource name seen in a cycle (machine capacity, need aggregates and
//! min units) is interned once into a [`Dims`] table sorted by name; after that a
//! vector is a fixed-length slice of milli-units indexed by dimension. A missing
//! dimension is 0, which gives exactly the named-dimension semantics of
//! `ResourceVector` for non-negative capacities (capacities are clamped at 0).

use bigfleet_model::ResourceVector;
use smallvec::SmallVec;

/// An owned dense vector (length = number of dimensions in the cycle).
pub(crate) type Qty = SmallVec<[i64; 6]>;

/// The cycle's resource dimensions, sorted by name.
#[derive(Debug, Clone)]
pub(crate) struct Dims<'a> {
    names: Vec<&'a str>,
    /// Dimension index by a cheap digest of the name ([`slot`]): every demand vector is
    /// converted each cycle, and one table read plus one equality check per entry costs
    /// less than walking the sorted names with string comparisons.
    slots: [u16; SLOTS],
}

impl Default for Dims<'_> {
    fn default() -> Self {
        Dims::from_sorted(Vec::new())
    }
}

const SLOTS: usize = 256;
/// No dimension's name falls in this slot.
const EMPTY: u16 = u16::MAX;
/// Several do: search the names.
const SHARED: u16 = u16::MAX - 1;

/// The digest: length and first and last bytes.
#[inline]
fn slot(name: &str) -> usize {
    let b = name.as_bytes();
    let (first, last) = (b.first().copied(), b.last().copied());
    let h = (b.len() as u32)
        .wrapping_mul(31)
        .wrapping_add(u32::from(first.unwrap_or(0)).wrapping_mul(7))
        .wrapping_add(u32::from(last.unwrap_or(0)).wrapping_mul(131));
    (h as usize) % SLOTS
}

impl<'a> Dims<'a> {
    /// Builds the table from every vector the cycle will convert, in time linear in the
    /// number of names read (ADR-0104).
    pub(crate) fn collect(vectors: impl IntoIterator<Item = &'a ResourceVector>) -> Dims<'a> {
        Dims::from_sorted(bigfleet_model::distinct_names(vectors))
    }

    fn from_sorted(names: Vec<&'a str>) -> Dims<'a> {
        let mut slots = [EMPTY; SLOTS];
        for (i, n) in names.iter().enumerate() {
            let s = &mut slots[slot(n)];
            // More names than u16 indexes (never in practice: ADR-0104 bounds them) or a
            // shared slot: the lookup falls back to a search.
            *s = match (*s, u16::try_from(i)) {
                (EMPTY, Ok(i)) if i < SHARED => i,
                _ => SHARED,
            };
        }
        Dims { names, slots }
    }

    /// The index of `name`, if it is a dimension.
    #[inline]
    fn index(&self, name: &str) -> Option<usize> {
        match self.slots[slot(name)] {
            EMPTY => None,
            SHARED => self.names.binary_search(&name).ok(),
            i => (self.names[usize::from(i)] == name).then_some(usize::from(i)),
        }
    }

    /// [`Self::collect`] over `vectors`, plus `names`.
    pub(crate) fn collect_with(
        vectors: impl IntoIterator<Item = &'a ResourceVector>,
        names: impl IntoIterator<Item = &'a str>,
    ) -> Dims<'a> {
        let mut all = Self::collect(vectors).names;
        all.extend(names);
        all.sort_unstable();
        all.dedup();
        Dims::from_sorted(all)
    }

    pub(crate) fn len(&self) -> usize {
        self.names.len()
    }

    pub(crate) fn zero(&self) -> Qty {
        SmallVec::from_elem(0, self.names.len())
    }

    /// Dense form of `v`. Names unknown to the table are ignored (callers collect
    /// every vector first).
    pub(crate) fn dense(&self, v: &ResourceVector) -> Qty {
        let mut out = self.zero();
        for (name, milli) in v.iter() {
            if let Some(i) = self.index(name) {
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

    proptest::proptest! {
        /// The slot lookup converts exactly like a search of the names, whatever the
        /// names (short alphabets make shared and empty slots common).
        #[test]
        fn dense_equals_a_search_of_the_names(
            table in proptest::collection::vec("[ab.]{0,4}", 0..12),
            picks in proptest::collection::vec((0usize..12, 1i64..100), 0..6),
            others in proptest::collection::vec(("[ab.c]{0,4}", 1i64..100), 0..3),
        ) {
            let tv = ResourceVector::from_milli(table.iter().map(|n| (n.as_str(), 1)));
            let dims = Dims::collect([&tv]);
            // Mostly names the table has (found through shared slots too), some it may not.
            let known = picks
                .iter()
                .filter(|_| !table.is_empty())
                .map(|(i, m)| (table[i % table.len()].as_str(), *m));
            let v = ResourceVector::from_milli(
                known.chain(others.iter().map(|(n, m)| (n.as_str(), *m))),
            );
            let mut want = dims.zero();
            for (name, milli) in v.iter() {
                if let Some(i) = dims.names.iter().position(|d| *d == name) {
                    want[i] = milli;
                }
            }
            proptest::prop_assert_eq!(dims.dense(&v), want);
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
