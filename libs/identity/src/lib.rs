//! rustls configs from --tls-* flags, certificate reload, and PeerIdentity from bigfleet:// URI SANs.
//!
//! * [`TlsFlags`] is the `--tls-cert --tls-key --tls-ca` triple (all three ⇒ mTLS, none ⇒
//!   plaintext, partial ⇒ [`TlsError::PartialFlags`]).
//! * [`TlsContext`] loads the files and derives rustls [`rustls::ServerConfig`] (TLS 1.3,
//!   client certificates required and verified against the CA) and
//!   [`rustls::ClientConfig`] (our leaf as client certificate, servers verified against the
//!   CA). Both serve the leaf through [`CertReloader`], which swaps in a rotated pair when
//!   the files change and keeps the previous pair when the new files do not load.
//! * [`PeerIdentity`] is read from exactly one `bigfleet://` URI SAN of a verified leaf.
//! * [`CrlVerifiers`] checks peers against `--tls-crl` revocation lists, re-read on change.
//!
//! This crate knows nothing about gRPC; `bigfleet-mesh` wires it into servers and channels.

pub mod ca;
mod config;
mod crl;
mod flags;
mod peer;
mod reload;

use std::path::PathBuf;

pub use config::{TlsContext, crypto_provider};
pub use crl::{CrlVerifiers, read_crls};
pub use flags::{TlsFiles, TlsFlags};
pub use peer::{IDENTITY_SCHEME, IdentityError, PeerIdentity, Role};
pub use reload::{CertReloader, DEFAULT_RELOAD_CHECK_INTERVAL, ReloadOutcome};

/// Errors configuring TLS (startup) or reloading certificates.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error(
        "incomplete tls flags: missing {}; pass all of --tls-cert, --tls-key and --tls-ca for mtls or none for plaintext",
        missing.join(", ")
    )]
    PartialFlags { missing: Vec<&'static str> },
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    BadPem { path: PathBuf, reason: String },
    #[error("ca bundle {path}: {reason}")]
    BadCa { path: PathBuf, reason: String },
    #[error("certificate {cert} and key {key} do not form a usable pair: {reason}")]
    KeyPair {
        cert: PathBuf,
        key: PathBuf,
        reason: String,
    },
    #[error("tls configuration: {0}")]
    Config(String),
}
