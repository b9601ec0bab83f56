//! In-process doubles of the services a worker talks to, for this crate's
//! tests, the `execute-bench` binary and other crates' tests.
//!
//! * [`DecideDouble`]: a scripted `bigfleet.mesh.v1.Work` (Pull + Transition)
//!   with an authoritative machine table, the legal-transition check, one
//!   action in flight per machine, fencing windows, abandonment of a dead
//!   stream's actions (optionally re-issued) and records of everything.
//! * [`GatewayDouble`]: a scripted `bigfleet.mesh.v1.Relay`
//!   (RequestBootstrap / SendReclaim) that records what it was asked.
//! * [`fixtures`]: machines and work items as decide hands them out, and
//!   flow timeouts short enough for tests.
//!
//! Both work in memory (they implement the crate's link traits) and over
//! gRPC ([`serve_uds`]). They are doubles, not implementations: decide's
//! cycle, reconcile and publishing are not here.

mod decide;
pub mod fixtures;
mod gateway;

use std::path::{Path, PathBuf};

pub use decide::{DecideDouble, DoneRecord, StreamRecord, TransitionRecord, WorkDoubleService};
pub use gateway::{BlobScript, BootstrapCall, GatewayDouble, ReclaimCall};

use bigfleet_mesh::BareServer;
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::server::Router;

/// A double served on a Unix socket.
#[derive(Debug)]
pub struct Served {
    path: PathBuf,
    server: BareServer,
}

impl Served {
    /// `unix:///path`, for the worker's address flags.
    pub fn uri(&self) -> String {
        format!("unix://{}", self.path.display())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stops accepting and waits for open calls to end. Streams that never
    /// end (a Work stream) must be ended first (e.g. [`DecideDouble::end_streams`]).
    pub async fn stop(self) {
        // How a double's server ended tells a test nothing; its records do.
        let _ = self.server.stop().await;
    }
}

/// Serves `router` on a Unix socket at `path` (a stale socket file is removed).
pub fn serve_uds(router: Router, path: &Path) -> std::io::Result<Served> {
    if path.exists() {
        std::fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path)?;
    Ok(Served {
        path: path.to_owned(),
        server: BareServer::spawn(router, UnixListenerStream::new(listener)),
    })
}
