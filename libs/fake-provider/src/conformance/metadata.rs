//! Cases: shard_metadata echoed, cleared on drain, unknown keys kept.

use super::*;

pub(super) fn well_known_metadata() -> BTreeMap<String, String> {
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

pub(super) fn check_bound(
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
    let m = wait_state(&mut client, &id, MachineState::Configured, SETTLE).await?;
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
    let m = wait_state(&mut client, &id, MachineState::Idle, DRAIN_SETTLE).await?;
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
