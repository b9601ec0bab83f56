//! The provider conformance suite (`ref/wire-and-ops.md` §11.1): what any
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

// ---- helpers ----------------------------------------------------------------------------

fn unix_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default()
}

/// Tokens of one test: a run-unique shard id and a strictly increasing sequence.
struct Ctx {
    shard: String,
    epoch: i64,
    seq: AtomicI64,
}

impl Ctx {
    fn new(prefix: &str) -> Self {
        Self {
            shard: format!("conformance-{prefix}-{}", unix_nanos()),
            epoch: 1,
            seq: AtomicI64::new(0),
        }
    }

    fn next(&self) -> (String, i64, i64) {
        (
            self.shard.clone(),
            self.epoch,
            self.seq.fetch_add(1, Ordering::Relaxed) + 1,
        )
    }
}

fn create_req(
    id: &str,
    (shard_id, shard_epoch, sequence_number): (String, i64, i64),
) -> CreateRequest {
    CreateRequest {
        machine_id: id.to_owned(),
        shard_id,
        shard_epoch,
        sequence_number,
    }
}

fn configure_req(
    id: &str,
    cluster: &str,
    metadata: BTreeMap<String, String>,
    (shard_id, shard_epoch, sequence_number): (String, i64, i64),
) -> ConfigureRequest {
    ConfigureRequest {
        machine_id: id.to_owned(),
        cluster_id: cluster.to_owned(),
        bootstrap_blob: b"#cloud-config\n".to_vec(),
        shard_id,
        shard_epoch,
        sequence_number,
        shard_metadata: metadata,
    }
}

fn drain_req(
    id: &str,
    grace: i64,
    (shard_id, shard_epoch, sequence_number): (String, i64, i64),
) -> DrainRequest {
    DrainRequest {
        machine_id: id.to_owned(),
        grace_period_seconds: grace,
        shard_id,
        shard_epoch,
        sequence_number,
    }
}

fn delete_req(
    id: &str,
    (shard_id, shard_epoch, sequence_number): (String, i64, i64),
) -> DeleteRequest {
    DeleteRequest {
        machine_id: id.to_owned(),
        shard_id,
        shard_epoch,
        sequence_number,
    }
}

fn state_of(m: &Machine) -> String {
    MachineState::try_from(m.state)
        .map(|s| s.as_str_name().to_owned())
        .unwrap_or_else(|_| format!("state {}", m.state))
}

fn ack_op(
    what: &str,
    r: Result<tonic::Response<TransitionAck>, tonic::Status>,
) -> Result<String, Failure> {
    match r {
        Ok(ack) => {
            let op = ack.into_inner().operation_id;
            if op.is_empty() {
                Err(Failure(format!("{what}: empty operation_id")))
            } else {
                Ok(op)
            }
        }
        Err(s) => Err(Failure(format!("{what}: {:?} {}", s.code(), s.message()))),
    }
}

fn expect_code<T: std::fmt::Debug>(
    what: &str,
    r: Result<tonic::Response<T>, tonic::Status>,
    code: Code,
) -> Result<(), Failure> {
    match r {
        Ok(v) => Err(Failure(format!(
            "{what}: expected {code:?}, got success {:?}",
            v.into_inner()
        ))),
        Err(s) if s.code() == code => Ok(()),
        Err(s) => Err(Failure(format!(
            "{what}: expected {code:?}, got {:?} {}",
            s.code(),
            s.message()
        ))),
    }
}

async fn get(client: &mut Client, id: &str) -> Result<Machine, Failure> {
    client
        .get(MachineRef { id: id.to_owned() })
        .await
        .map(tonic::Response::into_inner)
        .map_err(|s| Failure(format!("Get({id}): {:?} {}", s.code(), s.message())))
}

async fn list(client: &mut Client, filter: ListFilter) -> Result<(Vec<Machine>, Vec<u8>), Failure> {
    client
        .list(filter)
        .await
        .map(|r| {
            let l = r.into_inner();
            (l.machines, l.revision)
        })
        .map_err(|s| Failure(format!("List: {:?} {}", s.code(), s.message())))
}

