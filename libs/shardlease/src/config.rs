//! Where etcd is, how to talk to it, and the key layout under `/bigfleet/shards/<id>/`.

use std::path::PathBuf;
use std::time::Duration;

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};

use crate::ShardLeaseError;
use crate::clock::LeaseTiming;
use crate::discovery::WorkEndpointWatcher;
use crate::epoch::{self, EpochGrant};
use crate::gate::{Campaign, LeaderGate};

/// The default root of every shard's keys.
pub const DEFAULT_KEY_PREFIX: &str = "/bigfleet/shards";

/// etcd's default `--grpc-keepalive-min-time`.
const ETCD_MIN_PING_INTERVAL: Duration = Duration::from_secs(5);

/// TLS towards etcd (PEM files). A CA alone verifies etcd's server certificate; a client
/// certificate and key are added when etcd requires client authentication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdTls {
    pub ca: PathBuf,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

/// How to reach etcd and how long a leader lease lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    /// `host:port`, `http://host:port` or `https://host:port`; with [`EtcdConfig::tls`]
    /// bare `host:port` means https.
    pub endpoints: Vec<String>,
    pub tls: Option<EtcdTls>,
    /// Leader lease TTL (whole seconds, at least 2 s).
    pub lease_ttl: Duration,
    /// `None`: `max(ttl/5, 200ms)` (ADR-0071).
    pub safety_margin: Option<Duration>,
    /// Bound on each unary etcd call; `None`: `ttl/3`.
    pub request_timeout: Option<Duration>,
    /// Root of the shard keys; [`DEFAULT_KEY_PREFIX`] unless a deployment shares one etcd
    /// between fleets.
    pub key_prefix: String,
}

impl EtcdConfig {
    /// Defaults (10 s TTL, `/bigfleet/shards`) for these endpoints.
    pub fn new<S: Into<String>>(endpoints: impl IntoIterator<Item = S>) -> Self {
        Self {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            tls: None,
            lease_ttl: Duration::from_secs(10),
            safety_margin: None,
            request_timeout: None,
            key_prefix: DEFAULT_KEY_PREFIX.to_owned(),
        }
    }

