//! Shard epochs (epoch file), fencing tokens and sequence minting.
//!
//! Every mutating provider call carries a [`FencingToken`] `(shard_id, epoch, sequence)`.
//! The epoch strictly increases on every start of a shard ([`advance_epoch_file`]), so a
//! zombie from an older incarnation is always older than the live one; within an epoch
//! decide hands each action a fresh `sequence_base` ([`SequenceMinter`]) and the worker
//! stamps `base + attempt` on each call, so per machine the sequence strictly increases
//! across workers and retries. Providers keep a per-(shard, machine) high-water mark
//! ([`HighWaterMarks`]) and refuse anything not strictly newer.
//!
//! In epoch-file mode a start mints `max(stored + 1, wall-clock seconds)` ([`clock_floor`],
//! ADR-0103), so losing the file does not send the epoch back below what providers have
//! seen, and one process at a time owns a data dir ([`DataDirLock`]).

mod epoch;
mod lock;
mod token;

pub use epoch::{
    EPOCH_FILE_NAME, MAX_CLOCK_WAIT, MAX_EPOCH, advance_epoch_file, clock_floor, read_epoch_file,
    until_clock_passes,
};
pub use lock::{DataDirLock, LOCK_FILE_NAME};
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
    /// Reading, writing or syncing the epoch file (or the data dir's lock file) failed.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The epoch would pass [`MAX_EPOCH`] (the wire's `int64`), or a sequence `u64`.
    #[error("{what} overflow")]
    Overflow { what: &'static str },
    /// Another process holds the data dir's lock ([`DataDirLock`]).
    #[error(
        "data dir {dir} is in use by another process{}: only one decide may run on a data dir",
        lock::holder_suffix(holder)
    )]
    DataDirLocked { dir: PathBuf, holder: Option<u32> },
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
