//! Acquirable supply of a Same profile, aggregated per domain.
//!
//! For one (profile, MinUnit): the shard-wide Idle/Speculative groups that pass
//! the pinned-type filter, match, carry the Same key and fit MinUnit, summed per
//! domain value. Availability only changes through acquirable consumption
//! during the pre-pass, which appends the consumed machine's group to a log;
//! an index refreshes just the domains those groups belong to.
//!
//! Per deficit the index also keeps the best few acquirable-only candidates
//! (ranked by ChooseSameBucket with no bound supply), valid until the next
//! consumption touching the index, so a gang with a few cluster-local domains
//! does not rescore thousands of shard-wide domains.

use crate::qty::{self, Qty};
use rustc_hash::FxHashMap;

/// How many acquirable-only candidates a deficit entry keeps.
const TOP: usize = 8;

/// A scored Same domain (ChooseSameBucket's ranking facts).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scored {
    pub value: u32,
    pub sat: bool,
    /// Coverage score (uncapped when satisfiable, capped otherwise).
    pub s: f64,
    pub cred: f64,
    pub own: f64,
    pub count: u64,
    /// Capped coverage score (for the verdict's per-mille coverage).
    pub cov: f64,
}

impl Scored {
    pub(crate) fn of(
        value: u32,
        count: u64,
        total: &[i64],
        cred: &[i64],
        own: &[i64],
        deficit: &[i64],
    ) -> Scored {
        let sat = qty::covers(total, deficit);
        Scored {
            value,
            sat,
            s: qty::score(total, deficit, !sat),
            cred: qty::score(cred, deficit, true),
            own: qty::score(own, deficit, true),
            count,
            cov: qty::score(total, deficit, true),
        }
    }

    /// Acquirable-only: no bound supply, no own machines.
    fn acquirable(value: u32, count: u64, total: &[i64], deficit: &[i64]) -> Scored {
        let sat = qty::covers(total, deficit);
        Scored {
            value,
            sat,
            s: qty::score(total, deficit, !sat),
            cred: 0.0,
            own: 0.0,
            count,
            cov: qty::score(total, deficit, true),
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct AcqIndex {
    dims: usize,
    pub values: Vec<u32>,
    groups: Vec<Vec<u32>>,
    pub dom_of: FxHashMap<u32, u32>,
    group_dom: FxHashMap<u32, u32>,
    pub count: Vec<u64>,
    total: Vec<i64>,
    /// Consumption-log position applied.
    seen: usize,
    top: FxHashMap<Qty, (usize, Vec<Scored>)>,
}

impl AcqIndex {
    /// `groups` = (group, domain value, capacity, available count).
    pub(crate) fn build(
        dims: usize,
        groups: impl Iterator<Item = (u32, u32)>,
        log_len: usize,
    ) -> AcqIndex {
        let mut idx = AcqIndex {
            dims,
            seen: log_len,
            ..AcqIndex::default()
        };
        for (g, v) in groups {
            let d = *idx.dom_of.entry(v).or_insert_with(|| {
                idx.values.push(v);
                idx.groups.push(Vec::new());
                (idx.values.len() - 1) as u32
            });
            idx.groups[d as usize].push(g);
            idx.group_dom.insert(g, d);
        }
        idx.count = vec![0; idx.values.len()];
        idx.total = vec![0; idx.values.len() * dims];
        idx
    }

    pub(crate) fn total(&self, d: usize) -> &[i64] {
        &self.total[d * self.dims..(d + 1) * self.dims]
    }

    /// Recomputes one domain from its groups' current availability.
    pub(crate) fn recompute(&mut self, d: usize, avail: &[u32], cap: impl Fn(u32) -> Qty) {
        let dims = self.dims;
        let t = &mut self.total[d * dims..(d + 1) * dims];
        t.iter_mut().for_each(|x| *x = 0);
        let mut n = 0u64;
        for &g in &self.groups[d] {
            let a = avail[g as usize];
            if a > 0 {
                n += u64::from(a);
                qty::add_scaled(t, &cap(g), a);
            }
        }
        self.count[d] = n;
    }

    /// Applies consumption-log entries not yet seen.
    pub(crate) fn refresh(&mut self, log: &[u32], avail: &[u32], cap: impl Fn(u32) -> Qty) {
        if self.seen == log.len() {
            return;
        }
        let mut touched: Vec<u32> = log[self.seen..]
            .iter()
            .filter_map(|g| self.group_dom.get(g).copied())
            .collect();
        touched.sort_unstable();
        touched.dedup();
        for d in touched {
            self.recompute(d as usize, avail, &cap);
        }
        if log[self.seen..]
            .iter()
            .any(|g| self.group_dom.contains_key(g))
        {
            self.top.clear();
        }
        self.seen = log.len();
    }

    /// Every acquirable-only candidate (domain not excluded), unsorted.
    pub(crate) fn scan(&self, deficit: &[i64], excluded: impl Fn(u32) -> bool) -> Vec<Scored> {
        (0..self.values.len())
            .filter(|&d| self.count[d] > 0 && !excluded(self.values[d]))
            .map(|d| Scored::acquirable(self.values[d], self.count[d], self.total(d), deficit))
            .collect()
    }

    /// The best `k` acquirable-only candidates not excluded, best first.
    pub(crate) fn top_k(
        &mut self,
        deficit: &Qty,
        k: usize,
        excluded: impl Fn(u32) -> bool,
        better: impl Fn(&Scored, &Scored) -> bool,
    ) -> Vec<Scored> {
        self.ensure_top(deficit, &better);
        let (_, top) = &self.top[deficit];
        let picked: Vec<Scored> = top
            .iter()
            .filter(|c| !excluded(c.value))
            .take(k)
            .copied()
            .collect();
        if picked.len() == k || top.len() < TOP {
            return picked;
        }
        let mut all = self.scan(deficit, excluded);
        all.sort_by(|a, b| {
            if better(a, b) {
                std::cmp::Ordering::Less
            } else if better(b, a) {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        });
        all.truncate(k);
        all
    }

    fn ensure_top(&mut self, deficit: &Qty, better: &impl Fn(&Scored, &Scored) -> bool) {
        let seen = self.seen;
        let fresh = self.top.get(deficit).is_some_and(|(at, _)| *at == seen);
        if !fresh {
            let mut top: Vec<Scored> = Vec::with_capacity(TOP + 1);
            for c in self.scan(deficit, |_| false) {
                let pos = top.iter().position(|t| better(&c, t)).unwrap_or(top.len());
                if pos < TOP {
                    top.insert(pos, c);
                    top.truncate(TOP);
                }
            }
            self.top.insert(deficit.clone(), (seen, top));
        }
    }

    /// The best acquirable-only candidate not excluded, ranked by `better`.
    pub(crate) fn best(
        &mut self,
        deficit: &Qty,
        excluded: impl Fn(u32) -> bool,
        better: impl Fn(&Scored, &Scored) -> bool,
    ) -> Option<Scored> {
        self.ensure_top(deficit, &better);
        let (_, top) = &self.top[deficit];
        if let Some(c) = top.iter().find(|c| !excluded(c.value)) {
            return Some(*c);
        }
        if top.len() < TOP {
            // The list held every candidate and all were excluded.
            return None;
        }
        self.scan(deficit, excluded)
            .into_iter()
            .reduce(|b, c| if better(&c, &b) { c } else { b })
    }
}
