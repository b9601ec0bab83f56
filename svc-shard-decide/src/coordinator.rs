//! The seam between the cycle and the coordinator client: [`CoordView`]
//! implements `bigfleet_coordclient::ShardView` over decide's plain-data
//! accessors, converting to the coordinator's wire types here so neither side
//! knows the other.
//!
//! It also keeps what the coordinator client's in-memory de-duplication
//! cannot: the answer to every instruction that made this shard *choose*
//! machines (a selector release, a cross-shard drain), saved with the owned
//! set before the ack goes out (ADR-0137). A redelivery after a restart is
//! answered with the same machine ids and chooses nothing new.

use bigfleet_conv::{requirements_to_proto, resources_message};
use bigfleet_coordclient::{Applied, ShardView};
use bigfleet_decision::Ownership;
use bigfleet_proto::v1alpha1 as pb;
use futures::future::BoxFuture;
use std::collections::VecDeque;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use svc_shard_decide_core::{Decide, TransferVerdict};

/// Decide as the coordinator client sees it.
#[derive(Debug, Clone)]
pub struct CoordView {
    decide: Decide,
    /// Where the owned set is saved before an instruction changing it is acked.
    state: Option<PathBuf>,
    /// The machines each recent choosing instruction named, oldest first
    /// (saved with the owned set; at most [`ANSWER_MEMORY`]).
    answers: Arc<Mutex<VecDeque<Answer>>>,
}

/// Name of the owned-set file in `--data-dir`.
pub const OWNERSHIP_FILE_NAME: &str = "ownership";

/// How many instruction answers are kept across restarts (ADR-0137). The
/// coordinator redelivers an instruction until it is acked, and only the
/// instructions of transfers in flight are redelivered, so the last 1,024
/// cover any realistic backlog many times over.
pub const ANSWER_MEMORY: usize = 1024;

/// An instruction that made this shard choose machines, and the ones it chose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub instruction_id: String,
    pub machine_ids: Vec<String>,
}

/// What the ownership file holds: the owned set and the recent answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedState {
    pub ownership: Ownership,
    /// Oldest first.
    pub answers: Vec<Answer>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl CoordView {
    pub fn new(decide: Decide) -> Self {
        CoordView {
            decide,
            state: None,
            answers: Arc::default(),
        }
    }

    /// Saves the owned set to `path` before acking any change to it
    /// (ADR-0129): an acked assignment, release or adoption survives a restart.
    /// The answers saved there by the previous process are read back, so a
    /// redelivered release or drain is answered as before (ADR-0137).
    #[must_use]
    pub fn with_state_file(mut self, path: PathBuf) -> Self {
        match load_state(&path) {
            Ok(Some(saved)) => {
                *lock(&self.answers) = saved.answers.into();
            }
            Ok(None) => {}
            // Start-up already refused an unreadable file before building the view.
            Err(e) => {
                tracing::warn!(error = %e, "saved instruction answers unreadable; starting without them");
            }
        }
        self.state = Some(path);
        self
    }

    /// Saves `change` applied to the current set; the caller applies it to
    /// decide after (grants) or before (releases) — whichever order leaves a
    /// crash in between owning less, never more.
    fn save_with(&self, change: impl FnOnce(&mut Ownership)) -> Result<(), String> {
        let Some(path) = &self.state else {
            return Ok(());
        };
        let mut o = self.decide.ownership();
        change(&mut o);
        let answers: Vec<Answer> = lock(&self.answers).iter().cloned().collect();
        save_state(
            path,
            &SavedState {
                ownership: o,
                answers,
            },
        )
    }

    /// The machines `instruction_id` chose, when this shard (or the process before
    /// it) already answered it.
    pub fn answered(&self, instruction_id: &str) -> Option<Vec<String>> {
        lock(&self.answers)
            .iter()
            .rev()
            .find(|a| a.instruction_id == instruction_id)
            .map(|a| a.machine_ids.clone())
    }

    /// Records an answer and saves it with the owned set, in one write, before
    /// the ack goes out; forgets it again when the write fails.
    fn save_answer(&self, instruction_id: &str, ids: &[String]) -> Result<(), String> {
        {
            let mut answers = lock(&self.answers);
            answers.push_back(Answer {
                instruction_id: instruction_id.to_owned(),
                machine_ids: ids.to_vec(),
            });
            while answers.len() > ANSWER_MEMORY {
                answers.pop_front();
            }
        }
        let saved = self.save_with(|_| {});
        if saved.is_err() {
            lock(&self.answers).retain(|a| a.instruction_id != instruction_id);
        }
        saved
    }
}

