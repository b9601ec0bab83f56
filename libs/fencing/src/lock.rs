//! One process per data dir: an exclusive advisory lock held for the life of the process.
//!
//! The epoch file alone cannot keep two processes on one data dir apart: both would read,
//! bump and write it, and each would act under its own epoch — the older one fenced only on
//! the machines the newer one happened to touch. The lock makes the second one refuse to
//! start instead.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::FencingError;

/// Conventional lock file name inside a data dir (`<data-dir>/decide.lock`).
pub const LOCK_FILE_NAME: &str = "decide.lock";

/// An exclusive `flock` on `<dir>/decide.lock`, released when dropped or when the process
/// ends in any way (the kernel drops it with the last file descriptor, so a SIGKILLed
/// holder never leaves a stale lock behind).
///
/// The file holds the holder's pid for the error message of the next one; it is never
/// deleted, because unlinking a lock file lets a third process lock a fresh inode while
/// the second still holds the old one.
#[derive(Debug)]
pub struct DataDirLock {
    // Only held: dropping the descriptor releases the lock.
    _file: File,
    path: PathBuf,
}

impl DataDirLock {
    /// Locks `dir` (which must exist) without waiting: a dir locked by another process is
    /// [`FencingError::DataDirLocked`], naming the holder's pid when the lock file says.
    pub fn acquire(dir: &Path) -> Result<Self, FencingError> {
        let path = dir.join(LOCK_FILE_NAME);
        let io = |source| FencingError::Io {
            path: path.clone(),
            source,
        };
        // Not truncated on open: the holder's pid must survive a refused attempt.
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(FencingError::DataDirLocked {
                    dir: dir.to_path_buf(),
                    holder: read_holder(&path),
                });
            }
            Err(TryLockError::Error(source)) => return Err(io(source)),
        }
        let wrote = file
            .set_len(0)
            .and_then(|()| file.write_all(format!("{}\n", std::process::id()).as_bytes()));
        if let Err(e) = wrote {
            // The pid is only a courtesy to the next process's error message.
            tracing::warn!(path = %path.display(), error = %e, "cannot record our pid in the lock file");
        }
        Ok(Self { _file: file, path })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn read_holder(path: &Path) -> Option<u32> {
    // Empty while the holder is between truncating and writing: reported as unknown.
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// `" (pid N)"` for [`FencingError::DataDirLocked`]'s message, empty when unknown.
pub(crate) fn holder_suffix(holder: &Option<u32>) -> String {
    holder.map_or_else(String::new, |pid| format!(" (pid {pid})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_the_same_dir_is_refused_with_the_holders_pid() {
        let dir = tempfile::tempdir().unwrap();
        let first = DataDirLock::acquire(dir.path()).unwrap();
        assert_eq!(first.path(), dir.path().join(LOCK_FILE_NAME));
        // flock locks belong to the open file, so a second open in this process conflicts
        // exactly like another process would.
        let err = DataDirLock::acquire(dir.path()).unwrap_err();
        let pid = std::process::id();
        match &err {
            FencingError::DataDirLocked { dir: d, holder } => {
                assert_eq!(d, dir.path());
                assert_eq!(*holder, Some(pid));
            }
            other => panic!("{other:?}"),
        }
        let msg = err.to_string();
        assert!(msg.contains(&dir.path().display().to_string()), "{msg}");
        assert!(msg.contains(&format!("(pid {pid})")), "{msg}");
        // The refused attempt left the holder's pid in place.
        let text = std::fs::read_to_string(first.path()).unwrap();
        assert_eq!(text, format!("{pid}\n"));
        drop(first);
        let again = DataDirLock::acquire(dir.path()).unwrap();
        drop(again);
    }

    #[test]
    fn an_unreadable_holder_is_reported_without_a_pid() {
        let dir = tempfile::tempdir().unwrap();
        let first = DataDirLock::acquire(dir.path()).unwrap();
        std::fs::write(first.path(), "").unwrap();
        let err = DataDirLock::acquire(dir.path()).unwrap_err();
        assert!(
            matches!(err, FencingError::DataDirLocked { holder: None, .. }),
            "{err:?}"
        );
        assert!(!err.to_string().contains("pid"), "{err}");
    }

    #[test]
    fn a_missing_dir_is_an_io_error() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            DataDirLock::acquire(&dir.path().join("nope")),
            Err(FencingError::Io { .. })
        ));
    }
}
