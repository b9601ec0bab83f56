//! What a fake provider is configured with: the mutation kinds, how long each
//! transition takes, failure injection, fencing tokens and the counters it keeps.

use super::*;

/// The four mutations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    Create,
    Configure,
    Drain,
    Delete,
}

impl OpKind {
    pub const ALL: [OpKind; 4] = [
        OpKind::Create,
        OpKind::Configure,
        OpKind::Drain,
        OpKind::Delete,
    ];

    /// The only state the operation may start from.
    pub fn from_state(self) -> MachineState {
        match self {
            OpKind::Create => MachineState::Speculative,
            OpKind::Configure => MachineState::Idle,
            OpKind::Drain => MachineState::Configured,
            OpKind::Delete => MachineState::Idle,
        }
    }

    /// The in-flight state.
    pub fn via_state(self) -> MachineState {
        match self {
            OpKind::Create => MachineState::Creating,
            OpKind::Configure => MachineState::Configuring,
            OpKind::Drain => MachineState::Draining,
            OpKind::Delete => MachineState::Deleting,
        }
    }

    /// The stable state the operation ends in.
    pub fn target_state(self) -> MachineState {
        match self {
            OpKind::Create => MachineState::Idle,
            OpKind::Configure => MachineState::Configured,
            OpKind::Drain => MachineState::Idle,
            OpKind::Delete => MachineState::Speculative,
        }
    }

    /// The operation whose in-flight state `state` is.
    pub fn of_transitional(state: MachineState) -> Option<OpKind> {
        OpKind::ALL.into_iter().find(|k| k.via_state() == state)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            OpKind::Create => "create",
            OpKind::Configure => "configure",
            OpKind::Drain => "drain",
            OpKind::Delete => "delete",
        }
    }
}

impl std::fmt::Display for OpKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// When an accepted transition reaches its stable target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Completion {
    /// Before the call returns: the ack already shows the target (a synchronous provider).
    #[default]
    Instant,
    /// Only when a test calls [`FakeProvider::complete_staged`].
    Staged,
    /// After this much wall-clock time.
    After(Duration),
}

/// Completion per operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TransitionModel {
    pub create: Completion,
    pub configure: Completion,
    pub drain: Completion,
    pub delete: Completion,
}

impl TransitionModel {
    pub fn instant() -> Self {
        Self::default()
    }

    pub fn all(c: Completion) -> Self {
        Self {
            create: c,
            configure: c,
            drain: c,
            delete: c,
        }
    }

    pub fn get(&self, kind: OpKind) -> Completion {
        match kind {
            OpKind::Create => self.create,
            OpKind::Configure => self.configure,
            OpKind::Drain => self.drain,
            OpKind::Delete => self.delete,
        }
    }

    pub fn set(&mut self, kind: OpKind, c: Completion) {
        match kind {
            OpKind::Create => self.create = c,
            OpKind::Configure => self.configure = c,
            OpKind::Drain => self.drain = c,
            OpKind::Delete => self.delete = c,
        }
    }
}

/// How an injected failure shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Injection {
    /// The call is refused with this code (FAILED_PRECONDITION is turned into INTERNAL:
    /// it is reserved for fencing) and nothing changes.
    Reject { code: tonic::Code, message: String },
    /// The call is accepted and the transition ends in FAILED with `message` as
    /// `last_error` instead of its target.
    Fail { message: String },
    /// The call is accepted and the machine moves as usual, but the acknowledgement reports
    /// `state` and `last_error` instead of the record: a provider whose answers a consumer
    /// must check rather than trust.
    Ack {
        state: MachineState,
        last_error: String,
    },
}

/// One mutating call as it arrived, before the fence looked at it: what a consumer sent,
/// including the calls that were fenced or refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MutationCall {
    pub op: OpKind,
    pub machine_id: String,
    pub shard_id: String,
    pub epoch: i64,
    pub sequence: i64,
    /// Configure's bootstrap blob; empty for the other operations.
    pub bootstrap_blob: Vec<u8>,
}

/// How many [`MutationCall`]s the provider keeps (the oldest go first): enough for any
/// test, bounded for a fake that runs for days under `bigfleet up`.
pub const MUTATION_CALLS_KEPT: usize = 1024;

/// What one List answers instead of the truth: the hostile or broken provider a consumer
/// must survive without moving machines (issue 16's "a lying provider").
///
/// In JSON (the admin API): `"unavailable"`, `"empty"`, `{"truncated": 5}`, `"invalid"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ListFault {
    /// The call fails with UNAVAILABLE (the provider is down).
    Unavailable,
    /// No machines and no cursor: a provider that restarted with an empty store.
    Empty,
    /// Only the first `n` machines, and no cursor: a truncated answer.
    Truncated(usize),
    /// Every machine with a negative price, and no cursor: records that fail validation.
    Invalid,
}

/// What the per-kind failure rates inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum FailureStyle {
    /// Refuse the call with INTERNAL.
    #[default]
    Reject,
    /// Accept the call; the machine lands in FAILED.
    Fail,
}

/// Probability in [0, 1] that a call of each kind fails.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FailureRates {
    pub create: f64,
    pub configure: f64,
    pub drain: f64,
    pub delete: f64,
}

impl FailureRates {
    pub fn get(&self, kind: OpKind) -> f64 {
        match kind {
            OpKind::Create => self.create,
            OpKind::Configure => self.configure,
            OpKind::Drain => self.drain,
            OpKind::Delete => self.delete,
        }
    }
}

/// Behaviour knobs; change them at run time with [`FakeProvider::update_config`].
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderConfig {
    /// `HostRef.provider` of hosts created by this provider.
    pub provider_name: String,
    pub transitions: TransitionModel,
    /// The original's ADR-0056: every Configure holds CONFIGURING until [`FakeProvider::mark_ready`].
    /// (Single machines can be held with [`FakeProvider::require_readiness`].)
    pub hold_configuring_until_ready: bool,
    /// A machine still in a transition this long after it started lands in FAILED.
    pub transition_timeout: Option<Duration>,
    pub failure_rates: FailureRates,
    pub failure_style: FailureStyle,
    /// `false` ⇒ Delete answers UNIMPLEMENTED, like a bare-metal provider.
    pub delete_supported: bool,
    /// Seed of the failure-rate and shedding dice.
    pub seed: u64,
}

impl Default for ProviderConfig {
    fn default() -> Self {
        Self {
            provider_name: catalog::DEFAULT_PROVIDER_NAME.to_owned(),
            transitions: TransitionModel::instant(),
            hold_configuring_until_ready: false,
            transition_timeout: None,
            failure_rates: FailureRates::default(),
            failure_style: FailureStyle::Reject,
            delete_supported: true,
            seed: 0,
        }
    }
}

/// The fencing token of a mutation as it arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Token<'a> {
    pub shard_id: &'a str,
    pub epoch: i64,
    pub sequence: i64,
}

impl<'a> Token<'a> {
    /// The token a transition request carries in its `shard_id`, `shard_epoch` and
    /// `sequence_number` fields.
    pub fn new(shard_id: &'a str, epoch: i64, sequence: i64) -> Self {
        Token {
            shard_id,
            epoch,
            sequence,
        }
    }

    /// The all-zero token: an in-process caller that opts out of fencing.
    pub fn is_zero(&self) -> bool {
        self.shard_id.is_empty() && self.epoch == 0 && self.sequence == 0
    }
}

/// Counts and cursor, for the admin endpoint, metrics and tests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Stats {
    pub machines: usize,
    pub by_state: BTreeMap<String, usize>,
    pub revision: u64,
    pub fence_marks: usize,
    pub operations: u64,
}
