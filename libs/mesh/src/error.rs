//! The one place errors become `tonic::Status` (gRPC) and HTTP status codes.
//!
//! Services classify their `thiserror` enums with [`ClassifyError`] (a deliberately small
//! [`ErrorClass`]) and return `err.into_status()` (gRPC) or [`http_error`] (HTTP); the server
//! stack's error-mapping layer turns everything the layers below it produce ([`MeshError`],
//! tower's overload/timeout errors, anything unexpected) into a status response with
//! [`status_from_box_error`]. Internal errors never reach the caller: their detail is logged
//! with an `error_ref` the caller's generic message also names ([`internal_status`]).

use http::StatusCode;
use tonic::metadata::MetadataValue;
use tonic::{Code, Status};

/// Boxed error used between tower layers.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Metadata key (trailers) in which a replica that is not the leader names the leader's client
/// address (`host:port`, no scheme) on its "not leader" answer (ADR-0061). The coordinator
/// sends it, and the coordinator clients (svc-inspect, the CLI, joining replicas) follow it.
pub const LEADER_HINT_METADATA: &str = "x-bigfleet-leader";

/// The generic message of every INTERNAL answer (followed by the correlation reference).
pub const INTERNAL_MESSAGE: &str = "internal error";

/// The classes of failure a service may report. Keep this small: each maps to exactly one
/// gRPC code and one HTTP status, and callers (retry policies, operators) act on the code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorClass {
    /// The request is malformed or violates an invariant; retrying it will not help.
    InvalidArgument,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    Unauthenticated,
    /// Reserved for fencing (a stale token) — providers and clients treat this code as
    /// "you are a zombie", so nothing else may use it except [`ErrorClass::NotLeader`],
    /// whose answers always say "not leader" (the wire contract of ADR-0061).
    Fenced,
    /// This replica is not the leader; ask `leader` (the leader's client address,
    /// `host:port`, when known). FAILED_PRECONDITION "… not leader" with the hint in
    /// [`LEADER_HINT_METADATA`] (ADR-0061); HTTP 503 with the hint in the same header.
    NotLeader {
        leader: Option<String>,
    },
    /// Quota or rate limit; retry later.
    ResourceExhausted,
    /// Transient; retry with backoff (e.g. dependency down).
    Unavailable,
    DeadlineExceeded,
    /// Concurrency conflict the caller may resolve by re-reading and retrying.
    Aborted,
    Unimplemented,
    /// A bug or an unexpected state. The message is logged, not sent.
    Internal,
}

impl ErrorClass {
    /// The gRPC code of this class.
    pub fn code(&self) -> Code {
        match self {
            ErrorClass::InvalidArgument => Code::InvalidArgument,
            ErrorClass::NotFound => Code::NotFound,
            ErrorClass::AlreadyExists => Code::AlreadyExists,
            ErrorClass::PermissionDenied => Code::PermissionDenied,
            ErrorClass::Unauthenticated => Code::Unauthenticated,
            ErrorClass::Fenced | ErrorClass::NotLeader { .. } => Code::FailedPrecondition,
            ErrorClass::ResourceExhausted => Code::ResourceExhausted,
            ErrorClass::Unavailable => Code::Unavailable,
            ErrorClass::DeadlineExceeded => Code::DeadlineExceeded,
            ErrorClass::Aborted => Code::Aborted,
            ErrorClass::Unimplemented => Code::Unimplemented,
            ErrorClass::Internal => Code::Internal,
        }
    }