/// Reads a saved owned set; `None` when there is no file yet.
pub fn load_ownership(path: &Path) -> Result<Option<Ownership>, String> {
    load_state(path).map(|s| s.map(|s| s.ownership))
}

/// Reads the saved owned set and answers; `None` when there is no file yet.
pub fn load_state(path: &Path) -> Result<Option<SavedState>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("reading {}: {e}", path.display())),
    };
    let mut o = Ownership::everything();
    let mut answers = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let fields: Vec<&str> = line.split('\t').collect();
        match fields.as_slice() {
            [] | [""] => {}
            ["domain", k, v] => {
                o.domains.insert(((*k).to_owned(), (*v).to_owned()));
            }
            ["adopted", id] => {
                o.adopted.insert((*id).to_owned());
            }
            ["released", id] => {
                o.released.insert((*id).to_owned());
            }
            ["answer", instruction, ids] if !instruction.is_empty() => answers.push(Answer {
                instruction_id: (*instruction).to_owned(),
                machine_ids: ids
                    .split(',')
                    .filter(|id| !id.is_empty())
                    .map(str::to_owned)
                    .collect(),
            }),
            _ => return Err(format!("{}:{}: unreadable line", path.display(), n + 1)),
        }
    }
    Ok(Some(SavedState {
        ownership: o,
        answers,
    }))
}

/// Writes the owned set durably (temp file, fsync, rename): one line per
/// domain, adopted or released machine, tab-separated.
pub fn save_ownership(path: &Path, o: &Ownership) -> Result<(), String> {
    save_state(
        path,
        &SavedState {
            ownership: o.clone(),
            answers: Vec::new(),
        },
    )
}

/// Writes the owned set and the answers durably in one file (temp file, fsync,
/// rename), so a release and the answer naming it are saved together or not at
/// all: `answer<TAB>instruction<TAB>id1,id2` lines after the owned set.
pub fn save_state(path: &Path, state: &SavedState) -> Result<(), String> {
    let o = &state.ownership;
    let clean = |s: &str| !s.contains(['\t', '\n', '\r']);
    let mut text = String::new();
    for (k, v) in &o.domains {
        if !clean(k) || !clean(v) {
            return Err(format!("domain {k:?}={v:?} cannot be saved"));
        }
        text.push_str(&format!("domain\t{k}\t{v}\n"));
    }
    for (kind, ids) in [("adopted", &o.adopted), ("released", &o.released)] {
        for id in ids {
            if !clean(id) {
                return Err(format!("machine id {id:?} cannot be saved"));
            }
            text.push_str(&format!("{kind}\t{id}\n"));
        }
    }
    for a in &state.answers {
        if !clean(&a.instruction_id) || a.instruction_id.is_empty() {
            return Err(format!(
                "instruction id {:?} cannot be saved",
                a.instruction_id
            ));
        }
        if let Some(id) = a
            .machine_ids
            .iter()
            .find(|id| !clean(id) || id.contains(','))
        {
            return Err(format!("machine id {id:?} cannot be saved"));
        }
        text.push_str(&format!(
            "answer\t{}\t{}\n",
            a.instruction_id,
            a.machine_ids.join(",")
        ));
    }
    let tmp = path.with_extension("tmp");
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| format!("saving owned domains to {}: {e}", path.display()))
}

fn count(n: u64) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

