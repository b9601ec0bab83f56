//! End-to-end tests: the real `bigfleet` binary's services as separate processes
//! (`bigfleet up`, or single `bigfleet svc ...` children through `bigfleet::up::local`),
//! simulated operators in the test, assertions on provider state and `InspectNeeds`.

mod actions;
mod chaos;
mod harness;
mod multishard;
mod ownership;
mod scenarios;
mod threeshard;
mod tools;
mod tracing;
mod up;
mod up_shards;
