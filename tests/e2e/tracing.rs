//! One trace across the mesh: with `OTEL_EXPORTER_OTLP_ENDPOINT` pointed at an OTLP trace
//! receiver run by this test, a roll-up that leads to a Bootstrap yields spans from the
//! gateway, decide, execute and the provider call under one trace id — the trace that holds
//! the roll-up's hop into decide (`Ingest/ApplyRollup`) must reach the provider.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use bigfleet_proto::v1alpha1 as pb;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use parking_lot::Mutex;
use pb::MachineState as S;

use crate::harness::*;

/// (trace id hex, service.name, span name)
type Seen = Arc<Mutex<Vec<(String, String, String)>>>;

#[derive(Default, Clone)]
struct Receiver {
    seen: Seen,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut seen = self.seen.lock();
        for rs in request.into_inner().resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| r.attributes.iter())
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| kv.value.as_ref())
                .and_then(|v| match &v.value {
                    Some(Value::StringValue(s)) => Some(s.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for span in ss.spans {
                    let id: String = span.trace_id.iter().map(|b| format!("{b:02x}")).collect();
                    seen.push((id, service.clone(), span.name));
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

fn is_provider_call(service: &str, span: &str) -> bool {
    service == "bigfleet-fake-provider" || span.contains("CapacityProvider")
}

// How the trace crosses decide's cycle: ADR-0080.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollup_to_bootstrap_is_one_trace_across_gateway_decide_execute_and_provider() {
    let receiver = Receiver::default();
    let seen = receiver.seen.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(receiver))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );

    let mut sc = Scenario::start("small-gpu.json", |spec| {
        spec.coordinator = false;
        spec.inspect = false;
        spec.env.extend([
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT".into(),
                format!("http://{addr}"),
            ),
            ("OTEL_BSP_SCHEDULE_DELAY".into(), "200".into()),
        ]);
    })
    .await;
    sc.operator("traced", gpu_units(1, 1000));
    sc.wait_for(1, S::Configured, "traced", Duration::from_secs(30))
        .await;

    let wanted = [
        "bigfleet-session-gateway",
        "bigfleet-shard-decide",
        "bigfleet-shard-execute",
        // The provider's own server span, not only execute's client span.
        "bigfleet-fake-provider",
    ];
    let result = wait_until(Duration::from_secs(30), "one trace across the mesh", || async {
        let spans = seen.lock().clone();
        // trace → (services, has the provider call, has the roll-up hop)
        let mut by_trace: BTreeMap<String, (BTreeSet<String>, bool)> = BTreeMap::new();
        let mut rollup_traces = BTreeSet::new();
        for (trace, service, name) in &spans {
            let e = by_trace.entry(trace.clone()).or_default();
            e.0.insert(service.clone());
            e.1 |= is_provider_call(service, name);
            // decide's server span for the hop: `/bigfleet.mesh.v1.Ingest/ApplyRollup`.
            if name.ends_with(".Ingest/ApplyRollup") {
                rollup_traces.insert(trace.clone());
            }
        }
        let found = by_trace.iter().find(|(id, (services, provider))| {
            *provider
                && rollup_traces.contains(*id)
                && wanted.iter().all(|w| services.contains(*w))
        });
        match found {
            Some((id, _)) => Ok(id.clone()),
            None => {
                let mut names: BTreeMap<(String, String), usize> = BTreeMap::new();
                for (_, service, name) in &spans {
                    *names.entry((service.clone(), name.clone())).or_default() += 1;
                }
                let multi: Vec<Vec<String>> = by_trace
                    .iter()
                    .filter(|(_, (s, p))| s.len() > 1 || *p)
                    .map(|(id, _)| {
                        spans
                            .iter()
                            .filter(|(t, _, _)| t == id)
                            .map(|(_, svc, name)| format!("{svc}: {name}"))
                            .collect()
                    })
                    .collect();
                Err(format!(
                    "{} spans in {} traces; spans by (service, name): {names:?}; traces crossing services: {multi:?}",
                    spans.len(),
                    by_trace.len(),
                ))
            }
        }
    })
    .await;
    assert_eq!(result.len(), 32, "a 16-byte trace id");
    for (_, service, name) in seen.lock().iter().filter(|(t, _, _)| *t == result) {
        eprintln!("trace {result}: {service}: {name}");
    }
    sc.finish().await;
    server.abort();
}
