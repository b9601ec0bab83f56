//! The provider conformance suite (`docs/provider-guide.md`): what any
//! `bigfleet.v1alpha1.CapacityProvider` must do for a shard to drive it safely.
//!
//! Every test is an async function over a connected client. The target must be pre-seeded
//! with SPECULATIVE slots (about 30 for one run of the suite) because tests create their
//! own machines from them; they never touch machines they did not create. Every test
//! mints its own run-unique shard id (`conformance-<test>-<unix nanos>`), so runs do not
//! fence each other. Polls use Get every 100 ms (5 ms where the test watches transitional
//! states).
//!
//! [`cases`] lists the tests that work against any provider; [`node_readiness_adr0056`]
//! needs the in-process fake to play the node. [`run_suite`] runs a list and reports.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bigfleet_proto::v1alpha1::capacity_provider_client::CapacityProviderClient;
use bigfleet_proto::v1alpha1::{
    ConfigureRequest, CreateRequest, DeleteRequest, DrainRequest, ListFilter, Machine, MachineRef,
    MachineState, TransitionAck,
};
use futures::future::BoxFuture;
use tonic::Code;
use tonic::transport::Channel;

use crate::FakeProvider;

/// A connected provider client (cheap to clone: clones share the channel).
pub type Client = CapacityProviderClient<Channel>;

/// Why a test failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Failure(pub String);

/// `Ok(None)`: passed; `Ok(Some(note))`: passed with a remark (e.g. optional Delete is
/// unimplemented); `Err`: failed.
pub type Outcome = Result<Option<String>, Failure>;

macro_rules! fail {
    ($($t:tt)*) => { return Err(Failure(format!($($t)*))) };
}

macro_rules! ensure {
    ($cond:expr, $($t:tt)*) => { if !$cond { fail!($($t)*); } };
}

/// One runnable test.
#[derive(Clone, Copy)]
pub struct Case {
    pub name: &'static str,
    pub run: fn(Client) -> BoxFuture<'static, Outcome>,
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

macro_rules! case {
    ($name:literal, $f:path) => {
        Case {
            name: $name,
            run: |c| Box::pin($f(c)),
        }
    };
}

/// Every test that runs against any provider, in a stable order.
pub fn cases() -> Vec<Case> {
    vec![
        case!("FullLifecycle", full_lifecycle),
        case!("CreateIdempotent", create_idempotent),
        case!("ConfigureIdempotent", configure_idempotent),
        case!("DrainIdempotent", drain_idempotent),
        case!("DeleteIdempotent", delete_idempotent),
        case!("GetUnknownMachine", get_unknown_machine),
        case!("EmptyMachineIdRejected", empty_machine_id_rejected),
        case!("DeleteUnknownMachine", delete_unknown_machine),
        case!("ListFiltersByState", list_filters_by_state),
        case!("ListMaxResults", list_max_results),
        case!("ListTruncatedPageCursor", list_truncated_page_cursor),
        case!("LabelShape", label_shape),
        case!("HostShape", host_shape),
        case!("CostFieldBounds", cost_field_bounds),
        case!("ListRevisionAdvances", list_revision_advances),
        case!("DrainOnSpeculative", drain_on_speculative),
        case!("DeleteOnConfigured", delete_on_configured),
        case!(
            "TransitionalStateObservability",
            transitional_state_observability
        ),
        case!("DrainGraceTimeout", drain_grace_timeout),
        case!(
            "FencingUnknownShardAccepted",
            fencing_unknown_shard_accepted
        ),
        case!("FencingStaleEpochRejected", fencing_stale_epoch_rejected),
        case!(
            "FencingStaleSequenceRejected",
            fencing_stale_sequence_rejected
        ),
        case!("FencingPerMachineIsolation", fencing_per_machine_isolation),
        case!(
            "FencingNewEpochResetsSequence",
            fencing_new_epoch_resets_sequence
        ),
        case!("FencingReadsUnaffected", fencing_reads_unaffected),
        case!(
            "FencingCheckedBeforeNotFound",
            fencing_checked_before_not_found
        ),
        case!(
            "MetadataEchoedOnGetAndList",
            metadata_echoed_on_get_and_list
        ),
        case!(
            "MetadataAndBindingClearOnDrain",
            metadata_and_binding_clear_on_drain
        ),
        case!(
            "MetadataUnknownKeysPreservedVerbatim",
            metadata_unknown_keys_preserved_verbatim
        ),
    ]
}

/// The result of one test.
#[derive(Debug, Clone)]
pub struct TestResult {
    pub name: &'static str,
    pub outcome: Outcome,
    pub took: Duration,
}

impl TestResult {
    pub fn passed(&self) -> bool {
        self.outcome.is_ok()
    }

    /// `PASS name (12 ms)`, `PASS name (3 ms): note` or `FAIL name (40 ms): reason`.
    pub fn line(&self) -> String {
        let ms = self.took.as_millis();
        match &self.outcome {
            Ok(None) => format!("PASS {} ({ms} ms)", self.name),
            Ok(Some(note)) => format!("PASS {} ({ms} ms): {note}", self.name),
            Err(f) => format!("FAIL {} ({ms} ms): {f}", self.name),
        }
    }
}

/// All results of a run.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub results: Vec<TestResult>,
}

impl Report {
    pub fn passed(&self) -> usize {
        self.results.iter().filter(|r| r.passed()).count()
    }

    pub fn failed(&self) -> usize {
        self.results.len() - self.passed()
    }

    /// `N passed, M failed`.
    pub fn summary(&self) -> String {
        format!("{} passed, {} failed", self.passed(), self.failed())
    }

    pub fn failures(&self) -> Vec<&TestResult> {
        self.results.iter().filter(|r| !r.passed()).collect()
    }
}

/// Longest any single test may take before it counts as failed.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(90);

/// Runs `cases` one after another (they share the target's speculative slots), calling
/// `on_result` after each.
pub async fn run_suite(
    client: &Client,
    cases: &[Case],
    mut on_result: impl FnMut(&TestResult),
) -> Report {
    let mut report = Report::default();
    for case in cases {
        let started = Instant::now();
        let outcome = match tokio::time::timeout(TEST_TIMEOUT, (case.run)(client.clone())).await {
            Ok(o) => o,
            Err(_) => Err(Failure(format!("timed out after {TEST_TIMEOUT:?}"))),
        };
        let result = TestResult {
            name: case.name,
            outcome,
            took: started.elapsed(),
        };
        on_result(&result);
        report.results.push(result);
    }
    report
}

mod fake_only;
mod fencing;
mod helpers;
mod lifecycle;
mod metadata;
mod reads;
mod transitions;
pub use fake_only::*;
pub use fencing::*;
use helpers::*;
pub use lifecycle::*;
pub use metadata::*;
pub use reads::*;
pub use transitions::*;
