//! The fleet as svc-inspect sees it: shards discovered through the coordinator, each asked
//! concurrently (with a per-shard timeout) for its description and its need verdicts, merged
//! with the coordinator's reports and domain table, and cached for `cache_ttl`.
//!
//! Nothing here fails because one party is down: an unreachable shard is reported with its
//! error next to the others' data, and an unreachable coordinator falls back to the shards
//! known from its last answer.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bigfleet_mesh::{ChannelConfig, ClientStackConfig, MeshChannel, RetryPolicy};
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::mesh::v1::shard_info_client::ShardInfoClient;
use bigfleet_proto::v1alpha1 as pb;
use bigfleet_proto::v1alpha1::shard_read_client::ShardReadClient;
use futures::StreamExt;
use parking_lot::Mutex;
use prometheus::{IntCounterVec, IntGauge};
use tonic::{Code, Status};

use crate::cache::TtlCache;
use crate::coordinator::{CoordinatorClient, CoordinatorError, code_name};
use crate::error::InspectError;
use crate::merge::{ShardRow, merge};
use crate::view::{ClusterView, DomainView, ShardFetchView, ShardView};

/// Shards asked at once in one fan-out.
const FANOUT_CONCURRENCY: usize = 64;
/// Recent actions returned when the request names no limit.
const DEFAULT_ACTIONS: usize = 100;
/// Machines per page when the request names no limit, and the most per page.
const DEFAULT_MACHINES: usize = 500;
const MAX_MACHINES: usize = 5000;
/// Distinct (cluster, limit) answers kept in the cache.
const NEEDS_CACHE_KEYS: usize = 256;

/// Tuning of the fan-out.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// Bound on each shard call, connect included; a slower shard is reported unreachable.
    pub shard_timeout: Duration,
    /// How long an answer is reused.
    pub cache_ttl: Duration,
    /// mTLS client config for shard calls (`None`: plaintext).
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

/// Counters of the fan-out (registered by the service; absent in small tests).
#[derive(Debug, Clone)]
pub struct FleetMetrics {
    /// `bigfleet_inspect_shard_calls_total{rpc, outcome}`.
    pub shard_calls: IntCounterVec,
    /// `bigfleet_inspect_shards_unreachable`: in the latest overview.
    pub shards_unreachable: IntGauge,
}

impl FleetMetrics {
    pub fn register(
        reg: &bigfleet_telemetry::MetricsRegistry,
    ) -> Result<Self, bigfleet_telemetry::TelemetryError> {
        Ok(Self {
            shard_calls: reg.int_counter_vec(
                "bigfleet_inspect_shard_calls_total",
                "Calls svc-inspect made to shards, by RPC and outcome.",
                &["rpc", "outcome"],
            )?,
            shards_unreachable: reg.int_gauge(
                "bigfleet_inspect_shards_unreachable",
                "Registered shards that did not answer the latest overview.",
            )?,
        })
    }
}

/// The fleet overview (one coordinator round plus one Describe per shard).
#[derive(Debug, Clone)]
pub struct FleetOverview {
    pub computed_at_unix_nanos: i64,
    pub coordinator_reachable: bool,
    pub coordinator_error: String,
    /// Why ListShards failed, typed (callers that must not show a stale list, like the
    /// CLI, turn it into their error).
    pub coordinator_failure: Option<CoordinatorError>,
    /// Sorted by shard id.
    pub shards: Vec<ShardView>,
    /// From the shards' latest reports: oldest first, then priority (high first).
    pub shortfalls: Vec<mesh::FleetShortfall>,
    pub domains: Vec<DomainView>,
}

impl FleetOverview {
    pub fn machines_by_state(&self) -> BTreeMap<String, i64> {
        let mut total = BTreeMap::new();
        for s in self.shards.iter().filter(|s| s.reachable) {
            for (state, n) in &s.machines_by_state {
                *total.entry(state.clone()).or_insert(0) += i64::from(*n);
            }
        }
        total
    }

    pub fn sessions(&self) -> u64 {
        self.shards
            .iter()
            .filter(|s| s.reachable)
            .map(|s| u64::from(s.sessions))
            .sum()
    }