impl ShardView for CoordView {
    fn summary(&self) -> BoxFuture<'_, pb::ShardSummary> {
        Box::pin(async move {
            let s = self.decide.summary().await;
            pb::ShardSummary {
                total_machines: count(s.inventory.total),
                free_machines: count(s.inventory.free),
                per_instance_type_counts: s
                    .inventory
                    .by_instance_type
                    .into_iter()
                    .map(|(k, v)| (k, count(v)))
                    .collect(),
                per_zone_counts: s
                    .inventory
                    .by_zone
                    .into_iter()
                    .map(|(k, v)| (k, count(v)))
                    .collect(),
                provider_address: s.provider_address,
            }
        })
    }

    fn shortfalls(&self, limit: usize) -> Vec<pb::Shortfall> {
        self.decide
            .shortfalls(limit)
            .into_iter()
            .map(|e| pb::Shortfall {
                requirements: requirements_to_proto(e.profile.requirements()),
                deficit: resources_message(&e.deficit),
                priority: e.profile.priority(),
                age_cycles: i32::try_from(e.age_cycles).unwrap_or(i32::MAX),
                interruption_penalty_bucket: i32::from(e.interruption_bucket.ordinal()),
            })
            .collect()
    }

    fn observe_term(&self, term: i64) {
        self.decide.observe_coordinator_term(term);
    }

    fn assign_domain(&self, key: &str, value: &str) -> Result<(), String> {
        if key.is_empty() {
            return Err("empty topology key".to_owned());
        }
        // A grant is saved first: a crash before the ack owns less, not more.
        self.save_with(|o| {
            o.domains.insert((key.to_owned(), value.to_owned()));
        })?;
        self.decide.assign_domain(key, value);
        Ok(())
    }

    fn unassign_domain(&self, key: &str, value: &str) -> Result<(), String> {
        // A surrender is applied first, for the same reason.
        self.decide.unassign_domain(key, value);
        self.save_with(|_| {})
    }

    /// The shard's half is read off the payload (ADR-0129): the donor named in
    /// `from_shard_id` releases, the recipient in `to_shard_id` adopts.
    fn transfer_ownership(&self, instruction_id: &str, t: &pb::TransferOwnership) -> Applied {
        let me = self.decide.config().shard_id.as_str();
        let verdict = if t.from_shard_id == t.to_shard_id {
            return Applied::Invalid("transfer to the donor itself".to_owned());
        } else if t.from_shard_id == me {
            if let Some(ids) = self.answered(instruction_id) {
                return applied(TransferVerdict::Released(ids));
            }
            self.release_saved(instruction_id, self.decide.release_machines(&t.machine_ids))
        } else if t.to_shard_id == me {
            self.adopt_saved(&t.machine_ids)
        } else {
            return Applied::Invalid(format!(
                "transfer between other shards ({} to {})",
                t.from_shard_id, t.to_shard_id
            ));
        };
        tracing::info!(
            shard = %me,
            from = %t.from_shard_id,
            to = %t.to_shard_id,
            machines = t.machine_ids.len(),
            verdict = ?verdict,
            "transfer of ownership"
        );
        applied(verdict)
    }

    /// Release tokens (`*`, `*/<type>`) make this shard the donor of that many
    /// Speculative slots; machine ids make it their owner (ADR-0135).
    fn reassign_speculative(&self, instruction_id: &str, r: &pb::ReassignSpeculative) -> Applied {
        let me = self.decide.config().shard_id.as_str();
        let selectors = r.machine_ids.iter().filter(|t| t.starts_with('*')).count();
        let verdict = if r.machine_ids.is_empty() {
            return Applied::Invalid("no machine ids".to_owned());
        } else if selectors == r.machine_ids.len() {
            if let Some(ids) = self.answered(instruction_id) {
                return applied(TransferVerdict::Released(ids));
            }
            self.release_saved(
                instruction_id,
                self.decide.release_speculative(&r.machine_ids),
            )
        } else if selectors == 0 {
            self.adopt_saved(&r.machine_ids)
        } else {
            return Applied::Invalid("selectors mixed with machine ids".to_owned());
        };
        tracing::info!(
            shard = %me,
            slots = r.machine_ids.len(),
            release = selectors > 0,
            verdict = ?verdict,
            "speculative slots reassigned"
        );
        applied(verdict)
    }

    /// This shard, the donor, drains up to one lower-priority machine per
    /// selector through its own victim scoring and rails (ADR-0137). The ack
    /// names the machines it started draining — `released: id1,id2`, as every
    /// release-phase ack does, possibly empty when nothing is eligible — and is
    /// saved first, so a redelivery, even after a restart, chooses nothing new.
    fn cross_shard_drain(&self, instruction_id: &str, d: &pb::CrossShardDrain) -> Applied {
        if let Some(ids) = self.answered(instruction_id) {
            return applied(TransferVerdict::Released(ids));
        }
        if d.machine_ids.is_empty() || !d.machine_ids.iter().all(|t| t.starts_with('*')) {
            return Applied::Invalid("a drain names selectors (*, */<type>) only".to_owned());
        }
        let verdict =
            self.decide
                .drain_machines(instruction_id, &d.machine_ids, d.preemptor_priority);
        let verdict = match verdict {
            TransferVerdict::Released(ids) => match self.save_answer(instruction_id, &ids) {
                Ok(()) => TransferVerdict::Released(ids),
                Err(e) => {
                    // Not acked as done: nothing may drain for it either.
                    self.decide.forget_drains(instruction_id);
                    TransferVerdict::Refused(e)
                }
            },
            other => other,
        };
        tracing::info!(
            shard = %self.decide.config().shard_id,
            instruction = instruction_id,
            preemptor_priority = d.preemptor_priority,
            asked = d.machine_ids.len(),
            verdict = ?verdict,
            "cross-shard drain"
        );
        applied(verdict)
    }
}

