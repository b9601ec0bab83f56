//! The seam between the cycle and the coordinator client: [`CoordView`]
//! implements `bigfleet_coordclient::ShardView` over decide's plain-data
//! accessors, converting to the coordinator's wire types here so neither side
//! knows the other.

use bigfleet_conv::{requirements_to_proto, resources_message};
use bigfleet_coordclient::{Applied, ShardView};
use bigfleet_decision::Ownership;
use bigfleet_proto::v1alpha1 as pb;
use futures::future::BoxFuture;
use std::io::Write;
use std::path::{Path, PathBuf};
use svc_shard_decide_core::{Decide, TransferVerdict};

/// Decide as the coordinator client sees it.
#[derive(Debug, Clone)]
pub struct CoordView {
    decide: Decide,
    /// Where the owned set is saved before an instruction changing it is acked.
    state: Option<PathBuf>,
}

/// Name of the owned-set file in `--data-dir`.
pub const OWNERSHIP_FILE_NAME: &str = "ownership";

impl CoordView {
    pub fn new(decide: Decide) -> Self {
        CoordView {
            decide,
            state: None,
        }
    }

    /// Saves the owned set to `path` before acking any change to it
    /// (ADR-0129): an acked assignment, release or adoption survives a restart.
    #[must_use]
    pub fn with_state_file(mut self, path: PathBuf) -> Self {
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
        save_ownership(path, &o)
    }
}

/// Reads a saved owned set; `None` when there is no file yet.
pub fn load_ownership(path: &Path) -> Result<Option<Ownership>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("reading {}: {e}", path.display())),
    };
    let mut o = Ownership::everything();
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
            _ => return Err(format!("{}:{}: unreadable line", path.display(), n + 1)),
        }
    }
    Ok(Some(o))
}

/// Writes the owned set durably (temp file, fsync, rename): one line per
/// domain, adopted or released machine, tab-separated.
pub fn save_ownership(path: &Path, o: &Ownership) -> Result<(), String> {
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
    fn transfer_ownership(&self, t: &pb::TransferOwnership) -> Applied {
        let me = self.decide.config().shard_id.as_str();
        let verdict = if t.from_shard_id == t.to_shard_id {
            return Applied::Invalid("transfer to the donor itself".to_owned());
        } else if t.from_shard_id == me {
            self.release_saved(self.decide.release_machines(&t.machine_ids))
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
    fn reassign_speculative(&self, r: &pb::ReassignSpeculative) -> Applied {
        let me = self.decide.config().shard_id.as_str();
        let selectors = r.machine_ids.iter().filter(|t| t.starts_with('*')).count();
        let verdict = if r.machine_ids.is_empty() {
            return Applied::Invalid("no machine ids".to_owned());
        } else if selectors == r.machine_ids.len() {
            self.release_saved(self.decide.release_speculative(&r.machine_ids))
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
}

impl CoordView {
    /// A donor's release, saved before it is acked: released in memory (owning less
    /// is safe) but not acked as done when the owned-set file cannot be written.
    fn release_saved(&self, verdict: TransferVerdict) -> TransferVerdict {
        match verdict {
            v @ (TransferVerdict::Done | TransferVerdict::Released(_)) => {
                match self.save_with(|_| {}) {
                    Ok(()) => v,
                    Err(e) => TransferVerdict::Refused(e),
                }
            }
            other => other,
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
    use bigfleet_telemetry::Readiness;
    use std::sync::Arc;
    use svc_shard_decide_core::reconcile::RawMachineList;
    use svc_shard_decide_core::{DecideConfig, MachineSource, Publisher, ShardMetrics};

    /// Never listed: these tests run no cycle.
    struct NoProvider;

    impl MachineSource for NoProvider {
        fn list(&self, _: Vec<u8>) -> BoxFuture<'_, Result<RawMachineList, tonic::Status>> {
            Box::pin(async { Err(tonic::Status::unavailable("no provider in this test")) })
        }
    }

    fn view(shard: &str) -> CoordView {
        let (publisher, _events) = Publisher::channel(16);
        let decide = Decide::new(
            DecideConfig {
                shard_id: shard.to_owned(),
                ..DecideConfig::default()
            },
            Arc::new(NoProvider),
            publisher,
            ShardMetrics::unregistered(),
            Readiness::not_ready("test"),
        )
        .unwrap();
        CoordView::new(decide)
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
        assert_eq!(v.transfer_ownership(&transfer("s0", "s1")), Applied::Done);
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
        assert_eq!(v.transfer_ownership(&transfer("s0", "s1")), Applied::Done);
        assert!(v.decide.ownership().adopted.contains("m1"));
        // Donor: releases only what it knows to be Idle; m1 is not in its inventory.
        let Applied::Failed(why) = v.transfer_ownership(&transfer("s1", "s2")) else {
            panic!("an unknown machine cannot be released");
        };
        assert!(why.contains("m1"), "{why}");
        assert!(v.decide.ownership().released.is_empty());
        // A selector release names what it chose (nothing, with no inventory).
        let mut pick = transfer("s1", "s2");
        pick.machine_ids = vec!["*/gpu".into(); 2];
        assert_eq!(
            v.transfer_ownership(&pick),
            Applied::DoneWith("released: ".into())
        );
        // Neither side, or both sides: not this shard's to apply.
        assert!(matches!(
            v.transfer_ownership(&transfer("s7", "s8")),
            Applied::Invalid(_)
        ));
        assert!(matches!(
            v.transfer_ownership(&transfer("s1", "s1")),
            Applied::Invalid(_)
        ));
    }
}
