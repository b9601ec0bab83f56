//! Cross-shard transfers as replicated state (ADR-0130): what the rebalancer started, which
//! phase each transfer is in, and the instruction each phase sends. Everything here is pure
//! and lives in the FSM, so a new leader resumes every transfer where the old one left it
//! and redelivers the same instruction id until the shard acknowledges it.
//!
//! The wire messages carry machine ids, which the coordinator never sees (reports carry
//! counts). So the first phase names *what* to release with selector tokens, and the donor
//! names *which* machines it released in its acknowledgement:
//!
//! * Release (to the donor): `TransferOwnership{machine_ids: ["*/<type>"; n], from: donor,
//!   to: recipient}` (idle machines), `ReassignSpeculative{machine_ids: ["*/<type>"; n]}`
//!   (speculative slots) or `CrossShardDrain{machine_ids: ["*/<type>"; n],
//!   preemptor_priority}`. `"*"` alone means any instance type; each token also names what
//!   its shortfall lacks and must match (`*?needs=nvidia.com/gpu`, ADR-0142). The donor
//!   releases up to n matching machines and acks ACCEPTED with `reason = "released: id1,id2"`.
//! * Adopt (to the recipient, only after that ack): the same payload with the released ids
//!   (`from: donor, to: recipient`). A drain has no adopt phase: the drained machines become
//!   the donor's Idle supply, which a later transfer moves.
//! * Return (to the donor, when the recipient refuses to adopt): `TransferOwnership{ids,
//!   from: recipient, to: donor}` — the donor takes its machines back.
//!
//! A shard releases when `from_shard_id` is itself and adopts when `to_shard_id` is itself.

use serde::{Deserialize, Serialize};

use bigfleet_proto::v1alpha1::{self as pb, coordinator_instruction::Payload};

/// Prefix of a selector token in a release instruction's `machine_ids`.
pub const SELECTOR: &str = "*";
/// Prefix of an ACCEPTED release ack's `reason` that lists the released machine ids.
pub const RELEASED_PREFIX: &str = "released:";
/// Finished transfers kept for cool-downs and for operators (oldest dropped first).
pub const MAX_RECENT: usize = 128;

/// What a transfer moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TransferKind {
    /// Idle machines change owner (`TransferOwnership`).
    Idle,
    /// Speculative slots change shard (`ReassignSpeculative`).
    Speculative,
    /// The donor reclaims lower-priority machines (`CrossShardDrain`).
    Drain,
}

impl TransferKind {
    /// The metric/log label: the instruction the transfer starts with.
    pub fn label(self) -> &'static str {
        match self {
            TransferKind::Idle => "transfer_ownership",
            TransferKind::Speculative => "reassign_speculative",
            TransferKind::Drain => "cross_shard_drain",
        }
    }
}

/// Where a transfer stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Waiting for the donor to release.
    Release,
    /// Waiting for the recipient to adopt the released machines.
    Adopt,
    /// The recipient refused; waiting for the donor to take the machines back.
    Return,
    /// Finished: moved (or, for a drain, the drain started).
    Done,
    /// Finished without moving anything to the recipient.
    Failed,
}

impl Phase {
    pub fn is_active(self) -> bool {
        matches!(self, Phase::Release | Phase::Adopt | Phase::Return)
    }
    pub fn label(self) -> &'static str {
        match self {
            Phase::Release => "release",
            Phase::Adopt => "adopt",
            Phase::Return => "return",
            Phase::Done => "done",
            Phase::Failed => "failed",
        }
    }
}

/// One transfer, replicated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transfer {
    pub id: String,
    pub kind: TransferKind,
    pub donor: String,
    pub recipient: String,
    /// Empty: any instance type.
    pub instance_type: String,
    /// Machines asked for in the release phase.
    pub count: u32,
    /// Priority of the shortfall behind it (a drain's preemptor priority).
    pub priority: i32,
    pub phase: Phase,
    /// The instruction of the current phase (redelivered until acknowledged).
    pub instruction_id: String,
    /// What the donor released (known after the release ack).
    #[serde(default)]
    pub machine_ids: Vec<String>,
    pub started_at_unix_ns: i64,
    pub updated_at_unix_ns: i64,
    /// Why it failed, or the decision's explanation while it runs.
    #[serde(default)]
    pub reason: String,
    /// The release tokens, one per machine asked for: what each shortfall lacks and must
    /// match (ADR-0142). Empty in transfers started before them: `*/<type>` × `count`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub selectors: Vec<String>,
}

