//! The one error type of every conversion, with a metric label.

use crate::limits::Limit;
use bigfleet_model::{InvariantError, Operator, QuantityError};

/// gRPC status metadata key under which decide's `ApplyRollup` names why it rejected a
/// roll-up (one of [`ConvError::ROLLUP_REASONS`]), so the gateway counts by a fixed label.
pub const REJECT_REASON_METADATA: &str = "bigfleet-reject-reason";

/// Why a message was rejected. Every variant names the offending field with a
/// path such as `needs[3].requirements[1].operator`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConvError {
    #[error("roll-up has an empty cluster_id")]
    EmptyClusterId,
    #[error("{path}: must not be empty")]
    EmptyField { path: String },
    #[error("{path}: {value} is not a valid {enum_name}")]
    EnumOutOfRange {
        path: String,
        enum_name: &'static str,
        value: i32,
    },
    #[error("{path}: operator is unspecified")]
    UnspecifiedOperator { path: String },
    #[error("{path}: operator {operator:?} {rule}")]
    OperatorValues {
        path: String,
        operator: Operator,
        rule: &'static str,
    },
    #[error("{path}: {source}")]
    Quantity {
        path: String,
        #[source]
        source: QuantityError,
    },
    #[error("{path}: quantity {value:?} is negative")]
    NegativeQuantity { path: String, value: String },
    #[error("{path}: {value:?} contains one of the reserved characters | ; : ,")]
    ReservedCharacter { path: String, value: String },
    #[error("{path}: max_skew {value} must be at least 1")]
    InvalidMaxSkew { path: String, value: i32 },
    #[error("{path}: {value} must not be negative")]
    NegativeDuration { path: String, value: i64 },
    #[error("{path}: {value} is not a non-negative dollar amount")]
    InvalidDollars { path: String, value: f64 },
    #[error("{path}: missing")]
    MissingField { path: String },
    /// A roll-up bigger in some dimension than the shard accepts (ADR-0104). The limit
    /// leads: echoes and log lines are cut to a bounded length, and the limit is what an
    /// operator acts on.
    #[error("{limit} = {max} exceeded at {path}: {value} {unit}", unit = .limit.unit())]
    LimitExceeded {
        limit: Limit,
        path: String,
        value: usize,
        max: usize,
    },
    #[error("{path}: not a kubernetes qualified name: {rule}")]
    InvalidResourceName { path: String, rule: &'static str },
    #[error("{path}: priority {value} is above max-priority = {max}")]
    PriorityAboveCeiling { path: String, value: i32, max: i32 },
    /// A provider record that parsed but breaks the machine invariants.
    #[error(transparent)]
    Invariant(#[from] InvariantError),
    /// A provider record whose fields could not be read at all.
    #[error("machine {id:?}: {source}")]
    InvalidMachine {
        id: String,
        #[source]
        source: Box<ConvError>,
    },
}

impl ConvError {
    /// Low-cardinality metric label. Every error from a machine conversion is
    /// `price`, `interruption_probability` or `structural`
    /// (`machines_rejected_total{reason}`).
    pub fn reason(&self) -> &'static str {
        match self {
            ConvError::EmptyClusterId => "empty_cluster_id",
            ConvError::EmptyField { .. } => "empty_field",
            ConvError::EnumOutOfRange { .. } => "enum_out_of_range",
            ConvError::UnspecifiedOperator { .. } => "unspecified_operator",
            ConvError::OperatorValues { .. } => "operator_values",
            ConvError::Quantity { .. } | ConvError::NegativeQuantity { .. } => "quantity",
            ConvError::ReservedCharacter { .. } => "reserved_character",
            ConvError::InvalidMaxSkew { .. } => "spread",
            ConvError::NegativeDuration { .. } => "duration",
            ConvError::InvalidDollars { .. } => "dollars",
            ConvError::MissingField { .. } => "missing_field",
            ConvError::LimitExceeded { limit, .. } => limit.reason(),
            ConvError::InvalidResourceName { .. } => "resource_name",
            ConvError::PriorityAboveCeiling { .. } => "priority_ceiling",
            ConvError::Invariant(e) => e.reason(),
            ConvError::InvalidMachine { .. } => "structural",
        }
    }

    /// The field path, when the error is about one field.
    pub fn path(&self) -> Option<&str> {
        match self {
            ConvError::EmptyField { path }
            | ConvError::EnumOutOfRange { path, .. }
            | ConvError::UnspecifiedOperator { path }
            | ConvError::OperatorValues { path, .. }
            | ConvError::Quantity { path, .. }
            | ConvError::NegativeQuantity { path, .. }
            | ConvError::ReservedCharacter { path, .. }
            | ConvError::InvalidMaxSkew { path, .. }
            | ConvError::NegativeDuration { path, .. }
            | ConvError::InvalidDollars { path, .. }
            | ConvError::MissingField { path }
            | ConvError::LimitExceeded { path, .. }
            | ConvError::InvalidResourceName { path, .. }
            | ConvError::PriorityAboveCeiling { path, .. } => Some(path),
            ConvError::InvalidMachine { source, .. } => source.path(),
            ConvError::EmptyClusterId => Some("cluster_id"),
            ConvError::Invariant(_) => None,
        }
    }

    /// Every label [`Self::reason`] can return for a roll-up: what a metric may be labelled
    /// with when a rejection's reason arrives as text (decide's status to the gateway).
    pub const ROLLUP_REASONS: [&'static str; 21] = [
        "empty_cluster_id",
        "empty_field",
        "enum_out_of_range",
        "unspecified_operator",
        "operator_values",
        "quantity",
        "reserved_character",
        "spread",
        "duration",
        "dollars",
        "missing_field",
        "resource_name",
        "priority_ceiling",
        "limit_needs",
        "limit_requirements",
        "limit_values",
        "limit_spreads",
        "limit_resource_entries",
        "limit_string_bytes",
        "limit_rollup_dimensions",
        "limit_shard_dimensions",
    ];

    /// The fixed label equal to `text`, if it is one of [`Self::ROLLUP_REASONS`]; anything
    /// else is `None`, so a label is never a string that came over the wire.
    pub fn rollup_reason_label(text: &str) -> Option<&'static str> {
        Self::ROLLUP_REASONS.iter().copied().find(|r| *r == text)
    }

    /// Index of the offending need in a roll-up, if the path names one.
    pub fn need_index(&self) -> Option<usize> {
        let rest = self.path()?.strip_prefix("needs[")?;
        rest[..rest.find(']')?].parse().ok()
    }
}
