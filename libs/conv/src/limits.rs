//! Bounds on what one roll-up may hold (ADR-0104).
//!
//! The byte cap on a frame (`--max-rollup-bytes`) bounds what a roll-up costs to decode, not
//! what it costs afterwards: a few MiB of protobuf can name a hundred thousand distinct
//! resources, each of which becomes a column of every dense vector in the decision cycle, or
//! a million one-byte requirement values. These limits bound the shape; every check runs
//! before the field it guards is looked at any further, so a violating roll-up is refused
//! in time proportional to the part of it read so far.

use std::fmt;

/// Shape bounds of a roll-up. The defaults admit every roll-up the project generates (the
/// largest is 60,000 needs, loadtest and `cycle-bench` rungs) with room to spare; see
/// ADR-0104 for each number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RollupLimits {
    /// Needs in one roll-up.
    pub max_needs: usize,
    /// Node-selector requirements of one need.
    pub max_requirements: usize,
    /// Values of one requirement.
    pub max_values: usize,
    /// Topology spreads of one need.
    pub max_spreads: usize,
    /// Entries of one resource map (`aggregate_resources`, `min_unit`).
    pub max_resource_entries: usize,
    /// Bytes of any one string: cluster id, requirement key and value, topology key, group,
    /// resource name, quantity.
    pub max_string_bytes: usize,
    /// Distinct resource names over the whole roll-up.
    pub max_dimensions: usize,
    /// Highest need priority accepted (the shard's priority ceiling).
    pub max_priority: i32,
}

impl RollupLimits {
    pub const DEFAULT_MAX_NEEDS: usize = 100_000;
    pub const DEFAULT_MAX_REQUIREMENTS: usize = 64;
    pub const DEFAULT_MAX_VALUES: usize = 1_024;
    pub const DEFAULT_MAX_SPREADS: usize = 16;
    pub const DEFAULT_MAX_RESOURCE_ENTRIES: usize = 32;
    pub const DEFAULT_MAX_STRING_BYTES: usize = 1_024;
    pub const DEFAULT_MAX_DIMENSIONS: usize = 64;
    /// The original has no ceiling: every int32 priority is accepted.
    pub const DEFAULT_MAX_PRIORITY: i32 = i32::MAX;
    /// Distinct resource names over every cluster's demand in one shard (decide only).
    pub const DEFAULT_MAX_SHARD_DIMENSIONS: usize = 128;

    /// No bound at all (benchmarks and tests that measure the unbounded cost).
    pub const UNBOUNDED: RollupLimits = RollupLimits {
        max_needs: usize::MAX,
        max_requirements: usize::MAX,
        max_values: usize::MAX,
        max_spreads: usize::MAX,
        max_resource_entries: usize::MAX,
        max_string_bytes: usize::MAX,
        max_dimensions: usize::MAX,
        max_priority: i32::MAX,
    };
}

impl Default for RollupLimits {
    fn default() -> Self {
        RollupLimits {
            max_needs: Self::DEFAULT_MAX_NEEDS,
            max_requirements: Self::DEFAULT_MAX_REQUIREMENTS,
            max_values: Self::DEFAULT_MAX_VALUES,
            max_spreads: Self::DEFAULT_MAX_SPREADS,
            max_resource_entries: Self::DEFAULT_MAX_RESOURCE_ENTRIES,
            max_string_bytes: Self::DEFAULT_MAX_STRING_BYTES,
            max_dimensions: Self::DEFAULT_MAX_DIMENSIONS,
            max_priority: Self::DEFAULT_MAX_PRIORITY,
        }
    }
}

/// Which bound a roll-up broke. The name is the flag that sets it, so an operator reading
/// a rejection knows what to change; the reason is the fixed metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Limit {
    Needs,
    Requirements,
    Values,
    Spreads,
    ResourceEntries,
    StringBytes,
    Dimensions,
    /// Decide's per-shard bound over every cluster's demand.
    ShardDimensions,
}

impl Limit {
    pub const ALL: [Limit; 8] = [
        Limit::Needs,
        Limit::Requirements,
        Limit::Values,
        Limit::Spreads,
        Limit::ResourceEntries,
        Limit::StringBytes,
        Limit::Dimensions,
        Limit::ShardDimensions,
    ];