    pub fn summary(&self) -> crate::view::SummaryView {
        let reachable: Vec<_> = self.shards.iter().filter(|s| s.reachable).collect();
        crate::view::SummaryView {
            computed_at_unix_nanos: self.computed_at_unix_nanos,
            coordinator_reachable: self.coordinator_reachable,
            coordinator_error: self.coordinator_error.clone(),
            shards_total: self.shards.len(),
            shards_reachable: reachable.len(),
            machines_by_state: self.machines_by_state(),
            sessions: self.sessions(),
            needs: reachable.iter().map(|s| i64::from(s.needs)).sum(),
            unmet_needs: reachable
                .iter()
                .map(|s| i64::from(s.unmet_needs.max(0)))
                .sum(),
            shortfalls: self.shortfalls.len(),
            domains: self.domains.len(),
        }
    }

    /// The `Inspect.FleetSummary` answer with at most `max_shortfalls` shortfalls.
    pub fn to_proto(&self, max_shortfalls: usize) -> mesh::FleetSummaryResponse {
        mesh::FleetSummaryResponse {
            computed_at_unix_nanos: self.computed_at_unix_nanos,
            coordinator_reachable: self.coordinator_reachable,
            coordinator_error: self.coordinator_error.clone(),
            shards: self.shards.iter().map(ShardView::to_proto).collect(),
            shortfalls: self
                .shortfalls
                .iter()
                .take(max_shortfalls)
                .cloned()
                .collect(),
            machines_by_state: self.machines_by_state().into_iter().collect(),
            sessions: u32::try_from(self.sessions()).unwrap_or(u32::MAX),
        }
    }
}

/// Need verdicts gathered from every shard for one cluster filter.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetNeeds {
    pub cluster_id: String,
    pub computed_at_unix_nanos: i64,
    /// Why the shard list may be stale; empty when the coordinator answered.
    pub coordinator_error: String,
    /// How each shard answered, sorted by shard id.
    pub shards: Vec<ShardFetchView>,
    /// In fleet order (priority ↓, arrival ↑, cluster ↑), at most `limit` when one was given.
    pub rows: Vec<ShardRow>,
}

impl FleetNeeds {
    /// A fleet-level header: the oldest cycle among reachable shards (0 when any reachable
    /// shard has not run a cycle yet, or none is reachable), the oldest computation time,
    /// and the sum of the shards' pre-limit counts.
    pub fn header(&self) -> pb::InspectNeedsHeader {
        let reachable: Vec<_> = self.shards.iter().filter(|s| s.reachable).collect();
        let cycle = reachable.iter().map(|s| s.cycle).min().unwrap_or(0);
        let computed = reachable
            .iter()
            .filter(|s| s.cycle > 0)
            .map(|s| s.computed_at_unix_nanos)
            .min()
            .unwrap_or(0);
        let total: i64 = reachable.iter().map(|s| i64::from(s.total_needs)).sum();
        pb::InspectNeedsHeader {
            cycle,
            computed_at_unix_nanos: if cycle == 0 { 0 } else { computed },
            total_needs: i32::try_from(total).unwrap_or(i32::MAX),
        }
    }

    pub fn unreachable(&self) -> impl Iterator<Item = &ShardFetchView> {
        self.shards.iter().filter(|s| !s.reachable)
    }
}

/// Every cluster with demand on some reachable shard.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterIndex {
    pub computed_at_unix_nanos: i64,
    pub coordinator_error: String,
    pub shards: Vec<ShardFetchView>,
    /// Sorted by cluster id.
    pub clusters: Vec<ClusterView>,
}

/// The fleet reader behind every svc-inspect surface.
pub struct Fleet {
    coordinator: CoordinatorClient,
    cfg: FleetConfig,
    metrics: Option<FleetMetrics>,
    channels: Mutex<HashMap<String, MeshChannel>>,
    /// Shards from the coordinator's last successful answer.
    known: Mutex<Vec<pb::ShardRegistryEntry>>,
    overview: TtlCache<(), FleetOverview>,
    needs: TtlCache<(String, usize), FleetNeeds>,
    clusters: TtlCache<(), ClusterIndex>,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("coordinator", &self.coordinator)
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

impl Fleet {
    pub fn new(
        coordinator: CoordinatorClient,
        cfg: FleetConfig,
        metrics: Option<FleetMetrics>,
    ) -> Self {
        Self {
            coordinator,
            overview: TtlCache::new(cfg.cache_ttl, 1),
            needs: TtlCache::new(cfg.cache_ttl, NEEDS_CACHE_KEYS),
            clusters: TtlCache::new(cfg.cache_ttl, 1),
            cfg,
            metrics,
            channels: Mutex::new(HashMap::new()),
            known: Mutex::new(Vec::new()),
        }
    }

    /// The overview, at most `cache_ttl` old.
    pub async fn overview(&self) -> Arc<FleetOverview> {
        match self
            .overview
            .get_or_load(&(), || async {
                Ok::<_, std::convert::Infallible>(self.load_overview().await)
            })
            .await
        {
            Ok(v) => v,
            Err(never) => match never {},
        }
    }

