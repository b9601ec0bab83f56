//! One test binary for this crate: each file beside this one is a module of it, so
//! the crate's integration tests link once instead of once per file (disk, link time).
//! nextest still runs every test in its own process.

mod common;

mod creating_verdicts;
mod golden;
mod normalize;
mod ownership;
mod phase1;
mod phase2;
mod phase3;
mod properties;
mod same_domain;
mod scale_determinism;
mod unmet_reasons;