    /// The HTTP status of this class: google.rpc's canonical code mapping, except that a
    /// fenced caller gets 409 (its view conflicts with the current holder's) and "not
    /// leader" gets 503 (retry elsewhere; the hint says where) rather than FAILED_PRECONDITION's
    /// 400, which would tell an HTTP client its request is wrong.
    pub fn http_status(&self) -> StatusCode {
        match self {
            ErrorClass::InvalidArgument => StatusCode::BAD_REQUEST,
            ErrorClass::NotFound => StatusCode::NOT_FOUND,
            ErrorClass::AlreadyExists => StatusCode::CONFLICT,
            ErrorClass::PermissionDenied => StatusCode::FORBIDDEN,
            ErrorClass::Unauthenticated => StatusCode::UNAUTHORIZED,
            ErrorClass::Fenced => StatusCode::CONFLICT,
            ErrorClass::NotLeader { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ErrorClass::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            ErrorClass::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorClass::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            ErrorClass::Aborted => StatusCode::CONFLICT,
            ErrorClass::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            ErrorClass::Internal => StatusCode::INTERNAL_SERVER_ERROR,
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
/// never leak to callers. `NotLeader` carries the leader hint in [`LEADER_HINT_METADATA`] and
/// always says "not leader" (what hint-following clients look for).
pub fn status_from<E: ClassifyError + ?Sized>(err: &E) -> Status {
    match err.class() {
        ErrorClass::Internal => internal_status(&ErrorChain(err)),
        ErrorClass::NotLeader { leader } => not_leader_status(&err.to_string(), leader.as_deref()),
        class => Status::new(class.code(), err.to_string()),
    }
}

/// The one way to write a "not leader" answer (what [`status_from`] sends for
/// [`ErrorClass::NotLeader`]; doubles that play a follower send it too): FAILED_PRECONDITION
/// whose message says "not leader", with `leader` in [`LEADER_HINT_METADATA`] when it is a
/// usable address. [`leader_hint`] reads it back.
pub fn not_leader_status(message: &str, leader: Option<&str>) -> Status {
    let mut status = Status::failed_precondition(not_leader_message(message));
    if let Some(v) = leader
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .and_then(|l| MetadataValue::try_from(l).ok())
    {
        status.metadata_mut().insert(LEADER_HINT_METADATA, v);
    }
    status
}

/// The one way to read a "not leader" answer: the leader's address it names, or `None` when
/// the status is anything else (fencing shares its code, so the message must say "not
/// leader") or names no usable address. Every client that follows hints (the coordinator
/// client, inspect and the CLI, a joining replica) reads it here.
pub fn leader_hint(status: &Status) -> Option<String> {
    if status.code() != Code::FailedPrecondition || !status.message().contains("not leader") {
        return None;
    }
    status
        .metadata()
        .get(LEADER_HINT_METADATA)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
}

/// The HTTP answer for a classified error: its status and the message to send (generic for
/// `Internal`, whose detail is logged as for gRPC), plus the leader hint of a `NotLeader`
/// (send it in a [`LEADER_HINT_METADATA`] header).
pub fn http_error<E: ClassifyError + ?Sized>(err: &E) -> HttpError {
    let class = err.class();
    let status = class.http_status();
    match class {
        ErrorClass::Internal => HttpError {
            status,
            message: internal_message(&ErrorChain(err)),
            leader: None,
        },
        ErrorClass::NotLeader { leader } => HttpError {
            status,
            message: not_leader_message(&err.to_string()),
            leader,
        },
        _ => HttpError {
            status,
            message: err.to_string(),
            leader: None,
        },
    }
}

/// What an HTTP handler answers for an error ([`http_error`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpError {
    pub status: StatusCode,
    pub message: String,
    /// The leader's address for a "not leader" answer, when known.
    pub leader: Option<String>,
}

fn not_leader_message(message: &str) -> String {
    if message.contains("not leader") {
        message.to_owned()
    } else {
        format!("not leader: {message}")
    }
}

/// An INTERNAL status for `detail`: the detail is logged at error level together with a fresh
/// `error_ref`, and the caller gets only [`INTERNAL_MESSAGE`] and that reference, which an
/// operator greps the logs for.
pub fn internal_status(detail: &dyn std::fmt::Display) -> Status {
    Status::internal(internal_message(detail))
}

/// The generic message for an internal failure ([`INTERNAL_MESSAGE`] and a fresh reference);
/// `detail` is logged at error level with that `error_ref`, never sent.
pub fn internal_message(detail: &dyn std::fmt::Display) -> String {
    let error_ref = format!("{:08x}", rand::random::<u32>());
    tracing::error!(error = %detail, error_ref = %error_ref, "internal error");
    format!("{INTERNAL_MESSAGE} (ref {error_ref})")
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
    internal_status(&format_args!(
        "unclassified error in the server stack: {}",
        ErrorChain(&*err)
    ))
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
        assert_eq!(s.code(), Code::Internal);
        assert_generic(s.message());
    }

    /// An internal answer names nothing but the generic message and an 8-hex-digit reference.
    fn assert_generic(message: &str) {
        let error_ref = message
            .strip_prefix("internal error (ref ")
            .and_then(|r| r.strip_suffix(')'))
            .unwrap_or_else(|| panic!("not the generic internal message: {message:?}"));
        assert!(
            error_ref.len() == 8 && error_ref.chars().all(|c| c.is_ascii_hexdigit()),
            "{message:?}"
        );
    }

    /// Every class, its gRPC code and its HTTP status. The exhaustive match makes a new class
    /// fail to compile until it is added here.
    #[test]
    fn every_class_maps_to_one_grpc_code_and_one_http_status() {
        let not_leader = ErrorClass::NotLeader {
            leader: Some("10.0.0.2:7790".into()),
        };
        let table = [
            (ErrorClass::InvalidArgument, Code::InvalidArgument, 400),
            (ErrorClass::NotFound, Code::NotFound, 404),
            (ErrorClass::AlreadyExists, Code::AlreadyExists, 409),
            (ErrorClass::PermissionDenied, Code::PermissionDenied, 403),
            (ErrorClass::Unauthenticated, Code::Unauthenticated, 401),
            (ErrorClass::Fenced, Code::FailedPrecondition, 409),
            (not_leader, Code::FailedPrecondition, 503),
            (ErrorClass::ResourceExhausted, Code::ResourceExhausted, 429),
            (ErrorClass::Unavailable, Code::Unavailable, 503),
            (ErrorClass::DeadlineExceeded, Code::DeadlineExceeded, 504),
            (ErrorClass::Aborted, Code::Aborted, 409),
            (ErrorClass::Unimplemented, Code::Unimplemented, 501),
            (ErrorClass::Internal, Code::Internal, 500),
        ];
        let mut covered = std::collections::BTreeSet::new();
        for (class, code, http) in table {
            covered.insert(match &class {
                ErrorClass::InvalidArgument => 0,
                ErrorClass::NotFound => 1,
                ErrorClass::AlreadyExists => 2,
                ErrorClass::PermissionDenied => 3,
                ErrorClass::Unauthenticated => 4,
                ErrorClass::Fenced => 5,
                ErrorClass::NotLeader { .. } => 6,
                ErrorClass::ResourceExhausted => 7,
                ErrorClass::Unavailable => 8,
                ErrorClass::DeadlineExceeded => 9,
                ErrorClass::Aborted => 10,
                ErrorClass::Unimplemented => 11,
                ErrorClass::Internal => 12,
            });
            assert_eq!(class.code(), code, "{class:?}");
            assert_eq!(class.http_status().as_u16(), http, "{class:?}");

            // The same through the public mapping functions, with a message that would leak.
            let err = Classified(class.clone(), "secret /var/lib/detail");
            let status = status_from(&err);
            let answer = http_error(&err);
            assert_eq!(status.code(), code, "{class:?}");
            assert_eq!(answer.status.as_u16(), http, "{class:?}");
            match class {
                ErrorClass::Internal => {
                    assert_generic(status.message());
                    assert_generic(&answer.message);
                }
                ErrorClass::NotLeader { .. } => {
                    assert_eq!(status.message(), "not leader: secret /var/lib/detail");
                    assert_eq!(answer.message, status.message());
                    assert_eq!(answer.leader.as_deref(), Some("10.0.0.2:7790"));
                }
                _ => {
                    assert_eq!(status.message(), "secret /var/lib/detail");
                    assert_eq!(answer.message, status.message());
                    assert_eq!(answer.leader, None);
                }
            }
        }
        assert_eq!(covered.len(), 13, "every class is in the table once");
    }

    #[derive(Debug)]
    struct Classified(ErrorClass, &'static str);

    impl std::fmt::Display for Classified {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.1)
        }
    }

    impl std::error::Error for Classified {}

    impl ClassifyError for Classified {
        fn class(&self) -> ErrorClass {
            self.0.clone()
        }
    }

    #[test]
    fn not_leader_carries_the_hint_only_when_known() {
        let hinted = Classified(
            ErrorClass::NotLeader {
                leader: Some("10.0.0.2:7790".into()),
            },
            "coordinator: not leader",
        );
        let s = status_from(&hinted);
        assert_eq!(
            (s.code(), s.message()),
            (Code::FailedPrecondition, "coordinator: not leader")
        );
        assert_eq!(
            s.metadata()
                .get(LEADER_HINT_METADATA)
                .unwrap()
                .to_str()
                .unwrap(),
            "10.0.0.2:7790"
        );
        assert_eq!(leader_hint(&s).as_deref(), Some("10.0.0.2:7790"));
        for leader in [None, Some("  ".to_owned()), Some("bad\nvalue".to_owned())] {
            let s = status_from(&Classified(
                ErrorClass::NotLeader { leader },
                "coordinator: not leader",
            ));
            assert_eq!(s.code(), Code::FailedPrecondition);
            assert!(s.metadata().get(LEADER_HINT_METADATA).is_none());
            assert_eq!(leader_hint(&s), None);
        }
        // A message that does not say it is added, so hint readers recognise the answer.
        let s = not_leader_status("follower of term 3", Some("10.0.0.2:7790"));
        assert_eq!(s.message(), "not leader: follower of term 3");
        assert_eq!(leader_hint(&s).as_deref(), Some("10.0.0.2:7790"));
    }

    #[test]
    fn leader_hints_are_read_only_from_not_leader_answers() {
        let with_hint = |mut s: Status, hint: &str| {
            s.metadata_mut()
                .insert(LEADER_HINT_METADATA, MetadataValue::try_from(hint).unwrap());
            s
        };
        let hinted = with_hint(
            Status::failed_precondition("not leader: a follower"),
            " x:1 ",
        );
        assert_eq!(leader_hint(&hinted).as_deref(), Some("x:1"), "trimmed");
        let blank = with_hint(Status::failed_precondition("not leader"), "  ");
        assert_eq!(leader_hint(&blank), None);
        let fenced = with_hint(Status::failed_precondition("stale fencing token"), "x:1");
        assert_eq!(
            leader_hint(&fenced),
            None,
            "fencing is not a leader problem"
        );
        let unavailable = with_hint(Status::unavailable("not leader"), "x:1");
        assert_eq!(leader_hint(&unavailable), None, "only FAILED_PRECONDITION");
        assert_eq!(
            leader_hint(&Status::failed_precondition("not leader: no leader known")),
            None
        );
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
            let status = status_from_box_error(err);
            assert_eq!(status.code(), code);
            if code == Code::Internal {
                assert_generic(status.message());
            }
        }
    }

    #[test]
    fn every_code_has_a_go_style_label() {
        assert_eq!(code_label(Code::Ok), "OK");
        assert_eq!(code_label(Code::ResourceExhausted), "ResourceExhausted");
        assert_eq!(code_label(Code::Cancelled), "Canceled");
    }
}