    /// The coordinator's transfers and shard ownership (`shard`: only what involves it;
    /// empty: all). Not cached: one small leader read, asked for by a person.
    pub async fn transfers(
        &self,
        shard: &str,
    ) -> Result<crate::view::TransfersView, crate::coordinator::CoordinatorError> {
        self.coordinator
            .list_transfers(shard)
            .await
            .map(|r| crate::view::TransfersView::from_proto(&r))
    }

    /// The needs of one cluster (empty: every cluster) from every shard, merged, at most
    /// `limit` rows (0: all).
    pub async fn needs(
        &self,
        cluster_id: &str,
        limit: usize,
    ) -> Result<Arc<FleetNeeds>, InspectError> {
        let key = (cluster_id.to_owned(), limit);
        self.needs
            .get_or_load(&key, || self.load_needs(cluster_id, limit))
            .await
    }

    /// Every cluster with demand somewhere, with counts.
    pub async fn clusters(&self) -> Result<Arc<ClusterIndex>, InspectError> {
        self.clusters
            .get_or_load(&(), || self.load_clusters())
            .await
    }

    // --- loading ---

    async fn registry(&self) -> (Vec<pb::ShardRegistryEntry>, Result<(), CoordinatorError>) {
        match self.coordinator.list_shards().await {
            Ok(mut shards) => {
                shards.sort_by(|a, b| a.shard_id.cmp(&b.shard_id));
                *self.known.lock() = shards.clone();
                self.forget_channels(&shards);
                (shards, Ok(()))
            }
            Err(e) => {
                tracing::warn!(error = %e, "coordinator unreachable; using the last known shards");
                (self.known.lock().clone(), Err(e))
            }
        }
    }

    async fn load_overview(&self) -> FleetOverview {
        let (registry, reports, domains) = tokio::join!(
            self.registry(),
            self.coordinator.list_shard_reports(),
            self.coordinator.list_domain_assignments()
        );
        let (registry, listed) = registry;
        let coordinator_reachable = listed.is_ok();
        let coordinator_failure = listed.err();
        let errors: Vec<String> = [
            coordinator_failure.as_ref().map(ToString::to_string),
            reports.as_ref().err().map(ToString::to_string),
            domains.as_ref().err().map(ToString::to_string),
        ]
        .into_iter()
        .flatten()
        .collect();
        let reports: HashMap<String, pb::ShardReportSnapshot> = reports
            .unwrap_or_default()
            .into_iter()
            .map(|r| (r.shard_id.clone(), r))
            .collect();
        let now = now_unix_nanos();

        let lives: Vec<(pb::ShardRegistryEntry, Result<Live, String>)> =
            futures::stream::iter(registry.into_iter().map(|entry| async move {
                let live = self.live(&entry).await;
                (entry, live)
            }))
            .buffer_unordered(FANOUT_CONCURRENCY)
            .collect()
            .await;

        let mut shards: Vec<ShardView> = lives
            .into_iter()
            .map(|(entry, live)| shard_view(&entry, reports.get(&entry.shard_id), live, now))
            .collect();
        shards.sort_by(|a, b| a.shard_id.cmp(&b.shard_id));
        if let Some(m) = &self.metrics {
            m.shards_unreachable
                .set(shards.iter().filter(|s| !s.reachable).count() as i64);
        }

        let mut shortfalls: Vec<mesh::FleetShortfall> = reports
            .values()
            .flat_map(|r| {
                r.shortfalls.iter().map(|s| mesh::FleetShortfall {
                    shard_id: r.shard_id.clone(),
                    cluster_id: String::new(),
                    requirements: s.requirements.clone(),
                    deficit: s.deficit.clone(),
                    priority: s.priority,
                    age_cycles: s.age_cycles,
                    interruption_penalty_bucket: s.interruption_penalty_bucket,
                })
            })
            .collect();
        shortfalls.sort_by(|a, b| {
            b.age_cycles
                .cmp(&a.age_cycles)
                .then(b.priority.cmp(&a.priority))
                .then_with(|| a.shard_id.cmp(&b.shard_id))
        });

        FleetOverview {
            computed_at_unix_nanos: now,
            coordinator_reachable,
            coordinator_error: errors.join("; "),
            coordinator_failure,
            shards,
            shortfalls,
            domains: domains
                .unwrap_or_default()
                .iter()
                .map(DomainView::from_proto)
                .collect(),
        }
    }

