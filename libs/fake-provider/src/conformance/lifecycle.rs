//! Cases: the whole lifecycle, and every mutation's idempotency.

use super::*;

/// SPECULATIVE → IDLE → CONFIGURED → IDLE → SPECULATIVE with non-empty operation ids;
/// Delete answering UNIMPLEMENTED passes.
pub async fn full_lifecycle(mut client: Client) -> Outcome {
    let ctx = Ctx::new("lifecycle");
    let id = claim_speculative(&mut client).await?;
    ack_op("Create", client.create(create_req(&id, ctx.next())).await)?;
    wait_state(&mut client, &id, MachineState::Idle, SETTLE).await?;
    let cluster = cluster_name();
    ack_op(
        "Configure",
        client
            .configure(configure_req(&id, &cluster, BTreeMap::new(), ctx.next()))
            .await,
    )?;
    let m = wait_state(&mut client, &id, MachineState::Configured, SETTLE).await?;
    ensure!(
        m.cluster == cluster,
        "configured machine reports cluster {:?}, sent {cluster:?}",
        m.cluster
    );
    ack_op("Drain", client.drain(drain_req(&id, 30, ctx.next())).await)?;
    wait_state(&mut client, &id, MachineState::Idle, DRAIN_SETTLE).await?;
    match client.delete(delete_req(&id, ctx.next())).await {
        Err(s) if s.code() == Code::Unimplemented => {
            return Ok(Some("Delete is unimplemented (allowed)".into()));
        }
        r => {
            ack_op("Delete", r)?;
        }
    }
    wait_state(&mut client, &id, MachineState::Speculative, SETTLE).await?;
    Ok(None)
}

pub(super) fn same_op(what: &str, a: &str, b: &str) -> Result<(), Failure> {
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
