//! Epoch-file mode start-up (ADR-0103): own the data dir, mint an epoch that never goes
//! backwards, and do not act under it before the wall clock has passed it.

use std::path::Path;
use std::time::SystemTime;

use bigfleet_fencing::{
    DataDirLock, EPOCH_FILE_NAME, FencingError, MAX_CLOCK_WAIT, advance_epoch_file, clock_floor,
    until_clock_passes,
};

/// This process's claim on its data dir: the epoch it acts under and the lock that keeps a
/// second decide off the same dir. Dropping it releases the lock, so hold it for the life
/// of the process.
#[derive(Debug)]
pub struct FileEpoch {
    pub epoch: u64,
    pub lock: DataDirLock,
}

/// Claims `data_dir` and mints this process's epoch.
///
/// In this order, because each step relies on the one before: the dir is created; its
/// lock is taken (a second decide fails here, before it can touch the epoch file); the
/// clock is read only now, so every earlier holder ran before this reading; the epoch
/// `max(stored + 1, clock seconds)` is stored durably; and the call returns only once the
/// wall clock has passed that epoch (normally under a second), so a later start that finds
/// no epoch file still reads a clock above it.
///
/// An epoch more than [`MAX_CLOCK_WAIT`] ahead of the clock (the clock was set back) is not
/// waited out: the stored epoch keeps this start above the previous ones, and holding the
/// shard down for as long as the clock is off would be worse than the residual risk, which
/// only a lost epoch file *and* a slow clock together can turn into fenced machines.
pub async fn claim_data_dir(data_dir: &Path) -> Result<FileEpoch, FencingError> {
    std::fs::create_dir_all(data_dir).map_err(|source| FencingError::Io {
        path: data_dir.to_path_buf(),
        source,
    })?;
    let lock = DataDirLock::acquire(data_dir)?;
    let path = data_dir.join(EPOCH_FILE_NAME);
    let epoch = advance_epoch_file(&path, clock_floor(SystemTime::now()))?;
    let wait = until_clock_passes(epoch, SystemTime::now());
    if wait > MAX_CLOCK_WAIT {
        tracing::warn!(
            epoch,
            ahead_s = wait.as_secs(),
            "the epoch is ahead of the wall clock (was the clock set back?); starting anyway: \
             the epoch file keeps epochs increasing, but if it is lost before the clock \
             catches up, the next start may be fenced at the provider"
        );
    } else if !wait.is_zero() {
        tracing::debug!(epoch, wait = ?wait, "waiting for the wall clock to pass the epoch");
        tokio::time::sleep(wait).await;
    }
    tracing::info!(epoch, path = %path.display(), lock = %lock.path().display(), "fencing epoch advanced");
    Ok(FileEpoch { epoch, lock })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_start_after_a_lost_epoch_file_is_above_the_previous_one() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let first = claim_data_dir(&data).await.unwrap();
        // Returned only once the clock has passed it.
        assert!(clock_floor(SystemTime::now()) > first.epoch);
        // While held, nobody else gets the dir, and the epoch file is left alone.
        let err = claim_data_dir(&data).await.unwrap_err();
        assert!(matches!(err, FencingError::DataDirLocked { .. }), "{err:?}");
        assert_eq!(
            bigfleet_fencing::read_epoch_file(&data.join(EPOCH_FILE_NAME)).unwrap(),
            Some(first.epoch)
        );
        drop(first.lock);

        // Immediately again: stored + 1, so above even within the same second.
        let second = claim_data_dir(&data).await.unwrap();
        assert!(second.epoch > first.epoch);
        drop(second.lock);

        // The file is lost: the clock floor still lands above everything minted before.
        std::fs::remove_file(data.join(EPOCH_FILE_NAME)).unwrap();
        let third = claim_data_dir(&data).await.unwrap();
        assert!(
            third.epoch > second.epoch,
            "{} after {}",
            third.epoch,
            second.epoch
        );
    }
}
