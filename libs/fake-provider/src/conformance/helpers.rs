//! Shared steps and request builders of the conformance cases.

use super::*;

pub(super) fn unix_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default()
}

/// Tokens of one test: a run-unique shard id and a strictly increasing sequence.
pub(super) struct Ctx {
    pub(super) shard: String,
    pub(super) epoch: i64,
    seq: AtomicI64,
}

impl Ctx {
    pub(super) fn new(prefix: &str) -> Self {
        Self {
            shard: format!("conformance-{prefix}-{}", unix_nanos()),
            epoch: 1,
            seq: AtomicI64::new(0),
        }
    }

    pub(super) fn next(&self) -> (String, i64, i64) {
        (
            self.shard.clone(),
            self.epoch,
            self.seq.fetch_add(1, Ordering::Relaxed) + 1,
        )
    }
}

pub(super) fn create_req(
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

pub(super) fn configure_req(
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

pub(super) fn drain_req(
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

pub(super) fn delete_req(
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

pub(super) fn state_of(m: &Machine) -> String {
    MachineState::try_from(m.state)
        .map(|s| s.as_str_name().to_owned())
        .unwrap_or_else(|_| format!("state {}", m.state))
}

pub(super) fn ack_op(
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

pub(super) fn expect_code<T: std::fmt::Debug>(
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

pub(super) async fn get(client: &mut Client, id: &str) -> Result<Machine, Failure> {
    client
        .get(MachineRef { id: id.to_owned() })
        .await
        .map(tonic::Response::into_inner)
        .map_err(|s| Failure(format!("Get({id}): {:?} {}", s.code(), s.message())))
}

pub(super) async fn list(
    client: &mut Client,
    filter: ListFilter,
) -> Result<(Vec<Machine>, Vec<u8>), Failure> {
    client
        .list(filter)
        .await
        .map(|r| {
            let l = r.into_inner();
            (l.machines, l.revision)
        })
        .map_err(|s| Failure(format!("List: {:?} {}", s.code(), s.message())))
}

/// How long a transition with no grace period may take to reach its target state.
pub(super) const SETTLE: Duration = Duration::from_secs(10);

/// How long a drain with the cases' 30 s grace period may take to reach IDLE.
pub(super) const DRAIN_SETTLE: Duration = Duration::from_secs(30);

/// Polls Get every 100 ms until the machine is in `target`; FAILED (when not the target)
/// ends the wait early.
pub(super) async fn wait_state(
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
pub(super) async fn claim_speculative(client: &mut Client) -> Result<String, Failure> {
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

pub(super) async fn make_idle(client: &mut Client, ctx: &Ctx) -> Result<String, Failure> {
    let id = claim_speculative(client).await?;
    ack_op("Create", client.create(create_req(&id, ctx.next())).await)?;
    wait_state(client, &id, MachineState::Idle, SETTLE).await?;
    Ok(id)
}

pub(super) async fn make_configured(
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
    wait_state(client, &id, MachineState::Configured, SETTLE).await?;
    Ok(id)
}

pub(super) fn cluster_name() -> String {
    format!("conformance-cluster-{}", unix_nanos())
}

pub(super) fn unknown_id() -> String {
    format!("conformance-no-such-machine-{}", unix_nanos())
}
