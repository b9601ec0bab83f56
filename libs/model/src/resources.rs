//! Resource vectors: named dimensions of integer milli-units.

use crate::quantity::{QuantityError, format_milli, parse_quantity};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::fmt;

/// A quantity map entry that failed to parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("resource {name:?}: {source}")]
pub struct ResourceError {
    pub name: String,
    #[source]
    pub source: QuantityError,
}

/// A resource vector: `(name, milli-units)` pairs sorted by name, names unique.
/// A missing dimension reads as 0. Arithmetic saturates instead of overflowing,
/// because these values come from the network.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(from = "BTreeMap<String, i64>", into = "BTreeMap<String, i64>")]
pub struct ResourceVector {
    dims: Vec<(String, i64)>,
}

impl ResourceVector {
    /// The empty vector.
    pub const fn new() -> Self {
        ResourceVector { dims: Vec::new() }
    }

    /// Builds from `(name, milli)` pairs in any order; repeated names are summed.
    pub fn from_milli<N: Into<String>>(pairs: impl IntoIterator<Item = (N, i64)>) -> Self {
        let mut dims: Vec<(String, i64)> = pairs.into_iter().map(|(n, v)| (n.into(), v)).collect();
        dims.sort_by(|a, b| a.0.cmp(&b.0));
        dims.dedup_by(|later, kept| {
            if later.0 == kept.0 {
                kept.1 = kept.1.saturating_add(later.1);
                true
            } else {
                false
            }
        });
        ResourceVector { dims }
    }

    /// Parses a map of Kubernetes quantity strings (`{"cpu": "500m"}`). The first
    /// unparseable entry (in name order) is the error.
    pub fn parse<K, V>(map: impl IntoIterator<Item = (K, V)>) -> Result<Self, ResourceError>
    where
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut parsed: Vec<(String, i64)> = Vec::new();
        let mut first_error: Option<ResourceError> = None;
        for (k, v) in map {
            let name = k.as_ref();
            match parse_quantity(v.as_ref()) {
                Ok(milli) => parsed.push((name.to_owned(), milli)),
                Err(source) => {
                    // Keep the error deterministic for unordered (hash) maps.
                    if first_error.as_ref().is_none_or(|e| name < e.name.as_str()) {
                        first_error = Some(ResourceError {
                            name: name.to_owned(),
                            source,
                        });
                    }
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(Self::from_milli(parsed)),
        }
    }

    /// Canonical quantity strings, e.g. for the wire.
    pub fn to_quantity_map(&self) -> BTreeMap<String, String> {
        self.dims
            .iter()
            .map(|(n, v)| (n.clone(), format_milli(*v)))
            .collect()
    }

    /// The value of one dimension (0 when absent).
    pub fn get(&self, name: &str) -> i64 {
        match self.dims.binary_search_by(|(n, _)| n.as_str().cmp(name)) {
            Ok(i) => self.dims[i].1,
            Err(_) => 0,
        }
    }

    /// Sets one dimension, inserting it if needed.
    pub fn set(&mut self, name: &str, milli: i64) {
        match self.dims.binary_search_by(|(n, _)| n.as_str().cmp(name)) {
            Ok(i) => self.dims[i].1 = milli,
            Err(i) => self.dims.insert(i, (name.to_owned(), milli)),
        }
    }

    /// The dimensions in name order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, i64)> + '_ {
        self.dims.iter().map(|(n, v)| (n.as_str(), *v))
    }

    /// Number of named dimensions (including zero-valued ones).
    pub fn len(&self) -> usize {
        self.dims.len()
    }

    /// No named dimensions at all (see [`Self::is_zero`] for "nothing requested").
    pub fn is_empty(&self) -> bool {
        self.dims.is_empty()
    }

    /// Every dimension `<= 0` (the empty vector is zero).
    pub fn is_zero(&self) -> bool {
        self.dims.iter().all(|(_, v)| *v <= 0)
    }

    /// `have.covers(want)`: for every dimension named in `want`, `have >= want`.
    /// Dimensions only in `have` are ignored; an empty `want` is always covered.
    pub fn covers(&self, want: &ResourceVector) -> bool {
        want.dims.iter().all(|(n, w)| self.get(n) >= *w)
    }

    /// Per-dimension sum over the union of names.
    pub fn add(&self, other: &ResourceVector) -> ResourceVector {
        self.zip_with(other, i64::saturating_add)
    }

    /// In-place [`Self::add`].
    pub fn add_assign(&mut self, other: &ResourceVector) {
        *self = self.add(other);
    }

    /// Per-dimension `self - other`, floored at 0, over the union of names
    /// (deficit arithmetic: "what is still missing").
    pub fn saturating_sub(&self, other: &ResourceVector) -> ResourceVector {
        self.zip_with(other, |a, b| a.saturating_sub(b).max(0))
    }

