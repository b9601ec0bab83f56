//! A hand-written `test.v1.Echo` service (no proto crate needed) and helpers shared by the
//! mesh integration tests.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bigfleet_mesh::{
    ChannelConfig, ClientStackConfig, MeshChannel, MeshServer, RateLimit, RetryPolicy,
    RunningServer, ServerStackConfig, dial, peer_of,
};
use prost::Message;
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::{Code, Status};
use tower::Service;

pub const SAY: &str = "/test.v1.Echo/Say";

#[derive(Clone, PartialEq, prost::Message)]
pub struct EchoRequest {
    #[prost(string, tag = "1")]
    pub text: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct EchoReply {
    #[prost(string, tag = "1")]
    pub text: String,
    /// The caller as the mesh identified it (`Peer` display).
    #[prost(string, tag = "2")]
    pub peer: String,
    /// The `x-attempt` metadata the client stamped, if any.
    #[prost(string, tag = "3")]
    pub attempt: String,
    /// Whether the request carried a `traceparent`.
    #[prost(bool, tag = "4")]
    pub traced: bool,
}

/// Behaviour by request text:
/// * `ok` — answers with the caller's identity;
/// * `flaky` — UNAVAILABLE for the first `fail_first` calls, then ok;
/// * `fenced` — FAILED_PRECONDITION;
/// * `sleep:<ms>` — answers after sleeping (on the first call only if `sleep_once`).
#[derive(Clone, Default)]
pub struct Echo {
    pub calls: Arc<AtomicU32>,
    pub fail_first: u32,
    pub sleep_once: bool,
}

impl Echo {
    /// An Echo whose `flaky` calls fail UNAVAILABLE the first `n` times.
    pub fn failing_first(n: u32) -> Self {
        Echo {
            fail_first: n,
            ..Echo::default()
        }
    }

    pub fn calls(&self) -> u32 {
        self.calls.load(Ordering::SeqCst)
    }

    async fn handle(
        self,
        req: tonic::Request<EchoRequest>,
    ) -> Result<tonic::Response<EchoReply>, Status> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let peer = peer_of(&req).map(ToString::to_string).unwrap_or_default();
        let attempt = req
            .metadata()
            .get("x-attempt")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let traced = req.metadata().get("traceparent").is_some();
        let text = req.into_inner().text;
        match text.as_str() {
            "flaky" if n < self.fail_first => return Err(Status::unavailable("flaky")),
            "fenced" => return Err(Status::failed_precondition("stale fencing token")),
            t if t.starts_with("sleep:") => {
                let ms: u64 = t[6..].parse().unwrap();
                if !self.sleep_once || n == 0 {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
            }
            _ => {}
        }
        Ok(tonic::Response::new(EchoReply {
            text,
            peer,
            attempt,
            traced,
        }))
    }
}

impl NamedService for Echo {
    const NAME: &'static str = "test.v1.Echo";
}

impl Service<http::Request<Body>> for Echo {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            if req.uri().path() != SAY {
                return Ok(Status::unimplemented("no such method").into_http());
            }
            let svc = tower::service_fn(move |r| this.clone().handle(r));
            let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default());
            Ok(grpc.unary(svc, req).await)
        })
    }
}

/// Calls `Say` through any channel.
pub async fn say(channel: &MeshChannel, text: &str) -> Result<EchoReply, Status> {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    grpc.unary(
        tonic::Request::new(EchoRequest {
            text: text.to_owned(),
        }),
        http::uri::PathAndQuery::from_static(SAY),
        tonic_prost::ProstCodec::<EchoRequest, EchoReply>::default(),
    )
    .await
    .map(tonic::Response::into_inner)
}