    /// Splits the comma-separated `--etcd-endpoints` value (blanks dropped).
    pub fn parse_endpoints(list: &str) -> Vec<String> {
        list.split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// Checks the configuration and derives the lease timing.
    pub fn timing(&self) -> Result<LeaseTiming, ShardLeaseError> {
        if self.endpoints.is_empty() {
            return Err(ShardLeaseError::Config("no etcd endpoints".to_owned()));
        }
        if let Some(tls) = &self.tls
            && tls.cert.is_some() != tls.key.is_some()
        {
            return Err(ShardLeaseError::Config(
                "etcd client certificate and key must be given together".to_owned(),
            ));
        }
        if !self.key_prefix.starts_with('/') {
            return Err(ShardLeaseError::Config(format!(
                "key prefix {:?} must start with '/'",
                self.key_prefix
            )));
        }
        LeaseTiming::new(self.lease_ttl, self.safety_margin, self.request_timeout)
    }

    /// Secure by default (ADR-0102): a process that runs the mesh with mTLS must not talk
    /// to etcd, which holds its epochs and leader lease, in plaintext — unless
    /// `insecure_plaintext` (`--insecure-plaintext`) says so. `Err` says what to change.
    pub fn check_transport(&self, mesh_mtls: bool, insecure_plaintext: bool) -> Result<(), String> {
        if !mesh_mtls || insecure_plaintext {
            return Ok(());
        }
        if self.tls.is_none() {
            return Err(
                "the mesh runs with mtls but etcd would be plaintext: give --etcd-ca (and --etcd-cert/--etcd-key), or --insecure-plaintext to accept it"
                    .to_owned(),
            );
        }
        if let Some(e) = self
            .endpoints
            .iter()
            .find(|e| e.to_ascii_lowercase().starts_with("http://"))
        {
            return Err(format!(
                "etcd endpoint {e} is plaintext while the mesh runs with mtls: use https:// or a bare host:port, or --insecure-plaintext"
            ));
        }
        Ok(())
    }

    /// The keys of one shard.
    pub fn keys(&self, shard_id: &str) -> ShardKeys {
        ShardKeys::new(&self.key_prefix, shard_id)
    }

    pub(crate) fn connect_options(
        &self,
        timing: &LeaseTiming,
    ) -> Result<ConnectOptions, ShardLeaseError> {
        // HTTP/2 pings notice a silently dead connection (partition, frozen etcd), so calls
        // and watches re-dial instead of queueing on it. Not more often than etcd's
        // default `--grpc-keepalive-min-time` (5 s): a server that sees pings faster than
        // that closes the connection ("too many pings"). Lease safety never waits for
        // this — the validity deadline is a local timer.
        let ping_interval = timing.keepalive_interval.max(ETCD_MIN_PING_INTERVAL);
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(timing.request_timeout)
            .with_keep_alive(ping_interval, timing.keepalive_interval)
            .with_keep_alive_while_idle(true);
        if let Some(tls) = &self.tls {
            let read = |path: &PathBuf| {
                std::fs::read(path).map_err(|source| ShardLeaseError::TlsFile {
                    path: path.clone(),
                    source,
                })
            };
            let mut t = TlsOptions::new().ca_certificate(Certificate::from_pem(read(&tls.ca)?));
            if let (Some(cert), Some(key)) = (&tls.cert, &tls.key) {
                t = t.identity(Identity::from_pem(read(cert)?, read(key)?));
            }
            opts = opts.with_tls(t);
        }
        Ok(opts)
    }
}

/// The etcd keys of one shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardKeys {
    pub shard_id: String,
    /// Decimal `u64`, advanced by compare-and-swap.
    pub epoch: String,
    /// The current leader's holder id, attached to its lease.
    pub leader: String,
    /// The current leader's Work endpoint URI, attached to the same lease.
    pub work: String,
}

impl ShardKeys {
    pub fn new(prefix: &str, shard_id: &str) -> Self {
        let base = format!("{}/{shard_id}", prefix.trim_end_matches('/'));
        Self {
            shard_id: shard_id.to_owned(),
            epoch: format!("{base}/epoch"),
            leader: format!("{base}/leader"),
            work: format!("{base}/work"),
        }
    }
}

/// A connection to the etcd cluster holding the shard keys. Cheap to clone; connecting is
/// lazy, so this succeeds while etcd is down and calls fail (bounded) until it is back.
#[derive(Clone)]
pub struct EtcdShards {
    client: Client,
    config: EtcdConfig,
    timing: LeaseTiming,
}

impl std::fmt::Debug for EtcdShards {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdShards")
            .field("endpoints", &self.config.endpoints)
            .field("timing", &self.timing)
            .finish_non_exhaustive()
    }
}

impl EtcdShards {
    /// Checks `config` and sets up the (lazy) client.
    pub async fn connect(config: EtcdConfig) -> Result<Self, ShardLeaseError> {
        let timing = config.timing()?;
        let opts = config.connect_options(&timing)?;
        let client = Client::connect(&config.endpoints, Some(opts)).await?;
        Ok(Self {
            client,
            config,
            timing,
        })
    }

    pub fn config(&self) -> &EtcdConfig {
        &self.config
    }

    pub fn timing(&self) -> &LeaseTiming {
        &self.timing
    }

    /// The raw client (for tests and diagnostics).
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// Mints the shard's next epoch: strictly above every epoch ever minted for it
    /// (and above `floor`, for a shard moving over from the epoch file).
    pub async fn next_epoch(
        &self,
        shard_id: &str,
        floor: u64,
    ) -> Result<EpochGrant, ShardLeaseError> {
        let keys = self.config.keys(shard_id);
        epoch::next_epoch(&self.client, &keys, floor, self.timing.request_timeout).await
    }

