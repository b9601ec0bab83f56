//! Trace context: a work item's span is a child of the context decide put on
//! the item, and that trace continues into the calls the worker makes, including a
//! client span per provider RPC that the fake provider's server span continues.
//! It installs the global tracing subscriber, which is safe because nextest gives every
//! test a process of its own (docs/testing.md).

use crate::common;

use std::collections::HashMap;

use bigfleet_fake_provider::ProviderConfig;
use bigfleet_model::MachineState::*;
use bigfleet_testkit::SpanCollector;
use common::*;
use opentelemetry::trace::{SpanKind, TracerProvider as _};
use svc_shard_execute::start;
use tracing_subscriber::layer::SubscriberExt;

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const DECIDE_SPAN: &str = "00f067aa0ba902b7";

#[tokio::test]
async fn an_items_trace_continues_into_the_gateway_call() {
    let spans = SpanCollector::default();
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_simple_exporter(spans.clone())
        .build();
    let tracer = provider.tracer("execute-test");
    let subscriber =
        tracing_subscriber::registry().with(tracing_opentelemetry::layer().with_tracer(tracer));
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let m = mesh(ProviderConfig::default()).await;
    m.seed(machine("idle-1", Idle, ""));
    m.seed(machine("idle-2", Idle, ""));
    m.decide.enqueue_traced(
        bootstrap("idle-1", "c1"),
        HashMap::from([(
            "traceparent".to_owned(),
            format!("00-{TRACE_ID}-{DECIDE_SPAN}-01"),
        )]),
    );
    // No context: the worker starts a trace of its own.
    m.decide.enqueue(bootstrap("idle-2", "c1"));
    let running = start(m.config("w1", 1)).await.unwrap();
    m.wait_dones(2).await;
    running.shutdown().await;

    let calls = m.gateway.bootstraps();
    let parent = |id: &str| {
        calls
            .iter()
            .find(|c| c.machine_id == id)
            .and_then(|c| c.traceparent.clone())
            .unwrap_or_else(|| panic!("no traceparent on the call for {id}: {calls:?}"))
    };
    let traced = parent("idle-1");
    let parts: Vec<_> = traced.split('-').collect();
    assert_eq!(parts[1], TRACE_ID, "{traced}");
    assert_ne!(
        parts[2], DECIDE_SPAN,
        "the call's parent is the worker's own span"
    );
    let untraced = parent("idle-2");
    assert_ne!(untraced.split('-').nth(1), Some(TRACE_ID));

    // The provider call: execute's client span in decide's trace, and the (in-process)
    // fake provider's server span as its child.
    provider.force_flush().unwrap();
    let spans = spans.spans();
    let configure = "/bigfleet.v1alpha1.CapacityProvider/Configure";
    let client = spans
        .iter()
        .find(|s| {
            s.name == configure
                && s.span_kind == SpanKind::Client
                && s.span_context.trace_id().to_string() == TRACE_ID
        })
        .unwrap_or_else(|| panic!("no client span for Configure in the trace: {spans:#?}"));
    let server = spans
        .iter()
        .find(|s| {
            s.name == configure
                && s.span_kind == SpanKind::Server
                && s.parent_span_id == client.span_context.span_id()
        })
        .unwrap_or_else(|| panic!("no provider server span under the client span: {spans:#?}"));
    assert_eq!(
        server.span_context.trace_id(),
        client.span_context.trace_id()
    );
    let item = spans
        .iter()
        .find(|s| s.span_context.span_id() == client.parent_span_id)
        .expect("the client span's parent is exported");
    assert_eq!(item.name, "execute bootstrap");
}
