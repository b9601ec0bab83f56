//! The gRPC face of [`FakeProvider`]: the generated `CapacityProvider` server for the five
//! small calls, and a List path that encodes the answer straight into tonic's send buffer.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bigfleet_proto::service_names::CAPACITY_PROVIDER;
use bigfleet_proto::v1alpha1::capacity_provider_server::{
    CapacityProvider, CapacityProviderServer,
};
use bigfleet_proto::v1alpha1::{
    ConfigureRequest, CreateRequest, DeleteRequest, DrainRequest, ListFilter, Machine, MachineList,
    MachineRef, TransitionAck,
};
use futures::future::BoxFuture;
use prost::Message;
use tonic::body::Body;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::server::{NamedService, UnaryService};
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::metrics::ProviderMetrics;
use crate::{FakeProvider, MAX_MESSAGE_SIZE, ProviderError};

const LIST_PATH: &str = "/bigfleet.v1alpha1.CapacityProvider/List";

/// Implements the generated trait over a shared [`FakeProvider`].
#[derive(Clone)]
pub struct ProviderGrpc {
    provider: Arc<FakeProvider>,
    metrics: Option<ProviderMetrics>,
    /// Delay before every mutating call (Create, Configure, Drain, Delete) is handled.
    rpc_latency: Duration,
}

impl ProviderGrpc {
    pub fn new(provider: Arc<FakeProvider>, metrics: Option<ProviderMetrics>) -> Self {
        Self {
            provider,
            metrics,
            rpc_latency: Duration::ZERO,
        }
    }

    /// Every mutating call waits `latency` before it is handled, like a cloud API's round
    /// trip. Get and List stay immediate: the latency being modelled is the worker's, and
    /// delaying List would slow decide's reconcile instead.
    pub fn with_rpc_latency(mut self, latency: Duration) -> Self {
        self.rpc_latency = latency;
        self
    }

    async fn delay(&self) {
        if !self.rpc_latency.is_zero() {
            tokio::time::sleep(self.rpc_latency).await;
        }
    }

    fn observe<T>(
        &self,
        rpc: &'static str,
        r: Result<T, ProviderError>,
    ) -> Result<Response<T>, Status> {
        if let Some(m) = &self.metrics {
            let code = match &r {
                Ok(_) => tonic::Code::Ok,
                Err(e) => e.code(),
            };
            m.observe(rpc, code);
        }
        r.map(Response::new).map_err(Status::from)
    }
}

#[tonic::async_trait]
impl CapacityProvider for ProviderGrpc {
    async fn create(
        &self,
        request: Request<CreateRequest>,
    ) -> Result<Response<TransitionAck>, Status> {
        self.delay().await;
        self.observe("Create", self.provider.create(request.get_ref()))
    }

    async fn configure(
        &self,
        request: Request<ConfigureRequest>,
    ) -> Result<Response<TransitionAck>, Status> {
        self.delay().await;
        self.observe("Configure", self.provider.configure(request.get_ref()))
    }

    async fn drain(
        &self,
        request: Request<DrainRequest>,
    ) -> Result<Response<TransitionAck>, Status> {
        self.delay().await;
        self.observe("Drain", self.provider.drain(request.get_ref()))
    }

    async fn delete(
        &self,
        request: Request<DeleteRequest>,
    ) -> Result<Response<TransitionAck>, Status> {
        self.delay().await;
        self.observe("Delete", self.provider.delete(request.get_ref()))
    }

    async fn get(&self, request: Request<MachineRef>) -> Result<Response<Machine>, Status> {
        self.observe("Get", self.provider.get(&request.get_ref().id))
    }

    /// The slow path, used only when this trait impl is served without
    /// [`FakeProviderService`]; the answer is the same.
    async fn list(&self, request: Request<ListFilter>) -> Result<Response<MachineList>, Status> {
        let filter = request.get_ref();
        let answer = self
            .provider
            .begin_list(filter)
            .map(|lie| lie.unwrap_or_else(|| self.provider.list(filter)));
        self.observe("List", answer)
    }
}

/// The tonic service to add to a server: `bigfleet.v1alpha1.CapacityProvider` with the
/// fast List path and 256 MiB message limits.
#[derive(Clone)]
pub struct FakeProviderService {
    inner: CapacityProviderServer<ProviderGrpc>,
    list: ListHandler,
}

impl FakeProviderService {
    pub fn new(provider: Arc<FakeProvider>) -> Self {
        Self::with_metrics(provider, None)
    }

    pub fn with_metrics(provider: Arc<FakeProvider>, metrics: Option<ProviderMetrics>) -> Self {
        Self::with_options(provider, metrics, Duration::ZERO)
    }