impl Transfer {
    /// A round's decision (a planned transfer, see `rebalance::Round`) carried out as
    /// transfer `id` with release instruction `instruction_id`, started at `now`.
    pub fn transfer(&self, id: String, instruction_id: String, now: i64) -> Transfer {
        Transfer {
            id,
            instruction_id,
            started_at_unix_ns: now,
            updated_at_unix_ns: now,
            ..self.clone()
        }
    }

    /// The shard the current phase's instruction goes to (`None` once finished).
    pub fn target(&self) -> Option<&str> {
        match self.phase {
            Phase::Release | Phase::Return => Some(&self.donor),
            Phase::Adopt => Some(&self.recipient),
            Phase::Done | Phase::Failed => None,
        }
    }

    /// Machines that ended up with the recipient.
    pub fn moved(&self) -> usize {
        if self.phase == Phase::Done && self.kind != TransferKind::Drain {
            self.machine_ids.len()
        } else {
            0
        }
    }

    /// The current phase's instruction payload (`None` once finished).
    pub fn payload(&self) -> Option<Payload> {
        let selectors = || {
            if !self.selectors.is_empty() {
                return self.selectors.clone();
            }
            vec![type_selector(&self.instance_type); self.count as usize]
        };
        let transfer = |ids: Vec<String>, from: &str, to: &str| {
            Payload::TransferOwnership(pb::TransferOwnership {
                machine_ids: ids,
                from_shard_id: from.to_owned(),
                to_shard_id: to.to_owned(),
            })
        };
        let speculative = |ids: Vec<String>| {
            Payload::ReassignSpeculative(pb::ReassignSpeculative { machine_ids: ids })
        };
        Some(match (self.phase, self.kind) {
            (Phase::Release, TransferKind::Idle) => {
                transfer(selectors(), &self.donor, &self.recipient)
            }
            (Phase::Release, TransferKind::Speculative) => speculative(selectors()),
            (Phase::Release, TransferKind::Drain) => {
                Payload::CrossShardDrain(pb::CrossShardDrain {
                    machine_ids: selectors(),
                    preemptor_priority: self.priority,
                })
            }
            (Phase::Adopt, TransferKind::Speculative)
            | (Phase::Return, TransferKind::Speculative) => speculative(self.machine_ids.clone()),
            (Phase::Adopt, _) => transfer(self.machine_ids.clone(), &self.donor, &self.recipient),
            (Phase::Return, _) => transfer(self.machine_ids.clone(), &self.recipient, &self.donor),
            (Phase::Done | Phase::Failed, _) => return None,
        })
    }
}

/// The release token of a shortfall known only by its instance type (empty: any type):
/// `*` or `*/<type>`, as transfers started before ADR-0142 ask.
pub fn type_selector(instance_type: &str) -> String {
    if instance_type.is_empty() {
        SELECTOR.to_owned()
    } else {
        format!("{SELECTOR}/{instance_type}")
    }
}

/// A shard's verdict as the FSM records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AckVerdict {
    Accepted,
    /// REJECTED_INVALID or FAILED: the shard will not do it.
    Refused,
}

/// Maps a wire outcome; `None` for outcomes that do not move a transfer (a stale term is
/// redelivered under the current term; unspecified is ignored).
pub fn verdict_of(outcome: i32) -> Option<AckVerdict> {
    use pb::instruct_ack::Outcome;
    match Outcome::try_from(outcome).ok()? {
        Outcome::Accepted => Some(AckVerdict::Accepted),
        Outcome::RejectedInvalid | Outcome::Failed => Some(AckVerdict::Refused),
        Outcome::RejectedStale | Outcome::Unspecified => None,
    }
}

/// The machine ids an ACCEPTED release ack lists (`"released: a,b"`); selector tokens and
/// blanks are dropped, duplicates kept once, order preserved.
pub fn released_ids(reason: &str) -> Vec<String> {
    let Some(list) = reason.trim().strip_prefix(RELEASED_PREFIX) else {
        return Vec::new();
    };
    let mut out: Vec<String> = Vec::new();
    for id in list.split(',').map(str::trim) {
        if !id.is_empty() && !id.starts_with(SELECTOR) && !out.iter().any(|o| o == id) {
            out.push(id.to_owned());
        }
    }
    out
}

