//! With OTEL_EXPORTER_OTLP_ENDPOINT configured, spans reach an OTLP/gRPC collector and keep
//! the remote parent's trace id. It installs the global subscriber, which is safe because
//! nextest gives every test a process of its own (docs/testing.md).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bigfleet_telemetry::propagation::{
    current_trace_id, extract_headers, inject_current_span, set_parent_from_headers,
};
use bigfleet_telemetry::{LogFormat, OTEL_ENDPOINT_ENV, TelemetryConfig, init};
use opentelemetry::trace::TraceContextExt;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;

#[derive(Default, Clone)]
struct Collector {
    got: Arc<Mutex<Vec<ExportTraceServiceRequest>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.got.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

async fn start_collector() -> (SocketAddr, Collector) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let collector = Collector::default();
    let svc = TraceServiceServer::new(collector.clone());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    (addr, collector)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_are_exported_with_the_remote_parent() {
    let (addr, collector) = start_collector().await;
    let endpoint = format!("http://{addr}");
    let cfg = TelemetryConfig::from_lookup("bigfleet-test", LogFormat::Text, |k| {
        (k == OTEL_ENDPOINT_ENV).then(|| endpoint.clone())
    });
    let guard = init(&cfg).unwrap();
    assert!(guard.exporting());

    let mut incoming = http::HeaderMap::new();
    incoming.insert(
        "traceparent",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
            .parse()
            .unwrap(),
    );
    let span = tracing::info_span!("handle_rollup", cluster = "a");
    set_parent_from_headers(&span, &incoming);
    let outgoing = span.in_scope(|| {
        assert_eq!(
            current_trace_id().as_deref(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        let mut out = http::HeaderMap::new();
        inject_current_span(&mut out);
        out
    });
    drop(span);
    // The next hop continues the same trace, with our span as its parent.
    let next = extract_headers(&outgoing);
    assert_eq!(
        next.span().span_context().trace_id().to_string(),
        "4bf92f3577b34da6a3ce929d0e0e4736"
    );
    assert_ne!(
        next.span().span_context().span_id().to_string(),
        "00f067aa0ba902b7"
    );

    // Flushes the batch processor.
    tokio::task::spawn_blocking(move || guard.shutdown())
        .await
        .unwrap();

    let mut found = None;
    for _ in 0..50 {
        let got = collector.got.lock().unwrap().clone();
        for req in got {
            for rs in req.resource_spans {
                let service = rs
                    .resource
                    .iter()
                    .flat_map(|r| r.attributes.iter())
                    .find(|kv| kv.key == "service.name")
                    .and_then(|kv| kv.value.clone())
                    .and_then(|v| v.value);
                for ss in rs.scope_spans {
                    for s in ss.spans {
                        if s.name == "handle_rollup" {
                            found = Some((s, service.clone()));
                        }
                    }
                }
            }
        }
        if found.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (span, service) = found.expect("the span reached the collector");
    assert_eq!(hex(&span.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(hex(&span.parent_span_id), "00f067aa0ba902b7");
    assert_eq!(
        service,
        Some(Value::StringValue("bigfleet-test".to_owned()))
    );
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