    async fn load_needs(&self, cluster_id: &str, limit: usize) -> Result<FleetNeeds, InspectError> {
        let (registry, listed) = self.registry().await;
        let listed = match listed {
            Err(e) if registry.is_empty() => return Err(InspectError::NoShardsKnown(e)),
            other => other,
        };
        let request = pb::InspectNeedsRequest {
            cluster_id: cluster_id.to_owned(),
            limit: i32::try_from(limit).unwrap_or(i32::MAX),
        };
        let answers: Vec<(ShardFetchView, Vec<ShardRow>)> =
            futures::stream::iter(registry.into_iter().map(|entry| {
                let request = request.clone();
                async move {
                    match self.fetch_needs(&entry, request, limit).await {
                        Ok((header, rows)) => (fetch_view(&entry, Ok(&header)), rows),
                        Err(e) => (fetch_view(&entry, Err(e)), Vec::new()),
                    }
                }
            }))
            .buffer_unordered(FANOUT_CONCURRENCY)
            .collect()
            .await;
        let (mut shards, rows): (Vec<_>, Vec<_>) = answers.into_iter().unzip();
        shards.sort_by(|a, b| a.shard_id.cmp(&b.shard_id));
        Ok(FleetNeeds {
            cluster_id: cluster_id.to_owned(),
            computed_at_unix_nanos: now_unix_nanos(),
            coordinator_error: listed.err().map(|e| e.to_string()).unwrap_or_default(),
            shards,
            rows: merge(rows, limit),
        })
    }

    async fn load_clusters(&self) -> Result<ClusterIndex, InspectError> {
        let (registry, listed) = self.registry().await;
        let listed = match listed {
            Err(e) if registry.is_empty() => return Err(InspectError::NoShardsKnown(e)),
            other => other,
        };
        let answers: Vec<(ShardFetchView, HashMap<String, ClusterView>)> =
            futures::stream::iter(registry.into_iter().map(|entry| async move {
                match self.scan_clusters(&entry).await {
                    Ok((header, clusters)) => (fetch_view(&entry, Ok(&header)), clusters),
                    Err(e) => (fetch_view(&entry, Err(e)), HashMap::new()),
                }
            }))
            .buffer_unordered(FANOUT_CONCURRENCY)
            .collect()
            .await;
        let mut merged: BTreeMap<String, ClusterView> = BTreeMap::new();
        let mut shards = Vec::new();
        for (fetch, clusters) in answers {
            shards.push(fetch);
            for (id, c) in clusters {
                match merged.get_mut(&id) {
                    None => {
                        merged.insert(id, c);
                    }
                    Some(m) => {
                        m.shards.extend(c.shards);
                        m.shards.sort();
                        m.needs += c.needs;
                        m.unmet_needs += c.unmet_needs;
                        m.max_priority = m.max_priority.max(c.max_priority);
                        m.max_age_cycles_unmet = m.max_age_cycles_unmet.max(c.max_age_cycles_unmet);
                    }
                }
            }
        }
        shards.sort_by(|a, b| a.shard_id.cmp(&b.shard_id));
        Ok(ClusterIndex {
            computed_at_unix_nanos: now_unix_nanos(),
            coordinator_error: listed.err().map(|e| e.to_string()).unwrap_or_default(),
            shards,
            clusters: merged.into_values().collect(),
        })
    }

    /// Recent actions of every reachable shard (or just `req.shard_id`), merged newest
    /// first by finish time and cut to the request's limit; not cached (ADR-0125).
    pub async fn recent_actions(
        &self,
        req: &mesh::RecentActionsRequest,
    ) -> Result<mesh::RecentActionsResponse, InspectError> {
        let registry = self.chosen_shards(&req.shard_id).await?;
        let limit = match req.limit {
            0 => DEFAULT_ACTIONS,
            n => usize::try_from(n).unwrap_or(usize::MAX),
        };
        let forward = mesh::RecentActionsRequest {
            shard_id: String::new(),
            // A shard's seq means nothing to the others.
            after_seq: 0,
            ..req.clone()
        };
        let answers = self
            .ask_each_shard(registry, "RecentActions", forward, |mut c, r| async move {
                c.recent_actions(r).await
            })
            .await;
        let mut out = mesh::RecentActionsResponse::default();
        for (shard_id, result) in answers {
            match result {
                Ok(r) => {
                    out.capacity = out.capacity.saturating_add(r.capacity);
                    out.recorded = out.recorded.saturating_add(r.recorded);
                    out.actions.extend(r.actions.into_iter().map(|mut a| {
                        if a.shard_id.is_empty() {
                            a.shard_id.clone_from(&shard_id);
                        }
                        a
                    }));
                }
                Err(error) => out.unreachable.push(mesh::ShardError { shard_id, error }),
            }
        }
        out.actions.sort_by(|a, b| {
            (b.finished_at_unix_nanos, &a.shard_id, b.seq).cmp(&(
                a.finished_at_unix_nanos,
                &b.shard_id,
                a.seq,
            ))
        });
        out.actions.truncate(limit);
        out.unreachable.sort_by(|a, b| a.shard_id.cmp(&b.shard_id));
        Ok(out)
    }

