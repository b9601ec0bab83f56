//! The actuation log: one JSON line per mutating call the provider accepted (it passed the
//! fence and either started a transition or was answered as a replay), appended in the
//! order the provider accepted them — `--actuation-log FILE`. `bigfleet up --chaos` reads
//! it to prove that no machine was actuated twice and that no call carrying an epoch older
//! than one already accepted for its shard got through.
//!
//! The file is appended to across restarts of the provider; every line names the
//! incarnation (process start) that wrote it, because a restarted fake reseeds its machines
//! from the catalog and its per-machine history starts again.
//!
//! Line format: `{"incarnation":..,"unix_ms":..,"op":"configure","machine":..,"shard":..,
//! "epoch":..,"sequence":..,"operation":"op-7","replay":false}`. Lines are flushed to the OS
//! on every call (a crash keeps them; a torn last line is skipped when reading).

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// One accepted mutating call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Actuation {
    /// The provider process that accepted it (its start, in Unix nanoseconds).
    pub incarnation: u64,
    /// When it was accepted (Unix milliseconds).
    pub unix_ms: u64,
    /// `create`, `configure`, `drain` or `delete`.
    pub op: String,
    pub machine: String,
    /// The fencing token (empty shard and zeros: an unfenced in-process caller).
    pub shard: String,
    pub epoch: i64,
    pub sequence: i64,
    /// The operation id handed back.
    pub operation: String,
    /// True when the call was answered as a replay of the machine's last operation (no new
    /// work started).
    pub replay: bool,
}

/// The open log of one provider process.
#[derive(Debug)]
pub(crate) struct ActuationLog {
    path: PathBuf,
    incarnation: u64,
    out: BufWriter<File>,
}

impl ActuationLog {
    /// Opens `path` for appending (created if missing).
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let f = OpenOptions::new().create(true).append(true).open(path)?;
        let incarnation = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        Ok(Self {
            path: path.to_owned(),
            incarnation,
            out: BufWriter::new(f),
        })
    }

    /// Appends one accepted call; a write error is logged, never fails the call.
    pub fn record(
        &mut self,
        op: &str,
        machine: &str,
        token: (&str, i64, i64),
        operation: u64,
        replay: bool,
    ) {
        let line = Actuation {
            incarnation: self.incarnation,
            unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            op: op.to_owned(),
            machine: machine.to_owned(),
            shard: token.0.to_owned(),
            epoch: token.1,
            sequence: token.2,
            operation: format!("op-{operation}"),
            replay,
        };
        let written = serde_json::to_writer(&mut self.out, &line)
            .map_err(std::io::Error::other)
            .and_then(|()| self.out.write_all(b"\n"))
            .and_then(|()| self.out.flush());
        if let Err(e) = written {
            tracing::warn!(path = %self.path.display(), error = %e, "actuation log write failed");
        }
    }
}

/// Reads an actuation log (missing file: empty; unparsable lines — a torn tail — skipped).
pub fn read_actuation_log(path: &Path) -> std::io::Result<Vec<Actuation>> {
    let f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for line in BufReader::new(f).lines() {
        let line = line?;
        if let Ok(a) = serde_json::from_str::<Actuation>(&line) {
            out.push(a);
        }
    }
    Ok(out)
}

/// What an actuation log proves.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ActuationAudit {
    /// Accepted calls (new operations and replays).
    pub accepted: u64,
    /// Of those, replays (idempotent retries: no new work).
    pub replays: u64,
    /// Machines on which one provider incarnation started the same kind of operation twice
    /// in a row (the second was new work, not a replay), or two new operations under one
    /// fencing token.
    pub machines_actuated_twice: Vec<String>,
    /// Accepted calls whose epoch was below one already accepted for the same shard.
    pub fenced_calls_accepted: u64,
    /// Highest epoch accepted per shard.
    pub epochs: BTreeMap<String, i64>,
}

