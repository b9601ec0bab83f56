//! The per-shard epoch counter: a compare-and-swap increment on `<shard>/epoch`, optionally
//! in the same transaction that claims the leader key (ADR-0070).
//!
//! The transaction compares the epoch key's `mod_revision` with the one just read (0 when
//! the key does not exist yet). etcd applies transactions one at a time from its Raft log,
//! so of two racers that read the same value exactly one commits; the other one's compare
//! fails, its else branch returns the new value, and it retries above it. A committed value
//! is in the replicated log, so it survives etcd leader changes and restarts.

use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse};

use crate::config::ShardKeys;
use crate::{ShardLeaseError, bounded};

/// Gives up after this many lost races in a row: each loss means another minting
/// committed, so reaching it means a runaway minting loop somewhere, not bad luck.
const MAX_CONFLICTS: usize = 1000;

/// One minted epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct EpochGrant {
    pub epoch: u64,
    /// The etcd revision of the transaction that minted it: grants ordered by revision
    /// are ordered by epoch.
    pub revision: i64,
}

/// What a leader claim found.
#[derive(Debug)]
pub(crate) enum Claim {
    /// The leader key is ours and this epoch is the term's.
    Won(EpochGrant),
    /// Someone holds the leader key (its value is the holder id).
    Held(KeyValue),
}

/// The leader key and work endpoint to write together with the epoch.
pub(crate) struct LeaderClaim<'a> {
    pub lease: i64,
    pub holder: &'a str,
    pub work_endpoint: Option<&'a str>,
}

fn parse(keys: &ShardKeys, kv: Option<&KeyValue>) -> Result<(u64, i64), ShardLeaseError> {
    let Some(kv) = kv else {
        return Ok((0, 0));
    };
    let value = kv.value();
    let parsed = std::str::from_utf8(value)
        .ok()
        .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|s| s.parse::<u64>().ok());
    match parsed {
        Some(e) => Ok((e, kv.mod_revision())),
        None => Err(ShardLeaseError::CorruptEpoch {
            key: keys.epoch.clone(),
            value: String::from_utf8_lossy(value).into_owned(),
        }),
    }
}

/// The latest epoch and the `mod_revision` of its key (0, 0 when never minted).
pub(crate) async fn read_epoch(
    client: &Client,
    keys: &ShardKeys,
    timeout: Duration,
) -> Result<(u64, i64), ShardLeaseError> {
    let mut c = client.clone();
    let resp = bounded("get epoch", timeout, c.get(keys.epoch.as_str(), None)).await?;
    parse(keys, resp.kvs().first())
}

/// Mints an epoch above every earlier one and above `floor`.
pub(crate) async fn next_epoch(
    client: &Client,
    keys: &ShardKeys,
    floor: u64,
    timeout: Duration,
) -> Result<EpochGrant, ShardLeaseError> {
    match mint(client, keys, floor, timeout, None).await? {
        Claim::Won(grant) => Ok(grant),
        Claim::Held(_) => Err(ShardLeaseError::Protocol(
            "epoch minting without a leader claim reported a holder".to_owned(),
        )),
    }
}

/// The CAS loop. With `claim`, the transaction also requires the leader key to be absent
/// and writes it (and the work endpoint) under the claim's lease, so a term and its epoch
/// are one atomic step.
pub(crate) async fn mint(
    client: &Client,
    keys: &ShardKeys,
    floor: u64,
    timeout: Duration,
    claim: Option<&LeaderClaim<'_>>,
) -> Result<Claim, ShardLeaseError> {
    let mut c = client.clone();
    let mut known = read_epoch(client, keys, timeout).await?;
    for _ in 0..MAX_CONFLICTS {
        let (current, mod_revision) = known;
        let next =
            current
                .max(floor)
                .checked_add(1)
                .ok_or_else(|| ShardLeaseError::EpochOverflow {
                    key: keys.epoch.clone(),
                })?;
        let mut when = vec![Compare::mod_revision(
            keys.epoch.as_str(),
            CompareOp::Equal,
            mod_revision,
        )];
        let mut then = vec![TxnOp::put(keys.epoch.as_str(), next.to_string(), None)];
        let mut otherwise = vec![TxnOp::get(keys.epoch.as_str(), None)];
        if let Some(claim) = claim {
            when.push(Compare::create_revision(
                keys.leader.as_str(),
                CompareOp::Equal,
                0,
            ));
            let leased = || Some(PutOptions::new().with_lease(claim.lease));
            then.push(TxnOp::put(keys.leader.as_str(), claim.holder, leased()));
            then.push(match claim.work_endpoint {
                Some(ep) => TxnOp::put(keys.work.as_str(), ep, leased()),
                // A leader without a Work listener must not leave an older endpoint behind.
                None => TxnOp::delete(keys.work.as_str(), None),
            });
            otherwise.push(TxnOp::get(keys.leader.as_str(), None));
        }
        let txn = Txn::new().when(when).and_then(then).or_else(otherwise);
        let resp = bounded("epoch transaction", timeout, c.txn(txn)).await?;
        if resp.succeeded() {
            let revision = resp.header().map_or(0, |h| h.revision());
            return Ok(Claim::Won(EpochGrant {
                epoch: next,
                revision,
            }));
        }
        let mut gets = resp.op_responses().into_iter().map(|r| match r {
            TxnOpResponse::Get(g) => Ok(g),
            other => Err(ShardLeaseError::Protocol(format!(
                "else branch answered {other:?}"
            ))),
        });
        let epoch_now = gets
            .next()
            .ok_or_else(|| ShardLeaseError::Protocol("else branch without reads".to_owned()))??;
        if claim.is_some() {
            let leader = gets.next().ok_or_else(|| {
                ShardLeaseError::Protocol("else branch without the leader read".to_owned())
            })??;
            if let Some(kv) = leader.kvs().first() {
                return Ok(Claim::Held(kv.clone()));
            }
        }
        known = parse(keys, epoch_now.kvs().first())?;
        tracing::debug!(
            shard_id = %keys.shard_id,
            seen = known.0,
            "epoch changed under us; retrying"
        );
    }
    Err(ShardLeaseError::Protocol(format!(
        "gave up minting an epoch after {MAX_CONFLICTS} conflicts"
    )))
}