    /// One page of machines over every reachable shard (or just `req.shard_id`), in
    /// machine-id order; not cached.
    pub async fn list_machines(
        &self,
        req: &mesh::ListMachinesRequest,
    ) -> Result<mesh::ListMachinesResponse, InspectError> {
        let registry = self.chosen_shards(&req.shard_id).await?;
        let limit = match req.limit {
            0 => DEFAULT_MACHINES,
            n => usize::try_from(n).unwrap_or(usize::MAX).min(MAX_MACHINES),
        };
        let forward = mesh::ListMachinesRequest {
            shard_id: String::new(),
            limit: u32::try_from(limit).unwrap_or(u32::MAX),
            ..req.clone()
        };
        let answers = self
            .ask_each_shard(registry, "ListMachines", forward, |mut c, r| async move {
                c.list_machines(r).await
            })
            .await;
        let mut out = mesh::ListMachinesResponse::default();
        let mut more = false;
        for (shard_id, result) in answers {
            match result {
                Ok(r) => {
                    out.total_matching = out.total_matching.saturating_add(r.total_matching);
                    more |= !r.next_after_machine_id.is_empty();
                    out.machines.extend(r.machines.into_iter().map(|mut m| {
                        if m.shard_id.is_empty() {
                            m.shard_id.clone_from(&shard_id);
                        }
                        m
                    }));
                }
                Err(error) => out.unreachable.push(mesh::ShardError { shard_id, error }),
            }
        }
        let id = |m: &mesh::MachineRow| m.machine.as_ref().map_or(String::new(), |m| m.id.clone());
        out.machines.sort_by_key(|m| (id(m), m.shard_id.clone()));
        // Each shard sent its first `limit` after the cursor, so the merged first `limit`
        // are the fleet's; anything cut, or held back by a shard, follows on a later page.
        if out.machines.len() > limit {
            out.machines.truncate(limit);
            more = true;
        }
        if more {
            out.next_after_machine_id = out.machines.last().map(id).unwrap_or_default();
        }
        out.unreachable.sort_by(|a, b| a.shard_id.cmp(&b.shard_id));
        Ok(out)
    }

    /// Every registered shard, or only `shard_id` (NotFound when unknown).
    async fn chosen_shards(
        &self,
        shard_id: &str,
    ) -> Result<Vec<pb::ShardRegistryEntry>, InspectError> {
        let (mut registry, listed) = self.registry().await;
        if let Err(e) = listed
            && registry.is_empty()
        {
            return Err(InspectError::NoShardsKnown(e));
        }
        if !shard_id.is_empty() {
            registry.retain(|e| e.shard_id == shard_id);
            if registry.is_empty() {
                return Err(InspectError::UnknownShard(shard_id.to_owned()));
            }
        }
        Ok(registry)
    }

    // --- per-shard calls ---

    fn channel(&self, entry: &pb::ShardRegistryEntry) -> Result<MeshChannel, String> {
        if entry.address.trim().is_empty() {
            return Err("the shard advertised no address".to_owned());
        }
        let mut channels = self.channels.lock();
        if let Some(ch) = channels.get(&entry.address) {
            return Ok(ch.clone());
        }
        let channel = ChannelConfig {
            connect_timeout: self.cfg.shard_timeout,
            ..ChannelConfig::default()
        }
        .with_tls(self.cfg.tls.clone());
        // No retries: the fan-out has one timeout per shard and a down shard is reported,
        // not waited for.
        let stack = ClientStackConfig {
            metrics: None,
            retry: RetryPolicy::none(),
            attempt_timeout: None,
        };
        let ch = bigfleet_mesh::dial_lazy(&entry.address, &channel, &stack)
            .map_err(|e| e.to_string())?;
        channels.insert(entry.address.clone(), ch.clone());
        Ok(ch)
    }

    fn forget_channels(&self, registry: &[pb::ShardRegistryEntry]) {
        self.channels
            .lock()
            .retain(|addr, _| registry.iter().any(|e| &e.address == addr));
    }