    /// The flag (without `--`) that sets the bound.
    pub fn name(self) -> &'static str {
        match self {
            Limit::Needs => "max-needs-per-rollup",
            Limit::Requirements => "max-requirements-per-need",
            Limit::Values => "max-values-per-requirement",
            Limit::Spreads => "max-spreads-per-need",
            Limit::ResourceEntries => "max-resource-entries",
            Limit::StringBytes => "max-string-bytes",
            Limit::Dimensions => "max-rollup-resource-dimensions",
            Limit::ShardDimensions => "max-shard-resource-dimensions",
        }
    }

    /// The metric label of a rejection by this bound.
    pub fn reason(self) -> &'static str {
        match self {
            Limit::Needs => "limit_needs",
            Limit::Requirements => "limit_requirements",
            Limit::Values => "limit_values",
            Limit::Spreads => "limit_spreads",
            Limit::ResourceEntries => "limit_resource_entries",
            Limit::StringBytes => "limit_string_bytes",
            Limit::Dimensions => "limit_rollup_dimensions",
            Limit::ShardDimensions => "limit_shard_dimensions",
        }
    }

    /// What the counted value counts, for the error message.
    pub(crate) fn unit(self) -> &'static str {
        match self {
            Limit::Needs => "needs",
            Limit::Requirements => "requirements",
            Limit::Values => "values",
            Limit::Spreads => "spreads",
            Limit::ResourceEntries => "entries",
            Limit::StringBytes => "bytes",
            Limit::Dimensions | Limit::ShardDimensions => "distinct resource names",
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Longest key echoed inside an error path: a path names where the problem is, and an
/// attacker-sized key must not make an attacker-sized error (or log line).
const MAX_PATH_KEY_CHARS: usize = 64;

/// `path[key]` with the key quoted and cut to [`MAX_PATH_KEY_CHARS`] characters.
pub(crate) fn key_path(path: &str, key: &str) -> String {
    if key.chars().count() <= MAX_PATH_KEY_CHARS {
        return format!("{path}[{key:?}]");
    }
    let head: String = key.chars().take(MAX_PATH_KEY_CHARS).collect();
    format!("{path}[{head:?}…({} bytes)]", key.len())
}

/// Why a resource name is not a Kubernetes qualified name, or `None` when it is one:
/// an optional DNS-1123 subdomain prefix (at most 253 characters) and `/`, then a name of
/// at most 63 characters of `[A-Za-z0-9-_.]` that starts and ends alphanumeric
/// (`cpu`, `hugepages-2Mi`, `nvidia.com/gpu`).
pub fn qualified_name_problem(s: &str) -> Option<&'static str> {
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    if let Some(p) = prefix {
        if p.is_empty() {
            return Some("the prefix before '/' is empty");
        }
        if p.len() > 253 {
            return Some("the prefix is longer than 253 characters");
        }
        let label_ok = |l: &str| {
            let b = l.as_bytes();
            !b.is_empty()
                && b.len() <= 63
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        };
        if !p.split('.').all(label_ok) {
            return Some("the prefix is not a lowercase dns subdomain");
        }
    }
    let b = name.as_bytes();
    if b.is_empty() {
        return Some("the name is empty");
    }
    if b.len() > 63 {
        return Some("the name is longer than 63 characters");
    }
    if !b[0].is_ascii_alphanumeric() || !b[b.len() - 1].is_ascii_alphanumeric() {
        return Some("the name must start and end with [A-Za-z0-9]");
    }
    if !b
        .iter()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
    {
        return Some("the name may only hold [A-Za-z0-9], '-', '_' and '.'");
    }
    None
}

/// The roll-up bounds as command-line flags, shared by the gateway and decide so both
/// binaries take the same names with the same defaults (docs/flags.md).
#[cfg(feature = "cli")]
#[derive(Debug, Clone, clap::Args)]
pub struct RollupLimitArgs {
    /// Needs in one roll-up; a roll-up with more is rejected whole.
    #[arg(long, env = "BIGFLEET_MAX_NEEDS_PER_ROLLUP", default_value_t = RollupLimits::DEFAULT_MAX_NEEDS)]
    pub max_needs_per_rollup: usize,

    /// Node-selector requirements of one need.
    #[arg(long, env = "BIGFLEET_MAX_REQUIREMENTS_PER_NEED", default_value_t = RollupLimits::DEFAULT_MAX_REQUIREMENTS)]
    pub max_requirements_per_need: usize,

    /// Values of one node-selector requirement.
    #[arg(long, env = "BIGFLEET_MAX_VALUES_PER_REQUIREMENT", default_value_t = RollupLimits::DEFAULT_MAX_VALUES)]
    pub max_values_per_requirement: usize,

