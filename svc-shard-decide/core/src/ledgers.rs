//! Cross-cycle state the engine does not keep: shortfalls, per-need verdicts,
//! AvailableCapacity de-duplication and provisioning-latency clocks.

use bigfleet_decision::{NeedVerdict, ShortfallSeed, VerdictSource};
use bigfleet_model::{Need, PenaltyBucket, Profile, ResourceVector};
use rustc_hash::FxHashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most shortfalls reported (the paper's per-shard bound).
pub const SHORTFALL_REPORT_LIMIT: usize = 100;

/// One unresolved demand, keyed by profile fingerprint.
#[derive(Debug, Clone, PartialEq)]
pub struct ShortfallEntry {
    pub profile: Arc<Profile>,
    pub deficit: ResourceVector,
    /// Consecutive cycles unresolved (1 on first sight): the wire's
    /// `Shortfall.age_cycles`, which stays a cycle count.
    pub age_cycles: u32,
    /// When the cycle that first saw it ran (UNIX nanos). Every threshold and
    /// "older" comparison uses this, not `age_cycles`: cycles also run on
    /// every accepted roll-up, so a cycle count is no measure of time.
    pub since_unix_nanos: i64,
    pub interruption_bucket: PenaltyBucket,
}

impl ShortfallEntry {
    /// How long it has been unresolved at `now`.
    pub fn age(&self, now_unix_nanos: i64) -> Duration {
        Duration::from_nanos(
            u64::try_from(now_unix_nanos.saturating_sub(self.since_unix_nanos)).unwrap_or(0),
        )
    }
}

/// The shortfall ledger: entries age while present and vanish when resolved.
#[derive(Debug, Default)]
pub struct ShortfallLedger {
    entries: FxHashMap<String, ShortfallEntry>,
}

/// Labels of the `shortfalls_aged{bucket}` gauge: seconds unresolved (the
/// original's cycles; the same at its 1 s cycle with no roll-up wake-ups).
pub const AGE_BUCKETS: [&str; 4] = ["1-9", "10-59", "60-299", "300+"];

/// Upper bounds (exclusive) of the first three [`AGE_BUCKETS`].
const AGE_BUCKET_BOUNDS: [Duration; 3] = [
    Duration::from_secs(10),
    Duration::from_secs(60),
    Duration::from_secs(300),
];

impl ShortfallLedger {
    /// Records the seeds of the cycle that ran at `now` (already summed per
    /// fingerprint by the engine).
    pub fn record(&mut self, seeds: &[ShortfallSeed], now_unix_nanos: i64) {
        let mut next = FxHashMap::with_capacity_and_hasher(seeds.len(), Default::default());
        for s in seeds {
            let fp = s.profile.fingerprint();
            let prev = self.entries.get(fp);
            next.insert(
                fp.to_owned(),
                ShortfallEntry {
                    profile: s.profile.clone(),
                    deficit: s.deficit.clone(),
                    age_cycles: prev.map_or(1, |e| e.age_cycles.saturating_add(1)),
                    since_unix_nanos: prev.map_or(now_unix_nanos, |e| e.since_unix_nanos),
                    interruption_bucket: s.profile.interruption_bucket(),
                },
            );
        }
        self.entries = next;
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The report: priority desc, then older first, then fingerprint; at
    /// most `limit`. (Every live entry is recorded every cycle, so more
    /// cycles and an earlier first sighting order the same.)
    pub fn top(&self, limit: usize) -> Vec<ShortfallEntry> {
        let mut all: Vec<&ShortfallEntry> = self.entries.values().collect();
        all.sort_by(|a, b| {
            b.profile
                .priority()
                .cmp(&a.profile.priority())
                .then(b.age_cycles.cmp(&a.age_cycles))
                .then_with(|| a.profile.fingerprint().cmp(b.profile.fingerprint()))
        });
        all.into_iter().take(limit).cloned().collect()
    }

    /// Entry counts per [`AGE_BUCKETS`] label, by time unresolved at `now`.
    pub fn aged(&self, now_unix_nanos: i64) -> [u64; 4] {
        let mut out = [0u64; 4];
        for e in self.entries.values() {
            let age = e.age(now_unix_nanos);
            let i = AGE_BUCKET_BOUNDS
                .iter()
                .position(|b| age < *b)
                .unwrap_or(AGE_BUCKET_BOUNDS.len());
            out[i] += 1;
        }
        out
    }
}

/// One row of the need-verdict ledger.
#[derive(Debug, Clone, PartialEq)]
pub struct VerdictRow {
    /// The demand snapshot the cycle ran on, shared by every row, so rows do
    /// not copy 50K needs.
    demand: Arc<Vec<Need>>,
    pub verdict: NeedVerdict,
    /// Consecutive cycles this need (this row, not its fingerprint) has been
    /// unmet, counting this one; 0 when satisfied (ADR-0117).
    pub age_cycles_unmet: u32,
    /// [`row_key`] and occurrence, so the next cycle finds this row's age without
    /// hashing the previous table again.
    key: (u64, u32),
}

impl VerdictRow {
    /// The need the verdict is about (a folded need for folded gangs).
    pub fn need(&self) -> &Need {
        match &self.verdict.source {
            VerdictSource::Demand(k) => &self.demand[*k],
            VerdictSource::Folded { need, .. } => need,
        }
    }
}

/// One cycle's verdicts, in NeedsTable snapshot order. Built whole, then
/// swapped in, so readers never see a half-built table.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VerdictTable {
    /// 0 before the first cycle.
    pub cycle: u64,
    pub computed_at_unix_nanos: i64,
    pub rows: Vec<VerdictRow>,
    /// When the provider List behind the cycle's inventory started (0 = never).
    pub inventory_listed_at_unix_nanos: i64,
    /// The cycle's List failed: it decided on the last-known inventory (ADR-0118).
    pub inventory_stale: bool,
}

/// Identity of one verdict row across cycles, for `age_cycles_unmet`: "the
/// need" of the wire field (ADR-0117). A NeedsTable row is (cluster,
/// fingerprint, group); a folded need is what NormalizeDemand folds by,
/// (cluster, stripped fingerprint, each member's aggregate = the folded
/// need's MinUnit), kept apart from table rows. Hashed (SipHash, 64 bits) so a
/// cycle over 50K rows allocates nothing for it; a collision could only carry
/// one row's age to another, an observation, never a decision.
fn row_key(row: &VerdictRow) -> u64 {
    // FxHasher, not SipHash: this runs for every demand row every cycle, and a key only
    // carries a row's unmet age to the next table inside this process (never persisted);
    // the worst a crafted collision can do is hand one of the sender's own rows another's
    // age, among rows the roll-up limits bound.
    use std::hash::{Hash, Hasher};
    let n = row.need();
    let mut h = rustc_hash::FxHasher::default();
    n.cluster.hash(&mut h);
    n.fingerprint().hash(&mut h);
    match &row.verdict.source {
        VerdictSource::Demand(_) => {
            0u8.hash(&mut h);
            n.group.hash(&mut h);
        }
        VerdictSource::Folded { .. } => {
            1u8.hash(&mut h);
            for (name, milli) in n.min_unit.iter() {
                name.hash(&mut h);
                milli.hash(&mut h);
            }
        }
    }
    h.finish()
}

/// Every row's key with its occurrence number among rows of the same key, in
/// row (snapshot) order: even a roll-up that repeats a (fingerprint, group)
/// gives every row its own age.
fn row_keys(rows: &[VerdictRow]) -> Vec<(u64, u32)> {
    let mut seen: FxHashMap<u64, u32> = FxHashMap::default();
    rows.iter()
        .map(|r| {
            let k = row_key(r);
            let n = seen.entry(k).or_insert(0);
            *n += 1;
            (k, *n - 1)
        })
        .collect()
}

impl VerdictTable {
    /// Builds the next table from the engine's verdicts over `demand` (the
    /// snapshot the cycle ran on), carrying unmet ages over from `prev`.
    pub fn build(
        prev: &VerdictTable,
        cycle: u64,
        now_unix_nanos: i64,
        demand: &Arc<Vec<Need>>,
        verdicts: Vec<NeedVerdict>,
    ) -> VerdictTable {
        let prev_age: FxHashMap<(u64, u32), u32> = prev
            .rows
            .iter()
            .filter(|r| r.age_cycles_unmet > 0)
            .map(|r| (r.key, r.age_cycles_unmet))
            .collect();
        let mut rows: Vec<VerdictRow> = verdicts
            .into_iter()
            .filter(|v| match &v.source {
                VerdictSource::Demand(k) => *k < demand.len(),
                VerdictSource::Folded { .. } => true,
            })
            .map(|v| VerdictRow {
                demand: Arc::clone(demand),
                verdict: v,
                age_cycles_unmet: 0,
                key: (0, 0),
            })
            .collect();
        rows.sort_by(|a, b| bigfleet_model::snapshot_order(a.need(), b.need()));
        for (key, row) in row_keys(&rows).into_iter().zip(rows.iter_mut()) {
            row.key = key;
            if !row.verdict.satisfied {
                row.age_cycles_unmet = prev_age.get(&key).copied().unwrap_or(0) + 1;
            }
        }
        VerdictTable {
            cycle,
            computed_at_unix_nanos: now_unix_nanos,
            rows,
            inventory_listed_at_unix_nanos: 0,
            inventory_stale: false,
        }
    }

    /// Rows of `cluster` ("" = all), and their count before `limit` (0 = no cap).
    pub fn select(&self, cluster: &str, limit: usize) -> (usize, Vec<&VerdictRow>) {
        let matching = self
            .rows
            .iter()
            .filter(|r| cluster.is_empty() || r.need().cluster == cluster);
        let total = matching.clone().count();
        let take = if limit == 0 { usize::MAX } else { limit };
        (total, matching.take(take).collect())
    }

    pub fn unmet(&self) -> usize {
        self.rows.iter().filter(|r| !r.verdict.satisfied).count()
    }
}

/// The (count, confidence, cost) of one hint.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HintValue {
    pub count: i32,
    /// Wire ordinal of `AvailableCapacityUpdate.Confidence`.
    pub confidence: i32,
    pub cost_per_hour: f64,
}