    /// Per-dimension maximum over the union of names (MinUnit folding).
    pub fn max(&self, other: &ResourceVector) -> ResourceVector {
        self.zip_with(other, i64::max)
    }

    /// `self × n`; empty when `n <= 0`.
    pub fn scale(&self, n: i64) -> ResourceVector {
        if n <= 0 {
            return ResourceVector::new();
        }
        ResourceVector {
            dims: self
                .dims
                .iter()
                .map(|(name, v)| (name.clone(), v.saturating_mul(n)))
                .collect(),
        }
    }

    /// Merge-join of two sorted vectors; a dimension missing on one side is 0.
    fn zip_with(&self, other: &ResourceVector, f: impl Fn(i64, i64) -> i64) -> ResourceVector {
        let (a, b) = (&self.dims, &other.dims);
        let mut out = Vec::with_capacity(a.len().max(b.len()));
        let (mut i, mut j) = (0, 0);
        while i < a.len() || j < b.len() {
            let ord = match (a.get(i), b.get(j)) {
                (Some(x), Some(y)) => x.0.cmp(&y.0),
                (Some(_), None) => std::cmp::Ordering::Less,
                _ => std::cmp::Ordering::Greater,
            };
            match ord {
                std::cmp::Ordering::Less => {
                    out.push((a[i].0.clone(), f(a[i].1, 0)));
                    i += 1;
                }
                std::cmp::Ordering::Greater => {
                    out.push((b[j].0.clone(), f(0, b[j].1)));
                    j += 1;
                }
                std::cmp::Ordering::Equal => {
                    out.push((a[i].0.clone(), f(a[i].1, b[j].1)));
                    i += 1;
                    j += 1;
                }
            }
        }
        ResourceVector { dims: out }
    }
}

/// The distinct dimension names of `vectors`, sorted, in time linear in the names read.
///
/// Vectors repeat a handful of names: a linear probe of the few seen so far beats hashing
/// every occurrence. Past a few distinct names the probe would make the walk quadratic
/// (demand can name many, ADR-0104), so a hash set takes over; it is keyed (std's SipHash)
/// because the names come from operators' roll-ups.
pub fn distinct_names<'a>(vectors: impl IntoIterator<Item = &'a ResourceVector>) -> Vec<&'a str> {
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
    names
}

impl From<BTreeMap<String, i64>> for ResourceVector {
    fn from(map: BTreeMap<String, i64>) -> Self {
        ResourceVector {
            dims: map.into_iter().collect(),
        }
    }
}

impl From<ResourceVector> for BTreeMap<String, i64> {
    fn from(v: ResourceVector) -> Self {
        v.dims.into_iter().collect()
    }
}

impl<N: Into<String>> FromIterator<(N, i64)> for ResourceVector {
    fn from_iter<T: IntoIterator<Item = (N, i64)>>(iter: T) -> Self {
        ResourceVector::from_milli(iter)
    }
}

