//! The provider itself: an in-memory machine store that answers the six provider calls
//! with the contract's semantics, plus the hooks tests use to steer it.
//!
//! One `RwLock` guards everything, so the fence check, the idempotency check and the state
//! change of one call are a single step (a passing token must never let an older call be
//! applied after a newer one). Reads share the lock. Timed transitions are not driven by a
//! background task: due completions sit in a heap and are applied by whichever call comes
//! next, which makes the store usable without a runtime and deterministic in tests (a
//! machine nobody looks at cannot be observed to lag).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bigfleet_proto::v1alpha1::{
    self as pb, ConfigureRequest, CreateRequest, DeleteRequest, DrainRequest, ListFilter, Machine,
    MachineList, MachineState, TransitionAck,
};
use bytes::BufMut;
use parking_lot::{Mutex, RwLock};
use prost::Message;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use crate::actuation::ActuationLog;
use crate::catalog::{self, Catalog, DEFAULT_CLUSTER, RACK_LABEL, ZONE_LABEL};
use crate::fence::{FenceMarks, Mark};
use crate::wire;
use crate::{CatalogError, FenceFileError, ProviderError};

mod config;
mod inner;
pub use config::*;

/// Static part of machines: everything but the per-machine fields, encoded once.
#[derive(Debug)]
struct Template {
    statics: Machine,
    encoded: Vec<u8>,
}

