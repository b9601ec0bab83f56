//! Cases: fencing tokens — stale epochs and sequences, isolation, check order.

use super::*;

/// Creates under chosen fencing tokens of one fresh shard: each case reads as the list of
/// tokens it sends and what the provider must answer.
struct Fence {
    client: Client,
    shard: String,
}

impl Fence {
    fn new(client: Client, prefix: &str) -> Self {
        Fence {
            client,
            shard: Ctx::new(prefix).shard,
        }
    }

    /// Creates `id` under the token (`epoch`, `sequence`).
    async fn create(
        &mut self,
        id: &str,
        (epoch, sequence): (i64, i64),
    ) -> Result<tonic::Response<TransitionAck>, tonic::Status> {
        let token = (self.shard.clone(), epoch, sequence);
        self.client.create(create_req(id, token)).await
    }

    /// Expects the create to be accepted (an operation id back).
    async fn accepts(&mut self, what: &str, id: &str, token: (i64, i64)) -> Result<(), Failure> {
        ack_op(what, self.create(id, token).await).map(drop)
    }

    /// Expects the create to be refused by the fence: FAILED_PRECONDITION.
    async fn refuses(&mut self, what: &str, id: &str, token: (i64, i64)) -> Result<(), Failure> {
        expect_code(what, self.create(id, token).await, Code::FailedPrecondition)
    }
}

pub async fn fencing_unknown_shard_accepted(mut client: Client) -> Outcome {
    let id = claim_speculative(&mut client).await?;
    let mut fence = Fence::new(client, "fence-unknown");
    fence.accepts("first token", &id, (1, 1)).await?;
    fence.refuses("exact replay", &id, (1, 1)).await?;
    Ok(None)
}

pub async fn fencing_stale_epoch_rejected(mut client: Client) -> Outcome {
    let id = claim_speculative(&mut client).await?;
    let mut fence = Fence::new(client, "fence-epoch");
    fence.accepts("token (2,1)", &id, (2, 1)).await?;
    fence
        .refuses("token (1,99) after (2,1)", &id, (1, 99))
        .await?;
    Ok(None)
}

pub async fn fencing_stale_sequence_rejected(mut client: Client) -> Outcome {
    let id = claim_speculative(&mut client).await?;
    let mut fence = Fence::new(client, "fence-seq");
    fence.accepts("token (1,5)", &id, (1, 5)).await?;
    fence.refuses("token (1,5) again", &id, (1, 5)).await?;
    fence.refuses("token (1,4)", &id, (1, 4)).await?;
    Ok(None)
}

/// Marks are per (shard, machine): a high sequence on one machine does not fence a lower
/// one on another.
pub async fn fencing_per_machine_isolation(mut client: Client) -> Outcome {
    let a = claim_speculative(&mut client).await?;
    let mut fence = Fence::new(client, "fence-isolation");
    fence.accepts("A at (1,30)", &a, (1, 30)).await?;
    let mut b = claim_speculative(&mut fence.client).await?;
    for _ in 0..8 {
        if b != a {
            break;
        }
        b = claim_speculative(&mut fence.client).await?;
    }
    ensure!(b != a, "could not find a second SPECULATIVE machine");
    fence.accepts("B at (1,7)", &b, (1, 7)).await?;
    fence.refuses("B replay (1,7)", &b, (1, 7)).await?;
    fence.refuses("A replay (1,30)", &a, (1, 30)).await?;
    fence.refuses("B at (0,999)", &b, (0, 999)).await?;
    Ok(None)
}

pub async fn fencing_new_epoch_resets_sequence(mut client: Client) -> Outcome {
    let id = claim_speculative(&mut client).await?;
    let mut fence = Fence::new(client, "fence-new-epoch");
    fence.accepts("token (1,1000)", &id, (1, 1000)).await?;
    fence.accepts("token (2,1)", &id, (2, 1)).await?;
    Ok(None)
}

pub async fn fencing_reads_unaffected(mut client: Client) -> Outcome {
    let id = claim_speculative(&mut client).await?;
    let mut fence = Fence::new(client, "fence-reads");
    fence.accepts("token (3,3)", &id, (3, 3)).await?;
    fence.refuses("zombie token (2,9)", &id, (2, 9)).await?;
    get(&mut fence.client, &id).await?;
    list(&mut fence.client, ListFilter::default()).await?;
    Ok(None)
}

/// The fence check comes before the machine lookup: a token is recorded for an unknown
/// machine (NOT_FOUND), and its replay is refused as fenced, not as unknown.
pub async fn fencing_checked_before_not_found(client: Client) -> Outcome {
    let id = unknown_id();
    let mut fence = Fence::new(client, "fence-order");
    expect_code(
        "first token on an unknown machine",
        fence.create(&id, (1, 1)).await,
        Code::NotFound,
    )?;
    fence
        .refuses("replay on the unknown machine", &id, (1, 1))
        .await?;
    Ok(None)
}
