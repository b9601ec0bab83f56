//! The three services a worker talks to, as small traits, so the flows run
//! against in-memory fakes in unit tests and against gRPC in production.
//!
//! The traits speak the wire messages (they are the contract the fakes must
//! honour) and report failures as `tonic::Status`, whose code is what the
//! flows act on: decide's Transition codes map to outcomes, and provider
//! codes decide between retry, fencing and failure.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bigfleet_mesh::MeshChannel;
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::mesh::v1::relay_client::RelayClient;
use bigfleet_proto::mesh::v1::work_client::WorkClient;
use bigfleet_proto::v1alpha1 as pb;
use bigfleet_proto::v1alpha1::capacity_provider_client::CapacityProviderClient;
use bigfleet_telemetry::propagation::inject_current_span_into_metadata;
use tonic::{Request, Status};
use tracing::Instrument;

/// Declares each link trait once: its methods are async calls answering `Result<_, Status>`,
/// and `Arc<T>` forwards every one of them to `T`, so a flow can run against a shared link
/// (tests keep a handle on their fakes that way).
macro_rules! link_traits {
    ($(
        $(#[$doc:meta])*
        trait $name:ident {
            $(
                $(#[$method_doc:meta])*
                fn $method:ident(&self, $($arg:ident: $ty:ty),*) -> $out:ty;
            )*
        }
    )*) => {$(
        $(#[$doc])*
        pub trait $name: Send + Sync + 'static {
            $(
                $(#[$method_doc])*
                fn $method(
                    &self,
                    $($arg: $ty),*
                ) -> impl Future<Output = Result<$out, Status>> + Send;
            )*
        }

        impl<T: $name> $name for Arc<T> {
            $(
                fn $method(
                    &self,
                    $($arg: $ty),*
                ) -> impl Future<Output = Result<$out, Status>> + Send {
                    (**self).$method($($arg),*)
                }
            )*
        }
    )*};
}

link_traits! {
    /// Decide's transition authority.
    trait DecideLink {
        /// Reports one state change; returns the machine as decide now holds it.
        fn transition(&self, req: mesh::TransitionRequest) -> mesh::TransitionResponse;
    }

    /// The session gateway's operator-facing calls.
    trait GatewayLink {
        /// Waits up to `timeout` for a bootstrap blob.
        fn request_bootstrap(
            &self,
            req: mesh::RequestBootstrapRequest,
            timeout: Duration
        ) -> mesh::RequestBootstrapResponse;
        /// Delivers a reclaim instruction to the cluster's operator.
        fn send_reclaim(
            &self,
            req: mesh::SendReclaimRequest,
            timeout: Duration
        ) -> mesh::SendReclaimResponse;
    }

    /// The four fenced mutations of the public CapacityProvider contract.
    trait ProviderLink {
        fn create(&self, req: pb::CreateRequest, timeout: Duration) -> pb::TransitionAck;
        fn configure(&self, req: pb::ConfigureRequest, timeout: Duration) -> pb::TransitionAck;
        fn drain(&self, req: pb::DrainRequest, timeout: Duration) -> pb::TransitionAck;
        fn delete(&self, req: pb::DeleteRequest, timeout: Duration) -> pb::TransitionAck;
    }
}

/// A request carrying the current span's trace context and, when given, a
/// deadline the server can see (`grpc-timeout`).
fn traced<T>(msg: T, timeout: Option<Duration>) -> Request<T> {
    let mut req = Request::new(msg);
    inject_current_span_into_metadata(req.metadata_mut());
    if let Some(t) = timeout {
        req.set_timeout(t);
    }
    req
}

/// Decide over gRPC.
#[derive(Clone, Debug)]
pub struct GrpcDecide {
    client: WorkClient<MeshChannel>,
    timeout: Duration,
}

impl GrpcDecide {
    /// `timeout` bounds each Transition call.
    pub fn new(channel: MeshChannel, timeout: Duration) -> Self {
        Self {
            client: bigfleet_mesh::with_message_limits!(WorkClient::new(channel)),
            timeout,
        }
    }

    /// The client, for the Work stream.
    pub fn client(&self) -> WorkClient<MeshChannel> {
        self.client.clone()
    }
}

impl DecideLink for GrpcDecide {
    async fn transition(
        &self,
        req: mesh::TransitionRequest,
    ) -> Result<mesh::TransitionResponse, Status> {
        let mut client = self.client.clone();
        Ok(client
            .transition(traced(req, Some(self.timeout)))
            .await?
            .into_inner())
    }
}

/// The gateway over gRPC.
#[derive(Clone, Debug)]
pub struct GrpcGateway {
    client: RelayClient<MeshChannel>,
}

impl GrpcGateway {
    pub fn new(channel: MeshChannel) -> Self {
        Self {
            client: bigfleet_mesh::with_message_limits!(RelayClient::new(channel)),
        }
    }
}

/// Both relay calls are one traced unary call bounded by the caller's timeout.
macro_rules! traced_relay_calls {
    ($($method:ident($req:ty) -> $resp:ty;)*) => {
        impl GatewayLink for GrpcGateway {
            $(
                async fn $method(&self, req: $req, timeout: Duration) -> Result<$resp, Status> {
                    let mut client = self.client.clone();
                    Ok(client.$method(traced(req, Some(timeout))).await?.into_inner())
                }
            )*
        }
    };
}

traced_relay_calls! {
    request_bootstrap(mesh::RequestBootstrapRequest) -> mesh::RequestBootstrapResponse;
    send_reclaim(mesh::SendReclaimRequest) -> mesh::SendReclaimResponse;
}

/// A capacity provider over gRPC.
#[derive(Clone, Debug)]
pub struct GrpcProvider {
    client: CapacityProviderClient<MeshChannel>,
}

impl GrpcProvider {
    pub fn new(channel: MeshChannel) -> Self {
        Self {
            client: bigfleet_mesh::with_message_limits!(CapacityProviderClient::new(channel)),
        }
    }
}

/// The four provider mutations are one traced call each, differing only in the method,
/// its request type and the RPC name on the span.
macro_rules! traced_provider_calls {
    ($($method:ident($req:ty) => $rpc:literal;)*) => {
        impl ProviderLink for GrpcProvider {
            $(
                async fn $method(
                    &self,
                    req: $req,
                    timeout: Duration,
                ) -> Result<pb::TransitionAck, Status> {
                    let mut client = self.client.clone();
                    let (span, req) = provider_call($rpc, req, timeout);
                    finish(&span, client.$method(req).instrument(span.clone()).await)
                }
            )*
        }
    };
}

traced_provider_calls! {
    create(pb::CreateRequest) => "Create";
    configure(pb::ConfigureRequest) => "Configure";
    drain(pb::DrainRequest) => "Drain";
    delete(pb::DeleteRequest) => "Delete";
}

/// A `grpc.client` span for one provider RPC (child of the work item's span) and the
/// request carrying it as `traceparent`: the provider is outside the mesh, so the client
/// span is the only record of the call on our side, and its id is the parent the
/// provider's own server span continues.
fn provider_call<T>(method: &str, msg: T, timeout: Duration) -> (tracing::Span, Request<T>) {
    let span = tracing::info_span!(
        "grpc.client",
        otel.name = %format!("/{}/{method}", bigfleet_proto::service_names::CAPACITY_PROVIDER),
        otel.kind = "client",
        otel.status_code = tracing::field::Empty,
        rpc.system = "grpc",
        rpc.service = bigfleet_proto::service_names::CAPACITY_PROVIDER,
        rpc.method = method,
        rpc.grpc.status_code = tracing::field::Empty,
    );
    let req = span.in_scope(|| traced(msg, Some(timeout)));
    (span, req)
}

/// Records the call's outcome on its span and unwraps the response.
fn finish<R>(
    span: &tracing::Span,
    result: Result<tonic::Response<R>, Status>,
) -> Result<R, Status> {
    match result {
        Ok(resp) => {
            span.record("rpc.grpc.status_code", 0);
            Ok(resp.into_inner())
        }
        Err(status) => {
            span.record("rpc.grpc.status_code", i32::from(status.code()));
            span.record("otel.status_code", "ERROR");
            Err(status)
        }
    }
}
