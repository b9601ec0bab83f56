//! The gateway's calls to decide on `decide.sock`: roll-ups, session events, and the reads
//! the gateway proxies on its public port.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use bigfleet_mesh::{ChannelConfig, ClientStackConfig, MeshChannel, RetryPolicy};
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::mesh::v1::ingest_client::IngestClient;
use bigfleet_proto::mesh::v1::shard_info_client::ShardInfoClient;
use bigfleet_proto::v1alpha1::shard_read_client::ShardReadClient;
use tonic::Status;

/// Bound on each call to decide. Session opens and roll-ups are small; a decide that
/// cannot answer within this is treated as unavailable.
pub const DECIDE_CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Clients for decide's services over one channel, plus the shard epoch and coordinator
/// term decide last reported (echoed in operator Acknowledgements).
#[derive(Debug)]
pub struct DecideLink {
    channel: MeshChannel,
    epoch: AtomicI64,
    term: AtomicI64,
}

impl DecideLink {
    /// Dials `target` lazily (the gateway starts before or without decide).
    pub fn dial(target: &str) -> Result<Self, bigfleet_mesh::ChannelError> {
        let stack = ClientStackConfig {
            metrics: None,
            retry: RetryPolicy::default(),
            attempt_timeout: Some(DECIDE_CALL_TIMEOUT),
        };
        let channel = bigfleet_mesh::dial_lazy(target, &ChannelConfig::default(), &stack)?;
        Ok(Self::from_channel(channel))
    }

    pub fn from_channel(channel: MeshChannel) -> Self {
        Self {
            channel,
            epoch: AtomicI64::new(0),
            term: AtomicI64::new(0),
        }
    }

    fn decide(&self) -> IngestClient<MeshChannel> {
        bigfleet_mesh::with_message_limits!(IngestClient::new(self.channel.clone()))
    }

    pub fn shard_read(&self) -> ShardReadClient<MeshChannel> {
        bigfleet_mesh::with_message_limits!(ShardReadClient::new(self.channel.clone()))
    }

    pub fn shard_info(&self) -> ShardInfoClient<MeshChannel> {
        bigfleet_mesh::with_message_limits!(ShardInfoClient::new(self.channel.clone()))
    }

    /// The latest (epoch, term) decide reported.
    pub fn epoch_term(&self) -> (i64, i64) {
        (
            self.epoch.load(Ordering::Relaxed),
            self.term.load(Ordering::Relaxed),
        )
    }

    fn learn(&self, epoch: i64, term: i64) {
        if epoch > 0 {
            self.epoch.fetch_max(epoch, Ordering::Relaxed);
        }
        self.term.fetch_max(term, Ordering::Relaxed);
    }

    pub async fn session_opened(
        &self,
        req: mesh::SessionOpenedRequest,
    ) -> Result<mesh::SessionOpenedResponse, Status> {
        let resp = self
            .decide()
            .session_opened(with_deadline(req))
            .await?
            .into_inner();
        self.learn(resp.shard_epoch, resp.coordinator_term);
        Ok(resp)
    }

    pub async fn session_closed(&self, req: mesh::SessionClosedRequest) -> Result<(), Status> {
        self.decide().session_closed(with_deadline(req)).await?;
        Ok(())
    }

    pub async fn apply_rollup(
        &self,
        req: mesh::ApplyRollupRequest,
    ) -> Result<mesh::ApplyRollupResponse, Status> {
        // The roll-up's span goes to decide explicitly: decide keeps it as the parent of
        // the actions this demand leads to (ADR-0080).
        let mut req = with_deadline(req);
        bigfleet_telemetry::propagation::inject_current_span_into_metadata(req.metadata_mut());
        let resp = self.decide().apply_rollup(req).await?.into_inner();
        self.learn(resp.shard_epoch, resp.coordinator_term);
        Ok(resp)
    }
}

fn with_deadline<T>(msg: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.set_timeout(DECIDE_CALL_TIMEOUT);
    req
}