    /// With metrics and a delay before every mutating call ([`ProviderGrpc::with_rpc_latency`]).
    pub fn with_options(
        provider: Arc<FakeProvider>,
        metrics: Option<ProviderMetrics>,
        rpc_latency: Duration,
    ) -> Self {
        let inner = CapacityProviderServer::new(
            ProviderGrpc::new(provider.clone(), metrics.clone()).with_rpc_latency(rpc_latency),
        )
        .max_decoding_message_size(MAX_MESSAGE_SIZE)
        .max_encoding_message_size(MAX_MESSAGE_SIZE);
        Self {
            inner,
            list: ListHandler { provider, metrics },
        }
    }
}

impl NamedService for FakeProviderService {
    const NAME: &'static str = CAPACITY_PROVIDER;
}

impl tower::Service<http::Request<Body>> for FakeProviderService {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let span = server_span(&req);
        if req.uri().path() == LIST_PATH {
            let handler = self.list.clone();
            Box::pin(
                async move {
                    let mut grpc = tonic::server::Grpc::new(ListCodec)
                        .apply_max_message_size_config(
                            Some(MAX_MESSAGE_SIZE),
                            Some(MAX_MESSAGE_SIZE),
                        );
                    Ok(grpc.unary(handler, req).await)
                }
                .instrument(span),
            )
        } else {
            let fut = span.in_scope(|| tower::Service::call(&mut self.inner, req));
            Box::pin(fut.instrument(span))
        }
    }
}

/// One `grpc.server` span per call, child of the caller's `traceparent`, so a provider call
/// shows up in the trace of the action that made it. Same shape as the mesh's server spans;
/// the fake is served by plain tonic (it must also stand in for third-party providers), so
/// it opens the span itself.
fn server_span(req: &http::Request<Body>) -> tracing::Span {
    let path = req.uri().path();
    let method = path.rsplit('/').next().unwrap_or_default();
    let span = tracing::info_span!(
        "grpc.server",
        otel.name = %path,
        otel.kind = "server",
        rpc.system = "grpc",
        rpc.service = CAPACITY_PROVIDER,
        rpc.method = %method,
    );
    bigfleet_telemetry::propagation::set_parent_from_headers(&span, req.headers());
    span
}

/// A List answer not encoded yet: the encoder writes it under the store's read lock
/// directly into the outgoing buffer, so no `MachineList` value and no second copy of a
/// 100 MB answer ever exists.
pub struct PendingList {
    answer: ListAnswer,
    metrics: Option<ProviderMetrics>,
}

enum ListAnswer {
    /// The store's content for the filter, encoded when sent.
    Truth {
        provider: Arc<FakeProvider>,
        filter: ListFilter,
    },
    /// A scripted lie ([`crate::ListFault`]), already built.
    Lie(MachineList),
}

#[derive(Clone)]
struct ListHandler {
    provider: Arc<FakeProvider>,
    metrics: Option<ProviderMetrics>,
}

impl UnaryService<ListFilter> for ListHandler {
    type Response = PendingList;
    type Future = std::future::Ready<Result<Response<PendingList>, Status>>;

    fn call(&mut self, request: Request<ListFilter>) -> Self::Future {
        let filter = request.into_inner();
        let answer = match self.provider.begin_list(&filter) {
            Ok(None) => ListAnswer::Truth {
                provider: self.provider.clone(),
                filter,
            },
            Ok(Some(lie)) => ListAnswer::Lie(lie),
            Err(e) => {
                if let Some(m) = &self.metrics {
                    m.observe("List", e.code());
                }
                return std::future::ready(Err(e.into()));
            }
        };
        std::future::ready(Ok(Response::new(PendingList {
            answer,
            metrics: self.metrics.clone(),
        })))
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct ListCodec;

impl Codec for ListCodec {
    type Encode = PendingList;
    type Decode = ListFilter;
    type Encoder = ListEncoder;
    type Decoder = FilterDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        ListEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        FilterDecoder
    }
}

struct ListEncoder;

impl Encoder for ListEncoder {
    type Item = PendingList;
    type Error = Status;

    fn encode(&mut self, item: PendingList, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        let started = Instant::now();
        let n = match &item.answer {
            ListAnswer::Truth { provider, filter } => provider.encode_list(filter, dst),
            ListAnswer::Lie(list) => {
                list.encode(dst)
                    .map_err(|e| Status::internal(format!("encoding a scripted List: {e}")))?;
                list.machines.len()
            }
        };
        if let Some(m) = &item.metrics {
            m.observe("List", tonic::Code::Ok);
            m.observe_list(n, started.elapsed());
        }
        Ok(())
    }
}

struct FilterDecoder;

impl Decoder for FilterDecoder {
    type Item = ListFilter;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<ListFilter>, Status> {
        ListFilter::decode(src)
            .map(Some)
            .map_err(|e| Status::internal(format!("decoding ListFilter: {e}")))
    }
}
