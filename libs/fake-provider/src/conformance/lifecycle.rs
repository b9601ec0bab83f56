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

/// A mutation's answer, in flight on a borrowed client.
type PendingAck<'c> = BoxFuture<'c, Result<tonic::Response<TransitionAck>, tonic::Status>>;

/// Sends one mutation twice, each time with a fresh request id: both answers must
/// acknowledge the same operation.
async fn acked_as_one_operation(
    what: &str,
    client: &mut Client,
    mut send: impl for<'c> FnMut(&'c mut Client) -> PendingAck<'c>,
) -> Result<(), Failure> {
    let a = ack_op(what, send(client).await)?;
    let b = ack_op(&format!("{what} again"), send(client).await)?;
    same_op(what, &a, &b)
}

pub async fn create_idempotent(mut client: Client) -> Outcome {
    let ctx = Ctx::new("create-idem");
    let id = claim_speculative(&mut client).await?;
    acked_as_one_operation("Create", &mut client, |c| {
        Box::pin(c.create(create_req(&id, ctx.next())))
    })
    .await?;
    Ok(None)
}

pub async fn configure_idempotent(mut client: Client) -> Outcome {
    let ctx = Ctx::new("configure-idem");
    let id = make_idle(&mut client, &ctx).await?;
    let cluster = cluster_name();
    acked_as_one_operation("Configure", &mut client, |c| {
        Box::pin(c.configure(configure_req(&id, &cluster, BTreeMap::new(), ctx.next())))
    })
    .await?;
    Ok(None)
}

pub async fn drain_idempotent(mut client: Client) -> Outcome {
    let ctx = Ctx::new("drain-idem");
    let id = make_configured(&mut client, &ctx, &cluster_name(), BTreeMap::new()).await?;
    acked_as_one_operation("Drain", &mut client, |c| {
        Box::pin(c.drain(drain_req(&id, 30, ctx.next())))
    })
    .await?;
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
