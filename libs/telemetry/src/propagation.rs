//! W3C trace context (`traceparent` / `tracestate`) in and out of headers and tonic metadata.
//!
//! The format is fixed to W3C trace-context across the mesh, so these helpers use that
//! propagator directly rather than whatever is installed globally: propagation works the
//! same in tests and in processes that never called [`crate::init`].

use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};
use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The header carrying the parent span (W3C).
pub const TRACEPARENT: &str = "traceparent";

struct HeaderInjector<'a>(&'a mut HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}

struct HeaderExtractor<'a>(&'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

struct MetadataInjector<'a>(&'a mut MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(key), Ok(value)) = (
            MetadataKey::from_bytes(key.as_bytes()),
            MetadataValue::try_from(value.as_str()),
        ) {
            self.0.insert(key, value);
        }
    }
}

struct MetadataExtractor<'a>(&'a MetadataMap);

impl Extractor for MetadataExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|k| match k {
                tonic::metadata::KeyRef::Ascii(k) => Some(k.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

/// The remote parent carried by `headers` (an empty context if there is none or it is
/// malformed).
pub fn extract_headers(headers: &HeaderMap) -> Context {
    TraceContextPropagator::new().extract(&HeaderExtractor(headers))
}

/// Writes `cx`'s span into `headers`; a context without a valid span writes nothing.
pub fn inject_headers(cx: &Context, headers: &mut HeaderMap) {
    TraceContextPropagator::new().inject_context(cx, &mut HeaderInjector(headers));
}

/// Writes the current `tracing` span's OpenTelemetry context into `headers` (nothing when
/// no OTel layer is installed — export off means no trace to continue).
pub fn inject_current_span(headers: &mut HeaderMap) {
    inject_headers(&tracing::Span::current().context(), headers);
}

/// Makes `span` a child of the remote parent in `headers`, if any. Must be called before the
/// span is first entered.
pub fn set_parent_from_headers(span: &tracing::Span, headers: &HeaderMap) {
    let cx = extract_headers(headers);
    if cx.span().span_context().is_valid() {
        // Fails only when no OTel layer is installed, in which case there is nothing to link.
        let _ = span.set_parent(cx);
    }
}

/// The remote parent carried by tonic metadata.
pub fn extract_metadata(metadata: &MetadataMap) -> Context {
    TraceContextPropagator::new().extract(&MetadataExtractor(metadata))
}

/// Writes `cx`'s span into tonic metadata.
pub fn inject_metadata(cx: &Context, metadata: &mut MetadataMap) {
    TraceContextPropagator::new().inject_context(cx, &mut MetadataInjector(metadata));
}

/// Writes the current `tracing` span's context into a request's metadata; for typed
/// clients that do not go through the mesh client stack (which does this itself).
pub fn inject_current_span_into_metadata(metadata: &mut MetadataMap) {
    inject_metadata(&tracing::Span::current().context(), metadata);
}

/// The hex trace id of the current span, if it belongs to a valid trace (for log lines and
/// tests).
pub fn current_trace_id() -> Option<String> {
    let cx = tracing::Span::current().context();
    let sc = cx.span().span_context().clone();
    sc.is_valid().then(|| sc.trace_id().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};

    fn remote_cx() -> Context {
        let sc = SpanContext::new(
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
            SpanId::from_hex("00f067aa0ba902b7").unwrap(),
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        );
        Context::new().with_remote_span_context(sc)
    }

    #[test]
    fn headers_round_trip_the_w3c_traceparent() {
        let mut headers = HeaderMap::new();
        inject_headers(&remote_cx(), &mut headers);
        assert_eq!(
            headers.get(TRACEPARENT).unwrap(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
        let back = extract_headers(&headers);
        let sc = back.span().span_context().clone();
        assert_eq!(
            sc.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(sc.span_id().to_string(), "00f067aa0ba902b7");
        assert!(sc.is_remote());
    }

    #[test]
    fn metadata_round_trips_too() {
        let mut md = MetadataMap::new();
        inject_metadata(&remote_cx(), &mut md);
        assert!(md.get(TRACEPARENT).is_some());
        let back = extract_metadata(&md);
        assert_eq!(
            back.span().span_context().trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
    }

    #[test]
    fn nothing_is_injected_without_a_trace_and_garbage_is_ignored() {
        let mut headers = HeaderMap::new();
        inject_headers(&Context::new(), &mut headers);
        assert!(headers.is_empty());
        inject_current_span(&mut headers);
        assert!(headers.is_empty());
        assert_eq!(current_trace_id(), None);

        headers.insert(TRACEPARENT, HeaderValue::from_static("00-zz-yy-01"));
        assert!(!extract_headers(&headers).span().span_context().is_valid());
    }
}