    fn count(&self, rpc: &str, result: &Result<impl Sized, String>) {
        if let Some(m) = &self.metrics {
            let outcome = if result.is_ok() { "ok" } else { "error" };
            m.shard_calls.with_label_values(&[rpc, outcome]).inc();
        }
    }

    /// Runs `f` under the per-shard timeout, turning statuses into display strings.
    /// One ShardInfo call to every shard of `registry` (at most [`FANOUT_CONCURRENCY`] at
    /// once, each bounded by the shard timeout and counted under `rpc`), with each shard's
    /// answer or why it has none.
    async fn ask_each_shard<Req, Resp, Fut>(
        &self,
        registry: Vec<pb::ShardRegistryEntry>,
        rpc: &'static str,
        request: Req,
        call: impl Fn(ShardInfoClient<MeshChannel>, Req) -> Fut,
    ) -> Vec<(String, Result<Resp, String>)>
    where
        Req: Clone,
        Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
    {
        let call = &call;
        futures::stream::iter(registry.into_iter().map(|entry| {
            let request = request.clone();
            async move {
                let result = match self.channel(&entry) {
                    Err(e) => Err(e),
                    Ok(channel) => {
                        let client =
                            bigfleet_mesh::with_message_limits!(ShardInfoClient::new(channel));
                        self.bounded(async { Ok(call(client, request).await?.into_inner()) })
                            .await
                    }
                };
                self.count(rpc, &result);
                (entry.shard_id, result)
            }
        }))
        .buffer_unordered(FANOUT_CONCURRENCY)
        .collect()
        .await
    }

    async fn bounded<T>(&self, f: impl Future<Output = Result<T, Status>>) -> Result<T, String> {
        match tokio::time::timeout(self.cfg.shard_timeout, f).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(status)) => Err(status_text(&status)),
            Err(_) => Err(format!(
                "no answer within {}",
                humantime::format_duration(self.cfg.shard_timeout)
            )),
        }
    }

    async fn fetch_needs(
        &self,
        entry: &pb::ShardRegistryEntry,
        request: pb::InspectNeedsRequest,
        limit: usize,
    ) -> Result<(pb::InspectNeedsHeader, Vec<ShardRow>), String> {
        let channel = self.channel(entry)?;
        let result = self
            .bounded(async {
                let mut client = bigfleet_mesh::with_message_limits!(ShardReadClient::new(channel));
                let mut stream = client.inspect_needs(request).await?.into_inner();
                let header = read_header(&mut stream).await?;
                let mut rows = Vec::new();
                while let Some(frame) = stream.message().await? {
                    let view = need_frame(frame)?;
                    // A shard that ignores the limit does not get to flood the merge.
                    if limit == 0 || rows.len() < limit {
                        rows.push(ShardRow {
                            shard_id: entry.shard_id.clone(),
                            view,
                        });
                    }
                }
                Ok((header, rows))
            })
            .await;
        self.count("InspectNeeds", &result);
        result
    }

    /// Streams every need of a shard, keeping only per-cluster counts (memory stays
    /// proportional to the number of clusters, not of needs).
    async fn scan_clusters(
        &self,
        entry: &pb::ShardRegistryEntry,
    ) -> Result<(pb::InspectNeedsHeader, HashMap<String, ClusterView>), String> {
        let channel = self.channel(entry)?;
        let result = self
            .bounded(async {
                let mut client = bigfleet_mesh::with_message_limits!(ShardReadClient::new(channel));
                let mut stream = client
                    .inspect_needs(pb::InspectNeedsRequest::default())
                    .await?
                    .into_inner();
                let header = read_header(&mut stream).await?;
                let mut clusters: HashMap<String, ClusterView> = HashMap::new();
                while let Some(frame) = stream.message().await? {
                    let v = need_frame(frame)?;
                    let prio = v.need.as_ref().map_or(0, |n| n.priority);
                    let c = clusters
                        .entry(v.cluster_id.clone())
                        .or_insert_with(|| ClusterView {
                            cluster_id: v.cluster_id.clone(),
                            shards: vec![entry.shard_id.clone()],
                            needs: 0,
                            unmet_needs: 0,
                            max_priority: prio,
                            max_age_cycles_unmet: 0,
                        });
                    c.needs += 1;
                    c.unmet_needs += u32::from(!v.satisfied);
                    c.max_priority = c.max_priority.max(prio);
                    c.max_age_cycles_unmet = c.max_age_cycles_unmet.max(v.age_cycles_unmet);
                }
                Ok((header, clusters))
            })
            .await;
        self.count("InspectNeeds", &result);
        result
    }

    /// The shard's live numbers: ShardInfo.Describe, or only the InspectNeeds header from a
    /// shard that does not serve ShardInfo.
    async fn live(&self, entry: &pb::ShardRegistryEntry) -> Result<Live, String> {
        let channel = self.channel(entry)?;
        let described = self
            .bounded(async {
                let mut client =
                    bigfleet_mesh::with_message_limits!(ShardInfoClient::new(channel.clone()));
                Ok(client
                    .describe(mesh::DescribeShardRequest {})
                    .await?
                    .into_inner())
            })
            .await;
        match described {
            Ok(d) => {
                self.count("Describe", &Ok::<_, String>(()));
                if !d.shard_id.is_empty() && d.shard_id != entry.shard_id {
                    return Err(format!(
                        "{} answers as shard {:?}",
                        entry.address, d.shard_id
                    ));
                }
                Ok(Live::Described(d))
            }
            Err(e) if e.starts_with(UNIMPLEMENTED_PREFIX) => {
                let header = self
                    .fetch_needs(
                        entry,
                        pb::InspectNeedsRequest {
                            cluster_id: String::new(),
                            limit: 1,
                        },
                        1,
                    )
                    .await?
                    .0;
                Ok(Live::HeaderOnly(header))
            }
            Err(e) => {
                self.count("Describe", &Err::<(), _>(e.clone()));
                Err(e)
            }
        }
    }
}

