//! The server stack's rejections and limits, over real connections where possible and by
//! calling the composed stack directly where a situation cannot be produced on the wire.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use bigfleet_identity::PeerIdentity;
use bigfleet_mesh::{
    AuthzPolicy, ConnInfo, GrpcMetrics, MeshChannel, PeerCert, Role, RunningServer,
    ServerStackConfig, Transport, server_stack,
};
use bigfleet_telemetry::MetricsRegistry;
use common::{
    Echo, SAY, assert_refused, code, dial_once, rate_limited, say, serve_echo, tcp_target,
};
use tonic::Code;
use tower::ServiceExt;

/// `echo` behind the stack `cfg`, and a channel to it.
async fn serve(cfg: ServerStackConfig, echo: Echo) -> (RunningServer, MeshChannel) {
    let running = serve_echo(cfg, echo).await;
    let ch = dial_once(&tcp_target(&running)).await;
    (running, ch)
}

#[tokio::test]
async fn the_rate_limit_answers_resource_exhausted_but_spares_health() {
    let (running, ch) = serve(rate_limited(0.01, 2), Echo::default()).await;
    assert_eq!(code(&say(&ch, "ok").await), Code::Ok);
    assert_eq!(code(&say(&ch, "ok").await), Code::Ok);
    assert_refused(&ch, Code::ResourceExhausted, "rate limit").await;
    // Health is exempt: probes neither consume nor get refused.
    for _ in 0..5 {
        let r = tonic_health::pb::health_client::HealthClient::new(ch.clone())
            .check(tonic_health::pb::HealthCheckRequest::default())
            .await;
        assert!(r.is_ok());
    }
    running.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_concurrency_limit_sheds_instead_of_queueing() {
    let echo = Echo::default();
    let cfg = ServerStackConfig {
        concurrency_limit: Some(1),
        ..ServerStackConfig::default()
    };
    let (running, ch) = serve(cfg, echo.clone()).await;
    let slow = tokio::spawn({
        let ch = ch.clone();
        async move { say(&ch, "sleep:400").await }
    });
    // Wait until the slow call occupies the only slot.
    while echo.calls() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let shed = say(&ch, "ok").await.unwrap_err();
    assert_eq!(shed.code(), Code::ResourceExhausted);
    assert!(slow.await.unwrap().is_ok());
    // The slot is free again.
    assert_eq!(code(&say(&ch, "ok").await), Code::Ok);
    running.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_server_timeout_answers_deadline_exceeded() {
    let cfg = ServerStackConfig {
        timeout: Some(Duration::from_millis(100)),
        ..ServerStackConfig::default()
    };
    let (running, ch) = serve(cfg, Echo::default()).await;
    assert_eq!(code(&say(&ch, "sleep:2000").await), Code::DeadlineExceeded);
    assert_eq!(code(&say(&ch, "sleep:10").await), Code::Ok);
    running.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_callers_grpc_timeout_is_enforced_too() {
    let (running, ch) = serve(ServerStackConfig::default(), Echo::default()).await;
    let mut grpc = tonic::client::Grpc::new(ch.clone());
    grpc.ready().await.unwrap();
    let mut req = tonic::Request::new(common::EchoRequest {
        text: "sleep:2000".into(),
    });
    req.set_timeout(Duration::from_millis(100));
    let started = std::time::Instant::now();
    let r: Result<tonic::Response<common::EchoReply>, _> = grpc
        .unary(
            req,
            http::uri::PathAndQuery::from_static(SAY),
            tonic_prost::ProstCodec::default(),
        )
        .await;
    assert_eq!(r.unwrap_err().code(), Code::DeadlineExceeded);
    assert!(started.elapsed() < Duration::from_secs(1));
    running.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_deadline_layer_honours_the_callers_grpc_timeout() {
    let cfg = ServerStackConfig::default();
    let (code, _) = call_stack_with(&cfg, None, "sleep:2000", Some("100m")).await;
    assert_eq!(code, Code::DeadlineExceeded);
    let (code, _) = call_stack_with(&cfg, None, "sleep:10", Some("2S")).await;
    assert_eq!(code, Code::Ok);
    // The tighter of the server's and the caller's limit wins.
    let tight = ServerStackConfig {
        timeout: Some(Duration::from_millis(50)),
        ..ServerStackConfig::default()
    };
    let (code, msg) = call_stack_with(&tight, None, "sleep:2000", Some("10S")).await;
    assert_eq!(code, Code::DeadlineExceeded);
    assert!(msg.contains("50ms"), "{msg}");
}

#[tokio::test]
async fn server_metrics_count_every_outcome() {
    let registry = MetricsRegistry::new();
    let cfg = ServerStackConfig {
        metrics: Some(GrpcMetrics::server(&registry).unwrap()),
        ..rate_limited(0.01, 2)
    };
    let (running, ch) = serve(cfg, Echo::default()).await;
    let _ = say(&ch, "ok").await;
    let _ = say(&ch, "fenced").await;
    let _ = say(&ch, "ok").await;
    running.shutdown().await.unwrap();
    let text = registry.encode_text().unwrap();
    let line = |code: &str| {
        format!(
            "grpc_server_handled_total{{grpc_code=\"{code}\",grpc_method=\"Say\",grpc_service=\"test.v1.Echo\"}} 1"
        )
    };
    assert!(text.contains(&line("OK")), "{text}");
    assert!(text.contains(&line("FailedPrecondition")), "{text}");
    assert!(text.contains(&line("ResourceExhausted")), "{text}");
    assert!(
        text.contains(
            "grpc_server_started_total{grpc_method=\"Say\",grpc_service=\"test.v1.Echo\"} 3"
        ),
        "{text}"
    );
    assert!(
        text.contains("grpc_server_handling_seconds_count{grpc_method=\"Say\",grpc_service=\"test.v1.Echo\"} 3"),
        "{text}"
    );
}

/// Calls the composed stack directly with a chosen connection identity.
async fn call_stack(cfg: &ServerStackConfig, conn: Option<ConnInfo>) -> (Code, String) {
    call_stack_with(cfg, conn, "ok", None).await
}

async fn call_stack_with(
    cfg: &ServerStackConfig,
    conn: Option<ConnInfo>,
    text: &str,
    grpc_timeout: Option<&str>,
) -> (Code, String) {
    use prost::Message;
    let mut routes = tonic::service::RoutesBuilder::default();
    routes.add_service(Echo::default());
    let stack = server_stack(routes.routes(), cfg);
    // One uncompressed gRPC frame.
    let msg = common::EchoRequest { text: text.into() }.encode_to_vec();
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    frame.extend_from_slice(&msg);
    let body = tonic::body::Body::new(http_body_util::Full::new(bytes::Bytes::from(frame)));
    let mut req = http::Request::post(format!("http://localhost{SAY}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(body)
        .unwrap();
    if let Some(t) = grpc_timeout {
        req.headers_mut().insert("grpc-timeout", t.parse().unwrap());
    }
    if let Some(info) = conn {
        req.extensions_mut().insert(info);
    }
    let resp = stack.oneshot(req).await.unwrap();
    let mut headers = resp.headers().clone();
    // Non-error responses carry the status in the trailers.
    if headers.get("grpc-status").is_none() {
        use http_body_util::BodyExt;
        let collected = resp.into_body().collect().await.unwrap();
        if let Some(t) = collected.trailers() {
            headers.extend(t.clone());
        }
    }
    match tonic::Status::from_header_map(&headers) {
        Some(status) => (status.code(), status.message().to_owned()),
        None => (Code::Ok, String::new()),
    }
}

fn tls_conn(cert: PeerCert) -> Option<ConnInfo> {
    Some(ConnInfo {
        transport: Transport::Tls,
        remote_addr: None,
        peer_cert: Arc::new(cert),
    })
}

#[tokio::test]
async fn identity_layer_answers_unauthenticated_without_a_client_certificate() {
    let cfg = ServerStackConfig {
        mtls: true,
        ..ServerStackConfig::default()
    };
    let (code, msg) = call_stack(&cfg, tls_conn(PeerCert::Missing)).await;
    assert_eq!(code, Code::Unauthenticated);
    assert!(msg.contains("client certificate required"), "{msg}");
    // No connection facts at all under mTLS: refused the same way.
    assert_eq!(call_stack(&cfg, None).await.0, Code::Unauthenticated);
    // A plaintext TCP connection reaching an mTLS stack is refused too.
    let plain = Some(ConnInfo {
        transport: Transport::Tcp,
        remote_addr: None,
        peer_cert: Arc::new(PeerCert::None),
    });
    assert_eq!(call_stack(&cfg, plain).await.0, Code::Unauthenticated);
}

#[tokio::test]
async fn authorization_layer_applies_the_policy_to_the_identity() {
    let cfg = ServerStackConfig {
        mtls: true,
        authz: Arc::new(AuthzPolicy::deny_by_default().allow_method(SAY, &[Role::Readonly])),
        ..ServerStackConfig::default()
    };
    let ok = call_stack(
        &cfg,
        tls_conn(PeerCert::Verified(Ok(PeerIdentity::Readonly))),
    )
    .await;
    assert_eq!(ok.0, Code::Ok);
    let (code, msg) = call_stack(
        &cfg,
        tls_conn(PeerCert::Verified(Ok(PeerIdentity::Cluster("a".into())))),
    )
    .await;
    assert_eq!(code, Code::PermissionDenied);
    assert!(msg.contains("bigfleet://cluster/a"), "{msg}");
    let (code, msg) = call_stack(
        &cfg,
        tls_conn(PeerCert::Verified(Err(
            bigfleet_identity::IdentityError::SanCount { found: 2 },
        ))),
    )
    .await;
    assert_eq!(code, Code::PermissionDenied);
    assert!(msg.contains("exactly one bigfleet:// URI SAN"), "{msg}");
    // Unix-socket callers are trusted by file permissions.
    let local = Some(ConnInfo {
        transport: Transport::Unix,
        remote_addr: None,
        peer_cert: Arc::new(PeerCert::None),
    });
    assert_eq!(call_stack(&cfg, local).await.0, Code::Ok);
}
