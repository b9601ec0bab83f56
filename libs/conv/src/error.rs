//! The one error type of every conversion, with a metric label.

use bigfleet_model::{InvariantError, Operator, QuantityError};

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
            | ConvError::MissingField { path } => Some(path),
            ConvError::InvalidMachine { source, .. } => source.path(),
            ConvError::EmptyClusterId => Some("cluster_id"),
            ConvError::Invariant(_) => None,
        }
    }

    /// Index of the offending need in a roll-up, if the path names one.
    pub fn need_index(&self) -> Option<usize> {
        let rest = self.path()?.strip_prefix("needs[")?;
        rest[..rest.find(']')?].parse().ok()
    }
}