const UNIMPLEMENTED_PREFIX: &str = "unimplemented:";

/// What a reachable shard told us about itself.
enum Live {
    Described(mesh::ShardDescription),
    HeaderOnly(pb::InspectNeedsHeader),
}

async fn read_header(
    stream: &mut tonic::Streaming<pb::InspectNeedsResponse>,
) -> Result<pb::InspectNeedsHeader, Status> {
    match stream.message().await?.and_then(|f| f.frame) {
        Some(pb::inspect_needs_response::Frame::Header(h)) => Ok(h),
        Some(pb::inspect_needs_response::Frame::Need(_)) => Err(Status::internal(
            "protocol error: the first InspectNeeds frame is not a header",
        )),
        None => Err(Status::internal(
            "protocol error: InspectNeeds stream without a header",
        )),
    }
}

fn need_frame(frame: pb::InspectNeedsResponse) -> Result<pb::NeedView, Status> {
    match frame.frame {
        Some(pb::inspect_needs_response::Frame::Need(v)) => Ok(v),
        Some(pb::inspect_needs_response::Frame::Header(_)) => Err(Status::internal(
            "protocol error: a second InspectNeeds header",
        )),
        None => Err(Status::internal(
            "protocol error: an empty InspectNeeds frame",
        )),
    }
}

/// `unavailable: connection refused`.
pub fn status_text(status: &Status) -> String {
    let code = code_name(status.code()).replace(' ', "_");
    let message = status.message().trim();
    if status.code() == Code::Unknown && message.is_empty() {
        return "unknown error".to_owned();
    }
    format!("{code}: {message}")
}

fn fetch_view(
    entry: &pb::ShardRegistryEntry,
    header: Result<&pb::InspectNeedsHeader, String>,
) -> ShardFetchView {
    let (reachable, error, h) = match header {
        Ok(h) => (true, String::new(), *h),
        Err(e) => (false, e, pb::InspectNeedsHeader::default()),
    };
    ShardFetchView {
        shard_id: entry.shard_id.clone(),
        address: entry.address.clone(),
        reachable,
        error,
        cycle: h.cycle,
        computed_at_unix_nanos: h.computed_at_unix_nanos,
        total_needs: h.total_needs,
    }
}

