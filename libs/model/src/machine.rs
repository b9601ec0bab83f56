//! The machine record, its invariants and the shard-metadata echo.

use crate::requirement::{CapacityType, INSTANCE_TYPE_KEY, ZONE_KEY};
use crate::resources::ResourceVector;
use crate::state::MachineState;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// BigFleet's own machine id: stable for the whole lifecycle, the join key everywhere.
pub type MachineId = String;
/// A cluster id; `""` means unbound.
pub type ClusterId = String;

/// The provider's reference to real hardware. Empty iff both strings are empty.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Host {
    /// Provider name, e.g. `aws-eu-west-1`.
    pub provider: String,
    /// Instance id or serial (wire field `ref`).
    pub reference: String,
}

impl Host {
    pub fn is_empty(&self) -> bool {
        self.provider.is_empty() && self.reference.is_empty()
    }
}

/// What the hardware is: the attributes requirements are matched against.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct MachineProfile {
    pub instance_type: String,
    pub zone: String,
    pub capacity_type: CapacityType,
    /// The declared shape (what the hardware IS).
    pub resources: ResourceVector,
    /// Provider-supplied labels, matched by requirements.
    pub labels: BTreeMap<String, String>,
}

impl MachineProfile {
    /// Attribute lookup used by matching: the instance-type and zone keys read
    /// the dedicated fields when those are non-empty, everything else (and
    /// those keys when the field is empty) reads the labels.
    pub fn attribute(&self, key: &str) -> Option<&str> {
        if key == INSTANCE_TYPE_KEY && !self.instance_type.is_empty() {
            return Some(&self.instance_type);
        }
        if key == ZONE_KEY && !self.zone.is_empty() {
            return Some(&self.zone);
        }
        self.labels.get(key).map(String::as_str)
    }
}

/// One machine record; the same shape in every state.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Machine {
    pub id: MachineId,
    pub state: MachineState,
    pub host: Host,
    /// Current assignment, `""` when unbound.
    pub cluster: ClusterId,
    pub profile: MachineProfile,
    /// USD per hour, provider-declared; 0 for bare metal.
    pub price_per_hour: f64,
    /// Provider-declared hourly interruption probability in `[0, 1]`.
    pub interruption_probability: f64,
    /// Non-empty when Failed.
    pub last_error: String,
    /// Priority of the need this machine serves (Phase 2 gap input).
    pub assigned_priority: i32,
    /// Upper bound of the serving need's interruption bucket, in dollars.
    pub assigned_interruption_penalty_dollars: f64,
    /// Upper bound of the serving need's reclamation bucket, in dollars.
    pub assigned_reclamation_penalty_dollars: f64,
    /// Fingerprint of the profile of the need it was acquired for.
    pub assigned_need_fingerprint: String,
    /// Co-location group of that need (`""` for non-gang needs).
    pub assigned_group: String,
    /// Real per-machine capacity; empty means "same as `profile.resources`".
    pub allocatable: ResourceVector,
    /// Provider store-and-echo map (decoded at ingest, see [`Machine::apply_shard_metadata`]).
    pub shard_metadata: BTreeMap<String, String>,
}

/// Which structural rule of the state grid a record breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum StructuralViolation {
    #[error("empty machine id")]
    EmptyId,
    #[error("state is unspecified")]
    UnspecifiedState,
    #[error("{0} machine must not have a host")]
    HostForbidden(MachineState),
    #[error("{0} machine must have a host")]
    HostRequired(MachineState),
    #[error("{0} machine must not have a cluster")]
    ClusterForbidden(MachineState),
    #[error("{0} machine must have a cluster")]
    ClusterRequired(MachineState),
    #[error("failed machine must have a last_error")]
    MissingLastError,
}

/// A machine record that must not enter the inventory. [`InvariantError::reason`]
/// is the `machines_rejected_total{reason}` label.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InvariantError {
    #[error("machine {id:?}: price_per_hour {value} must be finite and >= 0")]
    Price { id: MachineId, value: f64 },
    #[error("machine {id:?}: interruption_probability {value} must be within [0, 1]")]
    InterruptionProbability { id: MachineId, value: f64 },
    #[error("machine {id:?}: {violation}")]
    Structural {
        id: MachineId,
        violation: StructuralViolation,
    },
}