impl CoordView {
    /// A donor's release, saved before it is acked: released in memory (owning less
    /// is safe) but not acked as done when the owned-set file cannot be written. A
    /// selector release's choice is saved with it, under its instruction id.
    fn release_saved(&self, instruction_id: &str, verdict: TransferVerdict) -> TransferVerdict {
        let saved = match &verdict {
            TransferVerdict::Done => self.save_with(|_| {}),
            TransferVerdict::Released(ids) => self.save_answer(instruction_id, ids),
            _ => return verdict,
        };
        match saved {
            Ok(()) => verdict,
            Err(e) => TransferVerdict::Refused(e),
        }
    }

    /// A recipient's adoption: saved first, so a crash before the ack owns less, not more.
    fn adopt_saved(&self, ids: &[String]) -> TransferVerdict {
        let saved = self.save_with(|o| {
            for id in ids {
                o.released.remove(id);
                o.adopted.insert(id.clone());
            }
        });
        match saved {
            Ok(()) => self.decide.adopt_machines(ids),
            Err(e) => TransferVerdict::Refused(e),
        }
    }
}

/// The instruction ack a transfer half's verdict asks for.
fn applied(verdict: TransferVerdict) -> Applied {
    match verdict {
        TransferVerdict::Done => Applied::Done,
        // The coordinator's second phase adopts exactly these (ADR-0130).
        TransferVerdict::Released(ids) => Applied::DoneWith(format!("released: {}", ids.join(","))),
        TransferVerdict::Busy(why) => Applied::Deferred(why),
        TransferVerdict::Refused(why) => Applied::Failed(why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use svc_shard_decide_core::testing::{self, MapSource, provider_machine};
    use svc_shard_decide_core::{DecideConfig, MachineSource};

    /// A shard's decide reading `source`; its session frames go nowhere.
    fn decide(cfg: DecideConfig, source: impl MachineSource) -> Decide {
        testing::decide(cfg, Arc::new(source))
    }

    fn view(shard: &str) -> CoordView {
        let cfg = DecideConfig {
            shard_id: shard.to_owned(),
            ..DecideConfig::default()
        };
        // An empty provider: these tests run no cycle.
        CoordView::new(decide(cfg, MapSource::default()))
    }

    /// A valid m5.xlarge record; Configured ones serve `priority` in cluster c1.
    fn machine(id: &str, state: pb::MachineState, priority: i32) -> pb::Machine {
        if state != pb::MachineState::Configured {
            return provider_machine(id, state, "");
        }
        let mut m = provider_machine(id, state, "c1");
        m.shard_metadata.insert(
            "bigfleet.lucy.sh/assigned-priority".to_owned(),
            priority.to_string(),
        );
        m
    }

    /// A shard process over `machines` that read its saved state from `path`, as
    /// start-up does (ADR-0129), with one cycle run so its inventory is listed.
    async fn process(path: &Path, machines: &[pb::Machine]) -> CoordView {
        let cfg = DecideConfig {
            shard_id: "s1".to_owned(),
            engine_threads: 1,
            ..DecideConfig::default()
        };
        let decide = decide(cfg, machines.iter().cloned().collect::<MapSource>());
        if let Some(o) = load_ownership(path).unwrap() {
            decide.restore_ownership(o);
        }
        decide.run_cycle().await.unwrap();
        CoordView::new(decide).with_state_file(path.to_owned())
    }

    /// The bug of issue #21: a donor that saved a selector release but restarted before
    /// its ack reached the coordinator must answer the redelivery with the machine it
    /// released then, not release another one (which nobody would ever adopt).
    #[tokio::test]
    async fn a_redelivered_release_after_a_restart_names_the_same_machines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(OWNERSHIP_FILE_NAME);
        let idle = [
            machine("a", pb::MachineState::Idle, 0),
            machine("b", pb::MachineState::Idle, 0),
            machine("c", pb::MachineState::Idle, 0),
        ];
        let mut release = transfer("s1", "s2");
        release.machine_ids = vec!["*/m5.xlarge".into(); 2];
        let first = process(&path, &idle).await;
        let answer = first.transfer_ownership("rel-1", &release);
        assert_eq!(answer, Applied::DoneWith("released: a,b".into()));
        drop(first);
        // Restarted before the ack went out: the coordinator redelivers rel-1.
        let again = process(&path, &idle).await;
        assert_eq!(again.transfer_ownership("rel-1", &release), answer);
        let released: Vec<String> = again.decide.ownership().released.into_iter().collect();
        assert_eq!(released, ["a", "b"], "nothing new released");
        // A new instruction does choose again.
        assert_eq!(
            again.transfer_ownership("rel-2", &release),
            Applied::DoneWith("released: c".into())
        );
    }

    /// The same across a restart for a cross-shard drain: the redelivery names the
    /// victims chosen before and chooses no new ones.
    #[tokio::test]
    async fn a_redelivered_drain_after_a_restart_chooses_nothing_new() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(OWNERSHIP_FILE_NAME);
        let busy = [
            machine("v-high", pb::MachineState::Configured, 5_000),
            machine("v-low", pb::MachineState::Configured, 10),
            machine("v-mid", pb::MachineState::Configured, 500),
        ];
        let drain = pb::CrossShardDrain {
            machine_ids: vec!["*/m5.xlarge".into()],
            preemptor_priority: 1_000,
        };
        let first = process(&path, &busy).await;
        let answer = first.cross_shard_drain("drain-1", &drain);
        assert_eq!(answer, Applied::DoneWith("released: v-low".into()));
        // Redelivered in the same process: the same answer, no second victim.
        assert_eq!(first.cross_shard_drain("drain-1", &drain), answer);
        assert_eq!(first.decide.pending_drains().len(), 1);
        drop(first);
        let again = process(&path, &busy).await;
        assert_eq!(again.cross_shard_drain("drain-1", &drain), answer);
        assert!(
            again.decide.pending_drains().is_empty(),
            "the redelivery drains nothing new"
        );
        // Not selectors: not this shard's to apply.
        let named = pb::CrossShardDrain {
            machine_ids: vec!["v-mid".into()],
            preemptor_priority: 1_000,
        };
        assert!(matches!(
            again.cross_shard_drain("drain-2", &named),
            Applied::Invalid(_)
        ));
    }

    #[test]
    fn answers_round_trip_and_stay_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(OWNERSHIP_FILE_NAME);
        let v = view("s1").with_state_file(path.clone());
        for i in 0..ANSWER_MEMORY + 3 {
            v.save_answer(&format!("i{i}"), &[format!("m{i}"), "x".into()])
                .unwrap();
        }
        v.save_answer("empty", &[]).unwrap();
        let saved = load_state(&path).unwrap().expect("saved");
        assert_eq!(saved.answers.len(), ANSWER_MEMORY);
        assert_eq!(
            saved.answers[0].instruction_id, "i4",
            "oldest dropped first"
        );
        let last = saved.answers.last().unwrap();
        assert_eq!(
            (last.instruction_id.as_str(), last.machine_ids.len()),
            ("empty", 0)
        );
        let reread = view("s1").with_state_file(path.clone());
        assert_eq!(reread.answered("i9"), Some(vec!["m9".into(), "x".into()]));
        assert_eq!(reread.answered("i0"), None);
        assert_eq!(reread.answered("empty"), Some(vec![]));
        // An id the wire list could not carry is never saved.
        assert!(v.save_answer("bad", &["a,b".into()]).is_err());
        assert_eq!(v.answered("bad"), None);
    }

    fn transfer(from: &str, to: &str) -> pb::TransferOwnership {
        pb::TransferOwnership {
            machine_ids: vec!["m1".into()],
            from_shard_id: from.into(),
            to_shard_id: to.into(),
        }
    }

    #[test]
    fn the_owned_set_file_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(OWNERSHIP_FILE_NAME);
        assert_eq!(load_ownership(&path), Ok(None), "no file yet");
        let mut o = Ownership::of_domains([("rack", "r1"), ("topology.kubernetes.io/zone", "za")]);
        o.adopted.insert("m-7".into());
        o.released.insert("m 8".into());
        save_ownership(&path, &o).unwrap();
        assert_eq!(load_ownership(&path), Ok(Some(o.clone())));
        o.adopted.insert("bad\tid".into());
        assert!(save_ownership(&path, &o).is_err());
        std::fs::write(&path, "domain\tonly-key\n").unwrap();
        assert!(load_ownership(&path).is_err());
    }

    #[tokio::test]
    async fn acked_changes_are_saved_and_a_restart_reads_them_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(OWNERSHIP_FILE_NAME);
        let v = view("s1").with_state_file(path.clone());
        v.assign_domain("rack", "r1").unwrap();
        v.assign_domain("rack", "r2").unwrap();
        v.unassign_domain("rack", "r2").unwrap();
        assert_eq!(
            v.transfer_ownership("i1", &transfer("s0", "s1")),
            Applied::Done
        );
        let saved = load_ownership(&path).unwrap().expect("saved");
        assert_eq!(saved, v.decide.ownership());
        // The restarted process.
        let again = view("s1");
        again.decide.restore_ownership(saved);
        let o = again.decide.ownership();
        assert_eq!(
            o.domains.into_iter().collect::<Vec<_>>(),
            [("rack".to_owned(), "r1".to_owned())]
        );
        assert!(o.adopted.contains("m1"));
    }

    #[tokio::test]
    async fn the_payload_picks_the_half() {
        let v = view("s1");
        // Recipient: adopts.
        assert_eq!(
            v.transfer_ownership("i2", &transfer("s0", "s1")),
            Applied::Done
        );
        assert!(v.decide.ownership().adopted.contains("m1"));
        // Donor: releases only what it knows to be Idle; m1 is not in its inventory.
        let Applied::Failed(why) = v.transfer_ownership("i3", &transfer("s1", "s2")) else {
            panic!("an unknown machine cannot be released");
        };
        assert!(why.contains("m1"), "{why}");
        assert!(v.decide.ownership().released.is_empty());
        // A selector release names what it chose (nothing, with no inventory).
        let mut pick = transfer("s1", "s2");
        pick.machine_ids = vec!["*/gpu".into(); 2];
        assert_eq!(
            v.transfer_ownership("i4", &pick),
            Applied::DoneWith("released: ".into())
        );
        // Neither side, or both sides: not this shard's to apply.
        assert!(matches!(
            v.transfer_ownership("i5", &transfer("s7", "s8")),
            Applied::Invalid(_)
        ));
        assert!(matches!(
            v.transfer_ownership("i6", &transfer("s1", "s1")),
            Applied::Invalid(_)
        ));
    }
}
