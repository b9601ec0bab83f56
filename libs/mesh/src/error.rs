//! The one place errors become `tonic::Status`.
//!
//! Services classify their `thiserror` enums with [`ClassifyError`] (a deliberately small
//! [`ErrorClass`]) and return `err.into_status()`; the server stack's error-mapping layer
//! turns everything the layers below it produce ([`MeshError`], tower's overload/timeout
//! errors, anything unexpected) into a status response with [`status_from_box_error`].

use tonic::{Code, Status};

/// Boxed error used between tower layers.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The classes of failure a service may report. Keep this small: each maps to exactly one
/// gRPC code, and callers (retry policies, operators) act on the code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The request is malformed or violates an invariant; retrying it will not help.
    InvalidArgument,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    Unauthenticated,
    /// Reserved for fencing (a stale token) — providers and clients treat this code as
    /// "you are a zombie", so nothing else may use it.
    Fenced,
    /// Quota or rate limit; retry later.
    ResourceExhausted,
    /// Transient; retry with backoff (e.g. not the leader, dependency down).
    Unavailable,
    DeadlineExceeded,
    /// Concurrency conflict the caller may resolve by re-reading and retrying.
    Aborted,
    Unimplemented,
    /// A bug or an unexpected state. The message is logged, not sent.
    Internal,
}

impl ErrorClass {
    pub fn code(self) -> Code {
        match self {
            ErrorClass::InvalidArgument => Code::InvalidArgument,
            ErrorClass::NotFound => Code::NotFound,
            ErrorClass::AlreadyExists => Code::AlreadyExists,
            ErrorClass::PermissionDenied => Code::PermissionDenied,
            ErrorClass::Unauthenticated => Code::Unauthenticated,
            ErrorClass::Fenced => Code::FailedPrecondition,
            ErrorClass::ResourceExhausted => Code::ResourceExhausted,
            ErrorClass::Unavailable => Code::Unavailable,
            ErrorClass::DeadlineExceeded => Code::DeadlineExceeded,
            ErrorClass::Aborted => Code::Aborted,
            ErrorClass::Unimplemented => Code::Unimplemented,
            ErrorClass::Internal => Code::Internal,
        }
    }
}

/// Implemented by every service error enum: which class each variant is.
pub trait ClassifyError: std::error::Error {
    fn class(&self) -> ErrorClass;
}

/// Conversion into a gRPC status (blanket-implemented for every [`ClassifyError`]).
pub trait IntoStatus {
    fn into_status(self) -> Status;
}

impl<E: ClassifyError> IntoStatus for E {
    fn into_status(self) -> Status {
        status_from(&self)
    }
}

/// The status for a classified error: its message for every class except `Internal`, whose
/// details are logged (with the source chain) and replaced by a generic message so internals
/// never leak to callers.
pub fn status_from<E: ClassifyError + ?Sized>(err: &E) -> Status {
    let class = err.class();
    if class == ErrorClass::Internal {
        tracing::error!(error = %ErrorChain(err), "internal error");
        return Status::internal("internal error");
    }
    Status::new(class.code(), err.to_string())
}

/// Displays an error with its `source()` chain (`a: b: c`).
pub struct ErrorChain<'a, E: ?Sized>(pub &'a E);

impl<E: std::error::Error + ?Sized> std::fmt::Display for ErrorChain<'_, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(s) = source {
            write!(f, ": {s}")?;
            source = s.source();
        }
        Ok(())
    }
}

/// Rejections produced by the mesh's own server layers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MeshError {
    #[error("{0}")]
    Unauthenticated(String),
    #[error("{0}")]
    PermissionDenied(String),
    #[error("rate limit exceeded for {0}")]
    RateLimited(String),
    #[error("deadline of {0:?} exceeded")]
    Timeout(std::time::Duration),
}

impl ClassifyError for MeshError {
    fn class(&self) -> ErrorClass {
        match self {
            MeshError::Unauthenticated(_) => ErrorClass::Unauthenticated,
            MeshError::PermissionDenied(_) => ErrorClass::PermissionDenied,
            MeshError::RateLimited(_) => ErrorClass::ResourceExhausted,
            MeshError::Timeout(_) => ErrorClass::DeadlineExceeded,
        }
    }
}

/// Maps whatever a layer or handler below the error-mapping layer failed with.
pub fn status_from_box_error(err: BoxError) -> Status {
    let err = match err.downcast::<MeshError>() {
        Ok(mesh) => return status_from(&*mesh),
        Err(err) => err,
    };
    let err = match err.downcast::<Status>() {
        Ok(status) => return *status,
        Err(err) => err,
    };
    if err.is::<tower::load_shed::error::Overloaded>() {
        return Status::resource_exhausted("server overloaded: concurrency limit reached");
    }
    if err.is::<tower::timeout::error::Elapsed>() {
        return Status::deadline_exceeded("request timed out");
    }
    tracing::error!(error = %ErrorChain(&*err), "unclassified error in the server stack");
    Status::internal("internal error")
}

/// The code's name as Go's `codes.Code.String()` spells it, so `grpc_code` labels match
/// dashboards built for go-grpc-prometheus.
pub fn code_label(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    enum DemoError {
        #[error("cluster id is empty")]
        EmptyCluster,
        #[error("stale token")]
        Stale,
        #[error("ledger corrupted")]
        Corrupt(#[source] std::io::Error),
    }

    impl ClassifyError for DemoError {
        fn class(&self) -> ErrorClass {
            match self {
                DemoError::EmptyCluster => ErrorClass::InvalidArgument,
                DemoError::Stale => ErrorClass::Fenced,
                DemoError::Corrupt(_) => ErrorClass::Internal,
            }
        }
    }

    #[test]
    fn classified_errors_map_to_codes_and_hide_internals() {
        let s = DemoError::EmptyCluster.into_status();
        assert_eq!(
            (s.code(), s.message()),
            (Code::InvalidArgument, "cluster id is empty")
        );
        assert_eq!(
            DemoError::Stale.into_status().code(),
            Code::FailedPrecondition
        );
        let s = DemoError::Corrupt(std::io::Error::other("disk")).into_status();
        assert_eq!((s.code(), s.message()), (Code::Internal, "internal error"));
    }

    #[test]
    fn box_errors_from_layers_map_to_their_codes() {
        let cases: Vec<(BoxError, Code)> = vec![
            (
                Box::new(MeshError::Unauthenticated("x".into())),
                Code::Unauthenticated,
            ),
            (
                Box::new(MeshError::PermissionDenied("x".into())),
                Code::PermissionDenied,
            ),
            (
                Box::new(MeshError::RateLimited("k".into())),
                Code::ResourceExhausted,
            ),
            (
                Box::new(MeshError::Timeout(std::time::Duration::from_secs(1))),
                Code::DeadlineExceeded,
            ),
            (Box::new(Status::not_found("n")), Code::NotFound),
            (
                Box::new(tower::load_shed::error::Overloaded::new()),
                Code::ResourceExhausted,
            ),
            (
                Box::new(tower::timeout::error::Elapsed::new()),
                Code::DeadlineExceeded,
            ),
            (Box::new(std::io::Error::other("boom")), Code::Internal),
        ];
        for (err, code) in cases {
            assert_eq!(status_from_box_error(err).code(), code);
        }
    }

    #[test]
    fn every_code_has_a_go_style_label() {
        assert_eq!(code_label(Code::Ok), "OK");
        assert_eq!(code_label(Code::ResourceExhausted), "ResourceExhausted");
        assert_eq!(code_label(Code::Cancelled), "Canceled");
    }
}
