//! One test binary for this crate: each file beside this one is a module of it, so
//! the crate's integration tests link once instead of once per file (disk, link time).
//! nextest still runs every test in its own process.

mod common;

mod dashboard;
mod grpc;
mod history;
mod http;
mod mtls;
mod tools;
