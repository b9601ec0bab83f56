//! Fencing high-water marks per (shard, machine), optionally persisted to an append-only
//! file so a restarted provider still refuses a zombie shard.
//!
//! File format: one JSON object per line, `{"shard":..,"machine":..,"epoch":..,"sequence":..}`,
//! appended on every advance. Loading keeps the highest mark per key and rewrites the file
//! compacted. A torn last line (crash mid-write) is ignored; a malformed line anywhere else
//! is a hard error, because silently forgetting marks would let a zombie through.
//! Lines are flushed to the OS on every advance but not fsynced: the marks survive a
//! process crash, not a power loss — enough for a test provider.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use crate::FenceFileError;

/// A token's position: epoch first, then sequence (the wire's `int64`s, compared as such).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Mark {
    pub epoch: i64,
    pub sequence: i64,
}

/// Why a token was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stale {
    pub high_water: Mark,
}

#[derive(Serialize, Deserialize)]
struct Line<'a> {
    shard: std::borrow::Cow<'a, str>,
    machine: std::borrow::Cow<'a, str>,
    epoch: i64,
    sequence: i64,
}

/// The marks, nested shard → machine so a lookup borrows the request's strings instead of
/// allocating a key.
#[derive(Debug, Default)]
pub(crate) struct FenceMarks {
    marks: FxHashMap<Box<str>, FxHashMap<Box<str>, Mark>>,
    len: usize,
    file: Option<(PathBuf, BufWriter<File>)>,
}

impl FenceMarks {
    pub fn in_memory() -> Self {
        Self::default()
    }

