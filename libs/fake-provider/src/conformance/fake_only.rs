//! Cases only the fake provider can run (it needs its test hooks).

use super::*;

/// The original's ADR-0056 (needs the in-process fake as the node): CONFIGURING is held until the node
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
    wait_state(&mut client, &id, MachineState::Configured, SETTLE).await?;
    Ok(None)
}
