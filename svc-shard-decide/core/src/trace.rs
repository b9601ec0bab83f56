//! Trace continuity from a roll-up to the actions it causes (ADR-0080).
//!
//! A roll-up reaches decide inside the operator's trace (gateway → `ApplyRollup`), but the
//! cycle that acts on it runs later, on its own. So decide remembers, per cluster, the
//! trace context of the roll-up that last *changed* that cluster's demand, and each
//! action of a cycle continues the trace of its cluster's remembered roll-up instead of
//! the cycle's. Re-sends of unchanged demand do not move the pointer (they caused
//! nothing), and a pointer older than [`TRACE_HORIZON`] is ignored, so an action caused
//! long after (a failed machine replaced an hour later) is not glued onto an old trace.

use crate::actions::TraceContext;
use bigfleet_model::Action;
use rustc_hash::FxHashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::codegen::http::HeaderMap;
use tonic::codegen::http::header::{HeaderName, HeaderValue};

/// How long a roll-up's trace keeps absorbing its cluster's actions. Long enough for
/// provisioning and the follow-up cycles a bootstrap takes; short enough that unrelated
/// later actions start from the cycle's own trace.
pub const TRACE_HORIZON: Duration = Duration::from_secs(600);

/// The current span's W3C context as a plain map (empty when not tracing).
pub fn current_trace_context() -> TraceContext {
    let mut headers = HeaderMap::new();
    bigfleet_telemetry::propagation::inject_current_span(&mut headers);
    Arc::new(
        headers
            .iter()
            .filter_map(|(k, v)| Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned())))
            .collect(),
    )
}

fn headers_of(ctx: &TraceContext) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (k, v) in ctx.iter() {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(k.as_bytes()),
            HeaderValue::from_str(v),
        ) {
            headers.insert(name, value);
        }
    }
    headers
}

/// Per cluster: the context of the roll-up that last changed its demand, and when.
#[derive(Debug, Default)]
pub struct RollupTraces {
    by_cluster: FxHashMap<String, (TraceContext, Instant)>,
}

impl RollupTraces {
    /// Remembers `ctx` for `cluster` (an empty context — not tracing — changes nothing).
    pub fn record(&mut self, cluster: &str, ctx: TraceContext, at: Instant) {
        if !ctx.is_empty() {
            self.by_cluster.insert(cluster.to_owned(), (ctx, at));
        }
    }

    /// The remembered context of `cluster`, if still within the horizon at `now`.
    pub fn live(&self, cluster: &str, now: Instant) -> Option<&TraceContext> {
        self.by_cluster
            .get(cluster)
            .filter(|(_, at)| now.saturating_duration_since(*at) <= TRACE_HORIZON)
            .map(|(ctx, _)| ctx)
    }

    /// What one cycle needs to give each enqueued action its trace: a copy of the live
    /// pointers at `now` (so no lock is held while enqueueing) and the cycle's own
    /// context for everything else. Call inside the cycle's span.
    pub fn for_cycle(&self, cycle: u64, now: Instant, fallback: TraceContext) -> CycleTraces {
        CycleTraces {
            rollups: self
                .by_cluster
                .keys()
                .filter_map(|c| Some((c.clone(), self.live(c, now)?.clone())))
                .collect(),
            opened: FxHashMap::default(),
            cycle,
            cycle_trace: bigfleet_telemetry::propagation::current_trace_id().unwrap_or_default(),
            fallback,
        }
    }
}

/// Hands out each action's trace context during one cycle's enqueue.
#[derive(Debug)]
pub struct CycleTraces {
    rollups: FxHashMap<String, TraceContext>,
    /// The `decide actions` span context opened per cluster, this cycle.
    opened: FxHashMap<String, TraceContext>,
    cycle: u64,
    cycle_trace: String,
    fallback: TraceContext,
}

impl CycleTraces {
    /// The context `action`'s work item carries. For a cluster with a live roll-up trace,
    /// the first call opens a `decide actions` span in that roll-up's trace (recording
    /// the cycle and the cycle's trace id — the cross-trace link) and every action of
    /// the cluster gets that span as parent; otherwise the cycle's own context. Only
    /// actions actually enqueued should ask, so a cycle that queues nothing for a
    /// cluster adds nothing to its roll-up's trace.
    pub fn of(&mut self, action: &Action) -> TraceContext {
        let cluster = action.cluster();
        if let Some(ctx) = self.opened.get(cluster) {
            return ctx.clone();
        }
        let Some(parent) = self.rollups.get(cluster) else {
            return self.fallback.clone();
        };
        let span = tracing::info_span!(
            parent: None,
            "decide_actions",
            otel.name = "decide actions",
            cluster = %cluster,
            cycle = self.cycle,
            cycle_trace_id = %self.cycle_trace,
        );
        bigfleet_telemetry::propagation::set_parent_from_headers(&span, &headers_of(parent));
        let ctx = span.in_scope(current_trace_context);
        // Empty only when no OTel layer is installed; then there is no trace to continue.
        let ctx = if ctx.is_empty() {
            self.fallback.clone()
        } else {
            ctx
        };
        self.opened.insert(cluster.to_owned(), ctx.clone());
        ctx
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn ctx(span: &str) -> TraceContext {
        Arc::new(HashMap::from([(
            "traceparent".to_owned(),
            format!("00-4bf92f3577b34da6a3ce929d0e0e4736-{span}-01"),
        )]))
    }

    #[test]
    fn the_latest_recorded_roll_up_wins_until_the_horizon() {
        let t0 = Instant::now();
        let mut r = RollupTraces::default();
        r.record("c1", ctx("00f067aa0ba902b7"), t0);
        r.record("c1", ctx("00f067aa0ba902b8"), t0);
        r.record("c1", Arc::default(), t0);
        assert_eq!(r.live("c1", t0), Some(&ctx("00f067aa0ba902b8")));
        assert_eq!(
            r.live("c1", t0 + TRACE_HORIZON),
            Some(&ctx("00f067aa0ba902b8"))
        );
        assert_eq!(
            r.live("c1", t0 + TRACE_HORIZON + Duration::from_secs(1)),
            None
        );
        assert_eq!(r.live("c2", t0), None);
    }

    #[test]
    fn without_a_live_roll_up_trace_actions_keep_the_cycles_context() {
        let t0 = Instant::now();
        let mut r = RollupTraces::default();
        r.record("old", ctx("00f067aa0ba902b7"), t0);
        let cycle_ctx = ctx("00f067aa0ba902b9");
        let later = t0 + TRACE_HORIZON + Duration::from_secs(1);
        let mut traces = r.for_cycle(7, later, cycle_ctx.clone());
        for cluster in ["old", "never"] {
            let a = Action::Reclaim {
                machine_id: "m1".into(),
                cluster: cluster.into(),
                grace: Duration::from_secs(1),
            };
            assert_eq!(traces.of(&a), cycle_ctx, "{cluster}");
        }
        assert!(traces.rollups.is_empty());
    }

    #[test]
    fn headers_round_trip_the_context_and_skip_garbage() {
        let mut c = (*ctx("00f067aa0ba902b7")).clone();
        c.insert("bad name".to_owned(), "x".to_owned());
        let h = headers_of(&Arc::new(c));
        assert_eq!(h.len(), 1);
        assert_eq!(
            h.get("traceparent").unwrap(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
    }
}