impl InvariantError {
    /// Metric label: `price`, `interruption_probability` or `structural`.
    pub fn reason(&self) -> &'static str {
        match self {
            InvariantError::Price { .. } => "price",
            InvariantError::InterruptionProbability { .. } => "interruption_probability",
            InvariantError::Structural { .. } => "structural",
        }
    }
}

impl Machine {
    /// The capacity all supply math uses: `allocatable`, or the declared
    /// resources when the provider did not report allocatable.
    pub fn effective_allocatable(&self) -> &ResourceVector {
        if self.allocatable.is_empty() {
            &self.profile.resources
        } else {
            &self.allocatable
        }
    }

    /// Checks the record. Order of checks, so the reported reason is deterministic: id and
    /// state, then price, then probability, then the host/cluster grid (Speculative and
    /// Creating have neither; Idle, Configuring and Deleting need a host; Configured and
    /// Draining need a host and a cluster; Failed needs its `last_error`). Assigned* fields are not checked, so a Creating
    /// machine may carry its planned group and fingerprint (ADR-0052).
    /// Infinite prices are rejected too: no provider can mean them.
    pub fn invariant(&self) -> Result<(), InvariantError> {
        use MachineState::*;
        let structural = |violation| {
            Err(InvariantError::Structural {
                id: self.id.clone(),
                violation,
            })
        };
        if self.id.is_empty() {
            return structural(StructuralViolation::EmptyId);
        }
        if self.state == Unspecified {
            return structural(StructuralViolation::UnspecifiedState);
        }
        if !(self.price_per_hour.is_finite() && self.price_per_hour >= 0.0) {
            return Err(InvariantError::Price {
                id: self.id.clone(),
                value: self.price_per_hour,
            });
        }
        if !(0.0..=1.0).contains(&self.interruption_probability) {
            return Err(InvariantError::InterruptionProbability {
                id: self.id.clone(),
                value: self.interruption_probability,
            });
        }
        let has_host = !self.host.is_empty();
        let has_cluster = !self.cluster.is_empty();
        let s = self.state;
        match s {
            Speculative | Creating => {
                if has_host {
                    return structural(StructuralViolation::HostForbidden(s));
                }
                if has_cluster {
                    return structural(StructuralViolation::ClusterForbidden(s));
                }
            }
            Idle | Configuring | Deleting => {
                if !has_host {
                    return structural(StructuralViolation::HostRequired(s));
                }
            }
            Configured | Draining => {
                if !has_host {
                    return structural(StructuralViolation::HostRequired(s));
                }
                if !has_cluster {
                    return structural(StructuralViolation::ClusterRequired(s));
                }
            }
            Failed => {
                if self.last_error.is_empty() {
                    return structural(StructuralViolation::MissingLastError);
                }
            }
            Unspecified => unreachable!("rejected above"),
        }
        Ok(())
    }
}

/// `shard_metadata` key prefix.
pub const SHARD_METADATA_PREFIX: &str = "bigfleet.lucy.sh/";
/// Decimal `i32`.
pub const META_ASSIGNED_PRIORITY: &str = "bigfleet.lucy.sh/assigned-priority";
/// Float dollars, shortest representation (`+Inf` for Pinned).
pub const META_ASSIGNED_INTERRUPTION_PENALTY: &str =
    "bigfleet.lucy.sh/assigned-interruption-penalty-dollars";
/// Float dollars, shortest representation (`+Inf` for Pinned).
pub const META_ASSIGNED_RECLAMATION_PENALTY: &str =
    "bigfleet.lucy.sh/assigned-reclamation-penalty-dollars";
/// Profile fingerprint string.
pub const META_ASSIGNED_NEED_FINGERPRINT: &str = "bigfleet.lucy.sh/assigned-need-fingerprint";
/// Co-location group string.
pub const META_ASSIGNED_GROUP: &str = "bigfleet.lucy.sh/assigned-group";

/// One `shard_metadata` entry that could not be applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataFieldError {
    pub key: String,
    pub value: String,
    pub expected: &'static str,
}

impl fmt::Display for MetadataFieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}={:?}: expected {}",
            self.key, self.value, self.expected
        )
    }
}

/// Every malformed entry of one decode, sorted by key, joined for logging.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed shard_metadata: {}", join_errors(.errors))]
pub struct ShardMetadataError {
    pub errors: Vec<MetadataFieldError>,
}