/// Audits `log` (in acceptance order).
pub fn audit(log: &[Actuation]) -> ActuationAudit {
    let mut a = ActuationAudit::default();
    // (incarnation, machine) → kind of the last new operation.
    let mut last_new: BTreeMap<(u64, &str), &str> = BTreeMap::new();
    let mut tokens: BTreeMap<(u64, &str, &str, i64, i64), u32> = BTreeMap::new();
    let mut twice = std::collections::BTreeSet::new();
    for x in log {
        a.accepted += 1;
        if !x.shard.is_empty() {
            let hw = a.epochs.entry(x.shard.clone()).or_insert(x.epoch);
            if x.epoch < *hw {
                a.fenced_calls_accepted += 1;
            }
            *hw = (*hw).max(x.epoch);
        }
        if x.replay {
            a.replays += 1;
            continue;
        }
        let key = (x.incarnation, x.machine.as_str());
        if last_new.insert(key, x.op.as_str()) == Some(x.op.as_str()) {
            twice.insert(x.machine.clone());
        }
        if !x.shard.is_empty() {
            let n = tokens
                .entry((
                    x.incarnation,
                    x.machine.as_str(),
                    x.shard.as_str(),
                    x.epoch,
                    x.sequence,
                ))
                .or_default();
            *n += 1;
            if *n > 1 {
                twice.insert(x.machine.clone());
            }
        }
    }
    a.machines_actuated_twice = twice.into_iter().collect();
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn act(inc: u64, op: &str, m: &str, epoch: i64, seq: i64, replay: bool) -> Actuation {
        Actuation {
            incarnation: inc,
            unix_ms: 0,
            op: op.into(),
            machine: m.into(),
            shard: "shard-0".into(),
            epoch,
            sequence: seq,
            operation: "op-1".into(),
            replay,
        }
    }

    #[test]
    fn a_clean_history_passes() {
        let log = [
            act(1, "create", "a", 5, 1, false),
            act(1, "create", "a", 5, 2, true),
            act(1, "configure", "a", 6, 1, false),
            act(1, "drain", "a", 6, 2, false),
            act(1, "configure", "a", 6, 3, false),
            // A restarted provider reseeds: its history of "a" starts again.
            act(2, "configure", "a", 7, 1, false),
        ];
        let a = audit(&log);
        assert_eq!(a.accepted, 6);
        assert_eq!(a.replays, 1);
        assert!(a.machines_actuated_twice.is_empty(), "{a:?}");
        assert_eq!(a.fenced_calls_accepted, 0);
        assert_eq!(a.epochs["shard-0"], 7);
    }

    #[test]
    fn a_double_actuation_and_a_stale_epoch_are_caught() {
        let log = [
            act(1, "configure", "a", 6, 1, false),
            act(1, "configure", "a", 6, 2, false),
            act(1, "drain", "b", 7, 1, false),
            // An older epoch of shard-0 on another machine: the provider fences per
            // machine, the invariant is per shard.
            act(1, "create", "c", 6, 9, false),
        ];
        let a = audit(&log);
        assert_eq!(a.machines_actuated_twice, ["a"]);
        assert_eq!(a.fenced_calls_accepted, 1);
    }

    #[test]
    fn the_log_round_trips_and_skips_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("actuations.jsonl");
        {
            let mut l = ActuationLog::open(&p).unwrap();
            l.record("create", "m-1", ("shard-0", 3, 1), 1, false);
            l.record("create", "m-1", ("shard-0", 3, 2), 1, true);
        }
        let mut f = OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(b"{\"incarnation\":").unwrap();
        let log = read_actuation_log(&p).unwrap();
        assert_eq!(log.len(), 2);
        assert_eq!(log[0].operation, "op-1");
        assert!(log[1].replay);
        assert!(
            read_actuation_log(&dir.path().join("none"))
                .unwrap()
                .is_empty()
        );
    }
}