/// Whether `next` differs from the last emitted value by enough to be worth a frame:
/// any change of confidence or price, any count change when the count is small, and
/// otherwise at least `min_change` of the last emitted count. Small drifts add up
/// against the last *emitted* value, so they are sent once they matter.
fn worth_sending(min_change: f64, last: HintValue, next: HintValue) -> bool {
    if last.confidence != next.confidence || last.cost_per_hour != next.cost_per_hour {
        return true;
    }
    let step = (f64::from(last.count.max(0)) * min_change).floor().max(1.0);
    f64::from(last.count.abs_diff(next.count)) >= step
}

#[derive(Debug, Clone, Copy)]
struct HintState {
    last: HintValue,
    emitted_at: Instant,
}

/// AvailableCapacity de-duplication per (cluster, fingerprint): a hint goes
/// out only when its value changed and the key's last emit is at least
/// `interval` old.
#[derive(Debug)]
pub struct HintCache {
    interval: Duration,
    /// Smallest relative change of a count worth a frame (ADR-0127); 0 = any change.
    min_change: f64,
    clusters: FxHashMap<String, FxHashMap<String, HintState>>,
}

impl HintCache {
    pub fn new(interval: Duration) -> Self {
        HintCache::with_min_change(interval, 0.0)
    }

    /// A cache that also holds back count changes smaller than `min_change` of the last
    /// emitted count (ADR-0127).
    pub fn with_min_change(interval: Duration, min_change: f64) -> Self {
        HintCache {
            interval,
            min_change: if min_change.is_finite() {
                min_change.clamp(0.0, 1.0)
            } else {
                0.0
            },
            clusters: FxHashMap::default(),
        }
    }

