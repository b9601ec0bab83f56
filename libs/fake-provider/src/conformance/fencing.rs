//! Cases: fencing tokens — stale epochs and sequences, isolation, check order.

use super::*;

pub(super) fn token(shard: &str, epoch: i64, seq: i64) -> (String, i64, i64) {
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