    /// Loads `path` (missing ⇒ empty), compacts it and keeps it open for appends.
    pub fn open(path: &Path) -> Result<Self, FenceFileError> {
        let mut me = Self::default();
        let io = |source| FenceFileError::Io {
            path: path.to_owned(),
            source,
        };
        match File::open(path) {
            Ok(f) => {
                let lines: Vec<String> = BufReader::new(f)
                    .lines()
                    .collect::<Result<_, _>>()
                    .map_err(io)?;
                let last = lines.len().saturating_sub(1);
                for (i, line) in lines.iter().enumerate() {
                    if line.trim().is_empty() {
                        continue;
                    }
                    match serde_json::from_str::<Line>(line) {
                        Ok(l) => {
                            me.raise(
                                &l.shard,
                                &l.machine,
                                Mark {
                                    epoch: l.epoch,
                                    sequence: l.sequence,
                                },
                            );
                        }
                        Err(e) if i == last => {
                            tracing::warn!(path = %path.display(), error = %e, "ignoring torn last line of the fence file");
                        }
                        Err(e) => {
                            return Err(FenceFileError::Corrupt {
                                path: path.to_owned(),
                                line: i + 1,
                                reason: e.to_string(),
                            });
                        }
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(e)),
        }
        // Compact: write every current mark to a temp file and rename it over the log.
        let tmp = path.with_extension("compact.tmp");
        {
            let mut w = BufWriter::new(File::create(&tmp).map_err(io)?);
            for (shard, machines) in &me.marks {
                for (machine, mark) in machines {
                    write_line(&mut w, shard, machine, *mark).map_err(io)?;
                }
            }
            w.flush().map_err(io)?;
            w.get_ref().sync_all().map_err(io)?;
        }
        std::fs::rename(&tmp, path).map_err(io)?;
        let f = OpenOptions::new().append(true).open(path).map_err(io)?;
        me.file = Some((path.to_owned(), BufWriter::new(f)));
        Ok(me)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn get(&self, shard: &str, machine: &str) -> Option<Mark> {
        self.marks.get(shard)?.get(machine).copied()
    }

    /// The provider rule: accept iff no mark exists or `mark` is strictly newer; an accepted
    /// mark is recorded (and appended to the file) before the caller acts on it.
    pub fn check_and_advance(
        &mut self,
        shard: &str,
        machine: &str,
        mark: Mark,
    ) -> Result<Result<(), Stale>, FenceFileError> {
        if let Some(hw) = self.get(shard, machine)
            && mark <= hw
        {
            return Ok(Err(Stale { high_water: hw }));
        }
        if let Some((path, w)) = &mut self.file {
            write_line(w, shard, machine, mark)
                .and_then(|()| w.flush())
                .map_err(|source| FenceFileError::Io {
                    path: path.clone(),
                    source,
                })?;
        }
        self.raise(shard, machine, mark);
        Ok(Ok(()))
    }

    fn raise(&mut self, shard: &str, machine: &str, mark: Mark) {
        let machines = match self.marks.get_mut(shard) {
            Some(m) => m,
            None => self.marks.entry(shard.into()).or_default(),
        };
        match machines.get_mut(machine) {
            Some(hw) => *hw = (*hw).max(mark),
            None => {
                machines.insert(machine.into(), mark);
                self.len += 1;
            }
        }
    }
}

fn write_line(w: &mut impl Write, shard: &str, machine: &str, mark: Mark) -> std::io::Result<()> {
    let line = Line {
        shard: shard.into(),
        machine: machine.into(),
        epoch: mark.epoch,
        sequence: mark.sequence,
    };
    serde_json::to_writer(&mut *w, &line)?;
    w.write_all(b"\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(epoch: i64, sequence: i64) -> Mark {
        Mark { epoch, sequence }
    }

    #[test]
    fn strictly_newer_rule() {
        let mut f = FenceMarks::in_memory();
        assert!(f.check_and_advance("s", "a", m(1, 5)).unwrap().is_ok());
        assert_eq!(
            f.check_and_advance("s", "a", m(1, 5)).unwrap(),
            Err(Stale {
                high_water: m(1, 5)
            })
        );
        assert!(f.check_and_advance("s", "a", m(1, 4)).unwrap().is_err());
        assert!(f.check_and_advance("s", "a", m(0, 999)).unwrap().is_err());
        assert!(f.check_and_advance("s", "a", m(1, 6)).unwrap().is_ok());
        assert!(f.check_and_advance("s", "a", m(2, 1)).unwrap().is_ok());
        // Other machine and other shard are independent.
        assert!(f.check_and_advance("s", "b", m(0, 1)).unwrap().is_ok());
        assert!(f.check_and_advance("t", "a", m(0, 1)).unwrap().is_ok());
        assert_eq!(f.len(), 3);
        assert_eq!(f.get("s", "a"), Some(m(2, 1)));
    }

    #[test]
    fn persisted_marks_survive_reopen_and_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fence.jsonl");
        {
            let mut f = FenceMarks::open(&path).unwrap();
            f.check_and_advance("s", "a", m(3, 7)).unwrap().unwrap();
            f.check_and_advance("s", "a", m(3, 9)).unwrap().unwrap();
            f.check_and_advance("s\t\"odd\"", "b\n", m(1, 1))
                .unwrap()
                .unwrap();
        }
        // Simulate a crash in the middle of an append.
        let mut raw = std::fs::read_to_string(&path).unwrap();
        raw.push_str("{\"shard\":\"s\",\"mach");
        std::fs::write(&path, raw).unwrap();

        let mut f = FenceMarks::open(&path).unwrap();
        assert_eq!(f.get("s", "a"), Some(m(3, 9)));
        assert_eq!(f.get("s\t\"odd\"", "b\n"), Some(m(1, 1)));
        assert!(f.check_and_advance("s", "a", m(3, 9)).unwrap().is_err());
        // Compaction left one line per mark.
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 2, "{text}");
    }

    #[test]
    fn corrupt_middle_line_is_a_hard_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fence.jsonl");
        std::fs::write(
            &path,
            "garbage\n{\"shard\":\"s\",\"machine\":\"a\",\"epoch\":1,\"sequence\":1}\n",
        )
        .unwrap();
        assert!(matches!(
            FenceMarks::open(&path),
            Err(FenceFileError::Corrupt { line: 1, .. })
        ));
    }
}