    /// Whether to emit `value` for (cluster, fingerprint) now; records the emit.
    pub fn should_emit(&mut self, cluster: &str, fp: &str, value: HintValue, now: Instant) -> bool {
        let (interval, min_change) = (self.interval, self.min_change);
        let per = self.clusters.entry(cluster.to_owned()).or_default();
        match per.get_mut(fp) {
            Some(st) => {
                if !worth_sending(min_change, st.last, value)
                    || now.duration_since(st.emitted_at) < interval
                {
                    return false;
                }
                *st = HintState {
                    last: value,
                    emitted_at: now,
                };
                true
            }
            None => {
                per.insert(
                    fp.to_owned(),
                    HintState {
                        last: value,
                        emitted_at: now,
                    },
                );
                true
            }
        }
    }

    /// Drops keys of `cluster` whose fingerprint is no longer demanded.
    pub fn retain(&mut self, cluster: &str, keep: impl Fn(&str) -> bool) {
        if let Some(per) = self.clusters.get_mut(cluster) {
            per.retain(|fp, _| keep(fp));
        }
    }

    /// Forgets a cluster (its session ended), so a reconnecting operator gets
    /// fresh hints while other clusters keep their state.
    pub fn forget(&mut self, cluster: &str) {
        self.clusters.remove(cluster);
    }

