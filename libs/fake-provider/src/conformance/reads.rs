//! Cases: Get and List — unknown ids, filters, pages and cursors, record shapes.

use super::*;

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
    list_one_page(&mut client).await?;
    Ok(None)
}

/// A List with `max_results = 1`, checked to hold at most one machine.
async fn list_one_page(client: &mut Client) -> Result<(Vec<Machine>, Vec<u8>), Failure> {
    let (page, revision) = list(
        client,
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
    Ok((page, revision))
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
    let (_, revision) = list_one_page(&mut client).await?;
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

/// The host is empty only while SPECULATIVE or CREATING: those are the states with no
/// hardware behind them.
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
