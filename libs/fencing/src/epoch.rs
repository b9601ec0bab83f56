//! The on-disk epoch: one decimal number, bumped and made durable before a shard acts.
//!
//! A start mints `max(stored + 1, floor)` where the floor is the wall clock in whole seconds
//! (ADR-0103): `stored + 1` keeps epochs increasing while the file lives, the floor keeps
//! them increasing when it is lost — providers remember the highest epoch per machine, so an
//! epoch that went backwards would fence the shard out of every machine it touched.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::FencingError;

/// Conventional file name inside a shard's data dir (`<data-dir>/epoch`).
pub const EPOCH_FILE_NAME: &str = "epoch";

/// The highest epoch a shard may use: providers receive `shard_epoch` as an `int64`, and an
/// epoch above it could only be sent saturated — two incarnations would look the same.
pub const MAX_EPOCH: u64 = i64::MAX as u64;

/// How long a start may wait for the wall clock to pass its epoch ([`until_clock_passes`]).
/// One second is the normal worst case (the floor is the current second); a longer lead
/// means the clock was set back, and waiting it out would hold the shard down for as long.
pub const MAX_CLOCK_WAIT: Duration = Duration::from_secs(2);

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

/// The wall-clock floor for an epoch minted at `now`: whole seconds since the Unix epoch.
///
/// A clock before 1970 gives 0 (no floor): such a clock is broken, and `stored + 1` still
/// orders every start that finds its file.
pub fn clock_floor(now: SystemTime) -> u64 {
    now.duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}

/// Starts a new incarnation: reads the stored epoch (missing ⇒ 0), stores
/// `max(previous + 1, floor)` durably and returns it.
///
/// Pass [`clock_floor`] of the time *after* taking the data dir's lock
/// ([`crate::DataDirLock`]): any earlier incarnation then ran before this read of the clock,
/// so if it, too, took its epoch from the clock and did not act before the clock had passed
/// it ([`until_clock_passes`]), this epoch is above it even when the file was lost.
///
/// Durability matters more than speed here: the new value is written to a temporary file,
/// fsynced, renamed over the old one and the directory is fsynced, so after a crash the file
/// holds either the old or the new epoch — never a torn one — and a returned epoch is never
/// handed out again. A file that exists but does not parse is a hard error, and so is an
/// epoch above [`MAX_EPOCH`].
///
/// Two processes advancing the same file at once are not coordinated here: the caller holds
/// the data dir's [`crate::DataDirLock`].
pub fn advance_epoch_file(path: &Path, floor: u64) -> Result<u64, FencingError> {
    let stored = read_epoch_file(path)?;
    let next = stored
        .unwrap_or(0)
        .checked_add(1)
        .map(|n| n.max(floor))
        .filter(|n| *n <= MAX_EPOCH)
        .ok_or(FencingError::Overflow { what: "epoch" })?;
    write_atomically(path, next)?;
    match stored {
        None => tracing::warn!(
            path = %path.display(), epoch = next,
            "no epoch file: starting from the wall-clock floor (a first start, or the data dir was lost)"
        ),
        Some(previous) if next > previous + 1 => tracing::info!(
            path = %path.display(), previous, epoch = next,
            "advanced shard epoch to the wall-clock floor"
        ),
        Some(_) => tracing::info!(path = %path.display(), epoch = next, "advanced shard epoch"),
    }
    Ok(next)
}

