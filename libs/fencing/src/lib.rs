//! Shard epochs (epoch file), fencing tokens and sequence minting.
//!
//! Every mutating provider call carries a [`FencingToken`] `(shard_id, epoch, sequence)`.
//! The epoch strictly increases on every start of a shard ([`advance_epoch_file`]), so a
//! zombie from an older incarnation is always older than the live one; within an epoch
//! decide hands each action a fresh `sequence_base` ([`SequenceMinter`]) and the worker
//! stamps `base + attempt` on each call, so per machine the sequence strictly increases
//! across workers and retries. Providers keep a per-(shard, machine) high-water mark
//! ([`HighWaterMarks`]) and refuse anything not strictly newer.

mod epoch;
mod token;

pub use epoch::{EPOCH_FILE_NAME, advance_epoch_file, read_epoch_file};
pub use token::{
    DEFAULT_SEQUENCE_SPACING, FenceMark, FencingToken, HighWaterMarks, SequenceBase, SequenceMinter,
};

use std::path::PathBuf;

/// Errors from the epoch file, minting and fencing checks.
#[derive(Debug, thiserror::Error)]
pub enum FencingError {
    /// The epoch file exists but does not hold one decimal `u64`. Never guessed around: a
    /// shard that cannot prove its epoch is newer than every previous one must not start.
    #[error("corrupt epoch file {path}: {reason}")]
    CorruptEpochFile { path: PathBuf, reason: String },
    /// Reading, writing or syncing the epoch file failed.
    #[error("epoch file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The epoch (or a sequence) would overflow `u64`.
    #[error("{what} overflow")]
    Overflow { what: &'static str },
    /// An attempt number does not fit in the spacing between two sequence bases, so it
    /// would collide with the next action's sequences.
    #[error("attempt {attempt} exceeds the sequence spacing {spacing}")]
    AttemptOutOfRange { attempt: u64, spacing: u64 },
    /// The token is not strictly newer than the high-water mark for its (shard, machine).
    #[error(
        "stale fencing token for shard {shard_id} machine {machine_id}: \
         epoch {epoch} sequence {sequence} is not newer than epoch {hw_epoch} sequence {hw_sequence}"
    )]
    Stale {
        shard_id: String,
        machine_id: String,
        epoch: u64,
        sequence: u64,
        hw_epoch: u64,
        hw_sequence: u64,
    },
}