fn join_errors(errors: &[MetadataFieldError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Shortest decimal that parses back to the same f64; `+Inf` like Go's
/// `strconv.FormatFloat(f, 'g', -1, 64)` so either side can read the other.
fn format_dollars(v: f64) -> String {
    if v == f64::INFINITY {
        "+Inf".to_owned()
    } else {
        v.to_string()
    }
}

/// Non-negative, non-NaN dollars (Go and Rust spellings of infinity accepted).
fn parse_dollars(s: &str) -> Option<f64> {
    let v = match s {
        "+Inf" | "Inf" => f64::INFINITY,
        _ => s.parse::<f64>().ok()?,
    };
    (v >= 0.0).then_some(v)
}

impl Machine {
    /// The five `bigfleet.lucy.sh/` keys describing this machine's assignment,
    /// as sent in `ConfigureRequest.shard_metadata`.
    pub fn encode_shard_metadata(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (
                META_ASSIGNED_PRIORITY.to_owned(),
                self.assigned_priority.to_string(),
            ),
            (
                META_ASSIGNED_INTERRUPTION_PENALTY.to_owned(),
                format_dollars(self.assigned_interruption_penalty_dollars),
            ),
            (
                META_ASSIGNED_RECLAMATION_PENALTY.to_owned(),
                format_dollars(self.assigned_reclamation_penalty_dollars),
            ),
            (
                META_ASSIGNED_NEED_FINGERPRINT.to_owned(),
                self.assigned_need_fingerprint.clone(),
            ),
            (META_ASSIGNED_GROUP.to_owned(), self.assigned_group.clone()),
        ])
    }

    /// Restores Assigned* fields from an echoed metadata map. An absent key
    /// leaves its field untouched, unknown keys are ignored, and a malformed
    /// value is skipped while the others still apply; the skipped ones come
    /// back joined in the error.
    pub fn apply_shard_metadata<K, V>(
        &mut self,
        metadata: impl IntoIterator<Item = (K, V)>,
    ) -> Result<(), ShardMetadataError>
    where
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut errors = Vec::new();
        for (k, v) in metadata {
            let (key, value) = (k.as_ref(), v.as_ref());
            let bad = |expected| MetadataFieldError {
                key: key.to_owned(),
                value: value.to_owned(),
                expected,
            };
            match key {
                META_ASSIGNED_PRIORITY => match value.parse::<i32>() {
                    Ok(p) => self.assigned_priority = p,
                    Err(_) => errors.push(bad("a 32-bit decimal integer")),
                },
                META_ASSIGNED_INTERRUPTION_PENALTY => match parse_dollars(value) {
                    Some(d) => self.assigned_interruption_penalty_dollars = d,
                    None => errors.push(bad("non-negative dollars")),
                },
                META_ASSIGNED_RECLAMATION_PENALTY => match parse_dollars(value) {
                    Some(d) => self.assigned_reclamation_penalty_dollars = d,
                    None => errors.push(bad("non-negative dollars")),
                },
                META_ASSIGNED_NEED_FINGERPRINT => {
                    value.clone_into(&mut self.assigned_need_fingerprint)
                }
                META_ASSIGNED_GROUP => value.clone_into(&mut self.assigned_group),
                _ => {}
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            errors.sort_by(|a, b| a.key.cmp(&b.key));
            Err(ShardMetadataError { errors })
        }
    }

    /// Clears the assignment (Draining → Idle completion).
    pub fn clear_assignment(&mut self) {
        self.cluster.clear();
        self.assigned_priority = 0;
        self.assigned_interruption_penalty_dollars = 0.0;
        self.assigned_reclamation_penalty_dollars = 0.0;
        self.assigned_need_fingerprint.clear();
        self.assigned_group.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bucket::PenaltyBucket;
    use MachineState::*;

    fn host() -> Host {
        Host {
            provider: "fake".into(),
            reference: "i-1".into(),
        }
    }

    /// A valid record in each state.
    fn valid(state: MachineState) -> Machine {
        let mut m = Machine {
            id: "m-1".into(),
            state,
            price_per_hour: 1.0,
            interruption_probability: 0.1,
            ..Machine::default()
        };
        match state {
            Speculative | Creating | Unspecified => {}
            Idle | Configuring | Deleting => m.host = host(),
            Configured | Draining => {
                m.host = host();
                m.cluster = "c1".into();
            }
            Failed => m.last_error = "boom".into(),
        }
        m
    }

    fn reason(m: &Machine) -> Option<&'static str> {
        m.invariant().err().map(|e| e.reason())
    }

    #[test]
    fn every_state_has_a_valid_shape() {
        for s in MachineState::ALL.into_iter().skip(1) {
            assert_eq!(valid(s).invariant(), Ok(()), "{s}");
        }
    }

    #[test]
    fn reference_grid() {
        let mut spec_with_host = valid(Speculative);
        spec_with_host.host = host();
        let mut idle_no_host = valid(Idle);
        idle_no_host.host = Host::default();
        let mut configured_no_cluster = valid(Configured);
        configured_no_cluster.cluster.clear();
        let mut failed_no_error = valid(Failed);
        failed_no_error.last_error.clear();
        let mut prob = valid(Idle);
        prob.interruption_probability = 1.5;
        let cases = [
            (
                spec_with_host,
                StructuralViolation::HostForbidden(Speculative),
            ),
            (idle_no_host, StructuralViolation::HostRequired(Idle)),
            (
                configured_no_cluster,
                StructuralViolation::ClusterRequired(Configured),
            ),
            (failed_no_error, StructuralViolation::MissingLastError),
        ];
        for (m, violation) in cases {
            assert_eq!(
                m.invariant(),
                Err(InvariantError::Structural {
                    id: "m-1".into(),
                    violation
                })
            );
        }
        assert_eq!(reason(&prob), Some("interruption_probability"));
    }

    #[test]
    fn more_grid_cells() {
        let mut m = valid(Creating);
        m.cluster = "c1".into();
        assert_eq!(reason(&m), Some("structural"));
        let mut m = valid(Draining);
        m.cluster.clear();
        assert_eq!(reason(&m), Some("structural"));
        let mut m = valid(Deleting);
        m.host = Host::default();
        assert_eq!(reason(&m), Some("structural"));
        // Idle may keep a cluster; Configuring may carry its destination.
        let mut m = valid(Idle);
        m.cluster = "c1".into();
        assert_eq!(m.invariant(), Ok(()));
        let mut m = valid(Configuring);
        m.cluster = "c1".into();
        assert_eq!(m.invariant(), Ok(()));
        // A host with only one of its two strings set counts as set.
        let mut m = valid(Speculative);
        m.host.reference = "i-9".into();
        assert_eq!(reason(&m), Some("structural"));
        assert_eq!(reason(&valid(Unspecified)), Some("structural"));
        let mut m = valid(Idle);
        m.id.clear();
        assert_eq!(reason(&m), Some("structural"));
    }

    #[test]
    fn creating_may_carry_its_planned_assignment() {
        let mut m = valid(Creating);
        m.assigned_group = "gang-1".into();
        m.assigned_need_fingerprint = "p=1|ipb=1|rpb=1|reqs=|spr=".into();
        assert_eq!(m.invariant(), Ok(()));
    }

    #[test]
    fn bad_cost_inputs() {
        for (price, prob, want) in [
            (f64::NAN, 0.0, "price"),
            (-0.01, 0.0, "price"),
            (f64::INFINITY, 0.0, "price"),
            (1.0, f64::NAN, "interruption_probability"),
            (1.0, -0.1, "interruption_probability"),
            (1.0, 1.0000001, "interruption_probability"),
        ] {
            let mut m = valid(Idle);
            m.price_per_hour = price;
            m.interruption_probability = prob;
            assert_eq!(reason(&m), Some(want), "{price} {prob}");
            assert!(m.invariant().unwrap_err().to_string().contains("m-1"));
        }
        let mut m = valid(Idle);
        m.price_per_hour = 0.0;
        m.interruption_probability = 1.0;
        assert_eq!(m.invariant(), Ok(()));
    }

    #[test]
    fn effective_allocatable_falls_back_to_resources() {
        let mut m = valid(Idle);
        m.profile.resources = ResourceVector::from_milli([("cpu", 96_000)]);
        assert_eq!(m.effective_allocatable().get("cpu"), 96_000);
        m.allocatable = ResourceVector::from_milli([("cpu", 90_000)]);
        assert_eq!(m.effective_allocatable().get("cpu"), 90_000);
    }

    fn assigned() -> Machine {
        let mut m = valid(Configured);
        m.assigned_priority = -42;
        m.assigned_interruption_penalty_dollars = PenaltyBucket::Pinned.upper_bound_dollars();
        m.assigned_reclamation_penalty_dollars = 0.5;
        m.assigned_need_fingerprint = "p=-42|ipb=27|rpb=2|reqs=rack:5:;|spr=".into();
        m.assigned_group = "gang".into();
        m
    }

    #[test]
    fn shard_metadata_round_trip() {
        let m = assigned();
        let meta = m.encode_shard_metadata();
        assert_eq!(meta.len(), 5);
        assert!(meta.keys().all(|k| k.starts_with(SHARD_METADATA_PREFIX)));
        assert_eq!(meta[META_ASSIGNED_INTERRUPTION_PENALTY], "+Inf");
        let mut restored = valid(Configured);
        assert_eq!(restored.apply_shard_metadata(&meta), Ok(()));
        assert_eq!(restored, Machine { ..m });
    }

    #[test]
    fn shard_metadata_absent_keys_and_nil_map_leave_fields_untouched() {
        let mut m = assigned();
        let before = m.clone();
        assert_eq!(
            m.apply_shard_metadata(BTreeMap::<String, String>::new()),
            Ok(())
        );
        assert_eq!(m, before);
        assert_eq!(
            m.apply_shard_metadata([(META_ASSIGNED_GROUP, "other"), ("x/unknown", "?")]),
            Ok(())
        );
        assert_eq!(m.assigned_group, "other");
        assert_eq!(m.assigned_priority, -42);
        assert_eq!(
            m.assigned_need_fingerprint,
            before.assigned_need_fingerprint
        );
    }

    #[test]
    fn shard_metadata_malformed_values_are_skipped_and_joined() {
        let mut m = valid(Configured);
        let err = m
            .apply_shard_metadata([
                (META_ASSIGNED_PRIORITY, "high"),
                (META_ASSIGNED_RECLAMATION_PENALTY, "-1"),
                (META_ASSIGNED_INTERRUPTION_PENALTY, "8.388608e+06"),
                (META_ASSIGNED_GROUP, "g"),
            ])
            .unwrap_err();
        assert_eq!(m.assigned_interruption_penalty_dollars, 8_388_608.0);
        assert_eq!(m.assigned_group, "g");
        assert_eq!(m.assigned_priority, 0);
        assert_eq!(m.assigned_reclamation_penalty_dollars, 0.0);
        let keys: Vec<_> = err.errors.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(
            keys,
            [META_ASSIGNED_PRIORITY, META_ASSIGNED_RECLAMATION_PENALTY]
        );
        let text = err.to_string();
        assert!(text.contains("\"high\"") && text.contains("\"-1\"") && text.contains("; "));
        let mut m = valid(Configured);
        assert!(
            m.apply_shard_metadata([(META_ASSIGNED_PRIORITY, "99999999999")])
                .is_err()
        );
        assert!(
            m.apply_shard_metadata([(META_ASSIGNED_INTERRUPTION_PENALTY, "NaN")])
                .is_err()
        );
        assert_eq!(
            m.apply_shard_metadata([(META_ASSIGNED_RECLAMATION_PENALTY, "inf")]),
            Ok(())
        );
        assert_eq!(m.assigned_reclamation_penalty_dollars, f64::INFINITY);
    }

    #[test]
    fn clear_assignment_unbinds() {
        let mut m = assigned();
        m.clear_assignment();
        assert!(m.cluster.is_empty() && m.assigned_group.is_empty());
        assert_eq!(m.assigned_priority, 0);
        assert_eq!(m.assigned_interruption_penalty_dollars, 0.0);
    }

    proptest::proptest! {
        #[test]
        fn shard_metadata_round_trips_any_assignment(
            prio in proptest::prelude::any::<i32>(),
            ip in 0.0f64..1e12,
            rp in 0.0f64..1e12,
            fp in ".{0,30}",
            group in ".{0,10}",
        ) {
            let mut m = valid(Configured);
            m.assigned_priority = prio;
            m.assigned_interruption_penalty_dollars = ip;
            m.assigned_reclamation_penalty_dollars = rp;
            m.assigned_need_fingerprint = fp;
            m.assigned_group = group;
            let mut back = valid(Configured);
            proptest::prop_assert_eq!(back.apply_shard_metadata(&m.encode_shard_metadata()), Ok(()));
            proptest::prop_assert_eq!(back, m);
        }
    }
}