/// How long from `now` until the wall clock has left second `epoch` behind; zero once it
/// has. A start that waits this long before acting guarantees that every later start's
/// [`clock_floor`] is above `epoch`, so a later loss of the epoch file cannot mint it again.
/// An epoch too far ahead to be represented as a time gives [`Duration::MAX`].
pub fn until_clock_passes(epoch: u64, now: SystemTime) -> Duration {
    epoch
        .checked_add(1)
        .and_then(|s| UNIX_EPOCH.checked_add(Duration::from_secs(s)))
        .map_or(Duration::MAX, |passed| {
            passed.duration_since(now).unwrap_or(Duration::ZERO)
        })
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
    fn without_a_floor_a_missing_file_starts_at_one_and_every_start_increments() {
        let dir = tempfile::tempdir().unwrap();
        let path = epoch_path(&dir);
        assert_eq!(read_epoch_file(&path).unwrap(), None);
        assert_eq!(advance_epoch_file(&path, 0).unwrap(), 1);
        assert_eq!(advance_epoch_file(&path, 0).unwrap(), 2);
        assert_eq!(advance_epoch_file(&path, 0).unwrap(), 3);
        assert_eq!(read_epoch_file(&path).unwrap(), Some(3));
        assert_eq!(fs::read_to_string(&path).unwrap(), "3\n");
    }

    #[test]
    fn continues_from_an_existing_value_without_newline() {
        let dir = tempfile::tempdir().unwrap();
        let path = epoch_path(&dir);
        fs::write(&path, "41").unwrap();
        assert_eq!(advance_epoch_file(&path, 0).unwrap(), 42);
    }

    #[test]
    fn no_temporary_files_are_left_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = epoch_path(&dir);
        advance_epoch_file(&path, 0).unwrap();
        advance_epoch_file(&path, 0).unwrap();
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
            let err = advance_epoch_file(&path, 0).unwrap_err();
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
            advance_epoch_file(&path, 0),
            Err(FencingError::CorruptEpochFile { .. })
        ));
    }

    #[test]
    fn epoch_overflow_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = epoch_path(&dir);
        fs::write(&path, format!("{}\n", u64::MAX)).unwrap();
        assert!(matches!(
            advance_epoch_file(&path, 0),
            Err(FencingError::Overflow { what: "epoch" })
        ));
    }

    #[test]
    fn missing_directory_is_an_io_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nope").join(EPOCH_FILE_NAME);
        assert!(matches!(
            advance_epoch_file(&path, 0),
            Err(FencingError::Io { .. })
        ));
    }

    /// Around the time of writing: the wall-clock floor of a real start.
    const NOW: u64 = 1_795_000_000;

    fn at(secs: u64, millis: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_millis(millis)
    }

    #[test]
    fn missing_file_starts_at_the_floor() {
        let dir = tempfile::tempdir().unwrap();
        let path = epoch_path(&dir);
        let epoch = advance_epoch_file(&path, NOW).unwrap();
        assert!(epoch >= NOW, "{epoch}");
        assert_eq!(epoch, NOW);
        assert_eq!(read_epoch_file(&path).unwrap(), Some(NOW));
        // The real clock gives a floor too: a lost file never restarts at 1.
        let dir = tempfile::tempdir().unwrap();
        let path = epoch_path(&dir);
        let floor = clock_floor(SystemTime::now());
        assert!(floor > 1_600_000_000, "the clock reads {floor}");
        assert!(advance_epoch_file(&path, floor).unwrap() >= floor);
    }

    #[test]
    fn stored_plus_one_wins_when_larger() {
        let dir = tempfile::tempdir().unwrap();
        let path = epoch_path(&dir);
        // Restarts faster than once a second, or a clock set back: the file stays ahead.
        fs::write(&path, format!("{}\n", NOW + 500)).unwrap();
        assert_eq!(advance_epoch_file(&path, NOW).unwrap(), NOW + 501);
        assert_eq!(advance_epoch_file(&path, NOW).unwrap(), NOW + 502);
        // Equal to the floor: still strictly above the stored value.
        fs::write(&path, format!("{NOW}\n")).unwrap();
        assert_eq!(advance_epoch_file(&path, NOW).unwrap(), NOW + 1);
    }

    #[test]
    fn a_file_that_goes_backwards_is_still_superseded() {
        let dir = tempfile::tempdir().unwrap();
        let path = epoch_path(&dir);
        let first = advance_epoch_file(&path, NOW).unwrap();
        let second = advance_epoch_file(&path, NOW).unwrap();
        assert_eq!((first, second), (NOW, NOW + 1));
        // The volume is restored from an old backup (or the file is lost and recreated by
        // hand): the stored value is far below what was already handed out.
        fs::write(&path, "3\n").unwrap();
        // The next start reads the clock after the previous one had passed its epoch.
        let third = advance_epoch_file(&path, clock_floor(at(NOW + 2, 1))).unwrap();
        assert!(third > second, "{third} after {second}");
        fs::remove_file(&path).unwrap();
        let fourth = advance_epoch_file(&path, clock_floor(at(NOW + 3, 0))).unwrap();
        assert!(fourth > third, "{fourth} after {third}");
    }

    #[test]
    fn the_clock_floor_is_whole_seconds_since_1970() {
        assert_eq!(clock_floor(at(NOW, 999)), NOW);
        assert_eq!(clock_floor(UNIX_EPOCH), 0);
        assert_eq!(clock_floor(UNIX_EPOCH - Duration::from_secs(5)), 0);
    }

    #[test]
    fn waiting_for_the_clock_to_pass_an_epoch() {
        // Minted from the floor mid-second: the rest of that second.
        assert_eq!(
            until_clock_passes(NOW, at(NOW, 250)),
            Duration::from_millis(750)
        );
        // Minted as stored + 1, one second ahead of the clock.
        assert_eq!(
            until_clock_passes(NOW + 1, at(NOW, 0)),
            Duration::from_secs(2)
        );
        // The clock already passed it (a file well behind the clock never waits).
        assert_eq!(until_clock_passes(NOW, at(NOW + 1, 0)), Duration::ZERO);
        assert_eq!(until_clock_passes(7, at(NOW, 0)), Duration::ZERO);
        // A clock set back by an hour: far more than a start should wait.
        assert!(until_clock_passes(NOW + 3600, at(NOW, 0)) > MAX_CLOCK_WAIT);
        assert_eq!(until_clock_passes(u64::MAX, at(NOW, 0)), Duration::MAX);
    }

    #[test]
    fn epochs_stay_within_the_wire_int64() {
        let dir = tempfile::tempdir().unwrap();
        let path = epoch_path(&dir);
        fs::write(&path, format!("{}\n", MAX_EPOCH - 1)).unwrap();
        assert_eq!(advance_epoch_file(&path, 0).unwrap(), MAX_EPOCH);
        assert_eq!(i64::try_from(MAX_EPOCH).unwrap(), i64::MAX);
        // The next one would not fit: refused, and the file keeps the last good epoch.
        assert!(matches!(
            advance_epoch_file(&path, 0),
            Err(FencingError::Overflow { what: "epoch" })
        ));
        assert_eq!(read_epoch_file(&path).unwrap(), Some(MAX_EPOCH));
        // A floor beyond the wire is refused as well, file or no file.
        let dir = tempfile::tempdir().unwrap();
        let path = epoch_path(&dir);
        assert!(matches!(
            advance_epoch_file(&path, MAX_EPOCH + 1),
            Err(FencingError::Overflow { what: "epoch" })
        ));
        assert_eq!(read_epoch_file(&path).unwrap(), None);
    }
}
