//! The on-disk epoch: one decimal number, bumped and made durable before a shard acts.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::FencingError;

/// Conventional file name inside a shard's data dir (`<data-dir>/epoch`).
pub const EPOCH_FILE_NAME: &str = "epoch";

/// Reads the epoch stored at `path` without changing it. A missing file reads as `None`.
pub fn read_epoch_file(path: &Path) -> Result<Option<u64>, FencingError> {
    let text = match fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.kind() == io::ErrorKind::InvalidData => {
            return Err(corrupt(path, "not utf-8 text"));
        }
        Err(source) => return Err(io_err(path, source)),
    };
    parse_epoch(&text)
        .map(Some)
        .map_err(|reason| corrupt(path, reason))
}

/// Starts a new incarnation: reads the stored epoch (missing ⇒ 0), stores `previous + 1`
/// durably and returns it. The first start therefore gets epoch 1.
///
/// Durability matters more than speed here: the new value is written to a temporary file,
/// fsynced, renamed over the old one and the directory is fsynced, so after a crash the file
/// holds either the old or the new epoch — never a torn one — and a returned epoch is never
/// handed out again. A file that exists but does not parse is a hard error.
///
/// Two processes advancing the same file at once are not coordinated here; one shard owns
/// its data dir (the etcd mode covers shared placement).
pub fn advance_epoch_file(path: &Path) -> Result<u64, FencingError> {
    let previous = read_epoch_file(path)?.unwrap_or(0);
    let next = previous
        .checked_add(1)
        .ok_or(FencingError::Overflow { what: "epoch" })?;
    write_atomically(path, next)?;
    tracing::info!(path = %path.display(), epoch = next, "advanced shard epoch");
    Ok(next)
}

fn parse_epoch(text: &str) -> Result<u64, &'static str> {
    // Exactly one line with digits: anything else is a sign of a foreign or damaged file, and
    // silently "repairing" it could hand out an epoch that is not newer than the last one.
    let digits = text.strip_suffix('\n').unwrap_or(text);
    if digits.is_empty() {
        return Err("empty");
    }
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err("not a decimal number");
    }
    digits.parse::<u64>().map_err(|_| "number out of range")
}

fn write_atomically(path: &Path, epoch: u64) -> Result<(), FencingError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let file_name = path
        .file_name()
        .ok_or_else(|| corrupt(path, "path has no file name"))?;
    let mut tmp_name = file_name.to_os_string();
    tmp_name.push(format!(".tmp.{}", std::process::id()));
    let tmp = dir.join(tmp_name);

    let result = (|| -> io::Result<()> {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        file.write_all(format!("{epoch}\n").as_bytes())?;
        file.sync_all()?;
        drop(file);
        fs::rename(&tmp, path)?;
        // The rename is only durable once the directory entry is.
        File::open(&dir)?.sync_all()
    })();
    if let Err(source) = result {
        let _ = fs::remove_file(&tmp);
        return Err(io_err(path, source));
    }
    Ok(())
}

fn corrupt(path: &Path, reason: &str) -> FencingError {
    FencingError::CorruptEpochFile {
        path: path.to_path_buf(),
        reason: reason.to_owned(),
    }
}

fn io_err(path: &Path, source: io::Error) -> FencingError {
    FencingError::Io {
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn epoch_path(dir: &tempfile::TempDir) -> PathBuf {
        dir.path().join(EPOCH_FILE_NAME)
    }

    #[test]
    fn missing_file_starts_at_one_and_every_start_increments() {
        let dir = tempfile::tempdir().unwrap();
        let path = epoch_path(&dir);
        assert_eq!(read_epoch_file(&path).unwrap(), None);
        assert_eq!(advance_epoch_file(&path).unwrap(), 1);
        assert_eq!(advance_epoch_file(&path).unwrap(), 2);
        assert_eq!(advance_epoch_file(&path).unwrap(), 3);
        assert_eq!(read_epoch_file(&path).unwrap(), Some(3));
        assert_eq!(fs::read_to_string(&path).unwrap(), "3\n");
    }

    #[test]
    fn continues_from_an_existing_value_without_newline() {
        let dir = tempfile::tempdir().unwrap();
        let path = epoch_path(&dir);
        fs::write(&path, "41").unwrap();
        assert_eq!(advance_epoch_file(&path).unwrap(), 42);
    }

    #[test]
    fn no_temporary_files_are_left_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = epoch_path(&dir);
        advance_epoch_file(&path).unwrap();
        advance_epoch_file(&path).unwrap();
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, vec![EPOCH_FILE_NAME.to_owned()]);
    }

    #[test]
    fn corrupt_files_are_hard_errors_and_left_untouched() {
        for content in [
            "",
            "\n",
            "abc",
            "12x",
            "-3",
            " 7",
            "7\n\n",
            "99999999999999999999999",
        ] {
            let dir = tempfile::tempdir().unwrap();
            let path = epoch_path(&dir);
            fs::write(&path, content).unwrap();
            let err = advance_epoch_file(&path).unwrap_err();
            assert!(
                matches!(err, FencingError::CorruptEpochFile { .. }),
                "{content:?} gave {err:?}"
            );
            assert_eq!(fs::read_to_string(&path).unwrap(), content);
        }
    }

    #[test]
    fn non_utf8_content_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let path = epoch_path(&dir);
        fs::write(&path, [0xff, 0xfe, b'1']).unwrap();
        assert!(matches!(
            advance_epoch_file(&path),
            Err(FencingError::CorruptEpochFile { .. })
        ));
    }

    #[test]
    fn epoch_overflow_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = epoch_path(&dir);
        fs::write(&path, format!("{}\n", u64::MAX)).unwrap();
        assert!(matches!(
            advance_epoch_file(&path),
            Err(FencingError::Overflow { what: "epoch" })
        ));
    }

    #[test]
    fn missing_directory_is_an_io_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nope").join(EPOCH_FILE_NAME);
        assert!(matches!(
            advance_epoch_file(&path),
            Err(FencingError::Io { .. })
        ));
    }
}