/// A shard's acknowledgement of a transfer's current instruction, as [`advance`] applies it
/// (the fields of `Command::AckTransfer` but the transfer id).
#[derive(Debug, Clone, Copy)]
pub struct Ack<'a> {
    pub instruction_id: &'a str,
    pub verdict: AckVerdict,
    /// The machines the donor says it released.
    pub machine_ids: &'a [String],
    /// The next phase's instruction, chosen by the leader so replicas agree.
    pub next_instruction_id: &'a str,
    pub reason: &'a str,
    pub at_unix_ns: i64,
}

/// Advances `t` by an acknowledgement of its current instruction. Returns false (and
/// leaves `t` alone) when the ack does not answer the current phase.
pub fn advance(t: &mut Transfer, ack: &Ack<'_>) -> bool {
    let Ack {
        instruction_id,
        verdict,
        machine_ids,
        next_instruction_id,
        reason,
        at_unix_ns: now,
    } = *ack;
    if !t.phase.is_active() || t.instruction_id != instruction_id {
        return false;
    }
    let next = |t: &mut Transfer, phase: Phase| {
        t.phase = phase;
        t.instruction_id = next_instruction_id.to_owned();
    };
    match (t.phase, verdict) {
        (Phase::Release, AckVerdict::Accepted) => {
            if t.kind == TransferKind::Drain {
                t.phase = Phase::Done;
            } else if machine_ids.is_empty() {
                // Nothing matched at the donor: finished, nothing moved.
                t.phase = Phase::Done;
                t.reason = "donor released nothing".into();
            } else {
                // Never more than asked for.
                t.machine_ids = machine_ids.iter().take(t.count as usize).cloned().collect();
                next(t, Phase::Adopt);
            }
        }
        (Phase::Release, AckVerdict::Refused) => {
            t.phase = Phase::Failed;
            t.reason = format!("donor refused: {reason}");
        }
        (Phase::Adopt, AckVerdict::Accepted) => t.phase = Phase::Done,
        (Phase::Adopt, AckVerdict::Refused) => {
            t.reason = format!("recipient refused: {reason}");
            next(t, Phase::Return);
        }
        (Phase::Return, v) => {
            t.phase = Phase::Failed;
            if v == AckVerdict::Refused {
                t.reason = format!("{}; donor refused the return: {reason}", t.reason);
            }
        }
        (Phase::Done | Phase::Failed, _) => return false,
    }
    t.updated_at_unix_ns = now;
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn transfer(kind: TransferKind) -> Transfer {
        Transfer {
            id: "t1".into(),
            kind,
            donor: "s1".into(),
            recipient: "s2".into(),
            instance_type: "m5.large".into(),
            count: 2,
            priority: 500,
            phase: Phase::Release,
            instruction_id: "i1".into(),
            machine_ids: Vec::new(),
            started_at_unix_ns: 1,
            updated_at_unix_ns: 1,
            reason: String::new(),
            selectors: Vec::new(),
        }
    }

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    /// Acknowledges instruction `id` as accepted with the `machines` it names;
    /// `next` is the next phase's instruction.
    fn accept(t: &mut Transfer, id: &str, machines: &[&str], next: &str, now: i64) -> bool {
        advance(
            t,
            &Ack {
                instruction_id: id,
                verdict: AckVerdict::Accepted,
                machine_ids: &ids(machines),
                next_instruction_id: next,
                reason: "",
                at_unix_ns: now,
            },
        )
    }

    /// Acknowledges instruction `id` as refused for `reason`.
    fn refuse(t: &mut Transfer, id: &str, next: &str, reason: &str, now: i64) -> bool {
        advance(
            t,
            &Ack {
                instruction_id: id,
                verdict: AckVerdict::Refused,
                machine_ids: &[],
                next_instruction_id: next,
                reason,
                at_unix_ns: now,
            },
        )
    }

    /// The instruction moving `machines` from shard `from` to shard `to`.
    fn ownership(machines: &[&str], from: &str, to: &str) -> Option<Payload> {
        Some(Payload::TransferOwnership(pb::TransferOwnership {
            machine_ids: ids(machines),
            from_shard_id: from.into(),
            to_shard_id: to.into(),
        }))
    }

    #[test]
    fn release_then_adopt_names_the_released_machines() {
        let mut t = transfer(TransferKind::Idle);
        assert_eq!(t.target(), Some("s1"));
        assert_eq!(
            t.payload(),
            ownership(&["*/m5.large", "*/m5.large"], "s1", "s2")
        );
        // An ack of another instruction does nothing.
        assert!(!accept(&mut t, "other", &["m1"], "i2", 5));
        assert_eq!(t.phase, Phase::Release);
        // The donor releases three; only the two asked for are adopted.
        assert!(accept(&mut t, "i1", &["m1", "m2", "m3"], "i2", 5));
        assert_eq!(
            (t.phase, t.instruction_id.as_str(), t.target()),
            (Phase::Adopt, "i2", Some("s2"))
        );
        assert_eq!(t.payload(), ownership(&["m1", "m2"], "s1", "s2"));
        // A late duplicate of the release ack does not move it again.
        assert!(!accept(&mut t, "i1", &["m9"], "i3", 6));
        assert!(accept(&mut t, "i2", &[], "i3", 7));
        assert_eq!(
            (t.phase, t.moved(), t.target(), t.payload()),
            (Phase::Done, 2, None, None)
        );
        assert_eq!(t.updated_at_unix_ns, 7);
    }

    #[test]
    fn a_refused_adopt_returns_the_machines_to_the_donor() {
        let mut t = transfer(TransferKind::Idle);
        accept(&mut t, "i1", &["m1"], "i2", 2);
        assert!(refuse(&mut t, "i2", "i3", "unsupported", 3));
        assert_eq!((t.phase, t.target()), (Phase::Return, Some("s1")));
        assert_eq!(t.payload(), ownership(&["m1"], "s2", "s1"));
        assert!(accept(&mut t, "i3", &[], "i4", 4));
        assert_eq!((t.phase, t.moved()), (Phase::Failed, 0));
        assert!(t.reason.contains("unsupported"), "{}", t.reason);
    }

    #[test]
    fn refused_or_empty_releases_finish_without_an_adopt() {
        let mut t = transfer(TransferKind::Idle);
        assert!(refuse(&mut t, "i1", "i2", "not supported", 2));
        assert_eq!(t.phase, Phase::Failed);
        let mut t = transfer(TransferKind::Speculative);
        assert_eq!(
            t.payload(),
            Some(Payload::ReassignSpeculative(pb::ReassignSpeculative {
                machine_ids: ids(&["*/m5.large", "*/m5.large"]),
            }))
        );
        assert!(accept(&mut t, "i1", &[], "i2", 2));
        assert_eq!((t.phase, t.moved()), (Phase::Done, 0));
    }

    #[test]
    fn a_drain_is_one_phase_and_carries_the_priority() {
        let mut t = transfer(TransferKind::Drain);
        t.instance_type.clear();
        assert_eq!(
            t.payload(),
            Some(Payload::CrossShardDrain(pb::CrossShardDrain {
                machine_ids: ids(&["*", "*"]),
                preemptor_priority: 500,
            }))
        );
        assert!(accept(&mut t, "i1", &["m1"], "i2", 2));
        assert_eq!((t.phase, t.moved()), (Phase::Done, 0));
    }

    #[test]
    fn released_ids_parse_strictly() {
        assert_eq!(released_ids("released: m1, m2,,m1"), ids(&["m1", "m2"]));
        assert_eq!(released_ids("released:*/x,m3"), ids(&["m3"]));
        assert!(released_ids("duplicate-redelivery").is_empty());
        assert!(released_ids("").is_empty());
    }

    #[test]
    fn verdicts_map_wire_outcomes() {
        use pb::instruct_ack::Outcome;
        assert_eq!(
            verdict_of(Outcome::Accepted as i32),
            Some(AckVerdict::Accepted)
        );
        assert_eq!(
            verdict_of(Outcome::Failed as i32),
            Some(AckVerdict::Refused)
        );
        assert_eq!(
            verdict_of(Outcome::RejectedInvalid as i32),
            Some(AckVerdict::Refused)
        );
        assert_eq!(verdict_of(Outcome::RejectedStale as i32), None);
        assert_eq!(verdict_of(99), None);
    }
}
