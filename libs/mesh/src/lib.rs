//! The server and client builders every service uses: tonic over TCP/UDS, health, reflection, tower layers.
//!
//! **Servers** — [`MeshServer`] serves tonic services on TCP (plaintext or mTLS with the
//! reloadable rustls config from `bigfleet-identity`) and/or a Unix socket, always with
//! `grpc.health.v1` and reflection v1 + v1alpha, behind [`server_stack`]: trace → metrics →
//! error mapping → identity → authorization → per-identity rate limit → load shed /
//! concurrency limit → timeout (ADR-0002). Shutdown turns health NOT_SERVING, stops
//! accepting, drains until a deadline and then closes what is left.
//!
//! **Clients** — [`dial`] / [`dial_lazy`] connect to `unix:///path` or `http(s)://host:port`
//! (TCP + mTLS with our client certificate) and wrap the channel in [`client_stack`]: trace
//! propagation → metrics → retry (retryable codes only, bounded, jittered backoff) →
//! per-attempt timeout → channel. [`RetryPolicy::run`] retries typed calls that must change
//! per attempt (fencing re-stamps).
//!
//! **Handlers** read the caller with [`peer_of`] and bind asserted ids with
//! [`Peer::ensure`]; their errors become statuses through [`ClassifyError`] /
//! [`IntoStatus`] ([`error`]). Generated servers and clients get the 256 MiB limits with
//! [`with_message_limits!`].
//!
//! **Retry loops** wait through [`backoff`] (exponential, capped, jittered); waits for a
//! condition poll with [`poll_until`]. **Listen flags** parse with [`parse_listen_addr`]
//! (`:port` ⇒ `[::]:port`) and bind with [`bind_tcp`] (dual-stack, IPv4 fallback).
//!
//! **Fakes and doubles** that stand in for something outside the mesh serve a plain router
//! with [`BareServer`].

mod authz;
pub mod backoff;
mod bare;
pub mod binary;
mod channel;
mod client;
mod conn;
pub mod error;
mod flags;
mod layers;
mod limits;
mod listen;
mod local;
mod metrics;
mod peer;
pub mod ports;
mod rate_limit;
mod server;
mod stack;

pub use authz::{AuthzPolicy, HEALTH_SERVICE, REFLECTION_SERVICES, RoleSet};
pub use backoff::{Backoff, BackoffPolicy, Jitter, poll_until};
pub use bare::BareServer;
pub use channel::{
    ChannelConfig, ChannelError, ClientStream, Target, TargetError, connect, connect_lazy,
};
pub use client::{
    AttemptHook, Attempts, ClientStackConfig, MeshChannel, RetryPolicy, client_stack, dial,
    dial_lazy,
};
pub use conn::{ConnInfo, MeshConn, PeerCert, Transport};
pub use error::{
    BoxError, ClassifyError, ErrorClass, HttpError, INTERNAL_MESSAGE, IntoStatus,
    LEADER_HINT_METADATA, MeshError, http_error, internal_message, internal_status, leader_hint,
    not_leader_status, status_from,
};
pub use flags::ServiceFlags;
pub use layers::{
    AuthzCheck, CheckLayer, DeadlineLayer, ErrorMapLayer, IdentityCheck, RateLimitCheck,
    RequestCheck, TraceLayer,
};
pub use limits::ServerLimits;
pub use listen::{
    OpsFlagError, bind_tcp, parse_listen_addr, parse_optional_listen_addr, start_ops_server,
};
pub use local::{
    LocalPeers, SOCKET_DIR_MODE, SOCKET_FILE_MODE, SocketDirError, current_uid, prepare_socket_dir,
};
pub use metrics::{GrpcMetrics, MetricsLayer};
pub use peer::{Peer, peer_of};
pub use rate_limit::{RateLimit, TokenBuckets};
pub use server::{
    DEFAULT_DRAIN_DEADLINE, MAX_MESSAGE_SIZE, MeshServer, RoutableService, RunningServer,
    ServerError, stop_signal,
};
pub use stack::{InnerService, MeshLayer, ServerStackConfig, ServerStackService, server_stack};

pub use bigfleet_identity::{PeerIdentity, Role};
pub use tonic_health::ServingStatus;
pub use tonic_health::server::HealthReporter;