    /// Reads the shard's latest epoch (0: never minted).
    pub async fn current_epoch(&self, shard_id: &str) -> Result<u64, ShardLeaseError> {
        let keys = self.config.keys(shard_id);
        epoch::read_epoch(&self.client, &keys, self.timing.request_timeout)
            .await
            .map(|(e, _)| e)
    }

    /// Starts campaigning for the shard's leader lease in the background; the returned
    /// gate reports each won term.
    pub fn campaign(&self, campaign: Campaign) -> LeaderGate {
        LeaderGate::spawn(self.clone(), campaign, tokio::sync::watch::channel(None).0)
    }

    /// As [`EtcdShards::campaign`], reporting each term's epoch (`None` between terms)
    /// straight into `epochs` — for a consumer that had to exist before the campaign
    /// could start (decide's hand-out gate), with no relay task in between.
    pub fn campaign_with(
        &self,
        campaign: Campaign,
        epochs: tokio::sync::watch::Sender<Option<u64>>,
    ) -> LeaderGate {
        LeaderGate::spawn(self.clone(), campaign, epochs)
    }

    /// Follows the shard's published Work endpoint.
    pub fn watch_work_endpoint(&self, shard_id: &str) -> WorkEndpointWatcher {
        WorkEndpointWatcher::spawn(self.clone(), shard_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_layout() {
        let k = ShardKeys::new("/bigfleet/shards/", "shard-3");
        assert_eq!(k.epoch, "/bigfleet/shards/shard-3/epoch");
        assert_eq!(k.leader, "/bigfleet/shards/shard-3/leader");
        assert_eq!(k.work, "/bigfleet/shards/shard-3/work");
        assert_eq!(
            EtcdConfig::new(["x:1"]).keys("a").leader,
            "/bigfleet/shards/a/leader"
        );
    }

    #[test]
    fn endpoints_and_validation() {
        assert_eq!(
            EtcdConfig::parse_endpoints(" a:1, ,http://b:2,"),
            vec!["a:1".to_owned(), "http://b:2".to_owned()]
        );
        assert!(EtcdConfig::new(Vec::<String>::new()).timing().is_err());
        let mut c = EtcdConfig::new(["a:1"]);
        assert!(c.timing().is_ok());
        c.tls = Some(EtcdTls {
            ca: "/ca.pem".into(),
            cert: Some("/c.pem".into()),
            key: None,
        });
        assert!(matches!(c.timing(), Err(ShardLeaseError::Config(_))));
        c.tls = None;
        c.key_prefix = "bigfleet".to_owned();
        assert!(c.timing().is_err());
    }

    #[tokio::test]
    async fn missing_tls_files_are_reported_by_path() {
        let mut c = EtcdConfig::new(["127.0.0.1:1"]);
        c.tls = Some(EtcdTls {
            ca: "/nonexistent/ca.pem".into(),
            cert: None,
            key: None,
        });
        match EtcdShards::connect(c).await {
            Err(ShardLeaseError::TlsFile { path, .. }) => {
                assert_eq!(path, PathBuf::from("/nonexistent/ca.pem"));
            }
            other => panic!("expected a tls file error, got {other:?}"),
        }
    }

    #[test]
    fn plaintext_etcd_is_refused_when_the_mesh_runs_mtls() {
        let plain = EtcdConfig::new(["a:2379"]);
        assert!(plain.check_transport(false, false).is_ok());
        let err = plain.check_transport(true, false).unwrap_err();
        assert!(err.contains("--etcd-ca"), "{err}");
        assert!(plain.check_transport(true, true).is_ok());
        let mut tls = EtcdConfig::new(["a:2379", "http://b:2379"]);
        tls.tls = Some(EtcdTls {
            ca: "ca.pem".into(),
            cert: None,
            key: None,
        });
        let err = tls.check_transport(true, false).unwrap_err();
        assert!(err.contains("http://b:2379"), "{err}");
        tls.endpoints.pop();
        assert!(tls.check_transport(true, false).is_ok());
    }
}
