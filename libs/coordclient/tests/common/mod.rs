//! The shard side of the coordinator client's tests, [`View`]; the coordinator they report
//! to is the one Coordinator double, `svc_inspect::doubles::CoordinatorDouble`, whose
//! ReportShard answers come from each test's script.

use bigfleet_coordclient::ShardView;
use bigfleet_proto::v1alpha1 as pb;
use futures::future::BoxFuture;
use parking_lot::Mutex;
use std::collections::BTreeSet;
use std::net::SocketAddr;

/// Serves `double` in plaintext on a fresh loopback port; the address, and the server to
/// keep alive.
pub async fn serve(double: &CoordinatorDouble) -> (SocketAddr, RunningServer) {
    let server = double
        .serve(None)
        .await
        .expect("the coordinator double serves");
    (server.tcp_addr().expect("a tcp listener"), server)
}

pub use bigfleet_mesh::RunningServer;
pub use svc_inspect::doubles::CoordinatorDouble;

/// The shard side of the client: a fixed summary and three shortfalls; it records the
/// domains it is told to own, how many domain instructions it applied, and the last term.
#[derive(Default)]
pub struct View {
    pub domains: Mutex<BTreeSet<(String, String)>>,
    pub applied: Mutex<u32>,
    pub term: Mutex<i64>,
}

impl ShardView for View {
    fn summary(&self) -> BoxFuture<'_, pb::ShardSummary> {
        Box::pin(async {
            pb::ShardSummary {
                total_machines: 10,
                free_machines: 4,
                provider_address: "unix:///p.sock".into(),
                ..Default::default()
            }
        })
    }
    fn shortfalls(&self, limit: usize) -> Vec<pb::Shortfall> {
        (0..3)
            .map(|i| pb::Shortfall {
                priority: 10 - i,
                age_cycles: 1,
                ..Default::default()
            })
            .take(limit)
            .collect()
    }
    fn observe_term(&self, term: i64) {
        *self.term.lock() = term;
    }
    fn assign_domain(&self, key: &str, value: &str) -> Result<(), String> {
        *self.applied.lock() += 1;
        self.domains.lock().insert((key.into(), value.into()));
        Ok(())
    }
    fn unassign_domain(&self, key: &str, value: &str) -> Result<(), String> {
        *self.applied.lock() += 1;
        self.domains.lock().remove(&(key.into(), value.into()));
        Ok(())
    }
}
