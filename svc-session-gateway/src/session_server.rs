//! The `bigfleet.v1alpha1.Shard` tower service with small codec buffers.
//!
//! tonic allocates an 8 KiB encode and an 8 KiB decode buffer per call up front and keeps
//! them for the call's lifetime. A session is one call that lives for days, and a gateway
//! holds 10,000 of them, so the generated server's defaults would cost most of the per-session
//! memory budget while sessions idle. This is the generated dispatch for the one method,
//! with a codec whose buffers start small; they still grow to fit any message (up to the
//! 256 MiB limit), so nothing is lost but the idle reservation.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use bigfleet_proto::v1alpha1::shard_server::Shard;
use bigfleet_proto::v1alpha1::{OperatorMessage, ShardMessage};
use tonic::codec::{BufferSettings, Codec};
use tonic::codegen::{Body, BoxFuture, StdError, http};
use tonic::server::{Grpc, NamedService, StreamingService};
use tonic_prost::{ProstDecoder, ProstEncoder};

/// Initial codec buffer per session and direction. Acks (~30 bytes) and Hellos fit; the
/// decode buffer grows once to the cluster's roll-up size and is reused from then on.
const SESSION_BUFFER: usize = 256;
/// Batching bound for outbound frames (tonic's default).
const YIELD_THRESHOLD: usize = 32 * 1024;
const SESSION_PATH: &str = "/bigfleet.v1alpha1.Shard/Session";

fn buffers() -> BufferSettings {
    BufferSettings::new(SESSION_BUFFER, YIELD_THRESHOLD)
}

/// Prost encoding with [`SESSION_BUFFER`]-sized starting buffers.
#[derive(Debug, Clone, Copy, Default)]
struct SessionCodec;

impl Codec for SessionCodec {
    type Encode = ShardMessage;
    type Decode = OperatorMessage;
    type Encoder = ProstEncoder<ShardMessage>;
    type Decoder = ProstDecoder<OperatorMessage>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(buffers())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder::new(buffers())
    }
}

/// Serves `Shard/Session` (the only method of `bigfleet.v1alpha1.Shard`) with
/// [`SessionCodec`] and the mesh-wide message limits.
#[derive(Debug)]
pub struct SessionServer<T> {
    inner: Arc<T>,
}

impl<T> SessionServer<T> {
    pub fn new(inner: T) -> Self {
        Self {
            inner: Arc::new(inner),
        }
    }
}

impl<T> Clone for SessionServer<T> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<T> NamedService for SessionServer<T> {
    const NAME: &'static str = bigfleet_proto::service_names::SHARD;
}

struct SessionMethod<T>(Arc<T>);

impl<T: Shard> StreamingService<OperatorMessage> for SessionMethod<T> {
    type Response = ShardMessage;
    type ResponseStream = T::SessionStream;
    type Future = BoxFuture<tonic::Response<Self::ResponseStream>, tonic::Status>;

    fn call(&mut self, request: tonic::Request<tonic::Streaming<OperatorMessage>>) -> Self::Future {
        let inner = Arc::clone(&self.0);
        Box::pin(async move { inner.session(request).await })
    }
}

impl<T, B> tower::Service<http::Request<B>> for SessionServer<T>
where
    T: Shard,
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != SESSION_PATH {
            return Box::pin(async {
                Ok(
                    tonic::Status::unimplemented("unknown method of bigfleet.v1alpha1.Shard")
                        .into_http(),
                )
            });
        }
        let inner = Arc::clone(&self.inner);
        Box::pin(async move {
            let mut grpc = Grpc::new(SessionCodec).apply_max_message_size_config(
                Some(bigfleet_mesh::MAX_MESSAGE_SIZE),
                Some(bigfleet_mesh::MAX_MESSAGE_SIZE),
            );
            Ok(grpc.streaming(SessionMethod(inner), req).await)
        })
    }
}
