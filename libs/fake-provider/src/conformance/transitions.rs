//! Cases: transitions the contract forbids, and transitional states.

use super::*;

pub async fn drain_on_speculative(mut client: Client) -> Outcome {
    let ctx = Ctx::new("drain-spec");
    let id = claim_speculative(&mut client).await?;
    let answer = client.drain(drain_req(&id, 0, ctx.next())).await;
    refused_in_place(&mut client, &id, "Drain", MachineState::Speculative, answer).await
}

pub async fn delete_on_configured(mut client: Client) -> Outcome {
    let ctx = Ctx::new("delete-configured");
    let id = make_configured(&mut client, &ctx, &cluster_name(), BTreeMap::new()).await?;
    let answer = client.delete(delete_req(&id, ctx.next())).await;
    refused_in_place(&mut client, &id, "Delete", MachineState::Configured, answer).await
}

/// `verb` is illegal from `from`: the provider must refuse it with a code other than
/// FAILED_PRECONDITION (reserved for fencing) and leave the machine in `from`.
async fn refused_in_place(
    client: &mut Client,
    id: &str,
    verb: &str,
    from: MachineState,
    answer: Result<tonic::Response<TransitionAck>, tonic::Status>,
) -> Outcome {
    let label = from.as_str_name().trim_start_matches("MACHINE_STATE_");
    match answer {
        Ok(ack) => fail!("{verb} on {label} was accepted: {:?}", ack.into_inner()),
        Err(s) if s.code() == Code::FailedPrecondition => {
            fail!("{verb} on {label} answered FAILED_PRECONDITION, which is reserved for fencing")
        }
        Err(_) => {}
    }
    let m = get(client, id).await?;
    ensure!(
        m.state == from as i32,
        "rejected {verb} moved {id} to {}",
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
        wait_state(&mut client, &id, MachineState::Idle, SETTLE).await?;
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