/// An encoded FileDescriptorSet describing `test.v1.Echo`, as a service would get from its
/// proto crate.
pub fn echo_descriptor_set() -> &'static [u8] {
    use prost_types::{
        DescriptorProto, FieldDescriptorProto, FileDescriptorProto, FileDescriptorSet,
        MethodDescriptorProto, ServiceDescriptorProto, field_descriptor_proto,
    };
    let string_field = |name: &str, number| FieldDescriptorProto {
        name: Some(name.into()),
        number: Some(number),
        label: Some(field_descriptor_proto::Label::Optional as i32),
        r#type: Some(field_descriptor_proto::Type::String as i32),
        json_name: Some(name.into()),
        ..Default::default()
    };
    // Both services declare the one method `Say(EchoRequest) returns (EchoReply)`.
    let say = MethodDescriptorProto {
        name: Some("Say".into()),
        input_type: Some(".test.v1.EchoRequest".into()),
        output_type: Some(".test.v1.EchoReply".into()),
        ..Default::default()
    };
    let set = FileDescriptorSet {
        file: vec![FileDescriptorProto {
            name: Some("test/v1/echo.proto".into()),
            package: Some("test.v1".into()),
            syntax: Some("proto3".into()),
            message_type: vec![
                DescriptorProto {
                    name: Some("EchoRequest".into()),
                    field: vec![string_field("text", 1)],
                    ..Default::default()
                },
                DescriptorProto {
                    name: Some("EchoReply".into()),
                    field: vec![string_field("text", 1), string_field("peer", 2)],
                    ..Default::default()
                },
            ],
            service: vec![
                ServiceDescriptorProto {
                    name: Some("Echo".into()),
                    method: vec![say.clone()],
                    ..Default::default()
                },
                // Described but never served: reflection must not advertise it.
                ServiceDescriptorProto {
                    name: Some("Unserved".into()),
                    method: vec![say.clone()],
                    ..Default::default()
                },
            ],
            ..Default::default()
        }],
    };
    Box::leak(set.encode_to_vec().into_boxed_slice())
}

/// Calls `Say` and checks that it is refused with `code` and a message mentioning `needle`.
pub async fn assert_refused(channel: &MeshChannel, code: Code, needle: &str) {
    let err = say(channel, "ok").await.unwrap_err();
    assert_eq!(err.code(), code);
    assert!(err.message().contains(needle), "{}", err.message());
}

pub fn code(r: &Result<EchoReply, Status>) -> Code {
    match r {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    }
}

/// A client stack that makes one attempt: a test sees each call's own outcome.
pub fn no_retry() -> ClientStackConfig {
    ClientStackConfig {
        retry: RetryPolicy::none(),
        ..ClientStackConfig::default()
    }
}

/// A client stack retrying under `retry`, otherwise the default.
pub fn retrying(retry: RetryPolicy) -> ClientStackConfig {
    ClientStackConfig {
        retry,
        ..ClientStackConfig::default()
    }
}

/// A server stack whose only non-default setting is a per-identity rate limit.
pub fn rate_limited(per_second: f64, burst: u32) -> ServerStackConfig {
    ServerStackConfig {
        rate_limit: Some(RateLimit { per_second, burst }),
        ..ServerStackConfig::default()
    }
}

/// A channel to `server`'s TCP listener through the client stack `stack`.
pub async fn dial_with(server: &RunningServer, stack: &ClientStackConfig) -> MeshChannel {
    dial(&tcp_target(server), &ChannelConfig::default(), stack)
        .await
        .unwrap()
}

/// A channel to `target` (`http://…` or `unix://…`) with one attempt per call.
pub async fn dial_once(target: &str) -> MeshChannel {
    dial(target, &ChannelConfig::default(), &no_retry())
        .await
        .unwrap()
}

/// `echo` served on the Unix socket `sock` behind the default stack.
pub async fn serve_echo_unix(sock: &std::path::Path, echo: Echo) -> RunningServer {
    MeshServer::new("echo", ServerStackConfig::default())
        .unix(sock)
        .add_service(echo)
        .start()
        .await
        .unwrap()
}

/// `echo` served on a loopback TCP port behind the stack `cfg`.
pub async fn serve_echo(cfg: ServerStackConfig, echo: Echo) -> RunningServer {
    MeshServer::new("echo", cfg)
        .tcp("127.0.0.1:0".parse().unwrap())
        .add_service(echo)
        .start()
        .await
        .unwrap()
}

/// The `http://` target of a server's TCP listener.
pub fn tcp_target(s: &RunningServer) -> String {
    format!("http://{}", s.tcp_addr().unwrap())
}