/// Polls Get every 100 ms until the machine is in `target`; FAILED (when not the target)
/// ends the wait early.
async fn wait_state(
    client: &mut Client,
    id: &str,
    target: MachineState,
    within: Duration,
) -> Result<Machine, Failure> {
    let deadline = Instant::now() + within;
    loop {
        let m = get(client, id).await?;
        if m.state == target as i32 {
            return Ok(m);
        }
        if m.state == MachineState::Failed as i32 {
            fail!(
                "machine {id} went FAILED ({:?}) while waiting for {}",
                m.last_error,
                target.as_str_name()
            );
        }
        if Instant::now() >= deadline {
            fail!(
                "machine {id} still {} after {within:?}, expected {}",
                state_of(&m),
                target.as_str_name()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

static CLAIMS: AtomicU64 = AtomicU64::new(0);

/// A SPECULATIVE machine to work on, spread over the first slots the provider lists so
/// concurrent runs rarely collide.
async fn claim_speculative(client: &mut Client) -> Result<String, Failure> {
    let (machines, _) = list(
        client,
        ListFilter {
            states: vec![MachineState::Speculative as i32],
            max_results: 256,
            ..ListFilter::default()
        },
    )
    .await?;
    let candidates: Vec<&Machine> = machines
        .iter()
        .filter(|m| m.state == MachineState::Speculative as i32)
        .collect();
    if candidates.is_empty() {
        fail!("the provider has no SPECULATIVE machines left; seed more slots");
    }
    let pick = (CLAIMS.fetch_add(1, Ordering::Relaxed) as usize + (unix_nanos() % 7919) as usize)
        % candidates.len();
    Ok(candidates[pick].id.clone())
}

async fn make_idle(client: &mut Client, ctx: &Ctx) -> Result<String, Failure> {
    let id = claim_speculative(client).await?;
    ack_op("Create", client.create(create_req(&id, ctx.next())).await)?;
    wait_state(client, &id, MachineState::Idle, Duration::from_secs(10)).await?;
    Ok(id)
}

async fn make_configured(
    client: &mut Client,
    ctx: &Ctx,
    cluster: &str,
    metadata: BTreeMap<String, String>,
) -> Result<String, Failure> {
    let id = make_idle(client, ctx).await?;
    ack_op(
        "Configure",
        client
            .configure(configure_req(&id, cluster, metadata, ctx.next()))
            .await,
    )?;
    wait_state(
        client,
        &id,
        MachineState::Configured,
        Duration::from_secs(10),
    )
    .await?;
    Ok(id)
}

fn cluster_name() -> String {
    format!("conformance-cluster-{}", unix_nanos())
}

fn unknown_id() -> String {
    format!("conformance-no-such-machine-{}", unix_nanos())
}

// ---- lifecycle and idempotency ----------------------------------------------------------

/// SPECULATIVE → IDLE → CONFIGURED → IDLE → SPECULATIVE with non-empty operation ids;
/// Delete answering UNIMPLEMENTED passes.
pub async fn full_lifecycle(mut client: Client) -> Outcome {
    let ctx = Ctx::new("lifecycle");
    let id = claim_speculative(&mut client).await?;
    ack_op("Create", client.create(create_req(&id, ctx.next())).await)?;
    wait_state(
        &mut client,
        &id,
        MachineState::Idle,
        Duration::from_secs(10),
    )
    .await?;
    let cluster = cluster_name();
    ack_op(
        "Configure",
        client
            .configure(configure_req(&id, &cluster, BTreeMap::new(), ctx.next()))
            .await,
    )?;
    let m = wait_state(
        &mut client,
        &id,
        MachineState::Configured,
        Duration::from_secs(10),
    )
    .await?;
    ensure!(
        m.cluster == cluster,
        "configured machine reports cluster {:?}, sent {cluster:?}",
        m.cluster
    );
    ack_op("Drain", client.drain(drain_req(&id, 30, ctx.next())).await)?;
    wait_state(
        &mut client,
        &id,
        MachineState::Idle,
        Duration::from_secs(30),
    )
    .await?;
    match client.delete(delete_req(&id, ctx.next())).await {
        Err(s) if s.code() == Code::Unimplemented => {
            return Ok(Some("Delete is unimplemented (allowed)".into()));
        }
        r => {
            ack_op("Delete", r)?;
        }
    }
    wait_state(
        &mut client,
        &id,
        MachineState::Speculative,
        Duration::from_secs(10),
    )
    .await?;
    Ok(None)
}

fn same_op(what: &str, a: &str, b: &str) -> Result<(), Failure> {
    ensure!(
        a == b,
        "{what} repeated: operation ids differ ({a:?} vs {b:?})"
    );
    Ok(())
}

pub async fn create_idempotent(mut client: Client) -> Outcome {
    let ctx = Ctx::new("create-idem");
    let id = claim_speculative(&mut client).await?;
    let a = ack_op("Create", client.create(create_req(&id, ctx.next())).await)?;
    let b = ack_op(
        "Create again",
        client.create(create_req(&id, ctx.next())).await,
    )?;
    same_op("Create", &a, &b)?;
    Ok(None)
}

pub async fn configure_idempotent(mut client: Client) -> Outcome {
    let ctx = Ctx::new("configure-idem");
    let id = make_idle(&mut client, &ctx).await?;
    let cluster = cluster_name();
    let a = ack_op(
        "Configure",
        client
            .configure(configure_req(&id, &cluster, BTreeMap::new(), ctx.next()))
            .await,
    )?;
    let b = ack_op(
        "Configure again",
        client
            .configure(configure_req(&id, &cluster, BTreeMap::new(), ctx.next()))
            .await,
    )?;
    same_op("Configure", &a, &b)?;
    Ok(None)
}

pub async fn drain_idempotent(mut client: Client) -> Outcome {
    let ctx = Ctx::new("drain-idem");
    let id = make_configured(&mut client, &ctx, &cluster_name(), BTreeMap::new()).await?;
    let a = ack_op("Drain", client.drain(drain_req(&id, 30, ctx.next())).await)?;
    let b = ack_op(
        "Drain again",
        client.drain(drain_req(&id, 30, ctx.next())).await,
    )?;
    same_op("Drain", &a, &b)?;
    Ok(None)
}

pub async fn delete_idempotent(mut client: Client) -> Outcome {
    let ctx = Ctx::new("delete-idem");
    let id = make_idle(&mut client, &ctx).await?;
    let a = match client.delete(delete_req(&id, ctx.next())).await {
        Err(s) if s.code() == Code::Unimplemented => {
            return Ok(Some("Delete is unimplemented (allowed)".into()));
        }
        r => ack_op("Delete", r)?,
    };
    let b = ack_op(
        "Delete again",
        client.delete(delete_req(&id, ctx.next())).await,
    )?;
    same_op("Delete", &a, &b)?;
    Ok(None)
}

// ---- reads ------------------------------------------------------------------------------

pub async fn get_unknown_machine(mut client: Client) -> Outcome {
    expect_code(
        "Get(unknown)",
        client.get(MachineRef { id: unknown_id() }).await,
        Code::NotFound,
    )?;
    Ok(None)
}

/// An empty `machine_id` is INVALID_ARGUMENT on every machine RPC (never NOT_FOUND, and
/// checked before the fence, so never FAILED_PRECONDITION) — the rule of the original's
/// provider kit and its extension suite.
pub async fn empty_machine_id_rejected(mut client: Client) -> Outcome {
    let ctx = Ctx::new("empty-id");
    expect_code(
        "Get(\"\")",
        client.get(MachineRef { id: String::new() }).await,
        Code::InvalidArgument,
    )?;
    expect_code(
        "Create(\"\")",
        client.create(create_req("", ctx.next())).await,
        Code::InvalidArgument,
    )?;
    expect_code(
        "Configure(\"\")",
        client
            .configure(configure_req(
                "",
                &cluster_name(),
                BTreeMap::new(),
                ctx.next(),
            ))
            .await,
        Code::InvalidArgument,
    )?;
    expect_code(
        "Drain(\"\")",
        client.drain(drain_req("", 0, ctx.next())).await,
        Code::InvalidArgument,
    )?;
    match client.delete(delete_req("", ctx.next())).await {
        Err(s) if s.code() == Code::InvalidArgument => {}
        Err(s) if s.code() == Code::Unimplemented => {}
        other => fail!("Delete(\"\"): expected InvalidArgument, got {other:?}"),
    }
    Ok(None)
}

pub async fn delete_unknown_machine(mut client: Client) -> Outcome {
    let ctx = Ctx::new("delete-unknown");
    match client.delete(delete_req(&unknown_id(), ctx.next())).await {
        Err(s) if s.code() == Code::NotFound => Ok(None),
        Err(s) if s.code() == Code::Unimplemented => Ok(Some("Delete is unimplemented".into())),
        Err(s) => fail!(
            "Delete(unknown): expected NotFound or Unimplemented, got {:?} {}",
            s.code(),
            s.message()
        ),
        Ok(ack) => fail!("Delete(unknown) succeeded: {:?}", ack.into_inner()),
    }
}

pub async fn list_filters_by_state(mut client: Client) -> Outcome {
    let ctx = Ctx::new("list-filter");
    // Make sure at least one IDLE machine exists, so the filter is tested on real data.
    make_idle(&mut client, &ctx).await?;
    for wanted in [MachineState::Idle, MachineState::Speculative] {
        let (machines, _) = list(
            &mut client,
            ListFilter {
                states: vec![wanted as i32],
                ..ListFilter::default()
            },
        )
        .await?;
        if wanted == MachineState::Idle {
            ensure!(
                !machines.is_empty(),
                "List(states=[IDLE]) is empty although a machine was just created"
            );
        }
        if let Some(m) = machines.iter().find(|m| m.state != wanted as i32) {
            fail!(
                "List(states=[{}]) returned {} in {}",
                wanted.as_str_name(),
                m.id,
                state_of(m)
            );
        }
    }
    Ok(None)
}

pub async fn list_max_results(mut client: Client) -> Outcome {
    let (machines, _) = list(
        &mut client,
        ListFilter {
            max_results: 1,
            ..ListFilter::default()
        },
    )
    .await?;
    ensure!(
        machines.len() <= 1,
        "List(max_results=1) returned {} machines",
        machines.len()
    );
    Ok(None)
}

/// ADR-0108: a List cut short by `max_results` should return no revision cursor, because
/// a reader resuming from the head revision would never see the machines the page left
/// out. A provider that echoes the head revision anyway (the original's providers do)
/// passes with a remark: the wire contract allows any opaque cursor, and bigfleet's decide
/// never combines `max_results` with `since_revision`.
pub async fn list_truncated_page_cursor(mut client: Client) -> Outcome {
    let (all, _) = list(&mut client, ListFilter::default()).await?;
    if all.len() < 2 {
        return Ok(Some(
            "fewer than two machines listed; nothing to truncate".into(),
        ));
    }
    let (page, revision) = list(
        &mut client,
        ListFilter {
            max_results: 1,
            ..ListFilter::default()
        },
    )
    .await?;
    ensure!(
        page.len() <= 1,
        "List(max_results=1) returned {} machines",
        page.len()
    );
    if revision.is_empty() {
        Ok(None)
    } else {
        Ok(Some(
            "a truncated page carries a revision cursor: an incremental reader resuming from it \
             would skip the machines the page left out (ADR-0108)"
                .into(),
        ))
    }
}

pub async fn label_shape(mut client: Client) -> Outcome {
    let (machines, _) = list(&mut client, ListFilter::default()).await?;
    ensure!(!machines.is_empty(), "the provider lists no machines");
    for m in &machines {
        ensure!(
            !m.instance_type.is_empty(),
            "machine {} has no instance_type",
            m.id
        );
        ensure!(
            m.state != MachineState::Unspecified as i32,
            "machine {} has state UNSPECIFIED",
            m.id
        );
    }
    Ok(None)
}

/// §3.6: the host is empty only while SPECULATIVE or CREATING.
pub async fn host_shape(mut client: Client) -> Outcome {
    let (machines, _) = list(&mut client, ListFilter::default()).await?;
    for m in &machines {
        let hostless = m.host.as_ref().is_none_or(|h| h.r#ref.is_empty());
        let may_lack_host = [
            MachineState::Speculative,
            MachineState::Creating,
            MachineState::Failed,
        ]
        .iter()
        .any(|s| *s as i32 == m.state);
        ensure!(
            !hostless || may_lack_host,
            "machine {} in {} has no host",
            m.id,
            state_of(m)
        );
    }
    Ok(None)
}

pub async fn cost_field_bounds(mut client: Client) -> Outcome {
    let (machines, _) = list(&mut client, ListFilter::default()).await?;
    for m in &machines {
        let p = m.price_per_hour;
        ensure!(
            !p.is_nan() && p >= 0.0,
            "machine {} has price_per_hour {p}",
            m.id
        );
        let q = m.interruption_probability;
        ensure!(
            !q.is_nan() && (0.0..=1.0).contains(&q),
            "machine {} has interruption_probability {q}",
            m.id
        );
    }
    Ok(None)
}

pub async fn list_revision_advances(mut client: Client) -> Outcome {
    let ctx = Ctx::new("revision");
    let (_, before) = list(&mut client, ListFilter::default()).await?;
    if before.is_empty() {
        return Ok(Some(
            "provider returns no revision (full state only)".into(),
        ));
    }
    let id = claim_speculative(&mut client).await?;
    ack_op("Create", client.create(create_req(&id, ctx.next())).await)?;
    let (_, after) = list(&mut client, ListFilter::default()).await?;
    ensure!(
        after != before,
        "revision {:?} did not change after a Create",
        String::from_utf8_lossy(&before)
    );
    Ok(None)
}

// ---- invalid transitions ------------------------------------------------------------------

pub async fn drain_on_speculative(mut client: Client) -> Outcome {
    let ctx = Ctx::new("drain-spec");
    let id = claim_speculative(&mut client).await?;
    match client.drain(drain_req(&id, 0, ctx.next())).await {
        Ok(ack) => fail!("Drain on SPECULATIVE was accepted: {:?}", ack.into_inner()),
        Err(s) if s.code() == Code::FailedPrecondition => {
            fail!(
                "Drain on SPECULATIVE answered FAILED_PRECONDITION, which is reserved for fencing"
            )
        }
        Err(_) => {}
    }
    let m = get(&mut client, &id).await?;
    ensure!(
        m.state == MachineState::Speculative as i32,
        "rejected Drain moved {id} to {}",
        state_of(&m)
    );
    Ok(None)
}

pub async fn delete_on_configured(mut client: Client) -> Outcome {
    let ctx = Ctx::new("delete-configured");
    let id = make_configured(&mut client, &ctx, &cluster_name(), BTreeMap::new()).await?;
    match client.delete(delete_req(&id, ctx.next())).await {
        Ok(ack) => fail!("Delete on CONFIGURED was accepted: {:?}", ack.into_inner()),
        Err(s) if s.code() == Code::FailedPrecondition => {
            fail!(
                "Delete on CONFIGURED answered FAILED_PRECONDITION, which is reserved for fencing"
            )
        }
        Err(_) => {}
    }
    let m = get(&mut client, &id).await?;
    ensure!(
        m.state == MachineState::Configured as i32,
        "rejected Delete moved {id} to {}",
        state_of(&m)
    );
    Ok(None)
}

/// After Create, Get polled every 5 ms for a second shows only SPECULATIVE, CREATING or
/// IDLE, and the machine reaches IDLE.
pub async fn transitional_state_observability(mut client: Client) -> Outcome {
    let ctx = Ctx::new("observe");
    let id = claim_speculative(&mut client).await?;
    ack_op("Create", client.create(create_req(&id, ctx.next())).await)?;
    let allowed = [
        MachineState::Speculative as i32,
        MachineState::Creating as i32,
        MachineState::Idle as i32,
    ];
    let watch_until = Instant::now() + Duration::from_secs(1);
    let mut reached = false;
    while Instant::now() < watch_until {
        let m = get(&mut client, &id).await?;
        ensure!(
            allowed.contains(&m.state),
            "after Create, {id} was observed in {}",
            state_of(&m)
        );
        reached |= m.state == MachineState::Idle as i32;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    if !reached {
        wait_state(
            &mut client,
            &id,
            MachineState::Idle,
            Duration::from_secs(10),
        )
        .await?;
    }
    Ok(None)
}

/// Drain with grace 0 ends IDLE, or FAILED with `last_error`, within 10 s — never back to
/// CONFIGURED and never stuck DRAINING.
pub async fn drain_grace_timeout(mut client: Client) -> Outcome {
    let ctx = Ctx::new("drain-grace");
    let id = make_configured(&mut client, &ctx, &cluster_name(), BTreeMap::new()).await?;
    ack_op("Drain", client.drain(drain_req(&id, 0, ctx.next())).await)?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = get(&mut client, &id).await?;
        if m.state == MachineState::Idle as i32 {
            return Ok(None);
        }
        if m.state == MachineState::Failed as i32 {
            ensure!(
                !m.last_error.is_empty(),
                "drain ended FAILED without last_error"
            );
            return Ok(Some(format!("drain ended FAILED: {}", m.last_error)));
        }
        ensure!(
            m.state == MachineState::Draining as i32,
            "after Drain(grace=0), {id} is {}",
            state_of(&m)
        );
        ensure!(
            Instant::now() < deadline,
            "{id} still DRAINING 10 s after Drain(grace=0)"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---- fencing ------------------------------------------------------------------------------

fn token(shard: &str, epoch: i64, seq: i64) -> (String, i64, i64) {
    (shard.to_owned(), epoch, seq)
}

pub async fn fencing_unknown_shard_accepted(mut client: Client) -> Outcome {
    let shard = Ctx::new("fence-unknown").shard;
    let id = claim_speculative(&mut client).await?;
    ack_op(
        "first token",
        client.create(create_req(&id, token(&shard, 1, 1))).await,
    )?;
    expect_code(
        "exact replay",
        client.create(create_req(&id, token(&shard, 1, 1))).await,
        Code::FailedPrecondition,
    )?;
    Ok(None)
}

pub async fn fencing_stale_epoch_rejected(mut client: Client) -> Outcome {
    let shard = Ctx::new("fence-epoch").shard;
    let id = claim_speculative(&mut client).await?;
    ack_op(
        "token (2,1)",
        client.create(create_req(&id, token(&shard, 2, 1))).await,
    )?;
    expect_code(
        "token (1,99) after (2,1)",
        client.create(create_req(&id, token(&shard, 1, 99))).await,
        Code::FailedPrecondition,
    )?;
    Ok(None)
}

pub async fn fencing_stale_sequence_rejected(mut client: Client) -> Outcome {
    let shard = Ctx::new("fence-seq").shard;
    let id = claim_speculative(&mut client).await?;
    ack_op(
        "token (1,5)",
        client.create(create_req(&id, token(&shard, 1, 5))).await,
    )?;
    expect_code(
        "token (1,5) again",
        client.create(create_req(&id, token(&shard, 1, 5))).await,
        Code::FailedPrecondition,
    )?;
    expect_code(
        "token (1,4)",
        client.create(create_req(&id, token(&shard, 1, 4))).await,
        Code::FailedPrecondition,
    )?;
    Ok(None)
}

/// Marks are per (shard, machine): a high sequence on one machine does not fence a lower
/// one on another.
pub async fn fencing_per_machine_isolation(mut client: Client) -> Outcome {
    let shard = Ctx::new("fence-isolation").shard;
    let a = claim_speculative(&mut client).await?;
    ack_op(
        "A at (1,30)",
        client.create(create_req(&a, token(&shard, 1, 30))).await,
    )?;
    let mut b = claim_speculative(&mut client).await?;
    for _ in 0..8 {
        if b != a {
            break;
        }
        b = claim_speculative(&mut client).await?;
    }
    ensure!(b != a, "could not find a second SPECULATIVE machine");
    ack_op(
        "B at (1,7)",
        client.create(create_req(&b, token(&shard, 1, 7))).await,
    )?;
    expect_code(
        "B replay (1,7)",
        client.create(create_req(&b, token(&shard, 1, 7))).await,
        Code::FailedPrecondition,
    )?;
    expect_code(
        "A replay (1,30)",
        client.create(create_req(&a, token(&shard, 1, 30))).await,
        Code::FailedPrecondition,
    )?;
    expect_code(
        "B at (0,999)",
        client.create(create_req(&b, token(&shard, 0, 999))).await,
        Code::FailedPrecondition,
    )?;
    Ok(None)
}

pub async fn fencing_new_epoch_resets_sequence(mut client: Client) -> Outcome {
    let shard = Ctx::new("fence-new-epoch").shard;
    let id = claim_speculative(&mut client).await?;
    ack_op(
        "token (1,1000)",
        client.create(create_req(&id, token(&shard, 1, 1000))).await,
    )?;
    ack_op(
        "token (2,1)",
        client.create(create_req(&id, token(&shard, 2, 1))).await,
    )?;
    Ok(None)
}

pub async fn fencing_reads_unaffected(mut client: Client) -> Outcome {
    let shard = Ctx::new("fence-reads").shard;
    let id = claim_speculative(&mut client).await?;
    ack_op(
        "token (3,3)",
        client.create(create_req(&id, token(&shard, 3, 3))).await,
    )?;
    expect_code(
        "zombie token (2,9)",
        client.create(create_req(&id, token(&shard, 2, 9))).await,
        Code::FailedPrecondition,
    )?;
    get(&mut client, &id).await?;
    list(&mut client, ListFilter::default()).await?;
    Ok(None)
}

/// The fence check comes before the machine lookup: a token is recorded for an unknown
/// machine (NOT_FOUND), and its replay is refused as fenced, not as unknown.
pub async fn fencing_checked_before_not_found(mut client: Client) -> Outcome {
    let shard = Ctx::new("fence-order").shard;
    let id = unknown_id();
    expect_code(
        "first token on an unknown machine",
        client.create(create_req(&id, token(&shard, 1, 1))).await,
        Code::NotFound,
    )?;
    expect_code(
        "replay on the unknown machine",
        client.create(create_req(&id, token(&shard, 1, 1))).await,
        Code::FailedPrecondition,
    )?;
    Ok(None)
}

// ---- shard_metadata -------------------------------------------------------------------------

fn well_known_metadata() -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            "bigfleet.lucy.sh/assigned-priority".to_owned(),
            "1000".to_owned(),
        ),
        (
            "bigfleet.lucy.sh/assigned-interruption-penalty-dollars".to_owned(),
            "12.5".to_owned(),
        ),
        (
            "bigfleet.lucy.sh/assigned-reclamation-penalty-dollars".to_owned(),
            "0.25".to_owned(),
        ),
        (
            "bigfleet.lucy.sh/assigned-need-fingerprint".to_owned(),
            "fp-0123456789abcdef".to_owned(),
        ),
        (
            "bigfleet.lucy.sh/assigned-group".to_owned(),
            "topology.bigfleet/rack\u{0}gang-7".to_owned(),
        ),
        ("example.com/opaque".to_owned(), "kept as is".to_owned()),
    ])
}

fn check_bound(
    m: &Machine,
    cluster: &str,
    metadata: &BTreeMap<String, String>,
    seen_via: &str,
) -> Result<(), Failure> {
    ensure!(
        m.cluster == cluster,
        "{seen_via}: cluster {:?}, expected {cluster:?}",
        m.cluster
    );
    ensure!(
        &m.shard_metadata == metadata,
        "{seen_via}: shard_metadata {:?} differs from what Configure sent {:?}",
        m.shard_metadata,
        metadata
    );
    Ok(())
}

pub async fn metadata_echoed_on_get_and_list(mut client: Client) -> Outcome {
    let ctx = Ctx::new("metadata-echo");
    let id = make_idle(&mut client, &ctx).await?;
    let cluster = cluster_name();
    let metadata = well_known_metadata();
    let ack = client
        .configure(configure_req(&id, &cluster, metadata.clone(), ctx.next()))
        .await
        .map_err(|s| Failure(format!("Configure: {:?} {}", s.code(), s.message())))?
        .into_inner();
    if let Some(m) = &ack.machine {
        check_bound(m, &cluster, &metadata, "TransitionAck")?;
    }
    let m = wait_state(
        &mut client,
        &id,
        MachineState::Configured,
        Duration::from_secs(10),
    )
    .await?;
    check_bound(&m, &cluster, &metadata, "Get")?;
    let (machines, _) = list(
        &mut client,
        ListFilter {
            states: vec![MachineState::Configured as i32],
            ..ListFilter::default()
        },
    )
    .await?;
    let Some(listed) = machines.iter().find(|m| m.id == id) else {
        fail!("List(states=[CONFIGURED]) does not contain {id}");
    };
    check_bound(listed, &cluster, &metadata, "List")?;
    Ok(None)
}

pub async fn metadata_and_binding_clear_on_drain(mut client: Client) -> Outcome {
    let ctx = Ctx::new("metadata-clear");
    let metadata = well_known_metadata();
    let id = make_configured(&mut client, &ctx, &cluster_name(), metadata).await?;
    ack_op("Drain", client.drain(drain_req(&id, 30, ctx.next())).await)?;
    let m = wait_state(
        &mut client,
        &id,
        MachineState::Idle,
        Duration::from_secs(30),
    )
    .await?;
    ensure!(
        m.cluster.is_empty(),
        "drained machine still reports cluster {:?}",
        m.cluster
    );
    ensure!(
        m.shard_metadata.is_empty(),
        "drained machine still has shard_metadata {:?}",
        m.shard_metadata
    );
    Ok(None)
}

pub async fn metadata_unknown_keys_preserved_verbatim(mut client: Client) -> Outcome {
    let ctx = Ctx::new("metadata-verbatim");
    let metadata = BTreeMap::from([
        ("example.com/unicode".to_owned(), "grüße 🚀 日本".to_owned()),
        ("example.com/tab".to_owned(), "a\tb".to_owned()),
        ("example.com/empty".to_owned(), String::new()),
        (
            "example.com/control".to_owned(),
            "\u{0}\u{1}\r\n\u{7f}".to_owned(),
        ),
        ("example.com/  spaces  ".to_owned(), "  padded  ".to_owned()),
    ]);
    let cluster = cluster_name();
    let id = make_configured(&mut client, &ctx, &cluster, metadata.clone()).await?;
    let m = get(&mut client, &id).await?;
    check_bound(&m, &cluster, &metadata, "Get")?;
    Ok(None)
}

// ---- fake-only ------------------------------------------------------------------------------

/// ADR-0056 (needs the in-process fake as the node): CONFIGURING is held until the node
/// reports Ready and never shows CONFIGURED early.
pub async fn node_readiness_adr0056(mut client: Client, provider: &FakeProvider) -> Outcome {
    let ctx = Ctx::new("readiness");
    let id = make_idle(&mut client, &ctx).await?;
    provider
        .require_readiness(&id)
        .map_err(|e| Failure(format!("require_readiness: {e}")))?;
    ack_op(
        "Configure",
        client
            .configure(configure_req(
                &id,
                &cluster_name(),
                BTreeMap::new(),
                ctx.next(),
            ))
            .await,
    )?;
    let watch_until = Instant::now() + Duration::from_millis(300);
    while Instant::now() < watch_until {
        let m = get(&mut client, &id).await?;
        ensure!(
            m.state == MachineState::Configuring as i32,
            "before readiness, {id} is {} (expected CONFIGURING)",
            state_of(&m)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    provider
        .mark_ready(&id)
        .map_err(|e| Failure(format!("mark_ready: {e}")))?;
    wait_state(
        &mut client,
        &id,
        MachineState::Configured,
        Duration::from_secs(10),
    )
    .await?;
    Ok(None)
}
