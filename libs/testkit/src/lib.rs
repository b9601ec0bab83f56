//! Test helpers: throwaway CAs and role certificates, process and sandbox helpers, a
//! minimal HTTP client ([`http_request`]), a span collector ([`SpanCollector`]), and the
//! external tools (headless Chromium, grpcurl) the end-to-end suites drive.
//!
//! Test code only: crates take it as a dev-dependency (or from a `testing` feature that
//! only dev-dependencies enable), never into a production binary — `bigfleet up` has its
//! own CA (`bigfleet-identity`). Port reservation is production code in
//! `bigfleet_mesh::ports`, which `up` uses and [`reserve_tcp_port`] re-exports; cargo allows
//! the dev-dependency cycle, so every crate (mesh and identity included) can still use the
//! testkit from its tests. [`wait_until`] is the suites' one polling helper (docs/testing.md);
//! [`host_metadata`] is the dependency-rule tests' view of the graph.

mod ca;
mod cargo;
mod http;
mod sandbox;
mod spans;
pub mod tools;
mod wait;

pub use ca::{IssuedCert, LeafSpec, TestCa, TlsPaths, ca_params, role_file_stem};
pub use cargo::{host_metadata, host_triple};
pub use http::http_request;
pub use sandbox::{PortReservation, free_tcp_port, reserve_tcp_port, temp_dir, unix_socket_path};
pub use spans::SpanCollector;
pub use wait::{Progress, wait_until};

/// Errors from certificate generation and writing bundles.
#[derive(Debug, thiserror::Error)]
pub enum TestkitError {
    #[error("certificate generation failed: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("writing {path}: {source}")]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("unix socket path {path} is {len} bytes, longer than the kernel's limit of 107")]
    SocketPathTooLong {
        path: std::path::PathBuf,
        len: usize,
    },
}
