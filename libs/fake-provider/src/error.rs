//! Errors of the store, the catalog and the fence file, and their gRPC codes.

use std::path::PathBuf;

use crate::fence::Mark;
use crate::store::OpKind;

/// Why a provider call (or a test hook) was refused.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// The token is not strictly newer than the high-water mark of its (shard, machine).
    #[error(
        "fenced: token epoch {epoch} sequence {sequence} of shard {shard_id} is not newer than \
         epoch {} sequence {} for machine {machine_id}",
        high_water.epoch,
        high_water.sequence
    )]
    Fenced {
        shard_id: String,
        machine_id: String,
        epoch: i64,
        sequence: i64,
        high_water: Mark,
    },
    #[error("machine {id} not found")]
    NotFound { id: String },
    #[error("invalid transition: {op} is not allowed on machine {id} in state {state}")]
    InvalidTransition {
        id: String,
        op: OpKind,
        state: &'static str,
    },
    #[error("machine {id} is in state {state}, not in a transition")]
    NotTransitional { id: String, state: &'static str },
    #[error("{op} is not supported by this provider")]
    Unsupported { op: OpKind },
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("machine {id} already exists")]
    AlreadyExists { id: String },
    /// A failure injected by configuration or a test hook.
    #[error("{message}")]
    Injected { code: tonic::Code, message: String },
    /// The accepted fencing mark could not be persisted; the call was not applied.
    #[error(transparent)]
    FencePersist(#[from] FenceFileError),
}

impl ProviderError {
    /// The gRPC status code on the wire. FAILED_PRECONDITION means "fenced" on this
    /// service and nothing else, so every other refusal maps elsewhere (invalid
    /// transitions to INTERNAL, as the reference adapter does).
    pub fn code(&self) -> tonic::Code {
        match self {
            ProviderError::Fenced { .. } => tonic::Code::FailedPrecondition,
            ProviderError::NotFound { .. } => tonic::Code::NotFound,
            ProviderError::InvalidTransition { .. } | ProviderError::NotTransitional { .. } => {
                tonic::Code::Internal
            }
            ProviderError::Unsupported { .. } => tonic::Code::Unimplemented,
            ProviderError::InvalidArgument(_) => tonic::Code::InvalidArgument,
            ProviderError::AlreadyExists { .. } => tonic::Code::AlreadyExists,
            ProviderError::Injected { code, .. } => {
                // An injection must not impersonate a fencing refusal.
                if *code == tonic::Code::FailedPrecondition {
                    tonic::Code::Internal
                } else {
                    *code
                }
            }
            ProviderError::FencePersist(_) => tonic::Code::Unavailable,
        }
    }
}

impl From<ProviderError> for tonic::Status {
    fn from(e: ProviderError) -> Self {
        tonic::Status::new(e.code(), e.to_string())
    }
}

/// A catalog that cannot be read or does not describe a valid fleet.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("reading catalog {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing catalog: {0}")]
    Parse(String),
    #[error("invalid catalog: {0}")]
    Invalid(String),
    #[error("catalog seeds machine {id} twice")]
    DuplicateMachine { id: String },
}

/// The fence file cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FenceFileError {
    #[error("fence file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("corrupt fence file {path} line {line}: {reason}")]
    Corrupt {
        path: PathBuf,
        line: usize,
        reason: String,
    },
}