fn shard_view(
    entry: &pb::ShardRegistryEntry,
    report: Option<&pb::ShardReportSnapshot>,
    live: Result<Live, String>,
    now: i64,
) -> ShardView {
    let summary = report.and_then(|r| r.summary.as_ref());
    let mut view = ShardView {
        shard_id: entry.shard_id.clone(),
        address: entry.address.clone(),
        reachable: false,
        error: String::new(),
        registered_at_unix_ns: entry.registered_at_unix_ns,
        last_report_age_ms: if entry.last_heartbeat_unix_ns > 0 {
            (now - entry.last_heartbeat_unix_ns).max(0) / 1_000_000
        } else {
            -1
        },
        cycle: 0,
        machines_by_state: BTreeMap::new(),
        sessions: 0,
        needs: 0,
        unmet_needs: 0,
        shard_epoch: 0,
        actions_in_flight: 0,
        reported_total_machines: summary.map(|s| s.total_machines),
        reported_free_machines: summary.map(|s| s.free_machines),
        source: String::new(),
        inventory_stale: false,
        inventory_listed_at_unix_ns: 0,
        removals_held: 0,
    };
    match live {
        Ok(Live::Described(d)) => {
            view.reachable = true;
            view.cycle = d.cycle;
            view.machines_by_state = d.machines_by_state.into_iter().collect();
            view.sessions = d.sessions;
            view.needs = d.needs;
            view.unmet_needs = d.unmet_needs;
            view.shard_epoch = d.shard_epoch;
            view.actions_in_flight = d.actions_in_flight;
            view.inventory_stale = d.inventory_stale;
            view.inventory_listed_at_unix_ns = d.inventory_listed_at_unix_nanos;
            view.removals_held = d.removals_held;
            view.source = "shard-info".to_owned();
        }
        Ok(Live::HeaderOnly(h)) => {
            view.reachable = true;
            view.cycle = h.cycle;
            view.needs = h.total_needs;
            view.unmet_needs = -1;
            view.source = "inspect-needs".to_owned();
        }
        Err(e) => view.error = e,
    }
    view
}

pub fn now_unix_nanos() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fetch(id: &str, reachable: bool, cycle: i64, at: i64, total: i32) -> ShardFetchView {
        ShardFetchView {
            shard_id: id.into(),
            address: String::new(),
            reachable,
            error: String::new(),
            cycle,
            computed_at_unix_nanos: at,
            total_needs: total,
        }
    }

    fn needs(shards: Vec<ShardFetchView>) -> FleetNeeds {
        FleetNeeds {
            cluster_id: String::new(),
            computed_at_unix_nanos: 0,
            coordinator_error: String::new(),
            shards,
            rows: Vec::new(),
        }
    }

    #[test]
    fn the_fleet_header_is_conservative() {
        let h = needs(vec![
            fetch("a", true, 9, 900, 3),
            fetch("b", true, 4, 400, 2),
            fetch("c", false, 0, 0, 0),
        ])
        .header();
        assert_eq!(
            (h.cycle, h.computed_at_unix_nanos, h.total_needs),
            (4, 400, 5)
        );
        let before_first =
            needs(vec![fetch("a", true, 9, 900, 3), fetch("b", true, 0, 0, 0)]).header();
        assert_eq!(
            (before_first.cycle, before_first.computed_at_unix_nanos),
            (0, 0)
        );
        let none = needs(vec![fetch("a", false, 0, 0, 0)]).header();
        assert_eq!((none.cycle, none.total_needs), (0, 0));
    }

    #[test]
    fn status_texts_name_the_code() {
        assert_eq!(
            status_text(&Status::unavailable("refused")),
            "unavailable: refused"
        );
        assert_eq!(
            status_text(&Status::permission_denied("no")),
            "permission_denied: no"
        );
        assert!(status_text(&Status::unimplemented("x")).starts_with(UNIMPLEMENTED_PREFIX));
    }

    #[test]
    fn unreachable_shards_keep_their_reported_numbers() {
        let entry = pb::ShardRegistryEntry {
            shard_id: "s1".into(),
            address: "h:1".into(),
            registered_at_unix_ns: 5,
            last_heartbeat_unix_ns: 1_000_000_000,
        };
        let report = pb::ShardReportSnapshot {
            shard_id: "s1".into(),
            summary: Some(pb::ShardSummary {
                total_machines: 10,
                free_machines: 4,
                ..Default::default()
            }),
            ..Default::default()
        };
        let v = shard_view(
            &entry,
            Some(&report),
            Err("unavailable: refused".into()),
            3_000_000_000,
        );
        assert!(!v.reachable);
        assert_eq!(v.error, "unavailable: refused");
        assert_eq!(
            (v.reported_total_machines, v.reported_free_machines),
            (Some(10), Some(4))
        );
        assert_eq!(v.last_report_age_ms, 2000);
        let never = shard_view(
            &pb::ShardRegistryEntry::default(),
            None,
            Ok(Live::HeaderOnly(pb::InspectNeedsHeader {
                cycle: 3,
                computed_at_unix_nanos: 1,
                total_needs: 7,
            })),
            1,
        );
        assert_eq!(
            (never.last_report_age_ms, never.needs, never.unmet_needs),
            (-1, 7, -1)
        );
        assert_eq!(never.source, "inspect-needs");
    }
}
