//! An OpenTelemetry span exporter that keeps what it is given, for suites that check
//! which spans a call produced and how they are parented.

use std::sync::{Arc, Mutex};

use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};

/// Collects every exported span; clones share one collection.
#[derive(Debug, Clone, Default)]
pub struct SpanCollector(Arc<Mutex<Vec<SpanData>>>);

impl SpanCollector {
    /// The spans exported so far, in export order.
    pub fn spans(&self) -> Vec<SpanData> {
        self.0.lock().unwrap().clone()
    }
}

impl SpanExporter for SpanCollector {
    fn export(
        &self,
        batch: Vec<SpanData>,
    ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        self.0.lock().unwrap().extend(batch);
        std::future::ready(Ok(()))
    }
}
