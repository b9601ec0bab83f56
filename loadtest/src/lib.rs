//! Load generators and the scale harness: simulated operators, gateway load, e2e bench.
//!
//! * [`operator`] — a simulated cluster operator (`Operator::spawn(config) ->
//!   OperatorHandle`): the client side of `Shard/Session`, reused by `bigfleet up`, the
//!   end-to-end tests and the load tests.
//! * [`demand`] — realistic demand (CPU services, GPU jobs, Same-rack gangs) and churn.
//! * [`gateway_load`] — N operators against one session gateway (`gateway-load` binary).
//! * [`decide_stub`] — a `Decide` double so a gateway can run without a real decide
//!   (`decide-stub` binary, gateway tests).
//! * [`certs`] — per-cluster certificates for load tests under mTLS.
//! * [`latency`] — a shared latency histogram.
//! * [`e2e`] — the scale harness: a whole shard in-process (`e2e-bench --units N`).
//! * [`shard_load`] — the whole shard as real service processes under N simulated
//!   operators (`shard-load` binary).
//! * [`soak`] — many cycles of churn, then checks for leaked or stuck records
//!   (`e2e-bench --soak-cycles N`).

pub mod certs;
pub mod decide_stub;
pub mod demand;
pub mod e2e;
pub mod gateway_load;
pub mod latency;
pub mod operator;
pub mod shard_load;
pub mod soak;

pub use bigfleet_model::MachineState;
pub use demand::{Churn, Demand, NeedSpec};
pub use operator::{
    AvailableView, Backoff, BootstrapBehavior, NodeView, Operator, OperatorConfig, OperatorHandle,
    OperatorStats,
};