impl fmt::Display for ResourceVector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        for (i, (n, v)) in self.dims.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{n}: {}", format_milli(*v))?;
        }
        f.write_str("}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quantity::QuantityError;
    use proptest::prelude::*;

    fn rv(pairs: &[(&str, i64)]) -> ResourceVector {
        ResourceVector::from_milli(pairs.iter().map(|&(n, v)| (n, v)))
    }

    proptest! {
        /// The sorted distinct names, whether few (the linear probe) or many (past it, the
        /// hash set), and however they repeat across vectors.
        #[test]
        fn distinct_names_are_sorted_and_each_once(
            names in prop::collection::vec(prop::collection::vec(0u32..60, 0..6), 0..40),
        ) {
            let vs: Vec<ResourceVector> = names
                .iter()
                .map(|ns| ResourceVector::from_milli(ns.iter().map(|n| (format!("d{n:02}"), 1))))
                .collect();
            let mut want: Vec<String> = names.iter().flatten().map(|n| format!("d{n:02}")).collect();
            want.sort();
            want.dedup();
            prop_assert_eq!(distinct_names(&vs), want);
        }
    }

    #[test]
    fn parse_sorts_and_reads_quantities() {
        let v =
            ResourceVector::parse([("memory", "768Gi"), ("cpu", "96"), ("nvidia.com/gpu", "8")])
                .unwrap();
        let names: Vec<_> = v.iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["cpu", "memory", "nvidia.com/gpu"]);
        assert_eq!(v.get("cpu"), 96_000);
        assert_eq!(v.get("memory"), 768 * 1_073_741_824_000);
        assert_eq!(v.get("absent"), 0);
    }

    #[test]
    fn parse_error_names_the_first_bad_dimension() {
        let err =
            ResourceVector::parse([("zeta", "x"), ("cpu", "1"), ("alpha", "1..")]).unwrap_err();
        assert_eq!(err.name, "alpha");
        assert!(matches!(err.source, QuantityError::UnknownSuffix { .. }));
        assert!(err.to_string().contains("alpha"));
    }

    #[test]
    fn from_milli_sums_repeats() {
        assert_eq!(rv(&[("cpu", 1), ("cpu", 2)]), rv(&[("cpu", 3)]));
    }

    #[test]
    fn arithmetic() {
        let a = rv(&[("cpu", 4000), ("mem", 100)]);
        let b = rv(&[("cpu", 1000), ("gpu", 8000)]);
        assert_eq!(a.add(&b), rv(&[("cpu", 5000), ("gpu", 8000), ("mem", 100)]));
        assert_eq!(
            a.saturating_sub(&b),
            rv(&[("cpu", 3000), ("gpu", 0), ("mem", 100)])
        );
        assert_eq!(
            b.saturating_sub(&a),
            rv(&[("cpu", 0), ("gpu", 8000), ("mem", 0)])
        );
        assert_eq!(a.max(&b), rv(&[("cpu", 4000), ("gpu", 8000), ("mem", 100)]));
        assert_eq!(a.scale(3), rv(&[("cpu", 12000), ("mem", 300)]));
        assert!(a.scale(0).is_empty());
        assert!(a.scale(-1).is_empty());
        let mut c = a.clone();
        c.add_assign(&b);
        assert_eq!(c, a.add(&b));
        c.set("cpu", 1);
        c.set("aaa", 2);
        assert_eq!(c.get("cpu"), 1);
        assert_eq!(c.iter().next(), Some(("aaa", 2)));
    }

    #[test]
    fn covers_and_is_zero() {
        let have = rv(&[("cpu", 4000), ("mem", 100)]);
        assert!(have.covers(&rv(&[("cpu", 4000)])));
        assert!(!have.covers(&rv(&[("cpu", 4001)])));
        assert!(!have.covers(&rv(&[("gpu", 1)])));
        assert!(have.covers(&rv(&[("gpu", 0)])));
        assert!(have.covers(&ResourceVector::new()));
        assert!(ResourceVector::new().is_zero());
        assert!(rv(&[("cpu", 0), ("mem", -5)]).is_zero());
        assert!(!rv(&[("cpu", 0), ("mem", 1)]).is_zero());
    }

    #[test]
    fn saturates_instead_of_overflowing() {
        let big = rv(&[("cpu", i64::MAX)]);
        assert_eq!(big.add(&big).get("cpu"), i64::MAX);
        assert_eq!(big.scale(2).get("cpu"), i64::MAX);
        assert_eq!(rv(&[("cpu", i64::MIN)]).saturating_sub(&big).get("cpu"), 0);
    }

    #[test]
    fn quantity_map_and_serde_round_trip() {
        let v = rv(&[("cpu", 1500), ("memory", 2_000)]);
        let map = v.to_quantity_map();
        assert_eq!(map["cpu"], "1500m");
        assert_eq!(map["memory"], "2");
        assert_eq!(ResourceVector::parse(&map).unwrap(), v);
        let json = serde_json::to_string(&v).unwrap();
        assert_eq!(serde_json::from_str::<ResourceVector>(&json).unwrap(), v);
        assert_eq!(v.to_string(), "{cpu: 1500m, memory: 2}");
    }

    fn arb_vec() -> impl Strategy<Value = ResourceVector> {
        proptest::collection::vec(("[a-d]", -1_000_000i64..1_000_000), 0..5)
            .prop_map(ResourceVector::from_milli)
    }

    proptest! {
        #[test]
        fn sub_then_add_covers(a in arb_vec(), b in arb_vec()) {
            prop_assert!(a.saturating_sub(&b).add(&b).covers(&a));
        }

        #[test]
        fn max_covers_both(a in arb_vec(), b in arb_vec()) {
            let m = a.max(&b);
            prop_assert!(m.covers(&a) && m.covers(&b));
            prop_assert_eq!(m, b.max(&a));
        }

        #[test]
        fn add_commutes_and_stays_sorted(a in arb_vec(), b in arb_vec()) {
            let s = a.add(&b);
            prop_assert_eq!(&s, &b.add(&a));
            let names: Vec<_> = s.iter().map(|(n, _)| n.to_owned()).collect();
            let mut sorted = names.clone();
            sorted.sort();
            sorted.dedup();
            prop_assert_eq!(names, sorted);
        }

        #[test]
        fn deficit_is_zero_iff_covered(
            have in proptest::collection::vec(("[a-d]", 0i64..1_000), 0..5),
            want in proptest::collection::vec(("[a-d]", 0i64..1_000), 0..5),
        ) {
            // Quantities from the wire are non-negative; for those the deficit
            // view and the covers view must agree.
            let (have, want) = (ResourceVector::from_milli(have), ResourceVector::from_milli(want));
            prop_assert_eq!(want.saturating_sub(&have).is_zero(), have.covers(&want));
        }
    }
}