    /// Topology spreads of one need.
    #[arg(long, env = "BIGFLEET_MAX_SPREADS_PER_NEED", default_value_t = RollupLimits::DEFAULT_MAX_SPREADS)]
    pub max_spreads_per_need: usize,

    /// Entries of one resource map (aggregate_resources, min_unit).
    #[arg(long, env = "BIGFLEET_MAX_RESOURCE_ENTRIES", default_value_t = RollupLimits::DEFAULT_MAX_RESOURCE_ENTRIES)]
    pub max_resource_entries: usize,

    /// Bytes of any one string of a roll-up (ids, keys, values, resource names, quantities).
    #[arg(long, env = "BIGFLEET_MAX_STRING_BYTES", default_value_t = RollupLimits::DEFAULT_MAX_STRING_BYTES)]
    pub max_string_bytes: usize,

    /// Distinct resource names over one roll-up.
    #[arg(long, env = "BIGFLEET_MAX_ROLLUP_RESOURCE_DIMENSIONS", default_value_t = RollupLimits::DEFAULT_MAX_DIMENSIONS)]
    pub max_rollup_resource_dimensions: usize,

    /// Priority ceiling: a roll-up with any need above it is rejected whole. The default
    /// (2147483647, the largest int32) accepts every priority, as the original does.
    #[arg(long, env = "BIGFLEET_MAX_PRIORITY", default_value_t = RollupLimits::DEFAULT_MAX_PRIORITY, allow_hyphen_values = true)]
    pub max_priority: i32,
}

#[cfg(feature = "cli")]
impl RollupLimitArgs {
    /// The limits the flags describe.
    pub fn limits(&self) -> RollupLimits {
        RollupLimits {
            max_needs: self.max_needs_per_rollup,
            max_requirements: self.max_requirements_per_need,
            max_values: self.max_values_per_requirement,
            max_spreads: self.max_spreads_per_need,
            max_resource_entries: self.max_resource_entries,
            max_string_bytes: self.max_string_bytes,
            max_dimensions: self.max_rollup_resource_dimensions,
            max_priority: self.max_priority,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qualified_names() {
        for ok in [
            "cpu",
            "memory",
            "ephemeral-storage",
            "hugepages-2Mi",
            "nvidia.com/gpu",
            "nvidia.com/mig-1g.5gb",
            "example.com/Foo_bar.baz",
            "a",
            "a/b",
            &"x".repeat(63),
            &format!("{}/x", ["a"; 127].join(".")),
        ] {
            assert_eq!(qualified_name_problem(ok), None, "{ok:?}");
        }
        for (bad, why) in [
            ("", "the name is empty"),
            ("/cpu", "the prefix before '/' is empty"),
            ("nvidia.com/", "the name is empty"),
            (
                "Nvidia.com/gpu",
                "the prefix is not a lowercase dns subdomain",
            ),
            (
                "nvidia..com/gpu",
                "the prefix is not a lowercase dns subdomain",
            ),
            ("-a.com/gpu", "the prefix is not a lowercase dns subdomain"),
            (
                "a/b/c",
                "the name may only hold [A-Za-z0-9], '-', '_' and '.'",
            ),
            ("-cpu", "the name must start and end with [A-Za-z0-9]"),
            ("cpu.", "the name must start and end with [A-Za-z0-9]"),
            (
                "cp u",
                "the name may only hold [A-Za-z0-9], '-', '_' and '.'",
            ),
            (
                "güp",
                "the name may only hold [A-Za-z0-9], '-', '_' and '.'",
            ),
            (&"x".repeat(64), "the name is longer than 63 characters"),
            (
                &format!("{}/x", ["ab"; 85].join(".")),
                "the prefix is longer than 253 characters",
            ),
        ] {
            assert_eq!(qualified_name_problem(bad), Some(why), "{bad:?}");
        }
    }

    #[test]
    fn long_keys_are_cut_in_paths() {
        assert_eq!(key_path("m", "cpu"), "m[\"cpu\"]");
        let p = key_path("m", &"k".repeat(10_000));
        assert!(p.len() < 100, "{p}");
        assert!(p.ends_with("…(10000 bytes)]"), "{p}");
    }

    #[test]
    fn every_limit_has_a_distinct_flag_and_label() {
        let names: std::collections::HashSet<_> = Limit::ALL.iter().map(|l| l.name()).collect();
        let reasons: std::collections::HashSet<_> = Limit::ALL.iter().map(|l| l.reason()).collect();
        assert_eq!(names.len(), Limit::ALL.len());
        assert_eq!(reasons.len(), Limit::ALL.len());
    }
}
