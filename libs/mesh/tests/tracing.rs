//! One trace across a call: the client stack injects the caller's span as `traceparent`
//! and the server stack's span continues it. It installs the global subscriber, which is safe
//! because nextest gives every test a process of its own (docs/testing.md).

use crate::common;

use bigfleet_mesh::{ChannelConfig, ClientStackConfig, dial};
use bigfleet_testkit::SpanCollector;
use common::{Echo, say, serve_echo_unix};
use opentelemetry::trace::{SpanKind, TracerProvider as _};
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

#[tokio::test]
async fn the_server_span_is_a_child_of_the_callers_span() {
    let spans = SpanCollector::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(spans.clone())
        .build();
    tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")))
        .try_init()
        .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("echo.sock");
    let server = serve_echo_unix(&sock, Echo::default()).await;
    let ch = dial(
        &format!("unix://{}", sock.display()),
        &ChannelConfig::default(),
        &ClientStackConfig::default(),
    )
    .await
    .unwrap();

    let root = tracing::info_span!("operator_rollup");
    let reply = async { say(&ch, "ok").await }
        .instrument(root.clone())
        .await
        .unwrap();
    assert!(reply.traced, "the request carried a traceparent");
    drop(root);
    server.shutdown().await.unwrap();
    provider.force_flush().unwrap();

    let spans = spans.spans();
    let root = spans
        .iter()
        .find(|s| s.name == "operator_rollup")
        .expect("root span exported");
    let server_span = spans
        .iter()
        .find(|s| s.name == "/test.v1.Echo/Say")
        .expect("server span exported");
    assert_eq!(server_span.span_kind, SpanKind::Server);
    assert_eq!(
        server_span.span_context.trace_id(),
        root.span_context.trace_id()
    );
    assert_eq!(server_span.parent_span_id, root.span_context.span_id());
    assert!(server_span.parent_span_is_remote);
}