impl Template {
    fn new(statics: Machine) -> Arc<Self> {
        debug_assert!(statics.id.is_empty() && statics.state == 0 && statics.host.is_none());
        let encoded = statics.encode_to_vec();
        Arc::new(Self { statics, encoded })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Host {
    None,
    /// `{provider: <provider name>, ref: <machine id>}` without storing either string.
    Own,
    Custom {
        provider: Box<str>,
        reference: Box<str>,
    },
}

#[derive(Debug)]
struct Record {
    id: Box<str>,
    state: MachineState,
    tpl: Arc<Template>,
    host: Host,
    cluster: Option<Box<str>>,
    // Boxed: an unbound machine (most of a 500K fleet) then pays 8 bytes, not 48.
    #[allow(clippy::box_collection)]
    metadata: Option<Box<BTreeMap<String, String>>>,
    last_error: Option<Box<str>>,
    /// The latest accepted operation: the idempotency key is (machine, kind) and only the
    /// latest kind can still be in its in-flight or target state.
    last_op: Option<(OpKind, u64)>,
    /// Bumped on every state change so queued timers of an older transition are ignored.
    generation: u32,
    needs_ready: bool,
    ready: bool,
    awaiting_ready: bool,
    doom: Option<Box<str>>,
    /// This machine as a `MachineList.machines` entry (field key, length, `Machine`),
    /// refreshed on every change so a List is one copy per machine.
    framed: Box<[u8]>,
}

impl Record {
    /// `machine` as a record, in whatever state it says (host, cluster, metadata and
    /// last_error as given; an empty host in a state that has one gets the default host).
    fn given(machine: Machine) -> Result<Self, ProviderError> {
        let state = MachineState::try_from(machine.state)
            .ok()
            .filter(|s| *s != MachineState::Unspecified)
            .ok_or_else(|| {
                ProviderError::InvalidArgument(format!("machine {} has no valid state", machine.id))
            })?;
        if machine.id.is_empty() || machine.instance_type.is_empty() {
            return Err(ProviderError::InvalidArgument(
                "machine id and instance_type are required".into(),
            ));
        }
        let mut statics = machine;
        let id = std::mem::take(&mut statics.id);
        statics.state = 0;
        let host = match statics.host.take() {
            Some(h) if !h.r#ref.is_empty() || !h.provider.is_empty() => Host::Custom {
                provider: h.provider.into(),
                reference: h.r#ref.into(),
            },
            _ if has_host_in(state) => Host::Own,
            _ => Host::None,
        };
        let cluster = Some(std::mem::take(&mut statics.cluster))
            .filter(|c| !c.is_empty())
            .map(Into::into);
        let metadata = Some(std::mem::take(&mut statics.shard_metadata))
            .filter(|m| !m.is_empty())
            .map(Box::new);
        let last_error = Some(std::mem::take(&mut statics.last_error))
            .filter(|e| !e.is_empty())
            .map(Into::into);
        let mut record = Record::arriving(id.into(), state, Template::new(statics), host, cluster);
        record.metadata = metadata;
        record.last_error = last_error;
        Ok(record)
    }

    /// A machine as it enters the store (seeded or added): no metadata, no error, no
    /// operation on record yet; its `framed` entry is written when it is inserted.
    fn arriving(
        id: Box<str>,
        state: MachineState,
        tpl: Arc<Template>,
        host: Host,
        cluster: Option<Box<str>>,
    ) -> Self {
        Record {
            id,
            state,
            tpl,
            host,
            cluster,
            metadata: None,
            last_error: None,
            last_op: None,
            generation: 0,
            needs_ready: false,
            ready: false,
            awaiting_ready: false,
            doom: None,
            framed: Box::default(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum DueKind {
    Complete,
    Timeout,
}

type Due = Reverse<(u64, u32, u32, DueKind)>;

const STATE_SLOTS: usize = 9;

struct Inner {
    config: ProviderConfig,
    provider_name: Box<str>,
    slots: Vec<Option<Record>>,
    index: FxHashMap<Box<str>, u32>,
    counts: [usize; STATE_SLOTS],
    /// Mutation counter; the List cursor is its decimal form.
    rev: u64,
    /// First revision of this incarnation: older cursors come from another process.
    base_rev: u64,
    /// (revision, slot) of every change since `base_rev`, ascending.
    log: Vec<(u64, u32)>,
    next_op: u64,
    fences: FenceMarks,
    /// `--actuation-log`: every accepted mutating call, in order.
    actuations: Option<ActuationLog>,
    due: BinaryHeap<Due>,
    /// Injections per (machine, operation), each answering one call, in order.
    fail_next: FxHashMap<(Box<str>, OpKind), VecDeque<Injection>>,
    rng: StdRng,
}

/// The fake capacity provider. Share it as `Arc<FakeProvider>` between tests and the gRPC
/// adapter ([`crate::grpc`]).
pub struct FakeProvider {
    inner: RwLock<Inner>,
    origin: Instant,
    /// Nanoseconds since `origin` of the earliest queued timer (`u64::MAX`: none), so reads
    /// only take the write lock when a timer is actually due.
    next_due: AtomicU64,
    /// Lists seen and scripted List faults. Apart from the store's lock: a List must not
    /// take the write lock just to be counted.
    lists: Mutex<ListCalls>,
    /// The last [`MUTATION_CALLS_KEPT`] mutating calls, as they arrived.
    calls: Mutex<VecDeque<MutationCall>>,
}

/// What the Lists so far asked for, and the faults the next ones answer with.
#[derive(Debug, Default)]
struct ListCalls {
    calls: u64,
    last_since: Vec<u8>,
    script: VecDeque<ListFault>,
}

impl std::fmt::Debug for FakeProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let g = self.inner.read();
        f.debug_struct("FakeProvider")
            .field("machines", &g.index.len())
            .field("revision", &g.rev)
            .finish()
    }
}

/// The lower-case name the engine's model uses for the state (both enums share the wire
/// ordinals), so admin stats and errors spell states as the rest of the fleet does.
fn state_name(s: MachineState) -> &'static str {
    bigfleet_model::MachineState::from_ordinal(s as i32)
        .unwrap_or_default()
        .as_str()
}

fn is_transitional(s: MachineState) -> bool {
    OpKind::of_transitional(s).is_some()
}

fn has_host_in(s: MachineState) -> bool {
    !matches!(s, MachineState::Speculative | MachineState::Creating)
}

#[cfg(test)]
fn is_bound(s: MachineState) -> bool {
    matches!(
        s,
        MachineState::Configuring | MachineState::Configured | MachineState::Draining
    )
}

impl FakeProvider {
    /// An empty provider.
    pub fn new(config: ProviderConfig) -> Self {
        // Starting the counter at the wall clock makes cursors of an earlier process
        // (restart = new counter) fall below `base_rev` and get a full List instead of a
        // wrong delta.
        let start = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        let rng = StdRng::seed_from_u64(config.seed);
        Self {
            inner: RwLock::new(Inner {
                provider_name: config.provider_name.clone().into(),
                config,
                slots: Vec::new(),
                index: FxHashMap::default(),
                counts: [0; STATE_SLOTS],
                rev: start,
                base_rev: start,
                log: Vec::new(),
                next_op: 1,
                fences: FenceMarks::in_memory(),
                actuations: None,
                due: BinaryHeap::new(),
                fail_next: FxHashMap::default(),
                rng,
            }),
            origin: Instant::now(),
            next_due: AtomicU64::new(u64::MAX),
            lists: Mutex::default(),
            calls: Mutex::default(),
        }
    }

    /// A provider seeded from `catalog`; its `provider` name replaces the config's.
    pub fn from_catalog(
        catalog: &Catalog,
        mut config: ProviderConfig,
    ) -> Result<Self, CatalogError> {
        catalog.validate()?;
        config.provider_name = catalog.provider.clone();
        let me = Self::new(config);
        me.seed(catalog)?;
        Ok(me)
    }

    /// The built-in catalog ([`Catalog::builtin`]) with the default (instant) config.
    pub fn builtin() -> Self {
        Self::from_catalog(&Catalog::builtin(), ProviderConfig::default())
            .unwrap_or_else(|e| unreachable!("the built-in catalog is valid: {e}"))
    }

    /// `n` generated machines ([`Catalog::generated`]), deterministic by `seed`.
    pub fn generate(n: u64, seed: u64) -> Self {
        let config = ProviderConfig {
            seed,
            ..ProviderConfig::default()
        };
        Self::from_catalog(&Catalog::generated(n, seed), config)
            .unwrap_or_else(|e| unreachable!("generated catalogs are valid: {e}"))
    }

    /// Seeds every machine of `catalog` at the current revision (not in the change log:
    /// a seed is the starting state, not a change). Returns how many were added.
    fn seed(&self, catalog: &Catalog) -> Result<usize, CatalogError> {
        let mut g = self.inner.write();
        let total = usize::try_from(catalog.machine_count()).unwrap_or(usize::MAX);
        g.slots.reserve(total);
        g.index.reserve(total);
        let mut templates: FxHashMap<(usize, usize, Option<u64>), Arc<Template>> =
            FxHashMap::default();
        for seed in catalog::expand(catalog) {
            let tpl = templates
                .entry((seed.pool, seed.zone, seed.rack))
                .or_insert_with(|| Template::new(pool_statics(catalog, &seed)))
                .clone();
            let pool = &catalog.pools[seed.pool];
            let cluster = seed.cluster.map(|c| {
                if pool.clusters.is_empty() {
                    DEFAULT_CLUSTER.into()
                } else {
                    pool.clusters[c % pool.clusters.len()].as_str().into()
                }
            });
            let host = if has_host_in(seed.state) {
                Host::Own
            } else {
                Host::None
            };
            let mut record = Record::arriving(seed.id.into(), seed.state, tpl, host, cluster);
            record.last_error =
                (seed.state == MachineState::Failed).then(|| "seeded as failed".into());
            if g.index.contains_key(&record.id) {
                return Err(CatalogError::DuplicateMachine {
                    id: record.id.into(),
                });
            }
            g.insert(record);
        }
        g.base_rev = g.rev;
        Ok(total)
    }

    /// Loads (and from now on appends to) a persisted fence file, replacing the in-memory
    /// marks. Call before serving.
    pub fn open_fence_file(&self, path: &Path) -> Result<usize, FenceFileError> {
        let marks = FenceMarks::open(path)?;
        let n = marks.len();
        self.inner.write().fences = marks;
        Ok(n)
    }

    /// Appends every accepted mutating call to `path` from now on (see
    /// [`crate::actuation`]). Call before serving.
    pub fn open_actuation_log(&self, path: &Path) -> std::io::Result<()> {
        let log = ActuationLog::open(path)?;
        self.inner.write().actuations = Some(log);
        Ok(())
    }

    pub fn config(&self) -> ProviderConfig {
        self.inner.read().config.clone()
    }

    /// Changes behaviour for subsequent calls (transition model, failure rates, ...).
    pub fn update_config(&self, f: impl FnOnce(&mut ProviderConfig)) {
        let mut g = self.inner.write();
        f(&mut g.config);
        if *g.provider_name != *g.config.provider_name {
            g.provider_name = g.config.provider_name.clone().into();
            // Every own host shows the new name: that is a change of those machines.
            let own: Vec<u32> = (0..g.slots.len() as u32)
                .filter(|&s| {
                    g.slots[s as usize]
                        .as_ref()
                        .is_some_and(|r| r.host == Host::Own)
                })
                .collect();
            for slot in own {
                g.touch(slot);
            }
        }
    }

    fn now(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    /// Applies due timers. Cheap when none is due.
    fn tick(&self) {
        let now = self.now();
        if now >= self.next_due.load(Ordering::Acquire) {
            let mut g = self.inner.write();
            g.process_due(now);
            self.next_due.store(g.peek_due(), Ordering::Release);
        }
    }

    fn mutate(
        &self,
        kind: OpKind,
        machine_id: &str,
        token: Token<'_>,
        apply: impl FnOnce(&mut Record),
        validate: impl FnOnce() -> Result<(), ProviderError>,
    ) -> Result<TransitionAck, ProviderError> {
        let now = self.now();
        let mut g = self.inner.write();
        g.process_due(now);
        let result = g.mutate(kind, machine_id, token, now, apply, validate);
        self.next_due.store(g.peek_due(), Ordering::Release);
        result
    }

    /// Remembers a mutating call before anything judges it.
    fn record_call(&self, op: OpKind, machine_id: &str, token: Token<'_>, blob: &[u8]) {
        let mut calls = self.calls.lock();
        if calls.len() == MUTATION_CALLS_KEPT {
            calls.pop_front();
        }
        calls.push_back(MutationCall {
            op,
            machine_id: machine_id.to_owned(),
            shard_id: token.shard_id.to_owned(),
            epoch: token.epoch,
            sequence: token.sequence,
            bootstrap_blob: blob.to_vec(),
        });
    }

    /// The last [`MUTATION_CALLS_KEPT`] mutating calls, oldest first, whatever became of
    /// them (fenced and refused ones included).
    pub fn mutation_calls(&self) -> Vec<MutationCall> {
        self.calls.lock().iter().cloned().collect()
    }

    /// SPECULATIVE → CREATING → IDLE.
    pub fn create(&self, req: &CreateRequest) -> Result<TransitionAck, ProviderError> {
        let token = Token::new(&req.shard_id, req.shard_epoch, req.sequence_number);
        self.record_call(OpKind::Create, &req.machine_id, token, &[]);
        self.mutate(OpKind::Create, &req.machine_id, token, |_| {}, || Ok(()))
    }

    /// IDLE → CONFIGURING → CONFIGURED; stores `cluster_id` and `shard_metadata` verbatim.
    pub fn configure(&self, req: &ConfigureRequest) -> Result<TransitionAck, ProviderError> {
        let token = Token::new(&req.shard_id, req.shard_epoch, req.sequence_number);
        self.record_call(
            OpKind::Configure,
            &req.machine_id,
            token,
            &req.bootstrap_blob,
        );
        self.mutate(
            OpKind::Configure,
            &req.machine_id,
            token,
            |rec| {
                rec.cluster = Some(req.cluster_id.as_str().into());
                rec.metadata =
                    (!req.shard_metadata.is_empty()).then(|| Box::new(req.shard_metadata.clone()));
                rec.ready = false;
                rec.awaiting_ready = false;
            },
            || {
                if req.cluster_id.is_empty() {
                    Err(ProviderError::InvalidArgument("cluster_id is empty".into()))
                } else {
                    Ok(())
                }
            },
        )
    }

    /// CONFIGURED → DRAINING → IDLE; the binding and metadata clear on arrival in IDLE.
    pub fn drain(&self, req: &DrainRequest) -> Result<TransitionAck, ProviderError> {
        let token = Token::new(&req.shard_id, req.shard_epoch, req.sequence_number);
        self.record_call(OpKind::Drain, &req.machine_id, token, &[]);
        self.mutate(OpKind::Drain, &req.machine_id, token, |_| {}, || Ok(()))
    }

    /// IDLE → DELETING → SPECULATIVE (UNIMPLEMENTED when deletes are switched off).
    pub fn delete(&self, req: &DeleteRequest) -> Result<TransitionAck, ProviderError> {
        let token = Token::new(&req.shard_id, req.shard_epoch, req.sequence_number);
        self.record_call(OpKind::Delete, &req.machine_id, token, &[]);
        self.mutate(OpKind::Delete, &req.machine_id, token, |_| {}, || Ok(()))
    }

    /// One machine; INVALID_ARGUMENT for an empty id, NOT_FOUND when unknown.
    pub fn get(&self, id: &str) -> Result<Machine, ProviderError> {
        if id.is_empty() {
            return Err(ProviderError::InvalidArgument("machine id is empty".into()));
        }
        self.tick();
        let g = self.inner.read();
        let slot = g.slot_of(id)?;
        Ok(g.to_proto(slot))
    }

    /// The inventory as proto values (in-process callers; the gRPC List writes the same
    /// content straight to the wire, see [`FakeProvider::encode_list`]).
    pub fn list(&self, filter: &ListFilter) -> MachineList {
        self.tick();
        let g = self.inner.read();
        let (slots, revision) = g.select(filter);
        MachineList {
            machines: slots.iter().map(|&s| g.to_proto(s)).collect(),
            revision,
        }
    }

    /// Counts a List call (cursor included) and takes the next scripted fault: `Ok(None)`
    /// means answer the truth ([`FakeProvider::list`] / [`FakeProvider::encode_list`]),
    /// `Ok(Some(_))` is the lie to answer instead. Both gRPC List paths call this first.
    pub fn begin_list(&self, filter: &ListFilter) -> Result<Option<MachineList>, ProviderError> {
        let fault = {
            let mut lists = self.lists.lock();
            lists.calls += 1;
            lists.last_since.clone_from(&filter.since_revision);
            lists.script.pop_front()
        };
        let Some(fault) = fault else {
            return Ok(None);
        };
        let truth = || self.list(&ListFilter::default()).machines;
        let machines = match fault {
            ListFault::Unavailable => {
                return Err(ProviderError::Injected {
                    code: tonic::Code::Unavailable,
                    message: "provider down (injected list fault)".into(),
                });
            }
            ListFault::Empty => Vec::new(),
            ListFault::Truncated(n) => truth().into_iter().take(n).collect(),
            ListFault::Invalid => truth()
                .into_iter()
                .map(|mut m| {
                    m.price_per_hour = -1.0;
                    m
                })
                .collect(),
        };
        Ok(Some(MachineList {
            machines,
            revision: Vec::new(),
        }))
    }

    /// Writes the encoded `MachineList` for `filter` into `buf` (reserving the exact size
    /// first) and returns how many machines it holds.
    pub fn encode_list<B: ReserveBufMut>(&self, filter: &ListFilter, buf: &mut B) -> usize {
        self.tick();
        let g = self.inner.read();
        let (slots, revision) = g.select(filter);
        let total: usize = slots.iter().map(|&s| g.rec(s).framed.len()).sum::<usize>()
            + wire::str_len(2, &revision);
        buf.reserve_bytes(total);
        for &slot in &slots {
            buf.put_slice(&g.rec(slot).framed);
        }
        wire::put_str(buf, 2, &revision);
        slots.len()
    }

    // ---- test hooks -------------------------------------------------------------------

    /// Ends a staged (or not yet due) transition now: CREATING → IDLE, CONFIGURING →
    /// CONFIGURED (still subject to a readiness hold), DRAINING → IDLE, DELETING →
    /// SPECULATIVE.
    pub fn complete_staged(&self, id: &str) -> Result<Machine, ProviderError> {
        self.with_record(id, |g, slot| {
            let state = g.rec(slot).state;
            if !is_transitional(state) {
                return Err(ProviderError::NotTransitional {
                    id: id.to_owned(),
                    state: state_name(state),
                });
            }
            g.complete(slot);
            Ok(g.to_proto(slot))
        })
    }

    /// Completes every pending transition (staged or timed); returns how many moved.
    pub fn complete_all(&self) -> usize {
        let now = self.now();
        let mut g = self.inner.write();
        g.process_due(now);
        let pending = g.slots_where(|r| is_transitional(r.state) && !r.awaiting_ready);
        for &slot in &pending {
            g.complete(slot);
        }
        self.next_due.store(g.peek_due(), Ordering::Release);
        pending.len()
    }

    /// The original's ADR-0056: hold this machine's next Configure in CONFIGURING until
    /// [`FakeProvider::mark_ready`], whatever the global setting.
    pub fn require_readiness(&self, id: &str) -> Result<(), ProviderError> {
        self.with_record(id, |g, slot| {
            let rec = g.rec_mut(slot);
            rec.needs_ready = true;
            rec.ready = false;
            Ok(())
        })
    }

    /// The node joined and reported Ready: a held CONFIGURING machine becomes CONFIGURED;
    /// one whose Configure is still in flight completes as soon as it lands. Only valid
    /// while CONFIGURING.
    pub fn mark_ready(&self, id: &str) -> Result<Machine, ProviderError> {
        self.with_record(id, |g, slot| {
            let rec = g.rec_mut(slot);
            if rec.state != MachineState::Configuring {
                return Err(ProviderError::NotTransitional {
                    id: id.to_owned(),
                    state: state_name(rec.state),
                });
            }
            rec.ready = true;
            if rec.awaiting_ready && rec.state == MachineState::Configuring {
                g.complete(slot);
            }
            Ok(g.to_proto(slot))
        })
    }

    /// The machine breaks: FAILED now, with `reason` as `last_error`.
    pub fn fail_machine(&self, id: &str, reason: &str) -> Result<Machine, ProviderError> {
        self.with_record(id, |g, slot| {
            g.fail(slot, reason);
            Ok(g.to_proto(slot))
        })
    }

    /// A `kind` call for `id` (that passes the fence) fails as `injection` says: the next
    /// one, or the one after those already queued for it. Keyed by operation rather than
    /// target state because Create and Drain share IDLE.
    pub fn fail_next(&self, id: &str, kind: OpKind, injection: Injection) {
        self.inner
            .write()
            .fail_next
            .entry((id.into(), kind))
            .or_default()
            .push_back(injection);
    }

    /// Records `mark` for (shard, machine) as a call of that shard would: what a newer
    /// incarnation of the shard leaves behind for its zombie predecessor to run into.
    pub fn record_fence(
        &self,
        shard_id: &str,
        machine_id: &str,
        mark: Mark,
    ) -> Result<(), ProviderError> {
        self.inner
            .write()
            .fences
            .check_and_advance(shard_id, machine_id, mark)?
            .map_err(|stale| ProviderError::Fenced {
                shard_id: shard_id.to_owned(),
                machine_id: machine_id.to_owned(),
                epoch: mark.epoch,
                sequence: mark.sequence,
                high_water: stale.high_water,
            })
    }

    /// The next Lists answer `faults`, one each and in order (after any still queued),
    /// then the truth again.
    pub fn script_lists(&self, faults: impl IntoIterator<Item = ListFault>) {
        self.lists.lock().script.extend(faults);
    }

    /// Drops the List faults not answered yet: the provider tells the truth again.
    pub fn clear_list_script(&self) {
        self.lists.lock().script.clear();
    }

    /// How many scripted List faults are still to be answered.
    pub fn list_script_len(&self) -> usize {
        self.lists.lock().script.len()
    }

    /// Lists called so far (answered truthfully or not).
    pub fn list_calls(&self) -> u64 {
        self.lists.lock().calls
    }

    /// The `since_revision` of the latest List (empty: a full List).
    pub fn last_since_revision(&self) -> Vec<u8> {
        self.lists.lock().last_since.clone()
    }

    /// The machine vanishes (a delta List cannot tell; a full List no longer shows it).
    pub fn remove_machine(&self, id: &str) -> Result<(), ProviderError> {
        self.with_record(id, |g, slot| {
            g.remove(slot);
            Ok(())
        })
    }

    /// Removes `fraction` (rounded) of the SPECULATIVE machines, chosen by the seeded dice
    /// — quota shrinking under the shard. Returns the removed ids.
    pub fn shed_speculative(&self, fraction: f64) -> Vec<String> {
        let mut g = self.inner.write();
        let spec = g.slots_where(|r| r.state == MachineState::Speculative);
        let k = ((spec.len() as f64) * fraction.clamp(0.0, 1.0)).round() as usize;
        let picked = rand::seq::index::sample(&mut g.rng, spec.len(), k);
        let mut removed = Vec::with_capacity(k);
        for i in picked {
            let slot = spec[i];
            removed.push(g.rec(slot).id.to_string());
            g.remove(slot);
        }
        removed
    }

    /// Adds a machine in whatever state `machine` says (host, cluster, metadata,
    /// last_error as given; an empty host in a state that has one gets the default host).
    pub fn add_machine(&self, machine: Machine) -> Result<(), ProviderError> {
        let record = Record::given(machine)?;
        let mut g = self.inner.write();
        if g.index.contains_key(&record.id) {
            return Err(ProviderError::AlreadyExists {
                id: record.id.into(),
            });
        }
        let slot = g.insert(record);
        g.touch(slot);
        Ok(())
    }

    /// Rewrites an existing machine through `edit` (state, host, cluster, price, anything,
    /// read as [`FakeProvider::get`] shows it), as a change at a new revision: the
    /// provider's view moved without a call through this API (a console, another
    /// controller). Records that fail a consumer's validation are allowed on purpose.
    pub fn update_machine(
        &self,
        id: &str,
        edit: impl FnOnce(&mut Machine),
    ) -> Result<Machine, ProviderError> {
        self.with_record(id, |g, slot| {
            let mut machine = g.to_proto(slot);
            edit(&mut machine);
            if machine.id != id {
                return Err(ProviderError::InvalidArgument(format!(
                    "an update cannot rename machine {id}"
                )));
            }
            let mut record = Record::given(machine)?;
            // The host `get` showed for an own host comes back as given: keep it this
            // provider's own, so a later rename of the provider still shows on it.
            if let Host::Custom {
                provider,
                reference,
            } = &record.host
                && **provider == *g.provider_name
                && **reference == *id
            {
                record.host = Host::Own;
            }
            g.replace(slot, record);
            Ok(g.to_proto(slot))
        })
    }

    /// Adds every machine of `catalog` (ids must not collide with existing ones).
    pub fn add_catalog(&self, catalog: &Catalog) -> Result<usize, CatalogError> {
        catalog.validate()?;
        {
            let g = self.inner.read();
            if let Some(dup) =
                catalog::expand(catalog).find(|m| g.index.contains_key(m.id.as_str()))
            {
                return Err(CatalogError::DuplicateMachine { id: dup.id });
            }
        }
        let before = self.inner.read().slots.len();
        let base = self.inner.read().base_rev;
        let n = self.seed(catalog)?;
        // Unlike the initial seed these are changes: log them and keep the old base.
        let mut g = self.inner.write();
        g.base_rev = base;
        for slot in before..g.slots.len() {
            g.touch(slot as u32);
        }
        Ok(n)
    }

    /// Replaces the machine's `allocatable` (e.g. a GPU fell off the bus).
    pub fn set_allocatable(
        &self,
        id: &str,
        allocatable: BTreeMap<String, String>,
    ) -> Result<Machine, ProviderError> {
        self.with_record(id, |g, slot| {
            let mut statics = g.rec(slot).tpl.statics.clone();
            statics.allocatable = Some(pb::Resources {
                resources: allocatable,
            });
            g.rec_mut(slot).tpl = Template::new(statics);
            g.touch(slot);
            Ok(g.to_proto(slot))
        })
    }

    /// The fencing high-water mark recorded for (shard, machine).
    pub fn fence_mark(&self, shard_id: &str, machine_id: &str) -> Option<Mark> {
        self.inner.read().fences.get(shard_id, machine_id)
    }

    /// The current List cursor value.
    pub fn revision(&self) -> u64 {
        self.tick();
        self.inner.read().rev
    }

    pub fn len(&self) -> usize {
        self.inner.read().index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Ids of machines currently in `state`, in seed order.
    pub fn ids_in_state(&self, state: MachineState) -> Vec<String> {
        self.tick();
        let g = self.inner.read();
        g.slots
            .iter()
            .flatten()
            .filter(|r| r.state == state)
            .map(|r| r.id.to_string())
            .collect()
    }

    pub fn stats(&self) -> Stats {
        self.tick();
        let g = self.inner.read();
        let by_state = (1..STATE_SLOTS)
            .filter_map(|i| {
                let s = MachineState::try_from(i as i32).ok()?;
                Some((state_name(s).to_owned(), g.counts[i]))
            })
            .collect();
        Stats {
            machines: g.index.len(),
            by_state,
            revision: g.rev,
            fence_marks: g.fences.len(),
            operations: g.next_op - 1,
        }
    }

    fn with_record<T>(
        &self,
        id: &str,
        f: impl FnOnce(&mut Inner, u32) -> Result<T, ProviderError>,
    ) -> Result<T, ProviderError> {
        let now = self.now();
        let mut g = self.inner.write();
        g.process_due(now);
        let result = match g.slot_of(id) {
            Ok(slot) => f(&mut g, slot),
            Err(e) => Err(e),
        };
        self.next_due.store(g.peek_due(), Ordering::Release);
        result
    }
}

/// A `BufMut` that can reserve room up front (so a 100 MB List grows its buffer once).
pub trait ReserveBufMut: BufMut {
    fn reserve_bytes(&mut self, additional: usize);
}

impl ReserveBufMut for Vec<u8> {
    fn reserve_bytes(&mut self, additional: usize) {
        self.reserve(additional);
    }
}

impl ReserveBufMut for bytes::BytesMut {
    fn reserve_bytes(&mut self, additional: usize) {
        self.reserve(additional);
    }
}

impl ReserveBufMut for tonic::codec::EncodeBuf<'_> {
    fn reserve_bytes(&mut self, additional: usize) {
        self.reserve(additional);
    }
}

fn pool_statics(catalog: &Catalog, seed: &catalog::SeedMachine) -> Machine {
    let pool = &catalog.pools[seed.pool];
    let it = &catalog.instance_types[&pool.instance_type];
    let zone = &pool.zones[seed.zone];
    let mut labels: BTreeMap<String, String> = it
        .labels
        .iter()
        .chain(&pool.labels)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    labels.insert(ZONE_LABEL.to_owned(), zone.clone());
    if let Some(rack) = seed.rack {
        labels.insert(
            RACK_LABEL.to_owned(),
            format!("{zone}-{}-rack-{rack}", pool.name),
        );
    }
    let res = |m: &BTreeMap<String, String>| pb::Resources {
        resources: m.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
    };
    Machine {
        instance_type: pool.instance_type.clone(),
        zone: zone.clone(),
        capacity_type: pool.capacity_type.to_proto() as i32,
        price_per_hour: pool.price_per_hour,
        interruption_probability: pool.interruption_probability,
        resources: Some(res(&it.resources)),
        labels,
        allocatable: it.allocatable.as_ref().map(res),
        ..Machine::default()
    }
}

#[cfg(test)]
mod tests;
