//! Test helpers: throwaway CAs and role certificates, process and sandbox helpers, and
//! the external tools (headless Chromium, grpcurl) the end-to-end suites drive.
//!
//! A normal (non-dev) library on purpose: `bigfleet up --tls` uses [`TestCa`] to mint a
//! throwaway CA and one certificate per role for a local mesh, exactly as the test suites do.
//! It depends on nothing of ours, so every crate (including `bigfleet-identity`) can use it
//! from its tests.

mod ca;
mod sandbox;
pub mod tools;

pub use ca::{IssuedCert, LeafSpec, TestCa, TlsPaths, ca_params, role_file_stem};
pub use sandbox::{PortReservation, free_tcp_port, reserve_tcp_port, temp_dir, unix_socket_path};

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
