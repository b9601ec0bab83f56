//! The `bigfleet.v1alpha1.Shard` tower service with small codec buffers.
//!
//! tonic allocates an 8 KiB encode and an 8 KiB decode buffer per call up front and keeps
//! them for the call's lifetime. A session is one call that lives for days, and a gateway
//! holds 10,000 of them, so the generated server's defaults would cost most of the per-session
//! memory budget while sessions idle. This is the generated dispatch for the one method,
//! with a codec whose buffers start small; they still grow to fit any message (up to the
//! configured roll-up limit), so nothing is lost but the idle reservation.
//!
//! Two size bounds apply before a single byte is buffered: the first frame (the Hello, read
//! before anything is known about the caller) may declare at most `max_hello_bytes`, every
//! later frame at most `max_rollup_bytes`. Both are checked against the gRPC length prefix,
//! so a stream announcing a 200 MiB frame is refused at its fifth byte.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Buf;
use http_body::Frame;

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
    max_first: usize,
    max_frame: usize,
}

impl<T> SessionServer<T> {
    /// `max_first`: largest first frame (the Hello); `max_frame`: largest later frame.
    pub fn new(inner: T, max_first: usize, max_frame: usize) -> Self {
        Self {
            inner: Arc::new(inner),
            max_first,
            max_frame,
        }
    }
}

impl<T> Clone for SessionServer<T> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            max_first: self.max_first,
            max_frame: self.max_frame,
        }
    }
}

pin_project_lite::pin_project! {
    /// Reads the gRPC length prefix of the stream's first message as it arrives and fails the
    /// body at once if it declares more than `limit` bytes; afterwards a plain pass-through.
    struct FirstFrameLimit<B> {
        #[pin]
        inner: B,
        header: [u8; 5],
        seen: usize,
        limit: usize,
    }
}

impl<B> FirstFrameLimit<B> {
    fn new(inner: B, limit: usize) -> Self {
        Self {
            inner,
            header: [0; 5],
            seen: 0,
            limit,
        }
    }
}

/// Copies up to the rest of a 5-byte header out of `data` without consuming it.
fn peek_header(data: &impl Buf, header: &mut [u8; 5], seen: &mut usize) {
    let mut slices = [std::io::IoSlice::new(&[]); 8];
    let n = data.chunks_vectored(&mut slices);
    for slice in &slices[..n] {
        for &b in slice.iter() {
            if *seen == header.len() {
                return;
            }
            header[*seen] = b;
            *seen += 1;
        }
    }
}

impl<B> Body for FirstFrameLimit<B>
where
    B: Body,
    B::Error: Into<StdError>,
{
    type Data = B::Data;
    type Error = StdError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = match ready!(this.inner.poll_frame(cx)) {
            None => return Poll::Ready(None),
            Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
            Some(Ok(frame)) => frame,
        };
        if *this.seen < this.header.len()
            && let Some(data) = frame.data_ref()
        {
            peek_header(data, this.header, this.seen);
            if *this.seen == this.header.len() {
                let declared = u32::from_be_bytes([
                    this.header[1],
                    this.header[2],
                    this.header[3],
                    this.header[4],
                ]) as usize;
                if declared > *this.limit {
                    // tonic finds the Status in the error and answers with its code.
                    let status = tonic::Status::resource_exhausted(format!(
                        "first frame declares {declared} bytes; a hello may be at most {}",
                        this.limit
                    ));
                    return Poll::Ready(Some(Err(Box::new(status))));
                }
            }
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
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
        let (max_first, max_frame) = (self.max_first, self.max_frame);
        let req = req.map(|body| FirstFrameLimit::new(body, max_first));
        Box::pin(async move {
            let mut grpc = Grpc::new(SessionCodec).apply_max_message_size_config(
                Some(max_frame),
                Some(bigfleet_mesh::MAX_MESSAGE_SIZE),
            );
            Ok(grpc.streaming(SessionMethod(inner), req).await)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn grpc_frame(len: u32, payload: &[u8]) -> bytes::Bytes {
        let mut v = vec![0u8];
        v.extend_from_slice(&len.to_be_bytes());
        v.extend_from_slice(payload);
        bytes::Bytes::from(v)
    }

    async fn drain(chunks: Vec<bytes::Bytes>, limit: usize) -> Result<usize, tonic::Status> {
        let stream = futures::stream::iter(
            chunks
                .into_iter()
                .map(|c| Ok::<_, Infallible>(Frame::data(c))),
        );
        let body = http_body_util::StreamBody::new(stream);
        let mut guarded = FirstFrameLimit::new(body, limit);
        let mut n = 0;
        while let Some(frame) = guarded.frame().await {
            match frame {
                Ok(f) => n += f.into_data().map_or(0, |d| d.len()),
                Err(e) => {
                    return Err(e
                        .downcast::<tonic::Status>()
                        .map(|s| *s)
                        .unwrap_or_else(|e| tonic::Status::unknown(e.to_string())));
                }
            }
        }
        Ok(n)
    }

    #[tokio::test]
    async fn a_first_frame_over_the_limit_fails_at_its_header() {
        let err = drain(vec![grpc_frame(200 << 20, b"x")], 64 * 1024)
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        assert!(err.message().contains("209715200"), "{}", err.message());
    }

    #[tokio::test]
    async fn a_header_split_across_chunks_is_still_read() {
        let whole = grpc_frame(1 << 20, b"");
        let chunks = whole
            .iter()
            .map(|b| bytes::Bytes::copy_from_slice(&[*b]))
            .collect();
        let err = drain(chunks, 1024).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
    }

    #[tokio::test]
    async fn small_first_frames_and_any_later_frames_pass() {
        let first = grpc_frame(3, b"abc");
        // Only the first frame is bounded here; later frames are the codec's business.
        let second = grpc_frame(10 << 20, b"");
        let n = drain(vec![first, second], 64).await.unwrap();
        assert_eq!(n, 8 + 5);
    }
}
