//! Trace context of work items: each item's span continues the trace of the
//! decision that produced it (`WorkItem.trace_context`, W3C keys), and the
//! links inject the current span into every outgoing call.

use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_telemetry::propagation::set_parent_from_headers;
use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};

/// The context map as headers, for the telemetry propagation helpers.
/// Invalid names or values are skipped: a broken context must not break
/// the action, it only costs the trace link.
pub fn context_headers(ctx: &std::collections::HashMap<String, String>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (k, v) in ctx {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(k.to_ascii_lowercase().as_bytes()),
            HeaderValue::from_str(v),
        ) {
            headers.insert(name, value);
        }
    }
    headers
}

/// The span one work item runs in, child of decide's context when present.
pub fn item_span(item: &mesh::WorkItem) -> tracing::Span {
    let (kind, machine, cluster) = item.action.as_ref().map_or((0, "", ""), |a| {
        (a.kind, a.machine_id.as_str(), a.cluster_id.as_str())
    });
    let kind_name = mesh::ActionKind::try_from(kind)
        .map(|k| k.as_str_name())
        .unwrap_or("ACTION_KIND_UNKNOWN");
    let span = tracing::info_span!(
        "execute",
        otel.name = %format!("execute {}", kind_name.trim_start_matches("ACTION_KIND_").to_lowercase()),
        action_id = %item.action_id,
        kind = kind_name,
        machine = %machine,
        cluster = %cluster,
        cycle = item.cycle,
    );
    if !item.trace_context.is_empty() {
        set_parent_from_headers(&span, &context_headers(&item.trace_context));
    }
    span
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn context_map_becomes_headers_and_skips_garbage() {
        let ctx = HashMap::from([
            (
                "TraceParent".to_owned(),
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned(),
            ),
            ("bad name".to_owned(), "x".to_owned()),
            ("tracestate".to_owned(), "bad\nvalue".to_owned()),
        ]);
        let headers = context_headers(&ctx);
        assert_eq!(headers.len(), 1);
        assert_eq!(
            headers.get("traceparent").unwrap(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
        let cx = bigfleet_telemetry::propagation::extract_headers(&headers);
        use opentelemetry::trace::TraceContextExt;
        assert_eq!(
            cx.span().span_context().trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
    }
}