    pub fn keys(&self) -> usize {
        self.clusters.values().map(FxHashMap::len).sum()
    }
}

/// First sighting of each (cluster, fingerprint) in accepted roll-ups, for the
/// provisioning-latency histogram. Observe-once: a Configured machine takes
/// the stamp out, and the next roll-up still demanding it puts a fresh one in.
#[derive(Debug, Default)]
pub struct ProvisioningClock {
    first_seen: FxHashMap<String, FxHashMap<String, i64>>,
}

impl ProvisioningClock {
    /// Stamps new fingerprints of `cluster` and prunes those no longer demanded.
    pub fn observe_demand<'a>(
        &mut self,
        cluster: &str,
        fingerprints: impl IntoIterator<Item = &'a str>,
        now_unix_nanos: i64,
    ) {
        let old = self.first_seen.remove(cluster).unwrap_or_default();
        let next: FxHashMap<String, i64> = fingerprints
            .into_iter()
            .map(|fp| {
                (
                    fp.to_owned(),
                    old.get(fp).copied().unwrap_or(now_unix_nanos),
                )
            })
            .collect();
        if !next.is_empty() {
            self.first_seen.insert(cluster.to_owned(), next);
        }
    }

    /// Time since the first sighting, once; `None` when not tracked.
    pub fn observe_configured(
        &mut self,
        cluster: &str,
        fp: &str,
        now_unix_nanos: i64,
    ) -> Option<Duration> {
        let since = self.first_seen.get_mut(cluster)?.remove(fp)?;
        Some(Duration::from_nanos(
            u64::try_from(now_unix_nanos.saturating_sub(since)).unwrap_or(0),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bigfleet_decision::UnmetReason;

    fn profile(prio: i32, tag: &str) -> Arc<Profile> {
        Arc::new(Profile::new(
            vec![bigfleet_model::Requirement::new(
                "t",
                bigfleet_model::Operator::In,
                [tag],
            )],
            vec![],
            prio,
            PenaltyBucket::B8,
            PenaltyBucket::Zero,
        ))
    }

    fn seed(prio: i32, tag: &str) -> ShortfallSeed {
        ShortfallSeed {
            profile: profile(prio, tag),
            deficit: ResourceVector::from_milli([("cpu", 1000)]),
        }
    }

    const SEC: i64 = 1_000_000_000;

    #[test]
    fn shortfalls_age_and_vanish() {
        let mut l = ShortfallLedger::default();
        l.record(&[seed(1, "a"), seed(5, "b")], 0);
        l.record(&[seed(1, "a")], SEC);
        l.record(&[seed(1, "a"), seed(9, "c")], 2 * SEC);
        let top = l.top(10);
        let got: Vec<_> = top
            .iter()
            .map(|e| (e.profile.priority(), e.age_cycles, e.since_unix_nanos))
            .collect();
        assert_eq!(got, [(9, 1, 2 * SEC), (1, 3, 0)]);
        assert_eq!(top[1].age(2 * SEC), Duration::from_secs(2));
        assert_eq!(top[0].interruption_bucket, PenaltyBucket::B8);
        assert_eq!(l.aged(2 * SEC), [2, 0, 0, 0]);
        assert_eq!(l.top(1).len(), 1);
        l.record(&[], 3 * SEC);
        assert!(l.is_empty());
    }

    #[test]
    fn shortfall_report_is_bounded_and_ordered() {
        let mut l = ShortfallLedger::default();
        let seeds: Vec<_> = (0..150).map(|i| seed(i, &format!("t{i}"))).collect();
        l.record(&seeds, 0);
        let top = l.top(SHORTFALL_REPORT_LIMIT);
        assert_eq!(top.len(), 100);
        assert_eq!(top[0].profile.priority(), 149);
        assert_eq!(top[99].profile.priority(), 50);
    }

    #[test]
    fn aged_buckets_are_seconds_whatever_the_cycle_count() {
        let mut l = ShortfallLedger::default();
        // A thousand cycles within 9 s (roll-ups waking cycles): still "1-9".
        for i in 0..1000 {
            l.record(&[seed(1, "a")], i * 9_000_000);
        }
        assert_eq!(l.top(1)[0].age_cycles, 1000);
        assert_eq!(l.aged(9 * SEC), [1, 0, 0, 0]);
        // Two cycles ten seconds apart: "10-59".
        assert_eq!(l.aged(10 * SEC), [0, 1, 0, 0]);
        assert_eq!(l.aged(59 * SEC), [0, 1, 0, 0]);
        assert_eq!(l.aged(60 * SEC), [0, 0, 1, 0]);
        assert_eq!(l.aged(299 * SEC), [0, 0, 1, 0]);
        assert_eq!(l.aged(300 * SEC), [0, 0, 0, 1]);
    }

    fn verdict(k: usize, satisfied: bool) -> NeedVerdict {
        NeedVerdict {
            source: VerdictSource::Demand(k),
            satisfied,
            residual_deficit: ResourceVector::new(),
            claimed_machine_count: 0,
            bootstrap_count: 0,
            provision_count: 0,
            same_domain: String::new(),
            same_satisfiable: false,
            acquisition_parked: false,
            parked_age_cycles: 0,
            unmet_reason: if satisfied {
                UnmetReason::Unspecified
            } else {
                UnmetReason::NoMatchingSupply
            },
            matching_supply: None,
            preemption: None,
            same_candidates: vec![],
        }
    }

    #[test]
    fn verdict_table_ages_unmet_and_selects() {
        let mut a = Need::new("a", profile(1, "x"));
        a.arrival_unix_nanos = 1;
        let mut b = Need::new("b", profile(1, "y"));
        b.arrival_unix_nanos = 2;
        let demand = Arc::new(vec![a, b]);
        let t1 = build_cycle(
            &VerdictTable::default(),
            1,
            &demand,
            vec![verdict(1, false), verdict(0, true)],
        );
        // Snapshot order, not verdict order.
        assert_eq!(t1.rows[0].need().cluster, "a");
        let t2 = build_cycle(&t1, 2, &demand, vec![verdict(0, true), verdict(1, false)]);
        assert_eq!(t2.rows[1].age_cycles_unmet, 2);
        assert_eq!(t2.rows[0].age_cycles_unmet, 0);
        assert_eq!(t2.unmet(), 1);
        let (total, rows) = t2.select("b", 0);
        assert_eq!((total, rows.len()), (1, 1));
        let (total, rows) = t2.select("", 1);
        assert_eq!((total, rows.len()), (2, 1));
    }

    /// Cycle `n`'s table, built at `10 * n` nanoseconds.
    fn build_cycle(
        prev: &VerdictTable,
        n: u64,
        demand: &Arc<Vec<Need>>,
        verdicts: Vec<NeedVerdict>,
    ) -> VerdictTable {
        VerdictTable::build(prev, n, 10 * n as i64, demand, verdicts)
    }

    fn folded(cluster: &str, p: &Arc<Profile>, member_cpu: i64, count: i64) -> NeedVerdict {
        let mut n = Need::new(cluster, Arc::clone(p));
        n.aggregate_resources = ResourceVector::from_milli([("cpu", member_cpu * count * 1000)]);
        n.min_unit = ResourceVector::from_milli([("cpu", member_cpu * 1000)]);
        NeedVerdict {
            source: VerdictSource::Folded {
                need: n,
                members: vec![],
            },
            ..verdict(0, false)
        }
    }

    fn ages(t: &VerdictTable) -> Vec<(String, u32)> {
        let mut v: Vec<_> = t
            .rows
            .iter()
            .map(|r| {
                let kind = match r.verdict.source {
                    VerdictSource::Demand(_) => "need",
                    VerdictSource::Folded { .. } => "folded",
                };
                (format!("{kind} {}", r.need().min_unit), r.age_cycles_unmet)
            })
            .collect();
        v.sort();
        v
    }

    #[test]
    fn unmet_age_is_per_row_not_per_fingerprint() {
        // Cluster "a" demands a plain need and two folded gang classes (1 and 2
        // cpu per gang), all with the same (stripped) fingerprint and group "".
        let p = profile(1, "x");
        let demand = Arc::new(vec![Need::new("a", Arc::clone(&p))]);
        let mut plain_met = verdict(0, true);
        plain_met.source = VerdictSource::Demand(0);
        let met = |v: NeedVerdict| NeedVerdict {
            satisfied: true,
            unmet_reason: UnmetReason::Unspecified,
            ..v
        };
        // Per cycle: the verdicts, then the ages of the 1-cpu class, the 2-cpu class and
        // the plain need.
        let cycles = [
            // Only the 1-cpu class is unmet.
            (
                vec![
                    plain_met.clone(),
                    folded("a", &p, 1, 3),
                    met(folded("a", &p, 2, 2)),
                ],
                [1, 0, 0],
            ),
            // Both classes unmet, the plain need too; the 1-cpu class grew.
            (
                vec![
                    verdict(0, false),
                    folded("a", &p, 1, 5),
                    folded("a", &p, 2, 2),
                ],
                [2, 1, 1],
            ),
            // The 1-cpu class is met: back to 0; the others keep counting.
            (
                vec![
                    verdict(0, false),
                    met(folded("a", &p, 1, 5)),
                    folded("a", &p, 2, 2),
                ],
                [0, 2, 2],
            ),
        ];
        let mut table = VerdictTable::default();
        for (n, (verdicts, [one_cpu, two_cpu, plain])) in (1..).zip(cycles) {
            table = build_cycle(&table, n, &demand, verdicts);
            let want = [
                ("folded {cpu: 1}".to_owned(), one_cpu),
                ("folded {cpu: 2}".to_owned(), two_cpu),
                ("need {}".to_owned(), plain),
            ];
            assert_eq!(ages(&table), want, "cycle {n}");
        }
    }

    #[test]
    fn repeated_rows_age_apart() {
        // A roll-up that repeats one (fingerprint, group): two rows, two ages.
        let p = profile(1, "x");
        let demand = Arc::new(vec![Need::new("a", Arc::clone(&p)), Need::new("a", p)]);
        let t1 = build_cycle(
            &VerdictTable::default(),
            1,
            &demand,
            vec![verdict(0, false), verdict(1, true)],
        );
        let t2 = build_cycle(&t1, 2, &demand, vec![verdict(0, false), verdict(1, false)]);
        let got: Vec<u32> = t2.rows.iter().map(|r| r.age_cycles_unmet).collect();
        assert_eq!(got, [2, 1]);
    }

    #[test]
    fn hints_coalesce_and_rate_limit() {
        let mut c = HintCache::new(Duration::from_secs(5));
        let t0 = Instant::now();
        let v = |n| HintValue {
            count: n,
            confidence: 4,
            cost_per_hour: 1.0,
        };
        assert!(c.should_emit("a", "fp", v(1), t0));
        // Unchanged: never re-sent.
        assert!(!c.should_emit("a", "fp", v(1), t0 + Duration::from_secs(60)));
        // Changed but too soon after the last emit.
        let t1 = t0 + Duration::from_secs(1);
        assert!(!c.should_emit("a", "fp", v(2), t1));
        assert!(c.should_emit("a", "fp", v(2), t0 + Duration::from_secs(6)));
        // Other keys are independent.
        assert!(c.should_emit("b", "fp", v(2), t1));
        c.forget("a");
        assert!(c.should_emit("a", "fp", v(2), t1));
        c.retain("a", |_| false);
        assert_eq!(c.keys(), 1);
    }

    #[test]
    fn hints_hold_back_small_count_changes() {
        let mut c = HintCache::with_min_change(Duration::from_secs(5), 0.1);
        let t = |s| Instant::now() + Duration::from_secs(s);
        let v = |n, conf| HintValue {
            count: n,
            confidence: conf,
            cost_per_hour: 1.0,
        };
        assert!(c.should_emit("a", "fp", v(1000, 4), t(0)));
        // 5 % below the last emitted count: held back however long it has been.
        assert!(!c.should_emit("a", "fp", v(950, 4), t(10)));
        // The drift adds up against the last emitted value: 10 % is sent.
        assert!(c.should_emit("a", "fp", v(900, 4), t(20)));
        // A confidence change is always sent (once the interval allows).
        assert!(c.should_emit("a", "fp", v(899, 3), t(30)));
        // Small counts are exact: 3 → 2 is sent.
        assert!(c.should_emit("b", "fp", v(3, 4), t(0)));
        assert!(c.should_emit("b", "fp", v(2, 4), t(10)));
        // A price change is always sent.
        let mut priced = v(2, 4);
        priced.cost_per_hour = 2.0;
        assert!(c.should_emit("b", "fp", priced, t(20)));
        // With 0 every change counts (the original's behaviour).
        let mut exact = HintCache::new(Duration::from_secs(5));
        assert!(exact.should_emit("a", "fp", v(1000, 4), t(0)));
        assert!(exact.should_emit("a", "fp", v(999, 4), t(10)));
    }

    #[test]
    fn provisioning_clock_observes_once() {
        let mut p = ProvisioningClock::default();
        p.observe_demand("a", ["fp1", "fp2"], 100);
        p.observe_demand("a", ["fp1", "fp2"], 200);
        assert_eq!(
            p.observe_configured("a", "fp1", 1_100),
            Some(Duration::from_nanos(1_000))
        );
        assert_eq!(p.observe_configured("a", "fp1", 1_200), None);
        // Re-observed demand restarts the clock.
        p.observe_demand("a", ["fp1"], 2_000);
        assert_eq!(
            p.observe_configured("a", "fp1", 2_500),
            Some(Duration::from_nanos(500))
        );
        // fp2 was pruned when no longer demanded.
        assert_eq!(p.observe_configured("a", "fp2", 3_000), None);
    }
}
